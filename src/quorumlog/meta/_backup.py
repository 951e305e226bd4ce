"""Backups of the metadata service: etcd's ``snapshot save``, ``status`` and ``restore``.

Meta holds every ledger's, stream's, table's and bookie's record. It is
replicated, so a lost host is replaced from its peers (docs/deploy.md); a
lost *majority* of meta hosts is not, and needs a backup:

* :func:`save_snapshot` asks the leader for its state, after a linearizable
  read barrier (the backup holds every write acknowledged before it began),
  in chunks (``MetaSnapshotRequest``), and writes it to one file atomically
  (a temporary file, fsync, rename, fsync of the directory).
* :func:`read_snapshot_file` checks a file (``quorumlog meta snapshot
  status``): its magic, header, lengths, SHA-256 and that the state decodes.
* :func:`restore_snapshot` creates one member of a **new** meta group from a
  file (``quorumlog meta snapshot restore``, run on every member with the
  same file): the member's Raft storage starts at a snapshot holding the
  state, with the new group's voters, and the members elect a leader when
  they start. As etcd's restore with ``--bump-revision --mark-compacted``,
  the ids, sessions and revision move ahead (see
  ``MetaStateMachine.rebase_for_restore``): what was handed out after the
  backup is never handed out again.

File layout (big-endian)::

    magic        8 bytes  b"QLMSNAP1"
    header len   u32
    header       msgpack MetaSnapshotInfo
    state        the state machine's snapshot (header.state_bytes bytes)
    sha256       32 bytes over everything before it
"""

from __future__ import annotations

import hashlib
import os
import struct
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import msgspec

from quorumlog.errors import CorruptionError, UsageError
from quorumlog.meta._client import MetaClient
from quorumlog.meta._service import (
    MEMBER_KEY_PREFIX,
    META_GROUP_ID,
    MetaSnapshotGoneError,
)
from quorumlog.meta._state import MetaLimits, MetaStateMachine
from quorumlog.raft import (
    ConfState,
    Snapshot,
    SnapshotMeta,
    WalRaftStorage,
    group_directory,
)
from quorumlog.wal import WalConfig

SNAPSHOT_FILE_MAGIC = b"QLMSNAP1"
SNAPSHOT_FILE_FORMAT = 1
# What a restore moves ahead by default (etcd suggests a bump of the revision
# larger than the writes the cluster could have taken since the backup).
BUMP_IDS_DEFAULT = 1_000_000
BUMP_REVISION_DEFAULT = 1_000_000
RESTORE_TERM = 1
SAVE_ATTEMPTS = 3  # a leader change mid-transfer starts the save over
_LENGTH = struct.Struct(">I")
_HASH_BYTES = 32
_HEADER_BYTES_MAX = 64 * 1024


class MetaSnapshotInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What a backup file holds (its header)."""

    format: int
    taken_at_ms: int  # wall clock of the machine that saved it
    member: int  # the meta member (the leader) it was taken from
    applied_index: int
    revision: int
    keys: int
    state_bytes: int


class RestoredMember(msgspec.Struct, frozen=True, kw_only=True):
    """What :func:`restore_snapshot` created."""

    directory: str
    node_id: int
    voters: list[int]
    index: int
    revision: int  # after the bump: the new group's first revision
    keys: int


_HEADER_DECODER = msgspec.msgpack.Decoder(MetaSnapshotInfo)
_ENCODER = msgspec.msgpack.Encoder()


async def save_snapshot(
    client: MetaClient, path: str | os.PathLike[str], *,
    progress: Callable[[int, int], None] | None = None,
) -> MetaSnapshotInfo:
    """Write a backup of the meta state to ``path`` (replacing it atomically);
    ``progress(done_bytes, total_bytes)`` after each chunk."""
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"{target} is a directory; give a file name for the snapshot")
    if not target.parent.is_dir():
        raise UsageError(f"{target.parent} does not exist; create it first")
    for attempt in range(SAVE_ATTEMPTS):
        try:
            first = await client.snapshot_chunk()
            chunks = [first.chunk]
            done = len(first.chunk)
            if progress is not None:
                progress(done, first.total_bytes)
            while done < first.total_bytes:
                response = await client.snapshot_chunk(first.snapshot_id, done)
                if not response.chunk or response.total_bytes != first.total_bytes:
                    raise MetaSnapshotGoneError(
                        f"meta snapshot {first.snapshot_id} changed while it was read")
                chunks.append(response.chunk)
                done += len(response.chunk)
                if progress is not None:
                    progress(done, first.total_bytes)
        except MetaSnapshotGoneError:
            if attempt == SAVE_ATTEMPTS - 1:
                raise
            continue
        info = MetaSnapshotInfo(
            format=SNAPSHOT_FILE_FORMAT, taken_at_ms=int(time.time() * 1000),
            member=first.member, applied_index=first.applied_index, revision=first.revision,
            keys=first.keys, state_bytes=first.total_bytes)
        write_snapshot_file(target, info, b"".join(chunks))
        return info
    raise AssertionError("unreachable")  # the loop returns or raises


def write_snapshot_file(path: str | os.PathLike[str], info: MetaSnapshotInfo,
                        state: bytes) -> None:
    """The file of :func:`save_snapshot`, written atomically and synced."""
    target = Path(path)
    header = _ENCODER.encode(info)
    body = b"".join((SNAPSHOT_FILE_MAGIC, _LENGTH.pack(len(header)), header, state))
    temporary = target.with_name(f".{target.name}.part")
    with open(temporary, "wb") as file:
        file.write(body)
        file.write(hashlib.sha256(body).digest())
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, target)
    directory = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def read_snapshot_file(path: str | os.PathLike[str]) -> tuple[MetaSnapshotInfo, bytes]:
    """Check a backup file and return its header and state.

    UsageError for a file that is missing or not a meta snapshot at all;
    CorruptionError for one that is damaged (truncated, a flipped byte: the
    SHA-256 does not match, or the state does not decode).
    """
    source = Path(path)
    try:
        data = source.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"{source}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{source} is a directory, not a meta snapshot file") from None
    if not data.startswith(SNAPSHOT_FILE_MAGIC):
        raise UsageError(f"{source} is not a quorumlog meta snapshot (no {SNAPSHOT_FILE_MAGIC!r} "
                         "at its start)")
    if len(data) < len(SNAPSHOT_FILE_MAGIC) + _LENGTH.size + _HASH_BYTES:
        raise CorruptionError(f"{source}: truncated ({len(data)} bytes)")
    body, digest = data[:-_HASH_BYTES], data[-_HASH_BYTES:]
    if hashlib.sha256(body).digest() != digest:
        raise CorruptionError(
            f"{source}: SHA-256 mismatch: the file is damaged or truncated; use another backup")
    (header_bytes,) = _LENGTH.unpack_from(body, len(SNAPSHOT_FILE_MAGIC))
    start = len(SNAPSHOT_FILE_MAGIC) + _LENGTH.size
    if header_bytes > _HEADER_BYTES_MAX or start + header_bytes > len(body):
        raise CorruptionError(f"{source}: header length {header_bytes} out of range")
    try:
        info = _HEADER_DECODER.decode(body[start:start + header_bytes])
    except msgspec.DecodeError as exc:
        raise CorruptionError(f"{source}: bad header: {exc}") from None
    if info.format != SNAPSHOT_FILE_FORMAT:
        raise UsageError(f"{source}: snapshot format {info.format}; this quorumlog reads "
                         f"format {SNAPSHOT_FILE_FORMAT}")
    state = body[start + header_bytes:]
    if len(state) != info.state_bytes:
        raise CorruptionError(f"{source}: the header says {info.state_bytes} bytes of state, "
                              f"the file holds {len(state)}")
    _machine(state, source)  # it decodes
    return info, state


def _machine(state: bytes, source: Path) -> MetaStateMachine:
    # Restored without the running cluster's limits: a backup is restored
    # whatever limits it was taken under (they bound new requests only).
    machine = MetaStateMachine(MetaLimits())
    try:
        machine.restore(state)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError) as exc:
        raise CorruptionError(f"{source}: the meta state does not decode: {exc}") from None
    return machine


def restore_snapshot(
    path: str | os.PathLike[str], raft_dir: str | os.PathLike[str], *,
    node_id: int, members: Mapping[int, str], bump_ids: int = BUMP_IDS_DEFAULT,
    bump_revision: int = BUMP_REVISION_DEFAULT, wal_config: WalConfig | None = None,
) -> RestoredMember:
    """Create member ``node_id`` of a new meta group of ``members`` (id ->
    address, every voter) in ``raft_dir`` (a node's ``<data_dir>/raft``) from
    the backup at ``path``. Run it on every member with the same file, bumps
    and members, before any of them starts. Refused (UsageError) when the
    member already has meta data there."""
    if node_id not in members:
        raise UsageError(f"node {node_id} is not among the meta members {sorted(members)}")
    if bump_ids < 0 or bump_revision < 0:
        raise UsageError("--bump-ids and --bump-revision must be >= 0")
    source = Path(path)
    _, state = read_snapshot_file(source)
    machine = _machine(state, source)
    machine.rebase_for_restore(bump_ids=bump_ids, bump_revision=bump_revision,
                               member_prefix=MEMBER_KEY_PREFIX)
    index = max(machine.applied_index, 1)
    machine.applied_index = index
    voters = frozenset(members)
    snapshot = Snapshot(
        meta=SnapshotMeta(index=index, term=RESTORE_TERM, conf_state=ConfState(voters=voters),
                          epoch=0),
        data=machine.snapshot())
    directory = group_directory(raft_dir, META_GROUP_ID)
    WalRaftStorage.create_from_snapshot(directory, snapshot, config=wal_config)
    return RestoredMember(directory=str(directory), node_id=node_id, voters=sorted(voters),
                          index=index, revision=machine.revision, keys=len(machine))
