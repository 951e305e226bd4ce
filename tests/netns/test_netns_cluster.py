"""A three-"host" cluster in network namespaces, each node listening on 0.0.0.0
and advertising its own 10.77.0.x address, with real network faults."""

from __future__ import annotations

import json
from pathlib import Path

from .harness import CLIENT, DEADLINE_S, LineReader, NetnsCluster, wait_for

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


def test_client_cut_from_meta_leader_only_is_served_by_followers(
        netns_cluster: NetnsCluster) -> None:
    """The leader and its followers see each other; the client sees only the
    followers (a broken link, a firewall). The followers pass its writes,
    linearizable reads and keep-alives on to the leader, as ZooKeeper's and
    etcd's do; before, they answered NotLeaderError pointing at the leader the
    client cannot reach, and a ledger writer's ensemble change failed after its
    whole deadline."""
    c = netns_cluster
    leader = c.leader()
    assert leader is not None
    c.partition([CLIENT], [leader])
    # Followers first: the client asks one of them (not a timeout on the leader first).
    members = ",".join(c.rpc_address(i) for i in sorted(c.node_ids, key=lambda i: i == leader))
    put = c.cli("meta", "put", "/netns/cut", "v1", "--members", members)
    assert put.returncode == 0, put.stderr
    got = c.cli("meta", "get", "/netns/cut", "--members", members)
    assert got.returncode == 0 and "v1" in got.stdout, got.stdout + got.stderr
    c.heal()
    assert c.leader() == leader, "the leader changed: the test did not test forwarding"
