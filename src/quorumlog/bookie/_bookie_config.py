"""Configuration of the bookie server role (the ``[bookie]`` section of a node)."""

from __future__ import annotations

from pathlib import Path

import msgspec

from quorumlog.bookie._config import MIB, LedgerStorageConfig
from quorumlog.config import Config, require

KIB = 1024


class BookieConfig(Config, frozen=True):
    """Directories, group commit, maintenance timers and registration of a bookie.

    ``storage`` (TOML ``[bookie.storage]``) holds the storage engine's limits:
    write cache, entry logs, read cache, disk usage thresholds.
    """

    # The journal (a WAL) and the ledger storage; put them on different disks
    # so journal fsyncs do not queue behind entry log writes (BookKeeper's advice).
    # Empty in a node's [bookie] section: <data_dir>/journal and <data_dir>/ledgers.
    journal_dir: str = ""
    ledger_dir: str = ""
    # Published in the registration; placement uses e.g. "rack" and "zone".
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    # Group commit: a write of the journal waits at most this long for more
    # records when records are already queued behind a busy disk (adaptive:
    # a record that finds the journal idle is written at once).
    journal_max_wait_us: int = 500
    # Most record bytes merged into one journal write + fdatasync.
    journal_max_batch_bytes: int = 4 * MIB
    # Journal record bytes queued but not written; adds beyond it wait.
    journal_queue_max_bytes: int = 64 * MIB
    # Journal segment files (preallocated); released after checkpoints.
    journal_segment_size_bytes: int = 64 * MIB
    # The write cache is flushed (checkpoint, journal release) at least this
    # often, and earlier once half of a write cache half is used. Short: a
    # flush sorts its entries and commits one RocksDB batch while holding the
    # GIL, so a flush of many entries stalls the event loop (about 1 ms per
    # 3,000 entries); frequent small flushes keep add latency low.
    flush_interval_ms: int = 100
    # Garbage collection (deleted ledgers, then entry log compaction) period.
    gc_interval_ms: int = 600_000
    # Entry logs with live/total under this ratio are compacted by GC.
    gc_live_ratio_threshold: float = 0.5
    # How often disk usage is measured (read-only mode, registration update).
    disk_check_interval_ms: int = 5_000
    # The meta session that keeps the registration alive; keep-alives go out
    # every third of it. Without a keep-alive for a whole TTL the bookie
    # considers itself unregistered and refuses adds.
    session_ttl_ms: int = 10_000
    # Pause between registration attempts while meta is unreachable.
    registration_retry_ms: int = 500
    # At start the bookie checks its cookie (identity) against meta before it
    # serves anything, retrying while meta is unreachable for at most this
    # long; then start fails with a retriable error (the node exits and its
    # supervisor starts it again). Long enough for a meta group starting at
    # the same time to elect a leader.
    identity_check_timeout_ms: int = 60_000
    # Long-poll LAC reads: longest wait granted, and most requests parked.
    long_poll_timeout_ms_max: int = 60_000
    long_poll_parked_max: int = 10_000
    # One batch read answers with at most this many entries / bytes.
    read_batch_entries_max: int = 10_000
    read_batch_bytes_max: int = 8 * MIB
    storage: LedgerStorageConfig = msgspec.field(default_factory=LedgerStorageConfig)

    def validate(self) -> None:
        for name in (
            "journal_max_batch_bytes", "journal_queue_max_bytes", "journal_segment_size_bytes",
            "flush_interval_ms", "gc_interval_ms", "disk_check_interval_ms",
            "registration_retry_ms", "identity_check_timeout_ms", "long_poll_timeout_ms_max",
            "long_poll_parked_max", "read_batch_entries_max", "read_batch_bytes_max",
        ):
            require(getattr(self, name) > 0, f"[bookie] {name} must be positive")
        require(self.journal_max_wait_us >= 0, "[bookie] journal_max_wait_us must be >= 0")
        require(
            self.journal_segment_size_bytes >= 64 * KIB,
            "[bookie] journal_segment_size_bytes must be at least 64 KiB",
        )
        require(
            self.journal_queue_max_bytes >= self.journal_max_batch_bytes,
            "[bookie] journal_queue_max_bytes must be >= journal_max_batch_bytes",
        )
        require(
            0.0 <= self.gc_live_ratio_threshold <= 1.0,
            "[bookie] gc_live_ratio_threshold is a fraction in [0, 1]",
        )
        require(self.session_ttl_ms >= 500, "[bookie] session_ttl_ms must be >= 500")
        for key, value in self.labels.items():
            require(bool(key) and bool(value), "[bookie] labels need non-empty keys and values")
        self.storage.validate()

    def with_directories(self, data_dir: str) -> BookieConfig:
        """Fill empty journal_dir / ledger_dir with directories under ``data_dir``."""
        return msgspec.structs.replace(
            self, journal_dir=self.journal_dir or str(Path(data_dir) / "journal"),
            ledger_dir=self.ledger_dir or str(Path(data_dir) / "ledgers"))
