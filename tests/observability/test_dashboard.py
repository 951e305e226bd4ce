"""The Grafana dashboard (deploy/grafana/quorumlog.json) is valid Grafana JSON whose
queries name only metrics that exist (checked against a real Prometheus by
test_prometheus.py, marked slow)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DASHBOARD = Path(__file__).parents[2] / "deploy" / "grafana" / "quorumlog.json"
RATE_INTERVAL = "1m"  # what $__rate_interval stands for in the queries


def dashboard_exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expression) of every target of every panel, rows included."""
    found: list[tuple[str, str]] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            found.extend((panel["title"], target["expr"]) for target in panel.get("targets", [])
                         if target.get("expr"))
            walk(panel.get("panels", []))

    walk(dashboard["panels"])
    return found


def substitute(expr: str) -> str:
    return expr.replace("$__rate_interval", RATE_INTERVAL).replace("${__rate_interval}",
                                                                   RATE_INTERVAL)


def test_the_dashboard_is_valid_grafana_json() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert isinstance(dashboard["schemaVersion"], int)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
    exprs = dashboard_exprs(dashboard)
    assert exprs
    assert all("$" not in substitute(expr) for _, expr in exprs)
