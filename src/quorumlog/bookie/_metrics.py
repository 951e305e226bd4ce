"""Prometheus metrics of the bookie server, on ``quorumlog.rpc.metrics_registry``.

The add and read paths bump plain integers of :class:`BookieCounters` (a
prometheus_client ``inc()`` takes a lock per call); a collector turns the
counters of every running bookie of the process into metric families at
scrape time. Journal fdatasync latency and batch sizes are histograms,
observed once per journal write by the journal thread.

Families:

- ``quorumlog_bookie_adds_total{result}`` (ok, error), ``..._added_bytes_total``;
- ``quorumlog_bookie_reads_total{kind}`` (entry, batch, lac, fence), ``..._read_bytes_total``;
- ``quorumlog_bookie_long_polls_parked`` (gauge);
- ``quorumlog_bookie_journal_fsync_seconds`` and ``..._journal_batch_records``
  (histograms), ``..._journal_queued_bytes`` (gauge);
- ``quorumlog_bookie_flushes_total``, ``..._checkpoint_index`` (gauge);
- ``quorumlog_bookie_gc_runs_total``, ``..._gc_running`` (gauge: progress),
  ``..._gc_deleted_ledgers_total``, ``..._gc_compacted_logs_total``,
  ``..._gc_reclaimed_bytes_total``;
- ``quorumlog_bookie_read_only``, ``..._registered``, ``..._write_cache_bytes``,
  ``..._ledgers`` (gauges); ``..._cache_hits_total{cache}`` (write, read, log).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from quorumlog import rpc

JOURNAL_FSYNC_SECONDS = Histogram(
    "quorumlog_bookie_journal_fsync_seconds", "Duration of one journal fdatasync.",
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
    registry=rpc.metrics_registry,
)
JOURNAL_BATCH_RECORDS = Histogram(
    "quorumlog_bookie_journal_batch_records", "Records written by one journal write.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 8192),
    registry=rpc.metrics_registry,
)


@dataclass(slots=True)
class BookieCounters:
    """Counters of one bookie; the event loop thread writes them (GC: its task)."""

    adds_ok: int = 0
    adds_failed: int = 0
    added_bytes: int = 0
    reads: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("entry", "batch", "lac", "fence", "limbo"), 0))
    read_bytes: int = 0
    long_polls_parked: int = 0
    flushes: int = 0
    checkpoint_index: int = 0
    gc_runs: int = 0
    gc_running: bool = False
    gc_deleted_ledgers: int = 0
    gc_compacted_logs: int = 0
    gc_reclaimed_bytes: int = 0


class _Source(Protocol):
    """What the collector reads from a running bookie (the BookieService)."""

    @property
    def counters(self) -> BookieCounters: ...

    def gauges(self) -> dict[str, float]: ...


_sources: weakref.WeakSet[_Source] = weakref.WeakSet()
_lock = threading.Lock()


def register_source(source: _Source) -> None:
    with _lock:
        _sources.add(source)


def unregister_source(source: _Source) -> None:
    with _lock:
        _sources.discard(source)


def _counter(name: str, doc: str, labels: list[str] | None = None) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=labels)


class _BookieCollector(Collector):
    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        with _lock:
            sources = list(_sources)
        adds = _counter("quorumlog_bookie_adds", "Add requests answered.", ["result"])
        added = _counter("quorumlog_bookie_added_bytes", "Entry bytes added.")
        reads = _counter("quorumlog_bookie_reads", "Read requests answered.", ["kind"])
        read_bytes = _counter("quorumlog_bookie_read_bytes", "Entry bytes read.")
        flushes = _counter("quorumlog_bookie_flushes", "Write cache flushes (checkpoints).")
        gc_runs = _counter("quorumlog_bookie_gc_runs", "Garbage collection runs finished.")
        gc_deleted = _counter("quorumlog_bookie_gc_deleted_ledgers",
                              "Ledgers deleted because their metadata is gone.")
        gc_logs = _counter("quorumlog_bookie_gc_compacted_logs", "Entry logs compacted.")
        gc_bytes = _counter("quorumlog_bookie_gc_reclaimed_bytes", "Disk bytes reclaimed by GC.")
        totals: dict[str, float] = {}
        reads_by_kind: dict[str, int] = {}
        adds_ok = adds_failed = added_bytes = read_total = 0
        flush_total = runs = deleted = logs = reclaimed = 0
        for source in sources:
            c = source.counters
            adds_ok += c.adds_ok
            adds_failed += c.adds_failed
            added_bytes += c.added_bytes
            for kind, count in c.reads.items():
                reads_by_kind[kind] = reads_by_kind.get(kind, 0) + count
            read_total += c.read_bytes
            flush_total += c.flushes
            runs += c.gc_runs
            deleted += c.gc_deleted_ledgers
            logs += c.gc_compacted_logs
            reclaimed += c.gc_reclaimed_bytes
            for name, value in source.gauges().items():
                totals[name] = totals.get(name, 0.0) + value
        adds.add_metric(["ok"], adds_ok)
        adds.add_metric(["error"], adds_failed)
        added.add_metric([], added_bytes)
        for kind, count in sorted(reads_by_kind.items()):
            reads.add_metric([kind], count)
        read_bytes.add_metric([], read_total)
        flushes.add_metric([], flush_total)
        gc_runs.add_metric([], runs)
        gc_deleted.add_metric([], deleted)
        gc_logs.add_metric([], logs)
        gc_bytes.add_metric([], reclaimed)
        yield from (adds, added, reads, read_bytes, flushes, gc_runs, gc_deleted, gc_logs,
                    gc_bytes)
        hits = _counter("quorumlog_bookie_cache_hits", "Reads served, by where.", ["cache"])
        for cache in ("write", "read", "log"):
            hits.add_metric([cache], totals.pop(f"hits_{cache}", 0.0))
        yield hits
        for name, value in sorted(totals.items()):
            gauge = GaugeMetricFamily(f"quorumlog_bookie_{name}", f"Bookie gauge {name}.")
            gauge.add_metric([], value)
            yield gauge


rpc.metrics_registry.register(_BookieCollector())
