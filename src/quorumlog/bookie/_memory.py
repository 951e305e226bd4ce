"""``MemoryLedgerStore``: the ledger storage's contract in memory, on the real
:class:`LedgerTable`.

The reference implementation of the part of ``LedgerStorage`` that the
request rules (``_rules.py``) and journal replay (``_replay.py``) use: the
same per-ledger rules (``LedgerTable``: master key compared with
``hmac.compare_digest``, fencing, LACs, duplicates) over a dict of entries
instead of a write cache, entry logs and an index. The simulated bookie
(``quorumlog.sim``) holds two: what its memory holds and what its disk holds;
nothing here is simulated except where the entries live.
"""

from __future__ import annotations

from collections.abc import Sequence

from quorumlog.bookie._format import NO_ENTRY
from quorumlog.bookie._ledgers import LedgerInfo, LedgerRecord, LedgerTable, info_of
from quorumlog.errors import QuorumlogError, UsageError
from quorumlog.proto import NoSuchEntryError


class MemoryLedgerStore:
    """Ledgers and their entries in memory (see the module docstring)."""

    def __init__(self, records: dict[int, LedgerRecord] | None = None,
                 entries: dict[int, dict[int, bytes]] | None = None) -> None:
        self._records = dict(records or {})
        self._ledgers = LedgerTable(self._records)
        self._entries = entries if entries is not None else {}

    def copy(self) -> MemoryLedgerStore:
        """An independent copy (what a restart finds on disk)."""
        live = {lid: r for lid, r in self._records.items() if not r.deleted}
        return MemoryLedgerStore(
            live, {lid: dict(held) for lid, held in self._entries.items() if lid in live})

    # -- ledger metadata -------------------------------------------------------------

    def set_master_key(self, ledger_id: int, master_key: bytes) -> None:
        self._ledgers.set_master_key(ledger_id, master_key)

    def ledger_exists(self, ledger_id: int) -> bool:
        record = self._ledgers.get(ledger_id)
        return record is not None and not record.deleted

    def ledger_ids(self) -> list[int]:
        return self._ledgers.live_ids()

    def ledger_info(self, ledger_id: int) -> LedgerInfo:
        return info_of(ledger_id, self._ledgers.get_live(ledger_id))

    def set_fenced(self, ledger_id: int) -> int:
        return self._ledgers.fence(ledger_id)

    def set_explicit_lac(self, ledger_id: int, lac: int) -> None:
        self._ledgers.set_explicit_lac(ledger_id, lac)

    def last_add_confirmed(self, ledger_id: int) -> int:
        return self._ledgers.get_live(ledger_id).last_add_confirmed

    def last_entry_id(self, ledger_id: int) -> int:
        return self._ledgers.get_live(ledger_id).last_entry_id

    def delete_ledger(self, ledger_id: int) -> bool:
        if not self._ledgers.mark_deleted(ledger_id):
            return False
        self._entries.pop(ledger_id, None)
        self._ledgers.forget_deleted(frozenset([ledger_id]))
        return True

    # -- entries ---------------------------------------------------------------------

    def _holds(self, ledger_id: int, entry_id: int) -> bool:
        return entry_id in self._entries.get(ledger_id, {})

    def add(self, ledger_id: int, entry_id: int, data: bytes, *, master_key: bytes,
            piggyback_lac: int = NO_ENTRY, recovery: bool = False) -> bool:
        """As ``LedgerStorage.add``: False if the entry was already held."""
        if not self._ledgers.admit_add(ledger_id, entry_id, master_key,
                                       piggyback_lac=piggyback_lac, recovery=recovery,
                                       holds=self._holds):
            return False
        self._entries.setdefault(ledger_id, {})[entry_id] = bytes(data)
        self._ledgers.note_add(ledger_id, entry_id, piggyback_lac)
        return True

    def add_many(self, ledger_id: int, entries: Sequence[tuple[int, bytes, int]], *,
                 master_key: bytes, recovery: bool = False) -> dict[int, QuorumlogError]:
        """As ``LedgerStorage.add_many``: a ledger-wide error raises before
        anything is stored; nothing fails on its own here (no size bound, no
        write cache)."""
        if entries:
            self._ledgers.check_add(ledger_id, master_key, recovery=recovery)
        for entry_id, data, lac in entries:
            self.add(ledger_id, entry_id, data, master_key=master_key, piggyback_lac=lac,
                     recovery=recovery)
        return {}

    def get_entry(self, ledger_id: int, entry_id: int) -> bytes:
        self._ledgers.get_live(ledger_id)
        data = self._entries.get(ledger_id, {}).get(entry_id)
        if data is None:
            raise NoSuchEntryError(f"entry {ledger_id}:{entry_id} does not exist on this bookie")
        return data

    def entries(self, ledger_id: int) -> dict[int, bytes]:
        """A copy of the entries held for the ledger (empty when unknown)."""
        return dict(self._entries.get(ledger_id, {}))

    def damage_entry(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        """Replace a held entry's bytes behind the rules' back: bit rot, for tests
        and the simulator (a reader must notice by the envelope's digest)."""
        self._entries[ledger_id][entry_id] = data

    def read_batch(self, ledger_id: int, first_entry_id: int, max_entries: int,
                   max_bytes: int) -> list[bytes]:
        """As ``LedgerStorage.read_batch``: consecutive entries within both bounds,
        but always the first one (NoSuchEntryError if absent)."""
        if max_entries <= 0 or max_bytes <= 0:
            raise UsageError("read_batch needs max_entries > 0 and max_bytes > 0")
        first = self.get_entry(ledger_id, first_entry_id)
        held = self._entries[ledger_id]
        entries, total_bytes = [first], len(first)
        entry_id = first_entry_id + 1
        while len(entries) < max_entries and entry_id in held:
            data = held[entry_id]
            if total_bytes + len(data) > max_bytes:
                break
            entries.append(data)
            total_bytes += len(data)
            entry_id += 1
        return entries

