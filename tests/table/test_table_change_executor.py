"""The change executor on a real Raft host: a change applies only at its group's epoch."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from quorumlog import rpc
from quorumlog.raft import HostConfig, RaftHost, Role
from quorumlog.table import ChangeExecutor, ChangeKind, ChangeOutcome, ScheduledChange

GROUP = (1 << 48) | (1 << 20)
DEADLINE_S = 30.0  # one loaded CI run (2 cores, -n 2) took over 10 s to add a learner


class Machine:
    def apply(self, index: int, data: bytes) -> Any:
        return None

    def snapshot(self) -> bytes:
        return b""

    def restore(self, data: bytes) -> None:
        return None


async def _until(condition: Any, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while not condition():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def _stale_and_current(root: Path) -> None:
    host = RaftHost(1, {1: "127.0.0.1:1"}, root,
                    config=HostConfig(tick_interval_ms=10, election_timeout_ticks=5))
    await host.start()
    host.add_group(GROUP, {1}, Machine())
    executor = ChangeExecutor(host)
    try:
        node = host.group(GROUP).node
        await _until(lambda: node.role is Role.LEADER, "a leader")
        epoch = node.epoch
        stale = ScheduledChange(group_id=GROUP, epoch=epoch - 1, kind=ChangeKind.ADD_LEARNER,
                                node_id=2)
        assert executor.submit(stale) is ChangeOutcome.STALE_EPOCH
        assert executor.ignored_stale == 1
        unknown = ScheduledChange(group_id=GROUP + 1, epoch=epoch, kind=ChangeKind.ADD_LEARNER,
                                  node_id=2)
        assert executor.submit(unknown) is ChangeOutcome.NOT_HOSTED
        current = ScheduledChange(group_id=GROUP, epoch=epoch, kind=ChangeKind.ADD_LEARNER,
                                  node_id=3)
        assert executor.submit(current) is ChangeOutcome.STARTED
        assert executor.submit(current) is ChangeOutcome.BUSY  # one change per group
        await _until(lambda: 3 in node.conf_state.learners, "learner 3")
        assert node.conf_state.learners == frozenset({3})  # never node 2
        assert node.epoch == epoch + 1
        # The same change again: its epoch is now stale, and it is ignored.
        await _until(lambda: executor.submit(current) is not ChangeOutcome.BUSY, "idle")
        assert executor.ignored_stale == 2
        promote = ScheduledChange(group_id=GROUP, epoch=node.epoch, kind=ChangeKind.PROMOTE,
                                  node_id=3)
        assert executor.submit(promote) is ChangeOutcome.STARTED
        await _until(lambda: 3 in node.conf_state.voters, "voter 3")
    finally:
        await executor.close()
        await host.close()


def test_a_stale_epoch_change_is_ignored_and_a_current_one_applies(tmp_path: Path) -> None:
    rpc.run(_stale_and_current(tmp_path))


async def _transfer_to_a_silent_voter(root: Path) -> None:
    """Voters 1, 2 (real hosts over rpc) and 3 (an address nothing listens on):
    1 and 2 form the quorum. A leader transfer to 3 would stop the group's
    proposals until it timed out (found by the netns Jepsen run with 3
    partitions: the scheduler balanced leaders onto a node cut off from its
    peers, again and again, and writes stalled for the whole fault)."""
    from quorumlog.node._cluster import free_ports

    ports = free_ports(3)
    addresses = {i + 1: f"127.0.0.1:{port}" for i, port in enumerate(ports)}
    config = HostConfig(tick_interval_ms=20, election_timeout_ticks=10)
    hosts, servers = [], []
    try:
        for node_id in (1, 2):
            host = RaftHost(node_id, addresses, root / f"n{node_id}", config=config)
            server = rpc.Server(host.handlers())
            await server.start("127.0.0.1", ports[node_id - 1])
            await host.start()
            host.add_group(GROUP, {1, 2, 3}, Machine())
            hosts.append(host)
            servers.append(server)
        leader = hosts[0]
        await _until(lambda: any(h.group(GROUP).node.role is Role.LEADER for h in hosts),
                     "a leader")
        leader = next(h for h in hosts if h.group(GROUP).node.role is Role.LEADER)
        node = leader.group(GROUP).node
        peer = 3 - leader.node_id  # the other live voter
        await _until(lambda: node.recently_active(peer) and not node.recently_active(3),
                     "the live peer heard and voter 3 silent for a check-quorum period")
        executor = ChangeExecutor(leader)
        try:
            silent = ScheduledChange(group_id=GROUP, epoch=node.epoch,
                                     kind=ChangeKind.TRANSFER_LEADER, node_id=3)
            assert executor.submit(silent) is ChangeOutcome.TARGET_SILENT
            assert node.lead_transferee == 0
            await leader.propose(GROUP, b"still taking writes")
            live = ScheduledChange(group_id=GROUP, epoch=node.epoch,
                                   kind=ChangeKind.TRANSFER_LEADER, node_id=peer)
            assert executor.submit(live) is ChangeOutcome.STARTED
            other = next(h for h in hosts if h is not leader)
            await _until(lambda: other.group(GROUP).node.role is Role.LEADER,
                         f"node {peer} leading after the transfer")
        finally:
            await executor.close()
    finally:
        for server in servers:
            await server.close()
        for host in hosts:
            await host.close()


def test_a_leader_transfer_to_a_voter_the_leader_cannot_hear_is_refused(tmp_path: Path) -> None:
    rpc.run(_transfer_to_a_silent_voter(tmp_path))
