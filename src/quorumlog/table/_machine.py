"""The Raft state machine of one partition replica: a TableStore.

Snapshots are RocksDB checkpoints, kept as files (``raft.FileSnapshotMachine``):
``snapshot_files`` makes a checkpoint in the directory the Raft host gives it
(RocksDB hard-links the SST files: no copy) and returns the applied decree as
the snapshot's metadata. The host keeps that directory as the group's snapshot
and streams its files, chunk by chunk, to a replica that lags behind the
compacted log. ``restore_files`` installs such a directory: it hard-links the
immutable SST files (and copies the few small files RocksDB rewrites on open)
into a fresh directory that the store renames into place, so the checkpoint
itself stays intact for the next transfer.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import msgspec

from quorumlog.errors import StorageError, invariant
from quorumlog.raft import LOG_TAIL_FILE_NAME
from quorumlog.table._commands import (
    DuplicateCommand,
    TableEntry,
    WriteCommand,
    WriteResult,
    decode_log_entry,
)
from quorumlog.table._store import TableStore
from quorumlog.table._timetag import TimetagClock

IMMUTABLE_FILE_SUFFIXES = (".sst", ".blob")
"""RocksDB files never written after creation: shared by hard links. Every other
file of a checkpoint (CURRENT, MANIFEST, OPTIONS, WAL) is small and copied,
since RocksDB may rewrite or append to it once the store opens it."""


class _CheckpointMetadata(msgspec.Struct, frozen=True):
    decree: int


_ENCODE = msgspec.msgpack.Encoder()
_DECODE_METADATA = msgspec.msgpack.Decoder(_CheckpointMetadata)


class PartitionMachine:
    """The Raft state machine of one partition replica (``raft.FileSnapshotMachine``)."""

    def __init__(self, store: TableStore, clock: TimetagClock, staging: Path) -> None:
        self.store = store
        self.clock = clock
        self._staging = staging

    def apply(self, index: int, data: bytes) -> list[WriteResult] | list[list[WriteResult]]:
        """The results of a TableEntry; of a combined entry, one list per entry
        it holds (what ``RaftHost`` hands each combined proposal)."""
        entry = decode_log_entry(data)
        if isinstance(entry, TableEntry):
            self._observe(entry)
            return self.store.apply(index, entry)
        for each in entry:
            self._observe(each)
        return self.store.apply_combined(index, entry)

    def _observe(self, entry: TableEntry) -> None:
        self.clock.observe(entry.timestamp_us)
        observe_duplicates(self.clock, entry.commands)

    def snapshot_files(self, directory: Path) -> bytes:
        """A RocksDB checkpoint of the store in ``directory`` (hard links)."""
        decree = self.store.checkpoint(directory)
        return _ENCODE.encode(_CheckpointMetadata(decree=decree))

    def restore_files(self, directory: Path, metadata: bytes) -> None:
        """Install the checkpoint in ``directory`` (left as it is), unless the
        store already holds everything in it (a restart: the store is at or past
        the snapshot's decree)."""
        try:
            decree = _DECODE_METADATA.decode(metadata).decree
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise StorageError(f"snapshot metadata of checkpoint {directory} is malformed: "
                               f"{exc}") from None
        if self.store.applied_decree >= decree:
            return
        self._staging.mkdir(parents=True, exist_ok=True)
        temp = Path(tempfile.mkdtemp(dir=self._staging, prefix="restore-"))
        try:
            target = temp / "checkpoint"
            target.mkdir()
            for source in sorted(directory.iterdir()):
                if source.name != LOG_TAIL_FILE_NAME:  # the Raft host's, not RocksDB's
                    _link_or_copy(source, target / source.name)
            _fsync(target)  # the new names survive a crash once the store points at them
            self.store.restore(target)
        finally:
            shutil.rmtree(temp, ignore_errors=True)
        invariant(self.store.applied_decree == decree, "a restored checkpoint holds its decree")


def observe_duplicates(clock: TimetagClock, commands: tuple[WriteCommand, ...]) -> None:
    """Move the clock past the timetags of shipped records: a local write after
    a duplicate write then gets a larger timetag, as it does on the cluster the
    record came from (last writer wins the same way on both)."""
    for command in commands:
        if isinstance(command, DuplicateCommand):
            for record in command.records:
                clock.observe(record[3] >> 8)


def _link_or_copy(source: Path, target: Path) -> None:
    if source.name.endswith(IMMUTABLE_FILE_SUFFIXES):
        try:
            os.link(source, target)
            return
        except OSError:
            pass  # another file system (staging elsewhere): copy instead
    shutil.copyfile(source, target)
    _fsync(target)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
