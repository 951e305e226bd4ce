"""Bad input closes that connection with a logged reason; the server keeps
serving every other connection, including one with a call in flight."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any

import msgspec
import pytest
from structlog.testing import capture_logs

from quorumlog import rpc
from quorumlog.rpc._frame import HEADER, MAGIC, VERSION

from .support import (
    EchoRequest,
    EchoResponse,
    hello_frame,
    message_frame,
    raw_frame,
    read_until_eof,
    run,
    started,
    wait_until,
)

MAX_FRAME = 64 * 1024


def garbage() -> bytes:
    return b"GET / HTTP/1.1\r\nHost: quorumlog\r\n\r\n"


def oversize() -> bytes:
    header = HEADER.pack(1 << 30, MAGIC, VERSION, EchoRequest.type_id, 2, 0)
    return hello_frame() + header + b"\0" * 100


def unknown_type() -> bytes:
    return hello_frame() + raw_frame(65000, 2, msgspec.msgpack.encode({"n": 1}))


def malformed_body() -> bytes:
    return hello_frame() + raw_frame(60000, 2, b"\xc1\xc1not msgpack")


def wrong_field_types() -> bytes:
    return hello_frame() + raw_frame(60000, 2, msgspec.msgpack.encode({"n": "one"}))


def half_frame_then_eof() -> bytes:
    return hello_frame() + message_frame(EchoRequest(n=1), 2, b"x" * 100)[:50]


def response_sent_to_server() -> bytes:
    return hello_frame() + message_frame(EchoResponse(n=1), 2)


def no_hello() -> bytes:
    return message_frame(EchoRequest(n=1), 1)


def body_longer_than_frame() -> bytes:
    frame = bytearray(raw_frame(60000, 2, b"\x80"))
    frame[16:20] = (100).to_bytes(4, "little")
    return hello_frame() + bytes(frame)


CASES: dict[str, tuple[Callable[[], bytes], str]] = {
    "garbage bytes": (garbage, "bad frame magic"),
    "oversize frame": (oversize, "oversize frame"),
    "unknown message type": (unknown_type, "unknown message type id 65000"),
    "malformed body": (malformed_body, "malformed EchoRequest body"),
    "wrong field types": (wrong_field_types, "malformed EchoRequest body"),
    "half a frame then EOF": (half_frame_then_eof, "mid-frame"),
    "response sent to server": (response_sent_to_server, "EchoResponse is not a request"),
    "no hello": (no_hello, "first frame must be a HelloRequest"),
    "body longer than frame": (body_longer_than_frame, "exceeds frame length"),
}


class Parked:
    """Handler: request n=0 parks until released; others echo."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.parked = False

    async def handle(self, request: EchoRequest, ctx: rpc.RequestContext) -> EchoResponse:
        if request.n == 0:
            self.parked = True
            await self.release.wait()
        return EchoResponse(n=request.n)


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_closes_only_that_connection(case: str) -> None:
    make, reason = CASES[case]

    async def body() -> list[MutableMapping[str, Any]]:
        parked = Parked()
        config = rpc.RpcConfig(max_frame_bytes=MAX_FRAME)
        server = await started({EchoRequest: parked.handle}, config=config)
        good = await rpc.connect("127.0.0.1", server.port)
        try:
            in_flight = asyncio.ensure_future(good.call(EchoRequest(n=0)))
            await wait_until(lambda: parked.parked)
            with capture_logs() as logs:
                reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
                writer.write(make())
                if case == "half a frame then EOF":
                    writer.write_eof()
                await read_until_eof(reader)
                writer.close()
                await wait_until(lambda: server.connection_count == 1, what="bad peer dropped")
            assert (await good.call(EchoRequest(n=7), timeout_s=5)).n == 7
            parked.release.set()
            assert (await in_flight).n == 0
            assert not good.closed
            return logs
        finally:
            await good.close()
            await server.close()

    logs = run(body())
    closes = [e for e in logs if e["event"] == "rpc_connection_closed" and e["side"] == "server"]
    assert len(closes) == 1, logs
    assert reason in closes[0]["reason"] and closes[0]["log_level"] == "warning"


def test_request_id_reused_while_in_flight_is_a_protocol_error() -> None:
    async def body() -> list[MutableMapping[str, Any]]:
        parked = Parked()
        server = await started({EchoRequest: parked.handle})
        try:
            with capture_logs() as logs:
                reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
                writer.write(hello_frame() + message_frame(EchoRequest(n=0), 5))
                await wait_until(lambda: parked.parked)
                writer.write(message_frame(EchoRequest(n=1), 5))
                await read_until_eof(reader)
                writer.close()
            return logs
        finally:
            parked.release.set()
            await server.close()

    logs = run(body())
    assert any("request id 5 reused" in e.get("reason", "") for e in logs)


def test_a_silent_client_is_dropped_after_the_handshake_timeout() -> None:
    async def body() -> None:
        server = await started(config=rpc.RpcConfig(handshake_timeout_s=0.2))
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            assert await read_until_eof(reader) == b""
            writer.close()
        finally:
            await server.close()

    run(body())


def test_connections_beyond_the_server_bound_are_refused() -> None:
    async def body() -> None:
        server = await started(config=rpc.RpcConfig(server_max_connections=1))
        first = await rpc.connect("127.0.0.1", server.port)
        try:
            with pytest.raises(rpc.ConnectionClosedError):
                await rpc.connect("127.0.0.1", server.port)
            assert (await first.call(EchoRequest(n=1))).n == 1
        finally:
            await first.close()
            await server.close()

    run(body())


def test_a_server_speaking_garbage_fails_the_client_calls() -> None:
    async def body() -> None:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read(100)
            writer.write(b"\xff" * 64)
            await writer.drain()

        fake = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = fake.sockets[0].getsockname()[1]
        try:
            with capture_logs() as logs, pytest.raises(rpc.ConnectionClosedError):
                await rpc.connect("127.0.0.1", port)
        finally:
            fake.close()
        assert any("bad frame magic" in e.get("reason", "") for e in logs)

    run(body())


SERVER_SCRIPT = """
import asyncio, sys
from quorumlog import rpc
from quorumlog.log import configure
from rpc.support import EchoRequest

configure("WARNING")  # logs to stderr; stdout carries the port

async def park(request, ctx):
    await asyncio.Event().wait()

async def main():
    server = rpc.Server({EchoRequest: park})
    await server.start("127.0.0.1", 0)
    print(f"PORT {server.port}", flush=True)
    await asyncio.Event().wait()

rpc.run(main())
"""


def test_pending_requests_fail_retriable_when_the_server_process_is_killed() -> None:
    tests_dir = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests_dir), *sys.path])}
    process = subprocess.Popen(
        [sys.executable, "-c", SERVER_SCRIPT], stdout=subprocess.PIPE, env=env, text=True
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("PORT "), line
        port = int(line.split()[1])

        async def body() -> list[BaseException]:
            conn = await rpc.connect("127.0.0.1", port)
            calls = [asyncio.ensure_future(conn.call(EchoRequest(n=i))) for i in range(100)]
            await wait_until(lambda: conn.in_flight == 100)
            process.send_signal(signal.SIGKILL)
            results = await asyncio.gather(*calls, return_exceptions=True)
            return [r for r in results if isinstance(r, BaseException)]

        errors = run(body())
        assert len(errors) == 100
        assert all(isinstance(e, rpc.ConnectionClosedError) and e.retriable for e in errors)
    finally:
        process.kill()
        process.wait(timeout=10)


def test_frames_before_the_hello_are_limited_to_a_small_size() -> None:
    async def body() -> list[MutableMapping[str, Any]]:
        server = await started()
        try:
            with capture_logs() as logs:
                reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
                writer.write(message_frame(EchoRequest(n=1, text="x" * 10_000), 1))
                await read_until_eof(reader)
                writer.close()
            return logs
        finally:
            await server.close()

    logs = run(body())
    assert any("max_frame_bytes 4096" in e.get("reason", "") for e in logs)


def test_receive_buffers_over_the_server_budget_close_the_largest_sender() -> None:
    """Issue 13, finding 3: buffered bytes of all connections are capped by
    server_max_buffered_bytes; the connection holding the most for an
    incomplete frame is closed with a warning, the others keep being served."""
    mib = 1024 * 1024
    config = rpc.RpcConfig(max_frame_bytes=mib, server_max_buffered_bytes=mib,
                           read_chunk_bytes=64 * 1024)

    async def body() -> list[MutableMapping[str, Any]]:
        server = await started(config=config)
        good = await rpc.connect("127.0.0.1", server.port)
        with capture_logs() as logs:
            streams = [await asyncio.open_connection("127.0.0.1", server.port)
                       for _ in range(3)]
            announce = HEADER.pack(mib - 4, MAGIC, VERSION, EchoRequest.type_id, 1, 0)
            for _, writer in streams:
                writer.write(hello_frame() + announce + b"\0" * (600 * 1024))
            await wait_until(lambda: any("buffers full" in e.get("reason", "") for e in logs),
                             timeout_s=10, what="the budget to close a connection")
            assert server.buffered_bytes <= mib + 2 * 600 * 1024
            assert (await good.call(EchoRequest(n=5), timeout_s=5)).n == 5
            for _, writer in streams:
                writer.close()
        await good.close()
        await server.close()
        return logs

    logs = run(body())
    closed = [e for e in logs if e["event"] == "rpc_connection_closed" and e["kind"] == "limit"]
    assert closed and closed[0]["log_level"] == "warning"
    assert "server_max_buffered_bytes" in closed[0]["reason"]
