"""The partition replica's Raft state machine: snapshots are RocksDB checkpoints."""

from __future__ import annotations

from pathlib import Path

from quorumlog.table import SetCommand, TableEntry, TableStore, TimetagClock, encode_entry
from quorumlog.table._machine import PartitionMachine


def _machine(path: Path) -> PartitionMachine:
    return PartitionMachine(TableStore(path / "db", cluster_id=1), TimetagClock(),
                            path / "staging")


def test_snapshot_restores_into_an_empty_replica_and_is_skipped_when_behind(
        tmp_path: Path) -> None:
    source = _machine(tmp_path / "a")
    for i in range(1, 6):
        entry = TableEntry(timestamp_us=i, commands=(SetCommand(b"h", b"%d" % i, b"v"),))
        source.apply(i, encode_entry(entry))
    snapshot = source.snapshot()
    target = _machine(tmp_path / "b")
    target.restore(snapshot)
    assert target.store.applied_decree == 5
    assert [item.sort_key for item in target.store.scan(b"h", 0).items] == [
        b"1", b"2", b"3", b"4", b"5"]
    source.apply(6, encode_entry(TableEntry(timestamp_us=6, commands=(
        SetCommand(b"h", b"6", b"v"),))))
    source.restore(snapshot)  # the store is past the snapshot: nothing is lost
    assert source.store.get(b"h", b"6", 0) == b"v"
    assert source.store.applied_decree == 6
