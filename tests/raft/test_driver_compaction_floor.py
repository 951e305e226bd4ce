"""The driver's compaction floor hook: a group's log is never compacted past
what ``RaftHost.compaction_floor`` allows (table duplication keeps the log its
shippers have not confirmed), and compaction resumes once the floor goes."""

from __future__ import annotations

from pathlib import Path

from quorumlog.raft._driver import HostConfig

from .driver_support import GROUP, Member, propose_retrying, run_cluster, wait_leader, wait_until

HELD_AT = 7


def test_compaction_stops_at_the_floor_and_resumes_without_it(tmp_path: Path) -> None:
    floors: dict[int, int | None] = {GROUP: HELD_AT}

    async def body(members: list[Member]) -> None:
        for member in members:
            assert member.host is not None
            member.host.compaction_floor = floors.get
        leader = await wait_leader(members)
        assert leader.host is not None
        group = leader.host.group(GROUP)
        for i in range(60):
            await propose_retrying(members, b"%d" % i)
        await wait_until(lambda: group.snapshot_index >= 40, timeout_s=30,
                         what="the leader took snapshots")
        for member in members:
            assert member.host is not None
            first = member.host.group(GROUP).storage.first_index()
            assert first <= HELD_AT + 1, f"node {member.node_id} compacted to {first}"
        floors[GROUP] = None
        for i in range(30):
            await propose_retrying(members, b"more %d" % i)
        await wait_until(lambda: group.storage.first_index() > 40, timeout_s=30,
                         what="compaction resumed")

    run_cluster(tmp_path, body, config=HostConfig(tick_interval_ms=20, snapshot_entries=10,
                                                  compaction_margin_entries=0))
