"""Exactly-once client sessions in the state machine (deterministic, no I/O).

A client with many writes in flight retries any of them after a failover:
each retry must get the result of its first application, never a second
application and never another request's answer. Results are kept until the
client acknowledges them (``first_outstanding_seq``), bounded in bytes, and
dropped with the session's lease; every way a result can be gone gives a
clear error, never a wrong answer.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from quorumlog import rpc
from quorumlog.meta import (
    CreateSession,
    ErrorResult,
    IdResult,
    MetaClient,
    MetaLimits,
    MetaStateMachine,
    NextId,
    PutOp,
    RangeOp,
    RevokeSession,
    SessionResult,
    Txn,
    TxnResult,
)

from .support import one_member
from .test_state import Log, cas, put


def _open(log: Log, ttl_ms: int = 60_000) -> int:
    result = log.apply(CreateSession(ttl_ms=ttl_ms))
    assert isinstance(result, SessionResult)
    return result.session_id


def _state_without_index(sm: MetaStateMachine) -> dict[str, object]:
    state: dict[str, object] = msgspec.msgpack.decode(sm.snapshot())
    state.pop("applied_index")
    return state


def test_a_retry_below_the_highest_applied_seq_gets_its_own_first_result() -> None:
    log = Log()
    log.apply(put("/c", b"0"))
    s = _open(log)
    # Three writes in flight at once (seqs 1..3, none answered: first = 1).
    r1 = log.apply(cas("/c", 1, b"1"), session=s, seq=1, first=1)
    r2 = log.apply(NextId(name="ledger"), session=s, seq=2, first=1)
    r3 = log.apply(put("/d", b"x"), session=s, seq=3, first=1)
    assert isinstance(r1, TxnResult) and r1.succeeded
    assert isinstance(r2, IdResult) and r2.first == 1
    assert isinstance(r3, TxnResult)
    before = _state_without_index(log.sm)
    # After a failover the client retries 1 and 2 (3 was answered: first = 1 still).
    assert log.apply(cas("/c", 1, b"1"), session=s, seq=1, first=1) == r1
    assert log.apply(NextId(name="ledger"), session=s, seq=2, first=1) == r2
    assert log.apply(put("/d", b"x"), session=s, seq=3, first=1) == r3
    assert _state_without_index(log.sm) == before  # nothing applied twice
    kv = log.sm.get("/c")
    assert kv is not None and kv.version == 2
    # A new seq is applied as usual.
    r4 = log.apply(NextId(name="ledger"), session=s, seq=4, first=1)
    assert isinstance(r4, IdResult) and r4.first == 2


def test_a_request_below_the_acknowledged_floor_is_refused_and_not_applied() -> None:
    log = Log()
    s = _open(log)
    log.apply(NextId(name="n"), session=s, seq=1, first=1)
    log.apply(NextId(name="n"), session=s, seq=2, first=1)
    # Seq 3 says every answer below 3 arrived: the table forgets 1 and 2.
    log.apply(NextId(name="n"), session=s, seq=3, first=3)
    before = _state_without_index(log.sm)
    late = log.apply(NextId(name="n"), session=s, seq=1, first=1)
    assert isinstance(late, ErrorResult) and late.code == "already_acknowledged"
    assert "below the acknowledged floor 3" in late.message
    assert _state_without_index(log.sm) == before
    # The floor never goes back: a request carrying an older floor changes nothing.
    r4 = log.apply(NextId(name="n"), session=s, seq=4, first=2)
    assert isinstance(r4, IdResult) and r4.first == 4
    again = log.apply(NextId(name="n"), session=s, seq=2, first=2)
    assert isinstance(again, ErrorResult) and again.code == "already_acknowledged"


def test_sequence_numbers_out_of_range_are_a_clear_error() -> None:
    log = Log()
    s = _open(log)
    before = _state_without_index(log.sm)
    bad = log.apply(put("/a", b"1"), session=s, seq=2, first=3)
    assert isinstance(bad, ErrorResult) and bad.code == "bad_sequence"
    zero = log.apply(put("/a", b"1"), session=s, seq=0, first=0)
    assert isinstance(zero, ErrorResult) and zero.code == "bad_sequence"
    assert _state_without_index(log.sm) == before


def test_an_unknown_session_applies_nothing() -> None:
    log = Log()
    result = log.apply(put("/a", b"1"), session=42, seq=1)
    assert isinstance(result, ErrorResult) and result.code == "session_expired"
    assert "expired or was revoked" in result.message and "not applied" in result.message
    assert log.sm.get("/a") is None


def test_the_table_expires_with_the_session_lease() -> None:
    log = Log()
    s = _open(log)
    log.apply(put("/a", b"1"), session=s, seq=1, first=1)
    log.apply(RevokeSession(session_id=s))  # the leader's LeaseKeeper expired it
    retry = log.apply(put("/a", b"1"), session=s, seq=1, first=1)
    assert isinstance(retry, ErrorResult) and retry.code == "session_expired"
    assert "outcome of an earlier attempt" in retry.message
    kv = log.sm.get("/a")
    assert kv is not None and kv.version == 1


def test_a_session_over_its_byte_bound_is_evicted_and_retries_get_a_clear_error() -> None:
    # A client that never acknowledges (first stays 1) fills its session.
    limits = MetaLimits(client_session_bytes_max=600, client_sessions_bytes_max=10_000,
                        client_response_bytes_max=200)
    log = Log(MetaStateMachine(limits))
    s = _open(log)
    results = []
    for seq in range(1, 100):
        result = log.apply(NextId(name="n"), session=s, seq=seq, first=1)
        if isinstance(result, ErrorResult):
            break
        results.append(result)
    # Every applied request got its own answer; then the session was evicted.
    assert [r.first for r in results if isinstance(r, IdResult)] == list(
        range(1, len(results) + 1))
    assert 5 < len(results) < 60
    assert isinstance(result, ErrorResult) and result.code == "session_expired"
    assert "evicted from the session table" in result.message
    retry = log.apply(NextId(name="n"), session=s, seq=1, first=1)
    assert isinstance(retry, ErrorResult) and retry.code == "session_expired"
    assert log.sm.sessions() == {s: 60_000}  # the lease itself (and its keys) lives on
    after = log.apply(NextId(name="n"))
    assert isinstance(after, IdResult) and after.first == len(results) + 1  # none re-applied


def test_the_total_bound_evicts_the_least_recently_used_session() -> None:
    # A kept put result is 56 + 32 bytes, a session 64 + its results: three
    # results each fit both, a fourth for b goes over the total of 700.
    limits = MetaLimits(client_session_bytes_max=500, client_sessions_bytes_max=700,
                        client_response_bytes_max=200)
    log = Log(MetaStateMachine(limits))
    a, b = _open(log), _open(log)
    for seq in range(1, 4):
        log.apply(put("/a", b"1"), session=a, seq=seq, first=1)
    for seq in range(1, 5):  # b is the most recently used: a goes first
        log.apply(put("/b", b"1"), session=b, seq=seq, first=1)
    gone = log.apply(put("/a", b"1"), session=a, seq=1, first=1)
    assert isinstance(gone, ErrorResult) and gone.code == "session_expired"
    kept = log.apply(put("/b", b"1"), session=b, seq=1, first=1)
    assert isinstance(kept, TxnResult) and kept.revision == 4  # b's first answer


def test_a_result_too_large_to_keep_is_answered_once_and_retries_get_a_clear_error() -> None:
    log = Log(MetaStateMachine(MetaLimits(client_response_bytes_max=1024)))
    log.apply(put("/big", b"x" * 4096))
    s = _open(log)
    read = Txn(success=(RangeOp(key="/big"), PutOp(key="/mark", value=b"1")))
    first = log.apply(read, session=s, seq=1, first=1)
    assert isinstance(first, TxnResult) and first.results[0].kvs[0].value == b"x" * 4096  # type: ignore[union-attr]
    retry = log.apply(read, session=s, seq=1, first=1)
    assert isinstance(retry, ErrorResult) and retry.code == "response_not_kept"
    assert "was applied" in retry.message and "client_response_bytes_max 1024" in retry.message
    kv = log.sm.get("/mark")
    assert kv is not None and kv.version == 1  # not applied twice


def test_a_member_restored_from_a_snapshot_answers_retries_the_same() -> None:
    log = Log()
    s = _open(log)
    answers = {seq: log.apply(NextId(name="n"), session=s, seq=seq, first=2)
               for seq in range(2, 6)}
    restored = MetaStateMachine()
    restored.restore(log.sm.snapshot())
    other = Log(restored)
    for seq, answer in answers.items():
        assert other.apply(NextId(name="n"), session=s, seq=seq, first=2) == answer
        assert log.apply(NextId(name="n"), session=s, seq=seq, first=2) == answer
    late = other.apply(NextId(name="n"), session=s, seq=1, first=1)
    assert isinstance(late, ErrorResult) and late.code == "already_acknowledged"
    log.apply(NextId(name="n"), session=s, seq=1, first=1)
    assert other.sm.snapshot() == log.sm.snapshot()  # same log, same state


def test_a_client_whose_session_was_evicted_opens_a_new_one_for_a_fresh_write(
    tmp_path: Path,
) -> None:
    """Room for one session only: each client's first write evicts the other's
    session. A write never attempted before is refused without being applied,
    so the client sends it again in a new session (once)."""
    limits = MetaLimits(client_session_bytes_max=200, client_sessions_bytes_max=200,
                        client_response_bytes_max=100)

    async def main() -> None:
        async with one_member(tmp_path, limits=limits) as member, \
                MetaClient([member.address]) as a, MetaClient([member.address]) as b:
            assert await a.next_id("n") == 1
            first_session = a.session_id
            assert await b.next_id("n") == 2  # b's session evicts a's
            assert await a.next_id("n") == 3  # refused in the old session, sent again
            assert a.session_id not in (0, first_session)
            assert await b.next_id("n") == 4
            assert member.service.machine.sessions().keys() >= {first_session, a.session_id}

    rpc.run(main())
