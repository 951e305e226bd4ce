"""The scheduler on real processes: 4 table nodes (3 of them meta), 8 partitions x 3.

A node that holds replicas is SIGKILLed and stays down: after
``replace_dead_after_ms`` every partition is back to 3 voters, none on the
dead node, and every acknowledged write reads back. The delays are short in
these node configs so the whole run fits in well under a minute.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from quorumlog import rpc
from quorumlog.errors import QuorumlogError
from quorumlog.meta import MetaClient
from quorumlog.node._cluster import free_port, start_node
from quorumlog.table import (
    BlockingTableClient,
    NotEnoughTableNodesError,
    TableLayout,
    fetch_schedule,
    group_id_of,
    table_nodes,
)

PARTITIONS = 8
REPLICAS = 3
DEADLINE_S = 60.0
POLL_S = 0.1
TABLE_TOML = """
[table]
tick_interval_ms = 50
election_timeout_ticks = 10
snapshot_entries = 50
registration_ttl_ms = 1000
heartbeat_interval_ms = 100
node_dead_after_ms = 1500
replace_dead_after_ms = 3000
catchup_entries_max = 20
"""


class Nodes:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.addresses: dict[int, str] = {}
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.meta: list[str] = []

    def write(self, node_id: int, roles: list[str]) -> Path:
        node_dir = self.root / f"node-{node_id}"
        node_dir.mkdir(parents=True, exist_ok=True)
        role_list = ", ".join(f'"{r}"' for r in roles)
        members = ", ".join(f'"{i}={a}"' for i, a in sorted(self.addresses.items()) if i <= 3)
        path = node_dir / "node.toml"
        path.write_text(
            f"[node]\nid = {node_id}\ndata_dir = \"{node_dir / 'data'}\"\n"
            f"listen = \"{self.addresses[node_id]}\"\nmetrics_listen = \"\"\n"
            f"roles = [{role_list}]\n\n[meta]\nmembers = [{members}]\nbootstrap = true\n"
            + TABLE_TOML)
        return path

    def start(self, node_id: int) -> None:
        roles = ["meta", "table"] if node_id <= 3 else ["table"]
        self.addresses.setdefault(node_id, f"127.0.0.1:{free_port()}")
        self.procs[node_id] = start_node(self.write(node_id, roles))

    def kill(self, node_id: int) -> None:
        proc = self.procs[node_id]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def close(self) -> None:
        for node_id in list(self.procs):
            self.kill(node_id)


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Nodes]:
    cluster = Nodes(tmp_path)
    for node_id in (1, 2, 3):
        cluster.addresses[node_id] = f"127.0.0.1:{free_port()}"
    cluster.meta = [cluster.addresses[i] for i in (1, 2, 3)]
    try:
        for node_id in (1, 2, 3):
            cluster.start(node_id)
        yield cluster
    finally:
        cluster.close()


def _until(condition: Callable[[], Any], what: str, timeout_s: float = DEADLINE_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = condition()
        except QuorumlogError:
            value = None
        if value:
            return value
        time.sleep(POLL_S)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def _registered(meta: list[str]) -> int:
    async def count() -> int:
        async with MetaClient(meta) as client:
            return len(await table_nodes(client))

    return rpc.run(count())


def _leaders(meta: list[str], layout: TableLayout) -> set[int]:
    """The nodes leading a partition of ``layout``, as the scheduler sees them."""
    async def fetch() -> set[int]:
        pool = rpc.Pool()
        try:
            view = await fetch_schedule(meta, pool)
        finally:
            await pool.close()
        gids = {group_id_of(layout.record.table_id, p) for p in range(layout.record.partitions)}
        return {g.leader for g in view.groups if g.group_id in gids}

    return rpc.run(fetch())


def _create(client: BlockingTableClient, meta: list[str], name: str,
            nodes: int) -> TableLayout:
    def attempt() -> TableLayout | None:
        if _registered(meta) < nodes:
            return None
        try:
            return client.create_table(name, partitions=PARTITIONS, replicas=REPLICAS)
        except NotEnoughTableNodesError:
            return None

    layout: TableLayout = _until(attempt, f"{nodes} registered table nodes")
    return layout


class Writer:
    """Sets keys one after another; remembers what was acknowledged."""

    def __init__(self, client: BlockingTableClient, table: str) -> None:
        self.client, self.table = client, table
        self.acked: dict[bytes, bytes] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        while not self.stop.is_set():
            key, value = b"k%05d" % i, b"v%d" % i
            try:
                self.client.set(self.table, key, b"s", value)
            except QuorumlogError:
                continue  # unknown outcome: not counted, the next key goes on
            self.acked[key] = value
            i += 1


def _settled(client: BlockingTableClient, table: str, dead: int) -> bool:
    layout = client.table_info(table)
    return all(len(p.members) == REPLICAS and dead not in p.members and not p.learners
               for p in layout.partitions)


def test_a_killed_nodes_replicas_are_replaced_and_no_write_is_lost(nodes: Nodes) -> None:
    nodes.start(4)
    with BlockingTableClient(nodes.meta) as client:
        layout = _create(client, nodes.meta, "resched", 4)
        victims = sum(4 in p.members for p in layout.partitions)
        assert victims > 0  # node 4 holds replicas
        writer = Writer(client, "resched")
        writer.thread.start()
        _until(lambda: len(writer.acked) >= 200, "200 acknowledged writes")
        scheduler = _cli("table", "schedule", "--members", ",".join(nodes.meta))["meta_leader"]
        nodes.kill(4)
        killed_at = time.monotonic()
        _until(lambda: _settled(client, "resched", dead=4), "every partition on 3 live nodes")
        replaced_s = time.monotonic() - killed_at
        _until(lambda: len(writer.acked) >= 400, "writes after the replacement")
        writer.stop.set()
        writer.thread.join(timeout=30)
        after = client.table_info("resched")
        for old, new in zip(layout.partitions, after.partitions, strict=True):
            if 4 in old.members:  # recorded by the scheduler at the group's new epoch
                assert new.epoch > 0 and set(old.members) - {4} <= set(new.members)
        for key, value in sorted(writer.acked.items()):
            assert client.get("resched", key, b"s") == value, key
        print(f"replaced {victims} replicas in {replaced_s:.1f} s after the kill")
    _check_cli(nodes.meta, "resched", dead=4, scheduler=scheduler)


def _cli(*args: str) -> Any:
    done = subprocess.run([sys.executable, "-m", "quorumlog", *args, "-o", "json"],
                          capture_output=True, text=True, timeout=60, check=True)
    return json.loads(done.stdout)


def _check_cli(meta: list[str], table: str, dead: int, scheduler: int) -> None:
    """`table info` and `table schedule` show the new layout and the changes made
    (the history is the scheduler's memory: checked when the meta leader that
    made the changes still leads; a new one starts with none, as Curve's MDS)."""
    members = ",".join(meta)

    def settled_view() -> list[dict[str, Any]] | None:
        # Leaders may still move (leader balancing) or be unknown to a scheduler
        # that just took over: wait until every group shows one of its members.
        groups: list[dict[str, Any]] = _cli("table", "info", table, "--members",
                                            members)["partition_groups"]
        return groups if all(g["leader"] in g["members"] for g in groups) else None

    groups = _until(settled_view, "every partition's leader among its members")
    assert len(groups) == PARTITIONS
    assert all(len(g["members"]) == REPLICAS and dead not in g["members"] for g in groups)
    schedule = _cli("table", "schedule", "--members", members)
    assert {n["node"]: n["alive"] for n in schedule["nodes"]}.get(dead) is False
    if schedule["meta_leader"] == scheduler:
        done = [c for c in schedule["changes"] if c["state"] == "done"]
        assert {"add_learner", "promote"} <= {c["kind"] for c in done}


def _spread(client: BlockingTableClient, table: str, node: int) -> bool:
    partitions = client.table_info(table).partitions
    replicas = {n: sum(n in p.members for p in partitions) for n in (1, 2, 3, node)}
    settled = all(len(p.members) == REPLICAS and not p.learners for p in partitions)
    return settled and max(replicas.values()) - min(replicas.values()) <= 1


@pytest.mark.slow  # ~30 s: six replica moves one after another, then leader moves
def test_a_node_added_to_a_running_cluster_gets_replicas_and_leaders(nodes: Nodes) -> None:
    with BlockingTableClient(nodes.meta) as client:
        layout = _create(client, nodes.meta, "grow", 3)
        assert all(set(p.members) == {1, 2, 3} for p in layout.partitions)
        writer = Writer(client, "grow")
        writer.thread.start()
        _until(lambda: len(writer.acked) >= 100, "100 acknowledged writes")
        nodes.start(4)
        started_at = time.monotonic()
        _until(lambda: _spread(client, "grow", 4), "replicas spread onto node 4")
        spread_s = time.monotonic() - started_at
        _until(lambda: 4 in _leaders(nodes.meta, layout), "a leader on node 4")
        writer.stop.set()
        writer.thread.join(timeout=30)
        for key, value in sorted(writer.acked.items()):
            assert client.get("grow", key, b"s") == value, key
        print(f"node 4 got its replicas in {spread_s:.1f} s")


def test_a_drained_node_gives_up_every_replica_while_writes_go_on(nodes: Nodes) -> None:
    """``table drain``: every replica and leadership of node 4 moves to nodes 1-3
    while a writer runs, nothing new is placed on it, ``table schedule`` counts
    down to 0; node 4 then goes, and every acknowledged write reads back."""
    nodes.start(4)
    members = ",".join(nodes.meta)
    with BlockingTableClient(nodes.meta) as client:
        layout = _create(client, nodes.meta, "drained", 4)
        assert any(4 in p.members for p in layout.partitions)
        writer = Writer(client, "drained")
        writer.thread.start()
        _until(lambda: len(writer.acked) >= 100, "100 acknowledged writes")
        typo = subprocess.run([sys.executable, "-m", "quorumlog", "table", "drain", "9",
                               "--members", members], capture_output=True, text=True,
                              timeout=60, check=False)
        assert typo.returncode == 1 and "no table node 9" in typo.stderr
        drained = subprocess.run([sys.executable, "-m", "quorumlog", "table", "drain", "4",
                                  "--members", members], capture_output=True, text=True,
                                 timeout=60, check=False)
        assert drained.returncode == 0, drained.stderr
        started = time.monotonic()

        def empty() -> bool:
            row = {n["node"]: n for n in _cli("table", "schedule", "--members",
                                              members)["nodes"]}.get(4)
            return (row is not None and row["draining"] and row["replicas_left"] == 0
                    and _settled(client, "drained", dead=4)
                    and 4 not in _leaders(nodes.meta, layout))

        _until(empty, "node 4 drained")
        drained_s = time.monotonic() - started
        assert client.draining_nodes() == frozenset({4})
        with pytest.raises(NotEnoughTableNodesError):  # 4 replicas would need node 4
            client.create_table("four", partitions=1, replicas=4)
        before = len(writer.acked)
        _until(lambda: len(writer.acked) >= before + 100, "writes after the drain")
        nodes.kill(4)
        writer.stop.set()
        writer.thread.join(timeout=30)
        for key, value in sorted(writer.acked.items()):
            assert client.get("drained", key, b"s") == value, key
        client.undrain_node(4)
        assert client.draining_nodes() == frozenset()
        print(f"drained node 4 in {drained_s:.1f} s, {len(writer.acked)} writes")
