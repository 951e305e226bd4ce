"""Configuration of the bookie's ledger storage (after BookKeeper's DbLedgerStorage)."""

from __future__ import annotations

from quorumlog.config import Config, require

MIB = 1024 * 1024
GIB = 1024 * MIB

# Bytes of framing around data in an entry log: the 24-byte frame header per
# entry and the 24-byte file header per log (see _format.py).
FRAME_OVERHEAD_BYTES = 24
LOG_HEADER_BYTES = 24


class LedgerStorageConfig(Config, frozen=True):
    """Bounds of the ledger storage; each field says why it has its default."""

    # Both halves of the double-buffered write cache together; each half holds
    # half of it (BookKeeper: dbStorage_writeCacheMaxSizeMb, 1/4 of direct memory).
    write_cache_max_bytes: int = 64 * MIB
    # How long an add waits for room when both halves are full before it fails
    # with a retriable WriteCacheFullError. BookKeeper waits 10 s on its own
    # thread; here the caller is an event loop, so the wait is kept short.
    add_max_wait_ms: int = 1_000
    # Largest entry accepted (BookKeeper's default frame limit is 5 MiB).
    entry_max_bytes: int = 5 * MIB
    # An entry log is rolled once it would grow past this (BookKeeper: 1 GiB).
    entry_log_max_bytes: int = GIB
    # Entry log files kept open for reading (least recently used are closed).
    entry_log_open_files_max: int = 128
    # Read cache: a ring of segments; the oldest segment is dropped when full.
    read_cache_max_bytes: int = 64 * MIB
    read_cache_segment_count: int = 8
    # Read-ahead for sequential readers: entries and bytes read in one go.
    read_ahead_entries: int = 100
    read_ahead_bytes: int = MIB
    # Ledgers whose last read position is remembered to detect sequential reads.
    read_ahead_tracked_ledgers_max: int = 4096
    # Compaction reads old logs in chunks and copies live entries in batches.
    compaction_read_bytes: int = 8 * MIB
    compaction_batch_bytes: int = 8 * MIB
    # Disk usage (used/total of the ledger directory's file system) above which
    # adds are refused, and below which they are accepted again (hysteresis).
    disk_usage_threshold_fraction: float = 0.95
    disk_usage_lwm_fraction: float = 0.90
    # RocksDB index: memtable size, block cache size, background threads.
    index_write_buffer_bytes: int = 16 * MIB
    index_block_cache_bytes: int = 32 * MIB
    index_background_threads: int = 2
    # verify() stops listing problems after this many (it keeps counting).
    scrub_errors_max: int = 100

    @property
    def write_cache_half_bytes(self) -> int:
        return self.write_cache_max_bytes // 2

    @property
    def read_cache_segment_bytes(self) -> int:
        return self.read_cache_max_bytes // self.read_cache_segment_count

    def validate(self) -> None:
        for name in (
            "write_cache_max_bytes", "entry_max_bytes", "entry_log_max_bytes",
            "entry_log_open_files_max", "read_cache_segment_count", "read_ahead_entries",
            "read_ahead_bytes", "read_ahead_tracked_ledgers_max", "compaction_read_bytes",
            "compaction_batch_bytes", "index_write_buffer_bytes", "index_block_cache_bytes",
            "index_background_threads", "scrub_errors_max",
        ):
            require(getattr(self, name) > 0, f"{name} must be positive")
        require(self.add_max_wait_ms >= 0, "add_max_wait_ms must be >= 0 (0: never wait)")
        require(self.read_cache_max_bytes >= 0, "read_cache_max_bytes must be >= 0 (0: off)")
        require(
            self.entry_max_bytes <= self.write_cache_half_bytes,
            "entry_max_bytes must fit in half of write_cache_max_bytes",
        )
        largest_frame = self.entry_max_bytes + FRAME_OVERHEAD_BYTES
        require(
            self.entry_log_max_bytes >= LOG_HEADER_BYTES + largest_frame,
            "entry_log_max_bytes must hold at least one entry of entry_max_bytes",
        )
        require(
            self.compaction_read_bytes >= largest_frame,
            "compaction_read_bytes must hold at least one entry of entry_max_bytes",
        )
        require(
            0.0 < self.disk_usage_lwm_fraction < self.disk_usage_threshold_fraction <= 1.0,
            "need 0 < disk_usage_lwm_fraction < disk_usage_threshold_fraction <= 1",
        )
