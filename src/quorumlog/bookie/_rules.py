"""The bookie's request rules, free of I/O: what a request changes and which
journal records make the change durable.

Each rule takes a :class:`LedgerStore` (``LedgerStorage`` in the server,
``MemoryLedgerStore`` in the simulator), applies the request's change to it
(the per-ledger rules are ``LedgerTable``'s: master key, fencing, LACs,
duplicates) and returns the journal records to append, in order. The caller
appends them without awaiting in between (journal order is storage order),
awaits the last one where the request is answered only once durable, and
answers. The server's handlers (``_handlers.py``) and the simulated bookie
(``quorumlog.sim``) call the same functions, so the simulator checks these
rules, not a copy of them.

Adds without the journal (``FLAG_RECOVERY | FLAG_NO_JOURNAL``, auto-recovery's
copies; :func:`add_flags`). The journal carries three things for an add:

- the entry data: left out. The entry sits in the write cache only, and the
  add is answered at once; it is durable after the next storage flush
  (periodic, or a ``FlushLedgerRequest``), whose synced index batch also
  holds the ledger's record (last entry id, piggybacked LAC) taken in the
  same swap as the entries. A crash before that loses the entry and the LAC
  it carried together; nothing depends on them, since the copier names this
  bookie in the ledger's metadata only after the flush answered.
- the master key record of a ledger new to this bookie: still journaled (a
  few bytes, not awaited). Without it, a later journaled add of the same
  ledger - which skips the key because the ledger is known - would replay
  after a crash with its key neither in the journal nor in storage, and the
  bookie would refuse to start (journal replay's CorruptionError).
- fencing: a recovery add never fences, and the fenced flag is journaled by
  the fence that set it; nothing to keep.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from quorumlog.bookie._bookie_config import BookieConfig
from quorumlog.bookie._journal import FenceRecord, KeyRecord, LacRecord, encode_control
from quorumlog.bookie._ledgers import LedgerInfo
from quorumlog.bookie._limbo import limbo_error
from quorumlog.errors import InvariantViolation, QuorumlogError, UsageError
from quorumlog.proto import (
    ADD_BATCH_ENTRIES_MAX,
    FLAG_NO_JOURNAL,
    FLAG_RECOVERY,
    BadEnvelopeError,
    EntryInLimboError,
    EntryTooLargeError,
    Envelope,
    NoSuchEntryError,
    NoSuchLedgerError,
    crc32c_add_lacs,
    parse_envelope,
)


class LedgerStore(Protocol):
    """What the rules and journal replay need of a ledger storage."""

    def ledger_exists(self, ledger_id: int) -> bool: ...

    def ledger_info(self, ledger_id: int) -> LedgerInfo: ...

    def set_master_key(self, ledger_id: int, master_key: bytes) -> None: ...

    def set_fenced(self, ledger_id: int) -> int: ...

    def set_explicit_lac(self, ledger_id: int, lac: int) -> None: ...

    def last_add_confirmed(self, ledger_id: int) -> int: ...

    def delete_ledger(self, ledger_id: int) -> bool: ...

    def add(self, ledger_id: int, entry_id: int, data: bytes, *, master_key: bytes,
            piggyback_lac: int = ..., recovery: bool = ...) -> bool: ...

    def add_many(self, ledger_id: int, entries: Sequence[tuple[int, bytes, int]], *,
                 master_key: bytes, recovery: bool = ...) -> dict[int, QuorumlogError]: ...

    def get_entry(self, ledger_id: int, entry_id: int) -> bytes: ...


@dataclass(frozen=True, slots=True)
class JournalWrite:
    """What makes a request's change durable: ``records`` to journal in order;
    with ``answer_when_durable`` the request is answered once the last one is
    durable, else at once (the records are durable with the next fsync)."""

    records: tuple[bytes, ...]
    answer_when_durable: bool


def parse_add(data: bytes, ledger_id: int, entry_id: int) -> Envelope:
    """The envelope of an add (structure, CRC32C), which must hold the entry the
    request names (BadEnvelopeError otherwise)."""
    envelope = parse_envelope(data)
    if envelope.ledger_id != ledger_id or envelope.entry_id != entry_id:
        raise BadEnvelopeError(
            f"envelope holds entry {envelope.ledger_id}:{envelope.entry_id} but the "
            f"request adds {ledger_id}:{entry_id}")
    return envelope


@dataclass(frozen=True, slots=True)
class AddFlags:
    """What an add's flags ask: ``recovery`` (fencing does not refuse it) and
    ``journal_data`` (False: ``FLAG_NO_JOURNAL``, see the module docstring)."""

    recovery: bool
    journal_data: bool


def add_flags(flags: int) -> AddFlags:
    """The meaning of an add's flags; ``FLAG_NO_JOURNAL`` without
    ``FLAG_RECOVERY`` is refused with UsageError (a writer's add must be durable
    when answered)."""
    recovery = bool(flags & FLAG_RECOVERY)
    if flags & FLAG_NO_JOURNAL and not recovery:
        raise UsageError(
            "FLAG_NO_JOURNAL is only valid with FLAG_RECOVERY: an add without the journal is "
            "durable only after a FlushLedgerRequest, which only a recovery copy waits for; "
            "send the add without FLAG_NO_JOURNAL")
    return AddFlags(recovery=recovery, journal_data=not flags & FLAG_NO_JOURNAL)


def _key_only(ledger_id: int, master_key: bytes, keyed: bool) -> JournalWrite:
    """What an add without the journal writes: the key record of a ledger new to
    the store (not awaited: the add is answered at once)."""
    records = () if keyed else (encode_control(KeyRecord(ledger_id, master_key)),)
    return JournalWrite(records, answer_when_durable=False)


def add_entry(store: LedgerStore, ledger_id: int, entry_id: int, data: bytes,
              master_key: bytes, *, recovery: bool, keyed: bool = False,
              journal_data: bool = True) -> JournalWrite:
    """Apply an add; the records to journal: the master key of a ledger new to
    the store first (``keyed``: the caller knows it is not new), then the
    envelope, whose durability answers the add. Without ``journal_data`` only
    the key record (see the module docstring), answered at once."""
    envelope = parse_add(data, ledger_id, entry_id)
    keyed = keyed or store.ledger_exists(ledger_id)
    store.add(ledger_id, entry_id, data, master_key=master_key,
              piggyback_lac=envelope.lac, recovery=recovery)
    if not journal_data:
        return _key_only(ledger_id, master_key, keyed)
    if keyed:
        return JournalWrite((data,), answer_when_durable=True)
    return JournalWrite((encode_control(KeyRecord(ledger_id, master_key)), data),
                        answer_when_durable=True)


@dataclass(frozen=True, slots=True)
class BatchAdd:
    """What a batch of adds did: one journal write covering every accepted
    entry (answered once its last record is durable), and each entry's error
    in request order (None: accepted)."""

    write: JournalWrite
    errors: tuple[QuorumlogError | None, ...]


def split_batch(payload: bytes | memoryview, entry_ids: Sequence[int],
                sizes: Sequence[int]) -> list[tuple[int, bytes]]:
    """The (entry id, envelope) pairs of an ``AddEntriesRequest``, copied out of
    the payload; a malformed batch (count over ``ADD_BATCH_ENTRIES_MAX``, sizes
    that do not add up to the payload, ids not strictly ascending) is refused
    whole with BadEnvelopeError."""
    count = len(entry_ids)
    if not 0 < count <= ADD_BATCH_ENTRIES_MAX:
        raise BadEnvelopeError(
            f"a batch of adds holds 1 to {ADD_BATCH_ENTRIES_MAX} entries, not {count}")
    if len(sizes) != count or any(size < 0 for size in sizes) or sum(sizes) != len(payload):
        raise BadEnvelopeError(
            f"a batch of {count} adds has {len(sizes)} sizes summing to {sum(sizes)} "
            f"for a payload of {len(payload)} bytes")
    if any(b <= a for a, b in itertools.pairwise(entry_ids)):
        raise BadEnvelopeError("the entry ids of a batch of adds must be strictly ascending")
    view = memoryview(payload)
    entries: list[tuple[int, bytes]] = []
    offset = 0
    for entry_id, size in zip(entry_ids, sizes, strict=True):
        entries.append((entry_id, bytes(view[offset:offset + size])))
        offset += size
    return entries


def add_entries(store: LedgerStore, ledger_id: int, entries: Sequence[tuple[int, bytes]],
                master_key: bytes, *, recovery: bool, entry_max_bytes: int,
                keyed: bool = False, journal_data: bool = True) -> BatchAdd:
    """Apply a batch of adds to one ledger, in order, each with the outcome of
    :func:`add_entry` (an entry over ``entry_max_bytes`` is refused with
    EntryTooLargeError first, as the server does for a single add). One
    entry's error does not stop the others; the accepted entries' records are
    journaled together, in order (the master key of a ledger new to the
    store first).

    In bulk: the CRC32C envelopes are checked in one pass
    (``crc32c_add_lacs``; others and failures go through :func:`parse_add`
    for the precise error), then ``store.add_many`` stores them under one
    check of the ledger's key and fencing (a ledger-wide error is every
    checked entry's error). Without ``journal_data`` only the key record of a
    ledger new to the store is journaled, and the batch is answered at once
    (see the module docstring)."""
    errors: list[QuorumlogError | None] = [None] * len(entries)
    checked: list[tuple[int, bytes, int]] = []
    positions: list[int] = []
    for position, ((entry_id, data), quick_lac) in enumerate(
            zip(entries, crc32c_add_lacs(entries, ledger_id), strict=True)):
        if len(data) > entry_max_bytes:
            errors[position] = EntryTooLargeError(
                f"entry {ledger_id}:{entry_id} has {len(data)} bytes, over entry_max_bytes "
                f"{entry_max_bytes}")
            continue
        lac = quick_lac
        if lac is None:
            try:
                lac = parse_add(data, ledger_id, entry_id).lac
            except InvariantViolation:
                raise  # a bug, not one entry's bad input
            except QuorumlogError as exc:
                errors[position] = exc
                continue
        checked.append((entry_id, data, lac))
        positions.append(position)
    if not checked:
        return BatchAdd(JournalWrite((), answer_when_durable=False), tuple(errors))
    keyed = keyed or store.ledger_exists(ledger_id)
    try:
        failed = store.add_many(ledger_id, checked, master_key=master_key, recovery=recovery)
    except InvariantViolation:
        raise  # a bug, not the batch's bad input
    except QuorumlogError as exc:
        for position in positions:
            errors[position] = exc
        return BatchAdd(JournalWrite((), answer_when_durable=False), tuple(errors))
    if failed:
        for index, error in failed.items():
            errors[positions[index]] = error
    if not journal_data:
        accepted = len(failed) < len(checked)
        return BatchAdd(_key_only(ledger_id, master_key, keyed or not accepted), tuple(errors))
    if failed:
        records = [data for index, (_, data, _) in enumerate(checked) if index not in failed]
    else:
        records = [data for _, data, _ in checked]
    if records and not keyed:
        records.insert(0, encode_control(KeyRecord(ledger_id, master_key)))
    return BatchAdd(JournalWrite(tuple(records), answer_when_durable=bool(records)),
                    tuple(errors))


def fence_ledger(store: LedgerStore, ledger_id: int, master_key: bytes) -> JournalWrite:
    """Fence (creating the ledger with this key if unknown); the record to journal,
    whose durability answers the fence (it carries the key)."""
    store.set_master_key(ledger_id, master_key)
    store.set_fenced(ledger_id)
    return JournalWrite((encode_control(FenceRecord(ledger_id, master_key)),),
                        answer_when_durable=True)


def write_lac(store: LedgerStore, ledger_id: int, master_key: bytes, lac: int) -> JournalWrite:
    """Record an explicit LAC (creating the ledger with this key if unknown); the
    records to journal (answered once the LAC is durable; at once for -1)."""
    if lac < -1:
        raise UsageError(f"LAC {lac} of ledger {ledger_id} is below -1")
    new_ledger = not store.ledger_exists(ledger_id)
    store.set_master_key(ledger_id, master_key)
    records = [encode_control(KeyRecord(ledger_id, master_key))] if new_ledger else []
    if lac >= 0:
        store.set_explicit_lac(ledger_id, lac)
        records.append(encode_control(LacRecord(ledger_id, lac)))
    return JournalWrite(tuple(records), answer_when_durable=lac >= 0)


def absent_error(error: NoSuchEntryError | NoSuchLedgerError, bookie_id: str, ledger_id: int,
                 entry_id: int, limbo_floor: int) -> NoSuchEntryError | NoSuchLedgerError | (
                     EntryInLimboError):
    """What a read of an entry the store does not hold answers: a re-added
    bookie never says "no such entry" for what it may have lost (``_limbo.py``)."""
    limbo = limbo_error(bookie_id, ledger_id, entry_id, limbo_floor)
    return error if limbo is None else limbo


def lac_or_none(store: LedgerStore, ledger_id: int) -> int | None:
    """The ledger's LAC; None when the store does not know the ledger."""
    try:
        return store.last_add_confirmed(ledger_id)
    except NoSuchLedgerError:
        return None


def lac_passed(lac: int | None, previous_lac: int) -> bool:
    """Whether a long poll waiting for the LAC to pass ``previous_lac`` is answered."""
    return lac is not None and lac > previous_lac


def lac_entry(store: LedgerStore, ledger_id: int, previous_lac: int) -> bytes:
    """The entry a LAC read ``with_entry`` carries: ``previous_lac + 1`` if held."""
    try:
        return store.get_entry(ledger_id, previous_lac + 1)
    except (NoSuchEntryError, NoSuchLedgerError):
        return b""


def batch_bounds(config: BookieConfig, max_entries: int, max_bytes: int) -> tuple[int, int]:
    """A batch read's bounds: the request's, capped by the bookie's."""
    if max_entries <= 0 or max_bytes <= 0:
        raise UsageError("a batch read needs max_entries > 0 and max_bytes > 0")
    return (min(max_entries, config.read_batch_entries_max),
            min(max_bytes, config.read_batch_bytes_max))


def long_poll_ms(config: BookieConfig, timeout_ms: int) -> int:
    """How long a LAC read may wait: the request's timeout, capped by the bookie's."""
    return min(timeout_ms, config.long_poll_timeout_ms_max)
