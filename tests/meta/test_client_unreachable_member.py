"""A meta member that accepts connections but never answers (partitioned, hung)
must cost a client at most one operation's deadline, not every operation.

Found by tests/netns in CI: a bookie's registration client (deadline 2 s) whose
first member was cut off by a partition spent each keep-alive's whole budget on
a 5 s request to that member (the deadline did not bound the attempt), and
every later operation started at the same first member again (no leader known),
so the bookie never kept its session, dropped out of the candidates, and a
writer's ensemble change found no bookie to replace the partitioned one.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from quorumlog import rpc
from quorumlog.errors import DeadlineExceededError
from quorumlog.meta import MetaClient

from .support import one_member

DEADLINE_S = 1.0
REQUEST_TIMEOUT_S = 5.0  # longer than the deadline, as in a bookie's registration
SLACK_S = 1.0  # scheduling on a loaded 2-core machine


def test_an_unanswering_first_member_costs_one_deadline_not_every_operation(
        tmp_path: Path) -> None:
    async def main() -> None:
        writers: list[asyncio.StreamWriter] = []

        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writers.append(writer)  # accept, never answer

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        silent_address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        loop = asyncio.get_running_loop()
        try:
            async with one_member(tmp_path) as member:
                async with MetaClient([member.address], deadline_s=10.0) as setup:
                    await setup.put("/k", b"v")
                async with MetaClient([silent_address, member.address], deadline_s=DEADLINE_S,
                                      request_timeout_s=REQUEST_TIMEOUT_S) as meta:
                    # Serializable reads never learn a leader: each one starts at
                    # the client's cursor.
                    started = loop.time()
                    try:
                        kv = await meta.get("/k", serializable=True)
                        assert kv is not None and kv.value == b"v"
                    except DeadlineExceededError:
                        pass  # the whole budget went to the silent member: allowed once
                    assert loop.time() - started < DEADLINE_S + SLACK_S
                    for _ in range(5):
                        kv = await meta.get("/k", serializable=True)
                        assert kv is not None and kv.value == b"v"
                    # Writes (leader known or not) go through too.
                    await meta.put("/k2", b"w")
                    kv = await meta.get("/k2")
                    assert kv is not None and kv.value == b"w"
        finally:
            for writer in writers:
                writer.close()
            server.close()
            await server.wait_closed()

    rpc.run(main())
