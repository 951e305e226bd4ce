"""Journal replay: what a restart re-applies to the ledger storage.

The storage checkpoints at a journal position; every journal record after it
is re-applied in journal order (``replay``), each by ``apply_journal_record``:
adds with ``recovery=True`` (fencing does not refuse them), master keys,
fencing, explicit LACs and deletions. The simulated bookie applies its synced
journal with the same ``apply_journal_record`` (its disk), so a replay rule
is checked by the ledger simulator too.
"""

from __future__ import annotations

from quorumlog.bookie._journal import (
    DeleteRecord,
    FenceRecord,
    Journal,
    KeyRecord,
    LacRecord,
    decode_position,
    decode_record,
    encode_position,
    unpack_entry,
)
from quorumlog.bookie._rules import LedgerStore
from quorumlog.bookie._storage import LedgerStorage
from quorumlog.errors import CorruptionError, QuorumlogError, invariant
from quorumlog.log import get_logger
from quorumlog.proto import NoSuchLedgerError, parse_envelope

_log = get_logger(__name__)


def replay(journal: Journal, storage: LedgerStorage) -> int:
    """Re-apply the journal records after the storage's checkpoint; return the checkpoint.

    Runs on a worker thread before the bookie serves. Records are applied in
    journal order: adds with ``recovery=True`` (fencing does not refuse them),
    master keys, fencing, explicit LACs and deletions.
    """
    checkpoint = decode_position(storage.last_checkpoint())
    entries = journal.take_replay()
    last = entries[-1].index if entries else journal.last_index
    if checkpoint > 0 and (journal.created or max(last, journal.last_index) < checkpoint):
        raise CorruptionError(
            f"the ledger storage in {storage.directory} was checkpointed at journal record "
            f"{checkpoint}, but the journal in {journal.directory} ends at {journal.last_index}"
            f"{' (it was just created: the journal is gone)' if journal.created else ''}; "
            "records acknowledged since then are lost. Restore the journal directory, or "
            "re-add this bookie as a new instance (`quorumlog bookie format --force <bookie id> "
            "--config <its node config>`, docs/bookie.md \"Re-adding a wiped bookie\"); its "
            "ledgers then stay under-replicated until they are re-replicated, which nothing "
            "does automatically yet (auto-recovery is not built)")
    keys: dict[int, bytes] = {}
    room = storage.config.write_cache_half_bytes
    unflushed_bytes = 0
    for entry in entries:
        if entry.index <= checkpoint:
            continue
        for record in unpack_entry(entry.data):
            if unflushed_bytes + len(record) > room:
                # Every entry before this one is applied: replay may restart here.
                storage.flush(encode_position(entry.index - 1))
                unflushed_bytes = 0
            _apply(storage, entry.index, record, keys)
            unflushed_bytes += len(record)
    _log.info("journal_replayed", entries=sum(1 for e in entries if e.index > checkpoint),
              checkpoint=checkpoint, last_index=journal.last_index)
    return checkpoint


def _apply(storage: LedgerStorage, index: int, data: bytes, keys: dict[int, bytes]) -> None:
    try:
        apply_journal_record(storage, index, data, keys)
    except NoSuchLedgerError:
        # A ledger deleted by GC and written again before a flush: the flush
        # forgets the deleted ledger, after which the record applies.
        storage.flush(None)
        apply_journal_record(storage, index, data, keys)


def apply_journal_record(store: LedgerStore, index: int, data: bytes,
                         keys: dict[int, bytes]) -> None:
    """Apply one journal record (journal entry ``index``) to ``store``.

    ``keys`` caches master keys by ledger (filled as records are applied).
    The bookie's replay and the simulated bookie's disk use it.
    """
    record = decode_record(data)
    if record is None:
        try:
            envelope = parse_envelope(data)
        except QuorumlogError as exc:
            raise CorruptionError(
                f"journal entry {index} holds a damaged entry envelope: {exc.message}"
            ) from None
        ledger_id = envelope.ledger_id
        key = keys.get(ledger_id)
        if key is None:
            try:
                key = store.ledger_info(ledger_id).master_key
            except NoSuchLedgerError:
                raise CorruptionError(
                    f"journal entry {index} adds to ledger {ledger_id}, whose master key "
                    "is neither in the journal nor in the ledger storage") from None
            keys[ledger_id] = key
        store.add(ledger_id, envelope.entry_id, data, master_key=key,
                    piggyback_lac=envelope.lac, recovery=True)
    elif isinstance(record, KeyRecord):
        keys[record.ledger_id] = record.master_key
        store.set_master_key(record.ledger_id, record.master_key)
    elif isinstance(record, FenceRecord):
        keys[record.ledger_id] = record.master_key
        store.set_master_key(record.ledger_id, record.master_key)
        store.set_fenced(record.ledger_id)
    elif isinstance(record, LacRecord):
        store.set_explicit_lac(record.ledger_id, record.lac)
    else:
        invariant(isinstance(record, DeleteRecord), f"unknown journal record {record!r}")
        keys.pop(record.ledger_id, None)
        store.delete_ledger(record.ledger_id)
