"""Helpers of the bookie storage tests: small bounds so logs roll and caches fill quickly."""

from __future__ import annotations

from collections.abc import Callable

from quorumlog.bookie import LedgerStorage, LedgerStorageConfig

KEY = b"master-key"
KIB = 1024


def small_config(**changes: object) -> LedgerStorageConfig:
    base = LedgerStorageConfig(
        write_cache_max_bytes=512 * KIB,
        add_max_wait_ms=0,
        entry_max_bytes=32 * KIB,
        entry_log_max_bytes=128 * KIB,
        read_cache_max_bytes=256 * KIB,
        read_cache_segment_count=4,
        read_ahead_entries=10,
        read_ahead_bytes=64 * KIB,
        compaction_read_bytes=48 * KIB,
        compaction_batch_bytes=32 * KIB,
        index_write_buffer_bytes=1024 * KIB,
        index_block_cache_bytes=1024 * KIB,
    )
    return base.replace(**changes)


def payload(ledger_id: int, entry_id: int, size: int = 100) -> bytes:
    seed = f"{ledger_id}:{entry_id}|".encode()
    return (seed * (size // len(seed) + 1))[:size]


class DiskProbe:
    """An injectable disk usage measure."""

    def __init__(self, usage: float = 0.10) -> None:
        self.usage = usage

    def __call__(self) -> float:
        return self.usage


Opener = Callable[..., LedgerStorage]


def fill(storage: LedgerStorage, ledger_id: int, count: int, size: int = 100,
         first: int = 0) -> None:
    for entry_id in range(first, first + count):
        storage.add(ledger_id, entry_id, payload(ledger_id, entry_id, size), master_key=KEY)
