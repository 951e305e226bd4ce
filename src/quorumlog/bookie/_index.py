"""The RocksDB index of the ledger storage (through ``rocksdict``).

One RocksDB instance in ``<ledger dir>/index`` with four column families, so
that one ``WriteBatch`` updates all of them atomically:

==============  ===========================  =================================
family          key                          value
==============  ===========================  =================================
``locations``   ledger u64 | entry u64       log id u64 | offset u64 | frame u32
``ledgers``     ledger u64                   msgpack ``LedgerRecord``
``entry_logs``  log id u64                   end offset u64 | live bytes u64
``default``     ``checkpoint``,              journal checkpoint token (opaque),
                ``format_version``           u32
==============  ===========================  =================================

Keys are big-endian, so a ledger's entries are one contiguous, ordered key
range: deleting a ledger is one range delete, and its last entry is a reverse
seek.

Options, and why:

- ``raw_mode``: keys and values are our own bytes; no pickling.
- WAL on, and every batch is written with ``sync=True``: a committed batch
  survives power loss, and a half-written batch is never seen (RocksDB
  recovers the WAL to the last complete batch).
- one LRU block cache shared by all families (``index_block_cache_bytes``),
  one memtable size per family (``index_write_buffer_bytes``);
- a 10 bits/key whole-key bloom filter: most point lookups that miss (the
  duplicate check of an add, an entry this bookie does not hold) stop there;
- LZ4 compression: keys share long ledger prefixes and compress well, at
  little CPU;
- ``index_background_threads`` flush/compaction threads (the machine is
  shared with the journal and the event loop);
- RocksDB's own info logs are capped (4 files of 8 MiB).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from rocksdict import (
    BlockBasedOptions,
    Cache,
    ColumnFamily,
    DBCompressionType,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
    WriteOptions,
)

from quorumlog.bookie._config import LedgerStorageConfig
from quorumlog.bookie._format import (
    ENTRY_KEY,
    Location,
    LogUsage,
    decode_entry_key,
    decode_ledger_key,
    decode_location,
    decode_log_usage,
    encode_location,
    encode_log_usage,
    entry_key,
    ledger_key,
    log_key,
)
from quorumlog.bookie._ledgers import LedgerRecord, decode_record, encode_record
from quorumlog.errors import InvariantViolation, LockedError, StorageError, UsageError, invariant

CF_LOCATIONS = "locations"
CF_LEDGERS = "ledgers"
CF_ENTRY_LOGS = "entry_logs"
KEY_CHECKPOINT = b"checkpoint"
KEY_FORMAT_VERSION = b"format_version"
INDEX_FORMAT_VERSION = 1
BLOOM_BITS_PER_KEY = 10
INFO_LOG_FILES_MAX = 4
INFO_LOG_FILE_MAX_BYTES = 8 * 1024 * 1024
_VERSION = struct.Struct(">I")


def _raw(value: object) -> bytes:
    """Keys and values are bytes in raw mode; anything else is a bug."""
    if not isinstance(value, bytes):
        raise InvariantViolation(f"invariant violated: index returned {type(value).__name__}")
    return value


def _options(config: LedgerStorageConfig, cache: Cache, *, bloom: bool) -> Options:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    options.set_max_background_jobs(config.index_background_threads)
    options.set_write_buffer_size(config.index_write_buffer_bytes)
    options.set_compression_type(DBCompressionType.lz4())
    options.set_keep_log_file_num(INFO_LOG_FILES_MAX)
    options.set_max_log_file_size(INFO_LOG_FILE_MAX_BYTES)
    table = BlockBasedOptions()
    table.set_block_cache(cache)
    if bloom:
        table.set_bloom_filter(BLOOM_BITS_PER_KEY, False)
    options.set_block_based_table_factory(table)
    return options


@dataclass(slots=True)
class _Handles:
    db: Rdict
    locations: Rdict
    ledgers: Rdict
    entry_logs: Rdict
    locations_cf: ColumnFamily
    ledgers_cf: ColumnFamily
    entry_logs_cf: ColumnFamily

    def close(self) -> None:
        for family in (self.locations, self.ledgers, self.entry_logs):
            family.close()
        self.db.close()


def _open(path: Path, config: LedgerStorageConfig) -> _Handles:
    cache = Cache(config.index_block_cache_bytes)
    families = {
        CF_LOCATIONS: _options(config, cache, bloom=True),
        CF_LEDGERS: _options(config, cache, bloom=False),
        CF_ENTRY_LOGS: _options(config, cache, bloom=False),
    }
    try:
        db = Rdict(str(path), _options(config, cache, bloom=False), column_families=families)
    except Exception as exc:  # rocksdict raises plain Exception
        if "lock" in str(exc).lower():
            raise LockedError(
                f"index {path} is in use by another storage instance or process ({exc}); "
                "stop it before opening this ledger directory"
            ) from None
        raise StorageError(f"cannot open index {path}: {exc}") from None
    return _Handles(
        db,
        db.get_column_family(CF_LOCATIONS),
        db.get_column_family(CF_LEDGERS),
        db.get_column_family(CF_ENTRY_LOGS),
        db.get_column_family_handle(CF_LOCATIONS),
        db.get_column_family_handle(CF_LEDGERS),
        db.get_column_family_handle(CF_ENTRY_LOGS),
    )


class IndexBatch:
    """Updates for one atomic, synced index write."""

    def __init__(self, handles: _Handles) -> None:
        self._h = handles
        self._batch = WriteBatch(raw_mode=True)

    def __len__(self) -> int:
        return len(self._batch)

    def put_location(self, ledger_id: int, entry_id: int, location: Location) -> None:
        self._batch.put(entry_key(ledger_id, entry_id), encode_location(location),
                        self._h.locations_cf)

    def put_encoded_locations(self, frames: Sequence[tuple[int, int, bytes]],
                              locations: Sequence[bytes]) -> None:
        """:meth:`put_location` for each ``(ledger id, entry id, _)`` of a flush, with
        its location already encoded (``EntryLogs.append_encoded``)."""
        invariant(len(frames) == len(locations), "a location for every flushed frame")
        put, key, column = self._batch.put, ENTRY_KEY.pack, self._h.locations_cf
        for (ledger_id, entry_id, _), location in zip(frames, locations, strict=True):
            put(key(ledger_id, entry_id), location, column)

    def delete_ledger(self, ledger_id: int) -> None:
        """Remove the ledger's record and every location of it (one range delete)."""
        self._batch.delete_range(entry_key(ledger_id, 0), entry_key(ledger_id + 1, 0),
                                 self._h.locations_cf)
        self._batch.delete(ledger_key(ledger_id), self._h.ledgers_cf)

    def put_ledger(self, ledger_id: int, record: LedgerRecord) -> None:
        self._batch.put(ledger_key(ledger_id), encode_record(record), self._h.ledgers_cf)

    def put_usage(self, log_id: int, usage: LogUsage) -> None:
        self._batch.put(log_key(log_id), encode_log_usage(usage), self._h.entry_logs_cf)

    def delete_usage(self, log_id: int) -> None:
        self._batch.delete(log_key(log_id), self._h.entry_logs_cf)

    def put_checkpoint(self, token: bytes) -> None:
        self._batch.put(KEY_CHECKPOINT, token)

    @property
    def write_batch(self) -> WriteBatch:
        return self._batch


class Index:
    """Typed access to the index; thread-safe as RocksDB is."""

    def __init__(self, path: Path, config: LedgerStorageConfig) -> None:
        self._path = path
        self._handles: _Handles | None = _open(path, config)
        self._sync = WriteOptions()
        self._sync.sync = True
        try:
            self._check_format()
        except BaseException:
            self.close()
            raise

    def _h(self) -> _Handles:
        handles = self._handles
        if handles is None:
            raise UsageError(f"index {self._path} is closed")
        return handles

    def _check_format(self) -> None:
        raw = self._h().db.get(KEY_FORMAT_VERSION)
        if raw is None:
            self._h().db.put(KEY_FORMAT_VERSION, _VERSION.pack(INDEX_FORMAT_VERSION), self._sync)
            return
        (version,) = _VERSION.unpack(_raw(raw))
        if version != INDEX_FORMAT_VERSION:
            raise StorageError(
                f"index {self._path} has format version {version}; this build reads "
                f"version {INDEX_FORMAT_VERSION}"
            )

    def get_location(self, ledger_id: int, entry_id: int) -> Location | None:
        raw = self._h().locations.get(entry_key(ledger_id, entry_id))
        return None if raw is None else decode_location(_raw(raw))

    def get_locations(self, keys: list[tuple[int, int]]) -> list[Location | None]:
        if not keys:
            return []
        raws: list[object] = list(
            self._h().locations.get([entry_key(lid, eid) for lid, eid in keys]) or [])
        return [None if raw is None else decode_location(_raw(raw)) for raw in raws]

    def ledger_locations(self, ledger_id: int) -> Iterator[tuple[int, Location]]:
        """(entry id, location) of every indexed entry of the ledger, in order."""
        bound = ReadOptions()
        bound.set_iterate_upper_bound(entry_key(ledger_id + 1, 0))
        items = self._h().locations.items(from_key=entry_key(ledger_id, 0), read_opt=bound)
        for key, value in items:
            yield decode_entry_key(_raw(key))[1], decode_location(_raw(value))

    def all_locations(self) -> Iterator[tuple[int, int, Location]]:
        for key, value in self._h().locations.items():
            ledger_id, entry_id = decode_entry_key(_raw(key))
            yield ledger_id, entry_id, decode_location(_raw(value))

    def load_ledgers(self) -> dict[int, LedgerRecord]:
        return {decode_ledger_key(_raw(k)): decode_record(_raw(v))
                for k, v in self._h().ledgers.items()}

    def load_usage(self) -> dict[int, LogUsage]:
        return {decode_ledger_key(_raw(k)): decode_log_usage(_raw(v))
                for k, v in self._h().entry_logs.items()}

    def checkpoint(self) -> bytes | None:
        raw = self._h().db.get(KEY_CHECKPOINT)
        return None if raw is None else _raw(raw)

    def new_batch(self) -> IndexBatch:
        return IndexBatch(self._h())

    def commit(self, batch: IndexBatch) -> None:
        """Write the batch atomically and durably (WAL fsync)."""
        try:
            self._h().db.write(batch.write_batch, self._sync)
        except UsageError:
            raise
        except Exception as exc:  # rocksdict raises plain Exception
            raise StorageError(f"index {self._path}: write failed: {exc}") from None

    def close(self) -> None:
        handles, self._handles = self._handles, None
        if handles is not None:
            handles.close()
