"""The write-ahead log shared by Raft members and the bookie journal (after etcd's WAL).

API::

    WalConfig(segment_size_bytes=64 MiB, record_size_max_bytes=16 MiB,
              batch_size_max_bytes=64 MiB, pending_size_max_bytes=256 MiB)
    WalEntry(index: int, data: bytes)            # frozen, keyword-only
    SnapshotMarker(term: int, index: int)
    WalContents(metadata: bytes, state: bytes | None, entries: list[WalEntry])

    Wal.exists(dir) -> bool
    Wal.create(dir, metadata, *, config=None) -> Wal          # append mode
    Wal.open(dir, *, snapshot=None, config=None) -> Wal       # append mode, repairs a torn tail
    Wal.open_read_only(dir, *, snapshot=None, config=None) -> Wal
    wal.read_all() -> WalContents                 # once; required after open() before saving
    wal.save(state=None, entries=(), *, sync=True) -> None
    await wal.save_async(state=None, entries=(), *, sync=True) -> None
    wal.save_snapshot(marker) -> None             # always fdatasyncs
    wal.sync() -> None
    wal.release_to(index) -> list[Path]           # unlinked segments
    wal.last_index -> int
    wal.repair_report -> RepairReport | None      # what open() cut, if anything
    wal.close() -> None                           # also a context manager

    Snapshotter(dir).save(marker, data) -> Path
    Snapshotter(dir).load_newest_available(wal_markers) -> Snapshot | None
    Snapshotter(dir).load(marker, *, wal_markers) -> Snapshot
    valid_snapshot_markers(wal_dir) -> list[SnapshotMarker]

    verify(dir) -> VerifySummary                  # raises CorruptionError on damage
    inspect(dir, *, records_limit=0) -> WalReport # never raises for damage
    repair(dir) -> RepairReport | None            # cuts a torn tail of the last segment

Writing: a save encodes its frames (CRC chained) in the caller's thread, then
writes them with one ``pwrite`` and one ``fdatasync``. ``save_async`` hands
the write to one writer thread; saves that queue up while an fdatasync runs
are written together (group commit). A segment is cut when a write leaves it
at or past ``segment_size_bytes``. After an I/O error the WAL refuses writes
until it is closed and opened again.

Reading: ``read_all`` returns the metadata, the last state record and the
entries after the snapshot the WAL was opened at: an entry with index i
replaces every entry >= i read before it; a snapshot marker beyond the last
entry restarts the log after it. With ``snapshot=None`` every segment is read
and the entries start at the first one present. With a snapshot, a marker of
the same index and another term raises :class:`SnapshotMismatchError`; a
snapshot that is not in the WAL raises :class:`SnapshotNotFoundError`.

Appending: entries of one save are contiguous and the first is in
``floor+1 .. last_index+1``, where floor is the snapshot the WAL was read at
(or the newest marker saved since): a suffix may be rewritten, entries up to a
snapshot may not, and gaps are refused (UsageError, nothing written).

Damage: a torn tail of the last segment (the unfinished last write of a crash)
is returned as the valid prefix by a read-only open and cut by an
open-for-append (a copy kept as ``<segment>.broken``). Anything else raises
CorruptionError naming file and byte offset. See docs/wal.md for the format.
"""

from quorumlog.wal._check import (
    RECORDS_LIMIT_DEFAULT,
    RecordInfo,
    SegmentReport,
    VerifySummary,
    WalReport,
    inspect,
    repair,
    valid_snapshot_markers,
    verify,
)
from quorumlog.wal._config import WalConfig
from quorumlog.wal._repair import RepairReport
from quorumlog.wal._snap import Snapshotter
from quorumlog.wal._types import (
    Snapshot,
    SnapshotMarker,
    SnapshotMismatchError,
    SnapshotNotFoundError,
    WalContents,
    WalEntry,
)
from quorumlog.wal._wal import Wal

__all__ = [
    "RECORDS_LIMIT_DEFAULT",
    "RecordInfo",
    "RepairReport",
    "SegmentReport",
    "Snapshot",
    "SnapshotMarker",
    "SnapshotMismatchError",
    "SnapshotNotFoundError",
    "Snapshotter",
    "VerifySummary",
    "Wal",
    "WalConfig",
    "WalContents",
    "WalEntry",
    "WalReport",
    "inspect",
    "repair",
    "valid_snapshot_markers",
    "verify",
]
