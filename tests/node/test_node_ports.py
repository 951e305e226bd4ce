"""A node whose metrics port is taken: one plain ``error:`` line naming the
port and its config field, exit EXIT_CONFIG, and no role started (the bookie's
directories are not even created). Real node processes on 127.0.0.1.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorumlog import node as cluster
from quorumlog.errors import QuorumlogError
from quorumlog.node._cluster import free_port

NODE_TIMEOUT_S = 60.0


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port held by a listening socket of this test process."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def write_config(directory: Path, *, listen: str, metrics: str) -> Path:
    path = directory / "node.toml"
    path.write_text(
        f'[node]\nid = 1\ndata_dir = "{directory / "data"}"\nlisten = "{listen}"\n'
        f'metrics_listen = "{metrics}"\nroles = ["meta", "bookie"]\n\n'
        f'[meta]\nmembers = ["1={listen}"]\n')
    return path


def run_node(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "quorumlog", "node", "--config", str(config)],
                          capture_output=True, text=True, timeout=NODE_TIMEOUT_S,
                          stdin=subprocess.DEVNULL)


def test_metrics_port_in_use_is_one_error_line_before_any_role_starts(
        tmp_path: Path, taken_port: int) -> None:
    metrics = f"127.0.0.1:{taken_port}"
    config = write_config(tmp_path, listen=f"127.0.0.1:{free_port()}", metrics=metrics)
    out = run_node(config)
    assert out.returncode == cluster.EXIT_CONFIG, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, out.stderr[-3000:]
    assert metrics in errors[0] and "metrics_listen" in errors[0], errors[0]
    assert not (tmp_path / "data").exists(), "a role started before the port was checked"



def test_free_port_is_outside_the_ephemeral_range_and_bindable() -> None:
    # A port from the kernel's ephemeral range can be taken by any outgoing connection
    # between free_port() and the node's bind: the dup test's second cluster failed so.
    from quorumlog.node._cluster import _ephemeral_port_range

    low, high = _ephemeral_port_range()
    ports = {free_port() for _ in range(50)}
    assert all(not low <= port <= high for port in ports), sorted(ports)
    assert len(ports) > 40  # random, not one port handed out again and again
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_clusters_ports_are_distinct_even_when_free_port_repeats_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """free_port() checks a port, it does not reserve it: two asks may return
    the same one. ``up`` once wrote one metrics port into two nodes' configs
    and the third node failed to start (CI, 2026-11-25)."""
    from quorumlog.node import _cluster

    answers = iter([21001, 21001, 21002, 21001, 21003, 21002, 21004, 21005, 21005, 21006,
                    21007, 21008])
    monkeypatch.setattr(_cluster, "free_port", lambda: next(answers))
    configs = _cluster.write_configs(tmp_path, 3)
    ports = [int(a.rsplit(":", 1)[1]) for _, _, address, metrics, _ in configs
             for a in (address, metrics)]
    assert sorted(ports) == [21001, 21002, 21003, 21004, 21005, 21006]


def test_free_ports_skips_the_ports_a_stopped_cluster_keeps(monkeypatch: pytest.MonkeyPatch,
                                                            ) -> None:
    from quorumlog.node import _cluster

    answers = iter([21001, 21002, 21001, 21003])
    monkeypatch.setattr(_cluster, "free_port", lambda: next(answers))
    assert _cluster.free_ports(2, taken=[21002]) == [21001, 21003]
    monkeypatch.setattr(_cluster, "free_port", lambda: 21001)
    with pytest.raises(QuorumlogError, match="distinct free ports"):
        _cluster.free_ports(2)
