"""Partition records from the scheduler's view (``updated_record``): a removed
member stays in the record until every voter of the new configuration has
applied it, so its node keeps the replica that a joint-config voter may still
need for an election (found by ``quorumlog sim table --seed 163462073 --mix dup``:
the leader committed leave-joint, died for good, and the followers, which never
learned the commit, needed the dropped old member's vote)."""

from __future__ import annotations

from quorumlog.table import (
    GroupReport,
    NodeReport,
    PartitionRecord,
    Scheduler,
    SchedulerConfig,
    updated_record,
)

GID = 7


def beat(scheduler: Scheduler, node: int, *, epoch: int, leader: bool = False,
         voters: tuple[int, ...] = (), learners: tuple[int, ...] = ()) -> None:
    group = GroupReport(group_id=GID, leader=leader, epoch=epoch, applied_index=50,
                        voters=voters if leader else (), learners=learners if leader else ())
    scheduler.heartbeat(NodeReport(node_id=node, address=f"127.0.0.1:{9000 + node}",
                                   zone="z", disk_free_bytes=1 << 30, groups=(group,)),
                        now_ms=1_000)


def test_a_removed_member_stays_in_the_record_until_every_new_voter_applied_the_change(
        ) -> None:
    scheduler = Scheduler(SchedulerConfig(), started_ms=0)
    record = PartitionRecord(members=(1, 3, 4), epoch=3)
    # Leader 3 applied "add 5, remove 1" (epoch 5); 4 and 5 hold it uncommitted.
    beat(scheduler, 3, epoch=5, leader=True, voters=(3, 4, 5))
    beat(scheduler, 4, epoch=4)
    beat(scheduler, 5, epoch=4)
    view = scheduler.groups[GID]
    kept = updated_record(view, record)
    assert kept is not None  # the new member is recorded at once (its node opens a replica)
    assert kept.members == (1, 3, 4, 5) and kept.epoch == 5
    assert updated_record(view, kept) is None  # nothing to rewrite while waiting

    beat(scheduler, 4, epoch=5)
    assert updated_record(view, kept) is None  # 5 has not applied it yet
    beat(scheduler, 5, epoch=5)
    final = updated_record(view, kept)
    assert final is not None and final.members == (3, 4, 5) and final.epoch == 5


def test_additions_and_learners_are_recorded_without_waiting() -> None:
    scheduler = Scheduler(SchedulerConfig(), started_ms=0)
    record = PartitionRecord(members=(1, 2, 3), epoch=2)
    beat(scheduler, 1, epoch=3, leader=True, voters=(1, 2, 3), learners=(4,))
    beat(scheduler, 2, epoch=2)
    new = updated_record(scheduler.groups[GID], record)
    assert new is not None
    assert new.members == (1, 2, 3) and new.learners == (4,)


def test_a_removed_member_readded_as_learner_is_not_kept_as_a_member() -> None:
    scheduler = Scheduler(SchedulerConfig(), started_ms=0)
    record = PartitionRecord(members=(1, 2, 3), epoch=4)
    beat(scheduler, 2, epoch=6, leader=True, voters=(2, 3, 4), learners=(1,))
    beat(scheduler, 3, epoch=5)
    new = updated_record(scheduler.groups[GID], record)
    assert new is not None
    assert new.members == (2, 3, 4) and new.learners == (1,)
