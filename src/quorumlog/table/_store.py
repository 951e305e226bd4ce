"""One partition replica's data: a RocksDB instance (rocksdict) and the rules
that apply table writes to it.

The store is the partition's Raft state machine. :meth:`TableStore.apply`
takes committed entries in log order and writes each as one RocksDB write
batch that also records the entry's decree (log index), so data and
``applied_decree`` always agree, even after a crash: RocksDB may lose its
last unsynced writes, but then it loses the decree with them and Raft applies
those entries again (Pegasus keeps ``last_flushed_decree`` the same way).
Reads take ``now_s`` from the caller so that TTL is decided by one clock.

Snapshots are RocksDB checkpoints (:meth:`checkpoint`): hard links to the
immutable SST files plus a copy of the small live files, taken in the thread
that applies, so a checkpoint holds exactly the entries up to
``applied_decree``.
"""

from __future__ import annotations

import os
import shutil
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from rocksdict import (
    Checkpoint,
    DBCompressionType,
    Options,
    Rdict,
    WriteBatch,
)

from quorumlog.errors import InvariantViolation, LockedError, StorageError, invariant
from quorumlog.table._codec import (
    STORE_KEY_PREFIX,
    Record,
    check_key,
    check_value,
    decode_key,
    decode_record,
    encode_key,
    encode_record,
    hash_key_prefix,
    prefix_end,
)
from quorumlog.table._commands import (
    INT64_MAX,
    INT64_MIN,
    CheckAndMutateCommand,
    CheckResult,
    CollectGarbage,
    DeleteCommand,
    Done,
    DuplicateCommand,
    IncrCommand,
    IncrResult,
    MultiDeleteCommand,
    MultiSetCommand,
    Refused,
    SetCommand,
    TableEntry,
    WriteCommand,
    WriteResult,
    check_passes,
    has_local_writes,
    parse_int64,
)
from quorumlog.table._errors import BadTableRequestError, TableError
from quorumlog.table._layout import partition_of
from quorumlog.table._sessions import ClientSessions, SessionCache
from quorumlog.table._timetag import CLUSTER_ID_MAX, check_cluster_id, make_timetag

KEY_APPLIED_DECREE = STORE_KEY_PREFIX + b"applied_decree"
# The decree of the last tombstone collection (the mark) and the key it stopped
# after (b"": the next one starts at the beginning).
KEY_GC_STATE = STORE_KEY_PREFIX + b"gc_state"

REPLACED_SUFFIX = ".replaced"
"""The store's old directory while a restore swaps a checkpoint in."""
KEY_FORMAT_VERSION = STORE_KEY_PREFIX + b"format_version"
STORE_FORMAT_VERSION = 1
SCAN_LIMIT_MAX = 10_000  # records one scan call returns at most; page for more
# A scan page also ends once it holds this many bytes of keys and values (one
# record at least): pages of large values would not fit an rpc frame (16 MiB).
SCAN_PAGE_BYTES_MAX = 4 * 1024 * 1024
INFO_LOG_FILES_MAX = 2
WRITE_BUFFER_BYTES = 4 * 1024 * 1024
"""A replica's memtable size (RocksDB's default is 64 MiB). A set puts about
four keys in the memtable (the record, its client's result, the result it
replaces, the session row), and a skip-list insert slows as the memtable
grows past the caches: in a 3-node run of 8 partitions in one copyset,
``InlineSkipList::Insert`` was 11 % of the leader's CPU (perf). 4 MiB halved
the write of a 25-set batch (90 -> 47 us, bench-like keys, docs/table.md
"Partitions and copysets") and bounds the memory of a node's hundreds of replicas."""
_U64 = struct.Struct(">Q")
# applied_decree, and the smallest timestamp of an entry with local writes
# applied after the GC mark (NO_ENTRY_US: none). A store written before it holds the decree alone
# (read as "unknown": 0, which bounds a collection to nothing unshipped).
_APPLIED = struct.Struct(">QQ")
NO_ENTRY_US = (1 << 64) - 1
US_PER_S = 1_000_000
FILTERED_SCAN_SKIP_MAX = 10_000
"""Records of other partitions one filtered full-scan page passes over at most
(bounds a page's time on a copyset whose other partitions hold most records)."""
GC_SCAN_RECORDS_MAX = 10_000
"""Records one collection entry looks at (it continues where the last one
stopped): bounds the time one entry holds the apply thread."""


def _raw(value: object) -> bytes:
    if not isinstance(value, bytes):
        raise InvariantViolation(f"invariant violated: store returned {type(value).__name__}")
    return value


def _options() -> Options:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.set_compression_type(DBCompressionType.lz4())
    options.set_keep_log_file_num(INFO_LOG_FILES_MAX)
    options.set_write_buffer_size(WRITE_BUFFER_BYTES)
    return options


@dataclass(frozen=True, slots=True)
class ScanItem:
    hash_key: bytes
    sort_key: bytes
    value: bytes
    expire_ts_s: int
    timetag: int


@dataclass(frozen=True, slots=True)
class ScanPage:
    items: list[ScanItem]
    # Where the next page starts (pass it as ``after``); None when the range is done.
    next_after: bytes | None


class TableStore:
    """A partition replica's RocksDB. Not thread-safe: one thread applies and reads."""

    def __init__(self, path: Path, *, cluster_id: int) -> None:
        self.path = path
        self.cluster_id = check_cluster_id(cluster_id)
        self._db = self._open(path)
        self._sessions = SessionCache()
        self._load_state()

    def _load_state(self) -> None:
        raw = self._db.get(KEY_APPLIED_DECREE)
        if raw is None:
            self._applied, self._since_mark_min_us = 0, NO_ENTRY_US
        elif len(_raw(raw)) == _U64.size:
            self._applied, self._since_mark_min_us = _U64.unpack(_raw(raw))[0], 0
        else:
            self._applied, self._since_mark_min_us = _APPLIED.unpack(_raw(raw))
        raw = self._db.get(KEY_GC_STATE)
        state = b"" if raw is None else _raw(raw)
        self._gc_mark = _U64.unpack(state[:_U64.size])[0] if state else 0
        self._gc_cursor = state[_U64.size:]
        self.collected_records = 0  # by collections applied since the store opened
        self._sessions.clear()  # (re)opened: the data may be a checkpoint's

    @staticmethod
    def _open(path: Path) -> Rdict:
        path.mkdir(parents=True, exist_ok=True)
        try:
            db = Rdict(str(path), _options())
        except Exception as exc:  # rocksdict raises plain Exception
            if "lock" in str(exc).lower():
                raise LockedError(f"table store {path} is in use by another process ({exc}); "
                                  "stop it first") from None
            raise StorageError(f"cannot open table store {path}: {exc}") from None
        version = db.get(KEY_FORMAT_VERSION)
        if version is None:
            db.put(KEY_FORMAT_VERSION, _U64.pack(STORE_FORMAT_VERSION))
        elif _U64.unpack(_raw(version))[0] != STORE_FORMAT_VERSION:
            db.close()
            raise StorageError(f"table store {path} has format version "
                               f"{_U64.unpack(_raw(version))[0]}, this build reads "
                               f"{STORE_FORMAT_VERSION}")
        return db

    def close(self) -> None:
        self._db.close()

    @property
    def applied_decree(self) -> int:
        return self._applied

    @property
    def gc_mark(self) -> int:
        """The decree of the last tombstone collection applied (0: none yet)."""
        return self._gc_mark

    def _applied_value(self) -> bytes:
        return _APPLIED.pack(self._applied, self._since_mark_min_us)

    # ----- writes --------------------------------------------------------------------------

    def apply(self, decree: int, entry: TableEntry) -> list[WriteResult]:
        """Apply one committed entry; an entry at or below ``applied_decree`` was
        applied before a crash and is skipped (returns [])."""
        return self.apply_combined(decree, [entry])[0]

    def apply_combined(self, decree: int, entries: list[TableEntry]) -> list[list[WriteResult]]:
        """Apply the entries of one committed log entry (``combine_entries``) in
        order, each with its own timestamp and session, in one RocksDB write
        batch; their results, one list per entry (each [] for a log entry at or
        below ``applied_decree``, skipped)."""
        invariant(bool(entries), "a log entry holds one table entry at least")
        if decree <= self._applied:
            return [[] for _ in entries]
        first = entries[0]
        batch = _Batch(self._db, first.timestamp_us, self.cluster_id)
        sessions = ClientSessions(self._db, batch.write_batch, first.timestamp_us,
                                  self._sessions)
        sessions.expire(len(entries))
        if first.gc is not None:
            invariant(len(entries) == 1, "a collection entry is never combined")
            results: list[list[WriteResult]] = [[]]
            mark, since_min_us, cursor, removed = self._collect(batch.write_batch, decree,
                                                                first.gc, first.timestamp_us)
        else:
            mark, cursor, removed = self._gc_mark, self._gc_cursor, 0
            since_min_us = self._since_mark_min_us
            results = []
            for entry in entries:
                batch.at(entry.timestamp_us)
                sessions.at(entry.timestamp_us)
                results.append(self._run(batch, sessions, entry))
                if entry.timestamp_us < since_min_us and has_local_writes(entry):
                    since_min_us = entry.timestamp_us
        sessions.write_rows()
        batch.write_batch.put(KEY_APPLIED_DECREE, _APPLIED.pack(decree, since_min_us))
        self._db.write(batch.write_batch)
        sessions.commit()
        self._applied, self._since_mark_min_us = decree, since_min_us
        self._gc_mark, self._gc_cursor = mark, cursor
        self.collected_records += removed
        return results

    def _run(self, batch: _Batch, sessions: ClientSessions,
             entry: TableEntry) -> list[WriteResult]:
        if entry.client_id == 0:
            return [batch.run(command) for command in entry.commands]
        answer = sessions.answered(entry.client_id, entry.seq, entry.first_outstanding_seq)
        if isinstance(answer, Refused):
            return [answer] * len(entry.commands)
        if answer is not None:
            return answer  # a duplicate: the first results, nothing applied again
        results = [batch.run(command) for command in entry.commands]
        sessions.remember(entry.client_id, entry.seq, entry.first_outstanding_seq, results)
        return results

    def skip(self, decree: int) -> None:
        """Record a log entry that is not a table write (a configuration change)."""
        if decree <= self._applied:
            return
        self._applied = decree
        self._db.put(KEY_APPLIED_DECREE, self._applied_value())

    # ----- reads ---------------------------------------------------------------------------

    def get_record(self, hash_key: bytes, sort_key: bytes, now_s: int) -> Record | None:
        check_key(hash_key, sort_key)
        raw = self._db.get(encode_key(hash_key, sort_key))
        if raw is None:
            return None
        record = decode_record(_raw(raw))
        return record if record.live(now_s) else None

    def stored_record(self, hash_key: bytes, sort_key: bytes) -> Record | None:
        """The record as stored, tombstones and expired records included
        (duplication ships it with its timetag)."""
        raw = self._db.get(encode_key(hash_key, sort_key))
        return None if raw is None else decode_record(_raw(raw))

    def stored_page(self, after: bytes | None, limit: int, bytes_max: int
                    ) -> tuple[list[tuple[bytes, bytes, Record]], bytes | None]:
        """Every stored record (tombstones and expired ones included) after the
        key ``after``: ``limit`` records and about ``bytes_max`` bytes at most
        (one record at least), as (hash_key, sort_key, record); and where the
        next page starts (None: done). For duplication's checkpoint copy."""
        out: list[tuple[bytes, bytes, Record]] = []
        size = 0
        low = b"" if after is None else after
        for key, record in self._range(low, STORE_KEY_PREFIX, reverse=False,
                                       start_inclusive=after is None):
            if len(out) == limit or (out and size + len(key) + len(record.value) > bytes_max):
                return out, encode_key(out[-1][0], out[-1][1])
            size += len(key) + len(record.value)
            hash_key, sort_key = decode_key(key)
            out.append((hash_key, sort_key, record))
        return out, None

    def get(self, hash_key: bytes, sort_key: bytes, now_s: int) -> bytes | None:
        record = self.get_record(hash_key, sort_key, now_s)
        return None if record is None else record.value

    def ttl_s(self, hash_key: bytes, sort_key: bytes, now_s: int) -> int | None:
        """Seconds left (-1: no TTL); None when there is no live value."""
        record = self.get_record(hash_key, sort_key, now_s)
        return None if record is None else record.ttl_s(now_s)

    def multi_get(self, hash_key: bytes, sort_keys: list[bytes],
                  now_s: int) -> dict[bytes, bytes]:
        out = {}
        for sort_key in sort_keys:
            value = self.get(hash_key, sort_key, now_s)
            if value is not None:
                out[sort_key] = value
        return out

    def scan(self, hash_key: bytes, now_s: int, *, start: bytes = b"", stop: bytes | None = None,
             start_inclusive: bool = True, stop_inclusive: bool = False,
             limit: int = 100, reverse: bool = False, after: bytes | None = None) -> ScanPage:
        """Live records of ``hash_key`` with sort keys in [start, stop) (bounds as
        asked), ``limit`` at most, in sort-key order or ``reverse``.

        ``after`` is the ``next_after`` of the previous page.
        """
        check_key(hash_key, start)
        if stop is not None:
            check_key(hash_key, stop)
        if not 1 <= limit <= SCAN_LIMIT_MAX:
            raise BadTableRequestError(f"scan limit {limit} out of range 1..{SCAN_LIMIT_MAX}")
        prefix = hash_key_prefix(hash_key)
        low = prefix + start
        high = prefix + stop if stop is not None else prefix_end(prefix)
        return self._page(low, high, now_s, start_inclusive=start_inclusive,
                          stop_inclusive=stop_inclusive and stop is not None, limit=limit,
                          reverse=reverse, after=after)

    def full_scan(self, now_s: int, *, limit: int = 100, after: bytes | None = None,
                  partitions: int = 0, partition: int = 0) -> ScanPage:
        """Every live record of the replica, in key order, a page at a time; with
        ``partitions`` (a copyset's store, holding several partitions), only those
        of ``partition`` of a table of that many. Such a page ends early, possibly
        empty but with a ``next_after``, once it passed ``FILTERED_SCAN_SKIP_MAX``
        records of other partitions."""
        if not 1 <= limit <= SCAN_LIMIT_MAX:
            raise BadTableRequestError(f"scan limit {limit} out of range 1..{SCAN_LIMIT_MAX}")
        if partitions and not 0 <= partition < partitions:
            raise BadTableRequestError(f"partition {partition} out of range 0..{partitions - 1}")
        keep = None
        if partitions:
            def keep(hash_key: bytes) -> bool:
                return partition_of(hash_key, partitions) == partition
        return self._page(b"", STORE_KEY_PREFIX, now_s, start_inclusive=True,
                          stop_inclusive=False, limit=limit, reverse=False, after=after,
                          keep=keep)

    def sort_key_count(self, hash_key: bytes, now_s: int) -> int:
        check_key(hash_key)
        prefix = hash_key_prefix(hash_key)
        return sum(1 for _ in self._live(prefix, prefix_end(prefix), now_s, reverse=False))

    def _page(self, low: bytes, high: bytes | None, now_s: int, *, start_inclusive: bool,
              stop_inclusive: bool, limit: int, reverse: bool, after: bytes | None,
              keep: Callable[[bytes], bool] | None = None) -> ScanPage:
        if after is not None:
            if reverse:
                high, stop_inclusive = after, False
            else:
                low, start_inclusive = after, False
        items: list[ScanItem] = []
        size = skipped = 0
        for key, record in self._live(low, high, now_s, reverse=reverse,
                                      start_inclusive=start_inclusive,
                                      stop_inclusive=stop_inclusive):
            if len(items) == limit or size >= SCAN_PAGE_BYTES_MAX:
                return ScanPage(items, next_after=_raw_key(items[-1]))
            hash_key, sort_key = decode_key(key)
            if keep is not None and not keep(hash_key):
                skipped += 1
                if skipped >= FILTERED_SCAN_SKIP_MAX:
                    return ScanPage(items, next_after=key)
                continue
            items.append(ScanItem(hash_key, sort_key, record.value, record.expire_ts_s,
                                  record.timetag))
            size += len(key) + len(record.value)
        return ScanPage(items, next_after=None)

    def _live(self, low: bytes, high: bytes | None, now_s: int, *, reverse: bool,
              start_inclusive: bool = True, stop_inclusive: bool = False,
              ) -> Iterator[tuple[bytes, Record]]:
        for key, record in self._range(low, high, reverse=reverse,
                                       start_inclusive=start_inclusive,
                                       stop_inclusive=stop_inclusive):
            if record.live(now_s):
                yield key, record

    def _range(self, low: bytes, high: bytes | None, *, reverse: bool,
               start_inclusive: bool = True, stop_inclusive: bool = False,
               ) -> Iterator[tuple[bytes, Record]]:
        """Records with keys between ``low`` and ``high`` (None: no end), bounds as asked.

        Bounds are checked here on each key: rocksdict's iterate bounds in
        ReadOptions are not reliable for raw-mode databases.
        """

        def above_low(key: bytes) -> bool:
            return key > low or (start_inclusive and key == low)

        def below_high(key: bytes) -> bool:
            return high is None or key < high or (stop_inclusive and key == high)

        it = self._db.iter()
        if reverse:
            if high is None:
                it.seek_to_last()
            else:
                it.seek_for_prev(high)
            while it.valid():
                key = _raw(it.key())
                if not above_low(key):
                    return
                if below_high(key):
                    yield key, decode_record(_raw(it.value()))
                it.prev()
        else:
            it.seek(low)
            while it.valid():
                key = _raw(it.key())
                if not below_high(key):
                    return
                if above_low(key):
                    yield key, decode_record(_raw(it.value()))
                it.next()

    # ----- garbage, snapshots ------------------------------------------------------------

    def _collect(self, write_batch: WriteBatch, decree: int, gc: CollectGarbage,
                 timestamp_us: int) -> tuple[int, int, bytes, int]:
        """Tombstones and expired records whose timetag is at or below the
        horizon, from where the last collection stopped, at most
        ``GC_SCAN_RECORDS_MAX`` records looked at. Returns the new mark, the
        timestamp bound after it, the cursor and how many records went.

        Reads treat both as absent already; the horizon keeps a tombstone long
        enough to win over late duplicate writes with older timetags, and
        (``unshipped_bound``) until duplication shipped the write that made it.
        """
        if gc.mark_decree != self._gc_mark:
            # Another collection came first: this one's bound was read against
            # an older mark; it collects nothing and the mark stays.
            return self._gc_mark, self._since_mark_min_us, self._gc_cursor, 0
        horizon_us = gc.horizon_us
        if gc.unshipped_bound:
            horizon_us = min(horizon_us, self._since_mark_min_us - 1)
        now_s = timestamp_us // US_PER_S
        removed = seen = 0
        cursor = b""
        if horizon_us >= 0:
            for key, record in self._range(self._gc_cursor, STORE_KEY_PREFIX, reverse=False,
                                           start_inclusive=False):
                if seen == GC_SCAN_RECORDS_MAX:
                    break
                seen += 1
                cursor = key
                if (record.deleted or record.expired(now_s)) and record.timetag >> 8 <= horizon_us:
                    write_batch.delete(key)
                    removed += 1
            else:
                cursor = b""  # the end: the next collection starts at the beginning
        write_batch.put(KEY_GC_STATE, _U64.pack(decree) + cursor)
        return decree, NO_ENTRY_US, cursor, removed

    def checkpoint(self, target: Path) -> int:
        """A RocksDB checkpoint of everything applied so far in ``target`` (must not
        exist); returns its applied decree."""
        invariant(not target.exists(), f"checkpoint target {target} exists")
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            Checkpoint(self._db).create_checkpoint(str(target))
        except Exception as exc:  # rocksdict raises plain Exception
            raise StorageError(f"cannot create a checkpoint in {target}: {exc}") from None
        return self._applied

    def restore(self, checkpoint: Path) -> None:
        """Replace this replica's data by a checkpoint (installing a snapshot):
        the checkpoint directory is renamed into place, no copy. The old data is
        renamed aside first, so a crash leaves either it or the checkpoint at
        ``path`` (or nothing: an empty store, which the Raft host restores from
        its snapshot again on restart), never a mix."""
        self._db.close()
        replaced = self.path.with_name(self.path.name + REPLACED_SUFFIX)
        shutil.rmtree(replaced, ignore_errors=True)
        os.rename(self.path, replaced)
        os.rename(checkpoint, self.path)
        _fsync_directory(self.path.parent)
        shutil.rmtree(replaced)
        self._db = self._open(self.path)
        self._load_state()

    def __enter__(self) -> TableStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _raw_key(item: ScanItem) -> bytes:
    return encode_key(item.hash_key, item.sort_key)


class _Batch:
    """The writes of one log entry: a RocksDB write batch plus what it wrote, so
    a later command (of the same table entry or of a later one combined with
    it) reads an earlier one's result."""

    def __init__(self, db: Rdict, timestamp_us: int, cluster_id: int) -> None:
        self._db = db
        self._cluster_id = cluster_id
        self.write_batch = WriteBatch(raw_mode=True)
        self._written: dict[bytes, Record] = {}
        self.at(timestamp_us)

    def at(self, timestamp_us: int) -> None:
        """The next commands run belong to a table entry with this timestamp."""
        self._now_s = timestamp_us // US_PER_S
        self._timetag = make_timetag(timestamp_us, self._cluster_id)
        self._tombstone_timetag = self._timetag | 1  # the delete flag

    def run(self, command: WriteCommand) -> WriteResult:
        try:
            return self._run(command)
        except TableError as exc:
            return Refused(exc.message)

    def _live(self, key: bytes) -> Record | None:
        record = self._written.get(key)
        if record is None:
            raw = self._db.get(key)
            if raw is None:
                return None
            record = decode_record(_raw(raw))
        return record if record.live(self._now_s) else None

    def _expire(self, ttl_s: int) -> int:
        if ttl_s < 0:
            raise BadTableRequestError(f"ttl_s {ttl_s} must be >= 0 (0: no TTL)")
        return 0 if ttl_s == 0 else self._now_s + ttl_s

    def _put(self, hash_key: bytes, sort_key: bytes, value: bytes, expire_ts_s: int) -> None:
        check_key(hash_key, sort_key)
        check_value(value)
        if not hash_key:
            raise BadTableRequestError("hash_key must not be empty")
        key = encode_key(hash_key, sort_key)
        record = Record(value=value, expire_ts_s=expire_ts_s, timetag=self._timetag)
        self._written[key] = record
        self.write_batch.put(key, encode_record(record))

    def _delete(self, hash_key: bytes, sort_key: bytes) -> None:
        check_key(hash_key, sort_key)
        key = encode_key(hash_key, sort_key)
        record = Record(value=b"", expire_ts_s=0, timetag=self._tombstone_timetag)
        self._written[key] = record
        self.write_batch.put(key, encode_record(record))

    def _run(self, command: WriteCommand) -> WriteResult:
        if isinstance(command, SetCommand):
            self._put(command.hash_key, command.sort_key, command.value,
                      self._expire(command.ttl_s))
            return Done()
        if isinstance(command, MultiSetCommand):
            expire = self._expire(command.ttl_s)
            for sort_key, value in command.items:  # all checked before any is written
                check_key(command.hash_key, sort_key)
                check_value(value)
            for sort_key, value in command.items:
                self._put(command.hash_key, sort_key, value, expire)
            return Done()
        if isinstance(command, DeleteCommand):
            self._delete(command.hash_key, command.sort_key)
            return Done()
        if isinstance(command, MultiDeleteCommand):
            for sort_key in command.sort_keys:
                check_key(command.hash_key, sort_key)
            for sort_key in command.sort_keys:
                self._delete(command.hash_key, sort_key)
            return Done()
        if isinstance(command, IncrCommand):
            return self._incr(command)
        if isinstance(command, DuplicateCommand):
            return self._duplicate(command)
        return self._check_and_mutate(command)

    def _duplicate(self, command: DuplicateCommand) -> WriteResult:
        """Last writer wins by timetag (timestamp, then cluster id): a shipped
        record at or below the stored one's timetag (live, expired or a
        tombstone) is dropped; the rest are written with their own timetag."""
        for sort_key, value, expire_ts_s, timetag in command.records:  # all checked first
            check_key(command.hash_key, sort_key)
            check_value(value)
            if not command.hash_key:
                raise BadTableRequestError("hash_key must not be empty")
            if (timetag >> 1) & CLUSTER_ID_MAX == 0 or expire_ts_s < 0 or (timetag & 1 and value):
                raise BadTableRequestError(
                    f"duplicate record with timetag {timetag}, expire_ts_s {expire_ts_s} "
                    f"and a value of {len(value)} bytes is malformed")
        for sort_key, value, expire_ts_s, timetag in command.records:
            key = encode_key(command.hash_key, sort_key)
            current = self._written.get(key)
            if current is None:
                raw = self._db.get(key)
                current = None if raw is None else decode_record(_raw(raw))
            if current is not None and current.timetag >= timetag:
                continue
            record = Record(value=value, expire_ts_s=expire_ts_s, timetag=timetag)
            self._written[key] = record
            self.write_batch.put(key, encode_record(record))
        return Done()

    def _incr(self, command: IncrCommand) -> WriteResult:
        check_key(command.hash_key, command.sort_key)
        current = self._live(encode_key(command.hash_key, command.sort_key))
        base = 0 if current is None else parse_int64(current.value, "the value to increment")
        value = base + command.increment
        if not INT64_MIN <= value <= INT64_MAX:
            raise BadTableRequestError(f"increment by {command.increment} overflows 64 bits "
                                       f"(value {base})")
        if command.ttl_s > 0:
            expire = self._now_s + command.ttl_s
        elif command.ttl_s < 0 or current is None:
            expire = 0
        else:
            expire = current.expire_ts_s
        self._put(command.hash_key, command.sort_key, b"%d" % value, expire)
        return IncrResult(value)

    def _check_and_mutate(self, command: CheckAndMutateCommand) -> WriteResult:
        check_key(command.hash_key, command.check_sort_key)
        if not command.mutations:
            raise BadTableRequestError("check_and_mutate needs at least one mutation")
        for mutation in command.mutations:
            check_key(command.hash_key, mutation.sort_key)
            if mutation.value is not None:
                check_value(mutation.value)
            self._expire(mutation.ttl_s)
        current = self._live(encode_key(command.hash_key, command.check_sort_key))
        current_value = None if current is None else current.value
        passed = check_passes(command.check_type, command.check_operand, current_value)
        if passed:
            for mutation in command.mutations:
                if mutation.value is None:
                    self._delete(command.hash_key, mutation.sort_key)
                else:
                    self._put(command.hash_key, mutation.sort_key, mutation.value,
                              self._expire(mutation.ttl_s))
        return CheckResult(succeeded=passed, check_value_exist=current is not None,
                           check_value=current_value if command.return_check_value else None)
