"""The host journal (``raft/_journal.py``): one fdatasync per pass for every group.

Group WALs are written unsynced and the journal holds the same writes; these
tests lose the unsynced tail of group WALs (what a power cut does to the page
cache) and check that the journal brings back every write, per group, in
whatever order the groups are opened.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from quorumlog import rpc
from quorumlog.raft import ConfState, Entry, HardState, WalRaftStorage
from quorumlog.raft._driver import HostConfig, RaftHost
from quorumlog.raft._journal import (
    JOURNAL_DIR_NAME,
    HostJournal,
    JournalRecord,
    PendingWrite,
    split_write,
)
from quorumlog.wal import WalConfig, WalEntry

from .driver_support import EchoMachine

CONFIG = WalConfig(segment_size_bytes=1 << 20)


def _apply(log: dict[int, int], record: JournalRecord) -> None:
    """A truncating append on a log of index -> term (the model)."""
    if record.entries:
        first = record.entries[0][0]
        for index in [i for i in log if i >= first]:
            del log[index]
        log.update((i, int(d)) for i, d in record.entries)


def test_the_fold_is_one_idempotent_append() -> None:
    """Applying the fold of writes 1..k to the log after any prefix 1..j of
    them gives the log after all k (what replay onto a group WAL that kept
    any prefix of its unsynced writes relies on)."""
    rng = random.Random(15)
    for _ in range(300):
        base = {i: 1 for i in range(1, 11)}  # synced at the checkpoint
        records, log, term = [], dict(base), 1
        for _ in range(rng.randint(1, 8)):
            last = max(log)
            first = rng.randint(max(6, last - 3), last + 1)  # never below what the base keeps
            term += rng.random() < 0.3
            count = rng.randint(0, 4)
            record = JournalRecord(1, 0, f"{term}".encode(),
                                   [(i, str(term).encode()) for i in range(first, first + count)])
            records.append(record)
            _apply(log, record)
        fold = PendingWrite()
        for record in records:
            fold.fold(record)
        merged = JournalRecord(1, 0, fold.state, [(e.index, e.data) for e in fold.entries])
        for kept in range(len(records) + 1):
            prefix = dict(base)
            for record in records[:kept]:
                _apply(prefix, record)
            _apply(prefix, merged)
            assert prefix == log, (records, kept)
        assert fold.state == records[-1].state


def _lose_unsynced_tail(group_dir: Path, keep_bytes: int) -> None:
    """Zero everything in the group's newest WAL segment after its first
    ``keep_bytes`` (what was synced), as a power cut loses unsynced pages."""
    segment = sorted((group_dir / "wal").glob("*.wal"))[-1]
    data = bytearray(segment.read_bytes())
    data[keep_bytes:] = bytes(len(data) - keep_bytes)
    segment.write_bytes(bytes(data))


def _written_bytes(group_dir: Path) -> int:
    segment = sorted((group_dir / "wal").glob("*.wal"))[-1]
    return len(segment.read_bytes().rstrip(b"\0"))


def _open(root: Path, journal: HostJournal, group_id: int) -> WalRaftStorage:
    return WalRaftStorage.open(root / f"g{group_id}", conf_state=ConfState(voters=frozenset({1})),
                               config=CONFIG, journal=journal, group_id=group_id)


def test_groups_get_their_lost_writes_back_from_the_journal(tmp_path: Path) -> None:
    journal = HostJournal.open(tmp_path / JOURNAL_DIR_NAME, config=CONFIG)
    groups = {g: _open(tmp_path, journal, g) for g in (1, 2)}
    synced = {g: _written_bytes(tmp_path / f"g{g}") for g in groups}
    for n in range(2, 40):
        for g, storage in groups.items():
            entries = [Entry(term=2, index=n, data=f"g{g}-{n}".encode())]
            storage.persist(HardState(term=2, vote=1, commit=n - 1), entries, None,
                            must_sync=True)
            storage.install(HardState(term=2, vote=1, commit=n - 1), entries, None)
        journal.flush(sync=True)
    # A new leader's log wins in group 2: its tail from index 30 is replaced.
    replaced = [Entry(term=3, index=i, data=f"g2-new-{i}".encode()) for i in (30, 31)]
    groups[2].persist(HardState(term=3, vote=1, commit=29), replaced, None, must_sync=True)
    journal.flush(sync=True)
    for storage in groups.values():
        storage.close()
    journal.close()
    for g in groups:
        _lose_unsynced_tail(tmp_path / f"g{g}", synced[g])

    # Group 2 opens first; group 1's fold is carried through a checkpoint.
    journal = HostJournal.open(tmp_path / JOURNAL_DIR_NAME, config=CONFIG)
    two = _open(tmp_path, journal, 2)
    assert [e.data for e in two.entries(29, 32, 1 << 20)] == [b"g2-29", b"g2-new-30",
                                                             b"g2-new-31"]
    assert two.last_index() == 31 and two.hard_state() == HardState(term=3, vote=1, commit=29)
    journal.checkpoint()
    journal.close()
    two.close()

    journal = HostJournal.open(tmp_path / JOURNAL_DIR_NAME, config=CONFIG)
    assert journal.take_pending(2) is None  # written to its WAL and synced before
    one = _open(tmp_path, journal, 1)
    assert [e.data for e in one.entries(2, 40, 1 << 20)] == [
        f"g1-{n}".encode() for n in range(2, 40)]
    assert one.hard_state().commit == 38
    one.close()
    journal.close()


def test_without_the_journal_the_lost_tail_stays_lost(tmp_path: Path) -> None:
    """The loss the test above repairs is real (the check can fail)."""
    journal = HostJournal.open(tmp_path / JOURNAL_DIR_NAME, config=CONFIG)
    storage = _open(tmp_path, journal, 1)
    synced = _written_bytes(tmp_path / "g1")
    entries = [Entry(term=2, index=n, data=b"x" * 100) for n in range(2, 20)]
    storage.persist(HardState(term=2, vote=1, commit=1), entries, None, must_sync=True)
    journal.flush(sync=True)
    storage.close()
    journal.close()
    _lose_unsynced_tail(tmp_path / "g1", synced)
    with WalRaftStorage.open(tmp_path / "g1", config=CONFIG) as bare:
        assert bare.last_index() < 19


def test_a_checkpoint_lets_the_journal_shrink(tmp_path: Path) -> None:
    journal = HostJournal.open(tmp_path / JOURNAL_DIR_NAME, config=CONFIG, checkpoint_bytes=4096)
    storage = _open(tmp_path, journal, 1)
    for n in range(2, 600):
        entries = [Entry(term=2, index=n, data=b"y" * 200)]
        storage.persist(HardState(term=2, vote=1, commit=n - 1), entries, None, must_sync=True)
        journal.flush(sync=True)
    storage.close()
    journal.close()
    segments = list((tmp_path / JOURNAL_DIR_NAME).glob("*.wal"))
    assert len(segments) <= 2  # 120 KB written, 1 MiB segments: the covered ones go
    journal = HostJournal.open(tmp_path / JOURNAL_DIR_NAME, config=CONFIG)
    pending = journal.take_pending(1)
    assert pending is None or len(pending.entries) <= 4096 // 200 + 1
    journal.close()


MIB = 1 << 20


def test_a_write_larger_than_a_wal_record_is_journaled_in_pieces(tmp_path: Path) -> None:
    """A follower catching up receives up to 64 MiB of entries in one pass; a WAL
    record holds 16 MiB. Before the write was split, flush failed the node:
    "WalEntry(index=2) has 31458... bytes of data; the limit is 16777200". The
    write comes back whole after the group loses its unsynced tail, also when
    its fold is carried through a checkpoint before the group opens."""
    journal = HostJournal.open(tmp_path / JOURNAL_DIR_NAME, config=CONFIG)
    storage = _open(tmp_path, journal, 1)
    synced = _written_bytes(tmp_path / "g1")
    entries = [Entry(term=2, index=n, data=bytes([n]) * MIB) for n in range(2, 32)]  # 30 MiB
    storage.persist(HardState(term=2, vote=1, commit=31), entries, None, must_sync=True)
    journal.flush(sync=True)
    storage.close()
    journal.close()
    _lose_unsynced_tail(tmp_path / "g1", synced)

    journal = HostJournal.open(tmp_path / JOURNAL_DIR_NAME, config=CONFIG)
    journal.checkpoint()  # group 1 not open: its 30 MiB fold is carried, in pieces
    journal.close()
    journal = HostJournal.open(tmp_path / JOURNAL_DIR_NAME, config=CONFIG)
    one = _open(tmp_path, journal, 1)
    assert [e.data for e in one.entries(2, 32, 64 * MIB)] == [e.data for e in entries]
    assert one.hard_state() == HardState(term=2, vote=1, commit=31)
    one.close()
    journal.close()


def test_a_torn_split_write_leaves_a_prefix_of_its_entries_and_the_old_state() -> None:
    """The pieces carry the reset first and the hard state last: replaying any
    prefix of them gives a prefix of the write's entries and, until the last
    piece, the hard state from before (never a commit past the entries)."""
    entries = [WalEntry(index=n, data=b"e%d" % n + b"." * 90) for n in range(5, 25)]
    records = split_write(7, 5, b"new-state", entries, entry_bytes_max=250)
    assert len(records) == 10 and all(sum(len(d) for _, d in r.entries) <= 250
                                      for r in records)  # 2 entries of 92-93 bytes each
    assert [r.reset_index for r in records] == [5] + [0] * 9
    assert [r.state for r in records] == [None] * 9 + [b"new-state"]
    for kept in range(1, len(records) + 1):
        fold = PendingWrite()
        fold.fold(JournalRecord(7, 0, b"old-state", [(i, b"old") for i in range(1, 30)]))
        for record in records[:kept]:
            fold.fold(record)
        got = [(e.index, e.data) for e in fold.entries]
        assert got == [(e.index, e.data) for e in entries][:len(got)]
        assert len(got) == sum(len(r.entries) for r in records[:kept])
        assert fold.state == (b"new-state" if kept == len(records) else b"old-state")
        assert fold.floor == 5
    # One entry over the bound is a record of its own; an empty write is one record.
    big = [WalEntry(index=1, data=b"x" * 300), WalEntry(index=2, data=b"y")]
    assert [len(r.entries) for r in split_write(7, 0, None, big, entry_bytes_max=250)] == [1, 1]
    assert split_write(7, 0, b"s", []) == [JournalRecord(7, 0, b"s", [])]


def test_a_host_restarts_with_every_acknowledged_proposal_after_losing_tails(
    tmp_path: Path,
) -> None:
    """Real driver, 4 single-member groups: proposals acknowledged, the host
    stops without a checkpoint (as after SIGKILL), the groups' unsynced WAL
    tails are lost; a restarted host applies every acknowledged proposal."""
    groups = (1, 2, 3, 4)
    config = HostConfig(tick_interval_ms=20, election_timeout_ticks=5, wal=CONFIG,
                        journal_checkpoint_bytes=1 << 30)

    async def run(propose: bool) -> dict[int, list[bytes]]:
        address = f"127.0.0.1:{_free_port()}"
        host = RaftHost(1, {1: address}, tmp_path, config=config)
        machines = {g: EchoMachine() for g in groups}
        for g in groups:
            host.add_group(g, {1}, machines[g])
        await host.start()
        try:
            for g in groups:
                await _wait_leader(host, g)
            if propose:
                synced = {g: _written_bytes(tmp_path / f"group-{g:016x}") for g in groups}
                results = await asyncio.gather(*(
                    host.propose(g, f"{g}-{n}".encode()) for n in range(50) for g in groups))
                assert len(results) == 200
                # Stop as a kill does: no closing checkpoint.
                journal, host._journal = host._journal, None
                assert journal is not None
                await host.close()
                journal.close()
                for g in groups:
                    _lose_unsynced_tail(tmp_path / f"group-{g:016x}", synced[g])
            else:
                for g in groups:
                    await _wait_applied(host, g, machines[g], 50)
        finally:
            await host.close()
        return {g: machines[g].items for g in groups}

    rpc.run(run(True))
    after = rpc.run(run(False))
    for g in groups:
        assert sorted(after[g]) == sorted(f"{g}-{n}".encode() for n in range(50))


def _free_port() -> int:
    from quorumlog.node._cluster import free_port
    return free_port()


async def _wait_leader(host: RaftHost, group: int) -> None:
    from quorumlog.raft import Role

    from .driver_support import wait_until
    await wait_until(lambda: host.group(group).node.role is Role.LEADER, timeout_s=10.0,
                     what=f"group {group} leader")


async def _wait_applied(host: RaftHost, group: int, machine: EchoMachine, count: int) -> None:
    from .driver_support import wait_until
    await wait_until(lambda: len(machine.items) >= count, timeout_s=10.0,
                     what=f"group {group} applies {count} entries")


pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")


@pytest.mark.parametrize(("inline_max", "sync_thread"), [(4, "MainThread"), (0, "raft-io")])
def test_small_passes_sync_on_the_loop_and_the_ack_still_waits_for_the_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inline_max: int, sync_thread: str,
) -> None:
    """``inline_sync_entries_max``: a one-entry pass fdatasyncs on the event loop
    (no hop to the I/O thread); either way the proposal is answered only after
    an fdatasync that followed it."""
    import os
    import threading

    syncs: list[str] = []
    real = os.fdatasync

    def recording_fdatasync(fd: int) -> None:
        real(fd)
        syncs.append(threading.current_thread().name)

    config = HostConfig(tick_interval_ms=20, election_timeout_ticks=5, wal=CONFIG,
                        inline_sync_entries_max=inline_max)

    async def run() -> None:
        host = RaftHost(1, {1: f"127.0.0.1:{_free_port()}"}, tmp_path, config=config)
        host.add_group(1, {1}, EchoMachine())
        await host.start()
        try:
            await _wait_leader(host, 1)
            monkeypatch.setattr(os, "fdatasync", recording_fdatasync)
            assert await host.propose(1, b"one") == b"one"
            assert syncs, "the proposal was answered before any fdatasync"
            assert syncs[0].startswith(sync_thread), syncs
        finally:
            monkeypatch.setattr(os, "fdatasync", real)
            await host.close()

    rpc.run(run())
