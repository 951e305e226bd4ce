"""Partition replicas behind real Raft hosts (rpc on 127.0.0.1, real WALs, real
RocksDB): a replica stopped while the leader writes, snapshots and compacts
receives the partition as its RocksDB checkpoint files, streamed in chunks,
with Python memory growth far below the partition size; its contents are
then identical to the leader's, timetags included, and the epoch persisted
with the snapshot survives a restart."""

from __future__ import annotations

import asyncio
import os
import tracemalloc
from pathlib import Path

from quorumlog.node._cluster import free_ports
from quorumlog.raft._driver import RaftHost
from quorumlog.table import SetCommand, TableEntry, TableStore, TimetagClock, encode_entry
from quorumlog.table._machine import PartitionMachine
from raft.driver_support import GROUP, Member, propose_retrying, wait_leader, wait_until
from raft.test_driver_snapshots import config
from rpc.support import run

MIB = 1024 * 1024
VALUE_BYTES = 256 * 1024
PARTITION_BYTES = 32 * MIB
ENTRIES = PARTITION_BYTES // VALUE_BYTES
# Sender and receiver share this process: each side has a few 1 MiB chunks in
# flight. The old path held the packed checkpoint whole on each side (the
# sender's snapshot bytes, the receiver's read-back and decoded files): at
# least twice the partition.
PYTHON_PEAK_GROWTH_BYTES_MAX = PARTITION_BYTES // 2
CATCH_UP_DEADLINE_S = 60.0


class PartitionMember(Member):
    """A driver_support Member whose state machine is a partition replica."""

    async def start(self, voters: set[int] | None, on_role_change: object = None) -> None:
        root = self.root / f"replica-{self.node_id}"
        self.machine = PartitionMachine(  # type: ignore[assignment]
            TableStore(root / "db", cluster_id=1), TimetagClock(), root / "staging")
        host = RaftHost(self.node_id, self.addresses, self.root / f"n{self.node_id}",
                        config=self.config)
        await self.start_server(host)
        await host.start()
        host.add_group(GROUP, voters, self.machine)  # type: ignore[arg-type]
        self.host = host

    async def stop(self) -> None:
        await super().stop()
        if isinstance(self.machine, PartitionMachine):
            self.machine.store.close()

    @property
    def store(self) -> TableStore:
        assert isinstance(self.machine, PartitionMachine)
        return self.machine.store


def dump(store: TableStore) -> list[tuple[bytes, bytes, bytes, int]]:
    """Every record of the store: (hash key, sort key, value, timetag)."""
    items, after = [], None
    while True:
        page = store.full_scan(0, limit=64, after=after)
        items += [(i.hash_key, i.sort_key, i.value, i.timetag) for i in page.items]
        if page.next_after is None:
            return items
        after = page.next_after


def applied(member: Member) -> int:
    return member.host.group(GROUP).applied_index if member.host is not None else -1


def entry(number: int) -> bytes:
    return encode_entry(TableEntry(timestamp_us=1_000_000 + number, commands=(
        SetCommand(b"h%d" % (number % 7), b"s%06d" % number, os.urandom(VALUE_BYTES)),)))


def test_a_lagging_replica_receives_the_checkpoint_in_chunks_with_bounded_memory(
        tmp_path: Path) -> None:
    async def main() -> None:
        addresses = {i: f"127.0.0.1:{port}"
                     for i, port in zip((1, 2, 3), free_ports(3), strict=True)}
        members = [PartitionMember(i, addresses, tmp_path, config()) for i in addresses]
        try:
            for member in members:
                await member.start({1, 2, 3})
            async with asyncio.timeout(120):
                await body(members)
        finally:
            for member in members:
                await member.stop()

    async def body(members: list[PartitionMember]) -> None:  # type: ignore[misc]
        leader = await wait_leader(members)
        follower = next(m for m in members if m is not leader)
        await follower.stop()
        up = [m for m in members if m is not follower]
        for start in range(0, ENTRIES, 4):
            await asyncio.gather(*(propose_retrying(up, entry(n))
                                   for n in range(start, min(start + 4, ENTRIES))))
        leader = await wait_leader(up)
        assert isinstance(leader, PartitionMember) and leader.host is not None
        group = leader.host.group(GROUP)
        await wait_until(lambda: group.storage.first_index() > 3, timeout_s=30,
                         what="the leader compacted its log past the stopped replica")
        tracemalloc.start()
        try:
            await follower.start(None)
            # Opening reads the replica's WAL segments (64 MiB preallocated):
            # count from here, before the leader has noticed the replica.
            tracemalloc.reset_peak()
            base_bytes = tracemalloc.get_traced_memory()[0]
            # Cheap checks only while tracing: a dump holds the whole partition.
            await wait_until(lambda: applied(follower) == applied(leader),
                             timeout_s=CATCH_UP_DEADLINE_S, what="the replica caught up")
            peak_bytes = tracemalloc.get_traced_memory()[1] - base_bytes
        finally:
            tracemalloc.stop()
        assert dump(follower.store) == dump(leader.store)
        assert follower.host is not None
        assert follower.host.snapshot_receive_stats.bytes_received >= PARTITION_BYTES * 3 // 4
        assert peak_bytes < PYTHON_PEAK_GROWTH_BYTES_MAX, peak_bytes
        records = dump(follower.store)
        assert len(records) == ENTRIES and len({r[3] for r in records}) == ENTRIES
        # The epoch persisted with the installed snapshot survives a restart.
        installed = follower.host.group(GROUP).storage.snapshot().meta
        await follower.stop()
        await follower.start(None)
        assert follower.host is not None
        restarted = follower.host.group(GROUP)
        assert restarted.storage.snapshot().meta == installed and installed.epoch >= 1
        assert restarted.node.epoch == installed.epoch
        assert dump(follower.store) == records

    run(main())
