"""The bounds that keep a scrape small, and the lock-free histogram."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from quorumlog import rpc
from quorumlog.stream import _metrics as stream_metrics


def test_stream_labels_beyond_the_bound_go_to_other(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stream_metrics, "_streams", {})
    monkeypatch.setattr(stream_metrics, "STREAM_LABELS_MAX", 3)
    for name in ("a", "b", "c", "d", "e"):
        stream_metrics.stream_metrics(name).in_messages += 1
    assert sorted(stream_metrics._streams) == ["_other", "a", "b", "c"]
    assert stream_metrics.stream_metrics("_other").in_messages == 2
    stream_metrics.stream_metrics("a").in_messages += 1  # a known stream keeps its series
    assert stream_metrics.stream_metrics("a").in_messages == 2


def test_backlog_series_per_stream_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stream_metrics, "_streams", {})
    monkeypatch.setattr(stream_metrics, "SUBSCRIPTION_LABELS_MAX", 2)
    stream_metrics.set_backlog("s", {"x": 1, "y": 2, "z": 3, "w": 4})
    assert stream_metrics.stream_metrics("s").backlog_entries == {"w": 4, "x": 1, "_other": 5}


def test_latency_histogram_is_cumulative_and_scrapes() -> None:
    histogram = rpc.LatencyHistogram((0.001, 0.01))
    for seconds in (0.0005, 0.001, 0.005, 0.5):
        histogram.observe(seconds)
    assert histogram.cumulative() == [("0.001", 2), ("0.01", 3), ("+Inf", 4)]
    registry = rpc.metrics_registry.__class__()

    class One:
        def collect(self):  # type: ignore[no-untyped-def]
            yield rpc.histogram_family("t_seconds", "test", [], [([], histogram)])

    registry.register(One())
    [family] = text_string_to_metric_families(generate_latest(registry).decode())
    samples = {(s.name, s.labels.get("le")): s.value for s in family.samples}
    assert samples[("t_seconds_bucket", "+Inf")] == 4
    assert samples[("t_seconds_count", None)] == 4
    assert samples[("t_seconds_sum", None)] == pytest.approx(0.5065)
