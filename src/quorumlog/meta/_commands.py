"""Commands of the metadata state machine and their results (typed, frozen).

Every write that goes through Raft is a :class:`Request`: the client's session,
sequence number and lowest unanswered sequence number (so a retried write is
applied once and answered with its first result) and one command. Reads
are served from the state machine without the log (after ReadIndex, or
serializable on any member), using the same operation types.
"""

from __future__ import annotations

import enum

import msgspec


class CompareTarget(enum.StrEnum):
    VERSION = "version"  # 0 = key absent
    VALUE = "value"
    MOD_REVISION = "mod_revision"
    CREATE_REVISION = "create_revision"


class CompareOp(enum.StrEnum):
    EQUAL = "=="
    NOT_EQUAL = "!="
    LESS = "<"
    GREATER = ">"


class Compare(msgspec.Struct, frozen=True, kw_only=True):
    key: str
    target: CompareTarget
    op: CompareOp = CompareOp.EQUAL
    version: int = 0
    value: bytes = b""
    revision: int = 0


class PutOp(msgspec.Struct, frozen=True, kw_only=True, tag="put"):
    key: str
    value: bytes
    session_id: int = 0  # non-zero: the key is ephemeral, bound to that session
    prev_kv: bool = False


class DeleteOp(msgspec.Struct, frozen=True, kw_only=True, tag="delete"):
    key: str
    prefix: bool = False  # delete every key starting with ``key``
    prev_kv: bool = False


class RangeOp(msgspec.Struct, frozen=True, kw_only=True, tag="range"):
    key: str
    prefix: bool = False
    end: str = ""  # non-empty: the half-open range [key, end)
    limit: int = 0  # 0 = the server maximum
    keys_only: bool = False


Op = PutOp | DeleteOp | RangeOp


class Txn(msgspec.Struct, frozen=True, kw_only=True, tag="txn"):
    compares: tuple[Compare, ...] = ()
    success: tuple[Op, ...] = ()
    failure: tuple[Op, ...] = ()


class CreateSession(msgspec.Struct, frozen=True, kw_only=True, tag="create_session"):
    ttl_ms: int


class RevokeSession(msgspec.Struct, frozen=True, kw_only=True, tag="revoke_session"):
    session_id: int


class NextId(msgspec.Struct, frozen=True, kw_only=True, tag="next_id"):
    name: str
    count: int = 1  # reserve a block of ids


class Compact(msgspec.Struct, frozen=True, kw_only=True, tag="compact"):
    revision: int


Command = Txn | CreateSession | RevokeSession | NextId | Compact


class Request(msgspec.Struct, frozen=True, kw_only=True):
    """One write in the log, with its exactly-once coordinates.

    ``session_id`` names the client's session (a meta session it created and
    keeps alive; 0 = no deduplication, for the service's own proposals).
    ``seq`` numbers the client's writes in that session; a retry reuses it.
    ``first_outstanding_seq`` is the lowest seq of the session whose answer
    the client has not received yet (at most ``seq``): the client acknowledges
    every answer below it, so the state machine may forget those (Raft
    dissertation, section 6.3).
    """

    session_id: int = 0
    seq: int = 0
    first_outstanding_seq: int = 0
    command: Command


class KeyValue(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    session_id: int = 0


class RangeResult(msgspec.Struct, frozen=True, kw_only=True, tag="range"):
    kvs: tuple[KeyValue, ...]
    more: bool = False
    count: int = 0


class PutResult(msgspec.Struct, frozen=True, kw_only=True, tag="put"):
    prev: KeyValue | None = None


class DeleteResult(msgspec.Struct, frozen=True, kw_only=True, tag="delete"):
    deleted: int
    prev: tuple[KeyValue, ...] = ()


OpResult = RangeResult | PutResult | DeleteResult


class TxnResult(msgspec.Struct, frozen=True, kw_only=True, tag="txn"):
    succeeded: bool
    results: tuple[OpResult, ...]
    revision: int


class SessionResult(msgspec.Struct, frozen=True, kw_only=True, tag="session"):
    session_id: int
    ttl_ms: int
    found: bool = True


class IdResult(msgspec.Struct, frozen=True, kw_only=True, tag="id"):
    first: int  # ids first .. first + count - 1 are the caller's


class CompactResult(msgspec.Struct, frozen=True, kw_only=True, tag="compact"):
    compacted_revision: int


class ErrorResult(msgspec.Struct, frozen=True, kw_only=True, tag="error"):
    code: str
    message: str


Result = TxnResult | SessionResult | IdResult | CompactResult | ErrorResult


class EventType(enum.StrEnum):
    PUT = "put"
    DELETE = "delete"


class Event(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    type: EventType
    kv: KeyValue  # for DELETE: key, mod_revision = deletion revision, empty value
    prev: KeyValue | None = None


REQUEST_ENCODER = msgspec.msgpack.Encoder()
REQUEST_DECODER = msgspec.msgpack.Decoder(Request)
RESULT_DECODER = msgspec.msgpack.Decoder(Result)
