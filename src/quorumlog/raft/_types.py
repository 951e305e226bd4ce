"""Values that go in and out of a Raft core: entries, state, messages, Ready.

Everything here is a frozen msgspec Struct (slots, no per-instance dict) so
values can be shared between the core, storage and the network layer without
copies. Wire structs are ``array_like`` (compact msgpack, field order is the
format) and ``gc=False`` where they only hold scalars and bytes.

Node ids are ints >= 1; :data:`NO_NODE` (0) means "none" (no vote, no leader).
"""

from __future__ import annotations

from enum import IntEnum
from typing import Annotated, Literal

import msgspec

from quorumlog.errors import ProtocolError

NO_NODE = 0
"""The node id meaning "nobody" (no vote cast, no known leader)."""

NonNegative = Annotated[int, msgspec.Meta(ge=0)]
NodeId = Annotated[int, msgspec.Meta(ge=0)]


class EntryType(IntEnum):
    NORMAL = 0
    CONF_CHANGE = 1


class Entry(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One log entry; ``data`` of a CONF_CHANGE entry is ``ConfChange.encode()``."""

    term: NonNegative
    index: NonNegative
    type: EntryType = EntryType.NORMAL
    data: bytes = b""


class HardState(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """What must be on disk before a node answers: term, vote (0 = none), commit."""

    term: NonNegative = 0
    vote: NodeId = 0
    commit: NonNegative = 0


class ConfState(msgspec.Struct, frozen=True, array_like=True):
    """A membership configuration; ``voters_outgoing`` non-empty means joint."""

    voters: frozenset[int]
    voters_outgoing: frozenset[int] = frozenset()
    learners: frozenset[int] = frozenset()
    learners_next: frozenset[int] = frozenset()
    auto_leave: bool = False

    @property
    def is_joint(self) -> bool:
        return bool(self.voters_outgoing)

    @property
    def is_empty(self) -> bool:
        return not (self.voters or self.voters_outgoing or self.learners or self.learners_next)

    def members(self) -> frozenset[int]:
        """Every node id the configuration mentions (voters and learners)."""
        return self.voters | self.voters_outgoing | self.learners | self.learners_next


class ConfChangeType(IntEnum):
    ADD_NODE = 0
    REMOVE_NODE = 1
    ADD_LEARNER = 2


class ConfChangeSingle(msgspec.Struct, frozen=True, array_like=True):
    type: ConfChangeType
    node_id: Annotated[int, msgspec.Meta(ge=1)]


ConfChangeTransition = Literal["auto", "joint_implicit", "joint_explicit"]
"""As etcd's ConfChangeV2: ``auto`` applies a change that alters at most one
voter directly (simple) and uses a joint configuration with automatic leave
otherwise; ``joint_implicit`` always goes joint and leaves automatically;
``joint_explicit`` goes joint and waits for an empty ConfChange to leave."""


class ConfChange(msgspec.Struct, frozen=True, array_like=True):
    """A membership change; an empty change leaves the joint configuration."""

    changes: tuple[ConfChangeSingle, ...] = ()
    transition: ConfChangeTransition = "auto"

    @property
    def leaves_joint(self) -> bool:
        return not self.changes and self.transition == "auto"

    def encode(self) -> bytes:
        return _CONF_CHANGE_ENCODER.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> ConfChange:
        """Decode ``encode()`` output; raises ProtocolError on anything else."""
        try:
            return _CONF_CHANGE_DECODER.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ProtocolError(f"malformed ConfChange ({len(data)} bytes): {exc}") from None


class SnapshotMeta(msgspec.Struct, frozen=True, array_like=True):
    """Where a snapshot sits in the log, the configuration then, and the epoch."""

    index: NonNegative
    term: NonNegative
    conf_state: ConfState
    epoch: NonNegative


class Snapshot(msgspec.Struct, frozen=True, array_like=True):
    """Application state as of ``meta.index``; ``data`` is opaque to the core."""

    meta: SnapshotMeta
    data: bytes = b""


class MessageType(IntEnum):
    HUP = 0  # local: start an election
    BEAT = 1  # local: leader sends heartbeats
    PROP = 2
    APP = 3
    APP_RESP = 4
    VOTE = 5
    VOTE_RESP = 6
    PRE_VOTE = 7
    PRE_VOTE_RESP = 8
    SNAP = 9
    SNAP_STATUS = 10  # local: report_snapshot()
    HEARTBEAT = 11
    HEARTBEAT_RESP = 12
    TRANSFER_LEADER = 13
    TIMEOUT_NOW = 14
    READ_INDEX = 15
    READ_INDEX_RESP = 16
    UNREACHABLE = 17  # local: report_unreachable()
    CHECK_QUORUM = 18  # local: leader checks it heard from a quorum


LOCAL_MESSAGE_TYPES = frozenset(
    {
        MessageType.HUP,
        MessageType.BEAT,
        MessageType.SNAP_STATUS,
        MessageType.UNREACHABLE,
        MessageType.CHECK_QUORUM,
    }
)
"""Types a core makes for itself; they never travel and ``step()`` refuses them."""


class Message(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """A message between cores, as etcd's raftpb.Message.

    ``index``/``log_term`` name a log position (the entry before ``entries``
    for APP, the last entry for VOTE), ``commit`` the sender's commit index,
    ``reject_hint``/``log_term`` the follower's conflict hint on a rejected APP.
    """

    type: MessageType
    to: NodeId
    from_: NodeId
    term: NonNegative = 0
    log_term: NonNegative = 0
    index: NonNegative = 0
    entries: tuple[Entry, ...] = ()
    commit: NonNegative = 0
    reject: bool = False
    reject_hint: NonNegative = 0
    snapshot: Snapshot | None = None
    context: bytes = b""


class Role(IntEnum):
    FOLLOWER = 0
    CANDIDATE = 1
    PRE_CANDIDATE = 2
    LEADER = 3


class SoftState(msgspec.Struct, frozen=True):
    """Volatile state worth telling the application about; never persisted."""

    leader_id: int
    role: Role


class ReadState(msgspec.Struct, frozen=True):
    """A linearizable read may be served once ``applied_index >= index``."""

    index: int
    context: bytes


class Ready(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a core wants done, handed out by ``RaftNode.ready()``.

    The caller handles it in this order, then calls ``advance(ready)``:

    1. persist ``hard_state`` (if not None) and ``entries`` (they may replace a
       suffix of the stored log: drop stored entries at and after
       ``entries[0].index``) and ``snapshot`` (if not None); fsync when
       ``must_sync``;
    2. send ``messages`` (only after step 1: a vote or an append ack must not
       leave before the state it promises is durable);
    3. install ``snapshot`` data in the state machine, then apply
       ``committed_entries`` in order; after them the group's epoch is
       ``epoch``; serve ``read_states`` once their index is applied;
    4. ``advance(ready)``.
    """

    soft_state: SoftState | None
    hard_state: HardState | None
    entries: list[Entry]
    must_sync: bool
    snapshot: Snapshot | None
    messages: list[Message]
    committed_entries: list[Entry]
    read_states: list[ReadState]
    epoch: int


_CONF_CHANGE_ENCODER = msgspec.msgpack.Encoder()
_CONF_CHANGE_DECODER = msgspec.msgpack.Decoder(ConfChange)
_MESSAGE_ENCODER = msgspec.msgpack.Encoder()
_MESSAGE_DECODER = msgspec.msgpack.Decoder(Message)


def encode_message(message: Message) -> bytes:
    """Serialize a message for the network layer (msgpack, array-like)."""
    return _MESSAGE_ENCODER.encode(message)


def decode_message(data: bytes | memoryview) -> Message:
    """Parse ``encode_message`` output; raises ProtocolError on garbage.

    Only the shape is checked here (types, non-negative numbers, no local
    message types); ``RaftNode.step`` checks the rest against its own state.
    """
    try:
        message = _MESSAGE_DECODER.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProtocolError(f"malformed raft message ({len(data)} bytes): {exc}") from None
    if message.type in LOCAL_MESSAGE_TYPES:
        raise ProtocolError(f"raft message of local-only type {message.type.name} on the wire")
    return message


def format_entries(entries: tuple[Entry, ...] | list[Entry]) -> str:
    """``[2/3 2/4c]``: term/index per entry, ``c`` marks a conf change."""
    parts = [
        f"{e.term}/{e.index}" + ("c" if e.type == EntryType.CONF_CHANGE else "") for e in entries
    ]
    return "[" + " ".join(parts) + "]"


def format_message(m: Message) -> str:
    """One line per message, as in transcripts: ``1->2 VOTE term=2 log=1/5``."""
    head = f"{m.from_}->{m.to} {m.type.name} term={m.term}"
    t = m.type
    if t in (MessageType.VOTE, MessageType.PRE_VOTE):
        body = f" log={m.log_term}/{m.index}"
    elif t == MessageType.APP:
        body = f" log={m.log_term}/{m.index} commit={m.commit}"
        if m.entries:
            body += f" entries={format_entries(m.entries)}"
    elif t == MessageType.APP_RESP:
        body = f" index={m.index}"
        if m.reject:
            body += f" rejected hint={m.log_term}/{m.reject_hint}"
    elif t == MessageType.HEARTBEAT:
        body = f" commit={m.commit}"
    elif t == MessageType.SNAP and m.snapshot is not None:
        meta = m.snapshot.meta
        body = f" snap={meta.term}/{meta.index} epoch={meta.epoch}"
    elif t == MessageType.PROP:
        body = f" entries={len(m.entries)}"
    elif t == MessageType.READ_INDEX_RESP:
        body = f" index={m.index}"
    else:
        body = ""
    if m.reject and t != MessageType.APP_RESP:  # APP_RESP says it above
        body += " rejected"
    if m.context:
        body += f" ctx={m.context.decode('utf-8', 'backslashreplace')}"
    return head + body
