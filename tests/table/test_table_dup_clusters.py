"""Duplication between two real local clusters on 127.0.0.1 (cluster ids 1 and
2, 3 node processes each): two-way convergence, a source leader SIGKILLed
mid-stream, a remote outage, skip mode, and the log floor on real nodes.

Cluster "two" starts first; cluster "one" starts knowing it ([clusters] via
QUORUMLOG_CLUSTERS__TWO); then "two" restarts knowing "one".
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import msgspec
import pytest

from quorumlog import node as cluster
from quorumlog.errors import UsageError
from quorumlog.meta import MetaClient
from quorumlog.table import (
    BlockingTableClient,
    DupProgress,
    DupState,
    FailMode,
    NonIdempotentWriteRefusedError,
    TableFlags,
    group_id_of,
)

from .kill_writer import write_through_kill

CONVERGE_DEADLINE_S = 60.0
POLL_INTERVAL_S = 0.2
# A snapshot every 100 entries: with the leader's margin of 1,000 entries
# (HostConfig.compaction_margin_entries), 1,300 writes compact the log past
# a paused duplication unless the floor holds it.
SNAPSHOT_ENTRIES = 100
HELD_WRITES = 1_300
DUP_ENV = {"QUORUMLOG_TABLE__DUP_REFRESH_INTERVAL_MS": "200",
           "QUORUMLOG_TABLE__SNAPSHOT_ENTRIES": str(SNAPSHOT_ENTRIES)}


def environment(values: dict[str, str]) -> Any:
    """Set environment variables for the node processes started inside."""
    return mock.patch.dict(os.environ, values)


def write_spread(client: BlockingTableClient, table: str, count: int) -> None:
    """``count`` sets on 31 hash keys, one after the other: one Raft entry each
    (concurrent writes of one client travel in one request and share an entry,
    and the tests that compact the log count entries)."""
    for i in range(count):
        client.set(table, b"h%d" % (i % 31), b"%d" % i, b"v")


@dataclass
class Clusters:
    one: Path
    two: Path

    def meta(self, which: Path) -> list[str]:
        return cluster.meta_addresses(which)

    def env(self, cluster_id: int, other: str, other_dir: Path) -> dict[str, str]:
        return {**DUP_ENV, "QUORUMLOG_TABLE__CLUSTER_ID": str(cluster_id),
                f"QUORUMLOG_CLUSTERS__{other.upper()}":
                    "[" + ", ".join(f'"{a}"' for a in self.meta(other_dir)) + "]"}


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clusters]:
    one = tmp_path_factory.mktemp("dup-one")
    two = tmp_path_factory.mktemp("dup-two")
    pair = Clusters(one, two)
    # Stop what was started (``up`` writes the cluster file before it waits), so
    # that a start-up failure is reported as itself and not as the clean-up's
    # "no local cluster".
    started: list[Path] = []
    try:
        started.append(two)
        with environment({**DUP_ENV, "QUORUMLOG_TABLE__CLUSTER_ID": "2"}):
            cluster.up(two, 3)
        started.append(one)
        with environment(pair.env(1, "two", two)):
            cluster.up(one, 3)
        cluster.down(two)
        with environment(pair.env(2, "one", one)):
            cluster.up(two, 3)
        yield pair
    finally:
        for directory in started:
            with contextlib.suppress(UsageError):  # up failed before it wrote the file
                cluster.down(directory)


def _cli(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "quorumlog", "dup", *args, "--dir",
                           str(directory)], capture_output=True, text=True, timeout=60,
                          check=False)


def contents(client: BlockingTableClient, table: str) -> dict[tuple[bytes, bytes],
                                                                tuple[bytes, int]]:
    """Every live record with its timetag, over all partitions."""
    partitions = client.table_info(table).record.partitions
    out = {}
    for partition in range(partitions):
        for item in client.scan_records(table, partition):
            out[(item.hash_key, item.sort_key)] = (item.value, item.timetag)
    return out


def wait_converged(a: BlockingTableClient, b: BlockingTableClient, table: str,
                   expect: int | None = None) -> dict[tuple[bytes, bytes], tuple[bytes, int]]:
    deadline = time.monotonic() + CONVERGE_DEADLINE_S
    while True:
        left, right = contents(a, table), contents(b, table)
        if left == right and (expect is None or len(left) == expect):
            return left
        if time.monotonic() > deadline:
            missing = set(left) ^ set(right)
            raise AssertionError(f"{table}: not converged within {CONVERGE_DEADLINE_S} s; "
                                 f"{len(left)} vs {len(right)} records, {len(missing)} keys "
                                 f"differ, e.g. {sorted(missing)[:5]}")
        time.sleep(POLL_INTERVAL_S)


def _paused_dup(one: BlockingTableClient, two: BlockingTableClient, table: str) -> Any:
    """``table`` (1 partition) on both clusters, duplicated one -> two, paused."""
    one.create_table(table, partitions=1, replicas=3)
    two.create_table(table, partitions=1, replicas=3)
    dup = one.add_dup(table, "two")
    one.update_dup(table, dup.dup_id, state=DupState.PAUSE)
    return dup


def test_two_way_duplication_converges(clusters: Clusters) -> None:
    with BlockingTableClient(clusters.meta(clusters.one)) as one, \
            BlockingTableClient(clusters.meta(clusters.two)) as two:
        # partition counts differ, and the source's partitions live in 2 copysets
        one.create_table("conv", partitions=4, replicas=3, copysets=2)
        two.create_table("conv", partitions=2, replicas=3)
        one.add_dup("conv", "two")
        two.add_dup("conv", "one")
        with pytest.raises(NonIdempotentWriteRefusedError):
            one.incr("conv", b"h", b"counter", 1)

        def writes(client: BlockingTableClient, tag: bytes, keys: range) -> None:
            for i in keys:
                client.set("conv", b"h%d" % (i % 17), b"s%d" % i, tag + b"%d" % i)
            for i in keys[::5]:
                client.delete("conv", b"h%d" % (i % 17), b"s%d" % i)

        threads = [threading.Thread(target=writes, args=(one, b"one", range(0, 300))),
                   threading.Thread(target=writes, args=(two, b"two", range(200, 500)))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        both = wait_converged(one, two, "conv")
        # keys never deleted are there; a deleted one may come back only if a set on
        # the other cluster was later than the delete (last writer wins)
        for i in range(500):
            if i % 5:
                assert (b"h%d" % (i % 17), b"s%d" % i) in both
        sources = {timetag >> 1 & 0x7F for _, timetag in both.values()}
        assert sources == {1, 2}
        status = one.dup_progress("conv", one.list_dups("conv")[0].dup_id)
        # one shipper per Raft group (copyset): it ships every partition the group holds
        assert len(status) == 2 and sum(p.shipped_mutations for p in status.values()) > 0
        dup_id = one.list_dups("conv")[0].dup_id
        shown = _cli(clusters.one, "status", "conv", str(dup_id), "-o", "json")
        assert shown.returncode == 0 and '"confirmed_decree"' in shown.stdout
        listed = _cli(clusters.one, "list", "conv")
        assert listed.returncode == 0 and "two" in listed.stdout and "log" in listed.stdout
        for bad in (["status", "conv", "999"], ["set-fail-mode", "conv", str(dup_id), "fast"],
                    ["add", "nosuch", "--remote", "two"], ["add", "conv", "--remote", "two"]):
            result = _cli(clusters.one, *bad)
            assert result.returncode != 0 and "Traceback" not in result.stderr, bad
            assert result.stderr.startswith("error:"), (bad, result.stderr)
        one.set_table_flags("conv", TableFlags(allow_non_idempotent_writes=True))
        deadline = time.monotonic() + 10
        while True:
            try:
                assert one.incr("conv", b"h", b"counter", 5) == 5
                break
            except NonIdempotentWriteRefusedError:
                assert time.monotonic() < deadline, "the flag did not reach the leader"
                time.sleep(POLL_INTERVAL_S)
        wait_converged(one, two, "conv")
        assert two.get("conv", b"h", b"counter") == b"5"


@pytest.mark.slow
def test_source_leader_killed_mid_stream_loses_nothing(clusters: Clusters) -> None:
    with BlockingTableClient(clusters.meta(clusters.one)) as one, \
            BlockingTableClient(clusters.meta(clusters.two)) as two:
        one.create_table("kill", partitions=1, replicas=3)
        two.create_table("kill", partitions=3, replicas=3)
        one.add_dup("kill", "two")
        one.set("kill", b"k", b"0", b"0")
        leader = one._client._leaders[(one.table_info("kill").record.table_id, 0)]
        victim = next(n for n in cluster.load(clusters.one) if n.address == leader)
        acknowledged = write_through_kill(
            lambda i: one.set("kill", b"k%d" % (i % 7), b"%d" % i, b"%d" % i), victim.pid,
            before=100, after=100, deadline_s=30)
        both = wait_converged(one, two, "kill", expect=len(acknowledged) + 1)
        missing = [i for i in acknowledged if (b"k%d" % (i % 7), b"%d" % i) not in both]
        assert not missing
        with environment(clusters.env(1, "two", clusters.two)):  # its [clusters] again
            cluster.restart_node(clusters.one, victim.id, serving_timeout_s=60)


@pytest.mark.slow
def test_remote_outage_loses_nothing_and_skip_mode_counts(clusters: Clusters) -> None:
    with BlockingTableClient(clusters.meta(clusters.one)) as one:
        one.create_table("outage", partitions=2, replicas=3)
        one.create_table("skip", partitions=1, replicas=3)
        with BlockingTableClient(clusters.meta(clusters.two)) as two:
            two.create_table("outage", partitions=2, replicas=3)
            two.create_table("skip", partitions=1, replicas=3)
        slow = one.add_dup("outage", "two")
        skip = one.add_dup("skip", "two")
        one.update_dup("skip", skip.dup_id, fail_mode=FailMode.SKIP)
        cluster.down(clusters.two)
        for i in range(50):
            one.set("outage", b"h%d" % (i % 5), b"%d" % i, b"v%d" % i)
            one.set("skip", b"h", b"%d" % i, b"v%d" % i)
        deadline = time.monotonic() + CONVERGE_DEADLINE_S
        while True:  # skip mode gives up on each hash_key after the remote deadline
            progress = one.dup_progress("skip", skip.dup_id)[0]
            if progress.skipped_mutations > 0 and progress.pending_decrees == 0:
                break
            assert time.monotonic() < deadline, f"skip mode did not skip: {progress}"
            time.sleep(POLL_INTERVAL_S)
        while True:  # slow mode holds on, and says so
            stuck = one.dup_progress("outage", slow.dup_id)
            if all(p.pending_decrees > 0 and p.error and p.lag_ms > 0 for p in stuck.values()):
                break
            assert time.monotonic() < deadline, f"slow mode shows no lag: {stuck}"
            time.sleep(POLL_INTERVAL_S)
        with environment(clusters.env(2, "one", clusters.one)):
            cluster.up(clusters.two, 3)
        with BlockingTableClient(clusters.meta(clusters.two)) as two:
            both = wait_converged(one, two, "outage", expect=50)
            assert len(both) == 50
            assert len(contents(two, "skip")) < 50
        one.update_dup("outage", slow.dup_id, state=DupState.PAUSE)
        assert one.list_dups("outage")[0].state is DupState.PAUSE


@pytest.mark.slow
def test_a_paused_duplication_holds_the_log_until_it_ships(clusters: Clusters) -> None:
    """Without the compaction floor, the leader compacts its log past
    confirmed_decree while the duplication is paused, and the resumed shipper
    finds the log lost and has to resync the partition."""
    with BlockingTableClient(clusters.meta(clusters.one)) as one, \
            BlockingTableClient(clusters.meta(clusters.two)) as two:
        dup = _paused_dup(one, two, "held")

        write_spread(one, "held", HELD_WRITES)
        one.update_dup("held", dup.dup_id, state=DupState.LOG)
        wait_converged(one, two, "held", expect=HELD_WRITES)
        deadline = time.monotonic() + CONVERGE_DEADLINE_S
        while True:  # progress reaches meta at most every dup_progress_interval_ms
            progress = one.dup_progress("held", dup.dup_id)[0]
            assert not progress.log_lost and progress.resyncs == 0, progress
            if progress.pending_decrees == 0 and progress.shipped_mutations >= HELD_WRITES:
                break
            assert time.monotonic() < deadline, progress
            time.sleep(POLL_INTERVAL_S)


GROWN_KEYS = 24


def test_records_grown_past_a_call_since_their_block_was_written_still_ship(
        clusters: Clusters) -> None:
    """A block ships the records its log entries touched as they are stored now.
    While a duplication is paused, 24 sort keys of one hash key are set small,
    then overwritten with 1 MiB values: the resumed shipper's first block (the
    small sets) holds 24 MiB of one hash key. Before, that was one duplicate
    call, over the rpc frame limit ("exceeds max_frame_bytes"), retried forever:
    the duplication never converged. Calls now end at 4 MiB."""
    big = b"b" * (1024 * 1024)
    with BlockingTableClient(clusters.meta(clusters.one)) as one, \
            BlockingTableClient(clusters.meta(clusters.two)) as two:
        dup = _paused_dup(one, two, "grown")
        for i in range(GROWN_KEYS):
            one.set("grown", b"h", b"s%02d" % i, b"small")
        for i in range(GROWN_KEYS):
            one.set("grown", b"h", b"s%02d" % i, big)
        one.update_dup("grown", dup.dup_id, state=DupState.LOG)
        converged = wait_converged(one, two, "grown", expect=GROWN_KEYS)
        assert all(value == big for value, _ in converged.values())
        one.drop_table("grown")
        two.drop_table("grown")


@pytest.mark.slow
def test_checkpoint_copies_existing_records_then_the_log(clusters: Clusters) -> None:
    with BlockingTableClient(clusters.meta(clusters.one)) as one, \
            BlockingTableClient(clusters.meta(clusters.two)) as two:
        one.create_table("existing", partitions=3, replicas=3, copysets=2)
        two.create_table("existing", partitions=2, replicas=3)
        # on the remote, a value older than the source's tombstone: the tombstone wins
        two.set("existing", b"h0", b"0", b"stale")
        for i in range(200):
            one.set("existing", b"h%d" % (i % 13), b"%d" % i, b"old%d" % i)
        for i in range(0, 200, 10):
            one.delete("existing", b"h%d" % (i % 13), b"%d" % i)
        dup = one.add_dup("existing", "two", checkpoint=True)
        for i in range(200, 260):
            one.set("existing", b"h%d" % (i % 13), b"%d" % i, b"new%d" % i)
        both = wait_converged(one, two, "existing", expect=260 - 20)
        assert both[(b"h1", b"1")][0] == b"old1"
        deadline = time.monotonic() + CONVERGE_DEADLINE_S
        while one.list_dups("existing")[0].state is not DupState.LOG:
            assert time.monotonic() < deadline, "the duplication stayed in prepare"
            time.sleep(POLL_INTERVAL_S)
        progress = one.dup_progress("existing", dup.dup_id)
        assert all(p.prepared for p in progress.values())
        assert sum(p.checkpoint_records for p in progress.values()) >= 200


@pytest.mark.slow
def test_a_leader_without_the_log_to_ship_resyncs_loudly(clusters: Clusters) -> None:
    """A leader whose log after confirmed_decree is gone (rebuilt from a
    snapshot past it: the "learn step back"; made here by moving
    confirmed_decree back in meta after the log was compacted) copies the
    partition's records, counts a resync, and the remote ends complete."""
    with BlockingTableClient(clusters.meta(clusters.one)) as one, \
            BlockingTableClient(clusters.meta(clusters.two)) as two:
        one.create_table("lost", partitions=1, replicas=3)
        two.create_table("lost", partitions=1, replicas=3)

        write_spread(one, "lost", HELD_WRITES)
        dup = one.add_dup("lost", "two")  # only writes from now on would ship
        key = f"/dup-progress/lost/{dup.dup_id}/0"

        async def rewind() -> None:
            async with MetaClient(clusters.meta(clusters.one)) as meta:
                kv = await meta.get(key)
                assert kv is not None
                progress = msgspec.msgpack.decode(kv.value, type=DupProgress)
                await meta.put(key, msgspec.msgpack.encode(
                    msgspec.structs.replace(progress, confirmed_decree=1)))

        asyncio.run(rewind())
        # The next block's progress write fails its compare-and-swap: the
        # shipper reads confirmed_decree again and finds the log gone.
        one.set("lost", b"after", b"rewind", b"v")
        wait_converged(one, two, "lost", expect=HELD_WRITES + 1)
        deadline = time.monotonic() + CONVERGE_DEADLINE_S
        while True:
            progress = one.dup_progress("lost", dup.dup_id)[0]
            if progress.resyncs == 1 and progress.prepared and not progress.log_lost:
                break
            assert time.monotonic() < deadline, progress
            time.sleep(POLL_INTERVAL_S)
        assert progress.checkpoint_records >= HELD_WRITES


def leader_of(client: BlockingTableClient, table: str) -> str:
    """The address of partition 0's leader, as the client found it by writing."""
    client.set(table, b"probe", b"leader", b"v")
    return client._client._leaders[(client.table_info(table).record.table_id, 0)]


@pytest.mark.slow
def test_a_replica_rebuilt_from_a_snapshot_leads_and_ships_without_a_resync(
        clusters: Clusters) -> None:
    """Learn step back with real processes: a follower's replica is wiped and
    rebuilt from the leader's snapshot (past confirmed_decree) while the remote
    is down; then it becomes leader and the remote comes back. Every write
    reaches the remote from the log (the tail kept with the snapshot), with no
    resync. Without the tail, its log starts at the snapshot and it resyncs."""
    env = clusters.env(1, "two", clusters.two)
    with BlockingTableClient(clusters.meta(clusters.one)) as one:
        one.create_table("learn", partitions=1, replicas=3)
        with BlockingTableClient(clusters.meta(clusters.two)) as two:
            two.create_table("learn", partitions=1, replicas=3)
        dup = one.add_dup("learn", "two")
        cluster.down(clusters.two)
        nodes = cluster.load(clusters.one)
        leader = leader_of(one, "learn")
        wiped = next(n for n in nodes if n.address != leader)
        group = group_id_of(one.table_info("learn").record.table_id, 0)
        cluster.stop_node(clusters.one, wiped.id)
        data = Path(wiped.config).parent / "data" / "table"
        shutil.rmtree(data / "raft" / f"group-{group:016x}")
        shutil.rmtree(data / "replicas" / f"{group:016x}")
        write_spread(one, "learn", HELD_WRITES)
        with environment(env):
            cluster.restart_node(clusters.one, wiped.id, serving_timeout_s=60)
        deadline = time.monotonic() + CONVERGE_DEADLINE_S
        while (leader := leader_of(one, "learn")) != wiped.address:
            # Stop the leader until the rebuilt replica is elected (it can be
            # only once it holds the snapshot and the log after it).
            assert time.monotonic() < deadline, "the rebuilt replica never led"
            stopped = next(n for n in nodes if n.address == leader)
            cluster.stop_node(clusters.one, stopped.id)
            leader_of(one, "learn")
            with environment(env):
                cluster.restart_node(clusters.one, stopped.id, serving_timeout_s=60)
        with environment(clusters.env(2, "one", clusters.one)):
            cluster.up(clusters.two, 3)
        with BlockingTableClient(clusters.meta(clusters.two)) as two:
            wait_converged(one, two, "learn", expect=HELD_WRITES + 1)
        progress = one.dup_progress("learn", dup.dup_id)[0]
        assert progress.resyncs == 0 and not progress.log_lost, progress
