"""Tombstone collection as a replicated entry (docs/duplication.md, "Tombstone
GC"): the GC delay, never a tombstone a duplication has not shipped, a late
older duplicate write losing to a tombstone while it exists, the leader's
bound read from the log between confirmed_decree and the mark, and the
bounded scan continuing where it stopped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from quorumlog.table import (
    CollectGarbage,
    DeleteCommand,
    DuplicateCommand,
    SetCommand,
    TableEntry,
    TableStore,
    WriteCommand,
    make_timetag,
)
from quorumlog.table import _store as store_module

T0_S = 1_700_000_000
US = 1_000_000
DELAY_S = 10


class Replica:
    def __init__(self, path: Path) -> None:
        self.store = TableStore(path, cluster_id=1)
        self.decree = self.store.applied_decree

    def write(self, *commands: WriteCommand, at_s: float) -> None:
        self.decree += 1
        self.store.apply(self.decree, TableEntry(int(at_s * US), commands))

    def collect(self, at_s: float, *, mark: int | None = None, horizon_s: float | None = None,
                unshipped_bound: bool = False) -> int:
        before = self.store.collected_records
        self.decree += 1
        horizon_us = int(((at_s - DELAY_S) if horizon_s is None else horizon_s) * US)
        self.store.apply(self.decree, TableEntry(int(at_s * US), (), gc=CollectGarbage(
            mark_decree=self.store.gc_mark if mark is None else mark, horizon_us=horizon_us,
            unshipped_bound=unshipped_bound)))
        return self.store.collected_records - before

    def stored(self, sort_key: bytes) -> bool:
        return self.store.stored_record(b"h", sort_key) is not None


@pytest.fixture
def replica(tmp_path: Path) -> Iterator[Replica]:
    r = Replica(tmp_path / "store")
    yield r
    r.store.close()


def late(sort_key: bytes, at_s: float) -> DuplicateCommand:
    """A duplicate write from cluster 2 with an old timetag, arriving late."""
    return DuplicateCommand(b"h", ((sort_key, b"late", 0, make_timetag(int(at_s * US), 2)),))


def test_a_tombstone_goes_after_the_delay_and_a_late_older_write_loses_to_it_meanwhile(
        replica: Replica) -> None:
    replica.write(SetCommand(b"h", b"s", b"v"), at_s=T0_S)
    replica.write(DeleteCommand(b"h", b"s"), at_s=T0_S + 2)
    assert replica.collect(T0_S + 2 + DELAY_S - 1) == 0  # within the delay: it stays
    replica.write(late(b"s", T0_S + 1), at_s=T0_S + 2 + DELAY_S - 1)
    assert replica.store.get(b"h", b"s", T0_S + 20) is None  # LWW: the tombstone wins
    assert replica.collect(T0_S + 2 + DELAY_S) == 1
    assert not replica.stored(b"s")
    # Why the delay: once it is gone, a write older than it comes back.
    replica.write(late(b"s", T0_S + 1), at_s=T0_S + 30)
    assert replica.store.get(b"h", b"s", T0_S + 30) == b"late"


def test_expired_records_go_after_the_delay_too(replica: Replica) -> None:
    replica.write(SetCommand(b"h", b"t", b"v", ttl_s=1), at_s=T0_S)
    assert replica.collect(T0_S + 5) == 0
    replica.write(late(b"t", T0_S - 1), at_s=T0_S + 5)  # older than the expired write
    assert replica.store.get(b"h", b"t", T0_S + 5) is None
    assert replica.collect(T0_S + DELAY_S + 1) == 1


def test_no_tombstone_written_after_the_mark_goes_while_a_duplication_is_active(
        replica: Replica) -> None:
    """The store bounds the horizon by the entries applied after the mark: the
    leader read confirmed_decree at or below the mark, so those may be unshipped."""
    replica.write(DeleteCommand(b"h", b"old"), at_s=T0_S)
    replica.collect(T0_S + 1, horizon_s=0)  # the mark, after the first delete
    replica.write(DeleteCommand(b"h", b"new"), at_s=T0_S + 1)
    # Far past the delay: without the bound both would go.
    assert replica.collect(T0_S + 1000, unshipped_bound=True) == 1
    assert not replica.stored(b"old") and replica.stored(b"new")
    # The next round (the duplication confirmed meanwhile) takes it.
    assert replica.collect(T0_S + 1001, unshipped_bound=True) == 1
    assert not replica.stored(b"new")


def test_a_collection_read_against_an_older_mark_collects_nothing(replica: Replica) -> None:
    replica.write(DeleteCommand(b"h", b"s"), at_s=T0_S)
    stale = replica.store.gc_mark
    replica.collect(T0_S + 1, horizon_s=0)  # another leader's collection moves the mark
    mark = replica.store.gc_mark
    assert mark != stale
    assert replica.collect(T0_S + 1000, mark=stale) == 0
    assert replica.stored(b"s") and replica.store.gc_mark == mark
    assert replica.collect(T0_S + 1000) == 1


def test_the_mark_and_bound_survive_a_reopen(tmp_path: Path) -> None:
    replica = Replica(tmp_path / "store")
    replica.collect(T0_S, horizon_s=0)
    replica.write(DeleteCommand(b"h", b"s"), at_s=T0_S + 1)
    mark = replica.store.gc_mark
    replica.store.close()
    replica = Replica(tmp_path / "store")
    assert replica.store.gc_mark == mark
    assert replica.collect(T0_S + 1000, unshipped_bound=True) == 0  # still bounded
    replica.store.close()


def test_a_collection_looks_at_a_bounded_number_of_records_and_continues(
        replica: Replica, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "GC_SCAN_RECORDS_MAX", 3)
    for i in range(7):
        replica.write(DeleteCommand(b"h", b"%d" % i), at_s=T0_S)
    assert [replica.collect(T0_S + 100) for _ in range(4)] == [3, 3, 1, 0]
    assert replica.store.full_scan(T0_S + 100).items == []
