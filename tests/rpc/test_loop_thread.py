"""LoopThread: the one event-loop-on-a-thread every blocking client uses."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import pytest

from quorumlog import rpc
from quorumlog.errors import DeadlineExceededError, NotLeaderError, UsageError

WAIT_S = 10.0  # bound on every wait in these tests (they finish in milliseconds)


async def _add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


async def _fail() -> None:
    raise NotLeaderError("not me", leader_hint="127.0.0.1:1")


async def _raise_timeout_itself() -> None:
    raise TimeoutError("the operation's own timeout")


def test_call_returns_the_result_and_runs_on_the_loop_thread() -> None:
    with rpc.LoopThread("test-loop") as loop_thread:
        assert loop_thread.call(_add(2, 3)) == 5

        async def where() -> str:
            return threading.current_thread().name

        assert loop_thread.call(where()) == "test-loop"


def test_the_loop_is_uvloop_when_installed() -> None:
    uvloop = pytest.importorskip("uvloop")
    with rpc.LoopThread("test-loop") as loop_thread:
        assert isinstance(loop_thread.loop, uvloop.Loop)


def test_errors_propagate_with_their_class_and_fields() -> None:
    with rpc.LoopThread("test-loop") as loop_thread:
        with pytest.raises(NotLeaderError) as info:
            loop_thread.call(_fail())
        assert info.value.leader_hint == "127.0.0.1:1"
        # A coroutine's own TimeoutError is its error, not the call's timeout.
        with pytest.raises(TimeoutError, match="own timeout"):
            loop_thread.call(_raise_timeout_itself(), timeout_s=WAIT_S)


def test_a_call_past_its_timeout_is_cancelled_and_names_the_operation() -> None:
    cancelled = threading.Event()

    async def stuck_operation() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with rpc.LoopThread("test-loop", call_timeout_s=0.05) as loop_thread:
        with pytest.raises(rpc.LoopCallTimeoutError, match="stuck_operation") as info:
            loop_thread.call(stuck_operation())  # the thread's default timeout
        assert isinstance(info.value, DeadlineExceededError) and info.value.retriable
        assert cancelled.wait(WAIT_S)
        cancelled.clear()
        with pytest.raises(rpc.LoopCallTimeoutError, match=r"within 0\.01 s"):
            loop_thread.call(stuck_operation(), timeout_s=0.01)  # an explicit one
        assert cancelled.wait(WAIT_S)
        assert loop_thread.call(_add(1, 1), timeout_s=None) == 2  # still serving


def test_a_blocking_call_from_the_loop_thread_raises_instead_of_deadlocking() -> None:
    with rpc.LoopThread("test-loop") as loop_thread:

        async def reenter() -> int:
            return loop_thread.call(_add(1, 2))

        with pytest.raises(rpc.LoopReentryError, match=r"_add.*test-loop loop thread"):
            loop_thread.call(reenter(), timeout_s=WAIT_S)

        async def close_itself() -> None:
            loop_thread.close()

        with pytest.raises(rpc.LoopReentryError):
            loop_thread.call(close_itself(), timeout_s=WAIT_S)
        assert not loop_thread.closed
        assert loop_thread.call(_add(2, 2)) == 4


def test_close_cancels_pending_work_and_is_idempotent() -> None:
    loop_thread = rpc.LoopThread("test-loop")
    started = threading.Event()
    unwound = threading.Event()

    async def pending_forever() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            unwound.set()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        waiter = pool.submit(loop_thread.call, pending_forever())
        assert started.wait(WAIT_S)
        loop_thread.close()
        with pytest.raises(rpc.LoopClosedError, match="closed while it ran"):
            waiter.result(WAIT_S)
    assert unwound.is_set()
    assert loop_thread.closed and loop_thread.loop.is_closed()
    loop_thread.close()  # again: nothing happens
    coro = _add(1, 1)
    with pytest.raises(rpc.LoopClosedError, match="open a new client") as info:
        loop_thread.call(coro)
    assert isinstance(info.value, UsageError)
    assert coro.cr_frame is None  # type: ignore[attr-defined]  # closed: no "never awaited"


def test_submit_runs_concurrently_with_the_caller() -> None:
    with rpc.LoopThread("test-loop") as loop_thread:
        release = asyncio.Event()

        async def wait_for_release() -> str:
            await release.wait()
            return "released"

        future = loop_thread.submit(wait_for_release())
        assert not future.done()
        loop_thread.loop.call_soon_threadsafe(release.set)
        assert future.result(WAIT_S) == "released"


def test_a_bad_default_timeout_is_refused() -> None:
    with pytest.raises(UsageError, match="call_timeout_s"):
        rpc.LoopThread("test-loop", call_timeout_s=0)
