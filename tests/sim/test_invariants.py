"""Each Raft invariant fires on a hand-made event stream that breaks it.

These tests prove the checks can fail; the seeded runs (test_raft_seeds.py)
prove the Raft core does not make them fail.
"""

from __future__ import annotations

import pytest

from quorumlog.raft import Entry, EntryType, HardState, Message, MessageType
from quorumlog.sim import RaftInvariants, SimInvariantViolation
from quorumlog.sim._invariants import DurableView


def _state(inv: RaftInvariants, node: int, **kw: int | bool) -> None:
    fields: dict[str, int | bool] = {
        "is_leader": False, "term": 1, "commit": 1, "commit_term": 0, "applied": 1, "epoch": 0,
    }
    fields.update(kw)
    inv.on_state(node, **fields)  # type: ignore[arg-type]


def _fires(name: str) -> pytest.RaisesContext[SimInvariantViolation]:
    return pytest.raises(SimInvariantViolation, match=f"^{name}:")


def _e(term: int, index: int, data: bytes = b"x") -> Entry:
    return Entry(term, index, EntryType.NORMAL, data)


def test_election_safety() -> None:
    inv = RaftInvariants()
    _state(inv, 1, is_leader=True, term=3)
    _state(inv, 1, is_leader=True, term=3)  # the same leader again is fine
    with _fires("election-safety"):
        _state(inv, 2, is_leader=True, term=3)


def test_log_matching_same_index_term_different_data_or_prefix() -> None:
    inv = RaftInvariants()
    inv.on_persist_entries(1, [_e(2, 5, b"a")], prev_term=1, replaced=[])
    inv.on_persist_entries(2, [_e(2, 5, b"a")], prev_term=1, replaced=[])
    with _fires("log-matching"):
        inv.on_persist_entries(3, [_e(2, 5, b"b")], prev_term=1, replaced=[])
    with _fires("log-matching"):
        inv.on_persist_entries(3, [_e(2, 5, b"a")], prev_term=2, replaced=[])


def test_committed_entry_lost_but_stale_appends_are_legal() -> None:
    inv = RaftInvariants()
    inv.on_apply(1, _e(2, 5, b"a"), digest=b"d5")
    # An old leader appends something else at index 5: legal, it cannot commit.
    inv.on_persist_entries(3, [_e(1, 5, b"z")], prev_term=1, replaced=[])
    with _fires("committed-entry-lost"):
        inv.on_persist_entries(2, [_e(3, 5, b"c")], prev_term=1, replaced=[_e(2, 5, b"a")])
    # Replacing an entry at or below the node's own commit index is also lost data.
    _state(inv, 4, commit=7, applied=1)
    with _fires("committed-entry-lost"):
        inv.on_persist_entries(4, [_e(3, 7)], prev_term=1, replaced=[_e(2, 7)])


def test_state_machine_safety() -> None:
    inv = RaftInvariants()
    inv.on_apply(1, _e(2, 5, b"a"), digest=b"d5")
    inv.on_apply(2, _e(2, 5, b"a"), digest=b"d5")
    with _fires("state-machine-safety"):
        inv.on_apply(3, _e(2, 5, b"b"), digest=b"d5")
    with _fires("state-machine-safety"):
        inv.on_apply(3, _e(2, 5, b"a"), digest=b"other")


def test_leader_completeness() -> None:
    inv = RaftInvariants()
    for index in (2, 3, 4):
        inv.on_apply(1, _e(2, index), digest=bytes([index]))
    log = {2: _e(2, 2), 3: _e(2, 3), 4: _e(2, 4), 5: _e(4, 5, b"")}
    inv.on_became_leader(2, snapshot_index=1, log=log)
    inv.on_became_leader(2, snapshot_index=3, log={4: _e(2, 4)})
    with _fires("leader-completeness"):
        inv.on_became_leader(3, snapshot_index=1, log={2: _e(2, 2), 3: _e(3, 3)})
    with _fires("leader-completeness"):
        inv.on_became_leader(3, snapshot_index=1, log={2: _e(2, 2)})


def test_monotonic_commit_applied_epoch_and_term() -> None:
    inv = RaftInvariants()
    _state(inv, 1, term=2, commit=5, applied=4, epoch=1)
    with _fires("commit-monotonic"):
        _state(inv, 1, term=2, commit=4, applied=4, epoch=1)
    with _fires("applied-monotonic"):
        _state(inv, 1, term=2, commit=5, applied=3, epoch=1)
    with _fires("applied-monotonic"):
        _state(inv, 1, term=2, commit=5, applied=6, epoch=1)
    with _fires("term-monotonic"):
        _state(inv, 1, term=1, commit=5, applied=4, epoch=1)
    with _fires("epoch-monotonic"):
        _state(inv, 1, term=2, commit=5, applied=4, epoch=0)


def test_epoch_agreement() -> None:
    inv = RaftInvariants()
    _state(inv, 1, commit=5, applied=5, epoch=2)
    with _fires("epoch-agreement"):
        _state(inv, 2, commit=5, applied=5, epoch=3)


def test_leader_commits_only_current_term_entries() -> None:
    inv = RaftInvariants()
    _state(inv, 1, is_leader=True, term=4, commit=3, applied=3)
    _state(inv, 1, is_leader=True, term=4, commit=5, commit_term=4, applied=3)
    with _fires("leader-commits-current-term"):
        _state(inv, 1, is_leader=True, term=4, commit=6, commit_term=2, applied=3)


def _durable(term: int, vote: int, unsynced_from: int = 0, last: int = 10) -> DurableView:
    return DurableView(HardState(term=term, vote=vote, commit=1), unsynced_from, last)


def test_messages_must_not_outrun_the_disk() -> None:
    inv = RaftInvariants()
    grant = Message(type=MessageType.VOTE_RESP, to=2, from_=1, term=5)
    inv.on_send(1, grant, _durable(5, 2))
    with _fires("vote-durable"):
        inv.on_send(1, grant, _durable(5, 0))
    with _fires("term-durable"):
        inv.on_send(1, Message(type=MessageType.HEARTBEAT_RESP, to=2, from_=1, term=6),
                    _durable(5, 2))
    # A pre-vote carries the next term without persisting it.
    inv.on_send(1, Message(type=MessageType.PRE_VOTE, to=2, from_=1, term=9), _durable(5, 2))
    ack = Message(type=MessageType.APP_RESP, to=2, from_=1, term=5, index=8)
    inv.on_send(1, ack, _durable(5, 2, unsynced_from=9))
    with _fires("acknowledged-entries-durable"):
        inv.on_send(1, ack, _durable(5, 2, unsynced_from=7))
    with _fires("acknowledged-entries-durable"):
        inv.on_send(1, ack, _durable(5, 2, last=7))


def test_promises_survive_a_crash() -> None:
    inv = RaftInvariants()
    inv.on_send(1, Message(type=MessageType.VOTE_RESP, to=3, from_=1, term=4), _durable(4, 3))
    inv.on_send(1, Message(type=MessageType.APP_RESP, to=3, from_=1, term=4, index=6),
                _durable(4, 3))
    promise = inv.promise_at_crash(1, {5: 4, 6: 4, 7: 4})
    assert promise.entries == {5: 4, 6: 4}
    restart = {"commit": 1, "snapshot_index": 1}
    inv.on_restart(1, promise, term=4, vote=3, log_terms={5: 4, 6: 4}, **restart)
    with _fires("vote-durable"):
        inv.on_restart(1, promise, term=4, vote=0, log_terms={5: 4, 6: 4}, **restart)
    with _fires("term-durable"):
        inv.on_restart(1, promise, term=3, vote=3, log_terms={5: 4, 6: 4}, **restart)
    with _fires("acknowledged-entries-durable"):
        inv.on_restart(1, promise, term=4, vote=3, log_terms={5: 4}, **restart)
    # Covered by a snapshot is as good as stored.
    inv.on_restart(1, promise, term=4, vote=3, log_terms={}, commit=6, snapshot_index=6)


def test_snapshot_safety() -> None:
    from quorumlog.raft import ConfState, Snapshot, SnapshotMeta

    inv = RaftInvariants()
    inv.on_apply(1, _e(2, 5), digest=b"d5")
    meta = SnapshotMeta(index=5, term=2, conf_state=ConfState(voters=frozenset({1})), epoch=1)
    inv.on_snapshot_installed(2, Snapshot(meta=meta), digest=b"d5")
    with _fires("snapshot-safety"):
        inv.on_snapshot_installed(3, Snapshot(meta=meta), digest=b"other")
    wrong_term = SnapshotMeta(index=5, term=3, conf_state=meta.conf_state, epoch=1)
    with _fires("snapshot-safety"):
        inv.on_snapshot_installed(3, Snapshot(meta=wrong_term), digest=b"d5")
