"""Garbage collection of a bookie: deleted ledgers, then entry log compaction.

A ledger is deleted by removing its metadata key (``ledger_key(id)``) from
meta. The bookie finds such ledgers by listing its *local* ledgers first and
reading meta's ledger keys *afterwards*, linearizably: a client writes a
ledger's metadata before any entry reaches a bookie, so a ledger held locally
at the time of the listing whose key is absent from a later read was deleted.
Never the other way round (a ledger created between a meta read and a local
listing would look deleted).

Then every entry log whose live/total ratio is under the threshold is
compacted by the storage (live entries copied, index repointed, log removed).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass

from quorumlog.bookie._storage import LedgerStorage
from quorumlog.log import get_logger
from quorumlog.meta import MetaClient
from quorumlog.proto import LEDGER_KEY_PREFIX, ledger_id_of_key

_log = get_logger(__name__)

# Ledger keys read from meta per request while looking for deleted ledgers.
META_PAGE_KEYS = 1000


@dataclass(frozen=True, slots=True)
class GcResult:
    deleted_ledgers: int
    compacted_logs: int
    reclaimed_bytes: int


class GarbageCollector:
    """One bookie's GC; ``run()`` is serialized (a second caller waits for the first)."""

    def __init__(
        self,
        storage: LedgerStorage,
        meta: MetaClient | None,
        *,
        live_ratio_threshold: float,
        executor: Executor,
        delete_ledger: Callable[[int], None],
        flush: Callable[[], Awaitable[None]],
    ) -> None:
        self._storage = storage
        self._meta = meta
        self._threshold = live_ratio_threshold
        self._executor = executor
        self._delete_ledger = delete_ledger
        self._flush = flush
        self._lock = asyncio.Lock()

    @property
    def running(self) -> bool:
        return self._lock.locked()

    async def run(self) -> GcResult:
        async with self._lock:
            deleted = await self._delete_gone_ledgers()
            if deleted:
                # The storage drops deleted ledgers' index ranges and live bytes
                # in the next flush; compaction decides on committed usage.
                await self._flush()
            loop = asyncio.get_running_loop()
            result = await loop.run_in_executor(
                self._executor, self._storage.compact, self._threshold)
        gc = GcResult(deleted_ledgers=deleted, compacted_logs=len(result.compacted_logs),
                      reclaimed_bytes=result.reclaimed_bytes)
        _log.info("bookie_gc_done", deleted_ledgers=gc.deleted_ledgers,
                  compacted_logs=gc.compacted_logs, reclaimed_bytes=gc.reclaimed_bytes)
        return gc

    @staticmethod
    async def _ledgers_in_meta(meta: MetaClient) -> set[int]:
        """Every ledger id with a metadata key, read page by page, linearizably."""
        found: set[int] = set()
        start, end = LEDGER_KEY_PREFIX, LEDGER_KEY_PREFIX[:-1] + chr(ord(LEDGER_KEY_PREFIX[-1]) + 1)
        while True:
            result, _ = await meta.range(start, end=end, limit=META_PAGE_KEYS)
            for kv in result.kvs:
                ledger_id = ledger_id_of_key(kv.key)
                if ledger_id is not None:
                    found.add(ledger_id)
            if not result.more or not result.kvs:
                return found
            start = result.kvs[-1].key + "\x00"

    async def _delete_gone_ledgers(self) -> int:
        meta = self._meta
        if meta is None:
            return 0  # no meta (a bookie run on its own): nothing can be known deleted
        local = self._storage.ledger_ids()  # first: see the module docstring
        if not local:
            return 0
        in_meta = await self._ledgers_in_meta(meta)
        deleted = 0
        for ledger_id in local:
            if ledger_id not in in_meta:
                self._delete_ledger(ledger_id)
                deleted += 1
        if deleted:
            _log.info("bookie_gc_deleted_ledgers", count=deleted)
        return deleted
