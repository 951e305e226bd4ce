"""Counters and results the ledger storage hands back (plain dataclasses).

Each counter of :class:`StorageStats` is written by one thread only (adds and
reads by the caller's thread, flush and compaction counters by theirs), so
reading a copy is safe; the Prometheus layer will export them later.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class StorageStats:
    adds: int = 0
    add_duplicates: int = 0
    add_waits: int = 0
    add_rejected_write_cache_full: int = 0
    add_rejected_read_only: int = 0
    write_cache_hits: int = 0
    read_cache_hits: int = 0
    entry_log_reads: int = 0
    read_ahead_batches: int = 0
    read_ahead_entries: int = 0
    batch_log_entries: int = 0  # entries batch reads took from entry logs (read_run)
    flushes: int = 0
    flushed_entries: int = 0
    flushed_bytes: int = 0
    deleted_ledgers: int = 0
    compacted_logs: int = 0
    compaction_copied_entries: int = 0
    compaction_copied_bytes: int = 0
    reclaimed_bytes: int = 0


@dataclass(frozen=True, slots=True)
class FlushResult:
    entries: int
    data_bytes: int
    deleted_ledgers: int


@dataclass(slots=True)
class CompactionResult:
    compacted_logs: list[int] = field(default_factory=list)
    copied_entries: int = 0
    copied_bytes: int = 0
    reclaimed_bytes: int = 0


@dataclass(slots=True)
class ScrubReport:
    """Outcome of ``verify()``: entries checked and the problems found."""

    entries_checked: int = 0
    bytes_checked: int = 0
    error_count: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error_count == 0
