"""The bookie's ledger storage engine, after BookKeeper's DbLedgerStorage.

Entries of many ledgers go to a double-buffered write cache; ``flush`` sorts
them by (ledger, entry) into append-only entry log files and commits their
locations to a RocksDB index in one synced batch, with a caller-supplied
checkpoint. Reads go write cache -> read cache (with read-ahead) -> index +
entry log. Ledger metadata (master key, fencing, LACs), deletion, entry log
compaction, disk-usage read-only mode, crash recovery and a scrub live here.
The journal, the RPC handlers and registration belong to the bookie server.
See docs/bookie.md.
"""

from quorumlog.bookie._config import LedgerStorageConfig
from quorumlog.bookie._errors import (
    BookieError,
    EntryLogCorruptionError,
    EntryTooLargeError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    ReadOnlyError,
    UnauthorizedError,
    WriteCacheFullError,
)
from quorumlog.bookie._format import NO_ENTRY
from quorumlog.bookie._ledgers import MASTER_KEY_MAX_BYTES, LedgerInfo
from quorumlog.bookie._results import CompactionResult, FlushResult, ScrubReport, StorageStats
from quorumlog.bookie._storage import DiskUsageProbe, LedgerStorage, filesystem_usage

__all__ = [
    "MASTER_KEY_MAX_BYTES",
    "NO_ENTRY",
    "BookieError",
    "CompactionResult",
    "DiskUsageProbe",
    "EntryLogCorruptionError",
    "EntryTooLargeError",
    "FlushResult",
    "LedgerFencedError",
    "LedgerInfo",
    "LedgerStorage",
    "LedgerStorageConfig",
    "NoSuchEntryError",
    "NoSuchLedgerError",
    "ReadOnlyError",
    "ScrubReport",
    "StorageStats",
    "UnauthorizedError",
    "WriteCacheFullError",
    "filesystem_usage",
]
