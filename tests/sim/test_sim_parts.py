"""The simulator's parts on their own: network, disk, clock, KV state machine, clients."""

from __future__ import annotations

import random

import pytest

from quorumlog.errors import ConfigError, InvariantViolation, ProtocolError
from quorumlog.sim._client import CLIENT_ID_BASE, ClientResponse, SimClient
from quorumlog.sim._clock import TimerQueue, VirtualClock
from quorumlog.sim._config import MIXES, FaultMix, SimConfig, mix_for_seed
from quorumlog.sim._disk import SimDisk
from quorumlog.sim._kv import KvCommand, KvOp, KvStateMachine, decode_command, encode_command
from quorumlog.sim._linearizability import OpKind
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


# -- key-value state machine -----------------------------------------------------


def _cmd(client: int, seq: int, op: KvOp, key: str = "k", value: str | None = None,
         expected: str | None = None) -> KvCommand:
    return KvCommand(client, seq, op, key, value, expected)


def test_kv_put_get_cas() -> None:
    kv = KvStateMachine()
    assert kv.apply(_cmd(1, 1, KvOp.PUT, value="a")).result is None
    assert kv.apply(_cmd(1, 2, KvOp.GET)).result == "a"
    assert kv.apply(_cmd(1, 3, KvOp.CAS, value="b", expected="x")).result is False
    assert kv.apply(_cmd(1, 4, KvOp.CAS, value="b", expected="a")).result is True
    assert kv.get("k") == "b"


def test_kv_retried_write_is_applied_once() -> None:
    kv = KvStateMachine()
    first = kv.apply(_cmd(1, 1, KvOp.CAS, value="a", expected=None))
    assert first.result is True
    kv.apply(_cmd(2, 1, KvOp.PUT, value="z"))
    again = kv.apply(_cmd(1, 1, KvOp.CAS, value="a", expected=None))
    assert again.duplicate and again.result is True
    assert kv.get("k") == "z"
    kv.apply(_cmd(1, 2, KvOp.PUT, value="c"))
    stale = kv.apply(_cmd(1, 1, KvOp.PUT, value="old"))
    assert stale.stale
    assert kv.get("k") == "c"


def test_kv_snapshot_round_trip_and_digest() -> None:
    kv = KvStateMachine()
    for index in range(1, 6):
        command = _cmd(1, index, KvOp.PUT, key=f"k{index % 2}", value=str(index))
        kv.note_entry(index, 1, encode_command(command))
        kv.apply(command)
    restored = KvStateMachine.at_snapshot(kv.snapshot(), 5)
    assert restored == kv
    other = KvStateMachine()
    other.note_entry(1, 2, b"")
    assert other.digest != KvStateMachine().digest
    with pytest.raises(InvariantViolation):
        KvStateMachine.at_snapshot(kv.snapshot(), 4)
    with pytest.raises(InvariantViolation):
        kv.note_entry(9, 1, b"")


def test_kv_command_codec() -> None:
    command = _cmd(3, 4, KvOp.CAS, value="n", expected="o")
    assert decode_command(encode_command(command)) == command
    with pytest.raises(ProtocolError):
        decode_command(b"\xff\x00")


# -- clients ---------------------------------------------------------------------


def _client(seed: int = 1) -> tuple[SimClient, VirtualClock]:
    clock = VirtualClock()
    config = SimConfig(client_get_probability=0.0, client_cas_probability=0.0)
    return SimClient(CLIENT_ID_BASE, random.Random(seed), config, clock.stamp), clock


def test_client_retries_with_same_seq_then_records_unknown() -> None:
    client, clock = _client()
    config = SimConfig()
    sends = []
    now = 0
    while now <= config.client_operation_deadline_ms + 100 and not client.history:
        clock.advance_to(now)
        sends.extend(client.wake(now, [1, 2, 3]))
        now += 1
    seqs = {request.seq for _, request in sends}
    assert seqs == {1}
    assert len(sends) > 3
    assert {node for node, _ in sends} == {1, 2, 3}
    [op] = client.history
    assert op.kind is OpKind.PUT and op.ret is None


def test_client_follows_leader_hint_and_records_result() -> None:
    client, clock = _client()
    start = client.wake_ms
    [(node, request)] = client.wake(start, [1, 2, 3])
    clock.advance_to(start + 1)
    hint = 3 if node != 3 else 2
    client.on_response(clock.now_ms, ClientResponse(CLIENT_ID_BASE, request.seq, False, None, hint))
    clock.advance_to(client.wake_ms)
    [(again, retried)] = client.wake(client.wake_ms, [1, 2, 3])
    assert again == hint and retried == request
    client.on_response(clock.now_ms, ClientResponse(CLIENT_ID_BASE, request.seq, True, None))
    [op] = client.history
    assert op.outcome_known and op.call < op.ret  # type: ignore[operator]
    assert client.completed == 1
    # A late answer to an old attempt is ignored.
    client.on_response(clock.now_ms, ClientResponse(CLIENT_ID_BASE, request.seq, True, None))
    assert len(client.history) == 1
