"""Entry log files: append-only, framed, CRC-checked, rolled at a size limit.

Threading: ``append`` (the flush and compaction threads) is serialized by an
append lock and does its own write + fsync; reads (any thread) go through a
small LRU of read-only file descriptors guarded by a second lock, held across
each ``pread`` so that ``remove`` can never close a descriptor in use (or let
its number be reused) under a reader.

A log that was written to but whose index batch has not committed yet is
*in flight*; compaction must not pick it (its entries are not indexed yet).
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import crc32c
import quorumlog_native

from quorumlog.bookie._config import FRAME_OVERHEAD_BYTES, LOG_HEADER_BYTES, LedgerStorageConfig
from quorumlog.bookie._format import (
    FRAME_HEAD,
    LOCATION,
    Frame,
    FrameIncomplete,
    FrameInvalid,
    Location,
    LogUsage,
    check_log_header,
    decode_frame,
    decode_location,
    encode_log_header,
    log_file_name,
    parse_log_file_name,
)
from quorumlog.bookie._storage_errors import EntryLogCorruptionError
from quorumlog.errors import CorruptionError, InvariantViolation, StorageError, invariant

# One frame to append: (ledger id, entry id, data).
PendingFrame = tuple[int, int, bytes]


class LogGoneError(Exception):
    """The entry log was removed by compaction; look the entry up again."""


@dataclass(slots=True)
class RecoveryReport:
    """What opening the entry logs repaired."""

    truncated_bytes: dict[int, int] = field(default_factory=dict)
    removed_logs: list[int] = field(default_factory=list)
    stale_usage_records: list[int] = field(default_factory=list)
    next_log_id: int = 0


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def scan_log_files(directory: Path) -> dict[int, Path]:
    found: dict[int, Path] = {}
    for path in directory.iterdir():
        log_id = parse_log_file_name(path.name)
        if log_id is not None and path.is_file():
            found[log_id] = path
    return found


def recover_log_files(directory: Path, usage: dict[int, LogUsage]) -> RecoveryReport:
    """Make the files match the index: cut uncommitted tails, drop unknown logs.

    A log without a usage record was never referenced by a committed index
    batch (the batch that first points into a log also writes its record), so
    it is removed. A log longer than its committed end has a tail written after
    the last index batch: it is truncated. A log shorter than its committed end
    lost indexed data: that is corruption and opening fails.
    """
    report = RecoveryReport()
    files = scan_log_files(directory)
    for log_id, path in sorted(files.items()):
        record = usage.get(log_id)
        if record is None:
            path.unlink()
            report.removed_logs.append(log_id)
            continue
        size = path.stat().st_size
        if size < record.end_offset:
            raise CorruptionError(
                f"entry log {path} is {size} bytes but the index committed "
                f"{record.end_offset} bytes; restore this bookie's data from replicas"
            )
        if size > record.end_offset:
            _truncate(path, record.end_offset)
            report.truncated_bytes[log_id] = size - record.end_offset
    for log_id, record in usage.items():
        if log_id in files:
            continue
        if record.live_bytes > 0:
            raise CorruptionError(
                f"entry log {directory / log_file_name(log_id)} is missing but the index "
                f"holds {record.live_bytes} live bytes in it; restore from replicas"
            )
        report.stale_usage_records.append(log_id)
    if report.removed_logs or report.truncated_bytes:
        fsync_directory(directory)
    report.next_log_id = max([*files, *usage, -1]) + 1
    return report


def _truncate(path: Path, size: int) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(slots=True)
class AppendedFrames:
    """Frames appended by :meth:`EntryLogs.append_encoded`: each frame's
    location encoded for the index, in order; the logs written (in order);
    per log, its end offset after the write and the bytes written to it."""

    locations: list[bytes] = field(default_factory=list)
    log_ids: list[int] = field(default_factory=list)
    written: dict[int, tuple[int, int]] = field(default_factory=dict)


@dataclass(slots=True)
class _Writer:
    fd: int
    log_id: int
    offset: int


class EntryLogs:
    """The entry log files of one ledger directory."""

    def __init__(self, directory: Path, config: LedgerStorageConfig, next_log_id: int) -> None:
        self._directory = directory
        self._config = config
        self._append_lock = threading.Lock()
        self._writer: _Writer | None = None
        self._next_log_id = next_log_id
        self._inflight_lock = threading.Lock()
        self._inflight: Counter[int] = Counter()
        self._fds_lock = threading.Lock()
        self._fds: OrderedDict[int, int] = OrderedDict()

    def path(self, log_id: int) -> Path:
        return self._directory / log_file_name(log_id)

    # -- writing ---------------------------------------------------------------

    @property
    def current_log_id(self) -> int | None:
        writer = self._writer
        return None if writer is None else writer.log_id

    def append(self, frames: Sequence[PendingFrame]) -> list[Location]:
        """Append frames in order, rolling logs as needed; fsync before returning.

        Every log written to is marked in flight; the caller must call
        :meth:`release` with the locations once its index batch is done.
        """
        return [decode_location(value) for value in self.append_encoded(frames).locations]

    def append_encoded(self, frames: Sequence[PendingFrame]) -> AppendedFrames:
        """:meth:`append` for a flush: the locations already encoded for the
        index (``encode_location``), one per frame, and each written log's
        end and bytes, without a Location object per frame; the caller calls
        :meth:`release_logs` with ``log_ids`` once its index batch is done."""
        touched: list[int] = []
        with self._append_lock:
            try:
                return self._append_locked(frames, touched)
            except OSError as exc:
                self._abandon_writer()
                self._release_logs(touched)
                raise StorageError(
                    f"writing entry log in {self._directory} failed: {exc}",
                    retriable=exc.errno == errno.ENOSPC,
                ) from exc

    def _append_locked(self, frames: Sequence[PendingFrame],
                       touched: list[int]) -> AppendedFrames:
        """The hot loop of a flush: frame headers (``encode_frame_header``,
        inlined), location values and per-log totals in one pass."""
        result = AppendedFrames()
        locations = result.locations
        chunk: list[bytes] = []
        chunk_bytes = 0
        head, pack_location = FRAME_HEAD.pack, LOCATION.pack
        crc = crc32c.crc32c
        log_bytes_max = self._config.entry_log_max_bytes
        writer = self._writer
        for ledger_id, entry_id, data in frames:
            size = len(data)
            frame_bytes = FRAME_OVERHEAD_BYTES + size
            if writer is None or writer.offset + chunk_bytes + frame_bytes > log_bytes_max:
                # validate() guarantees one frame fits in an empty log, so this
                # never rolls an empty log.
                self._write_chunk(chunk, touched, result)
                chunk, chunk_bytes = [], 0
                self._roll()
                writer = self._current_writer()
            header = head(size, ledger_id, entry_id)
            chunk.append(header)
            chunk.append(crc(data, crc(header)).to_bytes(4, "big"))
            chunk.append(data)
            locations.append(pack_location(writer.log_id, writer.offset + chunk_bytes,
                                           frame_bytes))
            chunk_bytes += frame_bytes
        self._write_chunk(chunk, touched, result)
        return result

    def _current_writer(self) -> _Writer:
        writer = self._writer
        if writer is None:
            raise InvariantViolation("invariant violated: appending without an open entry log")
        return writer

    def _write_chunk(self, chunk: list[bytes], touched: list[int],
                     result: AppendedFrames) -> None:
        if not chunk:
            return
        writer = self._current_writer()
        data = b"".join(chunk)
        with self._inflight_lock:
            self._inflight[writer.log_id] += 1
        touched.append(writer.log_id)
        _write_all(writer.fd, data)
        os.fsync(writer.fd)
        writer.offset += len(data)
        result.log_ids.append(writer.log_id)
        result.written[writer.log_id] = (writer.offset, len(data))

    def _roll(self) -> None:
        self._close_writer()
        log_id = self._next_log_id
        self._next_log_id += 1
        fd = os.open(self.path(log_id), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            _write_all(fd, encode_log_header(log_id))
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        fsync_directory(self._directory)
        self._writer = _Writer(fd, log_id, LOG_HEADER_BYTES)

    def _close_writer(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                os.fsync(writer.fd)
            finally:
                os.close(writer.fd)

    def _abandon_writer(self) -> None:
        """After a write error the file position is unknown: never append there again."""
        writer, self._writer = self._writer, None
        if writer is not None:
            with contextlib.suppress(OSError):
                os.close(writer.fd)

    def _release_logs(self, log_ids: Sequence[int]) -> None:
        with self._inflight_lock:
            for log_id in log_ids:
                self._inflight[log_id] -= 1
                if self._inflight[log_id] <= 0:
                    del self._inflight[log_id]

    def release(self, locations: Sequence[Location]) -> None:
        """The index batch for these locations committed (or failed)."""
        self._release_logs(sorted({loc.log_id for loc in locations}))

    def release_logs(self, log_ids: Sequence[int]) -> None:
        """The index batch for the frames of :meth:`append_encoded` committed (or failed)."""
        self._release_logs(log_ids)

    def is_sealed(self, log_id: int) -> bool:
        """True when nothing will be appended to the log nor indexed into it."""
        with self._inflight_lock:
            return log_id != self.current_log_id and log_id not in self._inflight

    # -- reading ---------------------------------------------------------------

    def _open_for_read(self, log_id: int) -> int:
        try:
            fd = os.open(self.path(log_id), os.O_RDONLY)
        except FileNotFoundError:
            raise LogGoneError(log_id) from None
        problem = check_log_header(os.pread(fd, LOG_HEADER_BYTES, 0), log_id)
        if problem is not None:
            os.close(fd)
            raise EntryLogCorruptionError(self.path(log_id), 0, problem)
        self._fds[log_id] = fd
        while len(self._fds) > self._config.entry_log_open_files_max:
            _, old_fd = self._fds.popitem(last=False)
            os.close(old_fd)
        return fd

    def pread(self, log_id: int, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes of the log at ``offset`` (fewer at its end)."""
        with self._fds_lock:
            fd = self._fds.get(log_id)
            if fd is None:
                fd = self._open_for_read(log_id)
            else:
                self._fds.move_to_end(log_id)
            return os.pread(fd, size, offset)

    def read_entry(self, location: Location, ledger_id: int, entry_id: int) -> bytes:
        """The data of one entry, with its frame checked against the index."""
        buf = self.pread(location.log_id, location.offset, location.frame_bytes)
        if len(buf) != location.frame_bytes:
            raise EntryLogCorruptionError(
                self.path(location.log_id), location.offset,
                f"truncated frame: read {len(buf)} of {location.frame_bytes} bytes")
        frame = self.decode_at(buf, 0, location)
        if frame.ledger_id != ledger_id or frame.entry_id != entry_id:
            raise EntryLogCorruptionError(
                self.path(location.log_id), location.offset,
                f"frame holds entry {frame.ledger_id}:{frame.entry_id}, "
                f"the index says {ledger_id}:{entry_id}")
        return frame.data

    def read_following(self, location: Location, ledger_id: int, entry_id: int, *,
                       read_bytes: int, count_max: int, data_bytes_max: int) -> list[bytes]:
        """The data of entry ``entry_id`` (at ``location``, from the index) and
        of the ledger's following entries whose frames lie back to back after
        it within one ``pread`` of ``read_bytes``: at most ``count_max``
        entries, and the following ones only while the data of all fits
        ``data_bytes_max``. The first frame is checked as :meth:`read_entry` checks it
        (a bad one raises :class:`EntryLogCorruptionError`); a following frame
        is taken only when its length fits, its ids are the next entry's and
        its CRC32C matches, and the run stops quietly at the first that is
        not (another ledger, the end of the read, damage: a later read of
        that entry goes through the index and reports it), as read-ahead
        does. One loop, no :class:`Frame` per entry."""
        buf = self.pread(location.log_id, location.offset,
                         max(read_bytes, location.frame_bytes))
        if len(buf) < location.frame_bytes:
            raise EntryLogCorruptionError(
                self.path(location.log_id), location.offset,
                f"truncated frame: read {len(buf)} of {location.frame_bytes} bytes")
        first = self.decode_at(buf, 0, location)
        if (first.ledger_id, first.entry_id) != (ledger_id, entry_id) or \
                first.frame_bytes != location.frame_bytes:
            raise EntryLogCorruptionError(
                self.path(location.log_id), location.offset,
                f"frame holds entry {first.ledger_id}:{first.entry_id} "
                f"({first.frame_bytes} bytes), the index says {ledger_id}:{entry_id} "
                f"({location.frame_bytes} bytes)")
        out = [first.data]
        out += quorumlog_native.frames_following(
            buf, first.frame_bytes, ledger_id, entry_id + 1, count_max - 1,
            data_bytes_max - len(first.data), self._config.entry_max_bytes)
        return out

    def decode_at(self, buf: bytes, pos: int, location: Location) -> Frame:
        """Decode the frame at ``buf[pos:]`` read from ``location``; errors name the file."""
        try:
            return decode_frame(buf, pos, self._config.entry_max_bytes)
        except FrameInvalid as exc:
            raise EntryLogCorruptionError(
                self.path(location.log_id), location.offset + pos, str(exc)) from None
        except FrameIncomplete:
            raise EntryLogCorruptionError(
                self.path(location.log_id), location.offset + pos,
                "frame runs past the bytes read") from None

    def file_size(self, log_id: int) -> int:
        try:
            return self.path(log_id).stat().st_size
        except FileNotFoundError:
            return 0

    def remove(self, log_id: int) -> None:
        """Delete a sealed log whose entries are no longer indexed."""
        invariant(log_id != self.current_log_id, f"removing the current entry log {log_id:x}")
        with self._fds_lock:
            fd = self._fds.pop(log_id, None)
            if fd is not None:
                os.close(fd)
            self.path(log_id).unlink(missing_ok=True)
        fsync_directory(self._directory)

    def close(self) -> None:
        with self._append_lock:
            self._close_writer()
        with self._fds_lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
