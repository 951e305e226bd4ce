"""A local cluster that does not become healthy in time: ``quorumlog up``
leaves its nodes running for a look and says how to stop them; the
``running`` context (tests, scripts) stops them before it re-raises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from quorumlog import node as cluster
from quorumlog.errors import DeadlineExceededError
from quorumlog.node import _cluster

_alive = _cluster._alive  # the liveness check down() uses (reaps a child)


def test_running_stops_the_nodes_of_a_start_that_timed_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_cluster, "UP_TIMEOUT_S", 0.0)  # no cluster is healthy at once
    directory = tmp_path / "slow"
    with pytest.raises(DeadlineExceededError) as raised, cluster.running(directory, 3):
        raise AssertionError("a cluster that is not healthy must not be yielded")
    assert "`quorumlog down` stops them" in str(raised.value)
    pids = [n.pid for n in cluster.load(directory)]
    assert len(pids) == 3
    assert not any(_alive(p) for p in pids), "running() left the nodes of a failed start"


def test_up_that_timed_out_leaves_its_nodes_for_down(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_cluster, "UP_TIMEOUT_S", 0.0)
    directory = tmp_path / "slow"
    try:
        with pytest.raises(DeadlineExceededError, match="keep running for a look"):
            cluster.up(directory, 1)
        pids = [n.pid for n in cluster.load(directory)]
        assert pids and all(_alive(p) for p in pids)
    finally:
        stopped = cluster.down(directory)
    assert stopped == pids and not any(_alive(p) for p in pids)


def test_down_returns_once_a_node_that_ignored_sigterm_is_gone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node whose shutdown hangs past DOWN_TIMEOUT_S is SIGKILLed; ``down``
    returns only when it is gone, so an ``up`` of the same directory right
    after does not find it "already running" (CI, test_two_way_duplication_converges:
    a node's shutdown waited on a meta without quorum)."""
    monkeypatch.setattr(_cluster, "DOWN_TIMEOUT_S", 0.3)
    stubborn = subprocess.Popen([sys.executable, "-c", (
        "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(60)")], stdout=subprocess.PIPE)
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline() == b"ready\n"
        directory = tmp_path / "stuck"
        directory.mkdir()
        _cluster.save(directory, [_cluster.NodeInfo(
            1, stubborn.pid, "127.0.0.1:1", "", ["meta"], str(directory / "node.toml"),
            str(directory / "node.log"))])
        assert cluster.down(directory) == [stubborn.pid]
        assert not _alive(stubborn.pid)
    finally:
        stubborn.kill()
        stubborn.wait()
