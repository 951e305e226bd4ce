"""Prometheus metrics of streams, on ``quorumlog.rpc.metrics_registry``.

After Pulsar's topic stats (``pulsar_in_messages_total``,
``pulsar_out_messages_total``, ``pulsar_in_bytes_total``,
``pulsar_producers_count``, ``pulsar_consumers_count``,
``pulsar_msg_backlog``) and managed ledger stats. The stream name is a label;
partitions and ledgers are not. A process that touches more than
``STREAM_LABELS_MAX`` streams counts the rest under ``stream="_other"``, so a
scrape stays bounded however many streams a long-lived process sees.

Producers bump the in counters once per confirmed entry (a batch of
messages), readers and consumers the out counters once per batch read. The
backlog of every subscription is computed by the stream's producer (the
owner of the stream's writes) every ``BACKLOG_INTERVAL_S``, not per message.

Families (see docs/metrics.md):

- ``quorumlog_stream_in_messages_total{stream}``, ``..._in_bytes_total{stream}``;
- ``quorumlog_stream_out_messages_total{stream}``, ``..._out_bytes_total{stream}``;
- ``quorumlog_stream_producers{stream}``, ``..._consumers{stream}`` (gauges);
- ``quorumlog_stream_ledger_rollovers_total{stream}``;
- ``quorumlog_stream_backlog_entries{stream,subscription}`` (gauge);
- ``quorumlog_stream_trimmer_rounds_total``, ``..._trimmer_deleted_ledgers_total``,
  ``..._trimmer_failures_total``, ``..._trimmer_offloaded_ledgers_total``,
  ``..._trimmer_offload_failures_total``, ``..._trimmer_compacted_partitions_total``,
  ``..._trimmer_compaction_failures_total``: the background trimmer of this
  process, when it holds the trimmer lease (``stream/_trimmer.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from quorumlog import rpc

STREAM_LABELS_MAX = 1_000  # distinct stream label values per process; more go to "_other"
OTHER_STREAM = "_other"
BACKLOG_INTERVAL_S = 10.0  # how often a producer recomputes its stream's backlog gauges
SUBSCRIPTION_LABELS_MAX = 100  # backlog series per stream; more subscriptions are summed


@dataclass(slots=True)
class StreamMetrics:
    """The counters of one stream in this process (event loop threads write them)."""

    in_messages: int = 0
    in_bytes: int = 0
    out_messages: int = 0
    out_bytes: int = 0
    producers: int = 0
    consumers: int = 0
    rollovers: int = 0
    redelivered_messages: int = 0  # consumers' negative acks and ack timeouts
    dead_lettered_messages: int = 0  # sent to a dead-letter stream, then acknowledged
    backlog_entries: dict[str, int] = field(default_factory=dict)  # by subscription


_streams: dict[str, StreamMetrics] = {}
_lock = threading.Lock()


def stream_metrics(stream: str) -> StreamMetrics:
    """The counters of ``stream`` (created on first use; see ``STREAM_LABELS_MAX``)."""
    metrics = _streams.get(stream)
    if metrics is not None:
        return metrics
    with _lock:
        if stream not in _streams and len(_streams) >= STREAM_LABELS_MAX:
            stream = OTHER_STREAM
        return _streams.setdefault(stream, StreamMetrics())


@dataclass(slots=True)
class TrimmerMetrics:
    """The background trimmer's counters in this process (its loop writes them)."""

    rounds: int = 0  # rounds run while holding the lease
    deleted_ledgers: int = 0  # ledgers retention, TTL or orphan collection deleted
    failures: int = 0  # streams a round failed to trim
    offloaded_ledgers: int = 0  # ledgers offloaded by streams' offload policies
    offload_failures: int = 0  # streams whose automatic offload failed in a round
    compacted_partitions: int = 0  # partitions compacted by streams' compaction thresholds
    compaction_failures: int = 0  # streams whose automatic compaction failed in a round


_trimmer = TrimmerMetrics()


def trimmer_metrics() -> TrimmerMetrics:
    return _trimmer


def set_backlog(stream: str, backlog_by_subscription: dict[str, int]) -> None:
    """Replace the stream's backlog gauges (the producer's periodic computation)."""
    kept = dict(sorted(backlog_by_subscription.items())[:SUBSCRIPTION_LABELS_MAX])
    rest = sum(backlog_by_subscription.values()) - sum(kept.values())
    if rest:
        kept[OTHER_STREAM] = rest
    stream_metrics(stream).backlog_entries = kept


class _StreamCollector(Collector):
    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        with _lock:
            streams = sorted(_streams.items())
        labels = ["stream"]

        def counter(name: str, doc: str, attribute: str) -> CounterMetricFamily:
            return rpc.counter_family(name, doc, labels,
                                      [([s], getattr(m, attribute)) for s, m in streams])

        def gauge(name: str, doc: str, attribute: str) -> GaugeMetricFamily:
            return rpc.gauge_family(name, doc, labels,
                                    [([s], getattr(m, attribute)) for s, m in streams])

        yield counter("quorumlog_stream_in_messages", "Messages written (confirmed).",
                      "in_messages")
        yield counter("quorumlog_stream_in_bytes", "Message bytes written (confirmed).",
                      "in_bytes")
        yield counter("quorumlog_stream_out_messages", "Messages delivered to readers and "
                      "consumers.", "out_messages")
        yield counter("quorumlog_stream_out_bytes", "Message value bytes delivered.",
                      "out_bytes")
        yield counter("quorumlog_stream_ledger_rollovers", "Ledgers closed by rollover "
                      "(entries, bytes or time) and replaced by a new one.", "rollovers")
        yield counter("quorumlog_stream_redelivered_messages", "Messages consumers delivered "
                      "again (negative acknowledgements, acknowledgement timeouts).",
                      "redelivered_messages")
        yield counter("quorumlog_stream_dead_lettered_messages", "Messages consumers sent "
                      "to the subscription's dead-letter stream after their last "
                      "redelivery, then acknowledged.", "dead_lettered_messages")
        yield gauge("quorumlog_stream_producers", "Producers open in this process.",
                    "producers")
        yield gauge("quorumlog_stream_consumers", "Consumers open in this process.",
                    "consumers")
        yield rpc.gauge_family(
            "quorumlog_stream_backlog_entries",
            "Entries after each subscription's mark-delete, as the stream's producer "
            f"last counted them (every {BACKLOG_INTERVAL_S:g} s).",
            ["stream", "subscription"],
            [([s, sub], count) for s, m in streams
             for sub, count in sorted(m.backlog_entries.items())])
        yield rpc.counter_family("quorumlog_stream_trimmer_rounds", "Rounds of the background "
                                 "trimmer run while this process held its lease.", [],
                                 [([], _trimmer.rounds)])
        yield rpc.counter_family("quorumlog_stream_trimmer_deleted_ledgers", "Ledgers the "
                                 "background trimmer deleted (retention, TTL, orphans).", [],
                                 [([], _trimmer.deleted_ledgers)])
        yield rpc.counter_family("quorumlog_stream_trimmer_failures", "Streams a background "
                                 "trimmer round failed to trim (logged as stream_trim_failed).",
                                 [], [([], _trimmer.failures)])
        yield rpc.counter_family("quorumlog_stream_trimmer_offloaded_ledgers", "Ledgers the "
                                 "background trimmer offloaded to tiered storage (streams' "
                                 "offload policies).", [], [([], _trimmer.offloaded_ledgers)])
        yield rpc.counter_family("quorumlog_stream_trimmer_offload_failures", "Streams whose "
                                 "automatic offload failed in a round (logged as "
                                 "stream_offload_failed).", [], [([], _trimmer.offload_failures)])
        yield rpc.counter_family("quorumlog_stream_trimmer_compacted_partitions", "Partitions "
                                 "the background trimmer compacted (streams' compaction "
                                 "thresholds).", [], [([], _trimmer.compacted_partitions)])
        yield rpc.counter_family("quorumlog_stream_trimmer_compaction_failures", "Streams whose "
                                 "automatic compaction failed in a round (logged as "
                                 "stream_compaction_failed).", [],
                                 [([], _trimmer.compaction_failures)])


rpc.metrics_registry.register(_StreamCollector())
