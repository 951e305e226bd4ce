"""Time as an injected dependency: logic asks its :class:`Clock`, never ``time``.

Logic that stamps or compares times (a ledger's creation time, a stream
ledger's close time, a cursor's last update, retention by age, job marks)
takes the clock from the object that owns it (``LedgerClient.clock``), so a
test or the simulator can drive time by hand:

- :data:`SYSTEM_CLOCK` (a :class:`SystemClock`): the real clocks; the default.
- :class:`ManualClock`: moves only when told (``advance(ms=...)``).

Where it is injected: ``LedgerClient`` / ``StreamClient`` (``clock=``),
``MetaService`` (session lease expiry), the bookie's ``Registration`` (its
own view of whether its session is alive), the Raft ``SnapshotReceiver``
(idle transfers), cookies and ``bookie format`` (stamps). The meta read lease
keeps its own boot-time clock (``lease_clock``) on purpose: it must count
time a paused process did not see.

Process management, CLI output and the journal's group-commit timing may
still read ``time`` directly: they measure the world, they make no decisions
a test would want to replay.
"""

from __future__ import annotations

import time
from typing import Protocol

from quorumlog.errors import UsageError


class Clock(Protocol):
    """Where logic reads time."""

    def wall_ms(self) -> int:
        """Milliseconds since the Unix epoch (stamps stored in metadata)."""
        ...

    def monotonic_s(self) -> float:
        """Seconds from an arbitrary start that never goes back (intervals)."""
        ...


class SystemClock:
    """The process's clocks: ``time.time_ns`` and ``time.monotonic``."""

    __slots__ = ()

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic_s(self) -> float:
        return time.monotonic()


SYSTEM_CLOCK = SystemClock()


class ManualClock:
    """A clock for tests: both readings move only by :meth:`advance`."""

    __slots__ = ("_monotonic_s", "_wall_ms")

    def __init__(self, *, wall_ms: int = 0, monotonic_s: float = 0.0) -> None:
        if wall_ms < 0 or monotonic_s < 0:
            raise UsageError(f"a clock starts at or after 0, got {wall_ms} ms, {monotonic_s} s")
        self._wall_ms = wall_ms
        self._monotonic_s = monotonic_s

    def wall_ms(self) -> int:
        return self._wall_ms

    def monotonic_s(self) -> float:
        return self._monotonic_s

    def advance(self, *, ms: int) -> None:
        """Move both readings forward by ``ms`` milliseconds."""
        if ms < 0:
            raise UsageError(f"a clock only moves forward, got advance(ms={ms})")
        self._wall_ms += ms
        self._monotonic_s += ms / 1000
