"""Combined log entries: the write requests that reach a partition leader
between two ready passes share one Raft entry (``combine_entries``), applied
in one RocksDB write batch, each write with its own timestamp, client session
and results; duplication and tombstone collection read every write of it."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from quorumlog.errors import InvariantViolation, UsageError
from quorumlog.raft import Entry, EntryType
from quorumlog.raft._driver import HostConfig, Proposal, RaftHost, combine_queued
from quorumlog.table import (
    CollectGarbage,
    DeleteCommand,
    Done,
    IncrCommand,
    IncrResult,
    SetCommand,
    TableEntry,
    TableStore,
    TimetagClock,
    WriteCommand,
    block_of,
    combine_entries,
    decode_log_entry,
    encode_entry,
    entries_of,
    make_timetag,
)
from quorumlog.table._dup_gc import unconfirmed_horizon_us
from quorumlog.table._layout import PartitionRecord, TableLayout, TableRecord, group_id_of
from quorumlog.table._machine import PartitionMachine
from quorumlog.table._service import TableConfig, TableService
from quorumlog.table._sessions import US_PER_S
from rpc.support import run, wait_until

T0_US = 1_700_000_000 * US_PER_S
GROUP = 7


def _write(seq: int, command: WriteCommand, *, client: int = 5,
           timestamp_us: int | None = None) -> TableEntry:
    return TableEntry(timestamp_us=T0_US + seq if timestamp_us is None else timestamp_us,
                      commands=(command,), client_id=client, seq=seq,
                      first_outstanding_seq=seq)


def _machine(path: Path) -> PartitionMachine:
    return PartitionMachine(TableStore(path / "db", cluster_id=1), TimetagClock(),
                            path / "staging")


def _records(store: TableStore) -> list[tuple[bytes, bytes, bytes, int]]:
    page, _ = store.stored_page(None, 10_000, 1 << 30)
    return [(h, s, r.value, r.timetag) for h, s, r in page]


def test_one_or_many_entries_round_trip() -> None:
    writes = [_write(seq, SetCommand(b"h", b"s%d" % seq, b"v")) for seq in range(1, 21)]
    single = encode_entry(writes[0])
    assert decode_log_entry(single) == writes[0]
    assert entries_of(single) == [writes[0]]
    for count in (1, 2, 15, 16, 20):  # a msgpack fixarray up to 15, array16 above
        assert decode_log_entry(combine_entries([encode_entry(w) for w in writes[:count]])) \
            == writes[:count]
    with pytest.raises(UsageError):
        combine_entries([])
    collection = TableEntry(T0_US, (), gc=CollectGarbage(0, 0, False))
    with pytest.raises(InvariantViolation):
        decode_log_entry(combine_entries([single, encode_entry(collection)]))


def test_each_write_of_a_combined_entry_keeps_its_timestamp_and_results(
        tmp_path: Path) -> None:
    machine = _machine(tmp_path)
    results = machine.apply(1, combine_entries([
        encode_entry(_write(1, SetCommand(b"h", b"a", b"1"), client=5)),
        encode_entry(_write(1, IncrCommand(b"h", b"n", 7), client=6)),
        encode_entry(_write(2, DeleteCommand(b"h", b"a"), client=5)),
    ]))
    assert results == [[Done()], [IncrResult(7)], [Done()]]
    store = machine.store
    assert store.applied_decree == 1
    assert store.stored_record(b"h", b"n").timetag == make_timetag(T0_US + 1, 1)  # type: ignore[union-attr]
    assert store.stored_record(b"h", b"a").timetag == make_timetag(  # type: ignore[union-attr]
        T0_US + 2, 1, deleted=True)
    # The leader's clock moves past every timestamp of the entry.
    assert machine.clock.next(0) == T0_US + 3
    # A replay of the decree (a restart) applies nothing and answers each write.
    assert machine.apply(1, combine_entries([encode_entry(_write(3, SetCommand(
        b"h", b"z", b"z")))] * 2)) == [[], []]
    assert store.get(b"h", b"z", 0) is None


def test_a_retry_combined_with_its_first_attempt_applies_once(tmp_path: Path) -> None:
    """The second attempt reads the session the first one wrote in the same
    write batch: it gets the first result, the counter moves once."""
    machine = _machine(tmp_path)
    first = encode_entry(_write(1, IncrCommand(b"h", b"n", 1)))
    again = encode_entry(_write(1, IncrCommand(b"h", b"n", 1), timestamp_us=T0_US + 9))
    after = encode_entry(TableEntry(T0_US + 10, (IncrCommand(b"h", b"n", 1),), client_id=5,
                                    seq=2, first_outstanding_seq=1))  # 1 still unanswered
    assert machine.apply(1, combine_entries([first, again, after])) == [
        [IncrResult(1)], [IncrResult(1)], [IncrResult(2)]]
    assert machine.store.get(b"h", b"n", 0) == b"2"
    assert machine.apply(2, again) == [IncrResult(1)]  # kept across entries as before


def test_a_combined_entry_leaves_what_its_writes_one_by_one_leave(tmp_path: Path) -> None:
    rng = random.Random(11)
    writes = []
    seqs = {client: 0 for client in (1, 2, 3)}
    for number in range(200):
        client = rng.choice((1, 2, 3))
        if rng.random() < 0.2 and seqs[client]:
            seq = seqs[client]  # a retry of the client's last write
        else:
            seqs[client] += 1
            seq = seqs[client]
        key = b"k%d" % rng.randrange(8)
        choices: list[WriteCommand] = [
            SetCommand(b"h", key, b"v%d" % number), DeleteCommand(b"h", key),
            IncrCommand(b"c", key, rng.randrange(1, 5))]
        command = rng.choice(choices)
        writes.append(TableEntry(T0_US + number, (command,), client_id=client, seq=seq,
                                 first_outstanding_seq=seq))
    one_by_one, combined = _machine(tmp_path / "one"), _machine(tmp_path / "combined")
    answers = [one_by_one.apply(decree, encode_entry(w))
               for decree, w in enumerate(writes, start=1)]
    combined_answers: list[object] = []
    decree = 0
    position = 0
    while position < len(writes):
        size = rng.randrange(1, 12)
        part = writes[position:position + size]
        decree += 1
        combined_answers += combined.apply(
            decree, combine_entries([encode_entry(w) for w in part]))
        position += size
    assert combined_answers == answers
    assert _records(combined.store) == _records(one_by_one.store)


def test_duplication_and_collection_read_every_write_of_a_combined_entry(
        tmp_path: Path) -> None:
    machine = _machine(tmp_path)
    data = combine_entries([
        encode_entry(_write(1, SetCommand(b"x", b"1", b"a"), timestamp_us=T0_US + 10)),
        encode_entry(_write(2, SetCommand(b"y", b"2", b"b"), timestamp_us=T0_US + 20)),
    ])
    machine.apply(1, data)
    block = block_of([Entry(term=1, index=1, type=EntryType.NORMAL, data=data)], machine.store)
    assert sorted(block.commands) == [b"x", b"y"]
    assert block.oldest_timestamp_us == T0_US + 10

    class Log:
        def retained_entries(self, group_id: int, lo: int, hi: int,
                             max_bytes: int) -> list[Entry]:
            return [Entry(term=1, index=1, type=EntryType.NORMAL, data=data)]

    assert unconfirmed_horizon_us(Log(), GROUP, 0, 1) == T0_US + 10 - 1


def _proposal(data: bytes, combinable: bool = True) -> Proposal:
    return Proposal(asyncio.get_running_loop().create_future(), data, combinable=combinable)


def test_queued_runs_of_combinable_proposals_become_one_proposal_each() -> None:
    async def main() -> None:
        queued = [_proposal(b"a"), _proposal(b"b"), _proposal(b"c", False), _proposal(b"d"),
                  _proposal(b"e"), _proposal(b"f"), _proposal(b"g" * 10)]
        out = combine_queued(queued, b"+".join, count_max=2, bytes_max=8)
        assert [p.data for p in out] == [b"a+b", b"c", b"d+e", b"f", b"g" * 10]
        assert out[2].future is not queued[3].future and out[3] is queued[5]
        out[0].future.set_result(["A", "B"])
        out[2].future.set_exception(UsageError("lost"))
        await asyncio.sleep(0)
        assert (queued[0].future.result(), queued[1].future.result()) == ("A", "B")
        for member in queued[3:5]:
            with pytest.raises(UsageError):
                member.future.result()

    run(main())


def test_the_host_proposes_the_writes_of_one_pass_as_one_entry(tmp_path: Path) -> None:
    async def main() -> None:
        machine = _machine(tmp_path / "replica")
        host = RaftHost(1, {1: "127.0.0.1:1"}, tmp_path / "raft",
                        config=HostConfig(tick_interval_ms=10))
        await host.start()
        other: PartitionMachine | None = None
        try:
            host.add_group(GROUP, {1}, machine, combine=combine_entries)
            group = host.group(GROUP)
            # Leading, with the leader's own empty entry applied.
            await wait_until(lambda: group.node.leader_id == 1 and group.applied_index
                             == group.storage.last_index() > 1, timeout_s=30)
            before = group.applied_index
            futures = [host.propose_nowait(GROUP, encode_entry(
                _write(seq, IncrCommand(b"h", b"n", 1))), combine=True)
                for seq in range(1, 6)]
            assert await asyncio.gather(*futures) == [[IncrResult(n)] for n in range(1, 6)]
            assert group.applied_index == before + 1
            [entry] = host.retained_entries(GROUP, before + 1, before + 2, 1 << 20)
            assert len(entries_of(entry.data)) == 5
            # Without combine each proposal is an entry of its own.
            assert await host.propose(GROUP, encode_entry(_write(
                6, IncrCommand(b"h", b"n", 1)))) == [IncrResult(6)]
            assert group.applied_index == before + 2
            other = _machine(tmp_path / "other")
            host.add_group(GROUP + 1, {1}, other)
            with pytest.raises(UsageError, match="without a combiner"):
                host.propose_nowait(GROUP + 1, b"x", combine=True)
        finally:
            await host.close()
            machine.store.close()
            if other is not None:
                other.store.close()

    run(main())


def test_a_table_node_opens_partition_groups_that_combine_writes_and_broadcast_commits(
        tmp_path: Path) -> None:
    """TableService adds each partition's group with the combiner and with the
    commit broadcast of TableConfig.broadcast_commit (on by default)."""
    async def main() -> None:
        for broadcast in (True, False):
            service = TableService(1, "127.0.0.1:1", ["127.0.0.1:2"],
                                   tmp_path / f"node-{broadcast}",
                                   None if broadcast
                                   else TableConfig(broadcast_commit=broadcast))
            layout = TableLayout("t", TableRecord(table_id=3, partitions=1, replicas=1,
                                                  created_ms=0), (PartitionRecord((1,)),))
            try:
                service._open_replica(layout, 0)
                group = service.host.group(group_id_of(3, 0))
                assert group.combine is combine_entries
                assert group.node._config.broadcast_commit is broadcast
            finally:
                await service.close()

    run(main())
