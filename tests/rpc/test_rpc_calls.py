"""Calls over real sockets on 127.0.0.1: round trips, pipelining, deadlines,
closing, backpressure, errors, the pool and the metrics."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

import pytest

from quorumlog import rpc
from quorumlog.errors import (
    ConfigError,
    DeadlineExceededError,
    NotLeaderError,
    QuorumlogError,
    UsageError,
)
from quorumlog.node._cluster import free_port
from quorumlog.rpc._frame import HEADER, LENGTH_FIELD_BYTES

from .support import (
    HANDLERS,
    EchoRequest,
    EchoResponse,
    FailRequest,
    UnservedRequest,
    fail,
    hello_frame,
    message_frame,
    run,
    started,
    wait_until,
)

LOOPS = ["uvloop", "asyncio"]


class Gate:
    """A handler that parks every request until the test lets it go."""

    def __init__(self) -> None:
        self.waiting: dict[int, asyncio.Future[None]] = {}
        self.running = 0
        self.max_running = 0
        self.finished: list[int] = []

    async def handle(self, request: EchoRequest, ctx: rpc.RequestContext) -> EchoResponse:
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        future = asyncio.get_running_loop().create_future()
        self.waiting[request.n] = future
        try:
            await future
        finally:
            self.running -= 1
        self.finished.append(request.n)
        return EchoResponse(n=request.n, text=request.text)

    def release(self, n: int) -> None:
        future = self.waiting.pop(n)
        if not future.done():
            future.set_result(None)

    def release_all(self) -> None:
        for n in list(self.waiting):
            self.release(n)


@pytest.mark.parametrize("loop", LOOPS)
def test_round_trip_with_and_without_payload(loop: str) -> None:
    async def body() -> None:
        server = await started()
        conn = await rpc.connect("127.0.0.1", server.port)
        try:
            assert await conn.call(EchoRequest(n=1, text="hi")) == EchoResponse(n=1, text="hi")
            entry = bytes(range(256)) * 256  # a 64 KiB entry
            response, data = await conn.call_with_payload(EchoRequest(n=2), payload=entry)
            assert response.n == 2 and isinstance(data, memoryview) and data == entry
            response, data = await conn.call_with_payload(EchoRequest(n=3))
            assert response.n == 3 and len(data) == 0
            view = memoryview(bytearray(b"abcdef"))[1:4]
            _, data = await conn.call_with_payload(EchoRequest(n=4), payload=view)
            assert bytes(data) == b"bcd"
        finally:
            await conn.close()
            await server.close()
        assert conn.closed

    run(body(), loop=loop)


@pytest.mark.parametrize("loop", LOOPS)
def test_pipelining_1000_requests_completing_in_reverse_order(loop: str) -> None:
    async def body() -> None:
        gate = Gate()
        server = await started({EchoRequest: gate.handle})
        conn = await rpc.connect("127.0.0.1", server.port)
        try:
            calls = [
                asyncio.ensure_future(conn.call(EchoRequest(n=i, text=str(i))))
                for i in range(1000)
            ]
            await wait_until(lambda: len(gate.waiting) == 1000, what="1000 requests in handlers")
            assert conn.in_flight == 1000
            for n in reversed(range(1000)):
                gate.release(n)
            responses = await asyncio.gather(*calls)
            assert [r.n for r in responses] == list(range(1000))
            assert all(r.text == str(r.n) for r in responses)
            assert gate.finished == list(reversed(range(1000)))
            assert conn.in_flight == 0
        finally:
            await conn.close()
            await server.close()

    run(body(), loop=loop)


def test_call_many_and_send_nowait() -> None:
    async def body() -> None:
        server = await started()
        conn = await rpc.connect("127.0.0.1", server.port)
        try:
            responses = await conn.call_many([EchoRequest(n=i) for i in range(300)])
            assert [r.n for r in responses] == list(range(300))
            futures = [conn.send_nowait(EchoRequest(n=i), payload=b"p%d" % i) for i in range(50)]
            replies = await asyncio.gather(*futures)
            assert [(r.n, bytes(p)) for r, p in replies] == [(i, b"p%d" % i) for i in range(50)]
            mixed: list[rpc.Request[Any]] = [EchoRequest(n=1), FailRequest(kind="not_leader")]
            with pytest.raises(NotLeaderError):
                await conn.call_many(mixed)
        finally:
            await conn.close()
            await server.close()

    run(body())


def test_per_request_timeout_is_retriable_and_connection_survives() -> None:
    async def body() -> None:
        gate = Gate()
        server = await started({EchoRequest: gate.handle})
        conn = await rpc.connect("127.0.0.1", server.port)
        try:
            with pytest.raises(DeadlineExceededError, match=r"within 0\.100s") as caught:
                await conn.call(EchoRequest(n=1), timeout_s=0.1)
            assert caught.value.retriable and conn.in_flight == 0
            gate.release(1)  # the late response is dropped
            call = asyncio.ensure_future(conn.call(EchoRequest(n=2), timeout_s=5))
            await wait_until(lambda: 2 in gate.waiting)
            gate.release(2)
            assert (await call).n == 2
        finally:
            await conn.close()
            await server.close()

    run(body())


def test_cancelled_caller_frees_its_slot() -> None:
    async def body() -> None:
        gate = Gate()
        server = await started({EchoRequest: gate.handle})
        config = rpc.RpcConfig(max_in_flight_requests=1)
        conn = await rpc.connect("127.0.0.1", server.port, config=config)
        try:
            call = asyncio.ensure_future(conn.call(EchoRequest(n=1)))
            await wait_until(lambda: 1 in gate.waiting)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            assert conn.in_flight == 0
            second = asyncio.ensure_future(conn.call(EchoRequest(n=2), timeout_s=5))
            await wait_until(lambda: 2 in gate.waiting)
            gate.release_all()
            assert (await second).n == 2
        finally:
            await conn.close()
            await server.close()

    run(body())


@pytest.mark.parametrize("loop", LOOPS)
def test_pending_requests_fail_retriable_when_the_server_closes(loop: str) -> None:
    async def body() -> None:
        gate = Gate()
        server = await started({EchoRequest: gate.handle})
        conn = await rpc.connect("127.0.0.1", server.port)
        calls = [asyncio.ensure_future(conn.call(EchoRequest(n=i))) for i in range(50)]
        await wait_until(lambda: len(gate.waiting) == 50, what="50 requests in handlers")
        await server.close()
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert all(isinstance(r, rpc.ConnectionClosedError) for r in results), results
        assert all(r.retriable for r in results)  # type: ignore[union-attr]
        await wait_until(lambda: conn.closed)
        with pytest.raises(rpc.ConnectionClosedError):
            await conn.call(EchoRequest(n=99))
        assert conn.in_flight == 0

    run(body(), loop=loop)


def test_client_close_fails_its_own_pending_requests() -> None:
    async def body() -> None:
        gate = Gate()
        server = await started({EchoRequest: gate.handle})
        conn = await rpc.connect("127.0.0.1", server.port)
        try:
            calls = [asyncio.ensure_future(conn.call(EchoRequest(n=i))) for i in range(10)]
            await wait_until(lambda: len(gate.waiting) == 10)
            await conn.close()
            results = await asyncio.gather(*calls, return_exceptions=True)
            assert all(isinstance(r, rpc.ConnectionClosedError) for r in results)
            await wait_until(lambda: server.connection_count == 0)
        finally:
            gate.release_all()
            await server.close()

    run(body())


def test_client_backpressure_waits_for_capacity_until_the_deadline() -> None:
    async def body() -> None:
        gate = Gate()
        server = await started({EchoRequest: gate.handle})
        config = rpc.RpcConfig(max_in_flight_requests=4)
        conn = await rpc.connect("127.0.0.1", server.port, config=config)
        try:
            first = [asyncio.ensure_future(conn.call(EchoRequest(n=i))) for i in range(4)]
            await wait_until(lambda: len(gate.waiting) == 4)
            with pytest.raises(DeadlineExceededError, match="in-flight capacity"):
                await conn.call(EchoRequest(n=10), timeout_s=0.1)
            with pytest.raises(rpc.BackpressureError) as caught:
                conn.send_nowait(EchoRequest(n=11))
            assert caught.value.retriable
            waiting = asyncio.ensure_future(conn.call(EchoRequest(n=12), timeout_s=5))
            await asyncio.sleep(0)  # let it queue for capacity
            assert conn.in_flight == 4 and 12 not in gate.waiting
            gate.release(0)
            await wait_until(lambda: 12 in gate.waiting, what="the waiter to get a slot")
            gate.release_all()
            assert [r.n for r in await asyncio.gather(*first)] == [0, 1, 2, 3]
            assert (await waiting).n == 12
        finally:
            await conn.close()
            await server.close()

    run(body())


def test_server_stops_reading_at_its_in_flight_bound() -> None:
    async def body() -> None:
        gate = Gate()
        config = rpc.RpcConfig(server_max_in_flight_requests=3)
        server = await started({EchoRequest: gate.handle}, config=config)
        conn = await rpc.connect("127.0.0.1", server.port)
        try:
            calls = [asyncio.ensure_future(conn.call(EchoRequest(n=i))) for i in range(20)]
            await wait_until(lambda: len(gate.waiting) == 3)
            (server_conn,) = server._connections
            await wait_until(lambda: server_conn._reading_paused, what="reading paused")
            for _ in range(20):  # while paused, no further handler may start
                await asyncio.sleep(0)
            assert gate.running == 3
            while len(gate.finished) < 20:
                await wait_until(
                    lambda: bool(gate.waiting) or len(gate.finished) == 20, what="next handler"
                )
                gate.release_all()
            assert [r.n for r in await asyncio.gather(*calls)] == list(range(20))
            assert gate.max_running == 3
        finally:
            await conn.close()
            await server.close()

    run(body())


def test_error_codes_round_trip_to_the_same_class() -> None:
    async def body() -> None:
        server = await started()
        conn = await rpc.connect("127.0.0.1", server.port)
        try:
            with pytest.raises(NotLeaderError) as caught:
                await conn.call(FailRequest(kind="not_leader"))
            assert caught.value.leader_hint == "127.0.0.1:7001" and caught.value.retriable
            with pytest.raises(QuorumlogError, match="a plain quorumlog error") as plain:
                await conn.call(FailRequest(kind="quorumlog"))
            assert type(plain.value) is QuorumlogError and not plain.value.retriable
            with pytest.raises(rpc.UnsupportedRequestError, match="no handler for Unserved"):
                await conn.call(UnservedRequest())
            assert (await conn.call(EchoRequest(n=5))).n == 5  # connection still up
        finally:
            await conn.close()
            await server.close()

    run(body())


def test_unexpected_handler_exception_is_an_internal_error_and_logged() -> None:
    from structlog.testing import capture_logs

    async def body() -> list[MutableMapping[str, Any]]:
        server = await started()
        conn = await rpc.connect("127.0.0.1", server.port)
        try:
            with (
                capture_logs() as logs,
                pytest.raises(rpc.RemoteInternalError, match="ZeroDivisionError") as caught,
            ):
                await conn.call(FailRequest(kind="bug"))
            assert not caught.value.retriable
            assert (await conn.call(EchoRequest(n=6))).n == 6
            return logs
        finally:
            await conn.close()
            await server.close()

    logs = run(body())
    failed = [e for e in logs if e["event"] == "rpc_handler_failed"]
    assert failed and failed[0]["request"] == "FailRequest" and failed[0]["log_level"] == "error"
    assert isinstance(failed[0]["exc_info"], ZeroDivisionError)


def test_handler_returning_the_wrong_type_is_an_internal_error() -> None:
    async def wrong(request: EchoRequest, ctx: rpc.RequestContext) -> Any:
        return request  # a request, not an EchoResponse

    async def body() -> None:
        server = await started({EchoRequest: wrong})
        conn = await rpc.connect("127.0.0.1", server.port)
        try:
            with pytest.raises(rpc.RemoteInternalError, match="expected EchoResponse"):
                await conn.call(EchoRequest(n=1))
        finally:
            await conn.close()
            await server.close()

    run(body())


def test_oversize_request_is_refused_locally_and_connection_survives() -> None:
    async def body() -> None:
        config = rpc.RpcConfig(max_frame_bytes=64 * 1024)
        server = await started(config=config)
        conn = await rpc.connect("127.0.0.1", server.port, config=rpc.RpcConfig())
        try:
            # the client learned the server's smaller limit in the hello
            with pytest.raises(UsageError, match="exceeds max_frame_bytes 65536"):
                await conn.call(EchoRequest(n=1), payload=bytes(64 * 1024))
            assert conn.in_flight == 0
            assert (await conn.call(EchoRequest(n=2), payload=bytes(1000))).n == 2
        finally:
            await conn.close()
            await server.close()

    run(body())


def test_an_answer_over_the_frame_limit_is_a_clear_error_and_the_server_goes_on() -> None:
    """A handler whose answer will not fit a frame (a multi_get of many large
    values) gets the caller a ResponseTooLargeError naming the sizes, logged as
    a warning; before, a RemoteInternalError ("ValueError: response of ... >
    max_frame_bytes") and an error with its traceback in the server's log."""
    from structlog.testing import capture_logs

    async def big(request: EchoRequest, ctx: rpc.RequestContext) -> Any:
        return EchoResponse(n=request.n), bytes(request.n)

    async def body() -> list[MutableMapping[str, Any]]:
        server = await started({EchoRequest: big}, config=rpc.RpcConfig(max_frame_bytes=64 * 1024))
        conn = await rpc.connect("127.0.0.1", server.port)
        try:
            expected = r"over the connection's limit of 65,536 \(max_frame_bytes\)"
            with (capture_logs() as logs,
                  pytest.raises(rpc.ResponseTooLargeError, match=expected) as caught):
                await conn.call(EchoRequest(n=100_000))
            assert isinstance(caught.value, UsageError) and not caught.value.retriable
            assert (await conn.call(EchoRequest(n=1000))).n == 1000
            return logs
        finally:
            await conn.close()
            await server.close()

    logs = run(body())
    assert [(e["event"], e["log_level"]) for e in logs] == [("rpc_response_too_large", "warning")]


def test_listening_on_a_taken_port_is_a_clear_error() -> None:
    async def body() -> None:
        first = await started()
        try:
            with pytest.raises(ConfigError, match=r"cannot listen on 127\.0\.0\.1"):
                await rpc.Server({}).start("127.0.0.1", first.port)
        finally:
            await first.close()

    run(body())


def test_connect_to_a_closed_port_fails_retriable() -> None:
    async def body() -> None:
        with pytest.raises(rpc.ConnectFailedError) as caught:
            await rpc.connect("127.0.0.1", free_port())
        assert caught.value.retriable and isinstance(caught.value, rpc.ConnectionClosedError)

    run(body())


def test_pool_shares_one_connection_and_reconnects() -> None:
    async def body() -> None:
        server = await started()
        pool = rpc.Pool()
        address = f"127.0.0.1:{server.port}"
        try:
            connections = await asyncio.gather(*(pool.get(address) for _ in range(20)))
            assert len({id(c) for c in connections}) == 1 and len(pool) == 1
            assert (await pool.call(address, EchoRequest(n=1))).n == 1
            await connections[0].close()
            assert (await pool.call(address, EchoRequest(n=2))).n == 2  # reconnected
            assert await pool.get(address) is not connections[0]
            _, data = await pool.call_with_payload(address, EchoRequest(n=3), payload=b"zz")
            assert bytes(data) == b"zz"
            with pytest.raises(UsageError, match="bad address"):
                await pool.get("no-port")
        finally:
            await pool.close()
            await server.close()
        with pytest.raises(UsageError, match="closed"):
            await pool.get(address)

    run(body())


def test_a_calls_timeout_bounds_its_connect() -> None:
    """A member that accepts TCP but never answers the hello (a hung or
    partitioned peer) must cost a caller its call's timeout, not the pool's
    connect_timeout_s: a meta client with a 10 s deadline that tried such a
    member first ran out of time before trying the next (tests/netns)."""
    async def body() -> None:
        writers: list[asyncio.StreamWriter] = []

        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writers.append(writer)  # accept, never answer

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        pool = rpc.Pool(config=rpc.RpcConfig(connect_timeout_s=30.0))
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            with pytest.raises(rpc.ConnectFailedError, match="within the call"):
                await pool.call(f"127.0.0.1:{port}", EchoRequest(n=1), timeout_s=0.5)
            assert loop.time() - started < 5.0
        finally:
            await pool.close()
            for writer in writers:
                writer.close()
            server.close()
            await server.wait_closed()

    run(body())


def test_pool_evicts_idle_connections_at_its_bound() -> None:
    async def body() -> None:
        servers = [await started() for _ in range(3)]
        pool = rpc.Pool(config=rpc.RpcConfig(pool_max_connections=2))
        try:
            first = await pool.get(f"127.0.0.1:{servers[0].port}")
            await pool.get(f"127.0.0.1:{servers[1].port}")
            await pool.get(f"127.0.0.1:{servers[2].port}")
            assert len(pool) == 2
            await wait_until(lambda: first.closed, what="LRU connection closed")
        finally:
            await pool.close()
            for server in servers:
                await server.close()

    run(body())


def test_metrics_count_requests_bytes_errors_and_in_flight() -> None:
    registry = rpc.metrics_registry

    def sample(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, labels) or 0.0

    before_requests = sample("quorumlog_rpc_requests_total", side="server", type="EchoRequest")
    before_errors = sample("quorumlog_rpc_errors_total", side="client", code="9",
                           error="NotLeaderError")
    before_bytes = sample("quorumlog_rpc_sent_bytes_total", side="client")
    before_timeouts = sample("quorumlog_rpc_timeouts_total")

    async def body() -> None:
        gate = Gate()
        server = await started({EchoRequest: gate.handle, FailRequest: HANDLERS[FailRequest]})
        conn = await rpc.connect("127.0.0.1", server.port)
        try:
            calls = [asyncio.ensure_future(conn.call(EchoRequest(n=i))) for i in range(10)]
            await wait_until(lambda: len(gate.waiting) == 10)
            assert sample("quorumlog_rpc_in_flight_requests", side="client") == 10
            assert sample("quorumlog_rpc_in_flight_requests", side="server") == 10
            assert sample("quorumlog_rpc_open_connections", side="server") >= 1
            gate.release_all()
            await asyncio.gather(*calls)
            with pytest.raises(NotLeaderError):
                await conn.call(FailRequest(kind="not_leader"))
            with pytest.raises(DeadlineExceededError):
                await conn.call(EchoRequest(n=99), timeout_s=0.05)
            gate.release_all()
        finally:
            await conn.close()
            await server.close()

    run(body())
    assert sample("quorumlog_rpc_requests_total", side="server", type="EchoRequest") == (
        before_requests + 11
    )
    assert sample("quorumlog_rpc_errors_total", side="client", code="9",
                           error="NotLeaderError") == before_errors + 1
    assert sample("quorumlog_rpc_sent_bytes_total", side="client") > before_bytes + 10 * 20
    assert sample("quorumlog_rpc_timeouts_total") == before_timeouts + 1
    assert sample("quorumlog_rpc_in_flight_requests", side="client") == 0
    assert sample("quorumlog_rpc_closed_connections_total", side="client", reason="local") >= 1


def test_run_uses_uvloop() -> None:
    async def loop_module() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert rpc.run(loop_module()).startswith("uvloop")
    assert HANDLERS  # the shared handler map is what most tests serve


def test_client_stops_sending_to_a_server_that_does_not_read() -> None:
    from quorumlog.rpc._frame import HEADER
    from quorumlog.rpc._messages import PROTOCOL_VERSION, HelloResponse

    from .support import message_frame

    async def body() -> None:
        stop = asyncio.Event()

        async def deaf(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            header = await reader.readexactly(HEADER.size)
            length, _, _, _, request_id, _ = HEADER.unpack(header)
            await reader.readexactly(length + 4 - HEADER.size)
            hello = HelloResponse(protocol_version=PROTOCOL_VERSION, max_frame_bytes=1 << 24)
            writer.write(message_frame(hello, request_id))
            await stop.wait()  # and never read again
            writer.close()

        fake = await asyncio.start_server(deaf, "127.0.0.1", 0)
        port = fake.sockets[0].getsockname()[1]
        config = rpc.RpcConfig(write_buffer_high_water_bytes=64 * 1024)
        conn = await rpc.connect("127.0.0.1", port, config=config)
        futures = []
        try:
            chunk = bytes(1024 * 1024)
            with pytest.raises(rpc.BackpressureError, match="not reading"):
                for n in range(1000):
                    futures.append(conn.send_nowait(EchoRequest(n=n), payload=chunk))
                    await asyncio.sleep(0)  # let the frames go out
            assert len(futures) < 1000
            with pytest.raises(DeadlineExceededError, match="did not read"):
                await conn.call(EchoRequest(n=-1), timeout_s=0.2)
        finally:
            await conn.close()
            stop.set()
            fake.close()
        results = await asyncio.gather(*futures, return_exceptions=True)
        assert all(isinstance(r, rpc.ConnectionClosedError) for r in results)

    run(body())


async def _read_raw_frame(reader: asyncio.StreamReader) -> tuple[int, int]:
    """(type id, request id) of the next frame the server sends."""
    head = await reader.readexactly(HEADER.size)
    length, _, _, type_id, request_id, _ = HEADER.unpack(head)
    await reader.readexactly(length + LENGTH_FIELD_BYTES - HEADER.size)
    return type_id, request_id


def test_oneway_requests_run_in_order_and_get_no_response() -> None:
    seen: list[tuple[int, bytes]] = []

    async def record(request: EchoRequest, ctx: rpc.RequestContext) -> EchoResponse:
        seen.append((request.n, bytes(ctx.payload)))
        return EchoResponse(n=request.n)

    async def body() -> None:
        server = await started({EchoRequest: record, FailRequest: fail})
        conn = await rpc.connect("127.0.0.1", server.port)
        try:
            for i in range(100):
                conn.send_oneway(EchoRequest(n=i), payload=b"p%d" % i)
            await wait_until(lambda: len(seen) == 100, what="100 one-way requests")
            assert seen == [(i, b"p%d" % i) for i in range(100)]
            # A failing or unserved one-way request is logged; the connection lives on.
            conn.send_oneway(FailRequest(kind="bug"))
            conn.send_oneway(FailRequest(kind="quorumlog"))
            conn.send_oneway(UnservedRequest())
            assert (await conn.call(EchoRequest(n=7))).n == 7
            assert conn.in_flight == 0
            # On the wire: one-way frames (request id 0) get nothing back.
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(hello_frame(request_id=1))
            assert (await _read_raw_frame(reader))[1] == 1
            writer.write(message_frame(EchoRequest(n=1), 0) + message_frame(EchoRequest(n=2), 0)
                         + message_frame(EchoRequest(n=3), 5))
            assert await _read_raw_frame(reader) == (EchoResponse.type_id, 5)
            await wait_until(lambda: len(seen) == 104, what="the raw requests")
            assert [n for n, _ in seen[-4:]] == [7, 1, 2, 3]
            writer.close()
        finally:
            await conn.close()
            await server.close()
        with pytest.raises(rpc.ConnectionClosedError):
            conn.send_oneway(EchoRequest(n=0))

    run(body())
