"""Meta backup files and restores, without processes: the file's checks (every
kind of damage is refused with a clear error, never restored), and what a
restored member's Raft storage holds (the state, rebased: ids, sessions and
revision moved ahead, the watch history compacted, run-time member keys
dropped; the new group's voters). The real-process path is in
tests/cluster/test_meta_backup.py."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from quorumlog.errors import CorruptionError, UsageError
from quorumlog.meta import (
    CompactedError,
    CreateSession,
    IdResult,
    MetaStateMachine,
    NextId,
    RangeOp,
    SessionResult,
    read_snapshot_file,
    restore_snapshot,
)
from quorumlog.meta._backup import MetaSnapshotInfo, write_snapshot_file
from quorumlog.raft import WalRaftStorage, group_directory

from .test_state import Log, put

MEMBERS = {1: "127.0.0.1:7101", 2: "127.0.0.1:7102", 3: "127.0.0.1:7103"}


def backup(tmp_path: Path) -> tuple[Path, Log, int, int]:
    """A state with keys, an id counter, a session and a run-time member key,
    saved to a file: (file, log, last ledger id, last session id)."""
    log = Log()
    for i in range(20):
        log.apply(put(f"/app/{i:02d}", f"v{i}".encode()))
    last_id = 0
    for _ in range(3):
        result = log.apply(NextId(name="ledger", count=10))
        assert isinstance(result, IdResult)
        last_id = result.first + 9
    session = log.apply(CreateSession(ttl_ms=10_000))
    assert isinstance(session, SessionResult)
    log.apply(put("/_meta/members/4", b"10.0.0.4:7101"))
    state = log.sm.snapshot()
    info = MetaSnapshotInfo(format=1, taken_at_ms=1, member=1,
                            applied_index=log.sm.applied_index, revision=log.sm.revision,
                            keys=len(log.sm), state_bytes=len(state))
    path = tmp_path / "meta.snap"
    write_snapshot_file(path, info, state)
    return path, log, last_id, session.session_id


def test_a_backup_file_reads_back_and_every_damage_is_refused(tmp_path: Path) -> None:
    path, log, _, _ = backup(tmp_path)
    info, state = read_snapshot_file(path)
    assert (info.revision, info.keys, info.applied_index) == (
        log.sm.revision, len(log.sm), log.sm.applied_index)
    assert state == log.sm.snapshot()
    assert not list(tmp_path.glob(".*.part"))  # written through a temporary file

    data = path.read_bytes()
    damaged = tmp_path / "damaged.snap"
    for position in (9, 20, len(data) // 2, len(data) - 1):  # header, state, digest
        flipped = bytearray(data)
        flipped[position] ^= 0x01
        damaged.write_bytes(bytes(flipped))
        with pytest.raises(CorruptionError, match="SHA-256 mismatch"):
            read_snapshot_file(damaged)
    for size in (len(data) - 1, len(data) // 2, 12):
        damaged.write_bytes(data[:size])
        with pytest.raises(CorruptionError):
            read_snapshot_file(damaged)
    damaged.write_bytes(b"not a snapshot" + data)
    with pytest.raises(UsageError, match="not a quorumlog meta snapshot"):
        read_snapshot_file(damaged)
    with pytest.raises(UsageError, match="no such file"):
        read_snapshot_file(tmp_path / "missing.snap")
    # A consistent file whose state is not a meta state: refused, not restored.
    write_snapshot_file(damaged, msgspec.structs.replace(
        read_snapshot_file(path)[0], state_bytes=3), b"abc")
    with pytest.raises(CorruptionError, match="does not decode"):
        read_snapshot_file(damaged)
    with pytest.raises(CorruptionError):
        restore_snapshot(damaged, tmp_path / "raft", node_id=1, members=MEMBERS)
    assert not (tmp_path / "raft").exists()


def test_a_restored_member_starts_from_the_rebased_state(tmp_path: Path) -> None:
    path, log, last_id, session_id = backup(tmp_path)
    raft_dir = tmp_path / "node-2" / "raft"
    restored = restore_snapshot(path, raft_dir, node_id=2, members=MEMBERS,
                                bump_ids=1000, bump_revision=500)
    assert restored.voters == [1, 2, 3] and restored.index == log.sm.applied_index
    assert restored.revision == log.sm.revision + 500

    with WalRaftStorage.open(group_directory(raft_dir, 1)) as storage:
        hard_state, conf_state = storage.initial_state()
        snapshot = storage.snapshot()
    assert conf_state.voters == frozenset(MEMBERS)
    assert (snapshot.meta.index, hard_state.commit) == (log.sm.applied_index,) * 2
    machine = MetaStateMachine()
    machine.restore(snapshot.data)
    assert [kv.key for kv in machine.range(RangeOp(key="/app/", prefix=True)).kvs] == \
        [f"/app/{i:02d}" for i in range(20)]
    assert machine.get("/_meta/members/4") is None  # the new members come from configs
    assert machine.revision == log.sm.revision + 500
    with pytest.raises(CompactedError):  # no watcher resumes across the restore
        machine.events_since(log.sm.revision, "/app/", prefix=True)
    resumed = Log(machine)
    next_id = resumed.apply(NextId(name="ledger"))
    assert isinstance(next_id, IdResult) and next_id.first == last_id + 1000 + 1
    session = resumed.apply(CreateSession(ttl_ms=10_000))
    assert isinstance(session, SessionResult) and session.session_id == session_id + 1000 + 1
    assert session_id in machine.sessions()  # sessions live at the backup stay

    with pytest.raises(UsageError, match="already has data"):
        restore_snapshot(path, raft_dir, node_id=2, members=MEMBERS)
    with pytest.raises(UsageError, match="not among the meta members"):
        restore_snapshot(path, tmp_path / "node-9" / "raft", node_id=9, members=MEMBERS)
    with pytest.raises(UsageError, match=">= 0"):
        restore_snapshot(path, tmp_path / "node-1" / "raft", node_id=1, members=MEMBERS,
                         bump_ids=-1)


def test_a_large_state_is_saved_in_chunks_and_a_lost_one_is_a_clear_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``save_snapshot`` against a real member over rpc, with 1 KiB chunks: a state
    of ~200 chunks arrives whole; a held state that expires between chunks (as
    on a leader change) makes the save start over, then fail with the reason."""
    import asyncio

    from quorumlog.meta import MetaClient, MetaSnapshotGoneError, _service, save_snapshot

    from .support import one_member

    monkeypatch.setattr(_service, "SNAPSHOT_CHUNK_BYTES", 1024)

    async def main() -> None:
        async with one_member(tmp_path / "member") as member, \
                MetaClient([member.address]) as client:
            for i in range(200):
                await client.put(f"/big/{i:04d}", bytes([i % 256]) * 1000)
            seen: list[tuple[int, int]] = []
            info = await save_snapshot(client, tmp_path / "big.snap",
                                       progress=lambda done, total: seen.append((done, total)))
            assert info.keys == len(member.service.machine) and info.state_bytes > 200 * 1000
            assert len(seen) == -(-info.state_bytes // 1024)  # one call per chunk
            assert seen[-1] == (info.state_bytes, info.state_bytes)
            _, state = read_snapshot_file(tmp_path / "big.snap")
            machine = MetaStateMachine()
            machine.restore(state)
            assert [kv.value for kv in machine.range(RangeOp(key="/big/", prefix=True)).kvs] \
                == [bytes([i % 256]) * 1000 for i in range(200)]

            monkeypatch.setattr(_service, "SNAPSHOT_HELD_S", -1.0)  # gone at once
            with pytest.raises(MetaSnapshotGoneError, match="no longer held"):
                await save_snapshot(client, tmp_path / "lost.snap")
            assert not (tmp_path / "lost.snap").exists()

    asyncio.run(main())
