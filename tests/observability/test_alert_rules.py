"""The Prometheus alert rules (deploy/prometheus/quorumlog-alerts.yml) pass
``promtool check rules`` and their unit tests (``promtool test rules``: each
alert fires on a synthetic series that breaks its rule and stays quiet on a
healthy one), and name only metrics the nodes export (test_metrics.py scrapes
them; test_prometheus.py, marked slow, evaluates the rules on a real
Prometheus)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import msgspec
import pytest

ALERT_RULES = Path(__file__).parents[2] / "deploy" / "prometheus" / "quorumlog-alerts.yml"
ALERT_TESTS = ALERT_RULES.with_name("quorumlog-alerts.test.yml")
METRIC = re.compile(r"\bquorumlog_[a-z0-9_]+")
PROMETHEUS_BUILTINS = {"up"}


def alert_rules() -> list[dict[str, Any]]:
    document = msgspec.yaml.decode(ALERT_RULES.read_bytes())
    return [rule for group in document["groups"] for rule in group["rules"]]


def alert_names() -> list[str]:
    return [str(rule["alert"]) for rule in alert_rules()]


def metric_families() -> set[str]:
    """The metric families the rules read (histogram series named by family)."""
    names = {m for rule in alert_rules() for m in METRIC.findall(str(rule["expr"]))}
    return {re.sub(r"_(bucket|count|sum)$", "", name) for name in names}


@pytest.fixture
def promtool() -> str:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.skip("no 'promtool' on PATH: install the Debian package prometheus "
                    "(scripts/setup.sh does, as root)")
    return binary


def test_every_alert_has_a_severity_summary_description_and_a_unit_test() -> None:
    rules = alert_rules()
    assert len(rules) == len(set(alert_names())) >= 10
    for rule in rules:
        assert rule["labels"]["severity"] in ("warning", "critical"), rule
        annotations = rule["annotations"]
        assert annotations["summary"] and annotations["description"], rule
    tested = {case["alertname"] for test in msgspec.yaml.decode(ALERT_TESTS.read_bytes())["tests"]
              for case in test["alert_rule_test"]}
    assert tested == set(alert_names())


def test_promtool_checks_the_rules_and_runs_their_unit_tests(promtool: str) -> None:
    checked = subprocess.run([promtool, "check", "rules", str(ALERT_RULES)],
                             capture_output=True, text=True, timeout=60, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(alert_names())} rules found" in checked.stdout
    tested = subprocess.run([promtool, "test", "rules", ALERT_TESTS.name],
                            capture_output=True, text=True, timeout=60, check=False,
                            cwd=ALERT_TESTS.parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout
