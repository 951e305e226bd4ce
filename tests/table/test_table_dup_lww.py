"""Duplicate writes at the store: last writer wins by timetag (timestamp, then
cluster id), tombstones carry their timetag, and the partition's clock moves
past shipped timetags so a later local write wins everywhere."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from quorumlog.table import (
    DeleteCommand,
    Done,
    DuplicateCommand,
    Refused,
    SetCommand,
    TableEntry,
    TableStore,
    TimetagClock,
    WriteCommand,
    encode_entry,
    make_timetag,
)
from quorumlog.table._machine import PartitionMachine

T0_S = 1_700_000_000
US = 1_000_000


class Replica:
    def __init__(self, path: Path, cluster_id: int) -> None:
        self.store = TableStore(path, cluster_id=cluster_id)
        self.decree = 0

    def write(self, *commands: WriteCommand, at_s: float = T0_S) -> list[object]:
        self.decree += 1
        return list(self.store.apply(self.decree, TableEntry(int(at_s * US), commands)))

    def record(self, sort_key: bytes) -> tuple[bytes, int] | None:
        for item in self.store.scan(b"h", T0_S, limit=100).items:
            if item.sort_key == sort_key:
                return item.value, item.timetag
        return None


@pytest.fixture
def replica(tmp_path: Path) -> Iterator[Replica]:
    r = Replica(tmp_path / "store", cluster_id=2)
    yield r
    r.store.close()


def dup(sort_key: bytes, value: bytes, at_s: float, cluster_id: int, *,
        deleted: bool = False, expire_ts_s: int = 0) -> DuplicateCommand:
    timetag = make_timetag(int(at_s * US), cluster_id, deleted=deleted)
    return DuplicateCommand(b"h", ((sort_key, b"" if deleted else value, expire_ts_s,
                                    timetag),))


def test_newer_duplicate_wins_and_keeps_its_timetag(replica: Replica) -> None:
    replica.write(SetCommand(b"h", b"s", b"local"), at_s=T0_S)
    assert replica.write(dup(b"s", b"remote", T0_S + 1, 1), at_s=T0_S + 2) == [Done()]
    assert replica.record(b"s") == (b"remote", make_timetag((T0_S + 1) * US, 1))


def test_older_duplicate_is_dropped(replica: Replica) -> None:
    replica.write(SetCommand(b"h", b"s", b"local"), at_s=T0_S + 5)
    assert replica.write(dup(b"s", b"remote", T0_S + 1, 1)) == [Done()]
    assert replica.record(b"s") == (b"local", make_timetag((T0_S + 5) * US, 2))


def test_equal_timestamps_are_ordered_by_cluster_id(replica: Replica) -> None:
    replica.write(dup(b"s", b"from-3", T0_S, 3))
    replica.write(dup(b"s", b"from-1", T0_S, 1))  # same time, lower cluster id: dropped
    assert replica.record(b"s") == (b"from-3", make_timetag(T0_S * US, 3))
    replica.write(dup(b"s", b"from-4", T0_S, 4))
    assert replica.record(b"s") == (b"from-4", make_timetag(T0_S * US, 4))


def test_a_replayed_duplicate_changes_nothing(replica: Replica) -> None:
    command = dup(b"s", b"v", T0_S, 1)
    replica.write(command)
    replica.write(command)
    assert replica.record(b"s") == (b"v", make_timetag(T0_S * US, 1))


def test_tombstones_ship_and_win_over_older_writes(replica: Replica) -> None:
    replica.write(SetCommand(b"h", b"s", b"v"), at_s=T0_S)
    replica.write(dup(b"s", b"", T0_S + 2, 1, deleted=True))
    assert replica.store.get(b"h", b"s", T0_S + 3) is None
    # A late write older than the tombstone does not bring the value back.
    replica.write(dup(b"s", b"late", T0_S + 1, 1))
    assert replica.store.get(b"h", b"s", T0_S + 3) is None
    # A local delete older than a shipped value loses to it the same way on the
    # other side: here the newer value wins over the tombstone.
    replica.write(dup(b"s", b"newer", T0_S + 4, 1))
    assert replica.store.get(b"h", b"s", T0_S + 5) == b"newer"
    replica.write(DeleteCommand(b"h", b"s"), at_s=T0_S + 6)
    assert replica.store.get(b"h", b"s", T0_S + 7) is None


def test_expire_time_travels_with_the_record(replica: Replica) -> None:
    replica.write(dup(b"s", b"v", T0_S, 1, expire_ts_s=T0_S + 10))
    assert replica.store.ttl_s(b"h", b"s", T0_S + 4) == 6
    assert replica.store.get(b"h", b"s", T0_S + 10) is None


def test_malformed_duplicates_are_refused_and_change_nothing(replica: Replica) -> None:
    bad = [DuplicateCommand(b"h", ((b"s", b"v", 0, 0),)),  # no cluster id
           DuplicateCommand(b"h", ((b"s", b"v", 0, make_timetag(T0_S * US, 1, deleted=True)),)),
           DuplicateCommand(b"", ((b"s", b"v", 0, make_timetag(T0_S * US, 1)),)),
           DuplicateCommand(b"h", ((b"s", b"v", -1, make_timetag(T0_S * US, 1)),))]
    for command in bad:
        [result] = replica.write(command)
        assert isinstance(result, Refused)
    assert replica.store.full_scan(T0_S).items == []


def test_local_writes_after_a_shipped_record_get_larger_timetags(tmp_path: Path) -> None:
    """The remote cluster's clock is ahead: the partition's clock follows the
    shipped timetag, so a later local write wins here and on the other side."""
    store = TableStore(tmp_path / "s", cluster_id=2)
    clock = TimetagClock()
    machine = PartitionMachine(store, clock, tmp_path / "staging")
    ahead_us = (T0_S + 100) * US
    machine.apply(1, encode_entry(TableEntry(T0_S * US, (dup(b"s", b"r", T0_S + 100, 1),))))
    assert clock.next(T0_S * US) > ahead_us
    store.close()
