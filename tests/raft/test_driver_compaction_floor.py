"""The driver's compaction floor hook: a group's log is never compacted past
what ``RaftHost.compaction_floor`` allows (table duplication keeps the log its
shippers have not confirmed), and compaction resumes once the floor goes."""

from __future__ import annotations

from pathlib import Path

from quorumlog.raft import Entry
from quorumlog.raft._driver import HostConfig

from .driver_support import GROUP, Member, propose_retrying, run_cluster, wait_leader, wait_until
from .test_driver_file_snapshots import run_file_cluster

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
    """Learn step back: a member that fell behind the floor is sent the leader's
    snapshot (the leader's log starts after the floor) and still reads every
    entry after the floor, from the log tail that came with the snapshot, also
    after a restart. Without the tail its log starts at the snapshot index and
    the entries between the floor and it are gone (CompactedError).

    The member is stopped, not wiped: a wiped member that rejoins under its old
    id is refused by design (the leader's commit is past its empty log: it lost
    acknowledged entries, docs/meta.md), which made this test flaky."""
    floors: dict[int, int | None] = {GROUP: HELD_AT}

    async def body(members: list[Member]) -> None:
        for member in members:
            assert member.host is not None
            member.host.compaction_floor = floors.get
        leader = await wait_leader(members)
        behind = next(m for m in members if m is not leader)
        assert behind.host is not None
        assert behind.host.group(GROUP).storage.last_index() < HELD_AT
        await behind.stop()
        up = [m for m in members if m is not behind]
        for i in range(60):
            await propose_retrying(up, b"%d" % i)
        leader = await wait_leader(up)
        assert leader.host is not None
        await wait_until(lambda: leader.host is not None
                         and leader.host.group(GROUP).snapshot_index >= 40,
                         timeout_s=30, what="the leader took snapshots")
        await behind.start(None)
        assert behind.host is not None
        behind.host.compaction_floor = floors.get
        await wait_until(lambda: behind.host is not None
                         and behind.host.group(GROUP).snapshot_index >= 40,
                         timeout_s=30, what="the member behind installed a snapshot")
        for _ in range(2):  # as installed, then after a restart
            assert behind.host is not None
            snapshot_index = behind.host.group(GROUP).snapshot_index
            assert behind.host.group(GROUP).storage.first_index() > HELD_AT + 1
            got = retained(behind, HELD_AT + 1, snapshot_index + 1)
            assert [e.index for e in got] == list(range(HELD_AT + 1, snapshot_index + 1))
            assert got == retained(leader, HELD_AT + 1, snapshot_index + 1)
            await behind.stop()
            await behind.start(None)
            behind.host.compaction_floor = floors.get  # type: ignore[union-attr]

    run_file_cluster(tmp_path, body)
