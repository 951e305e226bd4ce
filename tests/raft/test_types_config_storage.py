"""Wire values (encode/decode), configuration checks, MemoryStorage, confchange."""

from __future__ import annotations

import pytest

from quorumlog.errors import ConfigError, ProtocolError, UsageError
from quorumlog.raft import (
    BOOTSTRAP_INDEX,
    CompactedError,
    ConfChange,
    ConfChangeError,
    ConfChangeSingle,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    HardState,
    MemoryStorage,
    Message,
    MessageType,
    RaftConfig,
    Snapshot,
    SnapshotMeta,
    SnapshotOutOfDateError,
    UnavailableError,
    decode_message,
    encode_message,
    format_message,
)
from quorumlog.raft._confchange import apply_conf_change, enter_joint, leave_joint, simple

ADD = ConfChangeType.ADD_NODE
REMOVE = ConfChangeType.REMOVE_NODE
LEARNER = ConfChangeType.ADD_LEARNER


def cc(*pairs: tuple[ConfChangeType, int], transition: str = "auto") -> ConfChange:
    return ConfChange(tuple(ConfChangeSingle(t, i) for t, i in pairs), transition)  # type: ignore[arg-type]


def cs(voters: set[int], outgoing: set[int] | None = None, learners: set[int] | None = None,
       learners_next: set[int] | None = None, *, auto_leave: bool = False) -> ConfState:
    return ConfState(frozenset(voters), frozenset(outgoing or ()), frozenset(learners or ()),
                     frozenset(learners_next or ()), auto_leave)


# -- ConfChange / Message encoding -----------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [ConfChange(), cc((ADD, 4)), cc((ADD, 4), (REMOVE, 1), (LEARNER, 9),
                                    transition="joint_explicit")],
)
def test_conf_change_roundtrip(change: ConfChange) -> None:
    assert ConfChange.decode(change.encode()) == change


@pytest.mark.parametrize("data", [b"", b"\xff\x00garbage", ConfChange().encode()[:-1],
                                  b"\x92\x91\x92\x07\x04\xa4auto",  # unknown change type 7
                                  b"\x92\x91\x92\x00\x00\xa4auto",  # node id 0
                                  b"\x92\x90\xa4fast"])  # unknown transition
def test_conf_change_decode_garbage(data: bytes) -> None:
    with pytest.raises(ProtocolError, match="malformed ConfChange"):
        ConfChange.decode(data)


def test_message_roundtrip_and_garbage() -> None:
    snap = Snapshot(meta=SnapshotMeta(index=5, term=2, conf_state=cs({1, 2}, learners={3}),
                                      epoch=4), data=b"state")
    for m in (
        Message(type=MessageType.APP, to=2, from_=1, term=3, index=4, log_term=2, commit=4,
                entries=(Entry(3, 5, EntryType.NORMAL, b"x"), Entry(3, 6, EntryType.CONF_CHANGE,
                                                                   cc((ADD, 4)).encode()))),
        Message(type=MessageType.SNAP, to=2, from_=1, term=3, snapshot=snap),
        Message(type=MessageType.READ_INDEX, to=1, from_=2, context=b"ctx"),
    ):
        assert decode_message(encode_message(m)) == m
    good = encode_message(Message(type=MessageType.VOTE, to=2, from_=1, term=3))
    for garbage in (b"", b"\x00", good[:-1], good + b"\x00", b"\x91\xff"):
        with pytest.raises(ProtocolError, match="malformed raft message"):
            decode_message(garbage)
    with pytest.raises(ProtocolError, match="local-only"):
        decode_message(encode_message(Message(type=MessageType.HUP, to=1, from_=1)))
    negative = encode_message(Message(type=MessageType.VOTE, to=2, from_=1, term=-3))
    with pytest.raises(ProtocolError):
        decode_message(negative)


def test_format_message() -> None:
    assert format_message(Message(type=MessageType.VOTE, to=2, from_=1, term=2, index=5,
                                  log_term=1)) == "1->2 VOTE term=2 log=1/5"
    assert format_message(Message(type=MessageType.APP_RESP, to=1, from_=2, term=2, index=5,
                                  reject=True, reject_hint=3, log_term=1)) == (
        "2->1 APP_RESP term=2 index=5 rejected hint=1/3"
    )


# -- RaftConfig -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"node_id": 0}, "node_id"),
        ({"node_id": 1, "election_timeout_ticks": 1}, "greater than heartbeat"),
        ({"node_id": 1, "heartbeat_interval_ticks": 0}, "heartbeat_interval_ticks"),
        ({"node_id": 1, "max_inflight_messages": 0}, "max_inflight_messages"),
        ({"node_id": 1, "read_only_mode": "lease_based", "check_quorum": False}, "check_quorum"),
        ({"node_id": 1, "max_entry_data_bytes": 10, "max_uncommitted_entries_bytes": 5},
         "max_entry_data_bytes"),
    ],
)
def test_config_validation(fields: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        RaftConfig(**fields).validate()  # type: ignore[arg-type]


def test_config_defaults_are_valid() -> None:
    RaftConfig(node_id=1).validate()
    RaftConfig(node_id=1, read_only_mode="lease_based").validate()


# -- MemoryStorage ----------------------------------------------------------------------


def test_memory_storage_bootstrap_and_empty() -> None:
    boot = MemoryStorage(cs({1, 2, 3}))
    hs, conf = boot.initial_state()
    assert hs == HardState(term=1, commit=BOOTSTRAP_INDEX) and conf.voters == {1, 2, 3}
    assert (boot.first_index(), boot.last_index(), boot.term(1)) == (2, 1, 1)
    empty = MemoryStorage()
    assert empty.initial_state() == (HardState(), ConfState(frozenset()))
    assert (empty.first_index(), empty.last_index(), empty.term(0)) == (1, 0, 0)


def test_memory_storage_append_compact_snapshot() -> None:
    storage = MemoryStorage(cs({1}))
    storage.append([Entry(2, i) for i in range(2, 8)])
    storage.append([Entry(3, 5), Entry(3, 6)])  # replaces 5..7
    assert storage.last_index() == 6 and storage.term(5) == 3
    with pytest.raises(UsageError, match="gap"):
        storage.append([Entry(3, 9)])
    with pytest.raises(UnavailableError):
        storage.entries(2, 9, 1 << 30)
    with pytest.raises(UsageError, match="create a snapshot first"):
        storage.compact(4)
    snap = storage.create_snapshot(4, cs({1}), b"data", 7)
    assert snap.meta == SnapshotMeta(index=4, term=2, conf_state=cs({1}), epoch=7)
    with pytest.raises(SnapshotOutOfDateError):
        storage.create_snapshot(3, cs({1}), b"", 0)
    storage.compact(4)
    assert storage.first_index() == 5 and storage.term(4) == 2
    with pytest.raises(CompactedError):
        storage.entries(4, 6, 1 << 30)
    with pytest.raises(CompactedError):
        storage.compact(3)
    storage.append([Entry(2, 3), Entry(2, 4), Entry(3, 5)])  # compacted prefix skipped
    assert storage.last_index() == 5
    newer = Snapshot(meta=SnapshotMeta(index=10, term=4, conf_state=cs({1, 2}), epoch=9))
    storage.apply_snapshot(newer)
    assert (storage.first_index(), storage.last_index(), storage.snapshot()) == (11, 10, newer)
    with pytest.raises(SnapshotOutOfDateError):
        storage.apply_snapshot(newer)


# -- membership changes (pure) --------------------------------------------------------


def test_simple_changes() -> None:
    assert simple(cs({1, 2, 3}), cc((ADD, 4)).changes) == cs({1, 2, 3, 4})
    assert simple(cs({1, 2, 3}), cc((REMOVE, 3)).changes) == cs({1, 2})
    assert simple(cs({1, 2, 3}), cc((LEARNER, 3)).changes) == cs({1, 2}, learners={3})
    assert simple(cs({1, 2}, learners={3}), cc((ADD, 3)).changes) == cs({1, 2, 3})
    with pytest.raises(ConfChangeError, match="2 voters change"):
        simple(cs({1, 2, 3}), cc((ADD, 4), (ADD, 5)).changes)
    with pytest.raises(ConfChangeError, match="every voter"):
        simple(cs({1}), cc((REMOVE, 1)).changes)
    with pytest.raises(ConfChangeError, match="joint"):
        simple(cs({1, 2}, {1, 2, 3}, auto_leave=True), cc((ADD, 4)).changes)


def test_joint_changes() -> None:
    joint = enter_joint(cs({1, 2, 3}), cc((ADD, 4), (REMOVE, 1)).changes, auto_leave=True)
    assert joint == cs({2, 3, 4}, {1, 2, 3}, auto_leave=True)
    assert leave_joint(joint) == cs({2, 3, 4})
    with pytest.raises(ConfChangeError, match="already joint"):
        enter_joint(joint, cc((ADD, 5)).changes, auto_leave=False)
    with pytest.raises(ConfChangeError, match="not joint"):
        leave_joint(cs({1}))
    # demoting a voter to learner goes through learners_next
    demote = enter_joint(cs({1, 2, 3}), cc((LEARNER, 3)).changes, auto_leave=False)
    assert demote == cs({1, 2}, {1, 2, 3}, learners_next={3})
    assert leave_joint(demote) == cs({1, 2}, learners={3})


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (cc((ADD, 4)), cs({1, 2, 3, 4})),  # auto, one voter: simple
        (cc((ADD, 4), (LEARNER, 5)), cs({1, 2, 3, 4}, learners={5})),  # still one voter
        (cc((ADD, 4), (ADD, 5)), cs({1, 2, 3, 4, 5}, {1, 2, 3}, auto_leave=True)),
        (cc((ADD, 4), transition="joint_implicit"), cs({1, 2, 3, 4}, {1, 2, 3}, auto_leave=True)),
        (cc((ADD, 4), transition="joint_explicit"), cs({1, 2, 3, 4}, {1, 2, 3})),
    ],
)
def test_apply_conf_change_transitions(change: ConfChange, expected: ConfState) -> None:
    assert apply_conf_change(cs({1, 2, 3}), change) == expected


def test_apply_conf_change_errors() -> None:
    with pytest.raises(ConfChangeError, match="nothing to leave"):
        apply_conf_change(cs({1, 2, 3}), ConfChange())
    with pytest.raises(ConfChangeError, match="does nothing"):
        apply_conf_change(cs({1, 2, 3}), ConfChange(transition="joint_explicit"))
