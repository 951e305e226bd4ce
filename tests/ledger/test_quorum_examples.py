"""The worked examples of the protocol article, checked against the pure code."""

from __future__ import annotations

import itertools

import pytest

from quorumlog.errors import DeadlineExceededError
from quorumlog.ledger import ReadAnswer, RecoveryRead, RecoveryVerdict, Schedule, answer_of
from quorumlog.proto import LedgerFencedError, NoSuchEntryError, NoSuchLedgerError
from quorumlog.rpc import ConnectFailedError, ConnectionClosedError


@pytest.mark.parametrize(("qw", "qa", "qf"), [(5, 3, 3), (3, 2, 2), (3, 3, 1)])
def test_fence_quorum_examples(qw: int, qa: int, qf: int) -> None:
    """Qf = Qw - Qa + 1: Qw=5,Qa=3 -> 3; Qw=3,Qa=2 -> 2; Qw=3,Qa=3 -> 1."""
    assert Schedule(qw, qw, qa).fence_quorum == qf
    assert Schedule(qw + 2, qw, qa).fence_quorum == qf  # E does not matter


def test_coverage_example_e3_qw2_qa2() -> None:
    """E=3, Qw=Qa=2, Qf=1: write sets {0,1} {1,2} {2,0}; one fenced bookie never
    covers all three, any two do."""
    s = Schedule(3, 2, 2)
    assert [s.write_set(i) for i in range(3)] == [(0, 1), (1, 2), (2, 0)]
    for single in range(3):
        cov = s.coverage_set()
        assert not cov.add(single)
    for pair in itertools.combinations(range(3), 2):
        cov = s.coverage_set()
        cov.add(pair[0])
        assert cov.add(pair[1]), pair


def test_recovery_read_examples_qw3_qa2() -> None:
    """The article's three cases for Qw=3, Qa=2 (Qf=2)."""
    s = Schedule(3, 3, 2)
    found = RecoveryRead(s, 0)
    found.record(0, ReadAnswer.NO_SUCH_ENTRY)
    assert found.record(2, ReadAnswer.FOUND) is RecoveryVerdict.RECOVERABLE
    end = RecoveryRead(s, 0)
    end.record(0, ReadAnswer.NO_SUCH_ENTRY)
    end.record(2, ReadAnswer.UNKNOWN)
    assert end.record(1, ReadAnswer.NO_SUCH_ENTRY) is RecoveryVerdict.END_OF_LEDGER
    stuck = RecoveryRead(s, 0)
    stuck.record(0, ReadAnswer.NO_SUCH_ENTRY)
    stuck.record(1, ReadAnswer.UNKNOWN)
    assert stuck.record(2, ReadAnswer.UNKNOWN) is RecoveryVerdict.UNDECIDABLE


def test_only_explicit_answers_count_as_no_such_entry() -> None:
    assert answer_of(None) is ReadAnswer.FOUND
    assert answer_of(NoSuchEntryError("x")) is ReadAnswer.NO_SUCH_ENTRY
    assert answer_of(NoSuchLedgerError("x")) is ReadAnswer.NO_SUCH_ENTRY
    for unknown in (DeadlineExceededError("t"), ConnectionClosedError("c"),
                    ConnectFailedError("f"), LedgerFencedError("f"), RuntimeError("?")):
        assert answer_of(unknown) is ReadAnswer.UNKNOWN, unknown
