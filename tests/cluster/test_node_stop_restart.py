"""``quorumlog stop --node ID`` and ``quorumlog restart --node ID`` on a real
one-node cluster (meta and bookie in one process): restart waits until the node
serves, and a node that dies during start-up (here: its metrics port taken) is
reported with its error line and a non-zero exit, not as "started again"."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from inprocess_cli import run_cli, run_cli_process
from quorumlog import node as cluster
from quorumlog.node import NodeInfo

CLI_TIMEOUT_S = 120.0


def cli(*args: str, process: bool = False) -> subprocess.CompletedProcess[str]:
    """Run the CLI (in this process unless ``process``); its output with
    whitespace runs as single spaces (rich wraps lines)."""
    out = (run_cli_process(*args, timeout_s=CLI_TIMEOUT_S) if process else run_cli(*args))
    return subprocess.CompletedProcess(out.args, out.returncode, " ".join(out.stdout.split()),
                                       " ".join(out.stderr.split()))


def alive(pid: int) -> bool:
    """The node was started by this process (``cluster.up``): reap it if it exited."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def one_node(tmp_path: Path) -> Iterator[tuple[Path, NodeInfo]]:
    directory = tmp_path / "cluster"
    cluster.up(directory, 1)
    try:
        yield directory, cluster.load(directory)[0]
    finally:
        cluster.down(directory)


def test_restart_of_a_node_that_dies_at_once_fails_with_its_error_line(
        one_node: tuple[Path, NodeInfo]) -> None:
    directory, node = one_node
    cluster.stop_node(directory, node.id)
    assert not alive(node.pid)
    # Its metrics port taken: the restarted node exits at once.
    host, port = node.metrics.rsplit(":", 1)
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind((host, int(port)))
        squatter.listen()
        failed = cli("restart", "--node", str(node.id), "--dir", str(directory))
    assert failed.returncode != 0, failed.stdout
    assert "started again" not in failed.stdout, failed.stdout
    assert f"node {node.id}" in failed.stderr and "exited during start-up" in failed.stderr, \
        failed.stderr
    assert "metrics_listen" in failed.stderr and node.metrics in failed.stderr, failed.stderr

    restarted = cli("restart", "--node", str(node.id), "--dir", str(directory))
    assert restarted.returncode == 0, restarted.stderr
    assert "serving" in restarted.stdout, restarted.stdout
    row = cluster.status(directory)[0]  # serving when restart returns: no waiting here
    assert row["alive"] and row["meta_role"] != "unreachable", row
    assert row["bookie"]["state"] != "unreachable", row


def test_stop_one_node(one_node: tuple[Path, NodeInfo]) -> None:
    directory, node = one_node
    unknown = cli("stop", "--node", "9", "--dir", str(directory), process=True)
    assert unknown.returncode == 1 and "no node 9" in unknown.stderr, unknown
    stopped = cli("stop", "--node", str(node.id), "--dir", str(directory))
    assert stopped.returncode == 0, stopped.stderr
    assert f"node {node.id} stopped" in stopped.stdout
    assert not alive(node.pid)
    again = cli("stop", "--node", str(node.id), "--dir", str(directory))
    assert again.returncode == 0 and "was not running" in again.stdout, again


def test_stop_has_help() -> None:
    out = cli("stop", "--help")
    assert out.returncode == 0 and "--node" in out.stdout and "Stop one node" in out.stdout, out


def test_node_stop_id_and_node_restart_id(one_node: tuple[Path, NodeInfo]) -> None:
    """``quorumlog node stop ID`` / ``node restart ID`` beside ``stop --node ID``
    (issue 18), while ``node --config FILE`` still runs a node."""
    directory, node = one_node
    stopped = cli("node", "stop", str(node.id), "--dir", str(directory))
    assert stopped.returncode == 0 and f"node {node.id} stopped" in stopped.stdout, stopped
    assert not alive(node.pid)
    restarted = cli("node", "restart", str(node.id), "--dir", str(directory))
    assert restarted.returncode == 0 and "serving" in restarted.stdout, restarted
    assert cluster.status(directory)[0]["alive"]
    unknown = cli("node", "stop", "9", "--dir", str(directory))
    assert unknown.returncode == 1 and "no node 9" in unknown.stderr, unknown
    bare = cli("node")
    assert bare.returncode == 2 and "--config" in bare.stderr, bare
    both = cli("node", "--config", "x.toml", "stop", "1")
    assert both.returncode == 2 and "does not go with" in both.stderr, both
    usage = cli("node", "--help").stdout
    assert "--config" in usage and "stop" in usage and "restart" in usage, usage
