"""WalRaftStorage: restart returns exactly what was saved; Raft nodes restart from it."""

from __future__ import annotations

import random
from pathlib import Path

import msgspec
import pytest

from quorumlog.errors import CorruptionError, StorageError, UsageError
from quorumlog.raft import (
    SNAPSHOT_FILES_KEPT,
    ConfChange,
    ConfChangeSingle,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    HardState,
    MemoryStorage,
    RaftNode,
    Snapshot,
    SnapshotMeta,
    WalRaftStorage,
)
from quorumlog.wal import Wal, WalConfig, WalEntry, inspect

from .conftest import Golden
from .network import Network

BIG = 1 << 40
SMALL_SEGMENTS = WalConfig(segment_size_bytes=64 * 1024)
VOTERS = ConfState(voters=frozenset({1, 2, 3}))


def dump(storage: WalRaftStorage | MemoryStorage) -> tuple[object, ...]:
    first, last = storage.first_index(), storage.last_index()
    entries = storage.entries(first, last + 1, BIG) if last >= first else []
    return (storage.initial_state(), storage.snapshot(), first, last, entries)


def test_bootstrap_matches_memory_storage(tmp_path: Path) -> None:
    with WalRaftStorage.open(tmp_path / "g", conf_state=VOTERS, config=SMALL_SEGMENTS) as st:
        assert dump(st) == dump(MemoryStorage(VOTERS))
    other = ConfState(frozenset({9}))
    with WalRaftStorage.open(tmp_path / "g", conf_state=other, config=SMALL_SEGMENTS) as again:
        assert again.initial_state() == (HardState(term=1, commit=1), VOTERS)  # stored wins
    with WalRaftStorage.open(tmp_path / "joiner", config=SMALL_SEGMENTS) as joiner:
        assert dump(joiner) == dump(MemoryStorage())


def test_restart_returns_what_was_saved(tmp_path: Path) -> None:
    path = tmp_path / "g"
    memory = MemoryStorage(VOTERS)
    with WalRaftStorage.open(path, conf_state=VOTERS, config=SMALL_SEGMENTS) as storage:
        batches = [
            (HardState(term=2, vote=1, commit=1), [Entry(2, 2), Entry(2, 3, data=b"a" * 500)]),
            (HardState(term=2, vote=1, commit=3), [Entry(2, 4, data=b"b" * 70_000)]),
            (None, [Entry(2, i, data=b"c" * 300) for i in range(5, 60)]),
            (HardState(term=3, vote=2, commit=4), [Entry(3, 5, data=b"new")]),  # rewrites 5..
        ]
        for hard_state, entries in batches:
            storage.save(hard_state, entries, None, must_sync=True)
            memory.append(entries)
            if hard_state is not None:
                memory.set_hard_state(hard_state)
        assert dump(storage) == dump(memory)
    with WalRaftStorage.open(path, config=SMALL_SEGMENTS) as reopened:
        assert dump(reopened) == dump(memory)
        assert reopened.last_index() == 5 and reopened.term(5) == 3


def test_follower_snapshot_then_entries(tmp_path: Path) -> None:
    path = tmp_path / "g"
    snap = Snapshot(
        meta=SnapshotMeta(index=40, term=4, conf_state=ConfState(frozenset({1, 2, 3, 4})),
                          epoch=7),
        data=b"state",
    )
    with WalRaftStorage.open(path, config=SMALL_SEGMENTS) as storage:  # a joining member
        storage.save(HardState(term=4, commit=40), [], snap, must_sync=True)
        storage.save(HardState(term=4, commit=41), [Entry(4, 41), Entry(4, 42)], None,
                     must_sync=True)
    with WalRaftStorage.open(path, config=SMALL_SEGMENTS) as reopened:
        assert reopened.snapshot() == snap
        assert reopened.initial_state() == (HardState(term=4, commit=41), snap.meta.conf_state)
        assert (reopened.first_index(), reopened.last_index()) == (41, 42)


def test_snapshot_compaction_and_release(tmp_path: Path) -> None:
    path = tmp_path / "g"
    with WalRaftStorage.open(path, conf_state=VOTERS, config=SMALL_SEGMENTS) as storage:
        for start in range(2, 400, 20):
            entries = [Entry(2, i, data=b"x" * 1000) for i in range(start, start + 20)]
            storage.save(HardState(term=2, commit=start + 19), entries, None, must_sync=False)
        segments_before = len(list((path / "wal").glob("*.wal")))
        snap = storage.create_snapshot(300, VOTERS, b"app", 5)
        with pytest.raises(UsageError, match="persist_snapshot first"):
            storage.release_wal(300)
        storage.persist_snapshot(snap)
        storage.compact(300)
        storage.release_wal(300)
        assert len(list((path / "wal").glob("*.wal"))) < segments_before
        expected = dump(storage)
    with WalRaftStorage.open(path, config=SMALL_SEGMENTS) as reopened:
        assert reopened.snapshot() == snap
        assert reopened.first_index() == 301 and reopened.last_index() == 401
        assert dump(reopened)[1:] == expected[1:]


def test_old_snapshot_files_are_removed(tmp_path: Path) -> None:
    """Every snapshot used to stay in snap/ forever; the newest few are kept."""
    path = tmp_path / "g"
    with WalRaftStorage.open(path, conf_state=VOTERS, config=SMALL_SEGMENTS) as storage:
        entries = [Entry(2, i, data=b"x" * 100) for i in range(2, 60)]
        storage.save(HardState(term=2, commit=59), entries, None, must_sync=False)
        snaps = []
        for index in range(10, 60, 5):
            snap = storage.create_snapshot(index, VOTERS, f"app@{index}".encode(), 5)
            storage.persist_snapshot(snap)
            snaps.append(snap)
        files = sorted(p.name for p in (path / "snap").glob("*.snap"))
        assert len(files) == SNAPSHOT_FILES_KEPT < len(snaps)
        assert files[-1].endswith(f"{snaps[-1].meta.index:016x}.snap")
    with WalRaftStorage.open(path, config=SMALL_SEGMENTS) as reopened:
        assert reopened.snapshot() == snaps[-1]


def test_a_torn_last_save_is_gone_after_restart(tmp_path: Path) -> None:
    path = tmp_path / "g"
    with WalRaftStorage.open(path, conf_state=VOTERS, config=SMALL_SEGMENTS) as storage:
        storage.save(HardState(term=2, vote=1, commit=3), [Entry(2, 2), Entry(2, 3)], None,
                     must_sync=True)
        expected = dump(storage)
        records_before = len(inspect(path / "wal", records_limit=10_000).records)
        storage.save(HardState(term=2, vote=1, commit=5), [Entry(2, 4, data=b"x" * 2000),
                                                           Entry(2, 5)], None, must_sync=True)
    # The crash tore the last save: its frames never reached the disk.
    torn = inspect(path / "wal", records_limit=10_000).records[records_before:]
    assert [r.type for r in torn][-1] == "state"
    segment = path / "wal" / torn[0].segment
    with segment.open("r+b") as fh:
        fh.seek(torn[0].offset)
        fh.write(bytes(sum(r.frame_bytes for r in torn)))
    with WalRaftStorage.open(path, config=SMALL_SEGMENTS) as reopened:
        assert dump(reopened) == expected


def test_creation_cut_short_is_redone(tmp_path: Path) -> None:
    path = tmp_path / "g"
    (path / "wal.tmp").mkdir(parents=True)
    (path / "wal.tmp" / "junk").write_bytes(b"half-made")
    with WalRaftStorage.open(path, conf_state=VOTERS) as storage:
        assert storage.initial_state()[1] == VOTERS
    assert not (path / "wal.tmp").exists()


def test_entry_record_with_the_wrong_index_is_corruption(tmp_path: Path) -> None:
    path = tmp_path / "g"
    with WalRaftStorage.open(path, conf_state=VOTERS):
        pass
    wal = Wal.open(path / "wal", snapshot=None)
    wal.read_all()
    wal.save(None, [WalEntry(index=2, data=msgspec.msgpack.encode(Entry(2, 3)))], sync=True)
    wal.close()
    with pytest.raises(CorruptionError, match="holds Raft entry 3"):
        WalRaftStorage.open(path)


def test_not_a_raft_wal(tmp_path: Path) -> None:
    Wal.create(tmp_path / "g" / "wal", b"bookie-journal").close()
    with pytest.raises(CorruptionError, match="not a Raft WAL"):
        WalRaftStorage.open(tmp_path / "g")


def test_a_version_1_wal_is_refused_with_what_to_do(tmp_path: Path) -> None:
    # Version 1 entries began with the driver's 8-byte proposal id; handing
    # them to a state machine as they are would apply garbage.
    Wal.create(tmp_path / "g" / "wal", b"quorumlog-raft/1").close()
    with pytest.raises(StorageError, match=r"older quorumlog.*add it again"):
        WalRaftStorage.open(tmp_path / "g")


class WalNetwork(Network):
    """The test network with every node on WalRaftStorage in ``root``."""

    def __init__(self, root: Path, ids: list[int], **config: object) -> None:
        # (small segments: preallocating 64 MiB per node is slow in tests)
        self.root = root
        self.wal_storages: dict[int, WalRaftStorage] = {}
        super().__init__(ids, **config)  # type: ignore[arg-type]

    def start(self, node_id: int, *, applied: int = 0) -> RaftNode:
        conf = ConfState(voters=frozenset({1, 2, 3}))
        storage = WalRaftStorage.open(self.root / f"node-{node_id}",
                                      conf_state=conf if node_id <= 3 else None,
                                      config=SMALL_SEGMENTS)
        self.wal_storages[node_id] = storage
        self.storages[node_id] = storage  # type: ignore[assignment]
        node = RaftNode(self.make_config(node_id), storage, random.Random(node_id),
                        applied=applied)
        self.nodes[node_id] = node
        self.applied.setdefault(node_id, [])
        self.epochs.setdefault(node_id, [])
        self.down.discard(node_id)
        return node

    def crash(self, node_id: int) -> None:
        super().crash(node_id)
        self.wal_storages[node_id].close()

    def handle_ready(self, node_id: int) -> None:
        node = self.nodes[node_id]
        if node_id in self.down or not node.has_ready():
            return
        rd = node.ready()
        self.wal_storages[node_id].save(rd.hard_state, rd.entries, rd.snapshot,
                                        must_sync=rd.must_sync)
        self.queue.extend(rd.messages)
        if rd.snapshot is not None:
            self.applied[node_id] = [rd.snapshot.data]
        self.applied[node_id].extend(
            e.data for e in rd.committed_entries if e.type == EntryType.NORMAL and e.data
        )
        node.advance(rd)

    def close(self) -> None:
        for node_id, storage in self.wal_storages.items():
            if node_id not in self.down:
                storage.close()


def test_raft_nodes_restart_from_the_wal(tmp_path: Path, golden: Golden) -> None:
    net = WalNetwork(tmp_path, [1, 2, 3], seed=61)
    try:
        net.elect(1)
        net.propose(1, b"a", b"b")
        net.start(4)
        net.change(1, ConfChange(changes=(ConfChangeSingle(ConfChangeType.ADD_NODE, 4),)))
        leader = net.nodes[1]
        snap = net.wal_storages[1].create_snapshot(leader.applied_index, leader.conf_state,
                                                   b"a,b", leader.epoch)
        net.wal_storages[1].persist_snapshot(snap)
        net.wal_storages[1].compact(leader.applied_index)
        net.propose(1, b"c")
        before = {i: (n.epoch, n.conf_state, n.commit_index, n.term) for i, n in net.nodes.items()}
        for node_id in (1, 2, 3, 4):
            net.crash(node_id)
        for node_id in (1, 2, 3, 4):
            net.restart(node_id)
        assert {i: (n.commit_index, n.term) for i, n in net.nodes.items()} == {
            i: state[2:] for i, state in before.items()
        }
        assert net.nodes[1].epoch == before[1][0]  # from its snapshot, nothing to re-apply
        net.deliver()  # the others re-apply their logs: same epoch and configuration
        after = {i: (n.epoch, n.conf_state, n.commit_index, n.term) for i, n in net.nodes.items()}
        assert after == before
        assert net.applied[1] == [b"c"]  # the rest is in node 1's snapshot
        assert net.applied[2] == [b"a", b"b", b"c"]
        leader_id = net.tick_until_leader()
        net.propose(leader_id, b"d")
        net.show()
        golden.check("restart_wal", net.text())
        for node_id in (1, 2, 3, 4):
            assert net.applied[node_id][-1] == b"d"
            assert net.nodes[node_id].epoch == before[1][0] + 1
    finally:
        net.close()
