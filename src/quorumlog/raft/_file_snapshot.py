"""Snapshots made of files: a state machine's checkpoint directory on disk.

A state machine whose state is a set of files (a RocksDB instance) should not
pack them into ``Snapshot.data``: a 10 GiB partition would need 10 GiB of
memory and a full copy per snapshot. Such a machine implements
:class:`FileSnapshotMachine`; the host then keeps, per group::

    group-<id>/checkpoints/<index:016x>/   the files of the snapshot at index
                                           (the machine's checkpoint: RocksDB
                                           hard-links its SST files, no copy)

and the Raft snapshot record (``snap/*.snap``, with index, term, conf state
and the **epoch**, as Curve persists its epoch with the snapshot) holds only a
small :class:`FileSnapshotManifest`: the machine's metadata and the name and
size of each file. The transfer streams those files chunk by chunk
(``_snapshot_transfer``); the receiver writes them into a staging directory,
which the host renames into ``checkpoints/`` before it steps the SNAP message
into the core; the install hands that directory to ``restore_files``.

Durability order, so a crash anywhere leaves a member that restarts cleanly:
the checkpoint's files and directory are fsynced and renamed into place before
the snapshot record that names them is written; a directory no persisted
snapshot names (a ``.tmp`` cut short, a transfer the core refused, a replaced
snapshot) is removed by :meth:`Checkpoints.purge` when the group opens and
after each newer snapshot.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import msgspec

from quorumlog.errors import CorruptionError, ProtocolError, StorageError
from quorumlog.raft._log_tail import write_log_tail
from quorumlog.raft._types import Entry, Snapshot

CHECKPOINTS_DIR_NAME = "checkpoints"
"""Checkpoint directories of a group, under the group's storage directory."""

TEMP_SUFFIX = ".tmp"
"""A checkpoint being made; renamed to its final name once synced."""

MANIFEST_MAGIC = b"QLFSNAP1"
"""First bytes of a file snapshot's ``Snapshot.data``: refuses anything else."""

FILE_SNAPSHOT_FILES_MAX = 1000
"""Files one checkpoint may have (the transfer's part limit is 1024, one part
is the manifest); a RocksDB checkpoint of a partition has far fewer."""


class StateMachine(Protocol):
    """What a group applies its committed entries to (deterministically); its
    snapshots are bytes (``Snapshot.data``). See also FileSnapshotMachine."""

    def apply(self, index: int, data: bytes) -> Any: ...

    def snapshot(self) -> bytes: ...

    def restore(self, data: bytes) -> None: ...


@runtime_checkable
class FileSnapshotMachine(Protocol):
    """A state machine whose snapshots are directories of files (see the module doc).

    ``snapshot_files(directory)`` creates ``directory`` (it does not exist)
    holding a consistent checkpoint of everything applied so far, cheaply
    (hard links), and returns small metadata (bytes) that ``restore_files``
    gets back. ``restore_files(directory, metadata)`` makes the machine's state
    that of the checkpoint, unless it already holds everything in it (a
    restart), skipping ``LOG_TAIL_FILE_NAME`` (the driver's, see
    ``_log_tail``); it must leave ``directory`` as it found it (it stays the
    group's snapshot, sent to other members later): link or copy its files,
    never move or change them.
    """

    def apply(self, index: int, data: bytes) -> Any: ...

    def snapshot_files(self, directory: Path) -> bytes: ...

    def restore_files(self, directory: Path, metadata: bytes) -> None: ...


class SnapshotFile(msgspec.Struct, frozen=True, array_like=True):
    name: str
    size_bytes: int


class FileSnapshotManifest(msgspec.Struct, frozen=True, array_like=True):
    """What ``Snapshot.data`` holds for a file snapshot."""

    metadata: bytes
    files: list[SnapshotFile]


_ENCODER = msgspec.msgpack.Encoder()
_MANIFEST_DECODER = msgspec.msgpack.Decoder(FileSnapshotManifest)


def encode_manifest(manifest: FileSnapshotManifest) -> bytes:
    return MANIFEST_MAGIC + _ENCODER.encode(manifest)


def decode_manifest(data: bytes) -> FileSnapshotManifest:
    """The manifest in a snapshot's data; ProtocolError if it is not one."""
    if not data.startswith(MANIFEST_MAGIC):
        raise ProtocolError(
            f"snapshot data ({len(data)} bytes) is not a file snapshot manifest: the group's "
            "state machine keeps its snapshots as files, the sender's does not")
    try:
        manifest = _MANIFEST_DECODER.decode(memoryview(data)[len(MANIFEST_MAGIC):])
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProtocolError(f"malformed file snapshot manifest: {exc}") from None
    if len(manifest.files) > FILE_SNAPSHOT_FILES_MAX:
        raise ProtocolError(
            f"file snapshot of {len(manifest.files)} files > {FILE_SNAPSHOT_FILES_MAX}")
    return manifest


def list_files(directory: Path) -> list[SnapshotFile]:
    """The regular files of a checkpoint directory, by name (flat: no subdirectories)."""
    files = []
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        if not entry.is_file(follow_symlinks=False):
            raise StorageError(
                f"checkpoint {directory} holds {entry.name!r}, which is not a regular file; "
                "a file snapshot is a flat directory of files")
        files.append(SnapshotFile(name=entry.name, size_bytes=entry.stat().st_size))
    if len(files) > FILE_SNAPSHOT_FILES_MAX:
        raise StorageError(
            f"checkpoint {directory} has {len(files)} files > {FILE_SNAPSHOT_FILES_MAX}")
    return files


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_files(directory: Path) -> None:
    """fsync every file of ``directory`` and the directory (hard links of synced
    files cost nothing; files a checkpoint copied or a transfer wrote do)."""
    for entry in os.scandir(directory):
        fd = os.open(entry.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fsync_directory(directory)


class Checkpoints:
    """The checkpoint directories of one group (see the module docstring)."""

    def __init__(self, group_directory: Path) -> None:
        self.directory = group_directory / CHECKPOINTS_DIR_NAME

    def path(self, index: int) -> Path:
        return self.directory / f"{index:016x}"

    def take(self, machine: FileSnapshotMachine, index: int, *,
             log_tail: list[Entry] | None = None) -> tuple[Path, bytes]:
        """Have the machine checkpoint into a temporary directory (event loop:
        the cut must be consistent with ``index``), with ``log_tail`` as one
        more file (``_log_tail``); return it and the manifest."""
        self.directory.mkdir(parents=True, exist_ok=True)
        temp = self.directory / f"{index:016x}{TEMP_SUFFIX}"
        shutil.rmtree(temp, ignore_errors=True)
        metadata = machine.snapshot_files(temp)
        if log_tail:
            write_log_tail(temp, log_tail)
        manifest = FileSnapshotManifest(metadata=metadata, files=list_files(temp))
        return temp, encode_manifest(manifest)

    def seal(self, temp: Path, index: int) -> None:
        """Make a taken checkpoint durable under its final name (I/O thread)."""
        fsync_files(temp)
        self._replace(temp, index)

    def adopt(self, received: Path, index: int, manifest: FileSnapshotManifest) -> None:
        """Move a received (verified, fsynced) file set into place as the
        checkpoint at ``index``, after checking it is the manifest's."""
        present = list_files(received)
        if present != manifest.files:
            raise ProtocolError(
                f"received snapshot files {[f.name for f in present][:8]} do not match the "
                f"manifest's {[f.name for f in manifest.files][:8]}")
        self.directory.mkdir(parents=True, exist_ok=True)
        self._replace(received, index)

    def _replace(self, source: Path, index: int) -> None:
        target = self.path(index)
        if target.exists():
            # Left by a snapshot that was never recorded (a refused transfer):
            # no snapshot record names it, or the index would not be offered again.
            shutil.rmtree(target)
        os.rename(source, target)
        fsync_directory(self.directory)

    def check(self, snapshot: Snapshot) -> tuple[Path, FileSnapshotManifest]:
        """The checkpoint of a persisted snapshot, checked against its manifest."""
        manifest = decode_manifest(snapshot.data)
        path = self.path(snapshot.meta.index)
        try:
            present = list_files(path)
        except FileNotFoundError:
            raise CorruptionError(
                f"the snapshot at index {snapshot.meta.index} names checkpoint {path}, which "
                "is missing; remove this member from its group and add it again (it "
                "catches up from the others)") from None
        if present != manifest.files:
            raise CorruptionError(
                f"checkpoint {path} does not hold the files its snapshot record names")
        return path, manifest

    def purge(self, keep_index: int, *, newer_too: bool = False) -> None:
        """Remove the checkpoint directories older than ``keep_index``, and with
        ``newer_too`` (opening: nothing is in flight) every other one as well.
        A newer one may be a received snapshot the core has yet to hand out."""
        if not self.directory.exists():
            return
        keep = self.path(keep_index).name
        for entry in os.scandir(self.directory):
            try:
                index = int(entry.name[:16], 16)
            except ValueError:
                index = -1  # not ours: nothing else belongs here
            if entry.name != keep and (newer_too or index < keep_index):
                shutil.rmtree(entry.path, ignore_errors=True)


AnyStateMachine = StateMachine | FileSnapshotMachine


def restore_machine(machine: AnyStateMachine, group_directory: Path, snapshot: Snapshot) -> None:
    """Bring ``machine`` to ``snapshot`` (persisted already): from its checkpoint
    directory for a file machine, from its bytes otherwise. The bootstrap
    snapshot (no data) holds no state."""
    if not snapshot.data:
        return
    if isinstance(machine, FileSnapshotMachine):
        path, manifest = Checkpoints(group_directory).check(snapshot)
        machine.restore_files(path, manifest.metadata)
    else:
        machine.restore(snapshot.data)
