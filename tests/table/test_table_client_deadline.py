"""A TableClient's deadline covers the layout lookups in meta too.

A duplication shipper calls the remote cluster through a TableClient with a
short deadline (``dup_remote_deadline_s``). While the remote was cut off, a
call that still had to look the table up in the remote meta waited for meta's
own 20 s of retries: ``dup status`` showed no error for that long (seen once
in the netns duplication test under load). Here meta is a server that accepts
connections and never answers.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from quorumlog import rpc
from quorumlog.errors import DeadlineExceededError, QuorumlogError
from quorumlog.table import TableClient

DEADLINE_S = 1.0
REQUEST_TIMEOUT_S = 0.3
SLACK_S = 3.0  # scheduling on a loaded box; far below meta's own 20 s


async def _silent_server() -> tuple[asyncio.Server, int]:
    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # reads everything, answers nothing, until closed

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def test_a_write_gives_up_within_its_deadline_when_meta_never_answers() -> None:
    async def main() -> float:
        server, port = await _silent_server()
        try:
            async with TableClient([f"127.0.0.1:{port}"], deadline_s=DEADLINE_S,
                                   request_timeout_s=REQUEST_TIMEOUT_S) as tables:
                started = time.monotonic()
                with pytest.raises(QuorumlogError) as caught:
                    await tables.set("t", b"h", b"s", b"v")
                assert isinstance(caught.value, DeadlineExceededError | rpc.ConnectFailedError), (
                    caught.value)
                return time.monotonic() - started
        finally:
            server.close()

    elapsed = rpc.run(main())
    assert elapsed < DEADLINE_S + SLACK_S, f"gave up after {elapsed:.1f} s"
