"""Every component's metrics move under load, on a real 3-node local cluster.

The ledger client and stream counters live in this process (the client's
registry, ``quorumlog.rpc.metrics_registry``, as an application embedding
the client would serve it); the meta, table and bookie ones are scraped from
the nodes' ``/metrics`` over HTTP.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from quorumlog import node as cluster
from quorumlog import rpc

from . import load

SCRAPE_TIMEOUT_S = 5.0

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def local() -> Samples:
    return parse(generate_latest(rpc.metrics_registry).decode())


def scrape(address: str) -> Samples:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=SCRAPE_TIMEOUT_S) as reply:
        return parse(reply.read().decode())


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples: list[Samples], name: str, **labels: str) -> float:
    return sum(value(s, name, **labels) for s in samples)


def every(samples: list[Samples], name: str) -> float:
    """The sum of ``name`` over every label set and every node."""
    return sum(v for s in samples for (n, _), v in s.items() if n == name)


@pytest.fixture(scope="module")
def cluster_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    directory = tmp_path_factory.mktemp("metrics-cluster")
    with cluster.running(directory, 3):
        yield directory


def test_ledger_client_metrics(cluster_dir: Path) -> None:
    before = local()
    load.ledger_load(cluster.meta_addresses(cluster_dir))
    after = local()

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    # The left-open ledger's entry counts twice: appended, then rewritten by recovery.
    assert moved("quorumlog_ledger_adds_total", result="ok") == load.LEDGER_ENTRIES + 2
    assert moved("quorumlog_ledger_added_bytes_total") == load.LEDGER_ENTRIES * load.ENTRY_BYTES + 2
    # Every confirmed add, and every recovery rewrite, is one latency observation.
    assert moved("quorumlog_ledger_add_latency_seconds_count") >= load.LEDGER_ENTRIES + 1
    assert moved("quorumlog_ledger_read_entries_total") >= load.LEDGER_ENTRIES
    assert moved("quorumlog_ledger_read_bytes_total") >= load.LEDGER_ENTRIES * load.ENTRY_BYTES
    assert moved("quorumlog_ledger_read_latency_seconds_count") >= 1
    assert moved("quorumlog_ledger_recoveries_total", result="ok") == 1


def test_stream_metrics(cluster_dir: Path) -> None:
    name, subscription = "metrics-stream", "sub"
    streams = load.stream_load(cluster.meta_addresses(cluster_dir), name, subscription)
    try:
        samples = local()
        assert value(samples, "quorumlog_stream_in_messages_total",
                     stream=name) == load.STREAM_MESSAGES
        assert value(samples, "quorumlog_stream_in_bytes_total", stream=name) > 0
        assert value(samples, "quorumlog_stream_out_messages_total",
                     stream=name) >= load.CONSUMED_MESSAGES
        assert value(samples, "quorumlog_stream_producers", stream=name) == 1
        assert value(samples, "quorumlog_stream_consumers", stream=name) == 1
        assert value(samples, "quorumlog_stream_ledger_rollovers_total", stream=name) >= 1
        # The producer recomputes the backlog on its interval: poll for it.
        expected = load.STREAM_MESSAGES - load.CONSUMED_MESSAGES
        deadline = time.monotonic() + load.DEADLINE_S
        backlog = -1.0
        while time.monotonic() < deadline:
            backlog = value(local(), "quorumlog_stream_backlog_entries", stream=name,
                            subscription=subscription)
            if backlog == expected:
                break
            time.sleep(load.BACKLOG_INTERVAL_MS / 1000)
        assert backlog == expected
    finally:
        streams.close()
    assert value(local(), "quorumlog_stream_producers", stream=name) == 0
    assert value(local(), "quorumlog_stream_consumers", stream=name) == 0


def test_meta_and_table_metrics_on_the_nodes(cluster_dir: Path) -> None:
    nodes = cluster.load(cluster_dir)
    load.table_load(cluster.meta_addresses(cluster_dir), "metrics-table")
    samples = [scrape(n.metrics) for n in nodes]
    assert total(samples, "quorumlog_meta_requests_total", kind="Range") > 0
    assert total(samples, "quorumlog_meta_proposals_total", result="ok") > 0
    assert total(samples, "quorumlog_meta_proposal_latency_seconds_count") > 0
    assert total(samples, "quorumlog_meta_leader_changes_total") >= len(nodes)
    leaders = [n.id for n, s in zip(nodes, samples, strict=True)
               if value(s, "quorumlog_meta_is_leader", member=str(n.id)) == 1]
    assert len(leaders) == 1
    assert {value(s, "quorumlog_meta_leader_id", member=str(n.id))
            for n, s in zip(nodes, samples, strict=True)} == {leaders[0]}
    assert total(samples, "quorumlog_table_requests_total", op="write",
                 result="ok") == load.TABLE_KEYS
    assert total(samples, "quorumlog_table_requests_total", op="get",
                 result="ok") == load.TABLE_KEYS
    assert total(samples, "quorumlog_table_request_latency_seconds_count", op="get") \
        == load.TABLE_KEYS
    # Writes are answered from their proposal's future (no task): timed there.
    assert total(samples, "quorumlog_table_request_latency_seconds_count", op="write") \
        == load.TABLE_KEYS
    assert every(samples, "quorumlog_table_groups_hosted") >= 2 * 3
    assert every(samples, "quorumlog_table_groups_led") >= 2


def test_the_alert_rules_read_only_metrics_the_nodes_export(cluster_dir: Path) -> None:
    """Every metric family deploy/prometheus/quorumlog-alerts.yml reads is on a
    node's /metrics (labelled families too, with no series yet: duplication)."""
    from .test_alert_rules import metric_families

    exported = set()
    for node in cluster.load(cluster_dir):
        url = f"http://{node.metrics}/metrics"
        with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as reply:
            exported |= {line.split()[2] for line in reply.read().decode().splitlines()
                         if line.startswith("# TYPE ")}
    wanted = metric_families()
    assert wanted and wanted <= exported, sorted(wanted - exported)
