"""Messages, handlers and helpers shared by the rpc tests (type ids 60000+)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ClassVar, TypeVar

from quorumlog import rpc
from quorumlog.errors import NotLeaderError, QuorumlogError
from quorumlog.rpc._frame import HEADER, LENGTH_FIELD_BYTES, MAGIC, VERSION
from quorumlog.rpc._messages import PROTOCOL_VERSION, HelloRequest, encode_frame

T = TypeVar("T")
TEST_DEADLINE_S = 20.0


class EchoResponse(rpc.Message, frozen=True):
    type_id: ClassVar[int] = 60001
    n: int
    text: str = ""


class EchoRequest(rpc.Request[EchoResponse], frozen=True):
    type_id: ClassVar[int] = 60000
    n: int
    text: str = ""


class FailResponse(rpc.Message, frozen=True):
    type_id: ClassVar[int] = 60003


class FailRequest(rpc.Request[FailResponse], frozen=True):
    """The handler raises what ``kind`` names."""

    type_id: ClassVar[int] = 60002
    kind: str


class UnservedResponse(rpc.Message, frozen=True):
    type_id: ClassVar[int] = 60005


class UnservedRequest(rpc.Request[UnservedResponse], frozen=True):
    """Registered, but no test server has a handler for it."""

    type_id: ClassVar[int] = 60004


async def echo(request: EchoRequest, ctx: rpc.RequestContext) -> Any:
    response = EchoResponse(n=request.n, text=request.text)
    return (response, ctx.payload) if len(ctx.payload) else response


async def fail(request: FailRequest, ctx: rpc.RequestContext) -> FailResponse:
    if request.kind == "not_leader":
        raise NotLeaderError("not the leader", leader_hint="127.0.0.1:7001")
    if request.kind == "quorumlog":
        raise QuorumlogError("a plain quorumlog error")
    if request.kind == "bug":
        raise ZeroDivisionError("division by zero in handler")
    raise ValueError(f"unknown kind {request.kind}")


HANDLERS: dict[type[rpc.Request[Any]], Any] = {EchoRequest: echo, FailRequest: fail}


def run(main: Coroutine[Any, Any, T], *, loop: str = "uvloop") -> T:
    """Run a test body on a fresh loop with an overall deadline."""

    async def bounded() -> T:
        async with asyncio.timeout(TEST_DEADLINE_S):
            return await main

    if loop == "uvloop":
        return rpc.run(bounded())
    return asyncio.run(bounded())


async def wait_until(
    condition: Callable[[], bool], *, timeout_s: float = 5.0, what: str = "condition"
) -> None:
    """Poll ``condition`` each loop turn (with a short yield) until a deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.001)


async def started(
    handlers: dict[type[rpc.Request[Any]], Any] | None = None, **kwargs: Any
) -> rpc.Server:
    server = rpc.Server(HANDLERS if handlers is None else handlers, **kwargs)
    await server.start("127.0.0.1", 0)
    return server


def raw_frame(type_id: int, request_id: int, body: bytes, payload: bytes = b"") -> bytes:
    length = HEADER.size - LENGTH_FIELD_BYTES + len(body) + len(payload)
    header = HEADER.pack(length, MAGIC, VERSION, type_id, request_id, len(body))
    return header + body + payload


def hello_frame(token: str | None = None, request_id: int = 1) -> bytes:
    hello = HelloRequest(protocol_version=PROTOCOL_VERSION, max_frame_bytes=1 << 20, token=token)
    return bytes(encode_frame(hello, request_id, 0))


def message_frame(message: rpc.Message, request_id: int, payload: bytes = b"") -> bytes:
    return bytes(encode_frame(message, request_id, len(payload))) + payload


async def read_until_eof(reader: asyncio.StreamReader, timeout_s: float = 5.0) -> bytes:
    """Everything the server sends until it closes (or resets) the connection."""
    async with asyncio.timeout(timeout_s):
        try:
            return await reader.read()
        except ConnectionResetError:  # closed with our unread bytes in its buffer
            return b""


async def gather_all(*awaitables: Awaitable[Any]) -> list[Any]:
    return list(await asyncio.gather(*awaitables, return_exceptions=True))
