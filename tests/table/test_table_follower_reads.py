"""Follower reads (``stale_ok=True``) on real node processes on 127.0.0.1.

With the partition's leader and one follower stopped (SIGSTOP), the last
replica cannot reach a quorum: a default (linearizable) read fails, a
``stale_ok`` read (get, scan, full scan, record scan) is answered by that
replica from its own store. Before that, a stale record scan aimed at the
follower ``stale_read_nodes`` names (what the Spark reader does with
``staleOk``) is served there and never by the leader (the nodes' scan counters).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from quorumlog import node as cluster
from quorumlog import rpc
from quorumlog.errors import QuorumlogError
from quorumlog.table import TableClient
from quorumlog.table._messages import TableGetRequest

TABLE = "follower"
CATCH_UP_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 1.0  # an attempt on a stopped node gives up after this
DEADLINE_S = 4.0
SCRAPE_TIMEOUT_S = 5.0
VIEW_TIMEOUT_S = 15.0  # the scheduler's view learns the leader from heartbeats (1 s)


@pytest.fixture(scope="module")
def cluster_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    directory = tmp_path_factory.mktemp("table-follower")
    with cluster.running(directory, 3):
        yield directory


async def _wait_applied(pool: rpc.Pool, address: str, table_id: int) -> None:
    """Until the replica at ``address`` answers the value from its own store."""
    deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
    while time.monotonic() < deadline:
        response = await pool.call(address, TableGetRequest(
            table_id=table_id, partition=0, hash_key=b"h", sort_key=b"s", stale_ok=True),
            timeout_s=REQUEST_TIMEOUT_S)
        if response.value == b"v":
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"replica {address} did not apply the write")


def _scans(nodes: dict[str, cluster.NodeInfo]) -> dict[int, float]:
    """Each node's count of scan requests it answered (its /metrics)."""
    out = {}
    for node in nodes.values():
        with urllib.request.urlopen(f"http://{node.metrics}/metrics",
                                    timeout=SCRAPE_TIMEOUT_S) as reply:
            text = reply.read().decode()
        out[node.id] = sum(
            sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "quorumlog_table_requests_total"
            and sample.labels.get("op") == "scan" and sample.labels.get("result") == "ok")
    return out


async def _follower_to_read(tables: TableClient, leader_node: int) -> int:
    deadline = time.monotonic() + VIEW_TIMEOUT_S
    while time.monotonic() < deadline:
        (node,) = await tables.stale_read_nodes(TABLE)
        if node not in (0, leader_node):
            return node
        await asyncio.sleep(0.2)
    raise AssertionError("the scheduler view named no follower of the partition")


async def _scenario(cluster_dir: Path) -> None:
    addresses = cluster.meta_addresses(cluster_dir)
    async with TableClient(addresses, request_timeout_s=REQUEST_TIMEOUT_S,
                           deadline_s=DEADLINE_S) as tables:
        layout = await tables.create_table(TABLE, partitions=1, replicas=3)
        await tables.set(TABLE, b"h", b"s", b"v")
        assert await tables.get(TABLE, b"h", b"s") == b"v"
        table_id = layout.record.table_id
        leader = tables._leaders[(table_id, 0)]
        nodes = {n.address: n for n in cluster.load(cluster_dir)}
        follower, other = sorted(a for a in nodes if a != leader)
        pool = rpc.Pool()
        try:
            await _wait_applied(pool, follower, table_id)
        finally:
            await pool.close()
        read_node = await _follower_to_read(tables, nodes[leader].id)
        before = _scans(nodes)
        records = [item async for item in tables.scan_records(
            TABLE, 0, stale_ok=True, prefer_node=read_node)]
        assert [(r.hash_key, r.sort_key, r.value) for r in records] == [(b"h", b"s", b"v")]
        served = {n: c - before[n] for n, c in _scans(nodes).items() if c != before[n]}
        assert served == {read_node: 1}, (served, read_node)
        stopped = [nodes[leader].pid, nodes[other].pid]
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        try:
            assert await tables.get(TABLE, b"h", b"s", stale_ok=True) == b"v"
            assert [item async for item in tables.scan(TABLE, b"h", stale_ok=True)] == [
                (b"s", b"v")]
            assert await tables.sort_key_count(TABLE, b"h", stale_ok=True) == 1
            assert [item async for item in tables.full_scan(TABLE, stale_ok=True)] == [
                (b"h", b"s", b"v")]
            assert [(r.hash_key, r.value) async for r in tables.scan_records(
                TABLE, 0, stale_ok=True)] == [(b"h", b"v")]
            with pytest.raises(QuorumlogError):
                await tables.get(TABLE, b"h", b"s")
        finally:
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)
        # Once the quorum is back the default read is served again.
        tables._deadline_s = 30.0
        assert await tables.get(TABLE, b"h", b"s") == b"v"


def test_a_follower_read_is_served_while_the_leader_is_stopped(cluster_dir: Path) -> None:
    asyncio.run(_scenario(cluster_dir))
    stale = subprocess.run([sys.executable, "-m", "quorumlog", "table", "get", TABLE, "h", "s",
                            "--stale", "--dir", str(cluster_dir)], capture_output=True,
                           text=True, timeout=60, check=False)
    assert stale.stdout == "v\n", stale.stderr
