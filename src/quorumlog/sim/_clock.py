"""Virtual time: a millisecond clock and a timer queue, never the wall clock.

Events at the same millisecond run in the order they were scheduled.
:meth:`VirtualClock.stamp` returns a time with sub-millisecond order (the
n-th stamp taken within a millisecond is ``ms + n / STAMPS_PER_MS``), so
client histories keep the real order of events that share a millisecond.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

from quorumlog.errors import invariant

STAMPS_PER_MS = 10_000
"""Distinct history timestamps within one virtual millisecond."""


@dataclass(slots=True)
class VirtualClock:
    now_ms: int = 0
    _stamps_this_ms: int = 0

    def advance_to(self, ms: int) -> None:
        invariant(ms >= self.now_ms, f"virtual time goes backwards: {self.now_ms} -> {ms}")
        if ms != self.now_ms:
            self.now_ms = ms
            self._stamps_this_ms = 0

    def stamp(self) -> float:
        """A history timestamp: strictly increasing over the whole run."""
        self._stamps_this_ms += 1
        invariant(
            self._stamps_this_ms < STAMPS_PER_MS,
            f"more than {STAMPS_PER_MS} history timestamps within one millisecond",
        )
        return self.now_ms + self._stamps_this_ms / STAMPS_PER_MS


@dataclass(slots=True)
class TimerQueue:
    """Callbacks due at virtual times; ``pop_due`` returns them in order."""

    _heap: list[tuple[int, int, Callable[[], None]]] = field(default_factory=list)
    _sequence: int = 0

    def schedule(self, due_ms: int, callback: Callable[[], None]) -> None:
        self._sequence += 1
        heapq.heappush(self._heap, (due_ms, self._sequence, callback))

    def next_due_ms(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now_ms: int) -> Callable[[], None] | None:
        if self._heap and self._heap[0][0] <= now_ms:
            return heapq.heappop(self._heap)[2]
        return None

    def __len__(self) -> int:
        return len(self._heap)
