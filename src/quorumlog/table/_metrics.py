"""Prometheus metrics of the table role, on ``quorumlog.rpc.metrics_registry``.

After Pegasus's replica-server counters (``get_qps``, ``put_qps``,
``get_latency``, replica counts): requests by operation with a latency
histogram each, the partitions a node hosts and leads, and the scheduler's
configuration changes the node carried out. Request handlers are wrapped
once in :func:`metered` (the handler code is untouched); counters are plain
integers bumped on the event loop. No label names a table or partition.

Families (see docs/metrics.md):

- ``quorumlog_table_requests_total{op,result}`` (op: write, get, multi_get, scan,
  count, ttl; result: ok, error), ``..._request_latency_seconds{op}``;
- ``quorumlog_table_groups_hosted{node}``, ``..._groups_led{node}`` (gauges);
- ``quorumlog_table_changes_total{outcome}``: scheduler changes this node was
  told to run (started, stale_epoch, not_leader, not_hosted, busy).
"""

from __future__ import annotations

import asyncio
import functools
import threading
import weakref
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector

from quorumlog import rpc
from quorumlog.errors import QuorumlogError
from quorumlog.table._heartbeat import ChangeOutcome


@dataclass(slots=True)
class TableMetrics:
    """The counters of the table roles of this process (event loop thread)."""

    requests: Counter[tuple[str, str]] = field(default_factory=Counter)  # (op, result)
    latency: dict[str, rpc.LatencyHistogram] = field(default_factory=dict)  # by op
    changes: Counter[str] = field(default_factory=Counter)  # by ChangeOutcome value


TABLE_METRICS = TableMetrics()


class _Node(Protocol):
    """What the collector reads from a table role (the TableService)."""

    node_id: int

    def group_counts(self) -> tuple[int, int]: ...

    def disk_full(self) -> bool: ...


_nodes: weakref.WeakSet[_Node] = weakref.WeakSet()
_lock = threading.Lock()


def register_node(node: _Node) -> None:
    with _lock:
        _nodes.add(node)


def unregister_node(node: _Node) -> None:
    with _lock:
        _nodes.discard(node)


R = TypeVar("R")


def metered(op: str, handler: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
    """``handler`` counted under ``op`` (ok or error) and timed."""
    histogram = TABLE_METRICS.latency.setdefault(op, rpc.LatencyHistogram())
    requests = TABLE_METRICS.requests

    @functools.wraps(handler)
    async def wrapper(*args: Any, **kwargs: Any) -> R:
        loop = asyncio.get_running_loop()
        started_s = loop.time()
        try:
            response = await handler(*args, **kwargs)
        except QuorumlogError:
            requests[(op, "error")] += 1
            raise
        requests[(op, "ok")] += 1
        histogram.observe(loop.time() - started_s)
        return response

    return wrapper


def metered_deferred(op: str, handler: Callable[..., R | asyncio.Future[R]]
                     ) -> Callable[..., R | asyncio.Future[R]]:
    """:func:`metered` for a plain handler answering with a future (rpc's
    deferred answers): counted and timed from the future's done callback, so
    the write path keeps no task or coroutine per request."""
    histogram = TABLE_METRICS.latency.setdefault(op, rpc.LatencyHistogram())
    requests = TABLE_METRICS.requests

    def done(started_s: float, answer: asyncio.Future[R]) -> None:
        if answer.cancelled():
            return
        error = answer.exception()
        if error is None:
            requests[(op, "ok")] += 1
            histogram.observe(asyncio.get_running_loop().time() - started_s)
        elif isinstance(error, QuorumlogError):
            requests[(op, "error")] += 1

    @functools.wraps(handler)
    def wrapper(*args: Any, **kwargs: Any) -> R | asyncio.Future[R]:
        started_s = asyncio.get_running_loop().time()
        try:
            answer = handler(*args, **kwargs)
        except QuorumlogError:
            requests[(op, "error")] += 1
            raise
        if isinstance(answer, asyncio.Future):
            answer.add_done_callback(functools.partial(done, started_s))
        else:
            requests[(op, "ok")] += 1
            histogram.observe(asyncio.get_running_loop().time() - started_s)
        return answer

    return wrapper


class _TableCollector(Collector):
    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily
                                  | HistogramMetricFamily]:
        m = TABLE_METRICS
        yield rpc.counter_family(
            "quorumlog_table_requests", "Table requests served, by operation and outcome.",
            ["op", "result"],
            [([op, result], count) for (op, result), count in sorted(m.requests.copy().items())])
        yield rpc.histogram_family(
            "quorumlog_table_request_latency_seconds",
            "Table requests that succeeded, from arrival to answer (writes: committed).",
            ["op"], [([op], histogram) for op, histogram in sorted(m.latency.copy().items())])
        yield rpc.counter_family(
            "quorumlog_table_changes", "Scheduler configuration changes this node was told "
            "to run, by outcome.", ["outcome"],
            [([o.value], m.changes.get(o.value, 0)) for o in ChangeOutcome])
        with _lock:
            nodes = sorted(_nodes, key=lambda node: node.node_id)
        counts = [(str(node.node_id), node.group_counts()) for node in nodes]
        yield rpc.gauge_family("quorumlog_table_groups_hosted", "Partition replicas hosted.",
                               ["node"], [([n], hosted) for n, (hosted, _) in counts])
        yield rpc.gauge_family("quorumlog_table_groups_led", "Partition replicas led.",
                               ["node"], [([n], led) for n, (_, led) in counts])
        yield rpc.gauge_family(
            "quorumlog_table_disk_full", "1 while this node's partition leaders refuse writes "
            "for a full data disk (disk_usage_threshold_fraction), else 0.", ["node"],
            [([str(node.node_id)], int(node.disk_full())) for node in nodes])


rpc.metrics_registry.register(_TableCollector())
