"""The Raft driver: three hosts in one process over real rpc on 127.0.0.1, real WAL."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from quorumlog import rpc
from quorumlog.errors import NotLeaderError
from quorumlog.node._cluster import free_ports
from quorumlog.raft import HostConfig, RaftHost, Role

GROUP = 7
DEADLINE_S = 20.0


class Counter:
    """A tiny state machine: appends payloads, returns the count."""

    def __init__(self) -> None:
        self.items: list[bytes] = []

    def apply(self, index: int, data: bytes) -> Any:
        self.items.append(data)
        return len(self.items)

    def snapshot(self) -> bytes:
        return b"\n".join(self.items)

    def restore(self, data: bytes) -> None:
        self.items = data.split(b"\n") if data else []


class Member:
    def __init__(self, node_id: int, addresses: dict[int, str], root: Path) -> None:
        self.node_id, self.addresses, self.root = node_id, addresses, root
        self.machine = Counter()
        self.host: RaftHost | None = None
        self.server: rpc.Server | None = None

    async def start(self) -> None:
        self.machine = Counter()
        host = RaftHost(self.node_id, self.addresses, self.root / f"n{self.node_id}",
                        config=HostConfig(tick_interval_ms=20, snapshot_entries=50,
                                          compaction_margin_entries=10))
        self.server = rpc.Server(host.handlers())
        await self.server.start("127.0.0.1", int(self.addresses[self.node_id].split(":")[1]))
        await host.start()
        host.add_group(GROUP, set(self.addresses), self.machine)
        self.host = host

    async def stop(self) -> None:
        assert self.host is not None and self.server is not None
        await self.server.close()
        await self.host.close()
        self.host = None


async def wait_leader(members: list[Member]) -> Member:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while loop.time() < deadline:
        for m in members:
            if m.host is not None and m.host.group(GROUP).node.role is Role.LEADER:
                return m
        await asyncio.sleep(0.02)
    raise AssertionError("no leader elected before the deadline")


async def propose_retrying(members: list[Member], data: bytes) -> int:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while True:
        leader = await wait_leader(members)
        assert leader.host is not None
        try:
            result: int = await leader.host.propose(GROUP, data, timeout_s=2.0)
            return result
        except NotLeaderError:
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.05)


def with_members(tmp_path: Path, body: Callable[[list[Member]], Awaitable[None]]) -> None:
    async def main() -> None:
        addresses = {i: f"127.0.0.1:{port}"
                     for i, port in zip((1, 2, 3), free_ports(3), strict=True)}
        ms = [Member(i, addresses, tmp_path) for i in (1, 2, 3)]
        try:
            for m in ms:
                await m.start()
            async with asyncio.timeout(60):
                await body(ms)
        finally:
            for m in ms:
                if m.host is not None:
                    await m.stop()

    rpc.run(main())


def test_replicate_failover_and_restart(tmp_path: Path) -> None:
    with_members(tmp_path, _replicate_failover_and_restart)


def test_follower_refuses_proposals_with_leader_hint(tmp_path: Path) -> None:
    with_members(tmp_path, _follower_refuses)


async def _replicate_failover_and_restart(members: list[Member]) -> None:
    for i in range(120):  # crosses snapshot_entries: snapshots + compaction run
        await propose_retrying(members, f"a{i}".encode())
    leader = await wait_leader(members)
    await leader.stop()
    rest = [m for m in members if m is not leader]
    for i in range(30):
        await propose_retrying(rest, f"b{i}".encode())
    await leader.start()  # restart from WAL + snapshot files
    want = [f"a{i}".encode() for i in range(120)] + [f"b{i}".encode() for i in range(30)]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while loop.time() < deadline and any(m.machine.items != want for m in members):
        await asyncio.sleep(0.05)
    for m in members:
        assert m.machine.items == want, f"node {m.node_id} diverged"


async def _follower_refuses(members: list[Member]) -> None:
    leader = await wait_leader(members)
    await propose_retrying(members, b"x")
    follower = next(m for m in members if m is not leader)
    assert follower.host is not None
    with pytest.raises(NotLeaderError) as info:
        await follower.host.propose(GROUP, b"y")
    assert info.value.leader_hint == leader.addresses[leader.node_id]
    assert info.value.retriable
    barrier = await leader.host.read_barrier(GROUP) if leader.host else 0
    assert barrier >= 2
