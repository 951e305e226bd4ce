"""Plain (non-async) handlers that answer through a future, and Connection.flush."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from quorumlog import rpc
from quorumlog.errors import NotLeaderError

from .support import EchoRequest, EchoResponse, run, started, wait_until


class Deferred:
    """A plain handler: parks each request on a future the test resolves."""

    def __init__(self) -> None:
        self.waiting: dict[int, asyncio.Future[Any]] = {}
        self.tasks_at_call: list[int] = []

    def handle(self, request: EchoRequest, ctx: rpc.RequestContext) -> asyncio.Future[Any]:
        if request.n < 0:
            raise NotLeaderError("not me", leader_hint="127.0.0.1:1")  # raised at once
        self.tasks_at_call.append(len(asyncio.all_tasks()))
        future = asyncio.get_running_loop().create_future()
        self.waiting[request.n] = future
        return future


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_plain_handler_answers_when_its_future_is_done_without_a_task(loop: str) -> None:
    async def body() -> None:
        deferred = Deferred()
        server = await started({EchoRequest: deferred.handle})
        conn = await rpc.connect("127.0.0.1", server.port)
        try:
            tasks_before = len(asyncio.all_tasks())
            calls = [asyncio.ensure_future(conn.call(EchoRequest(n=i))) for i in range(3)]
            await wait_until(lambda: len(deferred.waiting) == 3, what="3 requests parked")
            # The server made no task for them: only the 3 callers' tasks are new.
            assert max(deferred.tasks_at_call) <= tasks_before + 3
            deferred.waiting[2].set_result(EchoResponse(n=2, text="two"))
            assert await calls[2] == EchoResponse(n=2, text="two")
            deferred.waiting[0].set_exception(NotLeaderError("lost it", leader_hint="h:1"))
            with pytest.raises(NotLeaderError, match="lost it") as caught:
                await calls[0]
            assert caught.value.leader_hint == "h:1"
            deferred.waiting[1].set_exception(ZeroDivisionError("bug"))
            with pytest.raises(rpc.RemoteInternalError, match="ZeroDivisionError"):
                await calls[1]
            with pytest.raises(NotLeaderError, match="not me"):  # raised by the call itself
                await conn.call(EchoRequest(n=-1))
            assert server.connection_count == 1  # every outcome kept the connection
            await wait_until(lambda: conn.in_flight == 0, what="no request in flight")
        finally:
            await conn.close()
            await server.close()

    run(body(), loop=loop)


def test_a_plain_handler_may_return_a_result_or_a_coroutine() -> None:
    async def later(n: int) -> EchoResponse:
        await asyncio.sleep(0)
        return EchoResponse(n=n, text="later")

    def handle(request: EchoRequest, ctx: rpc.RequestContext) -> Any:
        return EchoResponse(n=request.n, text="now") if request.n % 2 else later(request.n)

    async def body() -> None:
        server = await started({EchoRequest: handle})
        conn = await rpc.connect("127.0.0.1", server.port)
        try:
            assert await conn.call(EchoRequest(n=1)) == EchoResponse(n=1, text="now")
            assert await conn.call(EchoRequest(n=2)) == EchoResponse(n=2, text="later")
        finally:
            await conn.close()
            await server.close()

    run(body())


def test_closing_the_server_cancels_parked_deferred_answers() -> None:
    async def body() -> None:
        deferred = Deferred()
        server = await started({EchoRequest: deferred.handle})
        conn = await rpc.connect("127.0.0.1", server.port)
        try:
            call = asyncio.ensure_future(conn.call(EchoRequest(n=7)))
            await wait_until(lambda: 7 in deferred.waiting, what="request parked")
            await server.close()
            assert deferred.waiting[7].cancelled()
            with pytest.raises(rpc.ConnectionClosedError):
                await call
        finally:
            await conn.close()

    run(body())


def test_flush_writes_queued_frames_before_the_loop_turns() -> None:
    """A caller about to block the loop (an fsync) flushes first: the bytes are
    in the socket before it blocks, not after."""
    async def body() -> None:
        received: list[int] = []

        async def handle(request: EchoRequest, ctx: rpc.RequestContext) -> EchoResponse:
            received.append(request.n)
            return EchoResponse(n=request.n)

        server = await started({EchoRequest: handle})
        conn = await rpc.connect("127.0.0.1", server.port)
        try:
            conn.send_oneway(EchoRequest(n=1))
            conn.flush()
            assert conn._protocol._out_bytes == 0  # handed to the transport already
            await wait_until(lambda: received == [1], what="the one-way request served")
            conn.send_oneway(EchoRequest(n=2))
            assert conn._protocol._out_bytes > 0  # without flush: queued until the loop turns
            await wait_until(lambda: received == [1, 2], what="the second request served")
        finally:
            await conn.close()
            await server.close()

    run(body())


class Parked:
    """A plain handler answering each request from a source future the test
    settles (``sources`` by request n), through ``answer(n, source)``."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.sources: dict[int, asyncio.Future[int]] = {}

    def handle(self, request: EchoRequest, ctx: rpc.RequestContext) -> Any:
        source: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.sources[request.n] = source
        return self.answer(request.n, source)


def test_answer_from_converts_fails_and_never_cancels_its_source() -> None:
    """``rpc.answer_from``: a plain handler's answer taken from a proposal's
    future (meta's and the table's writes). The server answers from the
    source's own callback: converted, failed (after ``on_error``), nothing for
    a cancelled source; it never cancels the source, and closing the server
    does not wait for it."""
    async def body() -> None:
        errors: list[BaseException] = []

        def answer(n: int, source: asyncio.Future[int]) -> Any:
            if n == 4:
                return rpc.answer_from(source, lambda n: 1 // 0)  # a broken converter
            return rpc.answer_from(source, lambda n: EchoResponse(n=n, text=f"n={n}"),
                                   on_error=errors.append)

        parked = Parked(answer)
        sources = parked.sources
        server = await started({EchoRequest: parked.handle})
        conn = await rpc.connect("127.0.0.1", server.port)
        closed = False
        try:
            tasks_before = len(asyncio.all_tasks())
            calls = [asyncio.ensure_future(conn.call(EchoRequest(n=i), timeout_s=30))
                     for i in range(6)]
            await wait_until(lambda: len(sources) == 6, what="6 requests parked")
            assert len(asyncio.all_tasks()) <= tasks_before + 6  # the callers' only
            sources[0].set_result(70)
            assert await calls[0] == EchoResponse(n=70, text="n=70")
            failure = NotLeaderError("not me", leader_hint="h:1")
            sources[1].set_exception(failure)
            with pytest.raises(NotLeaderError, match="not me"):
                await calls[1]
            assert errors == [failure]
            sources[2].set_exception(ZeroDivisionError("bug"))
            with pytest.raises(rpc.RemoteInternalError, match="ZeroDivisionError"):
                await calls[2]
            sources[4].set_result(1)
            with pytest.raises(rpc.RemoteInternalError, match="ZeroDivisionError"):
                await calls[4]
            sources[3].cancel()  # no answer: the caller waits (here, until the close)
            await wait_until(lambda: conn.in_flight == 2, what="answered or parked")
            assert server.connection_count == 1
            await server.close()
            closed = True
            assert not sources[5].done()  # the server left its source alone
            for call in (calls[3], calls[5]):
                with pytest.raises(rpc.ConnectionClosedError):
                    await call
            sources[5].set_exception(NotLeaderError("late", leader_hint=None))
            await asyncio.sleep(0)  # the closed connection sends nothing
            assert len(errors) == 3  # counted still: the proposal did fail
        finally:
            await conn.close()
            if not closed:
                await server.close()

    run(body())


def test_answer_from_can_answer_a_failed_source_with_a_response() -> None:
    """``convert_error``: a failed source is answered with the response made of
    its error (a table write batch answers each write's error in its response),
    after ``on_error``; a converter that breaks is an internal error."""
    async def body() -> None:
        errors: list[BaseException] = []

        def answer(n: int, source: asyncio.Future[int]) -> Any:
            return rpc.answer_from(
                source, lambda n: EchoResponse(n=n, text="ok"), on_error=errors.append,
                convert_error=(lambda exc: 1 // 0) if n == 2  # type: ignore[arg-type,return-value]
                else lambda exc: EchoResponse(n=-1, text=f"failed: {exc}"))

        parked = Parked(answer)
        sources = parked.sources
        server = await started({EchoRequest: parked.handle})
        conn = await rpc.connect("127.0.0.1", server.port)
        try:
            calls = [asyncio.ensure_future(conn.call(EchoRequest(n=i), timeout_s=30))
                     for i in range(3)]
            await wait_until(lambda: len(sources) == 3, what="3 requests parked")
            sources[0].set_result(5)
            assert await calls[0] == EchoResponse(n=5, text="ok")
            failure = NotLeaderError("moved", leader_hint=None)
            sources[1].set_exception(failure)
            assert await calls[1] == EchoResponse(n=-1, text="failed: moved")
            assert errors == [failure]
            sources[2].set_exception(NotLeaderError("moved too", leader_hint=None))
            with pytest.raises(rpc.RemoteInternalError, match="ZeroDivisionError"):
                await calls[2]
        finally:
            await conn.close()
            await server.close()

    run(body())
