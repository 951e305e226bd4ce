"""Follower reads (``stale_ok=True``) on real node processes on 127.0.0.1.

With the partition's leader and one follower stopped (SIGSTOP), the last
replica cannot reach a quorum: a default (linearizable) read fails, a
``stale_ok`` read is answered by that replica from its own store.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorumlog import node as cluster
from quorumlog import rpc
from quorumlog.errors import QuorumlogError
from quorumlog.table import TableClient
from quorumlog.table._messages import TableGetRequest

TABLE = "follower"
CATCH_UP_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 1.0  # an attempt on a stopped node gives up after this
DEADLINE_S = 4.0


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
        stopped = [nodes[leader].pid, nodes[other].pid]
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        try:
            assert await tables.get(TABLE, b"h", b"s", stale_ok=True) == b"v"
            assert [item async for item in tables.scan(TABLE, b"h", stale_ok=True)] == [
                (b"s", b"v")]
            assert await tables.sort_key_count(TABLE, b"h", stale_ok=True) == 1
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
