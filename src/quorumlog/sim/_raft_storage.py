"""The simulated process's Raft storage: records on a :class:`SimDisk`.

:class:`SimRaftStorage` is the ready pass's storage (``quorumlog.raft.
ReadyStorage``) in the simulator: ``persist`` writes the Ready's records to the
disk - snapshot, then entries, then hard state, so a crash that keeps a
prefix of the unsynced records never keeps a commit index without its entries
- and fsyncs when ``must_sync`` or when the Ready installs a snapshot (as
etcd's driver does: a snapshot file is always fsynced); ``install`` writes the
``MemoryStorage`` the core reads. A restart rebuilds that ``MemoryStorage``
from the records that survived (:func:`replay_record`).
"""

from __future__ import annotations

import random
from typing import NamedTuple

from quorumlog.raft import Entry, HardState, MemoryStorage, Snapshot
from quorumlog.sim._disk import SimDisk
from quorumlog.sim._invariants import DurableView, RaftInvariants

LOG_READ_BYTES_MAX = 1 << 40
"""Byte cap for reading a whole (short, simulated) log back from storage."""

class EntriesRecord(NamedTuple):
    entries: tuple[Entry, ...]


DiskRecord = Snapshot | EntriesRecord | HardState


def tear_record(record: DiskRecord, rng: random.Random) -> DiskRecord | None:
    """A torn write: a prefix of an entries batch; any other record is lost whole."""
    if isinstance(record, EntriesRecord) and len(record.entries) > 1:
        return EntriesRecord(record.entries[: rng.randrange(1, len(record.entries))])
    return None


class SimRaftStorage:
    """The ready pass's storage in the simulator: records on the node's
    :class:`SimDisk`, and the ``MemoryStorage`` its core reads.

    It tracks what is durable (the hard state last synced, the lowest entry
    index written since the last sync) for the invariants' send checks.
    """

    __slots__ = ("_written_hard_state", "disk", "invariants", "memory", "node_id",
                 "synced_hard_state", "unsynced_from_index")

    def __init__(
        self, node_id: int, memory: MemoryStorage, disk: SimDisk[DiskRecord],
        invariants: RaftInvariants,
    ) -> None:
        self.node_id = node_id
        self.memory = memory
        self.disk = disk
        self.invariants = invariants
        # After a (re)start all of the stored state survived the crash.
        self.synced_hard_state = self._written_hard_state = memory.hard_state()
        self.unsynced_from_index = 0  # lowest index written since the last sync; 0: none

    def persist(
        self,
        hard_state: HardState | None,
        entries: list[Entry],
        snapshot: Snapshot | None,
        *,
        must_sync: bool,
    ) -> None:
        disk = self.disk
        if snapshot is not None:
            disk.write(snapshot)
        if entries:
            disk.write(EntriesRecord(tuple(entries)))
            first_written = entries[0].index
            if not self.unsynced_from_index or first_written < self.unsynced_from_index:
                self.unsynced_from_index = first_written
        if hard_state is not None:
            disk.write(hard_state)
            self._written_hard_state = hard_state
        if must_sync or snapshot is not None:
            self.sync()

    def install(
        self, hard_state: HardState | None, entries: list[Entry], snapshot: Snapshot | None
    ) -> None:
        memory = self.memory
        if snapshot is not None:
            memory.apply_snapshot(snapshot)
        if entries:
            fresh = [e for e in entries if e.index >= memory.first_index()]
            if fresh:
                first, last = fresh[0].index, memory.last_index()
                prev_term = memory.term(first - 1)
                replaced = (
                    memory.entries(first, last + 1, LOG_READ_BYTES_MAX) if first <= last else []
                )
                self.invariants.on_persist_entries(self.node_id, fresh, prev_term, replaced)
            memory.append(entries)
        if hard_state is not None:
            memory.set_hard_state(hard_state)

    def sync(self) -> None:
        """fsync: everything written so far is durable."""
        self.disk.sync()
        self.synced_hard_state = self._written_hard_state
        self.unsynced_from_index = 0

    def durable_view(self) -> DurableView:
        return DurableView(
            self.synced_hard_state, self.unsynced_from_index, self.memory.last_index()
        )


def replay_record(storage: MemoryStorage, record: DiskRecord) -> None:
    if isinstance(record, Snapshot):
        if record.meta.index > storage.snapshot().meta.index:
            storage.apply_snapshot(record)
    elif isinstance(record, EntriesRecord):
        storage.append(list(record.entries))
    else:
        storage.set_hard_state(record)
