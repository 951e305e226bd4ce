"""The :class:`Wal` object: open/create, read_all, group-committed saves, release."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import TypeVar

from quorumlog.errors import InvariantViolation, StorageError, UsageError, invariant
from quorumlog.wal._config import WalConfig
from quorumlog.wal._encoder import NOTHING, Encoded, Encoder, check_blob, segment_header
from quorumlog.wal._files import (
    DirLock,
    SegmentName,
    create_file_atomically,
    ensure_directory,
    existing_segments,
    list_segments,
    remove_temp_files,
)
from quorumlog.wal._repair import RepairReport, repair_tail
from quorumlog.wal._replay import Replay, replay
from quorumlog.wal._types import SnapshotMarker, WalContents, WalEntry
from quorumlog.wal._writer import SegmentWriter

_WRITER_THREAD_NAME = "wal-writer"
# Most saves merged into one group-commit write (bounds the pwritev vector).
_BATCH_REQUESTS_MAX = 1024

T = TypeVar("T")


def _present(value: T | None, what: str) -> T:
    """``value``, which an invariant says is there (narrows the type for mypy)."""
    if value is None:
        raise InvariantViolation(f"invariant violated: {what}")
    return value


class _Request:
    """One accepted save: its encoded frames and who waits for it."""

    __slots__ = ("done", "encoded", "error", "future", "loop", "sync")

    def __init__(
        self,
        encoded: Encoded,
        sync: bool,
        loop: asyncio.AbstractEventLoop | None,
        future: asyncio.Future[None] | None,
    ) -> None:
        self.encoded = encoded
        self.sync = sync
        self.loop = loop
        self.future = future
        self.error: str | None = None
        self.done = False

    def settle(self, error: str | None) -> None:
        self.error = error
        self.done = True
        if self.loop is not None and self.future is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                self.loop.call_soon_threadsafe(_settle_future, self.future, error)


def _settle_future(future: asyncio.Future[None], error: str | None) -> None:
    if future.done():  # the awaiting task was cancelled; the records are written anyway
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(StorageError(error))


def _config(config: WalConfig | None) -> WalConfig:
    cfg = config if config is not None else WalConfig()
    cfg.validate()
    return cfg


class Wal:
    """A write-ahead log directory; see the package docstring for the API and rules.

    Thread-safe: saves from any thread and ``save_async`` from an event loop
    may be mixed; they are written in the order they were accepted.
    """

    def __init__(
        self,
        *,
        directory: Path,
        config: WalConfig,
        contents: WalContents,
        lock: DirLock | None = None,
        encoder: Encoder | None = None,
        writer: SegmentWriter | None = None,
        needs_read_all: bool = False,
    ) -> None:
        self._directory = directory
        self._config = config
        self._contents: WalContents | None = contents
        self._lock = lock
        self._encoder = encoder
        self._writer = writer
        self._needs_read_all = needs_read_all
        self._queue_lock = threading.Lock()
        self._io_lock = threading.Lock()
        self._pending: deque[_Request] = deque()
        self._pending_bytes = 0
        self._last_async: asyncio.Future[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._writer_running = False
        self._failure: str | None = None
        self._closed = False
        self.repair_report: RepairReport | None = None

    # ----------------------------------------------------------------- opening

    @staticmethod
    def exists(directory: str | os.PathLike[str]) -> bool:
        """True if ``directory`` holds at least one WAL segment file."""
        return bool(list_segments(Path(directory)))

    @classmethod
    def create(
        cls, directory: str | os.PathLike[str], metadata: bytes, *, config: WalConfig | None = None
    ) -> Wal:
        """Create a WAL in ``directory`` (made if missing; must not hold a WAL yet).

        Writes segment 0 (crc seed 0, ``metadata``, snapshot marker (0, 0)) to a
        temp file, fsyncs and renames it. The WAL is in append mode at once.
        """
        cfg = _config(config)
        path = Path(directory)
        check_blob("metadata", metadata, cfg.record_size_max_bytes)
        ensure_directory(path)
        lock = DirLock.acquire(path)
        try:
            if list_segments(path):
                raise UsageError(f"{path} already holds a WAL; open it with Wal.open")
            remove_temp_files(path)
            name = SegmentName(seq=0, index=0)
            header, crc = segment_header(0, metadata, None, SnapshotMarker(term=0, index=0))
            fd = create_file_atomically(path / name.file_name, header, cfg.segment_size_bytes)
        except BaseException:
            lock.release()
            raise
        writer = SegmentWriter(path, [name], fd, len(header), cfg.segment_size_bytes)
        encoder = Encoder(
            metadata=metadata, segment=name, offset=len(header), crc=crc, last_index=0,
            floor=0, state=None, segment_size_bytes=cfg.segment_size_bytes,
            record_size_max_bytes=cfg.record_size_max_bytes,
        )
        contents = WalContents(metadata=metadata, state=None, entries=[])
        return cls(directory=path, config=cfg, contents=contents, lock=lock,
                   encoder=encoder, writer=writer)

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        *,
        snapshot: SnapshotMarker | None = None,
        config: WalConfig | None = None,
    ) -> Wal:
        """Open for append at ``snapshot``: lock, read, repair a torn tail.

        Call :meth:`read_all` before the first save (as in etcd).
        """
        cfg = _config(config)
        path = Path(directory)
        existing_segments(path)  # a clear error before leaving a lock file in a non-WAL dir
        lock = DirLock.acquire(path)
        try:
            remove_temp_files(path)
            result = replay(path, existing_segments(path), snapshot=snapshot,
                            record_size_max_bytes=cfg.record_size_max_bytes,
                            tolerate_torn_tail=True)
            tail = _present(result.tail, "replay ended without a tail segment")
            report = repair_tail(tail, cfg.segment_size_bytes) if tail.problem else None
            wal = cls._for_append(path, cfg, lock, result)
        except BaseException:
            lock.release()
            raise
        wal.repair_report = report
        return wal

    @classmethod
    def _for_append(cls, path: Path, cfg: WalConfig, lock: DirLock, result: Replay) -> Wal:
        tail = _present(result.tail, "replay ended without a tail segment")
        metadata = _present(result.metadata, "replay ended without metadata")
        segments = list_segments(path)
        invariant(segments[-1] == tail.name, "the tail segment changed while opening")
        fd = os.open(tail.path, os.O_RDWR | os.O_CLOEXEC)
        writer = SegmentWriter(path, segments, fd, tail.end_offset, cfg.segment_size_bytes)
        encoder = Encoder(
            metadata=metadata, segment=tail.name, offset=tail.end_offset,
            crc=tail.crc, last_index=result.last_index, floor=result.floor,
            state=result.state, segment_size_bytes=cfg.segment_size_bytes,
            record_size_max_bytes=cfg.record_size_max_bytes,
        )
        return cls(directory=path, config=cfg, contents=result.contents(), lock=lock,
                   encoder=encoder, writer=writer, needs_read_all=True)

    @classmethod
    def open_read_only(
        cls,
        directory: str | os.PathLike[str],
        *,
        snapshot: SnapshotMarker | None = None,
        config: WalConfig | None = None,
    ) -> Wal:
        """Open for reading only: no lock, no repair; a torn tail is tolerated."""
        cfg = _config(config)
        path = Path(directory)
        result = replay(path, existing_segments(path), snapshot=snapshot,
                        record_size_max_bytes=cfg.record_size_max_bytes,
                        tolerate_torn_tail=True)
        return cls(directory=path, config=cfg, contents=result.contents())

    # ----------------------------------------------------------------- reading

    @property
    def directory(self) -> Path:
        return self._directory

    @property
    def last_index(self) -> int:
        """Index of the last entry accepted (or read back), in append mode."""
        encoder = self._require_encoder()
        with self._queue_lock:
            return encoder.last_index

    def read_all(self) -> WalContents:
        """Metadata, last state and the entries after the snapshot; callable once."""
        with self._queue_lock:
            if self._contents is None:
                raise UsageError("read_all() was already called on this WAL (it hands over "
                                 "its entries once); reopen the WAL to read again")
            contents, self._contents = self._contents, None
            self._needs_read_all = False
        return contents

    # ----------------------------------------------------------------- writing

    def save(
        self, state: bytes | None = None, entries: Sequence[WalEntry] = (), *, sync: bool = True
    ) -> None:
        """Append ``entries`` then ``state`` with one write and (if ``sync``) one fdatasync.

        Entries must be contiguous and start in floor+1 .. last_index+1
        (starting at or below last_index rewrites that suffix). Blocks until
        written (and synced); raises UsageError without writing anything.
        """
        encoder = self._require_encoder()
        with self._io_lock:
            with self._queue_lock:
                self._check_writable()
                encoded = encoder.save(state, entries)
                queued = bool(self._pending)
                request = self._enqueue(encoded, sync, None, None) if queued else None
            if request is None:  # fast path: nothing queued ahead; async saves may queue behind
                self._write_direct(encoded, sync)
                return
            self._drain_locked()
        self._raise_if_failed(request)

    async def save_async(
        self, state: bytes | None = None, entries: Sequence[WalEntry] = (), *, sync: bool = True
    ) -> None:
        """Like :meth:`save`, but the write and fdatasync run on the WAL's writer thread.

        The frames are encoded (and checked) at once, in the caller; saves
        queued while the previous fdatasync runs are merged into one write and
        one fdatasync (group commit). Cancelling the await does not withdraw
        the records. Waits first if ``pending_size_max_bytes`` are queued.
        """
        loop = asyncio.get_running_loop()
        await self._wait_for_room(loop)
        future: asyncio.Future[None] = loop.create_future()
        self._accept(lambda encoder: encoder.save(state, entries), sync, loop, future)
        self._start_writer()
        await future

    def save_snapshot(self, marker: SnapshotMarker) -> None:
        """Append a snapshot marker and fdatasync (save the snapshot file first)."""
        self._run(self._accept(lambda encoder: encoder.snapshot(marker), True, None, None))

    def sync(self) -> None:
        """Write everything accepted so far and fdatasync."""
        self._run(self._accept(lambda _: NOTHING, True, None, None))

    def release_to(self, index: int) -> list[Path]:
        """Unlink whole segments before the one that may hold ``index``; return them."""
        self._require_encoder()
        with self._io_lock:
            self._check_open()
            return _present(self._writer, "append-mode WAL without a writer").release_to(index)

    def close(self) -> None:
        """Write what was accepted, fdatasync, release the lock. Idempotent."""
        with self._queue_lock:
            if self._closed:
                return
            self._closed = True
        try:
            if self._writer is not None:
                self._drain()
                if self._executor is not None:
                    self._executor.shutdown(wait=True)
                self._close_writer()
        finally:
            if self._lock is not None:
                self._lock.release()
        if self._failure is not None:
            raise StorageError(self._failure)

    def __enter__(self) -> Wal:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            with contextlib.suppress(StorageError):
                self.close()

    # ---------------------------------------------------------------- internals

    def _require_encoder(self) -> Encoder:
        if self._encoder is None:
            raise UsageError(f"WAL {self._directory} was opened read-only; it cannot be written")
        return self._encoder

    def _check_open(self) -> None:
        if self._closed:
            raise UsageError(f"WAL {self._directory} is closed")

    def _check_writable(self) -> None:
        """Called under the queue lock before a save is encoded."""
        if self._closed or self._failure is not None or self._needs_read_all:
            self._refuse_write()

    def _refuse_write(self) -> None:
        self._check_open()
        if self._failure is not None:
            raise StorageError(self._failure)
        raise UsageError("call read_all() before appending to a WAL opened with Wal.open")

    def _accept(
        self,
        encode: Callable[[Encoder], Encoded],
        sync: bool,
        loop: asyncio.AbstractEventLoop | None,
        future: asyncio.Future[None] | None,
    ) -> _Request:
        encoder = self._require_encoder()
        with self._queue_lock:
            self._check_writable()
            return self._enqueue(encode(encoder), sync, loop, future)

    def _enqueue(
        self,
        encoded: Encoded,
        sync: bool,
        loop: asyncio.AbstractEventLoop | None,
        future: asyncio.Future[None] | None,
    ) -> _Request:
        """Queue an encoded save (the queue lock is held)."""
        request = _Request(encoded, sync, loop, future)
        self._pending.append(request)
        self._pending_bytes += encoded.size_bytes
        if future is not None:
            self._last_async = future
        return request

    def _run(self, request: _Request) -> None:
        self._drain()
        self._raise_if_failed(request)

    @staticmethod
    def _raise_if_failed(request: _Request) -> None:
        invariant(request.done, "a synchronous save was not written by the drain")
        if request.error is not None:
            raise StorageError(request.error)

    def _take_batch(self) -> list[_Request]:
        """Queued requests for one write: up to batch_size_max_bytes, ending at a cut."""
        batch: list[_Request] = []
        size = 0
        limit = self._config.batch_size_max_bytes
        with self._queue_lock:
            while self._pending and len(batch) < _BATCH_REQUESTS_MAX:
                request = self._pending[0]
                if batch and size + request.encoded.size_bytes > limit:
                    break
                self._pending.popleft()
                batch.append(request)
                size += request.encoded.size_bytes
                if request.encoded.cut is not None:
                    break
            self._pending_bytes -= size
        return batch

    def _drain(self) -> None:
        """Write every queued request, batch by batch."""
        with self._io_lock:
            self._drain_locked()

    def _drain_locked(self) -> None:
        while batch := self._take_batch():
            self._write_batch(batch)

    def _write_direct(self, encoded: Encoded, sync: bool) -> None:
        """Write one save now (the I/O lock is held, nothing was queued ahead of it)."""
        writer = self._writer
        if writer is None:
            raise InvariantViolation("invariant violated: append-mode WAL without a writer")
        try:
            if encoded.buffers:
                writer.write_many(encoded.buffers)
            if encoded.cut is not None:
                writer.cut(encoded.cut)  # fsyncs the data written above
            elif sync:
                writer.sync()
        except OSError as exc:
            raise StorageError(self._fail(exc)) from exc

    def _write_batch(self, batch: list[_Request]) -> None:
        writer = _present(self._writer, "append-mode WAL without a writer")
        error = self._failure
        if error is None:
            try:
                writer.write_many([buf for request in batch for buf in request.encoded.buffers])
                cut = batch[-1].encoded.cut
                if cut is not None:
                    writer.cut(cut)  # fsyncs the data written above
                elif any(request.sync for request in batch):
                    writer.sync()
            except OSError as exc:
                error = self._fail(exc)
        for request in batch:
            request.settle(error)

    def _fail(self, exc: OSError) -> str:
        message = (
            f"WAL {self._directory}: write failed ({exc.strerror or exc}); the WAL refuses "
            "further writes. Close it and open it again (opening repairs a torn tail)."
        )
        with self._queue_lock:
            self._failure = message
            failed = list(self._pending)
            self._pending.clear()
            self._pending_bytes = 0
        for request in failed:
            request.settle(message)
        return message

    def _close_writer(self) -> None:
        with self._io_lock:
            writer = self._writer
            if writer is None:
                return
            try:
                if self._failure is None:
                    writer.sync()
            except OSError as exc:
                self._fail(exc)
            finally:
                writer.close()

    async def _wait_for_room(self, loop: asyncio.AbstractEventLoop) -> None:
        limit = self._config.pending_size_max_bytes
        while True:
            with self._queue_lock:
                waiter = self._last_async
                full = self._pending_bytes >= limit
            if not full or waiter is None or waiter.done() or waiter.get_loop() is not loop:
                return
            await asyncio.wait([waiter])

    def _start_writer(self) -> None:
        with self._queue_lock:
            if self._writer_running or self._closed:
                return  # the running writer (or close()) writes what is queued
            self._writer_running = True
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix=_WRITER_THREAD_NAME
                )
            self._executor.submit(self._writer_main)

    def _writer_main(self) -> None:
        while True:
            self._drain()
            with self._queue_lock:
                if not self._pending:
                    self._writer_running = False
                    return
