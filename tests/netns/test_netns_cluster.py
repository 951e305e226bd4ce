"""A three-"host" cluster in network namespaces, each node listening on 0.0.0.0
and advertising its own 10.77.0.x address, with real network faults."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .harness import NetnsCluster

DEADLINE_S = 60.0
POLL_INTERVAL_S = 0.2
WORKLOAD = Path(__file__).with_name("workload.py")
ENTRIES_BEFORE_FAULT = 30
ENTRIES_AFTER_FAULT = 30


def test_three_hosts_serve_meta_ledgers_and_streams_on_advertised_addresses(
        netns_cluster: NetnsCluster) -> None:
    c = netns_cluster
    rows = c.status()
    assert sorted(r["address"] for r in rows) == sorted(c.meta_members.split(","))
    assert all(r["alive"] and r["bookie"]["state"] == "writable" for r in rows), rows
    bookies = json.loads(c.cli("bookie", "list", "--members", c.meta_members, "--json").stdout)
    assert sorted(b["address"] for b in bookies["bookies"]) == sorted(c.meta_members.split(","))

    put = c.cli("meta", "put", "/deploy/k", "v1", "--members", c.meta_members)
    assert put.returncode == 0, put.stderr
    got = c.cli("meta", "get", "/deploy/k", "--members", c.meta_members)
    assert got.returncode == 0 and "v1" in got.stdout, got.stdout + got.stderr

    created = c.cli("ledger", "create", "-e", "3", "-w", "2", "-a", "2", "--members",
                    c.meta_members)
    assert created.returncode == 0, created.stderr
    ledger_id = created.stdout.split()[-1]
    lines = [f"entry-{i}" for i in range(20)]
    appended = c.cli("ledger", "append", ledger_id, "--members", c.meta_members,
                     stdin="\n".join(lines) + "\n")
    assert appended.returncode == 0, appended.stderr
    read = c.cli("ledger", "read", ledger_id, "--members", c.meta_members)
    assert read.stdout.splitlines() == lines, read.stderr

    assert c.cli("stream", "create", "orders", "--members", c.meta_members).returncode == 0
    produced = c.cli("stream", "produce", "orders", "a", "b", "c", "--members", c.meta_members)
    assert produced.returncode == 0, produced.stderr
    consumed = c.cli("stream", "consume", "orders", "-s", "sub", "--count", "3",
                     "--initial", "earliest", "--members", c.meta_members)
    assert consumed.returncode == 0, consumed.stderr
    values = [json.loads(line)["value"] for line in consumed.stdout.splitlines()]
    assert values == ["a", "b", "c"]


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(POLL_INTERVAL_S)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def test_isolated_meta_leader_is_replaced_and_rejoins_after_heal(
        netns_cluster: NetnsCluster) -> None:
    c = netns_cluster
    old = c.leader()
    assert old is not None
    majority = [i for i in c.node_ids if i != old]
    c.isolate(old)
    wait_for(lambda: c.leader(among=majority) is not None, "a leader on the majority side")
    put = c.cli("meta", "put", "/netns/during", "isolated", "--members", c.meta_members)
    assert put.returncode == 0, put.stderr
    c.heal()

    def rejoined() -> bool:
        got = c.cli("meta", "get", "/netns/during", "--serializable",
                    "--members", c.rpc_address(old))
        return got.returncode == 0 and "isolated" in got.stdout

    wait_for(rejoined, f"node {old} to catch up after heal")
    rows = {r["id"]: r for r in c.status()}
    assert rows[old]["meta_role"] == "follower", rows[old]
    assert len({r["leader"] for r in rows.values()}) == 1, rows


class LineReader:
    """JSON lines of a workload's stdout, each awaited with a deadline."""

    def __init__(self, proc: subprocess.Popen[str], cluster: NetnsCluster) -> None:
        self.proc = proc
        self.cluster = cluster
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def next(self, timeout_s: float = DEADLINE_S) -> dict[str, Any]:
        line = self.lines.get(timeout=timeout_s)
        if line is None:
            stderr = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"workload ended early: {stderr[-3000:]}\n"
                                 f"{self.cluster_events()}")
        record: dict[str, Any] = json.loads(line)
        return record

    def cluster_events(self) -> str:
        """The nodes' warnings and leadership/registration events, for a failure."""
        keep = ("warning", "error", "raft_leader_changed", "bookie_registered",
                "bookie_session")
        out = []
        for node_id in self.cluster.node_ids:
            lines = [line[:300] for line in
                     self.cluster.log_path(node_id).read_text(errors="replace").splitlines()
                     if any(k in line for k in keep)]
            out.append(f"node {node_id}:\n" + "\n".join(lines[-30:]))
        return "\n".join(out)


def test_isolated_bookie_ensemble_change_loses_no_acknowledged_entry(
        netns_cluster: NetnsCluster, tmp_path: Path) -> None:
    c = netns_cluster
    stop = tmp_path / "stop"
    proc = c.client_process([str(WORKLOAD), "ledger", c.meta_members, str(stop)])
    try:
        out = LineReader(proc, c)
        first = out.next()
        ledger_id, ensemble = first["ledger"], first["ensemble"]
        # The hard case when it is in the ensemble: the meta leader, so that the
        # other bookies' sessions and the writer's ensemble change must ride
        # through an election while their first member may be the one cut off.
        leader = c.leader()
        in_ensemble = [i for i in c.node_ids if c.rpc_address(i) in ensemble]
        victim = leader if leader in in_ensemble else in_ensemble[0]
        acked = [out.next()["acked"] for _ in range(ENTRIES_BEFORE_FAULT)]
        c.isolate(victim)
        acked += [out.next()["acked"] for _ in range(ENTRIES_AFTER_FAULT)]
        stop.touch()
        while "closed" not in (record := out.next()):
            acked.append(record["acked"])
        assert proc.wait(timeout=DEADLINE_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert acked == list(range(len(acked)))
    assert record["closed"] == acked[-1]
    assert len(record["ensembles"]) >= 2, f"no ensemble change: {record['ensembles']}"
    assert c.rpc_address(victim) not in record["ensembles"][-1][1]
    c.heal()
    read = c.cli("ledger", "read", str(ledger_id), "--members", c.meta_members)
    assert read.returncode == 0, read.stderr
    assert read.stdout.splitlines() == [f"entry-{i}" for i in acked]
