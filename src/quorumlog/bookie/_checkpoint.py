"""Checkpoints: the flush task that lets old journal segments go.

A checkpoint makes the journal durable up to position P, flushes the ledger
storage with checkpoint P (write cache -> entry logs + index), then releases
journal segments before P. A restart replays the journal after the
storage's checkpoint (``_replay.py``). The flush task runs one every
``flush_interval_ms``, or sooner when back-pressure asks (``_backpressure``),
or when a ``FlushLedgerRequest`` wants the write cache durable.

Every caller of :meth:`Checkpointer.flush` wants what the write cache holds
at its call durable; flushes run one at a time, so callers that wait while
one runs share the next: a flush that *started* after a caller's call
covers it, and that caller does not flush again.
"""

from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import Executor

from quorumlog.bookie._backpressure import AddBackpressure
from quorumlog.bookie._journal import Journal, encode_position
from quorumlog.bookie._metrics import BookieCounters
from quorumlog.bookie._storage import LedgerStorage
from quorumlog.errors import QuorumlogError
from quorumlog.log import get_logger

_log = get_logger(__name__)


class Checkpointer:
    """Flushes with a journal checkpoint, one at a time (see the module docstring)."""

    def __init__(self, storage: LedgerStorage, journal: Journal, *, checkpoint: int,
                 backpressure: AddBackpressure, counters: BookieCounters,
                 executor: Executor, bookie_id: str) -> None:
        self._storage = storage
        self._journal = journal
        self.checkpoint = checkpoint  # the journal position the storage holds everything to
        self._backpressure = backpressure
        self._counters = counters
        self._executor = executor
        self._bookie_id = bookie_id
        self._lock = asyncio.Lock()
        self._started = 0  # flushes begun under the lock, in order
        self._finished = 0  # the last of them that completed

    async def flush(self) -> None:
        """Checkpoint: journal durable to P, storage flushed with P, journal released to P.

        Returns once a flush that started after this call has completed (maybe
        another caller's: see the module docstring)."""
        wanted = self._started + 1
        async with self._lock:
            if self._finished >= wanted:
                return
            self._started += 1
            number = self._started
            await self._flush_locked()
            self._finished = number

    async def _flush_locked(self) -> None:
        storage, journal, backpressure = self._storage, self._journal, self._backpressure
        loop = asyncio.get_running_loop()
        position = await journal.sync_position()
        if position == self.checkpoint and storage.write_cache_bytes == 0:
            backpressure.flush_finished()
            return
        backpressure.flush_started()
        started = loop.time()
        try:
            result = await loop.run_in_executor(self._executor, storage.flush,
                                                encode_position(position))
        finally:
            backpressure.flush_finished()
        self.checkpoint = position
        self._counters.flushes += 1
        released = await loop.run_in_executor(self._executor, journal.release_to, position)
        _log.debug("bookie_flushed", entries=result.entries, data_bytes=result.data_bytes,
                   checkpoint=position, released_segments=released,
                   ms=round((loop.time() - started) * 1000, 1))

    async def run(self, interval_ms: int) -> None:
        """The flush task: every ``interval_ms``, or when a flush is wanted sooner."""
        wanted = self._backpressure.flush_wanted
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval_ms / 1000):
                    await wanted.wait()
            wanted.clear()
            try:
                await self.flush()
            except QuorumlogError as exc:
                _log.error("bookie_flush_failed", bookie=self._bookie_id, error=exc.message)
