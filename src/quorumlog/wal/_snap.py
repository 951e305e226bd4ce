"""Snapshot files ``{term:016x}-{index:016x}.snap`` with their own CRC (etcd's snap package).

Layout (little-endian)::

    offset  size  field
    0       8     magic b"QLSNAP01"
    8       4     crc: CRC32C of bytes 16..end (term, index, length, data)
    12      4     reserved, zero
    16      8     term
    24      8     index
    32      8     data length
    40      n     data (the caller's opaque snapshot)

Saving writes ``<name>.tmp``, fsyncs it, renames it and fsyncs the directory.
Loading checks magic, CRC, length and that term/index match the file name; a
file failing those checks is renamed ``<name>.broken`` and skipped.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Sequence
from pathlib import Path
from struct import Struct

from crc32c import crc32c

from quorumlog.errors import CorruptionError, UsageError
from quorumlog.log import get_logger
from quorumlog.wal._encoder import check_marker
from quorumlog.wal._files import (
    BROKEN_SUFFIX,
    TEMP_SUFFIX,
    ensure_directory,
    fsync_dir,
    read_image,
    write_all,
)
from quorumlog.wal._types import Snapshot, SnapshotMarker, SnapshotNotFoundError

SNAPSHOT_SUFFIX = ".snap"
SNAPSHOT_MAGIC = b"QLSNAP01"
_HEADER = Struct("<8sIIQQQ")
_CRC_COVERED_OFFSET = 16
_SNAP_RE = re.compile(r"^([0-9a-f]{16})-([0-9a-f]{16})\.snap$")
_FILE_MODE = 0o644


def snapshot_file_name(marker: SnapshotMarker) -> str:
    return f"{marker.term:016x}-{marker.index:016x}{SNAPSHOT_SUFFIX}"


def _parse_name(file_name: str) -> SnapshotMarker | None:
    match = _SNAP_RE.match(file_name)
    if match is None:
        return None
    return SnapshotMarker(term=int(match.group(1), 16), index=int(match.group(2), 16))


def encode_snapshot(marker: SnapshotMarker, data: bytes) -> bytes:
    body = _HEADER.pack(SNAPSHOT_MAGIC, 0, 0, marker.term, marker.index, len(data))
    crc = crc32c(data, crc32c(body[_CRC_COVERED_OFFSET:]))
    return _HEADER.pack(SNAPSHOT_MAGIC, crc, 0, marker.term, marker.index, len(data)) + data


def decode_snapshot_file(path: Path, image: bytes, expected: SnapshotMarker) -> Snapshot:
    """The snapshot in ``image``, or a CorruptionError naming ``path`` and why."""
    if len(image) < _HEADER.size:
        raise CorruptionError(f"snapshot file {path} is truncated ({len(image)} bytes)")
    magic, crc, reserved, term, index, length = _HEADER.unpack_from(image, 0)
    if magic != SNAPSHOT_MAGIC or reserved != 0:
        raise CorruptionError(f"snapshot file {path} has a bad header (not a quorumlog snapshot)")
    if length != len(image) - _HEADER.size:
        raise CorruptionError(
            f"snapshot file {path} says {length} data bytes but holds {len(image) - _HEADER.size}"
        )
    actual = crc32c(memoryview(image)[_CRC_COVERED_OFFSET:])
    if actual != crc:
        raise CorruptionError(
            f"snapshot file {path}: CRC mismatch (stored 0x{crc:08x}, computed 0x{actual:08x})"
        )
    marker = SnapshotMarker(term=term, index=index)
    if marker != expected:
        raise CorruptionError(f"snapshot file {path} holds snapshot {marker}, not {expected}")
    return Snapshot(marker=marker, data=image[_HEADER.size :])


class Snapshotter:
    """The snapshot files of one directory.

    Construction creates the directory if needed and removes ``*.tmp`` left
    by a crash during :meth:`save`.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        ensure_directory(self.directory)
        for temp in self.directory.glob(f"*{SNAPSHOT_SUFFIX}{TEMP_SUFFIX}"):
            temp.unlink()

    def save(self, marker: SnapshotMarker, data: bytes) -> Path:
        """Write the snapshot durably (tmp, fsync, rename, fsync dir); return its path.

        Save the file BEFORE the WAL's snapshot marker (``Wal.save_snapshot``),
        so the WAL never names a snapshot that is not on disk.
        """
        check_marker(marker)
        path = self.directory / snapshot_file_name(marker)
        temp = path.with_name(path.name + TEMP_SUFFIX)
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, _FILE_MODE)
        try:
            write_all(fd, encode_snapshot(marker, data), 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temp, path)
        fsync_dir(self.directory)
        return path

    def purge(self, keep: int) -> list[Path]:
        """Remove all but the ``keep`` newest snapshot files (etcd's
        ``--max-snapshots``); return what was removed. ``.broken`` copies stay
        for inspection. Call after the newest one's WAL marker is saved."""
        if keep < 1:
            raise UsageError(f"purge must keep at least one snapshot, not {keep}")
        removed = []
        for marker in self.markers()[keep:]:
            path = self.directory / snapshot_file_name(marker)
            path.unlink(missing_ok=True)
            removed.append(path)
        if removed:
            fsync_dir(self.directory)
        return removed

    def markers(self) -> list[SnapshotMarker]:
        """Markers of the snapshot files present, newest (term, index) first."""
        found = [_parse_name(name) for name in os.listdir(self.directory)]
        return sorted((m for m in found if m is not None),
                      key=lambda m: (m.term, m.index), reverse=True)

    def load_newest_available(self, wal_markers: Sequence[SnapshotMarker]) -> Snapshot | None:
        """The newest valid snapshot whose (term, index) is one of ``wal_markers``.

        ``wal_markers`` comes from :func:`valid_snapshot_markers` of the WAL
        directory. Files that fail their checks are renamed ``.broken`` and the
        next older match is tried; None if nothing matches (etcd: ErrNoSnapshot).
        """
        wanted = set(map(_key, wal_markers))
        for marker in self.markers():
            if _key(marker) not in wanted:
                continue
            with contextlib.suppress(CorruptionError):
                return self._load_or_quarantine(marker)
        return None

    def load(self, marker: SnapshotMarker, *, wal_markers: Sequence[SnapshotMarker]) -> Snapshot:
        """Load the snapshot ``marker``; refused unless the WAL holds that marker."""
        if _key(marker) not in set(map(_key, wal_markers)):
            raise SnapshotNotFoundError(
                f"snapshot {marker} has no matching marker in the WAL; loading it would "
                "pair a snapshot with a log it does not belong to"
            )
        path = self.directory / snapshot_file_name(marker)
        if not path.exists():
            raise SnapshotNotFoundError(f"snapshot file {path} does not exist")
        return self._load_or_quarantine(marker)

    def _load_or_quarantine(self, marker: SnapshotMarker) -> Snapshot:
        path = self.directory / snapshot_file_name(marker)
        try:
            return decode_snapshot_file(path, read_image(path), marker)
        except CorruptionError as exc:
            broken = path.with_name(path.name + BROKEN_SUFFIX)
            os.rename(path, broken)
            fsync_dir(self.directory)
            get_logger(__name__).warning("snapshot_broken", path=str(path), renamed_to=str(broken),
                         reason=exc.message)
            raise


def _key(marker: SnapshotMarker) -> tuple[int, int]:
    return marker.term, marker.index
