"""A real Prometheus scrapes a local cluster and answers every dashboard query.

Starts a 3-node cluster, serves this process's registry (the ledger client
and stream metrics of the load it generates, as an application embedding
the client would), writes a prometheus.yml naming every node's metrics
address from ``quorumlog status -o json``, runs Debian's ``prometheus`` on
127.0.0.1 with a temporary storage directory, produces load, and then asks
Prometheus's HTTP API for every ``expr`` of deploy/grafana/quorumlog.json
(with the dashboard variables substituted): each must return data. That
proves the dashboard and the metrics agree. It also loads the alert rules
(deploy/prometheus/quorumlog-alerts.yml): every rule must evaluate without
error, and none may fire on the healthy cluster.

Needs the ``prometheus`` binary (Debian package ``prometheus``;
scripts/setup.sh installs it when run as root); skips with that reason
otherwise.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import start_http_server

from quorumlog import node as cluster
from quorumlog import rpc
from quorumlog.node._cluster import free_port

from . import load
from .test_alert_rules import ALERT_RULES, alert_names
from .test_dashboard import DASHBOARD, dashboard_exprs, substitute

SCRAPE_INTERVAL_S = 1
READY_DEADLINE_S = 30.0
QUERY_DEADLINE_S = 60.0
HTTP_TIMEOUT_S = 5.0

pytestmark = pytest.mark.slow


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as reply:
        return json.loads(reply.read())


def query(prometheus: str, expr: str) -> list[Any]:
    url = f"http://{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    answer = get_json(url)
    assert answer["status"] == "success", answer
    return list(answer["data"]["result"])


def wait_until(what: str, check: Any, deadline_s: float) -> Any:
    deadline = time.monotonic() + deadline_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except OSError as exc:  # not listening yet
            last = exc
        else:
            if last:
                return last
        time.sleep(SCRAPE_INTERVAL_S / 2)
    pytest.fail(f"{what}: not within {deadline_s} s (last: {last!r})")


@pytest.fixture
def prometheus_binary() -> str:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("no 'prometheus' on PATH: install the Debian package prometheus "
                    "(scripts/setup.sh does, as root)")
    return binary


@pytest.fixture
def cluster_dir(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "cluster"
    with cluster.running(directory, 3):
        yield directory


def node_metrics_addresses(cluster_dir: Path) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-m", "quorumlog", "status", "--dir", str(cluster_dir), "-o", "json"],
        check=True, capture_output=True, text=True, timeout=60).stdout
    rows = json.loads(out)
    rows = rows["nodes"] if isinstance(rows, dict) else rows
    return [str(row["metrics"]) for row in rows]


def test_prometheus_answers_every_dashboard_query(
        prometheus_binary: str, cluster_dir: Path, tmp_path: Path) -> None:
    client_port = free_port()
    server, _ = start_http_server(client_port, addr="127.0.0.1", registry=rpc.metrics_registry)
    nodes = node_metrics_addresses(cluster_dir)
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({  # JSON is YAML
        "global": {"scrape_interval": f"{SCRAPE_INTERVAL_S}s",
                   "evaluation_interval": f"{SCRAPE_INTERVAL_S}s"},
        "rule_files": [str(ALERT_RULES)],
        "scrape_configs": [  # the nodes' job as docs/deploy.md names it (the alert rules')
            {"job_name": "quorumlog", "static_configs": [{"targets": nodes}]},
            {"job_name": "quorumlog-clients",
             "static_configs": [{"targets": [f"127.0.0.1:{client_port}"]}]},
        ],
    }))
    listen = f"127.0.0.1:{free_port()}"
    log = (tmp_path / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [prometheus_binary, f"--config.file={config}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address={listen}"],
        stdout=log, stderr=subprocess.STDOUT)
    stream = None
    try:
        wait_until("prometheus ready", lambda: get_json(
            f"http://{listen}/api/v1/status/buildinfo")["status"] == "success",
            READY_DEADLINE_S)
        wait_until("every target up", lambda: len(
            [r for r in query(listen, "up") if r["value"][1] == "1"]) == len(nodes) + 1,
            READY_DEADLINE_S)
        meta = cluster.meta_addresses(cluster_dir)
        load.ledger_load(meta)
        stream = load.stream_load(meta, "dashboard", "sub")
        load.table_load(meta, "dashboard")
        missing = []
        for title, expr in dashboard_exprs(json.loads(DASHBOARD.read_text())):
            try:
                wait_until(f"{title}: {expr}",
                           functools.partial(query, listen, substitute(expr)), QUERY_DEADLINE_S)
            except pytest.fail.Exception:
                missing.append(f"{title}: {expr}")
        assert not missing, "dashboard queries with no data:\n" + "\n".join(missing)
        # The alert rules evaluate without error against the live series, and
        # none fires on a healthy cluster under load.
        def evaluated() -> list[Any]:  # every rule of every group (never: year 0001)
            rules = [r for g in get_json(f"http://{listen}/api/v1/rules")["data"]["groups"]
                     for r in g["rules"]]
            done = all(not r.get("lastEvaluation", "0001").startswith("0001") for r in rules)
            return rules if done else []

        rules = wait_until("alert rules evaluated", evaluated, QUERY_DEADLINE_S)
        assert len(rules) == len(alert_names()), [r["name"] for r in rules]
        assert all(r["health"] == "ok" for r in rules), [
            (r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
        assert [r["name"] for r in rules if r["state"] != "inactive"] == []
    finally:
        if stream is not None:
            stream.close()
        process.terminate()
        process.wait(timeout=30)
        log.close()
        server.shutdown()
