"""The console's own time series: what it sampled, kept in memory for the charts.

Per stream: entries published (every partition's closed-ledger counters plus
the open ledger's LAC + 1), the rate between two samples, and the backlog of
all its subscriptions; per table duplication: the largest lag. Each series is
bounded (``SAMPLES_MAX``); the oldest sample goes first.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from quorumlog.console._collect import Snapshot

SAMPLES_MAX = 360  # per series: 30 minutes at the default 5 s interval


@dataclass(frozen=True, slots=True)
class Point:
    t_ms: int
    value: float


@dataclass
class History:
    samples_max: int = SAMPLES_MAX
    series: dict[str, deque[Point]] = field(default_factory=dict)
    _last_published: dict[str, tuple[int, int]] = field(default_factory=dict)

    def _add(self, name: str, t_ms: int, value: float) -> None:
        self.series.setdefault(name, deque(maxlen=self.samples_max)).append(Point(t_ms, value))

    def add(self, snap: Snapshot) -> None:
        """Take one snapshot's values into the series (a section that failed adds nothing)."""
        t = snap.taken_ms
        for stream in snap.streams:
            name = stream["name"]
            published = int(stream["published_entries"])
            self._add(f"backlog:{name}", t, stream["backlog_entries"])
            last = self._last_published.get(name)
            # A stream deleted and created again starts lower: no rate across that.
            if last is not None and t > last[0] and published >= last[1]:
                self._add(f"rate:{name}", t, (published - last[1]) * 1000 / (t - last[0]))
            self._last_published[name] = (t, published)
        for table in snap.tables:
            for dup in table["duplications"]:
                self._add(f"dup_lag:{table['name']}/{dup['dup_id']}", t, dup["lag_ms_max"])

    def get(self, name: str) -> list[Point]:
        return list(self.series.get(name, ()))

    def latest(self, name: str) -> float | None:
        points = self.series.get(name)
        return points[-1].value if points else None

    def to_json(self) -> dict[str, Any]:
        return {name: [[p.t_ms, p.value] for p in points]
                for name, points in sorted(self.series.items())}
