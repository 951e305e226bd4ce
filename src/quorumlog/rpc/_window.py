"""A bounded window of in-flight requests with FIFO waiters (backpressure)."""

from __future__ import annotations

import asyncio
from collections import deque

from quorumlog.errors import DeadlineExceededError, QuorumlogError, invariant


class Window:
    """``limit`` slots; ``acquire`` waits in FIFO order until its deadline.

    A released slot is handed straight to the oldest waiter, so a caller that
    arrives later cannot overtake callers already waiting.
    """

    def __init__(self, limit: int) -> None:
        invariant(limit > 0, "window limit must be positive")
        self.limit = limit
        self.used = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._failure: QuorumlogError | None = None

    def try_acquire(self) -> bool:
        if self._failure is not None:
            raise self._failure
        if self.used < self.limit and not self._waiters:
            self.used += 1
            return True
        return False

    async def acquire(self, deadline: float) -> None:
        """Take a slot before ``deadline`` (loop time) or raise DeadlineExceededError."""
        if self.try_acquire():
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout_at(deadline):
                await waiter
        except (TimeoutError, asyncio.CancelledError) as exc:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.release()  # granted at the last moment: hand it on
            if isinstance(exc, TimeoutError):
                raise DeadlineExceededError(
                    f"no in-flight capacity ({self.limit} requests) before the deadline"
                ) from None
            raise

    def release(self) -> None:
        invariant(self.used > 0, "window released more often than acquired")
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes to the waiter
                return
        self.used -= 1

    def fail(self, error: QuorumlogError) -> None:
        """Refuse all current and future acquirers with ``error``."""
        self._failure = error
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(error)
