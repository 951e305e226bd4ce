"""Meta snapshots stay bounded: the watch history, part of every snapshot, is
bounded in bytes as well as in events, and the bound survives a restore."""

from __future__ import annotations

import pytest

from quorumlog.errors import ConfigError
from quorumlog.meta import CompactedError, MetaLimits, MetaStateMachine, PutOp, Txn
from quorumlog.meta._state import EVENT_OVERHEAD_BYTES

from .test_state import Log

KIB = 1024
MIB = 1024 * KIB


def put(key: str, value: bytes) -> Txn:
    return Txn(success=(PutOp(key=key, value=value),))


def test_history_is_bounded_by_bytes_not_only_by_events() -> None:
    limits = MetaLimits(history_events_max=100_000, history_bytes_max=1 * MIB)
    log = Log(MetaStateMachine(limits))
    for i in range(100):  # 100 puts of 100 KiB over one key: 20 MiB with the previous values
        log.apply(put("/big", bytes([i]) * (100 * KIB)))
    sm = log.sm
    assert 0 < sm.history_bytes <= 1 * MIB
    assert sm.compacted_revision >= 90
    with pytest.raises(CompactedError):
        sm.events_since(1, "/big", prefix=False)
    assert [e.kv.value[0] for e in sm.events_since(sm.compacted_revision + 1, "/big",
                                                   prefix=False)][-1] == 99
    # The snapshot holds the live value and at most the bounded history.
    assert len(sm.snapshot()) < 100 * KIB + 1 * MIB + 64 * KIB


def test_the_newest_revision_is_kept_even_when_larger_than_the_bound() -> None:
    log = Log(MetaStateMachine(MetaLimits(history_bytes_max=10 * KIB)))
    log.apply(put("/a", b"x" * (20 * KIB)))
    log.apply(put("/b", b"y" * (30 * KIB)))
    events = log.sm.events_since(log.sm.revision, "/", prefix=True)
    assert [e.kv.key for e in events] == ["/b"]
    assert log.sm.history_bytes == EVENT_OVERHEAD_BYTES + len("/b") + 30 * KIB


def test_history_bytes_survive_a_snapshot_and_members_stay_identical() -> None:
    limits = MetaLimits(history_bytes_max=64 * KIB)
    original = Log(MetaStateMachine(limits))
    for i in range(20):
        original.apply(put(f"/k/{i % 3}", bytes([i]) * (5 * KIB)))
    restored_sm = MetaStateMachine(limits)
    restored_sm.restore(original.sm.snapshot())
    assert restored_sm.history_bytes == original.sm.history_bytes
    restored = Log(restored_sm)
    for i in range(20, 60):
        command = put(f"/k/{i % 3}", bytes([i]) * (5 * KIB))
        assert original.apply(command) == restored.apply(command)
        assert original.sm.history_bytes == restored.sm.history_bytes <= 64 * KIB
    assert original.sm.snapshot() == restored.sm.snapshot()


def test_the_byte_bound_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="history_bytes_max"):
        MetaLimits(history_bytes_max=0).validate()
