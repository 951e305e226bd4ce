"""Raft storage on the WAL: what was synced is exactly what a restart sees.

Layout of a group's directory::

    wal/    the WAL (quorumlog.wal): hard states (state records), entries (entry
            records: the Raft entry msgpack-encoded as the record data) and
            snapshot markers
    snap/   snapshot files {term}-{index}.snap holding the encoded Raft
            snapshot (metadata with conf state and epoch, plus the app's data)

Reads are served by an in-memory copy (:class:`MemoryStorage`) rebuilt from
disk on open. Writes are split so that the disk work can run on an I/O thread
while the Raft core keeps reading the memory copy on the event loop:

* :meth:`persist` (I/O thread): snapshot file, then the WAL's snapshot
  marker, then hard state + entries in one WAL write (one fdatasync when
  ``must_sync``) — etcd's order, so a stored commit index never points past
  a snapshot that is not on disk;
* :meth:`install` (event loop, after persist returned): the same changes to
  the memory copy;
* :meth:`save` does both, for single-threaded drivers and tests.

Snapshots the application makes follow the same split: :meth:`create_snapshot`
records it in memory (loop), :meth:`persist_snapshot` writes the file and the
WAL marker (I/O thread); then :meth:`compact` (memory) and :meth:`release_wal`
(unlinks WAL segments the persisted snapshot covers).

A founding member is created with its configuration as the bootstrap snapshot
(index 1, term 1, as :class:`MemoryStorage` does). Creation is atomic: the WAL
is built with that snapshot and hard state in ``wal.tmp`` and renamed to
``wal`` only when complete, so a crash during creation leaves either nothing
or a fully bootstrapped member — never a member that forgot its group.

Everything read back is checked: a WAL entry record whose decoded Raft entry
has another index, or a record that does not decode, is a CorruptionError.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import msgspec

from quorumlog.errors import CorruptionError, StorageError, UsageError
from quorumlog.raft._journal import HostJournal, PendingWrite
from quorumlog.raft._storage import MemoryStorage, bootstrap_snapshot
from quorumlog.raft._types import ConfState, Entry, HardState, Snapshot
from quorumlog.wal import (
    SnapshotMarker,
    Snapshotter,
    Wal,
    WalConfig,
    WalEntry,
    valid_snapshot_markers,
)

WAL_METADATA = b"quorumlog-raft/2"
"""Metadata record of a Raft WAL: refuses to open some other WAL as Raft storage.

Version 2: entry data is the application's proposal as it is. Version 1
entries began with an 8-byte proposal id of the driver (matched by position
now); a version 1 WAL is refused rather than handing those bytes to a state
machine."""

OLD_WAL_METADATA = (b"quorumlog-raft/1",)

WAL_DIR_NAME = "wal"
WAL_TEMP_DIR_NAME = "wal.tmp"
SNAP_DIR_NAME = "snap"

_ENCODER = msgspec.msgpack.Encoder()
_ENTRY_DECODER = msgspec.msgpack.Decoder(Entry)
_HARD_STATE_DECODER = msgspec.msgpack.Decoder(HardState)
_SNAPSHOT_DECODER = msgspec.msgpack.Decoder(Snapshot)


def _decode_entry(record: WalEntry, where: Path) -> Entry:
    try:
        entry = _ENTRY_DECODER.decode(record.data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise CorruptionError(
            f"{where}: WAL entry {record.index} is not a Raft entry: {exc}"
        ) from None
    if entry.index != record.index:
        raise CorruptionError(
            f"{where}: WAL entry record {record.index} holds Raft entry {entry.index}"
        )
    return entry


def _decode_hard_state(data: bytes, where: Path) -> HardState:
    try:
        return _HARD_STATE_DECODER.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise CorruptionError(f"{where}: state record is not a Raft hard state: {exc}") from None


def _decode_snapshot(data: bytes, marker: SnapshotMarker, where: Path) -> Snapshot:
    try:
        snapshot = _SNAPSHOT_DECODER.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise CorruptionError(f"{where}: snapshot {marker} is not a Raft snapshot: {exc}") from None
    if (snapshot.meta.term, snapshot.meta.index) != (marker.term, marker.index):
        raise CorruptionError(
            f"{where}: snapshot file {marker} holds the Raft snapshot of "
            f"{snapshot.meta.term}/{snapshot.meta.index}"
        )
    return snapshot


SNAPSHOT_FILES_KEPT = 5
"""Snapshot files kept in ``snap/`` (etcd's --max-snapshots default): the
newest is what a restart loads; a few older ones are kept in case the newest
turns out broken. Without a bound every snapshot stayed on disk forever."""


class WalRaftStorage:
    """RaftStorage backed by a WAL and snapshot files (see the module docstring)."""

    def __init__(
        self, directory: Path, wal: Wal, snapshotter: Snapshotter, memory: MemoryStorage
    ) -> None:
        self.directory = directory
        self._wal = wal
        self._snapshotter = snapshotter
        self._memory = memory
        self._persisted_snapshot_index = memory.snapshot().meta.index
        # With a host journal (``_journal``), Readies are written to the WAL
        # unsynced and journaled; the host syncs the journal once per pass.
        self._journal: HostJournal | None = None
        self._group_id = 0

    # ----- opening --------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        *,
        conf_state: ConfState | None = None,
        config: WalConfig | None = None,
        journal: HostJournal | None = None,
        group_id: int = 0,
    ) -> WalRaftStorage:
        """Open the group's storage, creating it on first use.

        ``conf_state`` bootstraps a founding member; it is ignored when the
        storage already exists (the stored configuration wins). A member that
        joins later passes None and learns the configuration from the leader.

        With a host ``journal``, the group's journaled writes since the last
        checkpoint are first written to the WAL (synced), then it is read,
        and later Readies are journaled (module doc of ``_journal``).
        """
        root = Path(directory)
        wal_dir = root / WAL_DIR_NAME
        if not Wal.exists(wal_dir):
            cls._create(root, conf_state, config)
        pending = journal.take_pending(group_id) if journal is not None else None
        if pending is not None:
            cls._replay_journal(root, config, pending)
        storage = cls._open_existing(root, config)
        storage._journal, storage._group_id = journal, group_id
        return storage

    @classmethod
    def _replay_journal(cls, root: Path, config: WalConfig | None, pending: PendingWrite) -> None:
        """Write the fold of the group's journaled writes to its WAL, synced.

        Entries at or below the WAL's snapshot are covered by it and left out;
        the rest must continue the log the WAL kept (the fold starts where the
        first journaled write after the checkpoint did, and everything before
        was synced by that checkpoint)."""
        storage = cls._open_existing(root, config)
        try:
            floor = storage.snapshot().meta.index
            entries = [e for e in pending.entries if e.index > floor]
            if entries and entries[0].index > storage.last_index() + 1:
                raise CorruptionError(
                    f"{root}: the host journal continues the log at index {entries[0].index} "
                    f"but the WAL ends at {storage.last_index()}: the WAL lost synced entries; "
                    "remove this member from its group and add it again")
            if entries or pending.state is not None:
                storage._wal.save(pending.state, entries, sync=True)
        finally:
            storage.close()

    @classmethod
    def _create(cls, root: Path, conf_state: ConfState | None, config: WalConfig | None) -> None:
        """Build a complete WAL in wal.tmp, then rename it into place."""
        root.mkdir(parents=True, exist_ok=True)
        wal_dir, temp_dir = root / WAL_DIR_NAME, root / WAL_TEMP_DIR_NAME
        if wal_dir.exists():
            raise CorruptionError(f"{wal_dir} exists but holds no WAL segment; inspect it")
        shutil.rmtree(temp_dir, ignore_errors=True)  # a creation cut short by a crash
        memory = MemoryStorage(conf_state)
        wal = Wal.create(temp_dir, WAL_METADATA, config=config)
        try:
            storage = cls(root, wal, Snapshotter(root / SNAP_DIR_NAME), memory)
            if conf_state is not None and not conf_state.is_empty:
                storage.persist_snapshot(bootstrap_snapshot(conf_state))
                storage.persist(memory.hard_state(), [], None, must_sync=True)
        finally:
            wal.close()
        os.rename(temp_dir, wal_dir)
        _fsync_directory(root)

    @classmethod
    def create_from_snapshot(cls, directory: str | os.PathLike[str], snapshot: Snapshot, *,
                             config: WalConfig | None = None) -> None:
        """Create a member whose log starts at ``snapshot`` (a restore from a
        backup): the snapshot file, its WAL marker and a hard state at the
        snapshot's term with everything up to its index committed.

        Every member of the new group is created from the same snapshot, so
        they agree on the log up to its index; the configuration is the
        snapshot's. Atomic as ``open``'s creation is (built in wal.tmp, then
        renamed). Refused when ``directory`` already holds a member's data.
        """
        root = Path(directory)
        meta = snapshot.meta
        if meta.index < 1 or meta.term < 1 or not meta.conf_state.voters:
            raise UsageError(
                f"a restored member needs a snapshot at index >= 1 and term >= 1 with voters; "
                f"got index {meta.index}, term {meta.term}, voters "
                f"{sorted(meta.conf_state.voters)}")
        for name in (WAL_DIR_NAME, SNAP_DIR_NAME):
            if (root / name).exists():
                raise UsageError(
                    f"{root / name} exists: this member already has data; move {root} aside "
                    "(or delete it) before restoring into it")
        root.mkdir(parents=True, exist_ok=True)
        temp_dir = root / WAL_TEMP_DIR_NAME
        shutil.rmtree(temp_dir, ignore_errors=True)  # a restore cut short by a crash
        wal = Wal.create(temp_dir, WAL_METADATA, config=config)
        try:
            storage = cls(root, wal, Snapshotter(root / SNAP_DIR_NAME), MemoryStorage())
            storage.persist_snapshot(snapshot)
            storage.persist(HardState(term=meta.term, vote=0, commit=meta.index), [], None,
                            must_sync=True)
        except BaseException:
            wal.close()
            shutil.rmtree(root / SNAP_DIR_NAME, ignore_errors=True)
            raise
        wal.close()
        os.rename(temp_dir, root / WAL_DIR_NAME)
        _fsync_directory(root)

    @classmethod
    def _open_existing(cls, root: Path, config: WalConfig | None) -> WalRaftStorage:
        wal_dir = root / WAL_DIR_NAME
        snapshotter = Snapshotter(root / SNAP_DIR_NAME)
        file = snapshotter.load_newest_available(valid_snapshot_markers(wal_dir))
        snapshot = None if file is None else _decode_snapshot(file.data, file.marker, root)
        wal = Wal.open(wal_dir, snapshot=None if file is None else file.marker, config=config)
        try:
            memory = cls._load(root, wal, snapshot)
        except BaseException:
            wal.close()
            raise
        return cls(root, wal, snapshotter, memory)

    @staticmethod
    def _load(root: Path, wal: Wal, snapshot: Snapshot | None) -> MemoryStorage:
        contents = wal.read_all()
        if contents.metadata in OLD_WAL_METADATA:
            raise StorageError(
                f"{root}: the Raft WAL was written by an older quorumlog "
                f"({contents.metadata.decode()}), whose entries this version cannot apply; "
                "remove this member from its group, delete its data directory and add it "
                "again (it catches up from the other members)"
            )
        if contents.metadata != WAL_METADATA:
            raise CorruptionError(
                f"{root}: the WAL is not a Raft WAL (metadata {contents.metadata[:32]!r})"
            )
        memory = MemoryStorage()
        if snapshot is not None and snapshot.meta.index > 0:
            memory.apply_snapshot(snapshot)
        if contents.state is not None:
            memory.set_hard_state(_decode_hard_state(contents.state, root))
        memory.append([_decode_entry(record, root) for record in contents.entries])
        return memory

    # ----- RaftStorage (reads, from memory) ---------------------------------------

    def initial_state(self) -> tuple[HardState, ConfState]:
        return self._memory.initial_state()

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        return self._memory.entries(lo, hi, max_bytes)

    def term(self, index: int) -> int:
        return self._memory.term(index)

    def first_index(self) -> int:
        return self._memory.first_index()

    def last_index(self) -> int:
        return self._memory.last_index()

    def snapshot(self) -> Snapshot:
        return self._memory.snapshot()

    def hard_state(self) -> HardState:
        return self._memory.hard_state()

    # ----- writes -------------------------------------------------------------------

    def persist(
        self,
        hard_state: HardState | None,
        entries: list[Entry],
        snapshot: Snapshot | None,
        *,
        must_sync: bool,
    ) -> None:
        """Make a Ready's state durable (I/O thread): snapshot first, then the log."""
        if snapshot is not None:
            self.persist_snapshot(snapshot)
        state = _ENCODER.encode(hard_state) if hard_state is not None else None
        records = [WalEntry(index=e.index, data=_ENCODER.encode(e)) for e in entries]
        journal = self._journal
        if journal is None:
            if state is not None or records:
                self._wal.save(state, records, sync=must_sync)
            return
        # The host syncs the journal once the pass's groups are all written.
        if state is not None or records:
            self._wal.save(state, records, sync=False)
        if state is not None or records or snapshot is not None:
            reset = snapshot.meta.index if snapshot is not None else 0
            journal.add(self._group_id, self, reset, state, records)

    def sync_wal(self) -> None:
        """fdatasync the WAL (a journal checkpoint, I/O thread)."""
        self._wal.sync()

    def install(
        self, hard_state: HardState | None, entries: list[Entry], snapshot: Snapshot | None
    ) -> None:
        """Apply a persisted Ready to the memory copy (event loop)."""
        self._memory.install(hard_state, entries, snapshot)

    def save(
        self,
        hard_state: HardState | None,
        entries: list[Entry],
        snapshot: Snapshot | None,
        *,
        must_sync: bool,
    ) -> None:
        """persist + install in one call (single-threaded drivers and tests)."""
        self.persist(hard_state, entries, snapshot, must_sync=must_sync)
        self.install(hard_state, entries, snapshot)

    def create_snapshot(
        self, index: int, conf_state: ConfState, data: bytes, epoch: int
    ) -> Snapshot:
        """Record the application state at ``index`` in memory (event loop);
        ``persist_snapshot`` makes it durable."""
        return self._memory.create_snapshot(index, conf_state, data, epoch)

    def persist_snapshot(self, snapshot: Snapshot) -> None:
        """Write the snapshot file, then its WAL marker, both synced (I/O thread)."""
        marker = SnapshotMarker(term=snapshot.meta.term, index=snapshot.meta.index)
        self._snapshotter.save(marker, _ENCODER.encode(snapshot))
        self._wal.save_snapshot(marker)
        self._persisted_snapshot_index = max(self._persisted_snapshot_index, marker.index)
        self._snapshotter.purge(keep=SNAPSHOT_FILES_KEPT)

    def compact(self, index: int) -> None:
        """Drop entries up to ``index`` from memory (event loop)."""
        self._memory.compact(index)

    def release_wal(self, index: int) -> None:
        """Unlink WAL segments wholly at or below ``index`` (I/O thread).

        Only up to a persisted snapshot: the entries must be recoverable from it.
        """
        if index > self._persisted_snapshot_index:
            raise UsageError(
                f"release_wal({index}) is past the last persisted snapshot "
                f"{self._persisted_snapshot_index}; persist_snapshot first"
            )
        self._wal.release_to(index)

    def close(self) -> None:
        self._wal.close()

    def __enter__(self) -> WalRaftStorage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
