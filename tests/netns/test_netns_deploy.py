"""docs/deploy.md's membership and repair commands, run as written on hosts in
network namespaces: adding a meta member (learner, catch up, promote) and
removing it; replacing a dead host with new disks at the same address (remove
it from meta, wipe, the node refuses to start with the format command, ``bookie
format``, start, add it back). Slow: ``pytest -m slow tests/netns``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from .harness import (
    DEADLINE_S,
    NetnsCluster,
    node_address,
    wait_for,
)

EXIT_CONFIG = 78  # a config or identity problem (docs/deploy.md, "Start order")
NEW_NODE = 4


def ok(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def members_by_id(c: NetnsCluster, meta: str) -> dict[int, dict[str, object]]:
    rows = json.loads(ok(c.cli("meta", "member", "list", "--json", "--members", meta)))
    return {int(r["id"]): r for r in rows}


def registered_bookies(c: NetnsCluster, meta: str) -> list[str]:
    bookies = json.loads(ok(c.cli("bookie", "list", "--members", meta, "--json")))
    return [str(b["address"]) for b in bookies["bookies"]]


def caught_up(c: NetnsCluster, node_id: int, key: str) -> bool:
    """``key`` (written before) is readable from ``node_id``'s own state."""
    got = c.cli("meta", "get", key, "--serializable", "--members", c.rpc_address(node_id))
    return got.returncode == 0 and "before" in got.stdout


def add_member(c: NetnsCluster, node_id: int, meta: str) -> None:
    """Step 2 of "Adding and removing meta members": learner, catch up, promote."""
    address = c.rpc_address(node_id)
    ok(c.cli("meta", "member", "add", str(node_id), address, "--learner", "--members", meta))
    wait_for(lambda: caught_up(c, node_id, "/deploy/before"), f"node {node_id} to catch up")
    ok(c.cli("meta", "member", "promote", str(node_id), "--members", meta))
    wait_for(lambda: members_by_id(c, meta)[node_id]["kind"] == "voter",
             f"node {node_id} to be a voter")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_deploy_guide_membership_and_host_replacement(netns_cluster: NetnsCluster) -> None:
    c = netns_cluster
    m = c.meta_members  # $M of the guide: the three original hosts
    ok(c.cli("meta", "put", "/deploy/before", "before", "--members", m))

    # Adding host 4: its TOML lists the members plus itself, bootstrap = false.
    c.add_node(NEW_NODE)
    add_member(c, NEW_NODE, m)
    assert sorted(members_by_id(c, m)) == [1, 2, 3, NEW_NODE]
    # ... and removing it again: member remove, then stop it.
    ok(c.cli("meta", "member", "remove", str(NEW_NODE), "--members", m))
    c.remove_node(NEW_NODE)
    wait_for(lambda: sorted(members_by_id(c, m)) == [1, 2, 3], "three members again")

    # Replacing a dead host, same address, new disks: remove it from meta, wipe it.
    victim = 3
    ok(c.cli("meta", "member", "remove", str(victim), "--members", m))
    c.kill(victim)
    shutil.rmtree(c.config_path(victim).parent / "data")
    c.write_config(victim, bootstrap=False)
    # Its bookie's cookie is in meta but not on its disks: it refuses to start.
    refused = subprocess.run(
        ["ip", "netns", "exec", c.namespace(victim), sys.executable, "-m", "quorumlog", "node",
         "--config", str(c.config_path(victim))],
        capture_output=True, text=True, timeout=DEADLINE_S)
    assert refused.returncode == EXIT_CONFIG, refused.stderr[-3000:]
    address = f"{node_address(victim)}:7100"
    assert f"quorumlog bookie format --force {address}" in refused.stderr, refused.stderr[-3000:]
    # A dead host's bookie stays registered until its session expires.
    wait_for(lambda: address not in registered_bookies(c, m), f"{address}'s session to expire")
    # The guide's command, run on that host (the prompt answered "y").
    formatted = subprocess.run(
        ["ip", "netns", "exec", c.namespace(victim), sys.executable, "-m", "quorumlog",
         "bookie", "format", address, "--force", "--config", str(c.config_path(victim)),
         "--members", m], input="y\n", capture_output=True, text=True, timeout=DEADLINE_S)
    assert formatted.returncode == 0, formatted.stdout + formatted.stderr
    assert f"bookie {address} formatted" in formatted.stdout
    c.start_node(victim)
    add_member(c, victim, m)
    c.wait_healthy(DEADLINE_S)
    assert sorted(members_by_id(c, m)) == [1, 2, 3]
    assert address in registered_bookies(c, m)
