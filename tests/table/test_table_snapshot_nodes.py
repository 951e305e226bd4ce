"""A table node that was down while its partition's log was compacted catches
up from the RocksDB checkpoint streamed by the leader: 3 real node processes
(meta, bookie, table roles) on 127.0.0.1, a snapshot every 100 entries."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from quorumlog import node as cluster
from quorumlog.table import BlockingTableClient, TableStore

from .test_table_snapshot_transfer import dump

SNAPSHOT_ENTRIES = 100
# The leader keeps 1,000 entries behind its snapshot for slow followers
# (HostConfig.compaction_margin_entries): write past that.
ENTRIES = 1_200
VALUE_BYTES = 32 * 1024
INSTALL_DEADLINE_S = 60.0
POLL_INTERVAL_S = 0.1
SENT_BYTES_MIN = 16 * 1024 * 1024


def wait_for_line(log: Path, text: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            if text in line:
                return line
        time.sleep(POLL_INTERVAL_S)
    raise AssertionError(f"no {text!r} in {log} within {timeout_s} s")


def replica_dump(directory: Path, node_id: int) -> list[tuple[bytes, bytes, bytes, int]]:
    [path] = (directory / f"node-{node_id}" / "data" / "table" / "replicas").glob("*[0-9a-f]")
    with TableStore(path, cluster_id=1) as store:
        return dump(store)


@pytest.mark.slow
def test_a_restarted_node_installs_the_streamed_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUORUMLOG_TABLE__SNAPSHOT_ENTRIES", str(SNAPSHOT_ENTRIES))
    with cluster.running(tmp_path, 3) as meta_addresses, \
            BlockingTableClient(meta_addresses) as tables:
        tables.create_table("snap", partitions=1, replicas=3)
        tables.set("snap", b"k", b"first", b"v")
        table_id = tables.table_info("snap").record.table_id
        nodes = cluster.load(tmp_path)
        leader = next(n for n in nodes
                      if n.address == tables._client._leaders[(table_id, 0)])
        follower, third = [n for n in nodes if n is not leader]
        cluster.stop_node(tmp_path, follower.id)

        # One write after the other, one Raft entry each: a client's concurrent
        # writes travel in one request and share entries, and the log must grow
        # past the compaction margin.
        for number in range(ENTRIES):
            tables.set("snap", b"h%d" % (number % 16), b"%06d" % number,
                       os.urandom(VALUE_BYTES))
        cluster.restart_node(tmp_path, follower.id, serving_timeout_s=60)
        wait_for_line(Path(follower.log), "raft_snapshot_installed", INSTALL_DEADLINE_S)
        sent = wait_for_line(Path(leader.log), "raft_snapshot_sent", INSTALL_DEADLINE_S)
        # Only the restarted follower and the third node remain: a write acknowledged
        # now went through the follower's log, and the one after it means the
        # follower applied the first (it applies before it answers the next append).
        cluster.stop_node(tmp_path, leader.id)
        tables.set("snap", b"marker", b"1", b"x")
        tables.set("snap", b"marker", b"2", b"x")
    match = re.search(r'\bbytes\W+(\d+)', sent)
    assert match is not None and int(match.group(1)) >= SENT_BYTES_MIN, sent
    before_markers = replica_dump(tmp_path, leader.id)
    assert len(before_markers) == ENTRIES + 1
    with_marker = [r for r in replica_dump(tmp_path, follower.id) if r[1] != b"2"]
    assert with_marker == [r for r in replica_dump(tmp_path, third.id) if r[1] != b"2"]
    assert [r for r in with_marker if r[0] != b"marker"] == before_markers
