"""The core's log: unstable tail over storage, conflicts, commit rules."""

from __future__ import annotations

import pytest

from quorumlog.errors import InvariantViolation
from quorumlog.raft import CompactedError, ConfState, Entry, MemoryStorage, UnavailableError
from quorumlog.raft._log import RaftLog, Unstable
from quorumlog.raft._size import ENTRY_OVERHEAD_BYTES, limit_size

BIG = 1 << 40


def ents(*term_index: tuple[int, int]) -> list[Entry]:
    return [Entry(t, i) for t, i in term_index]


def storage_with(*term_index: tuple[int, int]) -> MemoryStorage:
    storage = MemoryStorage(ConfState(voters=frozenset({1})))  # snapshot at 1/1
    storage.append(ents(*term_index))
    return storage


def test_unstable_truncate_and_append() -> None:
    u = Unstable(5)
    u.truncate_and_append(ents((1, 5), (1, 6)))
    assert [e.index for e in u.entries] == [5, 6]
    u.truncate_and_append(ents((1, 7)))  # directly after
    u.truncate_and_append(ents((2, 6), (2, 7)))  # replaces a suffix
    assert [(e.term, e.index) for e in u.entries] == [(1, 5), (2, 6), (2, 7)]
    u.truncate_and_append(ents((3, 4)))  # before the unstable start: replaces all
    assert u.offset == 4 and [(e.term, e.index) for e in u.entries] == [(3, 4)]


def test_unstable_stable_to_ignores_replaced_entries() -> None:
    u = Unstable(5)
    u.truncate_and_append(ents((1, 5), (1, 6), (1, 7)))
    u.stable_to(6, 2)  # wrong term: those were replaced meanwhile
    assert u.offset == 5
    u.stable_to(6, 1)
    assert u.offset == 7 and [e.index for e in u.entries] == [7]
    assert u.maybe_term(7) == 1 and u.maybe_term(6) is None and u.maybe_term(8) is None


def test_log_reads_across_storage_and_unstable() -> None:
    log = RaftLog(storage_with((1, 2), (1, 3)))
    log.append(ents((2, 4), (2, 5)))
    assert (log.first_index(), log.last_index(), log.last_term()) == (2, 5, 2)
    assert [e.index for e in log.slice(2, 6, BIG)] == [2, 3, 4, 5]
    assert [e.index for e in log.slice(3, 5, BIG)] == [3, 4]
    assert log.term(1) == 1 and log.term(4) == 2
    with pytest.raises(CompactedError):
        log.term(0)
    with pytest.raises(UnavailableError):
        log.term(6)
    with pytest.raises(CompactedError):
        log.slice(1, 3, BIG)
    assert log.term_or_zero(9) == 0


def test_slice_byte_cap_keeps_at_least_one_entry() -> None:
    log = RaftLog(storage_with())
    log.append([Entry(1, i, data=b"x" * 100) for i in range(2, 7)])
    per_entry = 100 + ENTRY_OVERHEAD_BYTES
    assert len(log.slice(2, 7, 2 * per_entry)) == 2
    assert len(log.slice(2, 7, 1)) == 1
    assert len(log.slice(2, 7, BIG)) == 5
    assert limit_size([], 0) == []


def test_find_conflict() -> None:
    log = RaftLog(storage_with((1, 2), (2, 3), (3, 4)))
    assert log.find_conflict(tuple(ents((1, 2), (2, 3)))) == 0
    assert log.find_conflict(tuple(ents((2, 3), (3, 4), (3, 5)))) == 5  # new entries
    assert log.find_conflict(tuple(ents((2, 3), (4, 4)))) == 4
    assert log.find_conflict(tuple(ents((9, 2)))) == 2
    assert log.find_conflict(tuple(ents((3, 6)))) == 6


@pytest.mark.parametrize(
    ("index", "term", "expected"),
    [
        (6, 5, (6, 5)),  # matches at once
        (6, 4, (4, 3)),  # skips every term-5 entry
        (6, 3, (4, 3)),
        (6, 2, (3, 2)),
        (6, 1, (2, 1)),
        (6, 0, (0, 0)),  # nothing has a term <= 0: back to the start
        (3, 9, (3, 2)),
    ],
)
def test_find_conflict_by_term(index: int, term: int, expected: tuple[int, int]) -> None:
    log = RaftLog(storage_with((1, 2), (2, 3), (3, 4), (5, 5), (5, 6)))
    assert log.find_conflict_by_term(index, term) == expected


def test_maybe_append() -> None:
    log = RaftLog(storage_with((1, 2), (1, 3)))
    log.commit_to(3)
    assert log.maybe_append(3, 2, 3, tuple(ents((2, 4)))) is None  # term mismatch at 3
    assert log.maybe_append(9, 1, 3, ()) is None  # we do not have index 9
    assert log.maybe_append(3, 1, 10, tuple(ents((2, 4), (2, 5)))) == 5
    assert log.committed == 5  # min(leader commit, last new)
    assert log.maybe_append(3, 1, 5, tuple(ents((2, 4)))) == 4  # already have it: no change
    assert log.last_index() == 5
    with pytest.raises(InvariantViolation):
        log.maybe_append(2, 1, 5, tuple(ents((3, 3))))  # would rewrite a committed entry


def test_conflicting_suffix_is_replaced() -> None:
    log = RaftLog(storage_with((1, 2)))
    log.append(ents((1, 3), (1, 4), (1, 5)))
    assert log.maybe_append(3, 1, 3, tuple(ents((2, 4)))) == 4
    assert [(e.term, e.index) for e in log.slice(2, log.last_index() + 1, BIG)] == [
        (1, 2), (1, 3), (2, 4)
    ]


def test_commit_only_counts_current_term() -> None:
    log = RaftLog(storage_with((1, 2), (2, 3)))
    assert not log.maybe_commit(3, 3)  # an older-term entry is not committed by counting
    assert log.maybe_commit(3, 2)
    assert not log.maybe_commit(2, 1)  # never backwards
    with pytest.raises(InvariantViolation):
        log.commit_to(9)


def test_next_committed_entries_and_applied() -> None:
    log = RaftLog(storage_with((1, 2), (1, 3), (1, 4)))
    assert log.applied == 1 and not log.has_next_committed_entries()
    log.commit_to(3)
    assert [e.index for e in log.next_committed_entries(BIG)] == [2, 3]
    log.applied_to(3)
    assert not log.has_next_committed_entries()
    with pytest.raises(InvariantViolation):
        log.applied_to(4)  # past commit
