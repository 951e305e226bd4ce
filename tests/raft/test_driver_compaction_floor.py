"""The driver's compaction floor hook: a group's log is never compacted past
what ``RaftHost.compaction_floor`` allows (table duplication keeps the log its
shippers have not confirmed), and compaction resumes once the floor goes."""

from __future__ import annotations

import shutil
from pathlib import Path

from quorumlog.raft import Entry
from quorumlog.raft._driver import HostConfig

from .driver_support import GROUP, Member, propose_retrying, run_cluster, wait_leader, wait_until
from .test_driver_file_snapshots import group_dir, run_file_cluster

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


def retained(member: Member, lo: int, hi: int) -> list[Entry]:
    """Entries [lo, hi) as ``retained_entries`` gives them, page by page."""
    assert member.host is not None
    out: list[Entry] = []
    while lo < hi:
        page = member.host.retained_entries(GROUP, lo, hi, 1024)
        out.extend(page)
        lo = page[-1].index + 1
    return out


def test_a_member_rebuilt_from_a_snapshot_gets_the_log_after_the_floor(tmp_path: Path) -> None:
    """Learn step back: a wiped member is sent the leader's snapshot (its log
    starts past the floor) and still reads every entry after the floor, from
    the log tail that came with the snapshot, also after a restart. Without
    the tail its log starts at the snapshot index and the entries between the
    floor and it are gone (CompactedError)."""
    floors: dict[int, int | None] = {GROUP: HELD_AT}

    async def body(members: list[Member]) -> None:
        for member in members:
            assert member.host is not None
            member.host.compaction_floor = floors.get
        leader = await wait_leader(members)
        wiped = next(m for m in members if m is not leader)
        await wiped.stop()
        shutil.rmtree(group_dir(wiped))
        shutil.rmtree(wiped.root / f"machine-{wiped.node_id}")
        up = [m for m in members if m is not wiped]
        for i in range(60):
            await propose_retrying(up, b"%d" % i)
        leader = await wait_leader(up)
        assert leader.host is not None
        await wait_until(lambda: leader.host is not None
                         and leader.host.group(GROUP).snapshot_index >= 40,
                         timeout_s=30, what="the leader took snapshots")
        await wiped.start(None)
        assert wiped.host is not None
        wiped.host.compaction_floor = floors.get
        await wait_until(lambda: wiped.host is not None
                         and wiped.host.group(GROUP).snapshot_index >= 40,
                         timeout_s=30, what="the wiped member installed a snapshot")
        for _ in range(2):  # as installed, then after a restart
            assert wiped.host is not None
            snapshot_index = wiped.host.group(GROUP).snapshot_index
            assert wiped.host.group(GROUP).storage.first_index() > HELD_AT + 1
            got = retained(wiped, HELD_AT + 1, snapshot_index + 1)
            assert [e.index for e in got] == list(range(HELD_AT + 1, snapshot_index + 1))
            assert got == retained(leader, HELD_AT + 1, snapshot_index + 1)
            await wiped.stop()
            await wiped.start(None)
            wiped.host.compaction_floor = floors.get  # type: ignore[union-attr]

    run_file_cluster(tmp_path, body)
