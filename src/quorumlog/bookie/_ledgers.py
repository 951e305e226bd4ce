"""Per-ledger metadata: master key, fenced flag, LACs, last entry, deleted state.

:class:`LedgerTable` is plain in-memory state with no locking; the storage
holds its state lock around every call. Changes mark the ledger *dirty*; a
flush takes a snapshot of the dirty records at the moment it swaps the write
cache (so the records it persists match the entries it writes) and persists
them in its index batch.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

import msgspec

from quorumlog.bookie._format import NO_ENTRY
from quorumlog.errors import UsageError
from quorumlog.proto import (
    LedgerFencedError,
    NoSuchLedgerError,
    UnauthorizedError,
)

# BookKeeper's master key is a 20-byte SHA-1 of the password; this leaves room
# for longer digests while keeping every ledger record small.
MASTER_KEY_MAX_BYTES = 256


class LedgerRecord(msgspec.Struct, frozen=True, array_like=True):
    """The persisted metadata of one ledger (msgpack in the ``ledgers`` family)."""

    master_key: bytes
    fenced: bool = False
    deleted: bool = False
    explicit_lac: int = NO_ENTRY
    piggyback_lac: int = NO_ENTRY
    last_entry_id: int = NO_ENTRY

    @property
    def last_add_confirmed(self) -> int:
        return max(self.explicit_lac, self.piggyback_lac)


class LedgerInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What the storage knows about a ledger (returned by ``ledger_info``)."""

    ledger_id: int
    master_key: bytes
    fenced: bool
    explicit_lac: int
    piggyback_lac: int
    last_add_confirmed: int
    last_entry_id: int


def info_of(ledger_id: int, record: LedgerRecord) -> LedgerInfo:
    """What ``ledger_info`` answers for ``record``."""
    return LedgerInfo(
        ledger_id=ledger_id, master_key=record.master_key, fenced=record.fenced,
        explicit_lac=record.explicit_lac, piggyback_lac=record.piggyback_lac,
        last_add_confirmed=record.last_add_confirmed, last_entry_id=record.last_entry_id,
    )


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(LedgerRecord)


def encode_record(record: LedgerRecord) -> bytes:
    return _ENCODER.encode(record)


def decode_record(raw: bytes) -> LedgerRecord:
    return _DECODER.decode(raw)


def check_master_key(master_key: bytes) -> None:
    if len(master_key) > MASTER_KEY_MAX_BYTES:
        raise UsageError(
            f"master key of {len(master_key)} bytes is over {MASTER_KEY_MAX_BYTES} bytes; "
            "pass the digest of the ledger password, not the password"
        )


class LedgerTable:
    """All ledgers of one storage, with the dirty set and pending deletions."""

    def __init__(self, records: dict[int, LedgerRecord]) -> None:
        self._records = records
        self._dirty: set[int] = set()
        self._pending_deletes: set[int] = {lid for lid, r in records.items() if r.deleted}

    def get(self, ledger_id: int) -> LedgerRecord | None:
        return self._records.get(ledger_id)

    def get_live(self, ledger_id: int) -> LedgerRecord:
        record = self._records.get(ledger_id)
        if record is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist on this bookie")
        if record.deleted:
            raise NoSuchLedgerError(f"ledger {ledger_id} was deleted on this bookie")
        return record

    def live_ids(self) -> list[int]:
        return sorted(lid for lid, r in self._records.items() if not r.deleted)

    def _put(self, ledger_id: int, record: LedgerRecord) -> None:
        self._records[ledger_id] = record
        self._dirty.add(ledger_id)

    def _authorize(self, ledger_id: int, master_key: bytes) -> LedgerRecord | None:
        record = self._records.get(ledger_id)
        if record is None:
            return None
        if record.deleted:
            raise NoSuchLedgerError(
                f"ledger {ledger_id} was deleted on this bookie; it cannot be written"
            )
        if not hmac.compare_digest(record.master_key, master_key):
            raise UnauthorizedError(
                f"master key does not match the one ledger {ledger_id} was created with; "
                "check the ledger password"
            )
        return record

    def set_master_key(self, ledger_id: int, master_key: bytes) -> None:
        """Create the ledger with ``master_key``, or check that it matches."""
        check_master_key(master_key)
        if self._authorize(ledger_id, master_key) is None:
            self._put(ledger_id, LedgerRecord(master_key=master_key))

    def check_add(self, ledger_id: int, master_key: bytes, *, recovery: bool) -> LedgerRecord:
        """The record an add to ``ledger_id`` may proceed with (created if new)."""
        check_master_key(master_key)
        record = self._authorize(ledger_id, master_key)
        if record is None:
            record = LedgerRecord(master_key=master_key)
            self._put(ledger_id, record)
        elif record.fenced and not recovery:
            raise LedgerFencedError(
                f"ledger {ledger_id} is fenced (being recovered or closed); "
                "the writer must stop; only recovery adds are accepted"
            )
        return record

    def admit_add(self, ledger_id: int, entry_id: int, master_key: bytes, *,
                  piggyback_lac: int, recovery: bool,
                  holds: Callable[[int, int], bool]) -> bool:
        """Whether an add is to be stored: :meth:`check_add` (master key, fencing;
        a new ledger is created), then False for a duplicate of an entry that
        ``holds(ledger_id, entry_id)`` says is stored (the first copy stays; its
        piggybacked LAC still counts). The caller stores the entry and calls
        :meth:`note_add` when True. The one add rule of the bookie server (via
        ``LedgerStorage``) and of the simulated bookie (via ``MemoryLedgerStore``).
        """
        record = self.check_add(ledger_id, master_key, recovery=recovery)
        if entry_id <= record.last_entry_id and holds(ledger_id, entry_id):
            self.note_add(ledger_id, entry_id, piggyback_lac)
            return False
        return True

    def note_add(self, ledger_id: int, entry_id: int, piggyback_lac: int) -> None:
        record = self._records[ledger_id]
        if entry_id <= record.last_entry_id and piggyback_lac <= record.piggyback_lac:
            return
        self._put(ledger_id, msgspec.structs.replace(
            record,
            last_entry_id=max(record.last_entry_id, entry_id),
            piggyback_lac=max(record.piggyback_lac, piggyback_lac),
        ))

    def fence(self, ledger_id: int) -> int:
        record = self.get_live(ledger_id)
        if not record.fenced:
            self._put(ledger_id, msgspec.structs.replace(record, fenced=True))
        return record.last_add_confirmed

    def set_explicit_lac(self, ledger_id: int, lac: int) -> None:
        record = self.get_live(ledger_id)
        if lac > record.explicit_lac:
            self._put(ledger_id, msgspec.structs.replace(record, explicit_lac=lac))

    def mark_deleted(self, ledger_id: int) -> bool:
        """Mark the ledger deleted; False if it was unknown or already deleted."""
        record = self._records.get(ledger_id)
        if record is None or record.deleted:
            return False
        self._put(ledger_id, msgspec.structs.replace(record, deleted=True))
        self._pending_deletes.add(ledger_id)
        return True

    def take_snapshot(self) -> tuple[dict[int, LedgerRecord], frozenset[int]]:
        """Dirty records (dirty set cleared) and the ledgers pending deletion."""
        records = {lid: self._records[lid] for lid in self._dirty}
        self._dirty.clear()
        return records, frozenset(self._pending_deletes)

    def restore_dirty(self, ledger_ids: set[int] | frozenset[int]) -> None:
        """A flush that took a snapshot failed: its ledgers are dirty again."""
        self._dirty.update(lid for lid in ledger_ids if lid in self._records)

    def forget_deleted(self, ledger_ids: frozenset[int]) -> None:
        """The index no longer holds these deleted ledgers: drop them from memory."""
        for lid in ledger_ids:
            self._pending_deletes.discard(lid)
            record = self._records.get(lid)
            if record is not None and record.deleted:
                del self._records[lid]
                self._dirty.discard(lid)
