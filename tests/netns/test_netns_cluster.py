"""A three-"host" cluster in network namespaces, each node listening on 0.0.0.0
and advertising its own 10.77.0.x address, with real network faults."""

from __future__ import annotations

import json

from .harness import NetnsCluster


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

    created = c.cli("ledger", "create", "-e", "3", "-w", "2", "-a", "2", "--meta",
                    c.meta_members)
    assert created.returncode == 0, created.stderr
    ledger_id = created.stdout.split()[-1]
    lines = [f"entry-{i}" for i in range(20)]
    appended = c.cli("ledger", "append", ledger_id, "--meta", c.meta_members,
                     stdin="\n".join(lines) + "\n")
    assert appended.returncode == 0, appended.stderr
    read = c.cli("ledger", "read", ledger_id, "--meta", c.meta_members)
    assert read.stdout.splitlines() == lines, read.stderr

    assert c.cli("stream", "create", "orders", "--members", c.meta_members).returncode == 0
    produced = c.cli("stream", "produce", "orders", "a", "b", "c", "--members", c.meta_members)
    assert produced.returncode == 0, produced.stderr
    consumed = c.cli("stream", "consume", "orders", "-s", "sub", "--count", "3",
                     "--initial", "earliest", "--members", c.meta_members)
    assert consumed.returncode == 0, consumed.stderr
    values = [json.loads(line)["value"] for line in consumed.stdout.splitlines()]
    assert values == ["a", "b", "c"]
