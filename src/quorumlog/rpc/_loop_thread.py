"""One event loop on a daemon thread: how every blocking client runs asyncio.

The blocking clients (ledger, meta, stream, the Spark data source) are thin
wrappers that hand coroutines to a :class:`LoopThread` and wait. The loop is
uvloop's when uvloop is installed (asyncio's otherwise). What they share:

- ``call(coro, timeout_s=...)`` runs ``coro`` on the loop and returns its
  result or raises its error. A call that outlives its timeout is cancelled
  on the loop and raises :class:`LoopCallTimeoutError` naming the operation.
- Calling the blocking API from the loop's own thread (a callback or task
  that blocks on its own loop) would deadlock; it raises
  :class:`LoopReentryError` at once instead.
- ``close()`` cancels pending work (their callers get
  :class:`LoopClosedError`), waits for it to unwind, stops the loop and joins
  the thread. It is idempotent; the object is also a context manager.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from quorumlog.errors import DeadlineExceededError, UsageError
from quorumlog.rpc._loop import new_event_loop

T = TypeVar("T")

LOOP_CLOSE_UNWIND_TIMEOUT_S = 10.0
"""How long ``close()`` waits for cancelled work to unwind and the thread to
end; a task that ignores cancellation longer than this is left behind (the
thread is a daemon, so it never keeps the process alive)."""


class LoopCallTimeoutError(DeadlineExceededError):
    """A blocking call did not finish in time; it was cancelled on the loop."""


class LoopClosedError(UsageError):
    """The loop thread was closed before (or while) the call ran."""


class LoopReentryError(UsageError):
    """A blocking call was made from the loop thread it would wait on."""


class _Default:
    """Marker type: ``call`` without ``timeout_s`` uses ``call_timeout_s``."""


_DEFAULT = _Default()


def _operation(coro: Coroutine[Any, Any, Any]) -> str:
    return getattr(coro, "__qualname__", None) or type(coro).__name__


class LoopThread:
    """An event loop running forever on a daemon thread named ``name``.

    ``call_timeout_s`` is the default timeout of :meth:`call` (``None``: wait
    as long as the coroutine runs; the async clients bound their own
    operations, so most blocking clients rely on those bounds).
    """

    def __init__(self, name: str, *, call_timeout_s: float | None = None) -> None:
        if call_timeout_s is not None and call_timeout_s <= 0:
            raise UsageError(f"call_timeout_s must be positive, got {call_timeout_s}")
        self.name = name
        self.call_timeout_s = call_timeout_s
        self._loop = new_event_loop()
        self._lock = threading.Lock()  # orders submit() against close()
        self._closed = False
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    @property
    def closed(self) -> bool:
        return self._closed

    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self._thread

    # ----- running work ----------------------------------------------------------

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start ``coro`` on the loop; the caller goes on and may wait on the future."""
        with self._lock:
            if self._closed:
                coro.close()
                raise LoopClosedError(
                    f"{_operation(coro)}: the {self.name} loop thread is closed; "
                    "open a new client")
            return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def call(self, coro: Coroutine[Any, Any, T], *,
             timeout_s: float | _Default | None = _DEFAULT) -> T:
        """Run ``coro`` on the loop and return its result (or raise its error).

        ``timeout_s`` defaults to the thread's ``call_timeout_s``; ``None``
        waits without bound.
        """
        limit_s = self.call_timeout_s if isinstance(timeout_s, _Default) else timeout_s
        operation = _operation(coro)
        if self.in_loop_thread():
            coro.close()
            raise LoopReentryError(
                f"{operation}: a blocking call was made from the {self.name} loop "
                "thread itself and would wait forever; await the asyncio API there")
        future = self.submit(coro)
        try:
            done, _ = concurrent.futures.wait([future], timeout=limit_s)
        except BaseException:  # KeyboardInterrupt while waiting: stop the work too
            future.cancel()
            raise
        if not done:
            future.cancel()
            raise LoopCallTimeoutError(
                f"{operation} did not finish within {limit_s} s on the {self.name} loop "
                "thread and was cancelled; check that the cluster is reachable, or "
                "pass a longer timeout")
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            if self._closed:
                raise LoopClosedError(
                    f"{operation}: the {self.name} loop thread was closed while "
                    "it ran") from None
            raise

    # ----- closing ---------------------------------------------------------------

    def close(self) -> None:
        """Cancel pending work, stop the loop and join the thread (idempotent)."""
        if self.in_loop_thread():
            raise LoopReentryError(
                f"the {self.name} loop thread cannot close itself; close it from "
                "another thread")
        with self._lock:
            if self._closed:
                return
            self._closed = True
        unwind = asyncio.run_coroutine_threadsafe(self._cancel_pending(), self._loop)
        try:
            unwind.result(LOOP_CLOSE_UNWIND_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            pass  # a task ignoring cancellation: leave it on the daemon thread
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(LOOP_CLOSE_UNWIND_TIMEOUT_S)
            if not self._thread.is_alive():
                self._loop.close()

    async def _cancel_pending(self) -> None:
        current = asyncio.current_task()
        pending = [task for task in asyncio.all_tasks() if task is not current]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await self._loop.shutdown_asyncgens()

    def __enter__(self) -> LoopThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
