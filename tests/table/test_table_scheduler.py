"""The table scheduler's policies over synthetic views (pure: view + time -> changes)."""

from __future__ import annotations

from quorumlog.table import (
    ChangeKind,
    GroupReport,
    NodeReport,
    ScheduledChange,
    Scheduler,
    SchedulerConfig,
)

CONFIG = SchedulerConfig(node_dead_after_ms=1_000, replace_dead_after_ms=3_000,
                         catchup_entries_max=10, changes_per_node_max=2,
                         change_timeout_ms=20_000)


class Cluster:
    """Groups as the nodes would report them; ``beat`` sends every live node's heartbeat."""

    def __init__(self, nodes: list[int], groups: dict[int, list[int]],
                 zones: dict[int, str] | None = None) -> None:
        self.nodes = list(nodes)
        self.zones = zones or {}
        self.down: set[int] = set()
        # group -> (leader, epoch, voters, learners, applied per node)
        self.voters = {g: list(m) for g, m in groups.items()}
        self.learners: dict[int, list[int]] = {g: [] for g in groups}
        self.leader = {g: m[0] for g, m in groups.items()}
        self.epoch = dict.fromkeys(groups, 1)
        self.applied = {g: dict.fromkeys(m, 100) for g, m in groups.items()}
        self.size_bytes: dict[int, int] = {}  # what each group's leader reports

    def report(self, node: int) -> NodeReport:
        groups = []
        for g in sorted(self.voters):
            if node not in self.voters[g] and node not in self.learners[g]:
                continue
            lead = self.leader[g] == node
            groups.append(GroupReport(
                group_id=g, leader=lead, epoch=self.epoch[g],
                applied_index=self.applied[g].get(node, 0),
                voters=tuple(self.voters[g]) if lead else (),
                learners=tuple(self.learners[g]) if lead else (),
                size_bytes=self.size_bytes.get(g, 0) if lead else 0))
        return NodeReport(node_id=node, address=f"n{node}", zone=self.zones.get(node, "z"),
                          disk_free_bytes=1 << 30, groups=tuple(groups))

    def beat(self, scheduler: Scheduler, now_ms: int) -> list[ScheduledChange]:
        for node in self.nodes:
            if node not in self.down:
                scheduler.heartbeat(self.report(node), now_ms)
        return scheduler.plan(now_ms)

    def apply(self, change: ScheduledChange) -> None:
        """What the group's leader does with a change whose epoch matches."""
        g = change.group_id
        assert change.epoch == self.epoch[g]
        if change.kind is ChangeKind.ADD_LEARNER:
            self.learners[g].append(change.node_id)
            self.applied[g][change.node_id] = 0
        elif change.kind is ChangeKind.PROMOTE:
            self.learners[g].remove(change.node_id)
            self.voters[g].append(change.node_id)
            if change.remove_node_id:
                self.voters[g].remove(change.remove_node_id)
        elif change.kind is ChangeKind.REMOVE:
            for members in (self.voters[g], self.learners[g]):
                if change.node_id in members:
                    members.remove(change.node_id)
        elif change.kind is ChangeKind.TRANSFER_LEADER:
            self.leader[g] = change.node_id
        self.epoch[g] += 1

    def catch_up(self) -> None:
        for applied in self.applied.values():
            for node in applied:
                applied[node] = 100


def run(cluster: Cluster, scheduler: Scheduler, start_ms: int, rounds: int,
        step_ms: int = 200) -> list[ScheduledChange]:
    """Heartbeat rounds; every change is applied at once and learners catch up."""
    done = []
    for i in range(rounds):
        for change in cluster.beat(scheduler, start_ms + i * step_ms):
            cluster.apply(change)
            done.append(change)
        cluster.catch_up()
    return done


def test_a_dead_nodes_replica_is_replaced_by_learner_then_promote_and_remove() -> None:
    cluster = Cluster([1, 2, 3, 4], {10: [1, 2, 3], 11: [2, 3, 4]})
    scheduler = Scheduler(CONFIG, started_ms=0)
    assert cluster.beat(scheduler, 0) == []
    cluster.down.add(3)
    # Dead after 1 s, but replaced only after 3 s of silence.
    assert cluster.beat(scheduler, 2_000) == []
    first = cluster.beat(scheduler, 3_100)
    assert sorted((c.group_id, c.kind, c.node_id) for c in first) == [
        (10, ChangeKind.ADD_LEARNER, 4), (11, ChangeKind.ADD_LEARNER, 1)]
    for change in first:
        cluster.apply(change)
    # Not caught up yet: nothing until the learners are close to the leader.
    assert cluster.beat(scheduler, 3_300) == []
    cluster.catch_up()
    second = cluster.beat(scheduler, 3_500)
    assert sorted((c.group_id, c.kind, c.node_id, c.remove_node_id) for c in second) == [
        (10, ChangeKind.PROMOTE, 4, 3), (11, ChangeKind.PROMOTE, 1, 3)]
    assert all(c.epoch == cluster.epoch[c.group_id] for c in second)
    for change in second:
        cluster.apply(change)
    assert run(cluster, scheduler, 3_700, 5) == []
    assert sorted(cluster.voters[10]) == [1, 2, 4] and sorted(cluster.voters[11]) == [1, 2, 4]


def test_a_dead_leader_victim_hands_leadership_over_first() -> None:
    # Node 1 leads group 10 and is silent: the group elects someone else in
    # reality; here the view still says 1 leads and 1 is dead: no change is
    # sent to a dead leader.
    cluster = Cluster([1, 2, 3, 4], {10: [1, 2, 3]})
    scheduler = Scheduler(CONFIG, started_ms=0)
    cluster.beat(scheduler, 0)
    cluster.down.add(1)
    assert cluster.beat(scheduler, 3_500) == []
    cluster.leader[10] = 2  # the survivors elect node 2
    cluster.epoch[10] += 1
    changes = run(cluster, scheduler, 3_600, 6)
    assert [c.kind for c in changes] == [ChangeKind.ADD_LEARNER, ChangeKind.PROMOTE]
    assert sorted(cluster.voters[10]) == [2, 3, 4]


def test_a_stale_view_never_sends_a_change_twice_and_a_pending_change_blocks_its_group() -> None:
    cluster = Cluster([1, 2, 3, 4], {10: [1, 2, 3]})
    scheduler = Scheduler(CONFIG, started_ms=0)
    cluster.beat(scheduler, 0)
    cluster.down.add(3)
    (change,) = cluster.beat(scheduler, 3_100)
    assert scheduler.changes_for(1) == [change]  # re-sent until done
    assert cluster.beat(scheduler, 3_300) == []  # not applied yet: nothing new for the group
    cluster.apply(change)
    cluster.beat(scheduler, 3_500)
    assert [f.outcome for f in scheduler.recent] == ["done"]


def test_changes_per_node_are_rate_limited() -> None:
    groups = {g: [1, 2, 3] for g in range(10, 16)}
    cluster = Cluster([1, 2, 3, 4], groups)
    scheduler = Scheduler(CONFIG, started_ms=0)
    cluster.beat(scheduler, 0)
    cluster.down.add(3)
    first = cluster.beat(scheduler, 3_100)
    # Every replacement adds a learner on node 4: at most 2 at once.
    assert len(first) == CONFIG.changes_per_node_max
    assert {c.node_id for c in first} == {4}
    for change in first:
        cluster.apply(change)
    changes = run(cluster, scheduler, 3_300, 40)
    assert all(sorted(cluster.voters[g]) == [1, 2, 4] for g in groups)
    moves = [c for c in changes if c.kind is not ChangeKind.TRANSFER_LEADER]
    assert len(moves) == 2 * len(groups) - len(first)
    # Then leaders spread: node 1 led all six groups.
    leaders = [cluster.leader[g] for g in groups]
    assert max(leaders.count(n) for n in (1, 2, 4)) - min(leaders.count(n) for n in (1, 2, 4)) <= 1


def test_replacement_keeps_replicas_in_distinct_zones() -> None:
    zones = {1: "a", 2: "b", 3: "c", 4: "a", 5: "c"}
    cluster = Cluster([1, 2, 3, 4, 5], {10: [1, 2, 3]}, zones)
    scheduler = Scheduler(CONFIG, started_ms=0)
    cluster.beat(scheduler, 0)
    cluster.down.add(3)
    (change,) = cluster.beat(scheduler, 3_100)
    assert change.kind is ChangeKind.ADD_LEARNER and change.node_id == 5  # zone c again


def test_a_new_node_gets_replicas_then_leaders() -> None:
    groups = {10 + g: [1 + g % 3, 1 + (g + 1) % 3, 1 + (g + 2) % 3] for g in range(8)}
    cluster = Cluster([1, 2, 3], groups)
    scheduler = Scheduler(CONFIG, started_ms=0)
    run(cluster, scheduler, 0, 3)
    assert all(sorted(v) == [1, 2, 3] for v in cluster.voters.values())
    cluster.nodes.append(4)
    run(cluster, scheduler, 1_000, 120)
    counts = {n: sum(n in v for v in cluster.voters.values()) for n in (1, 2, 3, 4)}
    assert max(counts.values()) - min(counts.values()) <= 1
    assert counts[4] >= 5
    leaders = {n: sum(1 for g in cluster.leader.values() if g == n) for n in (1, 2, 3, 4)}
    assert max(leaders.values()) - min(leaders.values()) <= 1
    assert leaders[4] >= 1
    assert all(len(v) == 3 and not cluster.learners[g] for g, v in cluster.voters.items())


def test_a_new_scheduler_declares_nobody_dead_before_one_dead_interval() -> None:
    cluster = Cluster([1, 2, 3, 4], {10: [1, 2, 3]})
    cluster.down.add(3)
    scheduler = Scheduler(CONFIG, started_ms=50_000)  # a new meta leader, node 3 never heard
    assert cluster.beat(scheduler, 50_500) == []
    assert not scheduler.is_dead(3, 50_500) and scheduler.is_dead(3, 51_000)
    assert cluster.beat(scheduler, 52_000) == []  # dead, not yet replaceable
    (change,) = cluster.beat(scheduler, 53_000)
    assert change.kind is ChangeKind.ADD_LEARNER and change.node_id == 4


def test_the_plan_is_deterministic() -> None:
    def changes() -> list[ScheduledChange]:
        cluster = Cluster([1, 2, 3, 4, 5], {g: [1, 2, 3] for g in range(10, 14)})
        scheduler = Scheduler(CONFIG, started_ms=0, seed=7)
        cluster.beat(scheduler, 0)
        cluster.down.add(2)
        return run(cluster, scheduler, 3_100, 20)

    assert changes() == changes()


def test_a_change_whose_target_dies_is_abandoned_and_the_node_replaced() -> None:
    groups = {10: [1, 2, 3], 11: [1, 2, 4], 12: [1, 3, 4]}
    cluster = Cluster([1, 2, 3, 4], groups)
    scheduler = Scheduler(CONFIG, started_ms=0)
    (transfer,) = cluster.beat(scheduler, 1_000)  # node 1 leads all three: hand one over
    assert transfer.kind is ChangeKind.TRANSFER_LEADER and transfer.node_id == 2
    cluster.down.add(transfer.node_id)  # the target dies before the transfer happens
    assert cluster.beat(scheduler, 1_500) == []
    cluster.beat(scheduler, 2_100)
    assert [f.outcome for f in scheduler.recent] == ["abandoned"]
    run(cluster, scheduler, 4_100, 30)
    assert all(transfer.node_id not in v and len(v) == 3 for v in cluster.voters.values())


def test_a_voter_dying_during_a_move_is_the_one_the_learner_replaces() -> None:
    """Found by the table simulator (seed 12): a balance move's learner was promoted in
    place of its live victim while another voter of the group was dead, leaving the
    dead voter in and one live voter fewer. The move now replaces the dead voter."""
    cluster = Cluster([1, 2, 3, 4], {1: [1, 2, 3]})
    cluster.learners[1] = [4]
    cluster.applied[1][4] = 0  # catching up
    scheduler = Scheduler(CONFIG, started_ms=0)
    scheduler.set_replicas_target(1, 3)  # the record sync
    assert cluster.beat(scheduler, 1_000) == []
    victim = scheduler._moves[1].victim
    dying = next(v for v in cluster.voters[1] if v not in (victim, cluster.leader[1]))
    cluster.down.add(dying)
    cluster.catch_up()
    changes = cluster.beat(scheduler, 2_100)  # `dying` silent for 1.1 s: dead
    assert [(c.kind, c.node_id, c.remove_node_id) for c in changes] == [
        (ChangeKind.PROMOTE, 4, dying)]


def test_a_learner_that_never_catches_up_is_removed_after_the_change_timeout() -> None:
    """Found by the table simulator (seed 17): a learner whose data vanished never
    catches up (the leader does not probe below what it once matched), so the group
    kept it forever and was never repaired. After change_timeout_ms it is removed."""
    cluster = Cluster([1, 2, 3, 4], {1: [1, 2, 3]})
    scheduler = Scheduler(CONFIG, started_ms=0)
    cluster.down.add(3)
    added = None
    for now in range(0, 10_000, 500):
        for change in cluster.beat(scheduler, now):
            assert change.kind is ChangeKind.ADD_LEARNER
            cluster.apply(change)
            added = now
            break
        if added is not None:
            break
    assert added is not None and cluster.learners[1] == [4]
    assert cluster.beat(scheduler, added + CONFIG.change_timeout_ms - 1) == []
    changes = cluster.beat(scheduler, added + CONFIG.change_timeout_ms)
    assert [(c.kind, c.node_id) for c in changes] == [(ChangeKind.REMOVE, 4)]
    assert "did not catch up" in changes[0].reason


def test_a_node_keeps_a_replica_its_group_has_past_a_lagging_record() -> None:
    """Found by the table simulator (seed 48): the record, written from a heartbeat a
    round behind, lacked a learner added a moment before; the node dropped (wiped) it,
    and the scheduler then promoted the empty replica to voter."""
    from quorumlog.table import PartitionRecord, keeps_replica

    record = PartitionRecord(members=(3, 4, 5), epoch=11)
    assert keeps_replica(1, record, group_epoch=12, group_members=frozenset({1, 3, 4, 5}))
    # The record is as new as the group, or the group no longer has the node: drop.
    assert not keeps_replica(1, record, group_epoch=11, group_members=frozenset({1, 3, 4, 5}))
    assert not keeps_replica(1, record, group_epoch=12, group_members=frozenset({3, 4, 5}))
    assert keeps_replica(4, record, group_epoch=0, group_members=frozenset())


def test_a_learner_that_has_not_reported_is_not_promoted_on_a_short_log() -> None:
    """Found by the table simulator (seed 88892615441718): with the leader's applied
    index below catchup_entries_max, a learner with no report counted as caught up and
    was promoted before its node had even opened the replica."""
    cluster = Cluster([1, 2, 3], {1: [1, 2, 3]})
    cluster.applied[1] = dict.fromkeys([1, 2, 3], 5)  # a young group: 5 entries
    cluster.learners[1] = [4]
    scheduler = Scheduler(CONFIG, started_ms=0)
    scheduler.set_replicas_target(1, 3)  # the record sync
    empty = NodeReport(node_id=4, address="n4", zone="z", disk_free_bytes=1 << 30, groups=())
    for now in (500, 1_000):  # node 4 is alive but has not opened the replica yet
        scheduler.heartbeat(empty, now)
        assert cluster.beat(scheduler, now) == []
    cluster.nodes.append(4)
    cluster.applied[1][4] = 5  # it opened the replica and caught up
    changes = cluster.beat(scheduler, 1_100)
    assert changes and changes[0].kind in (ChangeKind.PROMOTE, ChangeKind.TRANSFER_LEADER)


# ----- the replica-count policy --------------------------------------------------


def test_a_short_group_grows_to_its_tables_replica_count() -> None:
    """A group that lost a voter for good (removed) or was created short gets a
    learner, promoted without removing anyone, until it has the table's count."""
    cluster = Cluster([1, 2, 3, 4], {10: [1, 2], 11: [3]})
    scheduler = Scheduler(CONFIG, started_ms=0)
    scheduler.set_replicas_target(10, 3)
    scheduler.set_replicas_target(11, 3)
    changes = run(cluster, scheduler, 0, 20)
    grow = [c for c in changes if c.kind is not ChangeKind.TRANSFER_LEADER]
    assert [c.kind for c in grow if c.group_id == 10] == [ChangeKind.ADD_LEARNER,
                                                          ChangeKind.PROMOTE]
    assert all(c.remove_node_id == 0 for c in grow)
    assert len(cluster.voters[10]) == 3 and len(cluster.voters[11]) == 3
    assert not cluster.learners[10] and not cluster.learners[11]
    assert run(cluster, scheduler, 4_000, 5) == []  # never above the count


def test_a_group_keeps_its_voter_count_until_its_replica_count_is_known() -> None:
    cluster = Cluster([1, 2, 3, 4], {10: [1, 2]})
    scheduler = Scheduler(CONFIG, started_ms=0)  # a new meta leader before its record sync
    assert run(cluster, scheduler, 0, 5) == []
    scheduler.set_replicas_target(10, 2)
    assert run(cluster, scheduler, 1_000, 5) == []


def test_a_short_group_grows_across_zones_and_within_the_rate_limit() -> None:
    """Also: the replica balancing that follows never trades a group's zone spread
    for load (it moved zone b's only replica onto a zone-a node before)."""
    zones = {1: "a", 2: "a", 3: "b", 4: "c", 5: "c"}
    groups = {g: [1, 3] for g in range(10, 15)}
    cluster = Cluster([1, 2, 3, 4, 5], groups, zones)
    scheduler = Scheduler(CONFIG, started_ms=0)
    for g in groups:
        scheduler.set_replicas_target(g, 3)
    first = cluster.beat(scheduler, 0)
    # Zone c is the one the groups lack; at most changes_per_node_max per node.
    assert first and all(c.kind is ChangeKind.ADD_LEARNER and zones[c.node_id] == "c"
                         for c in first)
    busy = [c.node_id for c in first]
    assert all(busy.count(n) <= CONFIG.changes_per_node_max for n in busy)
    assert len(first) < len(groups)
    for change in first:
        cluster.apply(change)
    run(cluster, scheduler, 200, 60)
    for g in groups:
        assert len(cluster.voters[g]) == 3 and not cluster.learners[g]
        assert {zones[n] for n in cluster.voters[g]} == {"a", "b", "c"}


def test_a_group_above_its_replica_count_sheds_a_live_non_leader() -> None:
    cluster = Cluster([1, 2, 3, 4, 5], {10: [1, 2, 3, 4, 5], 11: [4, 5, 1]})
    scheduler = Scheduler(CONFIG, started_ms=0)
    scheduler.set_replicas_target(10, 3)
    scheduler.set_replicas_target(11, 3)
    (first,) = cluster.beat(scheduler, 0)
    # Nodes 4 and 5 hold the most replicas; node 1 leads: never the leader.
    assert (first.kind, first.node_id) == (ChangeKind.REMOVE, 5)
    cluster.apply(first)
    changes = run(cluster, scheduler, 200, 10)
    assert [(c.kind, c.node_id) for c in changes
            if c.kind is not ChangeKind.TRANSFER_LEADER] == [(ChangeKind.REMOVE, 4)]
    assert sorted(cluster.voters[10]) == [1, 2, 3]
    assert sorted(cluster.voters[11]) == [1, 4, 5]


def test_a_group_above_its_replica_count_sheds_a_dead_voter_first() -> None:
    cluster = Cluster([1, 2, 3, 4], {10: [1, 2, 3, 4]})
    scheduler = Scheduler(CONFIG, started_ms=0)
    scheduler.set_replicas_target(10, 3)
    cluster.down.add(2)  # never heard from: dead one node_dead_after_ms after the start
    (change,) = cluster.beat(scheduler, 1_100)
    assert (change.kind, change.node_id) == (ChangeKind.REMOVE, 2)


def test_a_short_group_waits_for_enough_live_nodes() -> None:
    cluster = Cluster([1, 2, 3], {10: [1, 2]})
    cluster.down.add(3)
    scheduler = Scheduler(CONFIG, started_ms=0)
    scheduler.set_replicas_target(10, 3)
    assert run(cluster, scheduler, 1_100, 5) == []
    cluster.down.discard(3)  # node 3 comes back: the group grows onto it
    run(cluster, scheduler, 3_000, 5)
    assert sorted(cluster.voters[10]) == [1, 2, 3]


def test_a_learner_found_by_a_new_scheduler_in_a_short_group_is_promoted_alone() -> None:
    cluster = Cluster([1, 2, 3], {10: [1, 2]})
    cluster.learners[10] = [3]
    cluster.applied[10][3] = 100
    scheduler = Scheduler(CONFIG, started_ms=0)
    scheduler.set_replicas_target(10, 3)
    (change,) = cluster.beat(scheduler, 0)
    assert (change.kind, change.node_id, change.remove_node_id) == (ChangeKind.PROMOTE, 3, 0)


def test_a_group_doubled_up_in_a_zone_spreads_once_a_zone_it_lacks_is_live() -> None:
    """Found by the table simulator with several nodes per zone (seeds 38, 84): a
    replacement made while zone c was down doubled up in zone a, and nothing spread
    the group again once zone c came back."""
    zones = {1: "a", 2: "a", 3: "b", 4: "c"}
    cluster = Cluster([1, 2, 3, 4], {10: [1, 2, 3], 11: [4, 1, 3]}, zones)
    scheduler = Scheduler(CONFIG, started_ms=0)
    assert cluster.beat(scheduler, 0) == []  # no balancing before a whole view
    (change,) = cluster.beat(scheduler, 1_000)
    # Node 2 leaves (zone a twice, not the leader), for node 4 (zone c).
    assert (change.group_id, change.kind, change.node_id) == (10, ChangeKind.ADD_LEARNER, 4)
    cluster.apply(change)
    changes = run(cluster, scheduler, 1_200, 20)
    assert (changes[0].kind, changes[0].node_id, changes[0].remove_node_id) == (
        ChangeKind.PROMOTE, 4, 2)
    # Replica balancing may then move zone a's replica within zone a, never out of it.
    assert {zones[n] for n in cluster.voters[10]} == {"a", "b", "c"}
    assert {zones[n] for n in cluster.voters[11]} == {"a", "b", "c"}


def test_replica_balancing_moves_the_smallest_group_first() -> None:
    cluster = Cluster([1, 2, 3], {10: [1, 2, 3], 11: [2, 3, 1], 12: [3, 1, 2]})
    cluster.size_bytes = {10: 500 << 20, 11: 100 << 20, 12: 300 << 20}
    scheduler = Scheduler(CONFIG, started_ms=0)
    run(cluster, scheduler, 0, 3)
    cluster.nodes.append(4)
    (change,) = cluster.beat(scheduler, 1_000)
    assert (change.group_id, change.kind, change.node_id) == (11, ChangeKind.ADD_LEARNER, 4)


def test_a_new_scheduler_waits_for_the_replica_count_before_deciding_a_found_learner() -> None:
    """Found by the table simulator (seed 207215719920): a scheduler that took over
    before its first record sync found the learner of a 1-voter group growing to 3,
    picked the only voter (the leader) as the one to go, and waited forever for a
    leader transfer with nobody to take it."""
    cluster = Cluster([1, 2, 3], {10: [1]})
    cluster.learners[10] = [2]
    cluster.applied[10][2] = 100
    scheduler = Scheduler(CONFIG, started_ms=0)
    assert cluster.beat(scheduler, 0) == []  # the count is not known yet
    assert 10 not in scheduler._moves
    scheduler.set_replicas_target(10, 3)
    run(cluster, scheduler, 200, 10)
    assert sorted(cluster.voters[10]) == [1, 2, 3] and not cluster.learners[10]


def test_a_one_voter_group_is_never_moved_by_balancing() -> None:
    cluster = Cluster([1, 2, 3], {g: [1] for g in range(10, 15)})
    scheduler = Scheduler(CONFIG, started_ms=0)
    for g in range(10, 15):
        scheduler.set_replicas_target(g, 1)
    assert run(cluster, scheduler, 0, 20) == []


def test_a_drained_node_loses_every_replica_and_leadership_and_gets_none_back() -> None:
    """``table drain``: each group on the drained node gets a learner elsewhere, then
    promote + remove (leadership handed over first where the node leads); nothing
    new goes to it, balancing included, and a one-voter group grows by one and
    shrinks back. Undrained, balancing may use it again."""
    groups = {10: [1, 2, 3], 11: [2, 3, 4], 12: [3, 1, 5], 13: [3]}
    cluster = Cluster([1, 2, 3, 4, 5], groups)
    scheduler = Scheduler(CONFIG, started_ms=0)
    for gid, count in {10: 3, 11: 3, 12: 3, 13: 1}.items():
        scheduler.set_replicas_target(gid, count)
    assert cluster.beat(scheduler, 0) == []
    scheduler.set_draining(frozenset({3}))
    assert scheduler.drain_remaining(3) == 4
    done = run(cluster, scheduler, 1_200, 60)
    assert all(3 not in cluster.voters[g] + cluster.learners[g] for g in groups), (
        cluster.voters, cluster.learners)
    assert scheduler.drain_remaining(3) == 0
    assert [len(cluster.voters[g]) for g in sorted(groups)] == [3, 3, 3, 1]
    assert all(cluster.leader[g] in cluster.voters[g] for g in groups)
    assert not any(c.node_id == 3 for c in done
                   if c.kind in (ChangeKind.ADD_LEARNER, ChangeKind.TRANSFER_LEADER))
    removed = {c.group_id for c in done if 3 in (c.node_id, c.remove_node_id)
               and c.kind in (ChangeKind.PROMOTE, ChangeKind.REMOVE)}
    assert removed == set(groups)
    assert any(c.kind is ChangeKind.TRANSFER_LEADER and c.group_id == 13 for c in done)
    assert run(cluster, scheduler, 20_000, 30) == []  # balancing leaves node 3 empty

    scheduler.set_draining(frozenset())
    back = run(cluster, scheduler, 30_000, 60)
    assert any(c.node_id == 3 for c in back if c.kind is ChangeKind.ADD_LEARNER)


def test_a_drain_without_room_elsewhere_waits() -> None:
    """Three replicas on three nodes: draining one would leave a group short, so
    nothing moves until a fourth node joins."""
    cluster = Cluster([1, 2, 3], {10: [1, 2, 3]})
    scheduler = Scheduler(CONFIG, started_ms=0)
    scheduler.set_replicas_target(10, 3)
    scheduler.set_draining(frozenset({2}))
    assert run(cluster, scheduler, 0, 20) == []
    cluster.nodes.append(4)
    moved = run(cluster, scheduler, 5_000, 30)
    assert sorted(cluster.voters[10]) == [1, 3, 4] and moved


def test_a_refused_leader_transfer_holds_its_group_only_a_dead_interval() -> None:
    """A leader refuses a transfer to a voter it cannot hear (ChangeExecutor,
    target_silent) while meta still hears that node: the pending transfer is given
    up after node_dead_after_ms, not change_timeout_ms, so the group's other
    changes wait seconds, not a minute."""
    cluster = Cluster([1, 2, 3], {10: [1, 2, 3], 11: [1, 2, 3], 12: [1, 2, 3]})
    scheduler = Scheduler(CONFIG, started_ms=0)
    issued = None
    for now in range(0, 5_000, 200):
        transfers = [c for c in cluster.beat(scheduler, now)
                     if c.kind is ChangeKind.TRANSFER_LEADER]
        if transfers:  # never applied: the leader refuses it
            issued, change = now, transfers[0]
            break
    assert issued is not None, "leaders all on node 1 were never balanced"
    cluster.beat(scheduler, issued + CONFIG.node_dead_after_ms - 1)
    assert scheduler.pending[change.group_id].change == change  # still held
    cluster.beat(scheduler, issued + CONFIG.node_dead_after_ms)
    finished = [f for f in scheduler.recent if f.change == change]
    assert [f.outcome for f in finished] == ["timed_out"]
    assert CONFIG.node_dead_after_ms < CONFIG.change_timeout_ms


class LosingCluster(Cluster):
    """Nodes may lose their data: such a node reports the groups it was a voter of
    as lost (not hosted) while it still is one, as TableService does."""

    def __init__(self, nodes: list[int], groups: dict[int, list[int]]) -> None:
        super().__init__(nodes, groups)
        self.lost: dict[int, set[int]] = {}

    def report(self, node: int) -> NodeReport:
        lost = {g for g in self.lost.get(node, set()) if node in self.voters[g]}
        self.lost[node] = lost
        report = super().report(node)
        groups = tuple(g for g in report.groups if g.group_id not in lost)
        return NodeReport(node_id=node, address=report.address, zone=report.zone,
                          disk_free_bytes=report.disk_free_bytes, groups=groups,
                          lost_groups=tuple(sorted(lost)))


def _node_3_loses_group_10(nodes: list[int]) -> tuple[LosingCluster, list[ScheduledChange]]:
    """Group 10 on nodes 1-3; node 3 loses its data; the changes of 6 rounds."""
    cluster = LosingCluster(nodes, {10: [1, 2, 3]})
    scheduler = Scheduler(CONFIG, started_ms=0)
    scheduler.set_replicas_target(10, 3)
    assert cluster.beat(scheduler, 0) == []
    cluster.lost[3] = {10}
    cluster.applied[10].pop(3)
    return cluster, run(cluster, scheduler, 200, 6)


def test_a_replica_lost_with_its_nodes_data_is_replaced_on_another_node() -> None:
    cluster, done = _node_3_loses_group_10([1, 2, 3, 4])
    assert [(c.kind, c.node_id, c.remove_node_id) for c in done] == [
        (ChangeKind.ADD_LEARNER, 4, 0), (ChangeKind.PROMOTE, 4, 3)]
    assert sorted(cluster.voters[10]) == [1, 2, 4]
    assert "lost with its data" in done[0].reason


def test_a_replica_lost_where_no_other_node_can_take_it_comes_back_as_a_learner() -> None:
    """Three nodes, three replicas: the voter goes, and the replica count adds a
    learner back on the same node, which opens it as a new replica."""
    cluster, done = _node_3_loses_group_10([1, 2, 3])
    assert [(c.kind, c.node_id, c.remove_node_id) for c in done] == [
        (ChangeKind.REMOVE, 3, 0), (ChangeKind.ADD_LEARNER, 3, 0), (ChangeKind.PROMOTE, 3, 0)]
    assert sorted(cluster.voters[10]) == [1, 2, 3] and cluster.lost[3] == set()


def test_a_lost_replica_is_never_the_last_voter_removed() -> None:
    cluster = LosingCluster([1], {10: [1]})
    scheduler = Scheduler(CONFIG, started_ms=0)
    scheduler.set_replicas_target(10, 1)
    cluster.lost[1] = {10}
    assert run(cluster, scheduler, 0, 5) == []  # no leader reports the group: no change
