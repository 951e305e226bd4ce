"""The simulator's parts on their own: network, disk, clock, snapshots, clients."""

from __future__ import annotations

import random

import msgspec
import pytest

from quorumlog.errors import ConfigError, InvariantViolation, ProtocolError
from quorumlog.meta import MetaStateMachine, PutResult, SessionResult, TxnResult
from quorumlog.raft import ConfState, Entry, Snapshot, SnapshotMeta
from quorumlog.sim._client import (
    CLIENT_ID_BASE,
    ClientOp,
    ClientRequest,
    ClientResponse,
    SimClient,
)
from quorumlog.sim._clock import TimerQueue, VirtualClock
from quorumlog.sim._config import MIXES, FaultMix, SimConfig, mix_for_seed
from quorumlog.sim._disk import SimDisk
from quorumlog.sim._linearizability import OpKind
from quorumlog.sim._machine import LogDigest, SimSnapshot, restore_state
from quorumlog.sim._network import SimNetwork

# -- network ---------------------------------------------------------------------


def _drain(net: SimNetwork[str], until_ms: int) -> list[tuple[int, int, int, str]]:
    out = []
    for now in range(until_ms + 1):
        out.extend((now, e.source, e.target, e.payload) for e in net.pop_due(now))
    return out


def test_network_delivers_within_delay_bounds_in_time_order() -> None:
    mix = FaultMix(message_delay_ms_min=2, message_delay_ms_max=5)
    net: SimNetwork[str] = SimNetwork(random.Random(1), mix)
    for i in range(200):
        net.send(0, 1, 2, f"m{i}")
    got = _drain(net, 10)
    assert len(got) == 200
    assert all(2 <= t <= 5 for t, *_ in got)
    assert [t for t, *_ in got] == sorted(t for t, *_ in got)
    # Random delays reorder messages.
    assert [p for *_, p in got] != [f"m{i}" for i in range(200)]


def test_network_drops_and_duplicates_by_probability() -> None:
    mix = FaultMix(message_drop_probability=0.5, message_duplicate_probability=0.5)
    net: SimNetwork[int] = SimNetwork(random.Random(2), mix)
    for i in range(2000):
        net.send(0, 1, 2, i)
    delivered = [e.payload for e in net.pop_due(1000)]
    assert 600 < net.stats.dropped_random < 1400
    assert 300 < net.stats.duplicated < 700
    assert len(delivered) == 2000 - net.stats.dropped_random + net.stats.duplicated
    assert len(set(delivered)) < len(delivered)


def test_network_tail_delays_are_long() -> None:
    mix = FaultMix(message_delay_tail_probability=1.0, message_delay_tail_ms_max=50)
    net: SimNetwork[int] = SimNetwork(random.Random(3), mix)
    for i in range(100):
        net.send(0, 1, 2, i)
    times = [t for t, *_ in _drain(net, 60)]  # type: ignore[arg-type]
    assert max(times) > 30


def test_symmetric_and_one_way_partitions() -> None:
    net: SimNetwork[str] = SimNetwork(random.Random(4), FaultMix())
    net.partition([[1], [2, 3]])
    assert net.is_blocked(1, 2) and net.is_blocked(2, 1) and net.is_blocked(3, 1)
    assert not net.is_blocked(2, 3)
    net.heal()
    net.block(1, 2)
    net.send(0, 1, 2, "lost")
    net.send(0, 2, 1, "arrives")
    assert [e.payload for e in net.pop_due(100)] == ["arrives"]
    assert net.stats.dropped_partition == 1


def test_partition_drops_messages_already_in_flight_and_down_targets() -> None:
    net: SimNetwork[str] = SimNetwork(random.Random(5), FaultMix())
    net.send(0, 1, 2, "in flight")
    net.send(0, 1, 3, "to a crashed node")
    net.partition([[1], [2]])
    net.set_down(3, True)
    assert net.pop_due(100) == []
    assert net.stats.dropped_partition == 1
    assert net.stats.dropped_unreachable == 1


def test_network_is_deterministic_per_seed() -> None:
    def run(seed: int) -> list[tuple[int, int, int, str]]:
        mix = MIXES["lossy"]
        net: SimNetwork[str] = SimNetwork(random.Random(seed), mix)
        for i in range(300):
            net.send(i // 10, i % 3, (i + 1) % 3, f"m{i}")
        return _drain(net, 200)

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_heal_faults_stops_random_loss() -> None:
    net: SimNetwork[int] = SimNetwork(random.Random(6), MIXES["lossy"])
    net.heal_faults()
    for i in range(500):
        net.send(0, 1, 2, i)
    assert sorted(e.payload for e in net.pop_due(1000)) == list(range(500))


# -- disk ------------------------------------------------------------------------


def _tear_prefix(record: tuple[int, ...], rng: random.Random) -> tuple[int, ...] | None:
    keep = rng.randrange(len(record))
    return record[:keep] if keep else None


def test_disk_sync_makes_writes_durable() -> None:
    disk: SimDisk[tuple[int, ...]] = SimDisk(_tear_prefix)
    disk.write((1,))
    disk.sync()
    disk.write((2, 3))
    assert disk.records() == [(1,), (2, 3)]
    assert disk.durable_records() == [(1,)]
    assert disk.unsynced_records == 1


def test_disk_crash_loses_unsynced_tail() -> None:
    mix = FaultMix(unsynced_tail_survives_probability=0.0)
    disk: SimDisk[tuple[int, ...]] = SimDisk(_tear_prefix)
    disk.write((1,))
    disk.sync()
    disk.write((2,))
    disk.write((3,))
    outcome = disk.crash(random.Random(1), mix)
    assert outcome.lost_records == 2
    assert disk.records() == [(1,)]


def test_disk_crash_can_keep_a_prefix_and_tear_the_last_write() -> None:
    mix = FaultMix(unsynced_tail_survives_probability=1.0, torn_write_probability=1.0)
    seen_torn = set()
    for seed in range(50):
        disk: SimDisk[tuple[int, ...]] = SimDisk(_tear_prefix)
        disk.write((0,))
        disk.sync()
        disk.write((1, 2, 3, 4))
        disk.write((5, 6, 7, 8))
        disk.crash(random.Random(seed), mix)
        records = disk.records()
        assert records[0] == (0,)
        flat = [x for r in records for x in r]
        assert flat == list(range(len(flat)))  # always a prefix of what was written
        assert len(flat) < 9  # the last surviving write is torn
        seen_torn.add(len(flat))
    assert len(seen_torn) > 3


def test_disk_rewrite_is_durable() -> None:
    disk: SimDisk[tuple[int, ...]] = SimDisk(_tear_prefix)
    disk.write((1,))
    disk.rewrite([(9,)])
    disk.crash(random.Random(0), FaultMix(unsynced_tail_survives_probability=0.0))
    assert disk.records() == [(9,)]


# -- clock -----------------------------------------------------------------------


def test_clock_stamps_increase_and_time_never_goes_back() -> None:
    clock = VirtualClock()
    a = clock.stamp()
    b = clock.stamp()
    clock.advance_to(5)
    c = clock.stamp()
    assert a < b < c
    assert 5 < c < 6
    with pytest.raises(InvariantViolation):
        clock.advance_to(4)


def test_timer_queue_orders_by_time_then_schedule_order() -> None:
    timers = TimerQueue()
    fired: list[str] = []
    timers.schedule(5, lambda: fired.append("b"))
    timers.schedule(1, lambda: fired.append("a"))
    timers.schedule(5, lambda: fired.append("c"))
    assert timers.next_due_ms() == 1
    while (callback := timers.pop_due(10)) is not None:
        callback()
    assert fired == ["a", "b", "c"]
    assert timers.pop_due(10) is None


# -- config ----------------------------------------------------------------------


def test_mixes_validate_and_rotate() -> None:
    for mix in MIXES.values():
        mix.validate()
    assert mix_for_seed("all", 0).name == next(iter(MIXES))
    assert {mix_for_seed("all", s).name for s in range(len(MIXES))} == set(MIXES)
    with pytest.raises(ConfigError, match="unknown fault mix"):
        mix_for_seed("nope", 0)
    with pytest.raises(ConfigError, match="probability"):
        FaultMix().replace(message_drop_probability=2.0)
    with pytest.raises(ConfigError, match="election_timeout_ticks"):
        SimConfig().replace(heartbeat_interval_ticks=50)


# -- state machine, snapshots and digest -------------------------------------------


def test_log_digest_chains_every_entry_in_order() -> None:
    digest = LogDigest()
    digest.note(Entry(term=1, index=1, data=b"a"))
    other = LogDigest()
    other.note(Entry(term=2, index=1, data=b"a"))
    assert digest.digest != other.digest != LogDigest().digest
    with pytest.raises(InvariantViolation):
        digest.note(Entry(term=1, index=3))


def test_snapshot_restores_the_meta_state_machine_and_digest() -> None:
    machine = MetaStateMachine()
    session = machine.apply(1, _payload(_open_session_request()))[0]
    assert isinstance(session, SessionResult)
    machine.apply(2, b"\xc1")  # garbage is answered with an error, not applied
    digest = LogDigest(2, b"d" * 16)
    data = msgspec.msgpack.encode(SimSnapshot(digest.digest, machine.snapshot()))
    restored, restored_digest = restore_state(
        Snapshot(meta=_meta(2), data=data))
    assert restored.snapshot() == machine.snapshot()
    assert restored_digest == digest
    empty, empty_digest = restore_state(Snapshot(meta=_meta(4)))
    assert len(empty) == 0 and empty_digest == LogDigest(4)
    with pytest.raises(ProtocolError):
        restore_state(Snapshot(meta=_meta(2), data=b"\xff\x00"))


def _meta(index: int) -> SnapshotMeta:
    return SnapshotMeta(index=index, term=1, conf_state=ConfState(voters=frozenset({1})), epoch=1)


def _payload(request: ClientRequest) -> bytes:
    return request.payload


def _open_session_request() -> ClientRequest:
    client, _ = _client()
    [(_, request)] = client.wake(client.wake_ms, [1])
    assert request.op is ClientOp.OPEN_SESSION
    return request


def test_client_commands_have_register_semantics_on_the_meta_state_machine() -> None:
    """The client's put / CAS / get / delete, applied by the real state machine,
    answer what the linearizability checker's register model expects; a retried
    write is applied once and a late copy of an abandoned one is refused."""
    config = SimConfig(client_get_probability=0.3, client_cas_probability=0.3,
                       client_delete_probability=0.2, read_index_probability=0.0, keys=1)
    clock = VirtualClock()
    client = SimClient(CLIENT_ID_BASE, random.Random(7), config, clock.stamp)
    machine = MetaStateMachine()
    register: str | None = None
    index = 0
    sent: list[ClientRequest] = []
    while client.completed < 40:
        now = client.wake_ms
        clock.advance_to(now)
        [(_, request)] = client.wake(now, [1])
        sent.append(request)
        index += 1
        result, _ = machine.apply(index, request.payload)
        if request.op is ClientOp.CAS:
            succeeded = register == request.expected
            assert isinstance(result, TxnResult) and result.succeeded is succeeded
            register = request.value if succeeded else register
        elif request.op is ClientOp.PUT:
            register = request.value
        elif request.op is ClientOp.DELETE:
            register = None
        clock.advance_to(now + 1)
        client.on_response(now + 1, ClientResponse(CLIENT_ID_BASE, request.seq, True, result))
        if request.op is ClientOp.GET:
            assert client.history[-1].output == register
    kinds = {op.kind for op in client.history}
    assert kinds == {OpKind.PUT, OpKind.GET, OpKind.CAS, OpKind.DELETE}
    last = sent[-1]
    again, _ = machine.apply(index + 1, last.payload)
    assert again == machine.apply(index + 2, last.payload)[0]  # the kept first answer
    stale, _ = machine.apply(index + 3, sent[-3].payload)
    assert not isinstance(stale, (TxnResult, PutResult))  # already acknowledged


# -- clients ---------------------------------------------------------------------


def _client(seed: int = 1) -> tuple[SimClient, VirtualClock]:
    clock = VirtualClock()
    config = SimConfig(client_get_probability=0.0, client_cas_probability=0.0,
                       client_delete_probability=0.0)
    return SimClient(CLIENT_ID_BASE, random.Random(seed), config, clock.stamp), clock


def _with_session(client: SimClient, clock: VirtualClock) -> None:
    """Answer the client's first request, which opens its session."""
    start = client.wake_ms
    clock.advance_to(start)
    [(_, request)] = client.wake(start, [1, 2, 3])
    assert request.op is ClientOp.OPEN_SESSION
    session = SessionResult(session_id=7, ttl_ms=1_000)
    client.on_response(start, ClientResponse(CLIENT_ID_BASE, request.seq, True, session))
    assert not client.history and not client.busy


_PUT_DONE = TxnResult(succeeded=True, results=(PutResult(),), revision=1)


def test_client_retries_with_same_seq_then_records_unknown() -> None:
    client, clock = _client()
    _with_session(client, clock)
    config = SimConfig()
    sends = []
    now = client.wake_ms
    while now <= config.client_operation_deadline_ms + 100 and not client.history:
        clock.advance_to(now)
        sends.extend(client.wake(now, [1, 2, 3]))
        now += 1
    seqs = {request.seq for _, request in sends}
    assert seqs == {2}
    assert len(sends) > 3
    assert {node for node, _ in sends} == {1, 2, 3}
    [op] = client.history
    assert op.kind is OpKind.PUT and op.ret is None


def test_client_follows_leader_hint_and_records_result() -> None:
    client, clock = _client()
    _with_session(client, clock)
    start = client.wake_ms
    [(node, request)] = client.wake(start, [1, 2, 3])
    clock.advance_to(start + 1)
    hint = 3 if node != 3 else 2
    client.on_response(clock.now_ms, ClientResponse(CLIENT_ID_BASE, request.seq, False, None, hint))
    clock.advance_to(client.wake_ms)
    [(again, retried)] = client.wake(client.wake_ms, [1, 2, 3])
    assert again == hint and retried == request
    client.on_response(clock.now_ms, ClientResponse(CLIENT_ID_BASE, request.seq, True, _PUT_DONE))
    [op] = client.history
    assert op.outcome_known and op.call < op.ret  # type: ignore[operator]
    assert client.completed == 1
    # A late answer to an old attempt is ignored.
    client.on_response(clock.now_ms, ClientResponse(CLIENT_ID_BASE, request.seq, True, _PUT_DONE))
    assert len(client.history) == 1
