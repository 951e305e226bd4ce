"""Benchmark of quorumlog.rpc against a plain asyncio echo, in the same run.

Cases (one connection each, server in a child process, both on uvloop):

- ping with 1, 64 and 1024 requests in flight (requests/s);
- add: a 64 KiB payload up, a small ack back, 64 in flight (MB/s of payload);
- read: a small request up, a 64 KiB payload back, 64 in flight (MB/s).

The baseline does the same rounds over asyncio StreamReader/StreamWriter with
a 4-byte length prefix and untyped bytes, served by a loop that answers each
message in order (no request ids, no tasks per request, no types). The rpc
client keeps N requests in flight with ``send_nowait`` and waits for the round;
the server runs a handler task per request.

Run: ``./scripts/uv run --frozen python bench/rpc_bench.py [--quick]``.
"""

from __future__ import annotations

import asyncio
import os
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, ClassVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import Harness, Sample
from quorumlog import rpc
from quorumlog.log import configure

ENTRY_BYTES = 64 * 1024
LENGTH = struct.Struct("<I")
ACK = b"ok" * 4


class PingResponse(rpc.Message, frozen=True):
    type_id: ClassVar[int] = 61001
    seq: int


class PingRequest(rpc.Request[PingResponse], frozen=True):
    type_id: ClassVar[int] = 61000
    seq: int


class AddResponse(rpc.Message, frozen=True):
    type_id: ClassVar[int] = 61003
    entry_id: int


class AddRequest(rpc.Request[AddResponse], frozen=True):
    type_id: ClassVar[int] = 61002
    ledger_id: int
    entry_id: int


class ReadResponse(rpc.Message, frozen=True):
    type_id: ClassVar[int] = 61005
    entry_id: int


class ReadRequest(rpc.Request[ReadResponse], frozen=True):
    type_id: ClassVar[int] = 61004
    ledger_id: int
    entry_id: int


# ---------------------------------------------------------------- server side

ENTRY = os.urandom(ENTRY_BYTES)


async def ping(request: PingRequest, ctx: rpc.RequestContext) -> PingResponse:
    return PingResponse(seq=request.seq)


async def add(request: AddRequest, ctx: rpc.RequestContext) -> AddResponse:
    if len(ctx.payload) != ENTRY_BYTES:
        raise rpc.UnsupportedRequestError("bad entry size")
    return AddResponse(entry_id=request.entry_id)


async def read(request: ReadRequest, ctx: rpc.RequestContext) -> tuple[ReadResponse, bytes]:
    return ReadResponse(entry_id=request.entry_id), ENTRY


async def echo_baseline(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Length-prefixed messages; b'R' asks for an entry, big messages get an ack."""
    try:
        while True:
            (length,) = LENGTH.unpack(await reader.readexactly(4))
            body = await reader.readexactly(length)
            if body[:1] == b"R":
                writer.write(LENGTH.pack(len(ENTRY)) + ENTRY)
            elif length >= ENTRY_BYTES:
                writer.write(LENGTH.pack(len(ACK)) + ACK)
            else:
                writer.write(LENGTH.pack(length) + body)
            if writer.transport.get_write_buffer_size() > 1 << 20:
                await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


async def serve() -> None:
    server = rpc.Server({PingRequest: ping, AddRequest: add, ReadRequest: read})
    await server.start("127.0.0.1", 0)
    baseline = await asyncio.start_server(echo_baseline, "127.0.0.1", 0)
    print(f"PORTS {server.port} {baseline.sockets[0].getsockname()[1]}", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until parent exits
    baseline.close()
    await server.close()


# ---------------------------------------------------------------- client side


async def rpc_rounds(
    port: int, make: Callable[[int], rpc.Request[Any]], in_flight: int, total: int,
    payload: bytes | None,
) -> float:
    conn = await rpc.connect("127.0.0.1", port)
    try:
        start = time.perf_counter()
        for first in range(0, total, in_flight):
            futures = [
                conn.send_nowait(make(i), payload=payload) for i in range(first, first + in_flight)
            ]
            for future in futures:
                await future
        return time.perf_counter() - start
    finally:
        await conn.close()


async def baseline_rounds(port: int, message: bytes, in_flight: int, total: int) -> float:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    framed = LENGTH.pack(len(message)) + message
    try:
        start = time.perf_counter()
        for _ in range(0, total, in_flight):
            for _ in range(in_flight):
                writer.write(framed)
            await writer.drain()
            for _ in range(in_flight):
                (length,) = LENGTH.unpack(await reader.readexactly(4))
                await reader.readexactly(length)
        return time.perf_counter() - start
    finally:
        writer.close()


def measure(coroutine: Callable[[], Coroutine[Any, Any, float]], units: float) -> Sample:
    return Sample(units=units, seconds=rpc.run(coroutine()))


def start_server() -> tuple[subprocess.Popen[str], int, int]:
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert child.stdout is not None
    for line in child.stdout:
        if line.startswith("PORTS "):
            _, rpc_port, baseline_port = line.split()
            return child, int(rpc_port), int(baseline_port)
    raise RuntimeError("benchmark server did not start")


def main(argv: list[str]) -> int:
    configure("WARNING")
    if "--serve" in argv:
        rpc.run(serve())
        return 0
    h = Harness("rpc", argv)
    child, rpc_port, base_port = start_server()
    scale_down = 10 if h.quick else 1
    try:
        for in_flight, total in ((1, 10_000), (64, 100_000), (1024, 204_800)):
            n = max(in_flight, total // scale_down // in_flight * in_flight)
            h.case(
                f"ping, {in_flight} in flight",
                workload=lambda f=in_flight, n=n: measure(
                    lambda: rpc_rounds(rpc_port, lambda i: PingRequest(seq=i), f, n, None), n
                ),
                baseline=lambda f=in_flight, n=n: measure(
                    lambda: baseline_rounds(base_port, b"p" * 8, f, n), n
                ),
                unit="req/s",
            )
        n = 20_480 // scale_down
        mb = n * ENTRY_BYTES / 1e6
        h.case(
            "add 64 KiB entry, 64 in flight",
            workload=lambda: measure(
                lambda: rpc_rounds(
                    rpc_port, lambda i: AddRequest(ledger_id=1, entry_id=i), 64, n, ENTRY
                ),
                mb,
            ),
            baseline=lambda: measure(lambda: baseline_rounds(base_port, ENTRY, 64, n), mb),
            unit="MB/s",
        )
        h.case(
            "read 64 KiB entry, 64 in flight",
            workload=lambda: measure(
                lambda: rpc_rounds(
                    rpc_port, lambda i: ReadRequest(ledger_id=1, entry_id=i), 64, n, None
                ),
                mb,
            ),
            baseline=lambda: measure(lambda: baseline_rounds(base_port, b"R" * 8, 64, n), mb),
            unit="MB/s",
        )
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=30)
    return h.finish()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
