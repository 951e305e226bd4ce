"""A meta member restored from an older copy of its data (finding 8 of issue
13): its log lacks entries it acknowledged, so it rejects every heartbeat of the
leader and cannot rejoin. The rejection is logged at most once per interval
(not 10 lines a second) and says what to do; the procedure docs/meta.md gives
("A member whose data is lost, damaged or older") brings it back, run here with
the real commands on real processes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from quorumlog import node as cluster
from quorumlog.errors import QuorumlogError
from quorumlog.meta import MEMBER_MARKER_NAME, MEMBER_RECORD_PREFIX, BlockingMetaClient
from quorumlog.raft import HostConfig
from quorumlog.raft._driver import LogRateLimiter
from quorumlog.table import BlockingTableClient

from .test_meta_cluster import _wait

CLI_TIMEOUT_S = 120.0
WAIT_S = 60.0
# Two rejection lines are at least this far apart (HostConfig's default).
INTERVAL_S = HostConfig().rejected_message_log_interval_ms / 1000


def test_rate_limiter_admits_one_line_per_interval_and_counts_the_rest() -> None:
    limiter = LogRateLimiter(interval_s=10.0)
    assert limiter.admit(("g", 1), 0.0) == 0
    assert [limiter.admit(("g", 1), t / 10) for t in range(1, 100)] == [None] * 99
    assert limiter.admit(("g", 2), 5.0) == 0          # another sender: its own budget
    assert limiter.admit(("g", 1), 10.0) == 99         # the next line carries the count
    assert limiter.admit(("g", 1), 10.5) is None


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([sys.executable, "-m", "quorumlog", *args], capture_output=True,
                         text=True, timeout=CLI_TIMEOUT_S, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, f"quorumlog {' '.join(args)}: {out.stderr[-2000:]}"
    return out


def rejections(log: Path, offset: int) -> list[dict[str, Any]]:
    out = []
    for line in log.read_bytes()[offset:].decode(errors="replace").splitlines():
        if '"raft_message_rejected"' in line:
            out.append(json.loads(line))
    return out


def row(directory: Path, node_id: int) -> dict[str, Any]:
    return next(r for r in cluster.status(directory) if r["id"] == node_id)


@pytest.fixture
def three_nodes(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "cluster"
    cluster.up(directory, 3)
    try:
        yield directory
    finally:
        cluster.down(directory)


@pytest.mark.slow
def test_member_restored_from_an_older_copy_logs_rarely_and_the_documented_way_back_works(
        three_nodes: Path) -> None:
    directory = three_nodes
    node = cluster.load(directory)[2]
    raft_dir = Path(node.config).parent / "data" / "raft"
    addresses = cluster.meta_addresses(directory)
    old_copy = directory.parent / "raft-old"
    with BlockingMetaClient(addresses) as meta:
        for i in range(20):
            meta.put(f"/early/{i}", b"x")
        cluster.stop_node(directory, node.id)
        shutil.copytree(raft_dir, old_copy)
        cluster.restart_node(directory, node.id, serving_timeout_s=WAIT_S)
        for i in range(200):
            meta.put(f"/late/{i}", b"y")
    _wait(lambda: row(directory, node.id)["applied_index"]
          >= row(directory, 1)["commit_index"] > 0, "node 3 to apply the late writes")
    cluster.stop_node(directory, node.id)
    shutil.rmtree(raft_dir)
    shutil.copytree(old_copy, raft_dir)  # the "restore from backup"
    log = Path(node.log)
    offset = log.stat().st_size
    cluster.restart_node(directory, node.id, serving_timeout_s=WAIT_S)

    # Stuck: every heartbeat is rejected, yet the log gets one line per interval.
    _wait(lambda: len(rejections(log, offset)) >= 2, "a second rejection line",
          timeout_s=INTERVAL_S + WAIT_S)
    first, second = rejections(log, offset)[:2]
    assert "Remove it from the group, wipe its Raft data and add it again" in first["error"]
    assert "A member whose data is lost, damaged or older" in first["error"]
    assert second["suppressed_since_last_line"] >= INTERVAL_S, second  # ~10 heartbeats/s held

    # The way back, as docs/meta.md writes it.
    where = ("--dir", str(directory))
    cli("stop", "--node", str(node.id), *where)
    cli("meta", "member", "remove", str(node.id), *where)
    shutil.rmtree(raft_dir)
    config = Path(node.config)
    config.write_text(config.read_text().replace("bootstrap = true", "bootstrap = false"))
    cli("restart", "--node", str(node.id), *where)
    cli("meta", "member", "add", str(node.id), node.address, "--learner", *where)
    _wait(lambda: row(directory, node.id)["applied_index"] >= row(directory, 1)["commit_index"],
          "the learner to catch up", timeout_s=WAIT_S)
    cli("meta", "member", "promote", str(node.id), *where)
    _wait(lambda: row(directory, node.id)["voters"] == [1, 2, 3], "node 3 a voter again",
          timeout_s=WAIT_S)
    with BlockingMetaClient([node.address]) as member:
        kv = member.get("/late/199", serializable=True)
    assert kv is not None and kv.value == b"y"


def _put_while_node_3_lags_then_stop(directory: Path, addresses: list[str]) -> None:
    """Node 3 stops, /acked is acknowledged by nodes 1 and 2, then both stop."""
    cluster.stop_node(directory, 3)
    with BlockingMetaClient(addresses) as meta:
        meta.put("/acked", b"by nodes 1 and 2")
    cluster.stop_node(directory, 1)
    cluster.stop_node(directory, 2)


def test_a_member_whose_raft_data_was_wiped_cannot_lose_an_acknowledged_write(
        three_nodes: Path) -> None:
    """Node 3 lags (stopped); a put is acknowledged by nodes 1 and 2; both stop and
    node 2's Raft directory is deleted. Before the guard, nodes 2 and 3 started
    alone elected node 3 with node 2's vote and the put was gone. Now node 2
    refuses to start as its old self, as a founding member and as a joiner that is
    still a voter, and the documented way back (remove, start, add as a learner,
    promote) works."""
    directory = three_nodes
    wiped = next(info for info in cluster.load(directory) if info.id == 2)
    raft_dir = Path(wiped.config).parent / "data" / "raft"
    assert (raft_dir.parent / MEMBER_MARKER_NAME).exists()
    addresses = cluster.meta_addresses(directory)
    _put_while_node_3_lags_then_stop(directory, addresses)
    shutil.rmtree(raft_dir)

    with pytest.raises(QuorumlogError, match="ran meta on this data directory before"):
        cluster.restart_node(directory, 2, serving_timeout_s=WAIT_S)
    config = Path(wiped.config)
    config.write_text(config.read_text().replace("bootstrap = true", "bootstrap = false"))
    for node_id in (1, 3):  # together: alone, a member has no quorum for its bookie
        cluster.restart_node(directory, node_id)
    with pytest.raises(QuorumlogError, match="still counts it as a voter"):
        cluster.restart_node(directory, 2, serving_timeout_s=WAIT_S)
    restarted = {info.id: info for info in cluster.load(directory)}  # their new pids
    for node_id in (1, 3):
        cluster.wait_serving(restarted[node_id], WAIT_S)
    with BlockingMetaClient(addresses) as meta:
        kv = meta.get("/acked")
    assert kv is not None and kv.value == b"by nodes 1 and 2"

    where = ("--dir", str(directory))
    cli("meta", "member", "remove", "2", *where)
    cli("restart", "--node", "2", *where)
    cli("meta", "member", "add", "2", wiped.address, "--learner", *where)
    _wait(lambda: row(directory, 2)["applied_index"] >= row(directory, 1)["commit_index"],
          "the learner to catch up", timeout_s=WAIT_S)
    cli("meta", "member", "promote", "2", *where)
    with BlockingMetaClient([wiped.address]) as member:
        kv = member.get("/acked", serializable=True)
    assert kv is not None and kv.value == b"by nodes 1 and 2"


@pytest.mark.parametrize("marker", [
    "kept",  # data/table deleted
    pytest.param("lost", marks=pytest.mark.slow),  # data/table-member.json too
])
def test_a_table_replica_whose_data_was_wiped_is_replaced_and_no_acknowledged_write_is_lost(
        three_nodes: Path, marker: str) -> None:
    """The same scenario for a table partition: node 2's data/table is deleted
    after a set acknowledged by nodes 1 and 2 while node 3 lagged. Node 2 must
    not host the partition as its old self (it would vote node 3 in without the
    set): with node 1 down the partition has no leader rather than losing the
    set. Once node 1 is back, the scheduler removes node 2 as a voter and adds it
    back as a learner that catches up from the leader."""
    directory = three_nodes
    infos = {info.id: info for info in cluster.load(directory)}
    table_dir = Path(infos[2].config).parent / "data" / "table"
    addresses = cluster.meta_addresses(directory)
    with BlockingTableClient(addresses) as tables:
        layout = tables.create_table("wiped", partitions=1, replicas=3)
        assert sorted(layout.partitions[0].members) == [1, 2, 3]
        tables.set("wiped", b"h", b"s", b"before")
    cluster.stop_node(directory, 3)
    with BlockingTableClient(addresses) as tables:
        tables.set("wiped", b"h", b"s", b"acked by nodes 1 and 2")
    cluster.stop_node(directory, 1)
    cluster.stop_node(directory, 2)
    shutil.rmtree(table_dir)
    if marker == "lost":  # as with the whole disk; its records still name it a voter
        (table_dir.parent / "table-member.json").unlink()

    for node_id in (2, 3):
        cluster.restart_node(directory, node_id)
    restarted = {info.id: info for info in cluster.load(directory)}
    for node_id in (2, 3):
        cluster.wait_serving(restarted[node_id], WAIT_S)
    # No leader: node 2 does not vote as its old self.
    with (BlockingTableClient(addresses, deadline_s=5.0) as tables,
          pytest.raises(QuorumlogError)):
        value = tables.get("wiped", b"h", b"s")
        pytest.fail(f"the partition answered {value!r} without node 1")

    cluster.restart_node(directory, 1, serving_timeout_s=WAIT_S)
    with BlockingTableClient(addresses) as tables:
        assert tables.get("wiped", b"h", b"s") == b"acked by nodes 1 and 2"

        def back_as_a_voter() -> bool:
            record = tables.table_info("wiped").partitions[0]
            # epoch 0: never changed since create; the way back removes, adds, promotes
            return (record.epoch > 0 and sorted(record.members) == [1, 2, 3]
                    and not record.learners)
        _wait(back_as_a_voter, "node 2 replaced, caught up and promoted", timeout_s=WAIT_S)
        tables.set("wiped", b"h", b"s", b"after")
    cluster.stop_node(directory, 1)  # node 2's new replica now completes the majority
    with BlockingTableClient(addresses) as tables:
        assert tables.get("wiped", b"h", b"s") == b"after"


def test_a_member_whose_whole_data_directory_was_lost_refuses_to_start(
        three_nodes: Path) -> None:
    """The same scenario with node 2's whole data directory gone (a replaced disk):
    no marker either, so only the cluster can tell. Node 3 holds node 2's record
    (/meta/members/2) and still counts it as a voter: node 2 refuses to start."""
    directory = three_nodes
    addresses = cluster.meta_addresses(directory)
    with BlockingMetaClient(addresses) as meta:
        _wait(lambda: all(meta.get(f"{MEMBER_RECORD_PREFIX}{n}") is not None
                          for n in (1, 2, 3)), "every member's record")
    data_dir = Path(next(i for i in cluster.load(directory) if i.id == 2).config).parent / "data"
    _put_while_node_3_lags_then_stop(directory, addresses)
    shutil.rmtree(data_dir)

    cluster.restart_node(directory, 3)
    with pytest.raises(QuorumlogError, match="holds its record /meta/members/2"):
        cluster.restart_node(directory, 2, serving_timeout_s=WAIT_S)
    cluster.restart_node(directory, 1)
    restarted = {info.id: info for info in cluster.load(directory)}
    for node_id in (1, 3):
        cluster.wait_serving(restarted[node_id], WAIT_S)
    with BlockingMetaClient(addresses) as meta:
        kv = meta.get("/acked")
    assert kv is not None and kv.value == b"by nodes 1 and 2"
