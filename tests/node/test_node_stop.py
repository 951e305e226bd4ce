"""A node stops on SIGTERM within ``quorumlog down``'s wait even when it is the
last meta member left: what its stop asks of meta (revoking the bookie's and
the recovery service's sessions) is best effort, bounded, not the 20 s of an
operation's deadline (the sessions' leases end them instead)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from quorumlog import node as cluster
from quorumlog.node import _cluster

_alive = _cluster._alive  # the liveness check down() uses (reaps a child)


def _wait_gone(pids: list[int], timeout_s: float) -> float:
    """Seconds until every pid is gone; fails past ``timeout_s``."""
    start = time.monotonic()
    while any(_alive(p) for p in pids):
        assert time.monotonic() - start < timeout_s, (
            f"node(s) {[p for p in pids if _alive(p)]} still running {timeout_s:.0f} s after "
            "SIGTERM")
        time.sleep(0.05)
    return time.monotonic() - start


def test_the_last_member_stops_in_time_without_a_meta_quorum(tmp_path: Path) -> None:
    directory = tmp_path / "cluster"
    infos = cluster.up(directory, 3)
    try:
        first, rest = infos[0], infos[1:]
        for info in rest:
            os.kill(info.pid, signal.SIGTERM)
        _wait_gone([i.pid for i in rest], _cluster.DOWN_TIMEOUT_S)
        os.kill(first.pid, signal.SIGTERM)  # meta has no quorum any more
        _wait_gone([first.pid], _cluster.DOWN_TIMEOUT_S)
    finally:
        cluster.down(directory)
