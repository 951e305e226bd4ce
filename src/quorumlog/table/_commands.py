"""Table writes as Raft log commands, and the pure rules they follow.

A partition's leader turns each client write request into one
:class:`TableEntry` stamped with one timestamp (microseconds, from its
:class:`~quorumlog.table.TimetagClock`). Every replica applies the entry with
that timestamp, never its own clock, so TTLs and timetags come out the same on
every replica. The write requests that reach a leader between two Raft ready
passes share one log entry (:func:`combine_entries`: a list of TableEntry, each
with its own timestamp, client session and results; ``TableEntry`` alone is the
one-request form). Names and semantics follow Pegasus's client API (``set``,
``multi_set``, ``del``, ``multi_del``, ``incr``, ``check_and_set``,
``check_and_mutate``) and its check types (``cas_check_type``).
"""

from __future__ import annotations

import enum

import msgspec

from quorumlog.errors import invariant
from quorumlog.raft import combine_msgpack
from quorumlog.table._errors import NotAnIntegerError

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1


class CheckType(enum.IntEnum):
    """What ``check_and_set``/``check_and_mutate`` test (Pegasus ``cas_check_type``)."""

    NO_CHECK = 0
    VALUE_NOT_EXIST = 1
    VALUE_NOT_EXIST_OR_EMPTY = 2
    VALUE_EXIST = 3
    VALUE_NOT_EMPTY = 4
    MATCH_ANYWHERE = 5
    MATCH_PREFIX = 6
    MATCH_POSTFIX = 7
    BYTES_LESS = 8
    BYTES_LESS_OR_EQUAL = 9
    BYTES_EQUAL = 10
    BYTES_GREATER_OR_EQUAL = 11
    BYTES_GREATER = 12
    INT_LESS = 13
    INT_LESS_OR_EQUAL = 14
    INT_EQUAL = 15
    INT_GREATER_OR_EQUAL = 16
    INT_GREATER = 17


_INT_CHECKS = {CheckType.INT_LESS, CheckType.INT_LESS_OR_EQUAL, CheckType.INT_EQUAL,
               CheckType.INT_GREATER_OR_EQUAL, CheckType.INT_GREATER}


def parse_int64(raw: bytes, what: str) -> int:
    """A decimal 64-bit integer as Pegasus stores counters; empty is 0."""
    if not raw:
        return 0
    text = raw.strip()
    if text != raw or not text.lstrip(b"-").isdigit():
        raise NotAnIntegerError(f"{what} {raw[:40]!r} is not a decimal integer")
    number = int(text)
    if not INT64_MIN <= number <= INT64_MAX:
        raise NotAnIntegerError(f"{what} {raw[:40]!r} does not fit in 64 bits")
    return number


def check_passes(check: CheckType, operand: bytes, current: bytes | None) -> bool:
    """Whether the check holds for the current value (None: no live value).

    Raises :class:`NotAnIntegerError` for an integer compare whose operand or
    current value is not an integer (Pegasus answers ERR_INVALID_ARGUMENT).
    """
    if check is CheckType.NO_CHECK:
        return True
    if check is CheckType.VALUE_NOT_EXIST:
        return current is None
    if check is CheckType.VALUE_NOT_EXIST_OR_EMPTY:
        return not current
    if check is CheckType.VALUE_EXIST:
        return current is not None
    if check is CheckType.VALUE_NOT_EMPTY:
        return bool(current)
    if current is None:
        return False  # every compare below needs a value
    if check is CheckType.MATCH_ANYWHERE:
        return operand in current
    if check is CheckType.MATCH_PREFIX:
        return current.startswith(operand)
    if check is CheckType.MATCH_POSTFIX:
        return current.endswith(operand)
    if check in _INT_CHECKS:
        left = parse_int64(current, "the checked value")
        right = parse_int64(operand, "the check operand")
        return _compare(check, left, right)
    return _compare(check, current, operand)


def _compare(check: CheckType, left: bytes | int, right: bytes | int) -> bool:
    kind = check.value - (CheckType.INT_LESS if check in _INT_CHECKS else CheckType.BYTES_LESS)
    if kind == 0:
        return left < right  # type: ignore[operator]
    if kind == 1:
        return left <= right  # type: ignore[operator]
    if kind == 2:
        return left == right
    if kind == 3:
        return left >= right  # type: ignore[operator]
    return left > right  # type: ignore[operator]


# ----- commands ------------------------------------------------------------------------------


class SetCommand(msgspec.Struct, frozen=True, tag="set"):
    hash_key: bytes
    sort_key: bytes
    value: bytes
    ttl_s: int = 0  # 0: no TTL


class MultiSetCommand(msgspec.Struct, frozen=True, tag="multi_set"):
    hash_key: bytes
    items: tuple[tuple[bytes, bytes], ...]  # (sort_key, value)
    ttl_s: int = 0


class DeleteCommand(msgspec.Struct, frozen=True, tag="del"):
    hash_key: bytes
    sort_key: bytes


class MultiDeleteCommand(msgspec.Struct, frozen=True, tag="multi_del"):
    hash_key: bytes
    sort_keys: tuple[bytes, ...]


class IncrCommand(msgspec.Struct, frozen=True, tag="incr"):
    hash_key: bytes
    sort_key: bytes
    increment: int
    # Pegasus's expire_ts_seconds of incr: 0 keeps the record's TTL, > 0 sets
    # a new TTL of that many seconds, < 0 removes the TTL.
    ttl_s: int = 0


class Mutation(msgspec.Struct, frozen=True):
    sort_key: bytes
    value: bytes | None  # None: delete
    ttl_s: int = 0


class CheckAndMutateCommand(msgspec.Struct, frozen=True, tag="check_and_mutate"):
    """``check_and_set`` is the one-mutation case."""

    hash_key: bytes
    check_sort_key: bytes
    check_type: CheckType
    check_operand: bytes
    mutations: tuple[Mutation, ...]
    return_check_value: bool = False


class DuplicateCommand(msgspec.Struct, frozen=True, tag="dup"):
    """Records of one hash_key shipped from another cluster (duplication,
    docs/duplication.md), each with the timetag it got where it was written:
    ``(sort_key, value, expire_ts_s, timetag)``; a timetag with the delete flag
    is a tombstone (empty value). Applied last-writer-wins: a record whose
    timetag is not above the stored record's (or tombstone's) is dropped.
    A duplicate write is never shipped again, so two-way duplication has no
    loops."""

    hash_key: bytes
    records: tuple[tuple[bytes, bytes, int, int], ...]


WriteCommand = (SetCommand | MultiSetCommand | DeleteCommand | MultiDeleteCommand
                | IncrCommand | CheckAndMutateCommand | DuplicateCommand)

NON_IDEMPOTENT_COMMANDS = (IncrCommand, CheckAndMutateCommand)
"""Writes whose outcome depends on the value they find: refused on a duplicated
table unless it allows them (the other cluster's concurrent writes do not add up
under last-writer-wins)."""


class CollectGarbage(msgspec.Struct, frozen=True):
    """Tombstone collection as a Raft entry (docs/duplication.md, "Tombstone
    GC"), so every replica drops the same records at the same decree: a
    duplicate write applied later meets the same state on every replica.

    A record goes when it is a tombstone or expired (at the entry's timestamp)
    and its timetag's timestamp is at or below ``horizon_us`` (< 0: nothing
    goes). The leader reads the store's ``gc_mark`` (the decree of the last
    collection) and bounds the horizon by the entries between the
    duplications' ``confirmed_decree`` and the mark; with ``unshipped_bound``
    the store bounds it by the entries applied after the mark as well, so no
    tombstone a duplication has not shipped goes. An entry whose
    ``mark_decree`` is not the store's mark any more (another leader's
    collection came first) collects nothing.
    """

    mark_decree: int
    horizon_us: int
    unshipped_bound: bool


class TableEntry(msgspec.Struct, frozen=True):
    """One Raft log entry of a partition: writes applied in order, one timestamp.

    ``client_id`` > 0 makes the entry exactly-once: ``seq`` is the write's
    number among the client's writes to this partition and
    ``first_outstanding_seq`` the lowest one the client still waits for
    (table/_sessions.py). 0: no deduplication (a retry may apply twice).
    """

    timestamp_us: int
    commands: tuple[WriteCommand, ...]
    client_id: int = 0
    seq: int = 0
    first_outstanding_seq: int = 0
    gc: CollectGarbage | None = None  # a collection entry (no commands); see CollectGarbage


def has_local_writes(entry: TableEntry) -> bool:
    """Whether the entry has a write of this cluster, one duplication ships
    (the records it writes carry the entry's timestamp); duplicate writes and
    collections are not shipped."""
    return any(not isinstance(command, DuplicateCommand) for command in entry.commands)


# ----- results ---------------------------------------------------------------------------------


class Done(msgspec.Struct, frozen=True, tag="done"):
    pass


class IncrResult(msgspec.Struct, frozen=True, tag="incr"):
    value: int


class CheckResult(msgspec.Struct, frozen=True, tag="check"):
    succeeded: bool
    check_value_exist: bool = False
    check_value: bytes | None = None  # only with return_check_value


class Refused(msgspec.Struct, frozen=True, tag="refused"):
    """The command was not applied; every replica refuses it the same way.

    ``code`` is empty for a bad command, else a session refusal of the whole
    write (table/_sessions.py: ``session_expired``, ``stale_sequence``,
    ``bad_sequence``) or ``non_idempotent`` (an incr or check_and_mutate on a
    duplicated table that does not allow them).
    """

    message: str
    code: str = ""


NON_IDEMPOTENT_REFUSED = "non_idempotent"

WriteResult = Done | IncrResult | CheckResult | Refused

_ENTRY_ENCODER = msgspec.msgpack.Encoder()
_ENTRY_DECODER = msgspec.msgpack.Decoder(TableEntry)
_LOG_ENTRY_DECODER = msgspec.msgpack.Decoder(TableEntry | list[TableEntry])
def encode_entry(entry: TableEntry) -> bytes:
    return _ENTRY_ENCODER.encode(entry)


def decode_entry(raw: bytes) -> TableEntry:
    """One encoded TableEntry (the one-request form)."""
    return _ENTRY_DECODER.decode(raw)


def combine_entries(encoded: list[bytes]) -> bytes:
    """Encoded TableEntries as one log entry, a msgpack array of them (the
    encodings are reused as they are). A collection entry is never combined
    (its scan reads the store, not the writes of the entry it would share)."""
    return combine_msgpack(encoded)


def decode_log_entry(raw: bytes) -> TableEntry | list[TableEntry]:
    """A partition's log entry: one TableEntry, or the list :func:`combine_entries` made."""
    entry: TableEntry | list[TableEntry] = _LOG_ENTRY_DECODER.decode(raw)
    if isinstance(entry, list):
        invariant(bool(entry) and all(e.gc is None for e in entry),
                  "a combined table entry holds one write entry at least and no collection")
    return entry


def entries_of(raw: bytes) -> list[TableEntry]:
    """The TableEntries of a log entry, in the order they apply."""
    entry = decode_log_entry(raw)
    return entry if isinstance(entry, list) else [entry]
