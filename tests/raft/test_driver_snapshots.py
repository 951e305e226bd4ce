"""Large states through the driver: snapshots larger than one rpc frame
(16 MiB) reach a lagging or new member in chunks, a failed transfer is
reported to the core and retried, and batches of Raft messages stay within a
frame. Real hosts over real rpc on 127.0.0.1, real WALs."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from quorumlog import rpc
from quorumlog.errors import UsageError
from quorumlog.raft import ConfChange, ConfChangeSingle, ConfChangeType, Role
from quorumlog.raft._driver import HostConfig, split_messages
from quorumlog.raft._snapshot_transfer import SnapshotSender, SnapshotTransferConfig

from .driver_support import GROUP, Member, propose_retrying, run_cluster, wait_leader, wait_until

MIB = 1024 * 1024
FRAME_LIMIT_BYTES = 16 * MIB
CATCH_UP_DEADLINE_S = 60.0


def config(**transfer: int) -> HostConfig:
    return HostConfig(
        tick_interval_ms=20,
        snapshot_entries=20,
        compaction_margin_entries=2,
        # Only a report from the driver can take the follower out of SNAPSHOT
        # state within these tests (the core's own timeout is out of reach).
        snapshot_wait_ticks_max=1_000_000,
        snapshot_transfer=SnapshotTransferConfig(**transfer),
    )


async def write_state(members: list[Member], mib: int) -> None:
    """``mib`` proposals of 1 MiB each, four at a time."""
    for start in range(0, mib, 4):
        await asyncio.gather(*(
            propose_retrying(members, bytes([i % 251]) * MIB + b"%d" % i)
            for i in range(start, min(start + 4, mib))
        ))


async def lagging_follower(members: list[Member], mib: int) -> tuple[Member, Member]:
    """Stop a follower, write ``mib`` MiB, let the leader snapshot and compact
    past the follower's log; return (leader, stopped follower)."""
    leader = await wait_leader(members)
    follower = next(m for m in members if m is not leader)
    await follower.stop()
    up = [m for m in members if m is not follower]
    await write_state(up, mib)
    leader = await wait_leader(up)
    assert leader.host is not None
    group = leader.host.group(GROUP)
    await wait_until(lambda: group.storage.first_index() > 3, timeout_s=30,
                     what="the leader compacted its log")
    assert len(group.storage.snapshot().data) > FRAME_LIMIT_BYTES
    return leader, follower


def sent(members: list[Member], field: str) -> int:
    """A snapshot send counter summed over the members (leadership may move)."""
    return sum(getattr(m.host.snapshot_send_stats, field) for m in members if m.host is not None)


async def caught_up(
    follower: Member, leader: Member, timeout_s: float = CATCH_UP_DEADLINE_S
) -> None:
    await wait_until(lambda: follower.machine.items == leader.machine.items,
                     timeout_s=timeout_s, what="the follower caught up")


def test_a_follower_catches_up_from_a_snapshot_larger_than_a_frame(tmp_path: Path) -> None:
    async def body(members: list[Member]) -> None:
        leader, follower = await lagging_follower(members, 40)
        await follower.start(None)
        await caught_up(follower, leader)
        assert follower.host is not None and leader.host is not None
        assert follower.host.snapshot_receive_stats.transfers_completed >= 1
        assert follower.host.snapshot_receive_stats.bytes_received > FRAME_LIMIT_BYTES
        # The sender counts once the follower's answer to the commit is in.
        await wait_until(lambda: sent(members, "transfers_completed") >= 1,
                         what="the sender saw the transfer complete")
        assert follower.host.group(GROUP).snapshot_index > 3
        assert follower.machine.total_bytes() >= 40 * MIB
        # Replication goes on from the snapshot.
        assert await propose_retrying(members, b"after") == b"after"
        await caught_up(follower, leader)

    run_cluster(tmp_path, body, config=config())


def test_a_transfer_cut_mid_way_is_reported_and_retried(tmp_path: Path) -> None:
    async def body(members: list[Member]) -> None:
        leader, follower = await lagging_follower(members, 40)
        await follower.start(None)
        assert follower.host is not None
        receiver = follower.host
        await wait_until(lambda: receiver.snapshot_receive_stats.bytes_received > 0,
                         timeout_s=30, what="the transfer started")
        assert receiver.snapshot_receive_stats.transfers_completed == 0
        # Drop every connection to the follower mid-transfer (its host stays up).
        assert follower.server is not None
        await follower.server.close()
        await wait_until(lambda: sent(members, "transfers_failed") >= 1,
                         timeout_s=30, what="the failed transfer reported")
        await follower.start_server(receiver)
        await caught_up(follower, leader)
        await wait_until(lambda: sent(members, "transfers_completed") >= 1,
                         what="the sender saw the transfer complete")
        assert receiver.snapshot_receive_stats.transfers_completed >= 1
        staging = follower.root / f"n{follower.node_id}" / "incoming-snapshots"
        assert list(staging.iterdir()) == []
        leader = await wait_leader(members)
        assert leader.host is not None
        progress = leader.host.group(GROUP).node.status()["progress"][follower.node_id]
        assert progress["state"] != "SNAPSHOT"

    # Small chunks, one in flight: the transfer takes long enough to be cut.
    run_cluster(tmp_path, body, config=config(chunk_bytes=64 * 1024, chunks_in_flight_max=1))


@pytest.mark.slow
def test_a_new_member_catches_up_to_200_mib(tmp_path: Path) -> None:
    async def body(members: list[Member]) -> None:
        founders, newcomer = members[:3], members[3]
        # 230 entries of 1 MiB: the snapshot after 220 of them (snapshot_entries
        # = 110) holds more than 200 MiB.
        await write_state(founders, 230)
        leader = await wait_leader(founders)
        assert leader.host is not None
        group = leader.host.group(GROUP)
        await wait_until(lambda: len(group.storage.snapshot().data) >= 200 * MIB, timeout_s=60,
                         what="a snapshot of 200 MiB")
        assert group.storage.first_index() > 3
        await newcomer.start(None)
        change = ConfChange(changes=(ConfChangeSingle(type=ConfChangeType.ADD_LEARNER,
                                                      node_id=newcomer.node_id),))
        await leader.host.change_membership(GROUP, change, timeout_s=30)
        await caught_up(newcomer, leader, timeout_s=300)
        assert newcomer.machine.total_bytes() >= 230 * MIB
        assert newcomer.host is not None
        assert newcomer.host.snapshot_receive_stats.bytes_received >= 200 * MIB
        assert newcomer.role() is Role.FOLLOWER

    run_cluster(tmp_path, body, config=config().replace(snapshot_entries=110),
                node_ids=(1, 2, 3, 4), voters=(1, 2, 3), deadline_s=600)


def test_messages_to_a_peer_are_split_by_count_and_by_bytes() -> None:
    # A batch of 1 MiB APP messages must not become one request past the rpc
    # frame limit (it was cut by count only, and dropped whole when too big).
    mib = b"x" * (1 << 20)
    messages = [(GROUP, mib)] * 10 + [(GROUP, b"y")] * 5
    requests = split_messages(messages, count_max=4, bytes_max=3 << 20)
    assert [len(r) for r in requests] == [3, 3, 3, 1 + 3, 2]
    assert [m for r in requests for m in r] == messages
    assert all(sum(len(d) for _, d in r) <= 3 << 20 for r in requests)
    huge = [(GROUP, mib * 5), (GROUP, b"z")]
    assert split_messages(huge, count_max=4, bytes_max=1 << 20) == [[huge[0]], [huge[1]]]
    assert split_messages([], count_max=4, bytes_max=1) == []


def test_failed_transfers_back_off_exponentially_up_to_the_max() -> None:
    sender = SnapshotSender(1, SnapshotTransferConfig(backoff_ms_min=100, backoff_ms_max=1000),
                            rpc.Pool(), lambda: 1)
    assert sender.delay_s(GROUP, 2, now=0.0) == 0.0
    delays = []
    for _ in range(6):
        sender.finished(GROUP, 2, ok=False, now=10.0)
        delays.append(round(sender.delay_s(GROUP, 2, now=10.0), 3))
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert sender.delay_s(GROUP, 3, now=10.0) == 0.0  # per follower
    sender.finished(GROUP, 2, ok=True, now=11.0)
    assert sender.delay_s(GROUP, 2, now=11.0) == 0.0


def test_a_chunk_that_cannot_fit_a_frame_is_a_clear_error() -> None:
    with pytest.raises(UsageError, match="chunk_bytes"):
        SnapshotSender(1, SnapshotTransferConfig(chunk_bytes=FRAME_LIMIT_BYTES), rpc.Pool(),
                       lambda: 1)
