"""Prometheus metrics of the ledger client, on ``quorumlog.rpc.metrics_registry``.

After BookKeeper's client stats (``bookkeeper_client_ADD_ENTRY``,
``READ_ENTRY``, ``ENSEMBLE_CHANGES``, ``LEDGER_RECOVER``): every ledger client
of the process adds into the one :data:`LEDGER_METRICS`. The write handle bumps
plain integers once per drained run of confirmed entries and observes each
entry's add latency into a :class:`quorumlog.rpc.LatencyHistogram`; reads count
once per decoded batch. No label names a ledger: the series stay bounded.

Families (see docs/metrics.md):

- ``quorumlog_ledger_adds_total{result}`` (ok, failed), ``..._added_bytes_total``,
  ``..._add_latency_seconds`` (histogram: append to confirmed);
- ``quorumlog_ledger_read_entries_total``, ``..._read_bytes_total``,
  ``..._read_latency_seconds`` (histogram: one read request to a bookie);
- ``quorumlog_ledger_ensemble_changes_total``, ``..._recoveries_total{result}``;
- ``quorumlog_ledger_errors_total{kind}``: handle failures by error class.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from quorumlog import rpc


@dataclass(slots=True)
class LedgerMetrics:
    """The counters of every ledger client of the process (event loop threads)."""

    adds_ok: int = 0
    adds_failed: int = 0
    added_bytes: int = 0
    add_latency: rpc.LatencyHistogram = field(default_factory=rpc.LatencyHistogram)
    read_entries: int = 0
    read_bytes: int = 0
    read_latency: rpc.LatencyHistogram = field(default_factory=rpc.LatencyHistogram)
    ensemble_changes: int = 0
    recoveries_ok: int = 0
    recoveries_failed: int = 0
    errors: Counter[str] = field(default_factory=Counter)  # by error class name


LEDGER_METRICS = LedgerMetrics()


class _LedgerCollector(Collector):
    def collect(self) -> Iterator[CounterMetricFamily | HistogramMetricFamily]:
        m = LEDGER_METRICS
        yield rpc.counter_family("quorumlog_ledger_adds", "Entries appended, by outcome.",
                                 ["result"], [(["ok"], m.adds_ok), (["failed"], m.adds_failed)])
        yield rpc.counter_family("quorumlog_ledger_added_bytes",
                                 "Payload bytes of confirmed entries.", [], [([], m.added_bytes)])
        yield rpc.histogram_family(
            "quorumlog_ledger_add_latency_seconds",
            "From append to confirmed (Qa acks and every earlier entry confirmed).",
            [], [([], m.add_latency)])
        yield rpc.counter_family("quorumlog_ledger_read_entries", "Entries read and verified.",
                                 [], [([], m.read_entries)])
        yield rpc.counter_family("quorumlog_ledger_read_bytes", "Payload bytes read.",
                                 [], [([], m.read_bytes)])
        yield rpc.histogram_family(
            "quorumlog_ledger_read_latency_seconds",
            "One read request (entry or batch) to a bookie.", [], [([], m.read_latency)])
        yield rpc.counter_family("quorumlog_ledger_ensemble_changes",
                                 "Bookies replaced in a ledger's ensemble.", [],
                                 [([], m.ensemble_changes)])
        yield rpc.counter_family(
            "quorumlog_ledger_recoveries", "Ledger recoveries (fence, rewrite, close).",
            ["result"], [(["ok"], m.recoveries_ok), (["failed"], m.recoveries_failed)])
        yield rpc.counter_family(
            "quorumlog_ledger_errors", "Write handles failed, by error class.", ["kind"],
            [([kind], count) for kind, count in sorted(m.errors.copy().items())])


rpc.metrics_registry.register(_LedgerCollector())
