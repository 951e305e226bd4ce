"""Quorum math (majority and joint) and per-follower progress / inflights."""

from __future__ import annotations

import pytest

from quorumlog.errors import InvariantViolation
from quorumlog.raft._progress import Inflights, Progress, ProgressState
from quorumlog.raft._quorum import (
    INDEX_MAX,
    JointConfig,
    VoteResult,
    majority_committed_index,
    majority_vote_result,
)

WON, LOST, PENDING = VoteResult.WON, VoteResult.LOST, VoteResult.PENDING


@pytest.mark.parametrize(
    ("matches", "expected"),
    [
        ({}, INDEX_MAX),
        ({1: 5}, 5),
        ({1: 5, 2: 3}, 3),
        ({1: 5, 2: 3, 3: 4}, 4),
        ({1: 5, 2: 3, 3: 4, 4: 9}, 4),
        ({1: 1, 2: 2, 3: 3, 4: 4, 5: 5}, 3),
        ({1: 7, 2: 7, 3: 0, 4: 0, 5: 7}, 7),
    ],
)
def test_majority_committed_index(matches: dict[int, int], expected: int) -> None:
    assert majority_committed_index(frozenset(matches), matches.__getitem__) == expected


def test_majority_committed_index_matches_brute_force() -> None:
    import itertools

    for n in range(1, 6):
        for values in itertools.product(range(4), repeat=n):
            matches = dict(enumerate(values, start=1))
            quorum = n // 2 + 1
            best = max(i for i in range(5) if sum(v >= i for v in values) >= quorum)
            assert majority_committed_index(frozenset(matches), matches.__getitem__) == best


@pytest.mark.parametrize(
    ("voters", "votes", "expected"),
    [
        ((), {}, WON),
        ((1,), {}, PENDING),
        ((1,), {1: True}, WON),
        ((1,), {1: False}, LOST),
        ((1, 2, 3), {1: True}, PENDING),
        ((1, 2, 3), {1: True, 2: True}, WON),
        ((1, 2, 3), {1: False, 2: False}, LOST),
        ((1, 2, 3), {1: True, 2: False}, PENDING),
        ((1, 2, 3, 4), {1: True, 2: True}, PENDING),
        ((1, 2, 3, 4), {1: True, 2: False, 3: False}, LOST),
        ((1, 2, 3), {1: True, 2: True, 9: False}, WON),  # non-voters do not count
    ],
)
def test_majority_vote_result(
    voters: tuple[int, ...], votes: dict[int, bool], expected: VoteResult
) -> None:
    assert majority_vote_result(frozenset(voters), votes) == expected


def test_joint_commit_is_the_minimum_of_both_halves() -> None:
    matches = {1: 10, 2: 10, 3: 2, 4: 2, 5: 2}
    joint = JointConfig(frozenset({1, 2, 3}), frozenset({3, 4, 5}))
    assert joint.committed_index(matches.__getitem__) == 2
    matches[4] = matches[5] = 8
    assert joint.committed_index(matches.__getitem__) == 8
    assert JointConfig(frozenset({1, 2, 3})).committed_index(matches.__getitem__) == 10


def test_joint_vote_needs_both_majorities() -> None:
    joint = JointConfig(frozenset({1, 2, 3}), frozenset({3, 4, 5}))
    assert joint.vote_result({1: True, 2: True}) == PENDING
    assert joint.vote_result({1: True, 2: True, 4: True, 5: True}) == WON
    assert joint.vote_result({1: True, 2: True, 4: False, 5: False}) == LOST
    assert joint.vote_result({1: False, 2: False, 4: True, 5: True}) == LOST
    assert joint.vote_result({3: True, 1: True, 4: True}) == WON
    assert joint.is_joint and joint.ids() == {1, 2, 3, 4, 5}


def test_inflights_count_and_bytes() -> None:
    inflights = Inflights(max_messages=3, max_bytes=100)
    inflights.add(5, 10)
    inflights.add(7, 10)
    assert not inflights.full()
    inflights.add(9, 10)
    assert inflights.full() and inflights.count() == 3
    inflights.free_le(6)
    assert inflights.count() == 2 and inflights.size_bytes() == 20
    inflights.free_le(100)
    assert inflights.count() == 0 and inflights.size_bytes() == 0
    inflights.add(10, 150)
    assert inflights.full()  # by bytes
    with pytest.raises(InvariantViolation):
        inflights.add(11, 1)
    inflights.reset()
    with pytest.raises(InvariantViolation):
        inflights.add(10, 1)
        inflights.add(10, 1)  # indexes must grow


def new_progress(next_index: int = 10) -> Progress:
    return Progress(next_index, Inflights(2, 1 << 20), is_learner=False)


def test_probe_sends_one_message_then_pauses() -> None:
    pr = new_progress()
    assert not pr.is_paused()
    pr.sent_entries(3, 0)
    assert pr.is_paused() and pr.next == 10  # probe does not move next
    assert pr.maybe_update(12)
    assert not pr.is_paused() and pr.match == 12 and pr.next == 13


def test_replicate_pipelines_up_to_the_inflight_cap() -> None:
    pr = new_progress()
    pr.maybe_update(9)
    pr.become_replicate()
    assert pr.next == 10
    pr.sent_entries(5, 500)
    pr.sent_entries(5, 500)
    assert pr.next == 20 and pr.is_paused()
    pr.maybe_update(14)
    pr.inflights.free_le(14)
    assert not pr.is_paused()


def test_maybe_decr_to() -> None:
    pr = new_progress(10)
    assert not pr.maybe_decr_to(5, 0)  # stale: not the probe we sent (next-1 = 9)
    assert pr.maybe_decr_to(9, 3)
    assert pr.next == 4
    pr.maybe_update(4)
    pr.become_replicate()
    pr.sent_entries(3, 10)
    assert not pr.maybe_decr_to(4, 0)  # at or below match: stale
    assert pr.maybe_decr_to(6, 0)
    assert pr.next == 5  # back to match + 1


def test_snapshot_state() -> None:
    pr = new_progress()
    pr.become_snapshot(50)
    assert pr.is_paused() and pr.pending_snapshot == 50 and pr.state == ProgressState.SNAPSHOT
    with pytest.raises(InvariantViolation):
        pr.sent_entries(1, 1)
    pr.become_probe()
    assert pr.next == 51 and pr.pending_snapshot == 0
