"""Quorum math of the ledger protocol, checked exhaustively on small ensembles."""

from __future__ import annotations

import gc
import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quorumlog.errors import InvariantViolation, UsageError
from quorumlog.ledger import (
    AckSet,
    LacTracker,
    ReadAnswer,
    RecoveryRead,
    RecoveryVerdict,
    Schedule,
)

SHAPES = [
    (e, w, a)
    for e in range(1, 7)
    for w in range(1, e + 1)
    for a in range(1, w + 1)
]


def test_schedule_rejects_bad_shapes() -> None:
    for bad in [(2, 3, 1), (3, 2, 3), (3, 3, 0), (0, 0, 0)]:
        with pytest.raises(UsageError, match="ensemble >= write_quorum >= ack_quorum"):
            Schedule(*bad)


def test_striping_5_3_2_matches_the_article() -> None:
    s = Schedule(5, 3, 2)
    assert s.write_set(0) == (0, 1, 2)
    assert s.write_set(1) == (1, 2, 3)
    assert s.write_set(4) == (4, 0, 1)
    assert s.fence_quorum == 2
    assert [s.stores(4, b) for b in range(5)] == [True, True, False, False, True]


@pytest.mark.parametrize(("e", "w", "a"), SHAPES)
def test_coverage_means_no_writer_can_reach_ack_quorum(e: int, w: int, a: int) -> None:
    """For every set of fenced bookies: covered <=> no write set keeps Qa unfenced."""
    s = Schedule(e, w, a)
    for size in range(e + 1):
        for fenced in itertools.combinations(range(e), size):
            cov = s.coverage_set()
            for b in fenced:
                cov.add(b)
            writer_can_ack = any(
                sum(1 for m in s.write_set(entry) if m not in fenced) >= a for entry in range(e)
            )
            assert cov.covered == (not writer_can_ack), (s, fenced)


def test_ack_set_complete_and_fail() -> None:
    acks = AckSet(2)
    assert not acks.complete_and_check(0)
    assert not acks.fail_and_check(1)
    assert acks.complete_and_check(2)
    assert acks.fail_and_check(0) is False  # 0's ack withdrawn: replica replaced
    assert acks.acked == frozenset({2})
    assert acks.complete_and_check(1)


def test_ack_set_holds_nothing_the_garbage_collector_tracks() -> None:
    """The write handle makes one AckSet per entry in flight: its acked and
    failed bookies are bit masks, not two sets more for the collector."""
    acks = AckSet(2)
    acks.complete_and_check(1)
    acks.fail_and_check(3)
    assert not [r for r in gc.get_referents(acks) if gc.is_tracked(r) and r is not AckSet]
    assert (acks.acked, acks.failed) == (frozenset({1}), frozenset({3}))
    acks.remove(3)
    assert acks.failed == frozenset()


def test_lac_advances_in_order_only() -> None:
    lac = LacTracker()
    assert lac.confirm(1) == []
    assert lac.confirm(2) == []
    assert lac.lac == -1
    assert lac.confirm(0) == [0, 1, 2]
    assert lac.confirm(1) == []
    assert lac.lac == 2


def test_recovery_read_rules() -> None:
    s = Schedule(3, 3, 2)  # Qf = 2
    r = RecoveryRead(s, 7)
    assert r.record(0, ReadAnswer.UNKNOWN) is RecoveryVerdict.PENDING
    assert r.record(1, ReadAnswer.NO_SUCH_ENTRY) is RecoveryVerdict.PENDING
    # Unknown never counts as missing: all answered, nothing decided.
    assert r.record(2, ReadAnswer.UNKNOWN) is RecoveryVerdict.UNDECIDABLE
    r2 = RecoveryRead(s, 7)
    r2.record(0, ReadAnswer.NO_SUCH_ENTRY)
    assert r2.record(1, ReadAnswer.NO_SUCH_ENTRY) is RecoveryVerdict.END_OF_LEDGER
    r3 = RecoveryRead(s, 7)
    r3.record(0, ReadAnswer.NO_SUCH_ENTRY)
    assert r3.record(2, ReadAnswer.FOUND) is RecoveryVerdict.RECOVERABLE
    assert r3.unasked() == [1]
    with pytest.raises(InvariantViolation):
        RecoveryRead(Schedule(5, 2, 2), 0).record(3, ReadAnswer.FOUND)


def _recover(s: Schedule, stored: list[set[int]], up: set[int], start_lac: int) -> int | None:
    """Recovery forward scan with the pure rules; None = undecidable (retry later)."""
    lac = start_lac
    while True:
        entry = lac + 1
        read = RecoveryRead(s, entry)
        verdict = RecoveryVerdict.PENDING
        for b in s.write_set(entry):
            if b not in up:
                answer = ReadAnswer.UNKNOWN
            elif entry in stored[b]:
                answer = ReadAnswer.FOUND
            else:
                answer = ReadAnswer.NO_SUCH_ENTRY
            verdict = read.record(b, answer)
            if verdict is not RecoveryVerdict.PENDING:
                break
        if verdict is RecoveryVerdict.RECOVERABLE:
            for b in s.write_set(entry):  # rewrite to the whole write set
                stored[b].add(entry)
            lac = entry
        elif verdict is RecoveryVerdict.END_OF_LEDGER:
            return lac
        else:
            return None


@settings(max_examples=400, deadline=None)
@given(
    shape=st.sampled_from(SHAPES),
    seed=st.integers(0, 2**32 - 1),
    entries=st.integers(0, 30),
)
def test_recovery_never_loses_an_acknowledged_entry(
    shape: tuple[int, int, int], seed: int, entries: int
) -> None:
    """A writer stores entries on random subsets of their write sets and crashes.

    Every entry it saw acknowledged (Qa replicas, all earlier ones acked) must be
    at or below the recovered LAC whichever fewer-than-Qa bookies are down
    during recovery, whenever recovery decides.
    """
    e, w, a = shape
    s = Schedule(e, w, a)
    rng = random.Random(seed)
    stored: list[set[int]] = [set() for _ in range(e)]
    acked_lac = -1
    for entry in range(entries):
        ws = s.write_set(entry)
        reached = [b for b in ws if rng.random() < 0.8]
        for b in reached:
            stored[b].add(entry)
        if len(reached) >= a and acked_lac == entry - 1:
            acked_lac = entry
    # Fewer than Qa bookies of the ensemble fail (the guarantee's premise).
    down = set(rng.sample(range(e), rng.randint(0, a - 1)))
    up = set(range(e)) - down
    bookie_lac = rng.randint(-1, max(-1, acked_lac - 1))  # LACs lag behind
    recovered = _recover(s, stored, up, bookie_lac)
    if recovered is None:
        return  # undecidable: recovery fails and is retried; nothing was closed
    assert recovered >= acked_lac
    for entry in range(recovered + 1):
        assert any(entry in stored[b] for b in up), entry
