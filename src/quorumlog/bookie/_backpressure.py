"""Add back-pressure: adds wait for a flush instead of blocking in the storage.

The storage's write cache has two halves; an add that finds both full blocks
its thread (``LedgerStorage.add``), which on the event loop would stop the
bookie. So the server counts the bytes added since the last flush *began*
(at least what the active half holds): when an add would take that count
past a half, the add waits, asynchronously, for the running flush to finish;
past ``FLUSH_SUGGESTED_FRACTION`` of a half it asks for a flush early.
"""

from __future__ import annotations

import asyncio

from quorumlog.bookie._storage import FLUSH_SUGGESTED_FRACTION


class AddBackpressure:
    """Bytes since the last flush began, and the waits they cause (see the module
    docstring). ``flush_wanted`` is the flush task's wake-up."""

    def __init__(self, write_cache_half_bytes: int) -> None:
        self._flush_soon_bytes = int(write_cache_half_bytes * FLUSH_SUGGESTED_FRACTION)
        self._pause_bytes = write_cache_half_bytes
        self._bytes_since_flush = 0
        self._flush_done: asyncio.Future[None] | None = None
        self._closing = False
        self.flush_wanted = asyncio.Event()

    def must_wait(self, size_bytes: int) -> bool:
        """Whether an add of ``size_bytes`` may overflow the write cache half."""
        return self._bytes_since_flush + size_bytes > self._pause_bytes and not self._closing

    async def wait_for_flush(self, size_bytes: int) -> None:
        """Ask for a flush and wait until an add of ``size_bytes`` fits (or closing)."""
        self.flush_wanted.set()
        while self.must_wait(size_bytes):
            if self._flush_done is None:
                self._flush_done = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._flush_done)

    def added(self, size_bytes: int) -> None:
        """An add was taken; ask for a flush once the half is filling up."""
        self._bytes_since_flush += size_bytes
        if self._bytes_since_flush >= self._flush_soon_bytes:
            self.flush_wanted.set()

    def flush_started(self) -> None:
        self._bytes_since_flush = 0

    def flush_finished(self) -> None:
        """A flush ended (done or failed): waiting adds look again."""
        done, self._flush_done = self._flush_done, None
        if done is not None and not done.done():
            done.set_result(None)

    def close(self) -> None:
        """The bookie closes: no add waits any more."""
        self._closing = True
        self.flush_finished()
