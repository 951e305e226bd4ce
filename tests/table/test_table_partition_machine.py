"""The partition replica's Raft state machine: snapshots are RocksDB checkpoints
kept as files (hard links), installed without touching the checkpoint."""

from __future__ import annotations

from pathlib import Path

from quorumlog.raft import FileSnapshotMachine
from quorumlog.table import SetCommand, TableEntry, TableStore, TimetagClock, encode_entry
from quorumlog.table._machine import PartitionMachine


def _machine(path: Path) -> PartitionMachine:
    return PartitionMachine(TableStore(path / "db", cluster_id=1), TimetagClock(),
                            path / "staging")


def _set(machine: PartitionMachine, index: int) -> None:
    entry = TableEntry(timestamp_us=index,
                       commands=(SetCommand(b"h", b"%d" % index, b"v" * 1000),))
    machine.apply(index, encode_entry(entry))


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_checkpoint_restores_into_an_empty_replica_and_is_skipped_when_behind(
        tmp_path: Path) -> None:
    source = _machine(tmp_path / "a")
    assert isinstance(source, FileSnapshotMachine)
    for i in range(1, 6):
        _set(source, i)
    checkpoint = tmp_path / "checkpoint"
    metadata = source.snapshot_files(checkpoint)
    # Hard links to the store's SST files, not copies.
    sst = [p for p in checkpoint.iterdir() if p.suffix == ".sst"]
    assert sst and all(p.stat().st_nlink >= 2 for p in sst)
    before = _files(checkpoint)
    target = _machine(tmp_path / "b")
    target.restore_files(checkpoint, metadata)
    assert target.store.applied_decree == 5
    assert [(i.sort_key, i.timetag) for i in target.store.scan(b"h", 0).items] == [
        (i.sort_key, i.timetag) for i in source.store.scan(b"h", 0).items]
    # The checkpoint stays as it was: it is the group's snapshot, sent again later.
    _set(target, 6)
    target.store.close()
    assert _files(checkpoint) == before
    _set(source, 6)
    source.restore_files(checkpoint, metadata)  # the store is past it: nothing is lost
    assert source.store.get(b"h", b"6", 0) == b"v" * 1000
    assert source.store.applied_decree == 6
    assert list((tmp_path / "b" / "staging").iterdir()) == []
