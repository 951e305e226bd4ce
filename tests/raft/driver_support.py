"""Raft hosts (the real driver) over real rpc on 127.0.0.1 with real WALs, in one process."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec

from quorumlog import rpc
from quorumlog.errors import ConfigError, QuorumlogError
from quorumlog.node._cluster import free_ports
from quorumlog.raft import Role
from quorumlog.raft._driver import HostConfig, RaftHost
from rpc.support import wait_until  # tests/rpc/support.py: the shared async poll helper

BIND_ATTEMPTS = 40  # x BIND_RETRY_S: up to 8 s for a taken port to come free
BIND_RETRY_S = 0.2

GROUP = 7
DEADLINE_S = 30.0
RETRY_PAUSE_S = 0.02  # paces retries of a refused proposal (not a wait for state)


class EchoMachine:
    """Keeps every payload; ``apply`` returns the payload, so a proposer can
    check it got the result of its own command and not of another's."""

    def __init__(self) -> None:
        self.items: list[bytes] = []

    def apply(self, index: int, data: bytes) -> Any:
        self.items.append(data)
        return data

    def snapshot(self) -> bytes:
        return msgspec.msgpack.encode(self.items)

    def restore(self, data: bytes) -> None:
        self.items = msgspec.msgpack.decode(data, type=list[bytes]) if data else []

    def total_bytes(self) -> int:
        return sum(map(len, self.items))


class Member:
    """One Raft host with its rpc server; stop() and start() again keep its directory."""

    def __init__(
        self, node_id: int, addresses: dict[int, str], root: Path, config: HostConfig
    ) -> None:
        self.node_id, self.addresses, self.root, self.config = node_id, addresses, root, config
        self.machine = EchoMachine()
        self.host: RaftHost | None = None
        self.server: rpc.Server | None = None

    @property
    def port(self) -> int:
        return int(self.addresses[self.node_id].rsplit(":", 1)[1])

    async def start(
        self,
        voters: set[int] | None,
        on_role_change: Callable[[int, Role, int], None] | None = None,
    ) -> None:
        self.machine = EchoMachine()
        host = RaftHost(self.node_id, self.addresses, self.root / f"n{self.node_id}",
                        config=self.config)
        host.on_role_change = on_role_change
        await self.start_server(host)
        await host.start()
        host.add_group(GROUP, voters, self.machine)
        self.host = host

    async def start_server(self, host: RaftHost) -> None:
        # The port was free when the cluster chose it (free_ports), or when this
        # member stopped; another process of a parallel test run may hold it for
        # a moment since (an outgoing connection's ephemeral port): retry briefly.
        for attempt in range(BIND_ATTEMPTS):
            self.server = rpc.Server(host.handlers())
            try:
                await self.server.start("127.0.0.1", self.port)
                return
            except ConfigError:
                if attempt == BIND_ATTEMPTS - 1:
                    raise
                await asyncio.sleep(BIND_RETRY_S)

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.close()
        if self.host is not None:
            await self.host.close()
        self.host = self.server = None

    def role(self) -> Role | None:
        return self.host.group(GROUP).node.role if self.host is not None else None


def leader_of(members: list[Member]) -> Member | None:
    return next((m for m in members if m.role() is Role.LEADER), None)


async def wait_leader(members: list[Member], timeout_s: float = DEADLINE_S) -> Member:
    await wait_until(lambda: leader_of(members) is not None, timeout_s=timeout_s,
                     what="a leader")
    leader = leader_of(members)
    assert leader is not None
    return leader


async def propose_retrying(members: list[Member], data: bytes) -> Any:
    """Propose at whoever leads, retrying retriable errors until the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while True:
        leader = await wait_leader(members)
        assert leader.host is not None
        try:
            return await leader.host.propose(GROUP, data, timeout_s=10.0)
        except QuorumlogError as exc:
            if not exc.retriable or loop.time() > deadline:
                raise
            await asyncio.sleep(RETRY_PAUSE_S)


def run_cluster(
    tmp_path: Path,
    body: Callable[[list[Member]], Awaitable[None]],
    *,
    config: HostConfig,
    node_ids: tuple[int, ...] = (1, 2, 3),
    voters: tuple[int, ...] = (1, 2, 3),
    deadline_s: float = 120.0,
) -> None:
    """Start a member per node id (the founding ``voters`` bootstrap the group,
    the others start empty and wait to be added), run ``body``, stop them all."""

    async def main() -> None:
        addresses = {i: f"127.0.0.1:{port}"
                     for i, port in zip(node_ids, free_ports(len(node_ids)), strict=True)}
        members = [Member(i, addresses, tmp_path, config) for i in node_ids]
        try:
            for member in members:
                if member.node_id in voters:
                    await member.start(set(voters))
            async with asyncio.timeout(deadline_s):
                await body(members)
        finally:
            for member in members:
                await member.stop()

    rpc.run(main())
