"""Exactly-once table writes: the partition's store answers a duplicate with its
first result, keeps the sessions in RocksDB (snapshots and restarts carry
them) and bounds them by the entries' timestamps."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

import quorumlog.table._client as client_module
import quorumlog.table._sessions as sessions_module
from quorumlog.table import (
    Done,
    IncrCommand,
    IncrResult,
    Refused,
    SetCommand,
    TableClient,
    TableEntry,
    TableStore,
    TimetagClock,
    encode_entry,
)
from quorumlog.table._layout import PartitionRecord, TableLayout, TableRecord
from quorumlog.table._machine import PartitionMachine
from quorumlog.table._messages import TableWriteRequest, TableWriteResponse
from quorumlog.table._sessions import (
    CLIENT_RESULTS_WINDOW_WRITES,
    CLIENT_SESSION_IDLE_EXPIRY_S,
    EXPIRY_BUCKET_S,
    SESSION_EXPIRED,
    SESSIONS_EXPIRED_PER_ENTRY_MAX,
    STALE_SEQUENCE,
    US_PER_S,
    count_sessions,
)
from rpc.support import run

CLIENT = 77
T0_US = 1_700_000_000 * US_PER_S


def _incr(seq: int, *, first: int | None = None, client: int = CLIENT,
          timestamp_us: int = T0_US) -> TableEntry:
    return TableEntry(timestamp_us=timestamp_us + seq,
                      commands=(IncrCommand(b"h", b"n", 1),), client_id=client, seq=seq,
                      first_outstanding_seq=seq if first is None else first)


def _machine(path: Path) -> PartitionMachine:
    return PartitionMachine(TableStore(path / "db", cluster_id=1), TimetagClock(),
                            path / "staging")


def test_a_duplicate_incr_applies_once_and_gets_the_first_result(tmp_path: Path) -> None:
    with TableStore(tmp_path, cluster_id=1) as store:
        assert store.apply(1, _incr(1)) == [IncrResult(1)]
        assert store.apply(2, _incr(1)) == [IncrResult(1)]  # the retry of seq 1
        assert store.get(b"h", b"n", 0) == b"1"
        assert store.apply(3, _incr(2)) == [IncrResult(2)]
        # Without a proposal id every delivery applies (the old behaviour).
        plain = TableEntry(timestamp_us=T0_US + 10, commands=(IncrCommand(b"h", b"n", 1),))
        store.apply(4, plain)
        store.apply(5, plain)
        assert store.get(b"h", b"n", 0) == b"4"


def test_sessions_survive_a_restart_and_a_snapshot_restore(tmp_path: Path) -> None:
    source = _machine(tmp_path / "a")
    source.apply(1, encode_entry(_incr(1)))
    source.store.close()
    source = _machine(tmp_path / "a")  # restart: the session is in RocksDB
    assert source.apply(2, encode_entry(_incr(1))) == [IncrResult(1)]
    assert source.store.get(b"h", b"n", 0) == b"1"
    target = _machine(tmp_path / "b")
    checkpoint = tmp_path / "checkpoint"
    target.restore_files(checkpoint, source.snapshot_files(checkpoint))
    assert target.apply(3, encode_entry(_incr(1))) == [IncrResult(1)]
    assert target.apply(4, encode_entry(_incr(2))) == [IncrResult(2)]
    assert target.store.get(b"h", b"n", 0) == b"2"


def test_acknowledged_and_out_of_window_writes_are_refused_not_applied(tmp_path: Path) -> None:
    with TableStore(tmp_path, cluster_id=1) as store:
        store.apply(1, _incr(1))
        store.apply(2, _incr(2, first=2))  # the client acknowledged seq 1
        [refused] = store.apply(3, _incr(1))
        assert isinstance(refused, Refused) and refused.code == STALE_SEQUENCE
        last = CLIENT_RESULTS_WINDOW_WRITES + 5
        store.apply(4, _incr(last, first=3))  # seqs 3.. outstanding, but out of the window
        [refused] = store.apply(5, _incr(3, first=3))
        assert isinstance(refused, Refused) and refused.code == STALE_SEQUENCE
        assert store.get(b"h", b"n", 0) == b"3"


def test_idle_sessions_expire_by_entry_time_and_a_known_client_is_told(
        tmp_path: Path) -> None:
    with TableStore(tmp_path, cluster_id=1) as store:
        store.apply(1, _incr(1, client=1))
        store.apply(2, _incr(1, client=2))
        assert count_sessions(store._db) == 2
        later_us = T0_US + (CLIENT_SESSION_IDLE_EXPIRY_S + EXPIRY_BUCKET_S) * US_PER_S
        store.apply(3, TableEntry(timestamp_us=later_us,
                                  commands=(SetCommand(b"h", b"x", b"v"),)))
        assert count_sessions(store._db) == 0
        # Client 1 comes back after an acknowledged write: its retry cannot be
        # told apart from a new write, so the partition refuses it.
        [refused] = store.apply(4, _incr(2, first=2, client=1, timestamp_us=later_us))
        assert isinstance(refused, Refused) and refused.code == SESSION_EXPIRED
        # A new client (first write) starts a session.
        assert store.apply(5, _incr(1, client=3, timestamp_us=later_us)) == [IncrResult(3)]
        assert count_sessions(store._db) == 1


def test_expiry_is_bounded_per_entry_and_keeps_active_sessions(tmp_path: Path) -> None:
    idle = 3 * SESSIONS_EXPIRED_PER_ENTRY_MAX
    with TableStore(tmp_path, cluster_id=1) as store:
        for client in range(1, idle + 1):
            store.apply(client, _incr(1, client=client))
        later_us = T0_US + (CLIENT_SESSION_IDLE_EXPIRY_S + EXPIRY_BUCKET_S) * US_PER_S
        active = idle + 1
        decree = idle
        for round_ in range(3):
            decree += 1
            store.apply(decree, _incr(round_ + 1, first=1, client=active, timestamp_us=later_us))
            assert count_sessions(store._db) == idle + 1 - (round_ + 1) * (
                SESSIONS_EXPIRED_PER_ENTRY_MAX)
        decree += 1
        assert store.apply(decree, _incr(4, first=1, client=active, timestamp_us=later_us)) == [
            IncrResult(idle + 4)]
        assert count_sessions(store._db) == 1
        # The active client's retry of its first write still gets its first answer.
        assert store.apply(decree + 1, _incr(1, client=active, timestamp_us=later_us)) == [
            IncrResult(idle + 1)]


def test_the_client_keeps_one_session_per_partition(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every write to a partition carries the same client id and the next seq;
    the session is made once (it draws its id from the OS)."""
    made: list[object] = []

    class CountedSession(client_module._WriterSession):
        def __init__(self) -> None:
            super().__init__()
            made.append(self)

    monkeypatch.setattr(client_module, "_WriterSession", CountedSession)
    sent: list[TableWriteRequest] = []

    class Pool:
        async def call(self, address: str, request: TableWriteRequest,
                       timeout_s: float) -> TableWriteResponse:
            sent.append(request)
            return TableWriteResponse(results=[Done()])

        async def close(self) -> None:
            return None

    async def main() -> None:
        tables = TableClient(["127.0.0.1:1"])
        tables._pool = Pool()  # type: ignore[assignment]
        tables._layouts["t"] = TableLayout("t", TableRecord(9, 1, 1, 0), (PartitionRecord((1,)),))
        tables._addresses[1] = "127.0.0.1:2"
        try:
            for number in range(3):
                await tables.set("t", b"h", b"s", b"%d" % number)
        finally:
            await tables.close()

    run(main())
    assert len(made) == 1
    assert [(r.client_id, r.seq, r.first_outstanding_seq) for r in sent] == [
        (made[0].client_id, seq, seq) for seq in (1, 2, 3)]  # type: ignore[attr-defined]


def test_a_restore_replaces_the_session_rows_kept_in_memory(tmp_path: Path) -> None:
    """The store keeps its session rows in memory too; a snapshot install
    replaces them with the checkpoint's, or a client's floor would be the
    replaced data's."""
    source = _machine(tmp_path / "a")
    source.apply(5, encode_entry(_incr(1)))  # floor 1: seq 1 may be retried
    target = _machine(tmp_path / "b")
    for seq in (1, 2, 3):
        target.apply(seq, encode_entry(_incr(seq, first=seq)))  # floor 3
    checkpoint = tmp_path / "checkpoint"
    target.restore_files(checkpoint, source.snapshot_files(checkpoint))
    assert target.apply(6, encode_entry(_incr(1))) == [IncrResult(1)]  # the first answer
    assert target.apply(7, encode_entry(_incr(2, first=1))) == [IncrResult(2)]  # applied


@pytest.mark.parametrize("cache_max", [1024, 2])
@pytest.mark.parametrize("seed", range(8))
def test_session_rows_in_memory_answer_as_the_database_does(
        tmp_path: Path, seed: int, cache_max: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Random writes, retries, acknowledgements and idle gaps of a few clients,
    in combined entries: a store that keeps its session rows in memory gives
    the results of one that reads every row from RocksDB (also when the cache
    holds fewer clients than write, and starts over)."""
    monkeypatch.setattr(sessions_module, "SESSION_CACHE_CLIENTS_MAX", cache_max)
    rng = random.Random(seed)
    cached = TableStore(tmp_path / "cached", cluster_id=1)
    reread = TableStore(tmp_path / "reread", cluster_id=1)
    next_seq = dict.fromkeys(range(1, 5), 1)
    first = dict.fromkeys(range(1, 5), 1)
    now_us = T0_US
    for decree in range(1, 300):
        if rng.random() < 0.03:
            now_us += (CLIENT_SESSION_IDLE_EXPIRY_S + EXPIRY_BUCKET_S) * US_PER_S
        now_us += 1
        entries = []
        for _ in range(rng.randint(1, 4)):
            client = rng.randint(1, 4)
            if next_seq[client] > 1 and rng.random() < 0.3:  # a retry, maybe acked already
                seq = rng.randint(max(1, next_seq[client] - 5), next_seq[client] - 1)
            else:
                seq = next_seq[client]
                next_seq[client] += 1
                if rng.random() < 0.4:  # acknowledgements move the floor
                    first[client] = rng.randint(first[client], seq)
            entries.append(TableEntry(
                timestamp_us=now_us, commands=(IncrCommand(b"h", b"%d" % client, 1),),
                client_id=client, seq=seq, first_outstanding_seq=min(first[client], seq)))
        reread._sessions.clear()
        assert cached.apply_combined(decree, entries) == reread.apply_combined(decree, entries)
    assert count_sessions(cached._db) == count_sessions(reread._db)
    cached.close()
    reread.close()
