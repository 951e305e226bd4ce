"""The ledger storage engine of a bookie (after BookKeeper's DbLedgerStorage).

Write path: ``add`` puts the entry in the active half of the write cache.
``flush`` swaps the halves, sorts the frozen half by (ledger, entry), appends it
to the current entry log (one write, one fsync), then commits one synced
RocksDB batch with the entries' locations, the per-log usage, the dirty ledger
records, pending ledger deletions and the caller's checkpoint token.

Read path: write cache (active, then frozen half) -> read cache -> index +
entry log (with read-ahead for sequential readers).

Threading contract
------------------
* *Caller-thread* methods (meant for one asyncio event-loop thread; they are
  also safe from several threads): ``add``, ``get_entry``, ``read_batch``, the
  ledger metadata methods, ``delete_ledger``, ``check_disk_usage``, ``stats``.
  They never block on the flush or on compaction, with two bounded exceptions:
  a read that misses both caches reads the entry log (``pread``), and ``add``
  waits at most ``add_max_wait_ms`` when both write cache halves are full.
* *Maintenance* methods do blocking disk I/O and belong in a worker thread
  (``await asyncio.to_thread(storage.flush, token)``): ``flush``, ``compact``,
  ``verify``, ``close``. ``flush`` calls are serialized among themselves, as are
  ``compact`` calls; a flush and a compaction may run at the same time.
* Locks, in the only order they nest: flush/compact lock -> commit lock (index
  batches + usage) -> state lock (a Condition: write cache halves, ledger
  table; adds wait on it) -> read lock (read cache). The entry logs' append
  and descriptor locks are leaves.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType

from quorumlog.bookie._caches import EntryKey, ReadCache, SequentialReads, WriteCache
from quorumlog.bookie._compaction import Compactor
from quorumlog.bookie._config import FRAME_OVERHEAD_BYTES, LedgerStorageConfig
from quorumlog.bookie._entrylog import (
    AppendedFrames,
    EntryLogs,
    LogGoneError,
    PendingFrame,
    recover_log_files,
)
from quorumlog.bookie._format import (
    ID_LIMIT,
    NO_ENTRY,
    FrameIncomplete,
    FrameInvalid,
    Location,
    decode_frame,
)
from quorumlog.bookie._index import Index
from quorumlog.bookie._ledgers import LedgerInfo, LedgerRecord, LedgerTable, info_of
from quorumlog.bookie._results import (
    CompactionResult,
    FlushResult,
    ScrubReport,
    StorageStats,
)
from quorumlog.bookie._storage_errors import EntryLogCorruptionError
from quorumlog.bookie._usage import UsageChanges, UsageTable
from quorumlog.errors import InvariantViolation, QuorumlogError, StorageError, UsageError
from quorumlog.log import get_logger
from quorumlog.proto import (
    EntryTooLargeError,
    NoSuchEntryError,
    ReadOnlyError,
    WriteCacheFullError,
)

_log = get_logger(__name__)

INDEX_DIRECTORY = "index"
# A checkpoint token is a journal position: small. Bound it anyway.
CHECKPOINT_MAX_BYTES = 1024
# A read retries its index lookup once when compaction removed the entry log
# between the lookup and the read (the index already points at the copy).
LOG_GONE_RETRIES = 1
# A batch read reads the frames lying back to back in an entry log with one
# pread of at most this many bytes (bounds the buffer; more is read by the
# next pread).
READ_RUN_BYTES_MAX = 8 * 1024 * 1024
# needs_flush turns true when the active half is this full.
FLUSH_SUGGESTED_FRACTION = 0.5

DiskUsageProbe = Callable[[], float]


def filesystem_usage(directory: Path) -> DiskUsageProbe:
    """A probe returning used/total of the file system holding ``directory``."""

    def probe() -> float:
        usage = shutil.disk_usage(directory)
        return usage.used / usage.total if usage.total else 1.0

    return probe


@dataclass(frozen=True, slots=True)
class _FlushPlan:
    """What one flush writes: taken atomically when the write cache is swapped."""

    entries: dict[EntryKey, bytes]
    records: dict[int, LedgerRecord]
    deletes: frozenset[int]


def _sorted_frames(entries: dict[EntryKey, bytes],
                   deletes: frozenset[int]) -> list[PendingFrame]:
    """A frozen write cache half as frames sorted by (ledger, entry), deleted
    ledgers left out. Keys are sorted as one int each (ledger id in the high
    64 bits): cheaper than comparing tuples."""
    keys = sorted([ledger_id << 64 | entry_id for ledger_id, entry_id in entries])
    mask = (1 << 64) - 1
    frames: list[PendingFrame] = []
    append = frames.append
    for key in keys:
        ledger_id, entry_id = key >> 64, key & mask
        if ledger_id not in deletes:
            append((ledger_id, entry_id, entries[ledger_id, entry_id]))
    return frames


# Errors of one entry in a batch of adds (the others may still be stored).
_ENTRY_ERRORS = (EntryTooLargeError, WriteCacheFullError, UsageError)


def _over_budget(total_bytes: int, budget: int, taken: int) -> bool:
    """Would a run of ``taken`` entries so far go over its budget with
    ``total_bytes``? A negative budget is ``-max_bytes`` for the run that
    starts a batch read: its first entry is taken whatever its size."""
    if budget >= 0:
        return total_bytes > budget
    return taken > 0 and total_bytes > -budget


def _check_id(kind: str, value: int) -> None:
    if not 0 <= value < ID_LIMIT:
        raise UsageError(f"{kind} id {value} is out of range [0, 2**63)")


class LedgerStorage:
    """Entries of many ledgers in one ledger directory. See the module docstring."""

    def __init__(
        self,
        directory: str | Path,
        config: LedgerStorageConfig | None = None,
        *,
        disk_usage_probe: DiskUsageProbe | None = None,
    ) -> None:
        self._config = config if config is not None else LedgerStorageConfig()
        self._config.validate()
        self._directory = Path(directory)
        self._directory.mkdir(parents=True, exist_ok=True)
        self._probe = disk_usage_probe or filesystem_usage(self._directory)
        self._stats = StorageStats()
        self._closed = False
        self._read_only = False
        self._plan: _FlushPlan | None = None
        self._flush_lock = threading.Lock()
        self._compact_lock = threading.Lock()
        self._commit_lock = threading.Lock()
        self._cond = threading.Condition(threading.Lock())
        self._read_lock = threading.Lock()
        self._write_cache = WriteCache(self._config.write_cache_half_bytes)
        self._read_cache = ReadCache(self._config.read_cache_max_bytes,
                                     self._config.read_cache_segment_count)
        self._sequential = SequentialReads(self._config.read_ahead_tracked_ledgers_max)
        self._index = Index(self._directory / INDEX_DIRECTORY, self._config)
        try:
            self._recover()
        except BaseException:
            self._index.close()
            raise
        self._compactor = Compactor(
            config=self._config, index=self._index, logs=self._logs, usage=self._usage,
            commit_lock=self._commit_lock, stats=self._stats,
        )
        self.check_disk_usage()

    def _recover(self) -> None:
        usage = self._index.load_usage()
        report = recover_log_files(self._directory, usage)
        if report.stale_usage_records:
            batch = self._index.new_batch()
            for log_id in report.stale_usage_records:
                batch.delete_usage(log_id)
                del usage[log_id]
            self._index.commit(batch)
        self._usage = UsageTable(usage)
        self._logs = EntryLogs(self._directory, self._config, report.next_log_id)
        self._ledgers = LedgerTable(self._index.load_ledgers())
        _log.info("ledger_storage_opened", directory=str(self._directory),
                  entry_logs=len(usage), truncated=report.truncated_bytes,
                  removed_logs=report.removed_logs, ledgers=len(self._ledgers.live_ids()))

    # -- lifecycle ---------------------------------------------------------------

    @property
    def directory(self) -> Path:
        return self._directory

    @property
    def config(self) -> LedgerStorageConfig:
        return self._config

    def _check_open(self) -> None:
        if self._closed:
            raise UsageError(f"ledger storage {self._directory} is closed")

    def close(self, *, flush: bool = True) -> None:
        """Close; with ``flush`` the write cache is flushed first (checkpoint kept)."""
        with self._flush_lock, self._compact_lock:
            if self._closed:
                return
            try:
                if flush:
                    self._flush_locked(None)
            finally:
                with self._cond:
                    self._closed = True
                    self._cond.notify_all()
                self._logs.close()
                self._index.close()

    def __enter__(self) -> LedgerStorage:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(flush=exc_type is None)

    @property
    def stats(self) -> StorageStats:
        """A copy of the counters."""
        return replace(self._stats)

    # -- ledger metadata ---------------------------------------------------------

    def set_master_key(self, ledger_id: int, master_key: bytes) -> None:
        """Create the ledger with this master key, or check it matches (UnauthorizedError)."""
        _check_id("ledger", ledger_id)
        with self._cond:
            self._check_open()
            self._ledgers.set_master_key(ledger_id, master_key)

    def ledger_exists(self, ledger_id: int) -> bool:
        with self._cond:
            record = self._ledgers.get(ledger_id)
            return record is not None and not record.deleted

    def ledger_ids(self) -> list[int]:
        with self._cond:
            return self._ledgers.live_ids()

    def ledger_info(self, ledger_id: int) -> LedgerInfo:
        with self._cond:
            return info_of(ledger_id, self._ledgers.get_live(ledger_id))

    def set_fenced(self, ledger_id: int) -> int:
        """Fence the ledger (idempotent); returns its last add confirmed (-1: none)."""
        with self._cond:
            self._check_open()
            return self._ledgers.fence(ledger_id)

    def is_fenced(self, ledger_id: int) -> bool:
        with self._cond:
            return self._ledgers.get_live(ledger_id).fenced

    def set_explicit_lac(self, ledger_id: int, lac: int) -> None:
        """Record an explicit LAC; the storage keeps the highest one seen."""
        _check_id("entry", lac)
        with self._cond:
            self._check_open()
            self._ledgers.set_explicit_lac(ledger_id, lac)

    def last_add_confirmed(self, ledger_id: int) -> int:
        """max(explicit LAC, piggybacked LAC); -1 when none was seen."""
        with self._cond:
            return self._ledgers.get_live(ledger_id).last_add_confirmed

    def last_entry_id(self, ledger_id: int) -> int:
        """The highest entry id held (write cache included); -1 when none."""
        with self._cond:
            return self._ledgers.get_live(ledger_id).last_entry_id

    def delete_ledger(self, ledger_id: int) -> bool:
        """Delete the ledger; False if unknown. Its index entries go at the next flush."""
        with self._cond:
            self._check_open()
            if not self._ledgers.mark_deleted(ledger_id):
                return False
            self._write_cache.drop_ledger(ledger_id)
            self._cond.notify_all()
        self._forget_reads(ledger_id)
        self._stats.deleted_ledgers += 1
        return True

    def _forget_reads(self, ledger_id: int) -> None:
        with self._read_lock:
            self._read_cache.drop_ledger(ledger_id)
            self._sequential.forget(ledger_id)

    # -- add ---------------------------------------------------------------------

    def add(
        self,
        ledger_id: int,
        entry_id: int,
        data: bytes,
        *,
        master_key: bytes,
        piggyback_lac: int = NO_ENTRY,
        recovery: bool = False,
    ) -> bool:
        """Add an entry to the write cache; False if it was already held (idempotent).

        Creates the ledger on first add. Raises UnauthorizedError (master key),
        LedgerFencedError (fenced and not ``recovery``), EntryTooLargeError,
        ReadOnlyError and WriteCacheFullError (both retriable).
        """
        if not (0 <= ledger_id < ID_LIMIT and 0 <= entry_id < ID_LIMIT):  # hot path: inline
            _check_id("ledger", ledger_id)
            _check_id("entry", entry_id)
        if len(data) > self._config.entry_max_bytes:
            raise EntryTooLargeError(
                f"entry {ledger_id}:{entry_id} has {len(data)} bytes, over entry_max_bytes "
                f"{self._config.entry_max_bytes}; split it or raise the limit")
        if type(data) is not bytes:
            data = bytes(data)
        with self._cond:
            if not self._admit(ledger_id, entry_id, master_key, piggyback_lac, recovery):
                return False
            if not self._write_cache.has_room(len(data)):
                self._wait_for_room(len(data))
                if not self._admit(ledger_id, entry_id, master_key, piggyback_lac, recovery):
                    return False
            self._write_cache.put(ledger_id, entry_id, data)
            self._ledgers.note_add(ledger_id, entry_id, piggyback_lac)
        self._stats.adds += 1
        return True

    def add_many(self, ledger_id: int, entries: Sequence[tuple[int, bytes, int]], *,
                 master_key: bytes, recovery: bool = False) -> dict[int, QuorumlogError]:
        """Add a batch of one ledger's entries, ``(entry id, data, piggybacked LAC)``
        each, in order, as :meth:`add` would one by one, under one lock hold.

        What holds for the whole ledger (closed or read-only storage, master
        key, fencing, deletion) is checked once and raised before anything is
        stored. Returns the entries that failed on their own (by position in
        ``entries``: ``EntryTooLargeError``, ``WriteCacheFullError``); the rest
        are held (a duplicate keeps its first copy, as :meth:`add`). Entry ids
        ascending and new to the ledger take one dict update; anything else goes
        one by one.
        """
        entry_max_bytes = self._config.entry_max_bytes
        total, previous = 0, -1
        for entry_id, data, _ in entries:
            if not (previous < entry_id < ID_LIMIT and len(data) <= entry_max_bytes
                    and type(data) is bytes):
                return self._add_each(ledger_id, entries, master_key, recovery)
            total += len(data)
            previous = entry_id
        if not entries:
            return {}
        _check_id("ledger", ledger_id)
        with self._cond:
            self._check_open()
            if self._read_only:
                self._stats.add_rejected_read_only += 1
                raise ReadOnlyError(
                    f"ledger storage {self._directory} is read-only: disk usage is over "
                    f"{self._config.disk_usage_threshold_fraction:.0%}; write to other bookies")
            record = self._ledgers.check_add(ledger_id, master_key, recovery=recovery)
            if not self._write_cache.has_room(total) or (
                    entries[0][0] <= record.last_entry_id):
                fresh = None  # waits for room, or duplicates to sort out: one by one
            else:
                fresh = entries
                self._write_cache.put_many(ledger_id, entries, total)
                self._ledgers.note_add(ledger_id, entries[-1][0],
                                       max(lac for _, _, lac in entries))
        if fresh is None:
            return self._add_each(ledger_id, entries, master_key, recovery)
        self._stats.adds += len(entries)
        return {}

    def _add_each(self, ledger_id: int, entries: Sequence[tuple[int, bytes, int]],
                  master_key: bytes, recovery: bool) -> dict[int, QuorumlogError]:
        """:meth:`add_many` one entry at a time (duplicates, waits for room, large
        entries); a ledger-wide error still raises before anything is stored."""
        failed: dict[int, QuorumlogError] = {}
        stored_any = False
        for position, (entry_id, data, lac) in enumerate(entries):
            try:
                self.add(ledger_id, entry_id, data, master_key=master_key, piggyback_lac=lac,
                         recovery=recovery)
            except InvariantViolation:
                raise
            except QuorumlogError as exc:
                if not stored_any and not isinstance(exc, _ENTRY_ERRORS):
                    raise  # ledger-wide, and nothing is stored yet
                failed[position] = exc
                continue
            stored_any = True
        return failed

    def _admit(self, ledger_id: int, entry_id: int, master_key: bytes,
               piggyback_lac: int, recovery: bool) -> bool:
        """Checks before an add (state lock held); False for a duplicate."""
        self._check_open()
        if self._read_only:
            self._stats.add_rejected_read_only += 1
            raise ReadOnlyError(
                f"ledger storage {self._directory} is read-only: disk usage is over "
                f"{self._config.disk_usage_threshold_fraction:.0%}; write to other bookies")
        if not self._ledgers.admit_add(ledger_id, entry_id, master_key,
                                       piggyback_lac=piggyback_lac, recovery=recovery,
                                       holds=self._holds):
            self._stats.add_duplicates += 1
            return False
        return True

    def _holds(self, ledger_id: int, entry_id: int) -> bool:
        if self._write_cache.get(ledger_id, entry_id) is not None:
            return True
        return self._index.get_location(ledger_id, entry_id) is not None

    def _wait_for_room(self, data_bytes: int) -> None:
        self._stats.add_waits += 1
        room = self._cond.wait_for(
            lambda: self._closed or self._write_cache.has_room(data_bytes),
            timeout=self._config.add_max_wait_ms / 1000,
        )
        self._check_open()
        if not room:
            self._stats.add_rejected_write_cache_full += 1
            raise WriteCacheFullError(
                f"write cache of {self._directory} is full (both halves of "
                f"{self._write_cache.half_bytes} bytes) and no flush made room within "
                f"{self._config.add_max_wait_ms} ms; retry later")

    @property
    def write_cache_bytes(self) -> int:
        with self._cond:
            return self._write_cache.active_bytes + self._write_cache.frozen_bytes

    @property
    def needs_flush(self) -> bool:
        """True when the active half is filling up: schedule a flush."""
        with self._cond:
            threshold = self._write_cache.half_bytes * FLUSH_SUGGESTED_FRACTION
            return self._write_cache.active_bytes >= threshold

    # -- read --------------------------------------------------------------------

    def get_entry(self, ledger_id: int, entry_id: int) -> bytes:
        """The entry's data; NoSuchLedgerError / NoSuchEntryError when absent."""
        _check_id("ledger", ledger_id)
        _check_id("entry", entry_id)
        with self._cond:
            self._check_open()
            self._ledgers.get_live(ledger_id)
            data = self._write_cache.get(ledger_id, entry_id)
        if data is not None:
            self._stats.write_cache_hits += 1
            return data
        with self._read_lock:
            data = self._read_cache.get(ledger_id, entry_id)
            sequential = self._sequential.is_next(ledger_id, entry_id)
            self._sequential.note(ledger_id, entry_id)
        if data is not None:
            self._stats.read_cache_hits += 1
            return data
        return self._read_from_log(ledger_id, entry_id, read_ahead=sequential)

    def _read_from_log(self, ledger_id: int, entry_id: int, *, read_ahead: bool) -> bytes:
        for _ in range(LOG_GONE_RETRIES + 1):
            location = self._index.get_location(ledger_id, entry_id)
            if location is None:
                raise NoSuchEntryError(
                    f"entry {ledger_id}:{entry_id} is not on this bookie; "
                    "try another replica of the ledger")
            try:
                if read_ahead:
                    return self._read_ahead(ledger_id, entry_id, location)
                data = self._logs.read_entry(location, ledger_id, entry_id)
            except LogGoneError:
                continue  # compaction moved it: the index points at the copy now
            self._stats.entry_log_reads += 1
            with self._read_lock:
                self._read_cache.put(ledger_id, entry_id, data)
            return data
        raise StorageError(
            f"entry {ledger_id}:{entry_id}: its entry log was removed twice while reading; "
            "retry the read", retriable=True)

    def _read_ahead(self, ledger_id: int, entry_id: int, location: Location) -> bytes:
        """Read the entry and the ledger's following entries in one pread."""
        size = max(self._config.read_ahead_bytes, location.frame_bytes)
        buf = self._logs.pread(location.log_id, location.offset, size)
        first = self._logs.decode_at(buf, 0, location)
        if (first.ledger_id, first.entry_id) != (ledger_id, entry_id):
            raise EntryLogCorruptionError(
                self._logs.path(location.log_id), location.offset,
                f"frame holds entry {first.ledger_id}:{first.entry_id}, "
                f"the index says {ledger_id}:{entry_id}")
        following = self._following_frames(buf, first.frame_bytes, ledger_id, entry_id)
        with self._read_lock:
            self._read_cache.put(ledger_id, entry_id, first.data)
            for next_id, data in following:
                self._read_cache.put(ledger_id, next_id, data)
        self._stats.entry_log_reads += 1
        self._stats.read_ahead_batches += 1
        self._stats.read_ahead_entries += len(following)
        return first.data

    def _following_frames(
        self, buf: bytes, pos: int, ledger_id: int, entry_id: int
    ) -> list[tuple[int, bytes]]:
        """Valid frames of the same ledger after ``pos``, ids increasing, bounded.

        Stops quietly at anything else: the buffer may end inside a frame or
        reach bytes a concurrent flush is still writing. Only the entry asked
        for is an error when damaged.
        """
        found: list[tuple[int, bytes]] = []
        last_id = entry_id
        while len(found) + 1 < self._config.read_ahead_entries:
            try:
                frame = decode_frame(buf, pos, self._config.entry_max_bytes)
            except (FrameIncomplete, FrameInvalid):
                break
            if frame.ledger_id != ledger_id or frame.entry_id <= last_id:
                break
            found.append((frame.entry_id, frame.data))
            last_id = frame.entry_id
            pos += frame.frame_bytes
        return found

    def read_batch(
        self, ledger_id: int, first_entry_id: int, max_entries: int, max_bytes: int
    ) -> list[bytes]:
        """Consecutive entries from ``first_entry_id``: at most ``max_entries`` and
        ``max_bytes`` of data, but always the first one (NoSuchEntryError if absent).

        Runs of entries come from the write cache, the read cache or the
        entry logs, whichever holds the run's first entry: a log run is one
        index lookup and one ``pread`` of the frames lying back to back from
        there, each checked (``EntryLogs.read_following``), so a sequential
        reader costs no index lookup, read-ahead or read-cache insert per
        entry. A damaged frame ends the batch before it, or raises
        ``EntryLogCorruptionError`` when it is the first entry asked for.
        """
        if max_entries <= 0 or max_bytes <= 0:
            raise UsageError("read_batch needs max_entries > 0 and max_bytes > 0")
        _check_id("ledger", ledger_id)
        _check_id("entry", first_entry_id)
        last = min(self.last_entry_id(ledger_id), first_entry_id + max_entries - 1)
        entries: list[bytes] = []
        total_bytes, entry_id = 0, first_entry_id
        while entry_id <= last:
            # budget < 0: the batch's first entry, taken whatever its size
            budget = max_bytes - total_bytes if entries else -max_bytes
            if entries and budget <= 0:
                break
            try:
                run = (self._write_cache_run(ledger_id, entry_id, last, budget)
                       or self._read_cache_run(ledger_id, entry_id, last, budget)
                       or self._log_run(ledger_id, entry_id, last, budget))
            except EntryLogCorruptionError:
                if not entries:
                    raise
                break  # the entries before it go out; a read starting there reports it
            if not run:
                break
            entries += run
            total_bytes += sum(map(len, run))
            entry_id += len(run)
        if not entries:
            return [self.get_entry(ledger_id, first_entry_id)]  # the precise error
        with self._read_lock:
            self._sequential.note(ledger_id, entry_id - 1)
        return entries

    def _write_cache_run(self, ledger_id: int, first_entry_id: int, last_entry_id: int,
                         max_bytes: int) -> list[bytes]:
        """Consecutive write-cache hits under one hold of the state lock."""
        run: list[bytes] = []
        total = 0
        with self._cond:
            self._check_open()
            self._ledgers.get_live(ledger_id)
            get = self._write_cache.get
            for entry_id in range(first_entry_id, last_entry_id + 1):
                data = get(ledger_id, entry_id)
                if data is None or _over_budget(total + len(data), max_bytes, len(run)):
                    break
                run.append(data)
                total += len(data)
        self._stats.write_cache_hits += len(run)
        return run

    def _read_cache_run(self, ledger_id: int, first_entry_id: int, last_entry_id: int,
                        max_bytes: int) -> list[bytes]:
        """Consecutive read-cache hits under one lock (what :meth:`get_entry`
        would return one by one for entries no longer in the write cache)."""
        with self._read_lock:
            run = self._read_cache.get_run(ledger_id, first_entry_id, last_entry_id, max_bytes)
        if not run:
            return run
        with self._cond:
            self._check_open()
            self._ledgers.get_live(ledger_id)
            # An entry still in the write cache wins (get_entry's order): keep
            # only the prefix the write cache does not hold.
            for index in range(len(run)):
                if self._write_cache.get(ledger_id, first_entry_id + index) is not None:
                    del run[index:]
                    break
        self._stats.read_cache_hits += len(run)
        return run

    def _log_run(self, ledger_id: int, first_entry_id: int, last_entry_id: int,
                 budget: int) -> list[bytes]:
        """Consecutive entries from the entry logs: the index locates the
        first one, and the ledger's following entries are taken from the
        frames that lie back to back after it (a flush writes a ledger's
        entries in order), read with the same ``pread``
        (``EntryLogs.read_following``). Empty when the index does not hold
        the first one."""
        count_max = last_entry_id - first_entry_id + 1
        for _ in range(LOG_GONE_RETRIES + 1):
            location = self._index.get_location(ledger_id, first_entry_id)
            if location is None:
                return []
            data_bytes = location.frame_bytes - FRAME_OVERHEAD_BYTES
            if _over_budget(data_bytes, budget, 0):
                return []
            # Read as if the following entries were the size of the first.
            room = abs(budget) // max(1, data_bytes)
            size = location.frame_bytes * max(1, min(count_max, room))
            try:
                run = self._logs.read_following(
                    location, ledger_id, first_entry_id,
                    read_bytes=min(max(size, location.frame_bytes), READ_RUN_BYTES_MAX),
                    count_max=count_max, data_bytes_max=abs(budget))
            except LogGoneError:
                continue  # compaction moved it: the index points at the copy now
            self._stats.entry_log_reads += 1
            self._stats.batch_log_entries += len(run)
            return run
        raise StorageError(
            f"entry {ledger_id}:{first_entry_id}: its entry log was removed twice while "
            "reading; retry the read", retriable=True)

    # -- flush -------------------------------------------------------------------

    def flush(self, checkpoint: bytes | None = None) -> FlushResult:
        """Write the write cache to the entry logs and the index; blocking I/O.

        ``checkpoint`` (opaque, e.g. a journal position) is stored in the same
        index batch; capture it *before* calling flush: every add that returned
        before that is covered, so journal replay may start there. ``None``
        keeps the previous checkpoint.
        """
        if checkpoint is not None and len(checkpoint) > CHECKPOINT_MAX_BYTES:
            raise UsageError(f"checkpoint token over {CHECKPOINT_MAX_BYTES} bytes")
        with self._flush_lock:
            self._check_open()
            result = self._flush_locked(checkpoint)
        self.check_disk_usage()
        return result

    def _flush_locked(self, checkpoint: bytes | None) -> FlushResult:
        if self._plan is not None:  # a previous flush failed half way: finish it first
            self._execute(self._plan, None)
        with self._cond:
            entries = self._write_cache.swap()
            records, deletes = self._ledgers.take_snapshot()
            self._plan = _FlushPlan(entries, records, deletes)
            self._cond.notify_all()
        return self._execute(self._plan, checkpoint)

    def _execute(self, plan: _FlushPlan, checkpoint: bytes | None) -> FlushResult:
        frames = _sorted_frames(plan.entries, plan.deletes)
        appended = self._logs.append_encoded(frames) if frames else AppendedFrames()
        try:
            with self._commit_lock:
                self._commit_plan(plan, frames, appended, checkpoint)
        finally:
            self._logs.release_logs(appended.log_ids)
        with self._cond:
            self._write_cache.release_frozen()
            self._ledgers.forget_deleted(plan.deletes)
            self._plan = None
            self._cond.notify_all()
        for ledger_id in plan.deletes:
            self._forget_reads(ledger_id)
        data_bytes = sum(written for _, written in appended.written.values()) - (
            FRAME_OVERHEAD_BYTES * len(frames))
        self._stats.flushes += 1
        self._stats.flushed_entries += len(frames)
        self._stats.flushed_bytes += data_bytes
        return FlushResult(entries=len(frames), data_bytes=data_bytes,
                           deleted_ledgers=len(plan.deletes))

    def _commit_plan(self, plan: _FlushPlan, frames: list[PendingFrame],
                     appended: AppendedFrames, checkpoint: bytes | None) -> None:
        batch = self._index.new_batch()
        changes = UsageChanges()
        batch.put_encoded_locations(frames, appended.locations)
        for log_id, (end_offset, frame_bytes) in appended.written.items():
            changes.made_live_run(log_id, end_offset, frame_bytes)
        for ledger_id in plan.deletes:
            for _, location in self._index.ledger_locations(ledger_id):
                changes.made_dead(location)
            batch.delete_ledger(ledger_id)
        for ledger_id, record in plan.records.items():
            if ledger_id not in plan.deletes:
                batch.put_ledger(ledger_id, record)
        if checkpoint is not None:
            batch.put_checkpoint(checkpoint)
        if len(batch):
            self._usage.commit(self._index, batch, changes)

    def missing_from_index(self, ledger_id: int, entry_ids: Sequence[int]) -> list[int]:
        """Which of ``entry_ids`` the index (what a flush made durable) does not
        hold; the write cache does not count. Blocking reads (a worker thread).
        After a flush that started after some adds, those adds are durable
        exactly when this returns none of them (``FlushLedgerRequest``)."""
        _check_id("ledger", ledger_id)
        self._check_open()
        get_location = self._index.get_location
        return [entry_id for entry_id in entry_ids
                if not 0 <= entry_id < ID_LIMIT or get_location(ledger_id, entry_id) is None]

    def last_checkpoint(self) -> bytes | None:
        """The checkpoint of the last flush that had one: journal replay starts there."""
        self._check_open()
        return self._index.checkpoint()

    # -- garbage collection --------------------------------------------------------

    def compact(self, live_ratio_threshold: float) -> CompactionResult:
        """Rewrite sealed entry logs whose live/total ratio is below the threshold.

        Blocking I/O (a worker thread); may run while a flush runs. Deleted
        ledgers are dropped from the index by ``flush`` first.
        """
        if not 0.0 <= live_ratio_threshold <= 1.0:
            raise UsageError("live_ratio_threshold is a fraction in [0, 1]")
        with self._compact_lock:
            self._check_open()
            result = self._compactor.run(live_ratio_threshold)
        if result.compacted_logs:
            _log.info("entry_logs_compacted", logs=[f"{x:x}" for x in result.compacted_logs],
                      reclaimed_bytes=result.reclaimed_bytes, copied_bytes=result.copied_bytes)
        self.check_disk_usage()
        return result

    def entry_log_usage(self) -> dict[int, tuple[int, int]]:
        """log id -> (total bytes, live bytes), as committed to the index."""
        with self._commit_lock:
            snapshot = self._usage.snapshot()
        return {log_id: (u.total_bytes, u.live_bytes) for log_id, u in snapshot.items()}

    # -- scrub ---------------------------------------------------------------------

    def verify(self) -> ScrubReport:
        """Read every indexed entry and check its frame (CRC, ids); blocking I/O."""
        self._check_open()
        report = ScrubReport()
        for ledger_id, entry_id, location in self._index.all_locations():
            try:
                data = self._read_checked(ledger_id, entry_id, location)
            except StorageError as exc:  # CorruptionError included
                report.error_count += 1
                if len(report.errors) < self._config.scrub_errors_max:
                    report.errors.append(exc.message)
                continue
            if data is not None:
                report.entries_checked += 1
                report.bytes_checked += len(data)
        return report

    def _read_checked(self, ledger_id: int, entry_id: int, location: Location) -> bytes | None:
        """Read one indexed entry; None if it vanished (compacted, deleted) meanwhile."""
        try:
            return self._logs.read_entry(location, ledger_id, entry_id)
        except LogGoneError:
            moved = self._index.get_location(ledger_id, entry_id)
            if moved is None or moved == location:
                return None
            try:
                return self._logs.read_entry(moved, ledger_id, entry_id)
            except LogGoneError:
                return None  # compacted twice while scrubbing: checked on the next run

    # -- disk usage ----------------------------------------------------------------

    def disk_usage(self) -> float:
        """Used fraction of the ledger directory's file system."""
        usage = self._probe()
        if not 0.0 <= usage <= 1.0:
            raise UsageError(f"disk usage probe returned {usage}, not a fraction in [0, 1]")
        return usage

    @property
    def read_only(self) -> bool:
        return self._read_only

    def check_disk_usage(self) -> float:
        """Measure usage; turn read-only at the threshold, writable below the lwm."""
        usage = self.disk_usage()
        with self._cond:
            was = self._read_only
            if usage >= self._config.disk_usage_threshold_fraction:
                self._read_only = True
            elif usage < self._config.disk_usage_lwm_fraction:
                self._read_only = False
            now = self._read_only
        if now != was:
            _log.warning("ledger_storage_read_only" if now else "ledger_storage_writable",
                         directory=str(self._directory), disk_usage=round(usage, 4))
        return usage
