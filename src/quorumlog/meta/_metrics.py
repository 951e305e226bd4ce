"""Prometheus metrics of the meta service, on ``quorumlog.rpc.metrics_registry``.

After etcd's server metrics (``etcd_server_proposals_committed_total``,
``etcd_server_leader_changes_seen_total``, ``etcd_server_has_leader``,
``etcd_debugging_mvcc_watcher_total``) and ZooKeeper's (BookKeeper's meta
store) request and session counts. Counters are plain integers bumped on the
event loop; the gauges of every meta member hosted by the process are read at
scrape time from the member itself (a few attribute reads), labelled by
``member`` (its node id).

Families (see docs/metrics.md):

- ``quorumlog_meta_requests_total{kind}``: requests served, by command or read kind;
- ``quorumlog_meta_proposals_total{result}`` (ok, failed),
  ``..._proposal_latency_seconds`` (histogram: propose to applied);
- ``quorumlog_meta_leader_changes_total``: leaders this member has seen change;
- ``quorumlog_meta_watches_open{member}``, ``..._sessions{member}``,
  ``..._is_leader{member}``, ``..._leader_id{member}``, ``..._term{member}``,
  ``..._revision{member}`` (gauges).
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector

from quorumlog import rpc


@dataclass(slots=True)
class MetaMetrics:
    """The counters of the meta members of this process (event loop thread)."""

    requests: Counter[str] = field(default_factory=Counter)  # by command / read kind
    proposals_ok: int = 0
    proposals_failed: int = 0
    proposal_latency: rpc.LatencyHistogram = field(default_factory=rpc.LatencyHistogram)
    leader_changes: int = 0


META_METRICS = MetaMetrics()


class _Member(Protocol):
    """What the collector reads from a meta member (the MetaService)."""

    def gauges(self) -> dict[str, float]: ...

    @property
    def member_id(self) -> int: ...


_members: weakref.WeakSet[_Member] = weakref.WeakSet()
_lock = threading.Lock()

GAUGES = {
    "watches_open": "Watch requests parked on this member.",
    "sessions": "Live client sessions (leases) in the replicated state.",
    "is_leader": "1 when this member leads the meta group.",
    "leader_id": "Node id of the leader this member knows (0: none).",
    "term": "Raft term of the meta group on this member.",
    "revision": "Revision of the meta KV store on this member.",
}


def register_member(member: _Member) -> None:
    with _lock:
        _members.add(member)


def unregister_member(member: _Member) -> None:
    with _lock:
        _members.discard(member)


class _MetaCollector(Collector):
    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily
                                  | HistogramMetricFamily]:
        m = META_METRICS
        yield rpc.counter_family("quorumlog_meta_requests", "Meta requests served, by kind.",
                                 ["kind"], [([k], c) for k, c in sorted(m.requests.copy().items())])
        yield rpc.counter_family(
            "quorumlog_meta_proposals", "Writes proposed to the meta Raft group, by outcome.",
            ["result"], [(["ok"], m.proposals_ok), (["failed"], m.proposals_failed)])
        yield rpc.histogram_family(
            "quorumlog_meta_proposal_latency_seconds",
            "From proposing a write to its result being applied.", [],
            [([], m.proposal_latency)])
        yield rpc.counter_family("quorumlog_meta_leader_changes",
                                 "Changes of the meta leader seen by this member.", [],
                                 [([], m.leader_changes)])
        with _lock:
            members = sorted(_members, key=lambda member: member.member_id)
        readings = [(str(member.member_id), member.gauges()) for member in members]
        for name, documentation in GAUGES.items():
            yield rpc.gauge_family(f"quorumlog_meta_{name}", documentation, ["member"],
                                   [([member], values[name]) for member, values in readings
                                    if name in values])


rpc.metrics_registry.register(_MetaCollector())
