"""quorumlog.clock: the system clock reads time; the manual clock moves when told."""

from __future__ import annotations

import time

import pytest

from quorumlog.clock import SYSTEM_CLOCK, Clock, ManualClock
from quorumlog.errors import UsageError


def test_the_system_clock_reads_the_process_clocks() -> None:
    clock: Clock = SYSTEM_CLOCK
    before_ms = time.time_ns() // 1_000_000
    wall_ms = clock.wall_ms()
    assert before_ms <= wall_ms <= time.time_ns() // 1_000_000
    first_s = clock.monotonic_s()
    assert first_s <= clock.monotonic_s() <= time.monotonic()


def test_the_manual_clock_moves_only_when_told() -> None:
    manual = ManualClock(wall_ms=1_000, monotonic_s=5.0)
    clock: Clock = manual
    assert (clock.wall_ms(), clock.monotonic_s()) == (1_000, 5.0)
    manual.advance(ms=1_500)
    assert (clock.wall_ms(), clock.monotonic_s()) == (2_500, 6.5)
    with pytest.raises(UsageError, match="only moves forward"):
        manual.advance(ms=-1)
    assert clock.wall_ms() == 2_500  # a refused move changes nothing
    with pytest.raises(UsageError):
        ManualClock(wall_ms=-1)
