"""The metadata state machine: revisions, CAS, transactions, sessions, watches."""

from __future__ import annotations

import random

import msgspec
import pytest

from quorumlog.meta import (
    Compact,
    CompactedError,
    Compare,
    CompareOp,
    CompareTarget,
    CreateSession,
    DeleteOp,
    ErrorResult,
    EventType,
    IdResult,
    MetaLimits,
    MetaStateMachine,
    NextId,
    PutOp,
    RangeOp,
    Request,
    Result,
    RevokeSession,
    SessionResult,
    Txn,
    TxnResult,
)
from quorumlog.meta._commands import REQUEST_ENCODER, Command
from quorumlog.raft import combine_msgpack


class Log:
    """Feeds requests to a state machine as a Raft log would."""

    def __init__(self, sm: MetaStateMachine | None = None) -> None:
        self.sm = MetaStateMachine() if sm is None else sm
        self.index = self.sm.applied_index
        self.entries: list[bytes] = []

    def apply(
        self, command: Command, *, session: int = 0, seq: int = 0, first: int | None = None
    ) -> Result:
        """Apply ``command``; in ``session`` (exactly-once) if given, with ``seq`` and
        the first outstanding seq ``first`` (default: ``seq`` itself)."""
        request = Request(session_id=session, seq=seq,
                          first_outstanding_seq=seq if first is None else first, command=command)
        data = REQUEST_ENCODER.encode(request)
        self.entries.append(data)
        self.index += 1
        result, _ = self.sm.apply(self.index, data)
        return result


def put(key: str, value: bytes, **kw: object) -> Txn:
    return Txn(success=(PutOp(key=key, value=value, **kw),))  # type: ignore[arg-type]


def cas(key: str, version: int, value: bytes) -> Txn:
    return Txn(
        compares=(Compare(key=key, target=CompareTarget.VERSION, version=version),),
        success=(PutOp(key=key, value=value),),
    )


def test_revisions_and_versions() -> None:
    log = Log()
    r1 = log.apply(put("/a", b"1"))
    r2 = log.apply(put("/a", b"2"))
    r3 = log.apply(put("/b", b"x"))
    assert isinstance(r3, TxnResult) and [r.revision for r in (r1, r2, r3)] == [1, 2, 3]  # type: ignore[union-attr]
    kv = log.sm.get("/a")
    assert kv is not None and (kv.version, kv.create_revision, kv.mod_revision) == (2, 1, 2)
    # A read-only transaction does not bump the revision.
    r4 = log.apply(Txn(success=(RangeOp(key="/", prefix=True),)))
    assert isinstance(r4, TxnResult) and r4.revision == 3


def test_cas_never_succeeds_on_a_stale_version() -> None:
    log = Log()
    log.apply(put("/k", b"v1"))
    ok = log.apply(cas("/k", 1, b"v2"))
    stale = log.apply(cas("/k", 1, b"v3"))
    assert isinstance(ok, TxnResult) and ok.succeeded
    assert isinstance(stale, TxnResult) and not stale.succeeded
    kv = log.sm.get("/k")
    assert kv is not None and kv.value == b"v2"
    create_only = log.apply(cas("/new", 0, b"n"))
    again = log.apply(cas("/new", 0, b"m"))
    assert isinstance(create_only, TxnResult) and create_only.succeeded
    assert isinstance(again, TxnResult) and not again.succeeded


def test_multi_key_txn_is_all_or_nothing() -> None:
    log = Log()
    log.apply(put("/x", b"1"))
    txn = Txn(
        compares=(
            Compare(key="/x", target=CompareTarget.VALUE, value=b"1"),
            Compare(key="/y", target=CompareTarget.VERSION, version=0),
        ),
        success=(PutOp(key="/x", value=b"2"), PutOp(key="/y", value=b"2")),
        failure=(RangeOp(key="/x"),),
    )
    first = log.apply(txn)
    second = log.apply(txn)
    assert isinstance(first, TxnResult) and first.succeeded and first.revision == 2
    assert isinstance(second, TxnResult) and not second.succeeded and second.revision == 2
    kv_x, kv_y = log.sm.get("/x"), log.sm.get("/y")
    assert kv_x is not None and kv_y is not None
    assert kv_x.mod_revision == kv_y.mod_revision == 2


def test_invalid_txn_changes_nothing() -> None:
    log = Log(MetaStateMachine(MetaLimits(value_max_bytes=4)))
    log.apply(put("/a", b"1"))
    before = log.sm.snapshot()
    bad = log.apply(Txn(success=(PutOp(key="/b", value=b"ok"), PutOp(key="/c", value=b"toolong"))))
    assert isinstance(bad, ErrorResult) and bad.code == "value_too_large"
    assert log.sm.get("/b") is None
    empty = log.apply(put("", b"x"))
    assert isinstance(empty, ErrorResult) and empty.code == "bad_key"
    after = msgspec.msgpack.decode(log.sm.snapshot())
    before_d = msgspec.msgpack.decode(before)
    before_d["applied_index"] = after["applied_index"]
    assert after == before_d


def test_malformed_entry_is_an_error_result() -> None:
    sm = MetaStateMachine()
    result, events = sm.apply(1, b"\xff\x00garbage")
    assert isinstance(result, ErrorResult) and result.code == "malformed" and not events


def test_range_prefix_limit_and_interval() -> None:
    log = Log()
    for i in range(10):
        log.apply(put(f"/l/{i:02d}", b"v"))
    log.apply(put("/m", b"v"))
    r = log.sm.range(RangeOp(key="/l/", prefix=True, limit=3))
    assert [kv.key for kv in r.kvs] == ["/l/00", "/l/01", "/l/02"] and r.more and r.count == 10
    r2 = log.sm.range(RangeOp(key="/l/05", end="/l/08", keys_only=True))
    assert [kv.key for kv in r2.kvs] == ["/l/05", "/l/06", "/l/07"]
    assert all(kv.value == b"" for kv in r2.kvs)
    deleted = log.apply(Txn(success=(DeleteOp(key="/l/", prefix=True),)))
    assert isinstance(deleted, TxnResult)
    assert log.sm.range(RangeOp(key="/", prefix=True)).count == 1


def test_sessions_own_ephemeral_keys() -> None:
    log = Log()
    s = log.apply(CreateSession(ttl_ms=5000))
    assert isinstance(s, SessionResult)
    log.apply(put("/bookies/b1", b"addr", session_id=s.session_id))
    log.apply(put("/bookies/b2", b"addr", session_id=s.session_id))
    log.apply(put("/bookies/b2", b"permanent"))  # rebinding to no session keeps it
    assert log.sm.sessions() == {s.session_id: 5000}
    revoked = log.apply(RevokeSession(session_id=s.session_id))
    assert isinstance(revoked, SessionResult) and revoked.found
    assert log.sm.get("/bookies/b1") is None
    assert log.sm.get("/bookies/b2") is not None
    gone = log.apply(put("/bookies/b3", b"x", session_id=s.session_id))
    assert isinstance(gone, ErrorResult) and gone.code == "session_not_found"
    bad_ttl = log.apply(CreateSession(ttl_ms=1))
    assert isinstance(bad_ttl, ErrorResult) and bad_ttl.code == "bad_ttl"


def test_ids_are_unique_and_increasing() -> None:
    log = Log()
    firsts = []
    for count in [1, 5, 1, 100]:
        r = log.apply(NextId(name="ledger", count=count))
        assert isinstance(r, IdResult)
        firsts.append(r.first)
    assert firsts == [1, 2, 7, 8]
    other = log.apply(NextId(name="stream"))
    assert isinstance(other, IdResult) and other.first == 1


def test_watch_history_in_order_and_compaction() -> None:
    log = Log()
    log.apply(put("/w/a", b"1"))
    log.apply(put("/other", b"1"))
    log.apply(Txn(success=(DeleteOp(key="/w/a"),)))
    log.apply(put("/w/b", b"2"))
    events = log.sm.events_since(1, "/w/", prefix=True)
    assert [(e.type, e.kv.key, e.kv.mod_revision) for e in events] == [
        (EventType.PUT, "/w/a", 1),
        (EventType.DELETE, "/w/a", 3),
        (EventType.PUT, "/w/b", 4),
    ]
    log.apply(Compact(revision=2))
    with pytest.raises(CompactedError, match="revision 2 is compacted"):
        log.sm.events_since(2, "/w/", prefix=True)
    assert [e.kv.mod_revision for e in log.sm.events_since(3, "/w/", prefix=True)] == [3, 4]


def test_history_is_bounded() -> None:
    log = Log(MetaStateMachine(MetaLimits(history_events_max=5)))
    for i in range(20):
        log.apply(put("/h", str(i).encode()))
    assert log.sm.compacted_revision >= 15
    with pytest.raises(CompactedError):
        log.sm.events_since(1, "/h", prefix=False)


def _random_command(rng: random.Random) -> Command:
    key = f"/k/{rng.randrange(6)}"
    roll = rng.random()
    if roll < 0.4:
        return put(key, rng.randbytes(3), session_id=rng.choice([0, 0, 1, 2]))
    if roll < 0.6:
        return cas(key, rng.randrange(3), rng.randbytes(2))
    if roll < 0.7:
        return Txn(success=(DeleteOp(key="/k/", prefix=rng.random() < 0.2),))
    if roll < 0.8:
        return CreateSession(ttl_ms=1000)
    if roll < 0.9:
        return RevokeSession(session_id=rng.randrange(1, 4))
    return NextId(name="n", count=rng.randrange(1, 3))


@pytest.mark.parametrize("seed", range(20))
def test_replicas_and_snapshots_agree(seed: int) -> None:
    """Two members applying one log agree at every step; a member restored from a
    snapshot mid-way ends in the same state (deterministic state machine)."""
    rng = random.Random(seed)
    a, b = Log(), Log()
    commands = [_random_command(rng) for _ in range(200)]
    client = CreateSession(ttl_ms=60_000)
    assert a.apply(client) == b.apply(client) == SessionResult(session_id=1, ttl_ms=60_000)
    for i, cmd in enumerate(commands):
        # Session 1 writes, retries (same seq) and acknowledges out of order.
        seq = i + 1 if rng.random() < 0.8 else max(1, i - rng.randrange(3))
        first = max(1, seq - rng.randrange(4))
        ra = a.apply(cmd, session=1, seq=seq, first=first)
        rb = b.apply(cmd, session=1, seq=seq, first=first)
        assert ra == rb
        if i == 100:
            restored = MetaStateMachine()
            restored.restore(a.sm.snapshot())
            b = Log(restored)
    assert a.sm.snapshot() == b.sm.snapshot()
    assert CompareOp.EQUAL.value == "=="


def _comparable(sm: MetaStateMachine) -> object:
    """A machine's snapshot without its applied index (which counts entries)."""
    state = msgspec.msgpack.decode(sm.snapshot())
    del state["applied_index"]
    return state


@pytest.mark.parametrize("seed", range(20))
def test_combined_entries_apply_as_their_requests_one_by_one(seed: int) -> None:
    """A combined entry (the writes a meta leader's ready pass proposes
    together, ``raft.combine_msgpack``) applies as its requests in entries of
    their own would: the same results, events and revisions in order, and the
    same state, retries and acknowledgements of one session included."""
    rng = random.Random(seed)
    requests = [REQUEST_ENCODER.encode(Request(command=CreateSession(ttl_ms=60_000)))]
    for i in range(300):
        seq = i + 1 if rng.random() < 0.8 else max(1, i - rng.randrange(3))
        first = max(1, seq - rng.randrange(4))
        requests.append(REQUEST_ENCODER.encode(Request(
            session_id=1, seq=seq, first_outstanding_seq=first, command=_random_command(rng))))
    one, combined = MetaStateMachine(), MetaStateMachine()
    done = entries = 0
    while done < len(requests):
        group = requests[done:done + rng.randrange(1, 40)]  # fixarray and array16 both
        expected = [one.apply(done + offset + 1, data) for offset, data in enumerate(group)]
        done += len(group)
        entries += 1
        assert combined.apply(entries, combine_msgpack(group)) == expected
    assert combined.applied_index == entries < len(requests) == one.applied_index
    assert combined.revision == one.revision > 0
    assert _comparable(combined) == _comparable(one)


def test_a_combined_entry_applies_the_requests_that_decode() -> None:
    """A request of a combined entry that does not decode is answered as
    malformed; the others apply (each request stands on its own)."""
    sm = MetaStateMachine()
    bad = msgspec.msgpack.encode({"command": 5})
    outcome = sm.apply(1, combine_msgpack([
        REQUEST_ENCODER.encode(Request(command=put("/a", b"1"))), bad,
        REQUEST_ENCODER.encode(Request(command=put("/b", b"2")))]))
    assert isinstance(outcome, list) and len(outcome) == 3
    (first, _), (malformed, events), (last, _) = outcome
    assert isinstance(malformed, ErrorResult) and malformed.code == "malformed" and not events
    assert isinstance(first, TxnResult) and isinstance(last, TxnResult)
    assert (first.revision, last.revision) == (1, 2)
    assert sm.get("/b") is not None and sm.get("/b").value == b"2"  # type: ignore[union-attr]


def test_lease_keeper_expires_and_refreshes() -> None:
    from quorumlog.meta._leases import LeaseKeeper

    keeper = LeaseKeeper()
    keeper.created(1, 1000, now_ms=0)  # not the leader: ignored
    assert keeper.expired(10_000) == []
    keeper.promote(now_ms=100, sessions={1: 1000, 2: 500})
    assert keeper.expired(599) == []
    assert keeper.expired(600) == [2]
    assert keeper.keepalive(1, now_ms=1000) == 1000
    assert keeper.expired(1999) == [2]  # still reported until revoked
    keeper.revoked(2)
    assert keeper.expired(1999) == []
    assert keeper.expired(2000) == [1]
    assert keeper.keepalive(99, now_ms=0) is None
    keeper.demote()
    assert keeper.keepalive(1, now_ms=0) is None and keeper.expired(10**9) == []


def test_lease_keeper_refuses_a_keepalive_once_the_session_has_expired() -> None:
    """A keep-alive that arrives after the deadline (swept or not) must not answer
    "alive": the revoke may already be in the log, and a bookie told "alive"
    would believe in a registration whose key is about to vanish (found with a
    meta process stopped for longer than a TTL and resumed)."""
    from quorumlog.meta._leases import LeaseKeeper

    keeper = LeaseKeeper()
    keeper.promote(now_ms=0, sessions={1: 1000, 2: 1000, 3: 1000})
    assert keeper.keepalive(1, now_ms=1000) is None  # at its deadline, not yet swept
    assert keeper.expired(1500) == [1, 2, 3]
    assert keeper.keepalive(2, now_ms=1501) is None  # swept: its revoke is on the way
    keeper.revoked(1)
    keeper.revoked(2)
    assert keeper.keepalive(3, now_ms=1600) is None  # still expiring until revoked
    # A new leader grants every session a full TTL again (expiry late, never early).
    keeper.demote()
    keeper.promote(now_ms=2000, sessions={3: 1000})
    assert keeper.keepalive(3, now_ms=2500) == 1000
