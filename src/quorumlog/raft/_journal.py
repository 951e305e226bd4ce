"""The host journal: one fdatasync per ready pass for all of a process's groups.

Every group keeps its own WAL (``_wal_storage``: entries, hard state,
snapshot markers, segment release), but with a journal a group's Ready is
written to its WAL *without* an fdatasync and the same records go to this
one journal, which the ready pass syncs once for every group it wrote (as
TiKV's raft engine shares one log per node; before, each group of a pass
paid its own fdatasync: 8 groups, 8 fdatasyncs per pass).

What is durable is therefore "the group WALs as last synced, plus the journal
after its checkpoint". A **checkpoint** fdatasyncs every group WAL written
since the previous one, then records the journal sequence it covers (the
journal's state record); the journal's older segments are released. Taken
when the journal has grown by ``checkpoint_bytes`` since the last one, when a
group is removed (its records must never reach a later group of the same id)
and when the host closes.

**Replay.** On open, the journal's records after the checkpoint are folded
per group into one :class:`PendingWrite`: a group's writes are truncating
appends (entries from index ``a`` replace the log from ``a`` on), so the
whole sequence since the checkpoint has the same effect as one truncating
append from the smallest first index any of them had, of the entries the
sequence left there, plus the last hard state. That append is *idempotent*:
applied to the group WAL in any state between the checkpoint and the crash
(unsynced writes lost, or not, in any prefix) it yields the state after the
last journaled write. A follower's snapshot install starts the fold over
(the snapshot file and WAL marker are synced before the journal record).
Each group's fold is written to its WAL, synced, when the host opens that
group; folds of groups not opened yet are carried into the next checkpoint.

Journal records are WAL entries (``quorumlog.wal``: CRC-chained, torn tails
repaired) whose index is the journal sequence and whose data is a msgpack
:class:`JournalRecord`.

**Record size.** A WAL record holds at most ``record_size_max_bytes`` (16 MiB),
and one group's write of one pass can be far larger: a follower catching up
receives up to ``max_inflight_bytes`` (64 MiB) of entries at once, a leader
may take dozens of 1 MiB table writes in one pass. So a write is journaled as
several records of at most ``RECORD_ENTRY_BYTES_MAX`` of entry data each (one
entry alone when it is larger): the snapshot reset in the first, the hard
state in the last. Folding them in order has the effect of the whole write;
a crash that keeps only a prefix of them leaves a prefix of the write's
entries and the previous hard state, as a torn write of the group's own WAL
does (nothing of the pass was acknowledged before its sync). Before, such a
write failed the whole node ("WalEntry has 27252010 bytes of data; the limit
is 16777200"), and the retried writes then failed the next leader too.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import msgspec

from quorumlog import chunks
from quorumlog.errors import CorruptionError, invariant
from quorumlog.wal import Wal, WalConfig, WalEntry

JOURNAL_METADATA = b"quorumlog-raft-journal/1"
"""Metadata record of a host journal (refuses to open another WAL as one)."""

JOURNAL_DIR_NAME = "journal"

CHECKPOINT_BYTES_DEFAULT = 64 * 1024 * 1024
"""Journal bytes written between checkpoints: bounds replay work and disk use
(a checkpoint costs one fdatasync per group written since the last one)."""

RECORD_ENTRY_BYTES_MAX = 4 * 1024 * 1024
"""Entry data per journal record (module doc, "Record size"); far below the WAL's
record limit, so that one entry up to the group WAL's own limit still fits."""


class JournalRecord(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One group's write of one pass: entries (index, encoded Raft entry) from
    their first index on, then the encoded hard state; ``reset_index`` > 0
    when the write installed a snapshot at that index first."""

    group_id: int
    reset_index: int
    state: bytes | None
    entries: list[tuple[int, bytes]]


_ENCODER = msgspec.msgpack.Encoder()
_RECORD_DECODER = msgspec.msgpack.Decoder(JournalRecord)


class PendingWrite:
    """The fold of one group's journaled writes since the checkpoint (module doc)."""

    __slots__ = ("entries", "floor", "state")

    def __init__(self) -> None:
        self.state: bytes | None = None
        self.entries: list[WalEntry] = []  # contiguous, from the smallest first index
        self.floor = 0  # a snapshot installed at this index (0: none)

    def fold(self, record: JournalRecord) -> None:
        if record.reset_index:
            self.entries, self.floor = [], max(self.floor, record.reset_index)
        if record.entries:
            first = record.entries[0][0]
            if self.entries:
                start = self.entries[0].index
                invariant(first <= self.entries[-1].index + 1,
                          "a journaled append leaves a gap after the folded entries")
                if first >= start:
                    del self.entries[first - start:]
                else:
                    self.entries = []
            self.entries.extend(WalEntry(index=i, data=d) for i, d in record.entries)
        if record.state is not None:
            self.state = record.state

    def records(self, group_id: int) -> list[JournalRecord]:
        """The fold as records (carried into a checkpoint)."""
        return split_write(group_id, self.floor, self.state, self.entries)


def split_write(group_id: int, reset_index: int, state: bytes | None,
                entries: Iterable[WalEntry],
                entry_bytes_max: int = RECORD_ENTRY_BYTES_MAX) -> list[JournalRecord]:
    """One group's write as journal records of at most ``entry_bytes_max`` of
    entry data each (an entry larger than that alone): the reset in the first,
    the hard state in the last; at least one record."""
    runs = chunks.by_size(((entry.index, entry.data) for entry in entries),
                          lambda item: len(item[1]), entry_bytes_max)
    last = len(runs) - 1
    return [JournalRecord(group_id, reset_index if n == 0 else 0, state if n == last else None,
                          run) for n, run in enumerate(runs)]


class SyncableWal(Protocol):
    """A group WAL the journal checkpoints (``WalRaftStorage``)."""

    def sync_wal(self) -> None: ...


class HostJournal:
    """The journal of one host; every method runs on the host's I/O side,
    between or inside ready passes (never two at once)."""

    def __init__(self, directory: Path, wal: Wal, checkpoint: int,
                 pending: dict[int, PendingWrite], checkpoint_bytes: int) -> None:
        self.directory = directory
        self._wal = wal
        self._checkpoint = checkpoint
        self._next = max(wal.last_index, checkpoint) + 1
        self.pending = pending  # folds of groups not opened yet
        self._records: list[WalEntry] = []
        self._dirty: dict[int, SyncableWal] = {}
        self._bytes_since_checkpoint = 0
        self._checkpoint_bytes = checkpoint_bytes

    @classmethod
    def open(cls, directory: Path, *, config: WalConfig | None = None,
             checkpoint_bytes: int = CHECKPOINT_BYTES_DEFAULT) -> HostJournal:
        """Open (or create) the journal and fold its records after the checkpoint."""
        if not Wal.exists(directory):
            directory.parent.mkdir(parents=True, exist_ok=True)
            Wal.create(directory, JOURNAL_METADATA, config=config).close()
        wal = Wal.open(directory, config=config)
        try:
            contents = wal.read_all()
            if contents.metadata != JOURNAL_METADATA:
                raise CorruptionError(f"{directory}: not a raft host journal "
                                      f"(metadata {contents.metadata[:32]!r})")
            checkpoint = _decode_checkpoint(contents.state, directory)
            pending: dict[int, PendingWrite] = {}
            for entry in contents.entries:
                if entry.index <= checkpoint:
                    continue
                record = _decode_record(entry, directory)
                pending.setdefault(record.group_id, PendingWrite()).fold(record)
        except BaseException:
            wal.close()
            raise
        return cls(directory, wal, checkpoint, pending, checkpoint_bytes)

    def take_pending(self, group_id: int) -> PendingWrite | None:
        """The fold a group must write to its WAL as it opens (once)."""
        return self.pending.pop(group_id, None)

    def add(self, group_id: int, wal: SyncableWal, reset_index: int, state: bytes | None,
            entries: Iterable[WalEntry]) -> None:
        """Journal one group's write of this pass (written by :meth:`flush`)."""
        for record in split_write(group_id, reset_index, state, entries):
            data = _ENCODER.encode(record)
            self._records.append(WalEntry(index=self._next, data=data))
            self._next += 1
            self._bytes_since_checkpoint += len(data)
        self._dirty[group_id] = wal

    def flush(self, *, sync: bool) -> None:
        """Write this pass's records (one write; one fdatasync if ``sync``)."""
        if self._records:
            records, self._records = self._records, []
            self._wal.save(None, records, sync=sync)
        elif sync:
            return
        if self._bytes_since_checkpoint >= self._checkpoint_bytes:
            self.checkpoint()

    def forget(self, group_id: int) -> None:
        """A removed group: nothing of it may be replayed again (checkpoints)."""
        self.pending.pop(group_id, None)
        self.checkpoint()
        self._dirty.pop(group_id, None)

    def checkpoint(self) -> None:
        """Sync every group WAL written since the last checkpoint, then record
        that the journal up to now is covered (carrying the folds of groups
        not opened yet), then release the covered segments."""
        invariant(not self._records, "a checkpoint runs between passes")
        for wal in self._dirty.values():
            wal.sync_wal()
        self._dirty.clear()
        covered = self._next - 1
        carried = []
        for group_id, write in sorted(self.pending.items()):
            for record in write.records(group_id):
                carried.append(WalEntry(index=self._next, data=_ENCODER.encode(record)))
                self._next += 1
        self._wal.save(covered.to_bytes(8, "little"), carried, sync=True)
        self._checkpoint = covered
        self._bytes_since_checkpoint = 0
        self._wal.release_to(covered)

    def close(self) -> None:
        self._wal.close()


def _decode_checkpoint(state: bytes | None, where: Path) -> int:
    if state is None:
        return 0
    if len(state) != 8:
        raise CorruptionError(f"{where}: journal checkpoint record of {len(state)} bytes")
    return int.from_bytes(state, "little")


def _decode_record(entry: WalEntry, where: Path) -> JournalRecord:
    try:
        return _RECORD_DECODER.decode(entry.data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise CorruptionError(f"{where}: journal record {entry.index} does not decode: "
                              f"{exc}") from None
