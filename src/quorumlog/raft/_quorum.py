"""Quorum math: majority and joint (C_old,new) configurations, as etcd's quorum.

A majority configuration is a set of voter ids. Its committed index is the
largest index acknowledged by a majority (sort the match indexes, take the
one a majority reaches); its vote result counts grants and rejects. A joint
configuration is two majorities that must both agree: the committed index is
the smaller of the two, a vote is won only when both are won. An empty
majority agrees with everything (commits any index, wins any vote), so a joint
configuration with an empty outgoing half behaves like its incoming half.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from enum import IntEnum

INDEX_MAX = sys.maxsize
"""The committed index of an empty majority: it constrains nothing."""


class VoteResult(IntEnum):
    PENDING = 0
    LOST = 1
    WON = 2


def majority_committed_index(voters: frozenset[int], match: Callable[[int], int]) -> int:
    """Largest index acked by a majority of ``voters`` (INDEX_MAX if empty)."""
    count = len(voters)
    if count == 0:
        return INDEX_MAX
    indexes = sorted([match(voter) for voter in voters])
    # With n voters a majority is n // 2 + 1; sorted ascending, the entry at
    # position n - (n // 2 + 1) is reached by exactly that many voters.
    return indexes[count - (count // 2 + 1)]


def majority_vote_result(voters: frozenset[int], votes: Mapping[int, bool]) -> VoteResult:
    """WON with a majority of grants, LOST once a majority is impossible."""
    if not voters:
        return VoteResult.WON
    granted = 0
    missing = 0
    for voter in voters:
        vote = votes.get(voter)
        if vote is None:
            missing += 1
        elif vote:
            granted += 1
    quorum = len(voters) // 2 + 1
    if granted >= quorum:
        return VoteResult.WON
    if granted + missing >= quorum:
        return VoteResult.PENDING
    return VoteResult.LOST


class JointConfig:
    """Incoming and outgoing voter sets; outgoing empty when not joint."""

    __slots__ = ("incoming", "outgoing")

    def __init__(self, incoming: frozenset[int], outgoing: frozenset[int] = frozenset()) -> None:
        self.incoming = incoming
        self.outgoing = outgoing

    @property
    def is_joint(self) -> bool:
        return bool(self.outgoing)

    def ids(self) -> frozenset[int]:
        return self.incoming | self.outgoing

    def committed_index(self, match: Callable[[int], int]) -> int:
        incoming = majority_committed_index(self.incoming, match)
        if not self.outgoing:
            return incoming
        return min(incoming, majority_committed_index(self.outgoing, match))

    def vote_result(self, votes: Mapping[int, bool]) -> VoteResult:
        first = majority_vote_result(self.incoming, votes)
        second = majority_vote_result(self.outgoing, votes)
        if first == second:
            return first
        if VoteResult.LOST in (first, second):
            return VoteResult.LOST
        return VoteResult.PENDING

    def __repr__(self) -> str:
        inc = sorted(self.incoming)
        return f"JointConfig({inc}&&{sorted(self.outgoing)})" if self.outgoing else f"{inc}"
