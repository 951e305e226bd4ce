"""Membership changes as pure functions ConfState -> ConfState (etcd confchange).

* ``simple``: at most one voter changes; C_old -> C_new directly is safe
  because any majority of C_old and any majority of C_new overlap.
* ``enter_joint``: C_old -> C_old,new: the outgoing voters are the old ones,
  the incoming voters the new ones; decisions need a majority of both.
* ``leave_joint``: C_old,new -> C_new; staged learners (``learners_next``:
  voters being demoted, still needed in the outgoing half) become learners.

Every function validates its result and raises :class:`ConfChangeError`
(a UsageError) instead of producing an illegal configuration.
"""

from __future__ import annotations

from quorumlog.errors import UsageError
from quorumlog.raft._types import ConfChange, ConfChangeSingle, ConfChangeType, ConfState


class ConfChangeError(UsageError):
    """A membership change that cannot be applied to the current configuration."""


class _Sets:
    __slots__ = ("incoming", "learners", "learners_next", "outgoing")

    def __init__(self, cs: ConfState) -> None:
        self.incoming = set(cs.voters)
        self.outgoing = set(cs.voters_outgoing)
        self.learners = set(cs.learners)
        self.learners_next = set(cs.learners_next)

    def freeze(self, *, auto_leave: bool) -> ConfState:
        return ConfState(
            voters=frozenset(self.incoming),
            voters_outgoing=frozenset(self.outgoing),
            learners=frozenset(self.learners),
            learners_next=frozenset(self.learners_next),
            auto_leave=auto_leave,
        )

    def make_voter(self, node_id: int) -> None:
        self.incoming.add(node_id)
        self.learners.discard(node_id)
        self.learners_next.discard(node_id)

    def make_learner(self, node_id: int) -> None:
        if node_id in self.learners:
            return
        self.remove(node_id)
        # A voter of the outgoing half cannot become a learner before the joint
        # configuration is left: stage it (etcd's LearnersNext).
        if node_id in self.outgoing:
            self.learners_next.add(node_id)
        else:
            self.learners.add(node_id)

    def remove(self, node_id: int) -> None:
        self.incoming.discard(node_id)
        self.learners.discard(node_id)
        self.learners_next.discard(node_id)

    def apply(self, changes: tuple[ConfChangeSingle, ...]) -> None:
        for change in changes:
            if change.node_id < 1:
                raise ConfChangeError(f"node id must be >= 1, got {change.node_id}")
            if change.type == ConfChangeType.ADD_NODE:
                self.make_voter(change.node_id)
            elif change.type == ConfChangeType.ADD_LEARNER:
                self.make_learner(change.node_id)
            else:
                self.remove(change.node_id)
        if not self.incoming:
            raise ConfChangeError("the change removes every voter; keep at least one")


def _check(cs: ConfState) -> ConfState:
    voters = cs.voters | cs.voters_outgoing
    if cs.learners & voters:
        raise ConfChangeError(f"nodes {sorted(cs.learners & voters)} are both voters and learners")
    if not cs.learners_next <= cs.voters_outgoing:
        raise ConfChangeError("staged learners must be outgoing voters")
    if not cs.is_joint and (cs.learners_next or cs.auto_leave):
        raise ConfChangeError("learners_next and auto_leave only exist in a joint configuration")
    return cs


def simple(cs: ConfState, changes: tuple[ConfChangeSingle, ...]) -> ConfState:
    """Apply ``changes`` directly; at most one voter may change."""
    if cs.is_joint:
        raise ConfChangeError("cannot apply a simple change in a joint configuration")
    sets = _Sets(cs)
    sets.apply(changes)
    changed = len(cs.voters.symmetric_difference(sets.incoming))
    if changed > 1:
        raise ConfChangeError(
            f"{changed} voters change at once; use a joint change (transition 'auto' does)"
        )
    return _check(sets.freeze(auto_leave=False))


def enter_joint(
    cs: ConfState, changes: tuple[ConfChangeSingle, ...], *, auto_leave: bool
) -> ConfState:
    """C_old -> C_old,new."""
    if cs.is_joint:
        raise ConfChangeError("the configuration is already joint; leave it first")
    if not cs.voters:
        raise ConfChangeError("cannot make a configuration without voters joint")
    sets = _Sets(cs)
    sets.outgoing = set(cs.voters)
    sets.apply(changes)
    return _check(sets.freeze(auto_leave=auto_leave))


def leave_joint(cs: ConfState) -> ConfState:
    """C_old,new -> C_new."""
    if not cs.is_joint:
        raise ConfChangeError("the configuration is not joint; nothing to leave")
    return _check(
        ConfState(
            voters=cs.voters,
            learners=cs.learners | cs.learners_next,
        )
    )


def _alters_at_most_one_voter(cs: ConfState, changes: tuple[ConfChangeSingle, ...]) -> bool:
    sets = _Sets(cs)
    try:
        sets.apply(changes)
    except ConfChangeError:
        return True  # let ``simple`` report the error
    return len(cs.voters.symmetric_difference(sets.incoming)) <= 1


def apply_conf_change(cs: ConfState, change: ConfChange) -> ConfState:
    """The configuration after ``change`` (see ConfChangeTransition)."""
    if change.leaves_joint:
        return leave_joint(cs)
    if not change.changes:
        raise ConfChangeError(f"an empty change with transition {change.transition!r} does nothing")
    if (
        change.transition == "auto"
        and not cs.is_joint
        and _alters_at_most_one_voter(cs, change.changes)
    ):
        return simple(cs, change.changes)
    auto_leave = change.transition in ("auto", "joint_implicit")
    return enter_joint(cs, change.changes, auto_leave=auto_leave)
