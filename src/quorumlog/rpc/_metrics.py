"""Counters of the rpc layer, served from a prometheus_client registry.

The hot path only bumps plain integers (a prometheus_client ``inc()`` takes a
lock and costs more than framing a small request); a collector turns them into
metric families when ``metrics_registry`` is scraped, e.g. with
``prometheus_client.generate_latest(metrics_registry)``. Label ``side`` is
``client`` or ``server``; the other label values are few and fixed (message
class names, error codes, close reasons), so series stay bounded.

Exported families:

- ``quorumlog_rpc_requests_total{side,type}``: requests sent / received;
- ``quorumlog_rpc_errors_total{side,code,error}``: error responses sent / received
  (``error`` names the code's class, e.g. ``NotLeaderError`` for code 9);
- ``quorumlog_rpc_sent_bytes_total{side}``, ``quorumlog_rpc_received_bytes_total{side}``;
- ``quorumlog_rpc_timeouts_total``: client requests past their deadline;
- ``quorumlog_rpc_closed_connections_total{side,reason}``;
- ``quorumlog_rpc_in_flight_requests{side}``, ``quorumlog_rpc_open_connections{side}``.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector

from ._errors import error_name

SIDES = ("client", "server")


class _Connection(Protocol):
    side: str

    @property
    def in_flight(self) -> int: ...


class Side:
    """The counters of one side; only the event loop thread writes them."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.requests: Counter[str] = Counter()  # by message class name
        self.errors: Counter[int] = Counter()  # by wire error code
        self.closed: Counter[str] = Counter()  # by close reason class
        self.sent_bytes = 0
        self.received_bytes = 0
        self.timeouts = 0
        # Open connections (added on connection_made, removed on connection_lost);
        # a scrape copies the set, which is atomic under the GIL.
        self.connections: set[_Connection] = set()


CLIENT = Side("client")
SERVER = Side("server")


class _RpcCollector(Collector):
    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        sides = (CLIENT, SERVER)
        requests = CounterMetricFamily(
            "quorumlog_rpc_requests", "Requests sent (client) or received (server).",
            labels=["side", "type"],
        )
        errors = CounterMetricFamily(
            "quorumlog_rpc_errors", "Error responses sent (server) or received (client).",
            labels=["side", "code", "error"],
        )
        closed = CounterMetricFamily(
            "quorumlog_rpc_closed_connections", "Connections closed, by reason class.",
            labels=["side", "reason"],
        )
        sent = CounterMetricFamily(
            "quorumlog_rpc_sent_bytes", "Bytes handed to the transport.", labels=["side"]
        )
        received = CounterMetricFamily(
            "quorumlog_rpc_received_bytes", "Bytes received from the transport.", labels=["side"]
        )
        in_flight = GaugeMetricFamily(
            "quorumlog_rpc_in_flight_requests",
            "Requests awaiting a response (client) or running in a handler (server).",
            labels=["side"],
        )
        open_connections = GaugeMetricFamily(
            "quorumlog_rpc_open_connections", "Open connections.", labels=["side"]
        )
        for side in sides:
            for name, count in side.requests.copy().items():
                requests.add_metric([side.name, name], count)
            for code, count in side.errors.copy().items():
                errors.add_metric([side.name, str(code), error_name(code)], count)
            for reason, count in side.closed.copy().items():
                closed.add_metric([side.name, reason], count)
            sent.add_metric([side.name], side.sent_bytes)
            received.add_metric([side.name], side.received_bytes)
            live = side.connections.copy()
            in_flight.add_metric([side.name], sum(c.in_flight for c in live))
            open_connections.add_metric([side.name], len(live))
        timeouts = CounterMetricFamily(
            "quorumlog_rpc_timeouts", "Client requests that passed their deadline."
        )
        timeouts.add_metric([], CLIENT.timeouts)
        yield from (requests, errors, closed, sent, received, in_flight, open_connections)
        yield timeouts


LATENCY_BUCKETS_SECONDS = (0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                           0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Upper bounds of the latency histograms of the ledger client, streams, meta
and tables (0.25 ms to 10 s: a local fsync to a request that timed out)."""


class LatencyHistogram:
    """A histogram kept in plain integers, for hot paths.

    ``observe`` is a bisect and two additions (a prometheus_client
    ``Histogram.observe`` takes a lock per call); a collector turns it into a
    ``HistogramMetricFamily`` at scrape time with :func:`histogram_family`.
    Written by one event loop thread; a scrape reads a copy of the counts.
    """

    __slots__ = ("bounds_seconds", "counts", "sum_seconds")

    def __init__(self, bounds_seconds: tuple[float, ...] = LATENCY_BUCKETS_SECONDS) -> None:
        self.bounds_seconds = bounds_seconds
        self.counts = [0] * (len(bounds_seconds) + 1)  # the last one: above every bound
        self.sum_seconds = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(self.bounds_seconds, seconds)] += 1
        self.sum_seconds += seconds

    def cumulative(self) -> list[tuple[str, float]]:
        """Prometheus buckets: (le, observations <= le), ending with +Inf."""
        counts = list(self.counts)
        buckets: list[tuple[str, float]] = []
        total = 0
        for bound, count in zip((*self.bounds_seconds, float("inf")), counts, strict=True):
            total += count
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), total))
        return buckets


def histogram_family(name: str, documentation: str, labels: list[str],
                     histograms: Iterable[tuple[list[str], LatencyHistogram]]
                     ) -> HistogramMetricFamily:
    """One histogram family from ``(label values, histogram)`` pairs."""
    family = HistogramMetricFamily(name, documentation, labels=labels)
    for values, histogram in histograms:
        family.add_metric(values, histogram.cumulative(), histogram.sum_seconds)
    return family


def counter_family(name: str, documentation: str, labels: list[str],
                   counts: Iterable[tuple[list[str], float]]) -> CounterMetricFamily:
    """One counter family (``name`` without ``_total``) from ``(label values, count)``."""
    family = CounterMetricFamily(name, documentation, labels=labels)
    for values, count in counts:
        family.add_metric(values, count)
    return family


def gauge_family(name: str, documentation: str, labels: list[str],
                 values: Iterable[tuple[list[str], float]]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=labels)
    for label_values, value in values:
        family.add_metric(label_values, value)
    return family


metrics_registry = CollectorRegistry(auto_describe=False)
metrics_registry.register(_RpcCollector())


def side(name: str) -> Side:
    return CLIENT if name == "client" else SERVER
