"""Prometheus metrics of duplication, in the node's registry (labels: table,
dup id, partition; exported by the partition's leader)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from quorumlog import rpc

_LABELS = ("table", "dup", "partition")

SHIPPED_MUTATIONS = Counter(
    "quorumlog_dup_shipped_mutations", "Records the remote cluster acknowledged",
    _LABELS, registry=rpc.metrics_registry)
SHIPPED_BYTES = Counter(
    "quorumlog_dup_shipped_bytes", "Key and value bytes the remote cluster acknowledged",
    _LABELS, registry=rpc.metrics_registry)
SKIPPED_MUTATIONS = Counter(
    "quorumlog_dup_skipped_mutations", "Records dropped in fail mode skip after the remote "
    "refused them or was unreachable", _LABELS, registry=rpc.metrics_registry)
PENDING_DECREES = Gauge(
    "quorumlog_dup_pending_decrees", "Applied log entries after confirmed_decree (lag in "
    "decrees)", _LABELS, registry=rpc.metrics_registry)
LAG_MS = Gauge(
    "quorumlog_dup_lag_ms", "Age of the oldest applied write not yet confirmed by the remote",
    _LABELS, registry=rpc.metrics_registry)
LOG_LOST = Gauge(
    "quorumlog_dup_log_lost", "1 from finding the log after confirmed_decree gone on this "
    "leader until the partition's resync copy is done", _LABELS, registry=rpc.metrics_registry)
RESYNCS = Counter(
    "quorumlog_dup_resyncs", "Partition copies after the log to ship was found compacted",
    _LABELS, registry=rpc.metrics_registry)
