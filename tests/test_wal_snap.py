"""Snapshot files: own CRC, newest valid match, broken ones renamed, mismatch refused."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from quorumlog.errors import CorruptionError
from quorumlog.wal import (
    SnapshotMarker,
    SnapshotMismatchError,
    SnapshotNotFoundError,
    Snapshotter,
    Wal,
    WalEntry,
    valid_snapshot_markers,
)
from quorumlog.wal._snap import decode_snapshot_file, snapshot_file_name


def _marker(term: int, index: int) -> SnapshotMarker:
    return SnapshotMarker(term=term, index=index)


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    snaps = Snapshotter(tmp_path / "snap")
    path = snaps.save(_marker(2, 10), b"state machine at 10")
    assert path.name == "0000000000000002-000000000000000a.snap"
    assert not list(path.parent.glob("*.tmp"))
    loaded = snaps.load(_marker(2, 10), wal_markers=[_marker(2, 10)])
    assert loaded.marker == _marker(2, 10)
    assert loaded.data == b"state machine at 10"


def test_newest_available_matches_the_wal_markers(tmp_path: Path) -> None:
    wal_dir, snap_dir = tmp_path / "wal", tmp_path / "snap"
    snaps = Snapshotter(snap_dir)
    with Wal.create(wal_dir, b"m") as wal:
        wal.save(None, [WalEntry(index=i, data=b"x") for i in range(1, 31)])
        for marker in (_marker(1, 10), _marker(2, 20)):
            snaps.save(marker, b"snap %d" % marker.index)  # file first, then the marker
            wal.save_snapshot(marker)
    snaps.save(_marker(3, 30), b"never recorded in the WAL")  # crashed before save_snapshot
    markers = valid_snapshot_markers(wal_dir)
    assert markers == [_marker(0, 0), _marker(1, 10), _marker(2, 20)]
    newest = snaps.load_newest_available(markers)
    assert newest is not None
    assert newest.marker == _marker(2, 20)
    assert newest.data == b"snap 20"
    contents = Wal.open_read_only(wal_dir, snapshot=newest.marker).read_all()
    assert [e.index for e in contents.entries] == list(range(21, 31))


def test_broken_snapshot_is_renamed_and_an_older_one_used(tmp_path: Path) -> None:
    snaps = Snapshotter(tmp_path)
    snaps.save(_marker(1, 10), b"older")
    newer = snaps.save(_marker(1, 20), b"newer, then damaged on disk")
    image = bytearray(newer.read_bytes())
    image[-3] ^= 0xFF
    newer.write_bytes(bytes(image))
    loaded = snaps.load_newest_available([_marker(1, 10), _marker(1, 20)])
    assert loaded is not None and loaded.data == b"older"
    assert not newer.exists()
    assert newer.with_name(newer.name + ".broken").exists()
    assert snaps.markers() == [_marker(1, 10)]


def test_snapshot_without_a_matching_marker_is_refused(tmp_path: Path) -> None:
    snaps = Snapshotter(tmp_path)
    snaps.save(_marker(2, 20), b"from another term")
    assert snaps.load_newest_available([_marker(1, 20)]) is None
    with pytest.raises(SnapshotNotFoundError, match="no matching marker"):
        snaps.load(_marker(2, 20), wal_markers=[_marker(1, 20)])
    with pytest.raises(SnapshotNotFoundError, match="does not exist"):
        snaps.load(_marker(5, 50), wal_markers=[_marker(5, 50)])


def test_wal_refuses_a_snapshot_of_another_term(tmp_path: Path) -> None:
    with Wal.create(tmp_path, b"m") as wal:
        wal.save(None, [WalEntry(index=i, data=b"x") for i in range(1, 11)])
        wal.save_snapshot(_marker(1, 5))
    with pytest.raises(SnapshotMismatchError, match="ErrSnapshotMismatch"):
        Wal.open(tmp_path, snapshot=_marker(2, 5))
    with Wal.open(tmp_path, snapshot=_marker(1, 5)) as wal:  # the lock was released
        assert [e.index for e in wal.read_all().entries] == list(range(6, 11))


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        (lambda b: b[:20], "truncated"),
        (lambda b: b"\xde\xad\xbe\xef" * 2 + b[8:], "bad header"),
        (lambda b: b + b"extra", "says"),
        (lambda b: b[:30] + bytes([b[30] ^ 1]) + b[31:], "CRC mismatch"),
    ],
)
def test_damaged_snapshot_files_fail_their_checks(
    tmp_path: Path, damage: Callable[[bytes], bytes], needle: str
) -> None:
    path = Snapshotter(tmp_path).save(_marker(1, 1), b"payload bytes")
    image = damage(path.read_bytes())
    with pytest.raises(CorruptionError, match=needle):
        decode_snapshot_file(path, image, _marker(1, 1))


def test_a_file_holding_another_marker_than_its_name_is_refused(tmp_path: Path) -> None:
    snaps = Snapshotter(tmp_path)
    path = snaps.save(_marker(1, 7), b"x")
    renamed = path.with_name(snapshot_file_name(_marker(1, 8)))
    path.rename(renamed)
    assert snaps.load_newest_available([_marker(1, 8)]) is None
    assert renamed.with_name(renamed.name + ".broken").exists()


def test_leftover_temp_files_are_removed(tmp_path: Path) -> None:
    (tmp_path / "0000000000000001-0000000000000001.snap.tmp").write_bytes(b"half")
    Snapshotter(tmp_path)
    assert not list(tmp_path.glob("*.tmp"))
