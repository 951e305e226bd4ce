"""Counters of the rpc layer, served from a prometheus_client registry.

The hot path only bumps plain integers (a prometheus_client ``inc()`` takes a
lock and costs more than framing a small request); a collector turns them into
metric families when ``metrics_registry`` is scraped, e.g. with
``prometheus_client.generate_latest(metrics_registry)``. Label ``side`` is
``client`` or ``server``; the other label values are few and fixed (message
class names, error codes, close reasons), so series stay bounded.

Exported families:

- ``quorumlog_rpc_requests_total{side,type}``: requests sent / received;
- ``quorumlog_rpc_errors_total{side,code}``: error responses sent / received;
- ``quorumlog_rpc_sent_bytes_total{side}``, ``quorumlog_rpc_received_bytes_total{side}``;
- ``quorumlog_rpc_timeouts_total``: client requests past their deadline;
- ``quorumlog_rpc_closed_connections_total{side,reason}``;
- ``quorumlog_rpc_in_flight_requests{side}``, ``quorumlog_rpc_open_connections{side}``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

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
            labels=["side", "code"],
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
                errors.add_metric([side.name, str(code)], count)
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


metrics_registry = CollectorRegistry(auto_describe=False)
metrics_registry.register(_RpcCollector())


def side(name: str) -> Side:
    return CLIENT if name == "client" else SERVER
