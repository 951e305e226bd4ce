"""The bookie's ledger storage engine, after BookKeeper's DbLedgerStorage.

Entries of many ledgers go to a double-buffered write cache; ``flush`` sorts
them by (ledger, entry) into append-only entry log files and commits their
locations to a RocksDB index in one synced batch, with a caller-supplied
checkpoint. Reads go write cache -> read cache (with read-ahead) -> index +
entry log. Ledger metadata (master key, fencing, LACs), deletion, entry log
compaction, disk-usage read-only mode, crash recovery and a scrub live here.

The server role on top of it: ``BookieService`` (rpc handlers for the wire
contract in ``quorumlog.proto``, whose error classes the storage raises too;
the journal with group commit, checkpoints, journal replay, long-poll LAC,
GC, registration in meta), its identity (``Cookie``: a bookie whose
directories were wiped or swapped refuses to start as its old self;
``plan_format`` / ``run_format`` re-add it as a new instance) and
``run_bookie`` to run one in-process. See docs/bookie.md.
"""

from quorumlog.bookie._bookie_config import BookieConfig
from quorumlog.bookie._config import LedgerStorageConfig
from quorumlog.bookie._cookie import (
    Cookie,
    DirectoryRole,
    DirectoryState,
    FormatPlan,
    Verdict,
    cookie_key,
    decide,
    plan_format,
    run_format,
)
from quorumlog.bookie._format import NO_ENTRY
from quorumlog.bookie._gc import GcResult
from quorumlog.bookie._journal import Journal
from quorumlog.bookie._ledgers import MASTER_KEY_MAX_BYTES, LedgerInfo, LedgerRecord, LedgerTable
from quorumlog.bookie._limbo import LimboRecord, in_limbo, limbo_error, limbo_key
from quorumlog.bookie._long_poll import LacWaiters
from quorumlog.bookie._memory import MemoryLedgerStore
from quorumlog.bookie._replay import apply_journal_record
from quorumlog.bookie._results import CompactionResult, FlushResult, ScrubReport, StorageStats
from quorumlog.bookie._rules import (
    AddFlags,
    BatchAdd,
    JournalWrite,
    LedgerStore,
    absent_error,
    add_entries,
    add_entry,
    add_flags,
    batch_bounds,
    fence_ledger,
    lac_entry,
    lac_or_none,
    lac_passed,
    long_poll_ms,
    parse_add,
    split_batch,
    write_lac,
)
from quorumlog.bookie._server import BookieService, LocalBookie, local_config, run_bookie
from quorumlog.bookie._storage import DiskUsageProbe, LedgerStorage, filesystem_usage
from quorumlog.bookie._storage_errors import EntryLogCorruptionError, InvalidCookieError

__all__ = [
    "MASTER_KEY_MAX_BYTES",
    "NO_ENTRY",
    "AddFlags",
    "BatchAdd",
    "BookieConfig",
    "BookieService",
    "CompactionResult",
    "Cookie",
    "DirectoryRole",
    "DirectoryState",
    "DiskUsageProbe",
    "EntryLogCorruptionError",
    "FlushResult",
    "FormatPlan",
    "GcResult",
    "InvalidCookieError",
    "Journal",
    "JournalWrite",
    "LacWaiters",
    "LedgerInfo",
    "LedgerRecord",
    "LedgerStorage",
    "LedgerStorageConfig",
    "LedgerStore",
    "LedgerTable",
    "LimboRecord",
    "LocalBookie",
    "MemoryLedgerStore",
    "ScrubReport",
    "StorageStats",
    "Verdict",
    "absent_error",
    "add_entries",
    "add_entry",
    "add_flags",
    "apply_journal_record",
    "batch_bounds",
    "cookie_key",
    "decide",
    "fence_ledger",
    "filesystem_usage",
    "in_limbo",
    "lac_entry",
    "lac_or_none",
    "lac_passed",
    "limbo_error",
    "limbo_key",
    "local_config",
    "long_poll_ms",
    "parse_add",
    "plan_format",
    "run_bookie",
    "run_format",
    "split_batch",
    "write_lac",
]
