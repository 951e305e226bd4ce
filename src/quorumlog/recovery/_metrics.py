"""Prometheus metrics of auto-recovery, in the node's registry."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from quorumlog import rpc

TASKS_PENDING = Gauge(
    "quorumlog_recovery_tasks_pending", "Under-replicated ledgers waiting for a worker "
    "(as the auditor last counted them)", registry=rpc.metrics_registry)
LEDGERS_LOST = Gauge(
    "quorumlog_recovery_ledgers_lost", "Ledgers with an entry no surviving bookie holds",
    registry=rpc.metrics_registry)
FRAGMENTS_REPLICATED = Counter(
    "quorumlog_recovery_fragments_replicated", "Fragment replicas copied and swapped in",
    registry=rpc.metrics_registry)
BYTES_COPIED = Counter(
    "quorumlog_recovery_bytes_copied", "Entry bytes copied to replacement bookies",
    registry=rpc.metrics_registry)
REPLICAS_MISSING_FOUND = Counter(
    "quorumlog_recovery_replicas_missing_found", "Fragment replicas the periodic check found "
    "lacking entries on a live bookie", registry=rpc.metrics_registry)
REPLICAS_MISPLACED_FOUND = Counter(
    "quorumlog_recovery_replicas_misplaced_found", "Fragment replicas the periodic check found "
    "breaking their ledger's placement policy (moved elsewhere)", registry=rpc.metrics_registry)
