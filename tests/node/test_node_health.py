"""/healthz and /readyz on real node processes, and the liveness rule with a
manual clock."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorumlog import node as cluster
from quorumlog.node._health import LOOP_STALE_AFTER_S, Health

DEADLINE_S = 60.0
HTTP_TIMEOUT_S = 5.0


def get(metrics: str, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{metrics}{path}", timeout=HTTP_TIMEOUT_S) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def wait_for(what: str, condition: object) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[list[cluster.NodeInfo]]:
    infos = cluster.up(tmp_path / "cluster", 3)
    try:
        yield infos
    finally:
        cluster.down(tmp_path / "cluster")


def test_ready_when_roles_serve_and_not_ready_without_quorum(
        nodes: list[cluster.NodeInfo]) -> None:
    for info in nodes:
        wait_for(f"node {info.id} ready", lambda i=info: get(i.metrics, "/readyz")[0] == 200)
        status, body = get(info.metrics, "/healthz")
        assert status == 200 and json.loads(body)["status"] == "ok"
        status, body = get(info.metrics, "/metrics")
        assert status == 200 and "quorumlog_raft_term" in body
        assert get(info.metrics, "/nope")[0] == 404
    survivor = nodes[0]
    for info in nodes[1:]:
        os.kill(info.pid, signal.SIGKILL)
    wait_for("the survivor to report not ready",
             lambda: get(survivor.metrics, "/readyz")[0] == 503)
    status, body = get(survivor.metrics, "/readyz")
    reasons = json.loads(body)["reasons"]
    assert any(r.startswith(("meta:", "bookie:")) for r in reasons), reasons
    assert get(survivor.metrics, "/healthz")[0] == 200  # alive, only not ready


def test_liveness_fails_when_the_loop_stops_turning() -> None:
    now = [100.0]
    health = Health(clock=lambda: now[0])
    health.add_check("role", lambda: None)
    assert health.ready() == (False, {"status": "not ready", "reasons": ["starting"]})
    health.refresh()
    assert health.live()[0] and health.ready()[0]
    health.add_check("broken", lambda: 1 / 0)  # type: ignore[arg-type, return-value]
    health.refresh()
    ok, body = health.ready()
    assert not ok and "ZeroDivisionError" in body["reasons"][0]
    now[0] += LOOP_STALE_AFTER_S + 1
    ok, body = health.live()
    assert not ok and body["status"] == "stalled"
    assert health.ready()[1]["reasons"] == ["the event loop is not turning"]
