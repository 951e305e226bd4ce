"""The table scheduler: meta as Curve's MDS for the partitions' Raft groups.

Pure and deterministic: a :class:`Scheduler` holds the view built from table
nodes' heartbeats (:meth:`Scheduler.heartbeat`) and, given the time, decides
configuration changes (:meth:`Scheduler.plan`); no I/O, no clock of its own,
so a simulator can drive it. The process of the meta leader runs one
(``SchedulerService``); a new leader starts from an empty view, rebuilt from
the next round of heartbeats, and declares no node dead before one
``node_dead_after_ms`` has passed since it started.

Every change carries the group epoch the scheduler last saw (Curve's
copyset epoch); the group's leader applies it only while the epoch still
matches, so a change decided on a stale view is harmless.

Policies, in order of priority, one change per group at a time and at most
``changes_per_node_max`` changes in flight touching any node:

1. *replace*: a voter on a node silent for ``replace_dead_after_ms`` is
   replaced: add a learner on a node chosen by ``place_replicas`` (zones,
   scatter width, load), wait until its applied index is within
   ``catchup_entries_max`` of the leader's, then promote it and remove the
   dead voter in one joint change;
2. *replica count*: a group with fewer voters than its table's replica count
   (``set_replicas_target``; a voter removed for good, or a table created
   short) gets a learner on a node chosen by ``place_replicas``, promoted
   once caught up without removing anyone; a group with more sheds voters,
   dead ones first, then a live non-leader on the most loaded node, one
   ``remove`` at a time. A group whose count is not known yet (a new meta
   leader before its first record sync) keeps its current voter count;
3. *spread zones*: a group whose voters share a zone while a zone it lacks has a
   live node moves one of them there (same learner, promote, remove steps);
4. *balance replicas*: while one live node holds more than
   ``replica_imbalance_max`` replicas more than another, move a replica from
   the most to the least loaded node (same learner, promote, remove steps),
   of the smallest group there (by the bytes its leader reports);
5. *balance leaders*: while one live node leads more than
   ``leader_imbalance_max`` groups more than another, transfer a leadership.

A voter about to be removed that leads its group first hands leadership to
another voter.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

import msgspec

from quorumlog.config import Config, require
from quorumlog.errors import invariant
from quorumlog.table._placement import (
    ClusterLoad,
    NodeCandidate,
    NotEnoughTableNodesError,
    place_replicas,
)

RECENT_CHANGES_MAX = 64  # finished changes the scheduler remembers for `table schedule`


class ChangeKind(StrEnum):
    ADD_LEARNER = "add_learner"
    PROMOTE = "promote"  # promote node_id (a learner) and remove remove_node_id, one joint change
    REMOVE = "remove"
    TRANSFER_LEADER = "transfer_leader"


class ScheduledChange(msgspec.Struct, frozen=True):
    """One configuration change for one group, stamped with the epoch it was decided at."""

    group_id: int
    epoch: int
    kind: ChangeKind
    node_id: int
    remove_node_id: int = 0
    reason: str = ""

    def touches(self) -> tuple[int, ...]:
        return (self.node_id, self.remove_node_id) if self.remove_node_id else (self.node_id,)


class GroupReport(msgspec.Struct, frozen=True):
    """What one node says of one group it hosts; the membership fields count
    only from the group's leader."""

    group_id: int
    leader: bool
    epoch: int
    applied_index: int
    voters: tuple[int, ...] = ()
    learners: tuple[int, ...] = ()
    change_in_progress: bool = False
    size_bytes: int = 0


class NodeReport(msgspec.Struct, frozen=True):
    """One table node's heartbeat: capacity and its groups."""

    node_id: int
    address: str
    zone: str
    disk_free_bytes: int
    groups: tuple[GroupReport, ...]
    # Groups the node is a voter of but does not host because its table Raft data
    # is gone (a wiped disk): the scheduler replaces those voters (policy 1).
    lost_groups: tuple[int, ...] = ()


class SchedulerConfig(Config, frozen=True):
    """The scheduler's bounds (``[table]`` of the meta leader's node config)."""

    # A node silent this long is dead: no placement on it, no leader balance.
    node_dead_after_ms: int = 10_000
    # A dead node's replicas are replaced after this long (a restart is cheaper).
    replace_dead_after_ms: int = 60_000
    # A learner this close to the leader's applied index may be promoted.
    catchup_entries_max: int = 100
    # Changes in flight that touch one node (add, remove, promote, transfer target).
    changes_per_node_max: int = 2
    # A change not reflected in a heartbeat by then is given up and may be decided again.
    change_timeout_ms: int = 60_000
    # Replica and leader counts may differ this much between live nodes.
    replica_imbalance_max: int = 1
    leader_imbalance_max: int = 1

    def validate(self) -> None:
        require(self.node_dead_after_ms >= 1, "[table] node_dead_after_ms must be >= 1")
        require(self.replace_dead_after_ms >= self.node_dead_after_ms,
                "[table] replace_dead_after_ms must be >= node_dead_after_ms")
        require(self.catchup_entries_max >= 0, "[table] catchup_entries_max must be >= 0")
        require(self.changes_per_node_max >= 1, "[table] changes_per_node_max must be >= 1")
        require(self.change_timeout_ms >= 1, "[table] change_timeout_ms must be >= 1")
        require(self.replica_imbalance_max >= 1, "[table] replica_imbalance_max must be >= 1")
        require(self.leader_imbalance_max >= 1, "[table] leader_imbalance_max must be >= 1")


@dataclass(slots=True)
class NodeView:
    node_id: int
    address: str
    zone: str
    last_seen_ms: int
    disk_free_bytes: int = 0


@dataclass(slots=True)
class GroupView:
    """A group as its leader last reported it, plus every replica's applied index."""

    group_id: int
    leader: int = 0
    epoch: int = 0
    voters: tuple[int, ...] = ()
    learners: tuple[int, ...] = ()
    change_in_progress: bool = False
    size_bytes: int = 0
    applied: dict[int, int] = field(default_factory=dict)
    # Every replica's epoch as it reports it (its group epoch at its applied index).
    epochs: dict[int, int] = field(default_factory=dict)


@dataclass(slots=True)
class PendingChange:
    change: ScheduledChange
    issued_ms: int


@dataclass(frozen=True, slots=True)
class FinishedChange:
    change: ScheduledChange
    issued_ms: int
    finished_ms: int
    outcome: str  # "done" (the epoch moved on), "timed_out" or "abandoned" (target died)


@dataclass(frozen=True, slots=True)
class _Move:
    learner: int
    victim: int
    reason: str
    since_ms: int  # when the learner was added (or found by a new meta leader)


class Scheduler:
    """See the module docstring."""

    def __init__(self, config: SchedulerConfig, *, started_ms: int, seed: int = 0) -> None:
        config.validate()
        self.config = config
        self.started_ms = started_ms
        self.nodes: dict[int, NodeView] = {}
        # node -> the groups it reports lost (NodeReport.lost_groups)
        self.lost: dict[int, frozenset[int]] = {}
        self.groups: dict[int, GroupView] = {}
        self.pending: dict[int, PendingChange] = {}
        self.recent: list[FinishedChange] = []
        self._moves: dict[int, _Move] = {}
        # group -> its table's replica count (the records' TableRecord.replicas)
        self.replicas_target: dict[int, int] = {}
        # Nodes an operator is draining (``quorumlog table drain``): no new replica or
        # leadership goes there, and their replicas move off, one move at a time.
        self.draining: frozenset[int] = frozenset()
        self._seed = seed

    # ----- the view -------------------------------------------------------------

    def heartbeat(self, report: NodeReport, now_ms: int) -> None:
        """Fold one node's heartbeat into the view."""
        self.nodes[report.node_id] = NodeView(report.node_id, report.address, report.zone,
                                              now_ms, report.disk_free_bytes)
        self.lost[report.node_id] = frozenset(report.lost_groups)
        for g in report.groups:
            view = self.groups.setdefault(g.group_id, GroupView(g.group_id))
            view.applied[report.node_id] = g.applied_index
            view.epochs[report.node_id] = g.epoch
            if g.leader:
                view.leader, view.epoch = report.node_id, g.epoch
                view.voters, view.learners = tuple(sorted(g.voters)), tuple(sorted(g.learners))
                view.change_in_progress, view.size_bytes = g.change_in_progress, g.size_bytes
                for node in list(view.applied):
                    if node not in view.voters and node not in view.learners:
                        del view.applied[node]
                        view.epochs.pop(node, None)
            elif view.leader == report.node_id:
                view.leader = 0  # it led the group and no longer does
        self._settle(now_ms)

    def set_replicas_target(self, group_id: int, replicas: int) -> None:
        """The replica count of the group's table (from its record in meta)."""
        invariant(replicas >= 1, f"group {group_id}: replica count {replicas} < 1")
        self.replicas_target[group_id] = replicas

    def set_draining(self, nodes: frozenset[int]) -> None:
        """The nodes being drained (from meta, at every record sync)."""
        self.draining = frozenset(nodes)

    def drain_remaining(self, node: int) -> int:
        """Replicas (voters and learners) the view still places on ``node``."""
        return sum(1 for g in self.groups.values() if node in g.voters or node in g.learners)

    def forget_group(self, group_id: int) -> None:
        """A dropped table's group."""
        self.groups.pop(group_id, None)
        self.replicas_target.pop(group_id, None)
        self.pending.pop(group_id, None)
        self._moves.pop(group_id, None)

    def last_seen_ms(self, node: int) -> int:
        view = self.nodes.get(node)
        return view.last_seen_ms if view is not None else self.started_ms

    def is_dead(self, node: int, now_ms: int) -> bool:
        return now_ms - self.last_seen_ms(node) >= self.config.node_dead_after_ms

    def is_gone(self, group_id: int, node: int, now_ms: int) -> bool:
        """A voter that cannot serve its group: its node is dead, or reports the
        group lost with its data (``NodeReport.lost_groups``)."""
        return self.is_dead(node, now_ms) or group_id in self.lost.get(node, ())

    def _gone(self, group: GroupView, node: int, now_ms: int) -> bool:
        return self.is_gone(group.group_id, node, now_ms)

    def _replaceable(self, node: int, now_ms: int) -> bool:
        return now_ms - self.last_seen_ms(node) >= self.config.replace_dead_after_ms

    def live_nodes(self, now_ms: int) -> list[NodeView]:
        return [n for _, n in sorted(self.nodes.items()) if not self.is_dead(n.node_id, now_ms)]

    def placeable_nodes(self, now_ms: int) -> list[NodeView]:
        """Live nodes that may take replicas and leaderships (not being drained)."""
        return [n for n in self.live_nodes(now_ms) if n.node_id not in self.draining]

    def changes_for(self, leader: int) -> list[ScheduledChange]:
        """The pending changes of the groups ``leader`` leads (re-sent until done)."""
        return [p.change for gid, p in sorted(self.pending.items())
                if self.groups.get(gid, GroupView(gid)).leader == leader]

    def _settle(self, now_ms: int) -> None:
        """Retire pending changes whose group moved past their epoch, or that timed out."""
        for gid, pending in list(self.pending.items()):
            group = self.groups.get(gid)
            if group is not None and group.epoch != pending.change.epoch:
                self._finish(gid, now_ms, "done")
            elif (pending.change.kind is not ChangeKind.REMOVE
                  and self.is_dead(pending.change.node_id, now_ms)):
                # Its target died (a leader transfer to it would never finish): give
                # the group back to the policies, which will replace the dead node.
                self._finish(gid, now_ms, "abandoned")
            elif now_ms - pending.issued_ms >= self._timeout_ms(pending.change):
                self._finish(gid, now_ms, "timed_out")

    def _timeout_ms(self, change: ScheduledChange) -> int:
        """A leader transfer ends within an election timeout or never: one the
        leader refused (a target it cannot hear, though meta still hears it) holds
        its group for at most node_dead_after_ms, not change_timeout_ms."""
        if change.kind is ChangeKind.TRANSFER_LEADER:
            return min(self.config.change_timeout_ms, self.config.node_dead_after_ms)
        return self.config.change_timeout_ms

    def _finish(self, gid: int, now_ms: int, outcome: str) -> None:
        pending = self.pending.pop(gid)
        self.recent.append(FinishedChange(pending.change, pending.issued_ms, now_ms, outcome))
        del self.recent[:-RECENT_CHANGES_MAX]

    # ----- decisions -----------------------------------------------------------------

    def plan(self, now_ms: int) -> list[ScheduledChange]:
        """Decide new changes (also kept as pending); deterministic for a view and time."""
        self._settle(now_ms)
        issued: list[ScheduledChange] = []
        for gid in sorted(self.groups):
            change = self._plan_group(self.groups[gid], now_ms)
            if change is not None and self._admit(change, now_ms):
                issued.append(change)
        # Balancing waits for a whole view (every live node heard from) and for
        # every other change to finish: one move at a time, cluster-wide.
        full_view = now_ms - self.started_ms >= self.config.node_dead_after_ms
        if full_view and not issued and not self.pending and not self._moves:
            change = (self._balance_zones(now_ms) or self._balance_replicas(now_ms)
                      or self._balance_leaders(now_ms))
            if change is not None and self._admit(change, now_ms):
                issued.append(change)
        return issued

    def _admit(self, change: ScheduledChange, now_ms: int) -> bool:
        """The rate limits: one change per group, ``changes_per_node_max`` per node."""
        if change.group_id in self.pending:
            return False
        busy: dict[int, int] = {}
        for pending in self.pending.values():
            for node in pending.change.touches():
                busy[node] = busy.get(node, 0) + 1
        if any(busy.get(n, 0) >= self.config.changes_per_node_max for n in change.touches()):
            return False
        self.pending[change.group_id] = PendingChange(change, now_ms)
        return True

    def _plan_group(self, group: GroupView, now_ms: int) -> ScheduledChange | None:
        if (group.group_id in self.pending or group.change_in_progress or not group.leader
                or self.is_dead(group.leader, now_ms)):
            return None
        move = self._moves.get(group.group_id)
        if move is not None and move.learner not in group.learners:
            # Promoted (done), or the add never happened (its change was given up):
            # either way this move is over, and the policies below decide afresh.
            del self._moves[group.group_id]
            move = None
        if group.learners:
            return self._continue_move(group, move, now_ms)
        target = self.replicas_target.get(group.group_id, len(group.voters))
        if len(group.voters) > target:
            return self._shrink(group, target, now_ms)
        dead = [v for v in group.voters if self._replaceable(v, now_ms)]
        if dead:
            return self._add_learner(group, dead[0], now_ms,
                                     f"replace replica on dead node {dead[0]}")
        lost = [v for v in group.voters if group.group_id in self.lost.get(v, ())]
        if lost and lost[0] != group.leader:
            reason = f"replace replica node {lost[0]} lost with its data"
            change = self._add_learner(group, lost[0], now_ms, reason)
            if change is not None or len(group.voters) < 2:
                return change
            # No other node can take it (every live node holds a replica already):
            # the voter goes, and the replica count policy adds a learner back,
            # maybe on that same node, where it opens as a new replica.
            return self._change(group, ChangeKind.REMOVE, lost[0], reason=reason)
        if len(group.voters) < target:
            return self._add_learner(group, 0, now_ms,
                                     f"group has {len(group.voters)} of {target} replicas")
        drained = [v for v in group.voters if v in self.draining]
        if drained and not any(self.is_dead(v, now_ms) for v in group.voters):
            # A dead voter is replaced first: a drain never removes a live voter
            # while a dead one stays. A group of one voter cannot hand its
            # leadership to a learner: it grows by one first, and the shrink back
            # to its count drops the drained voter.
            victim = drained[0] if len(group.voters) >= 2 else 0
            return self._add_learner(group, victim, now_ms, f"drain node {drained[0]}")
        return None

    def _shrink(self, group: GroupView, target: int, now_ms: int) -> ScheduledChange | None:
        """One voter fewer for a group above its replica count: a dead voter first
        (never a live one while a dead one stays), else a live non-leader on the
        most loaded node. The leader is live here (``_plan_group``), so a group of
        two or more voters always has a non-leader to remove."""
        reason = f"group has {len(group.voters)} voters, its table {target} replicas"
        dead = [v for v in group.voters if self._gone(group, v, now_ms)]
        if dead:
            return self._change(group, ChangeKind.REMOVE, dead[0], reason=reason)
        drained = [v for v in group.voters if v in self.draining]
        if drained:
            victim = drained[0]
            if victim != group.leader:
                return self._change(group, ChangeKind.REMOVE, victim,
                                    reason=f"{reason}; drain node {victim}")
            stay = [v for v in group.voters
                    if v not in self.draining and not self._gone(group, v, now_ms)]
            if stay:
                return self._change(group, ChangeKind.TRANSFER_LEADER, stay[0],
                                    reason=f"leader node {victim} is being drained")
        counts = self._replica_counts(now_ms)
        others = [v for v in group.voters if v != group.leader]
        invariant(bool(others), f"group {group.group_id}: no non-leader voter to remove")
        victim = max(others, key=lambda v: (counts.get(v, 0), v))
        return self._change(group, ChangeKind.REMOVE, victim, reason=reason)

    def _continue_move(self, group: GroupView, move: _Move | None,
                       now_ms: int) -> ScheduledChange | None:
        learner = group.learners[0] if move is None else move.learner
        if learner not in group.learners:
            return None
        if self.is_dead(learner, now_ms) or learner in self.draining:
            self._moves.pop(group.group_id, None)
            why = "is dead" if self.is_dead(learner, now_ms) else "is being drained"
            return self._change(group, ChangeKind.REMOVE, learner,
                                reason=f"learner on node {learner} {why}")
        if move is None:  # a new meta leader found the learner: pick the voter to go
            if group.group_id not in self.replicas_target:
                # Whether the learner grows the group or replaces a voter depends on
                # the table's replica count: wait for the first record sync (a 1-voter
                # group's only voter was picked to go, forever; seed 207215719920).
                return None
            victim = self._victim(group, now_ms)
            reason = (f"replica moves from node {victim} to {learner}" if victim
                      else f"learner on node {learner} adds a replica")
            move = _Move(learner, victim, reason, now_ms)
            self._moves[group.group_id] = move
        elif move.victim and not self._gone(group, move.victim, now_ms):
            # A voter died while a move (a balance) was under way: the learner replaces
            # the dead voter instead. Promoting it in place of a live voter would leave the
            # group with a dead voter and one live voter fewer (found by the simulator).
            dead = [v for v in group.voters if self._gone(group, v, now_ms)]
            if dead:
                move = _Move(learner, dead[0], f"replace replica on node {dead[0]}, dead or "
                             "lost with its data", move.since_ms)
                self._moves[group.group_id] = move
        leader_applied = group.applied.get(group.leader, 0)
        # A learner that has not reported yet (its node opens the replica once the
        # record names it) is not caught up, however short the leader's log is: while
        # the leader's applied index was below catchup_entries_max, -1 passed for caught
        # up, and an unopened replica was promoted; the group then waited in a joint
        # configuration for a voter that never came (found by the table simulator).
        learner_applied = group.applied.get(learner)
        if (learner_applied is None
                or learner_applied < leader_applied - self.config.catchup_entries_max):
            if now_ms - move.since_ms < self.config.change_timeout_ms:
                return None  # still catching up
            # It never caught up (a learner whose data vanished - a replica dropped on a
            # lagging record - can never: the leader does not probe below what it once
            # matched). Remove it; the policies add a fresh one.
            self._moves.pop(group.group_id, None)
            return self._change(group, ChangeKind.REMOVE, learner,
                                reason=f"learner on node {learner} did not catch up")
        if move.victim == group.leader:
            others = sorted((v for v in group.voters
                             if v != move.victim and not self._gone(group, v, now_ms)),
                            key=lambda v: v in self.draining)
            if not others:
                return None
            return self._change(group, ChangeKind.TRANSFER_LEADER, others[0],
                                reason=f"leader node {move.victim} is leaving the group")
        if move.victim not in group.voters:
            return self._change(group, ChangeKind.PROMOTE, learner, reason=move.reason)
        return self._change(group, ChangeKind.PROMOTE, learner, move.victim, move.reason)

    def _victim(self, group: GroupView, now_ms: int) -> int:
        """The voter a found learner replaces (0: none, the group is short or has one
        voter, which cannot hand its leadership to anyone)."""
        if (len(group.voters) < self.replicas_target.get(group.group_id, len(group.voters))
                or len(group.voters) < 2):
            return 0
        dead = [v for v in group.voters if self._gone(group, v, now_ms)]
        if dead:
            return dead[0]
        drained = [v for v in group.voters if v in self.draining]
        if drained:
            return drained[0]
        counts = self._replica_counts(now_ms)
        return max(group.voters, key=lambda v: (counts.get(v, 0), v != group.leader, v))

    def _add_learner(self, group: GroupView, victim: int, now_ms: int,
                     reason: str, *, only: set[int] | None = None) -> ScheduledChange | None:
        keep = [v for v in group.voters if v != victim]
        candidates = [NodeCandidate(n.node_id, n.zone) for n in self.live_nodes(now_ms)
                      if n.node_id != victim and (only is None or n.node_id in only
                                                  or n.node_id in keep)
                      and (n.node_id not in self.draining or n.node_id in keep)]
        for n in keep:  # members that stay count for zones even when not live
            if n not in {c.node_id for c in candidates} and n in self.nodes:
                candidates.append(NodeCandidate(n, self.nodes[n].zone, alive=False))
        load = ClusterLoad.of(g.voters + g.learners for g in self.groups.values())
        try:
            chosen = place_replicas(candidates, len(keep) + 1, load, keep=keep,
                                    rng=random.Random(self._seed ^ group.group_id))
        except NotEnoughTableNodesError:
            return None  # nowhere to go now; the next round looks again
        target = chosen[-1]
        invariant(target not in group.voters, f"placement chose member {target}")
        self._moves[group.group_id] = _Move(target, victim, reason, now_ms)
        return self._change(group, ChangeKind.ADD_LEARNER, target, reason=reason)

    def _change(self, group: GroupView, kind: ChangeKind, node: int, remove: int = 0,
                reason: str = "") -> ScheduledChange:
        return ScheduledChange(group_id=group.group_id, epoch=group.epoch, kind=kind,
                               node_id=node, remove_node_id=remove, reason=reason)

    def _replica_counts(self, now_ms: int) -> dict[int, int]:
        counts = {n.node_id: 0 for n in self.placeable_nodes(now_ms)}
        for g in self.groups.values():
            for node in g.voters + g.learners:
                if node in counts:
                    counts[node] += 1
        return counts

    def _balance_replicas(self, now_ms: int) -> ScheduledChange | None:
        counts = self._replica_counts(now_ms)
        if len(counts) < 2 or any(self._dead_voters(now_ms)):
            return None
        low = min(counts, key=lambda n: (counts[n], n))
        high = max(counts, key=lambda n: (counts[n], -n))
        if counts[high] - counts[low] <= self.config.replica_imbalance_max:
            return None
        # The smallest group first: a move copies the group's data to the new node.
        for gid in sorted(self.groups, key=lambda g: (self.groups[g].size_bytes, g)):
            group = self.groups[gid]
            # A 1-voter group cannot move: its leader, the voter to go, has nobody
            # to hand leadership to.
            if (high in group.voters and low not in group.voters and not group.learners
                    and len(group.voters) >= 2
                    and group.leader and not self.is_dead(group.leader, now_ms)
                    and not any(self._gone(group, v, now_ms) for v in group.voters)
                    and not group.change_in_progress
                    and self._keeps_zones(group.voters, high, low)):
                change = self._add_learner(group, high, now_ms,
                                           f"balance replicas: node {high} to node {low}",
                                           only={low})
                if change is not None and change.node_id == low:
                    return change
                self._moves.pop(gid, None)
        return None

    def _zone(self, node: int) -> str:
        view = self.nodes.get(node)
        return view.zone if view is not None else f"unknown-{node}"

    def _balance_zones(self, now_ms: int) -> ScheduledChange | None:
        """Move a replica of a group whose voters share a zone while a zone it lacks
        has a live node (a replacement made while a zone was down had to double up
        in another; nothing spread it again once the zone came back)."""
        live = self.placeable_nodes(now_ms)
        live_zones = {n.zone for n in live}
        counts = self._replica_counts(now_ms)
        for gid in sorted(self.groups):
            group = self.groups[gid]
            if (group.learners or not group.leader or group.change_in_progress
                    or len(group.voters) < 2
                    or any(self._gone(group, v, now_ms) for v in group.voters)):
                continue
            zones = [self._zone(v) for v in group.voters]
            if len(set(zones)) >= min(len(zones), len(live_zones)):
                continue
            lacking = {n.node_id for n in live if n.zone not in zones}
            crowded = [v for v in group.voters if zones.count(self._zone(v)) > 1]
            victim = max(crowded, key=lambda v: (v != group.leader, counts.get(v, 0), v))
            change = self._add_learner(group, victim, now_ms,
                                       f"spread zones: replica moves off node {victim}",
                                       only=lacking)
            if change is not None and change.node_id in lacking:
                return change
            self._moves.pop(gid, None)
        return None

    def _keeps_zones(self, voters: tuple[int, ...], leaving: int, coming: int) -> bool:
        """Whether moving a replica from ``leaving`` to ``coming`` keeps the group over
        as many zones (a balance move never trades zone spread for load)."""
        def zones(members: Iterable[int]) -> int:
            return len({self.nodes[n].zone if n in self.nodes else f"?{n}" for n in members})
        after = [v for v in voters if v != leaving] + [coming]
        return zones(after) >= zones(voters)

    def _dead_voters(self, now_ms: int) -> list[int]:
        return [v for g in self.groups.values() for v in g.voters if self.is_dead(v, now_ms)]

    def _balance_leaders(self, now_ms: int) -> ScheduledChange | None:
        live = {n.node_id for n in self.placeable_nodes(now_ms)}
        led = {n: 0 for n in live}
        for g in self.groups.values():
            if g.leader in led:
                led[g.leader] += 1
        if len(led) < 2:
            return None
        high = max(led, key=lambda n: (led[n], -n))
        for low in sorted(led, key=lambda n: (led[n], n)):
            if led[high] - led[low] <= self.config.leader_imbalance_max:
                return None
            for gid in sorted(self.groups):
                group = self.groups[gid]
                if (group.leader == high and low in group.voters
                        and not group.change_in_progress
                        and gid not in self.lost.get(low, ())):
                    return self._change(group, ChangeKind.TRANSFER_LEADER, low,
                                        reason=f"balance leaders: node {high} to node {low}")
        return None
