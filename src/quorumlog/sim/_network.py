"""A simulated network: delays, drops, duplicates, reorders and partitions.

Every decision comes from the ``random.Random`` handed in, so a run is a pure
function of its seed. Messages wait in a heap ordered by (delivery time,
send order); ties therefore deliver in send order, and reordering comes from
the random delays alone.

Partitions are a set of blocked *directed* links: a symmetric partition blocks
both directions, a one-way partition only one. A link is checked both when a
message is sent and when it would be delivered, so a partition that starts
while a message is in flight also loses it.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from quorumlog.errors import invariant
from quorumlog.sim._config import FaultMix

M = TypeVar("M")

IN_FLIGHT_MESSAGES_MAX = 100_000
"""Messages queued in the network at once; beyond this, sends are dropped (and counted)."""


@dataclass(frozen=True, slots=True)
class Envelope(Generic[M]):
    sent_ms: int
    deliver_ms: int
    source: int
    target: int
    payload: M


@dataclass(slots=True)
class NetworkStats:
    sent: int = 0
    delivered: int = 0
    dropped_random: int = 0
    dropped_partition: int = 0
    dropped_overflow: int = 0
    dropped_unreachable: int = 0
    duplicated: int = 0


@dataclass(slots=True)
class _Faults:
    delay_ms_min: int
    delay_ms_max: int
    tail_probability: float
    tail_ms_max: int
    drop_probability: float
    duplicate_probability: float

    @classmethod
    def of(cls, mix: FaultMix) -> _Faults:
        return cls(
            mix.message_delay_ms_min, mix.message_delay_ms_max,
            mix.message_delay_tail_probability, mix.message_delay_tail_ms_max,
            mix.message_drop_probability, mix.message_duplicate_probability,
        )


@dataclass(slots=True)
class SimNetwork(Generic[M]):
    """Point-to-point messages between integer endpoints, with seeded faults."""

    rng: random.Random
    mix: FaultMix
    stats: NetworkStats = field(default_factory=NetworkStats)
    _faults: _Faults = field(init=False)
    _queue: list[tuple[int, int, Envelope[M]]] = field(default_factory=list)
    _sequence: int = 0
    _blocked: set[tuple[int, int]] = field(default_factory=set)
    _down: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._faults = _Faults.of(self.mix)

    def heal_faults(self) -> None:
        """Stop random drops, duplicates and long delays (the quiet period)."""
        self._faults = _Faults(
            self.mix.message_delay_ms_min, self.mix.message_delay_ms_max, 0.0,
            self.mix.message_delay_ms_max, 0.0, 0.0,
        )

    def send(self, now_ms: int, source: int, target: int, payload: M) -> None:
        self.stats.sent += 1
        if self.is_blocked(source, target):
            self.stats.dropped_partition += 1
            return
        faults = self._faults
        if faults.drop_probability and self.rng.random() < faults.drop_probability:
            self.stats.dropped_random += 1
            return
        self._enqueue(now_ms, source, target, payload)
        if faults.duplicate_probability and self.rng.random() < faults.duplicate_probability:
            self.stats.duplicated += 1
            self._enqueue(now_ms, source, target, payload)

    def _enqueue(self, now_ms: int, source: int, target: int, payload: M) -> None:
        if len(self._queue) >= IN_FLIGHT_MESSAGES_MAX:
            self.stats.dropped_overflow += 1
            return
        deliver_ms = now_ms + self._delay_ms()
        self._sequence += 1
        envelope = Envelope(now_ms, deliver_ms, source, target, payload)
        heapq.heappush(self._queue, (deliver_ms, self._sequence, envelope))

    def _delay_ms(self) -> int:
        faults = self._faults
        if faults.tail_probability and self.rng.random() < faults.tail_probability:
            return self.rng.randint(faults.delay_ms_max, faults.tail_ms_max)
        return self.rng.randint(faults.delay_ms_min, faults.delay_ms_max)

    def next_delivery_ms(self) -> int | None:
        return self._queue[0][0] if self._queue else None

    def pop_due(self, now_ms: int) -> list[Envelope[M]]:
        """Messages due at or before ``now_ms`` whose link is open and target up."""
        due: list[Envelope[M]] = []
        queue = self._queue
        while queue and queue[0][0] <= now_ms:
            envelope = heapq.heappop(queue)[2]
            if self.is_blocked(envelope.source, envelope.target):
                self.stats.dropped_partition += 1
            elif envelope.target in self._down:
                self.stats.dropped_unreachable += 1
            else:
                self.stats.delivered += 1
                due.append(envelope)
        return due

    def in_flight(self) -> int:
        return len(self._queue)

    # -- endpoints and partitions ---------------------------------------------

    def set_down(self, endpoint: int, down: bool) -> None:
        """A crashed endpoint loses everything delivered to it while down."""
        if down:
            self._down.add(endpoint)
        else:
            self._down.discard(endpoint)

    def is_blocked(self, source: int, target: int) -> bool:
        return (source, target) in self._blocked

    def block(self, source: int, target: int) -> None:
        """Block one direction: ``source`` can no longer reach ``target``."""
        invariant(source != target, "a node cannot be partitioned from itself")
        self._blocked.add((source, target))

    def partition(self, groups: Iterable[Iterable[int]]) -> None:
        """Symmetric partition: no messages between different groups."""
        sides = [sorted(set(group)) for group in groups]
        for i, side in enumerate(sides):
            for other in sides[i + 1:]:
                for a in side:
                    for b in other:
                        self.block(a, b)
                        self.block(b, a)

    def heal(self) -> None:
        self._blocked.clear()

    def blocked_links(self) -> list[tuple[int, int]]:
        return sorted(self._blocked)
