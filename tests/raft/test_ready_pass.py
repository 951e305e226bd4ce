"""The ready pass on its own: the order of persist, install, send, apply, advance."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from quorumlog.raft import (
    ConfState,
    Entry,
    HardState,
    MemoryReadyStorage,
    MemoryStorage,
    Message,
    MessageType,
    RaftConfig,
    RaftNode,
    Ready,
    ReadyPass,
    Role,
    Snapshot,
)

ELECTION_TIMEOUT_TICKS = 10


@dataclass(slots=True)
class _Log:
    events: list[str] = field(default_factory=list)


class _RecordingStorage:
    """MemoryReadyStorage that writes what it does into the shared log."""

    def __init__(self, name: str, memory: MemoryStorage, log: _Log) -> None:
        self.inner = MemoryReadyStorage(memory)
        self.name = name
        self.log = log

    def persist(self, hard_state: HardState | None, entries: list[Entry],
                snapshot: Snapshot | None, *, must_sync: bool) -> None:
        self.log.events.append(f"persist {self.name} sync={must_sync}")
        self.inner.persist(hard_state, entries, snapshot, must_sync=must_sync)

    def install(self, hard_state: HardState | None, entries: list[Entry],
                snapshot: Snapshot | None) -> None:
        self.log.events.append(f"install {self.name}")
        self.inner.install(hard_state, entries, snapshot)


@dataclass(frozen=True, slots=True)
class _Group:
    group_id: int
    node: RaftNode
    storage: _RecordingStorage


@dataclass(slots=True)
class _Transport:
    log: _Log
    sent: list[tuple[int, Message]] = field(default_factory=list)

    def send(self, messages: Sequence[tuple[int, Message]]) -> None:
        groups = sorted({group_id for group_id, _ in messages})
        self.log.events.append(f"send groups={groups}")
        self.sent.extend(messages)


def _group(group_id: int, node_id: int, voters: frozenset[int], log: _Log) -> _Group:
    memory = MemoryStorage(ConfState(voters=voters))
    config = RaftConfig(node_id=node_id, election_timeout_ticks=ELECTION_TIMEOUT_TICKS,
                        heartbeat_interval_ticks=1, pre_vote=False)
    node = RaftNode(config, memory, random.Random(group_id))
    return _Group(group_id, node, _RecordingStorage(f"g{group_id}", memory, log))


def _campaign(group: _Group) -> None:
    for _ in range(2 * ELECTION_TIMEOUT_TICKS):
        group.node.tick()


def test_leaders_send_before_persisting_everyone_else_after() -> None:
    log = _Log()
    transport = _Transport(log)
    applied: list[int] = []

    def apply(group: _Group, ready: Ready) -> None:
        log.events.append(f"apply g{group.group_id}")
        applied.extend(e.index for e in ready.committed_entries)

    ready_pass: ReadyPass[_Group] = ReadyPass(transport, apply)
    solo = _group(1, 1, frozenset({1}), log)  # a one-member group leads at once
    _campaign(solo)
    assert ready_pass.run([solo]) is not None
    while ready_pass.run([solo]) is not None:
        pass
    assert solo.node.role is Role.LEADER
    candidate = _group(2, 1, frozenset({1, 2, 3}), log)
    _campaign(candidate)
    solo.node.propose(b"x")
    log.events.clear()
    transport.sent.clear()
    pending = ready_pass.begin([solo, candidate])
    assert pending is not None and pending.needs_sync
    # Only the candidate sends anything (votes), and only after persisting.
    assert log.events == []
    pending.persist()
    ready_pass.finish(pending)
    assert log.events == [
        "persist g1 sync=True", "persist g2 sync=True", "install g1", "install g2",
        "send groups=[2]", "apply g1", "apply g2",
    ]
    assert {m.type for _, m in transport.sent} == {MessageType.VOTE}
    assert candidate.node.role is Role.CANDIDATE


def test_leader_messages_leave_before_its_write_and_apply_runs_before_advance() -> None:
    log = _Log()
    transport = _Transport(log)
    after_advance: list[int] = []
    leader = _group(1, 1, frozenset({1, 2}), log)
    _campaign(leader)

    def apply(group: _Group, ready: Ready) -> Callable[[], None] | None:
        log.events.append("apply")
        if not ready.committed_entries:
            return None
        applied_before = group.node.applied_index
        return lambda: after_advance.append(group.node.applied_index - applied_before)

    ready_pass: ReadyPass[_Group] = ReadyPass(transport, apply)
    ready_pass.run([leader])  # campaign: votes to 2
    vote = next(m for _, m in transport.sent if m.type is MessageType.VOTE)
    leader.node.step(Message(type=MessageType.VOTE_RESP, from_=2, to=1, term=vote.term))
    assert leader.node.role is Role.LEADER
    log.events.clear()
    pending = ready_pass.begin([leader])
    assert pending is not None
    assert log.events == ["send groups=[1]"]  # the leader's appends, before persisting
    pending.persist()
    ready_pass.finish(pending)
    assert log.events == ["send groups=[1]", "persist g1 sync=True", "install g1", "apply"]
    last = leader.node.last_index
    leader.node.step(Message(type=MessageType.APP_RESP, from_=2, to=1, term=vote.term,
                             index=last))
    while ready_pass.run([leader]) is not None:
        pass
    assert after_advance and after_advance[-1] > 0  # ran after advance() moved applied


def test_no_ready_is_no_pass() -> None:
    log = _Log()
    group = _group(1, 1, frozenset({1, 2, 3}), log)
    ready_pass: ReadyPass[_Group] = ReadyPass(_Transport(log), lambda g, r: None)
    while ready_pass.run([group]) is not None:
        pass
    assert ready_pass.begin([group]) is None
    assert ready_pass.run([group]) is None
