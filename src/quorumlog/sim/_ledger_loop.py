"""A deterministic asyncio event loop on virtual time.

The ledger protocol is asyncio code (it awaits bookies and meta); to simulate
it we run that very code on an event loop whose clock is virtual: when no
callback is ready, the loop jumps straight to the next timer instead of
sleeping. With no real I/O and every random choice seeded, a run is a pure
function of its seed: callbacks run in FIFO order, timers in (time,
scheduling) order.

A run that waits with nothing scheduled can never finish: the loop raises
:class:`SimDeadlockError` instead of blocking forever.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Mapping
from typing import Any

from quorumlog.errors import InvariantViolation

VIRTUAL_TIME_RESOLUTION_S = 1e-6
"""Timers due within this of "now" run now (float rounding of virtual time)."""


class SimDeadlockError(InvariantViolation):
    """The simulated program waits for something that can never happen."""


class _VirtualSelector(selectors.BaseSelector):
    """Registers file objects (the loop's self-pipe) but never reports I/O:
    ``select(timeout)`` advances virtual time by ``timeout`` instead."""

    def __init__(self) -> None:
        self._keys: dict[int, selectors.SelectorKey] = {}
        self.now_s = 0.0

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._keys[fd] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        return self._keys.pop(fd)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise SimDeadlockError(
                "deadlock: the simulated program waits, and no timer or callback is scheduled")
        self.now_s += max(timeout, 0.0)
        return []

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._keys

    def close(self) -> None:
        self._keys.clear()


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """``loop.time()`` is virtual seconds since the start of the run."""

    def __init__(self) -> None:
        self._virtual = _VirtualSelector()
        super().__init__(self._virtual)
        self._clock_resolution = VIRTUAL_TIME_RESOLUTION_S

    def time(self) -> float:
        return self._virtual.now_s

    @property
    def now_ms(self) -> int:
        return int(self._virtual.now_s * 1000 + 1e-9)


def run_virtual(main: Any) -> Any:
    """Run coroutine ``main`` on a fresh virtual-time loop; cancel leftovers."""
    loop = VirtualTimeLoop()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        try:
            leftovers = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in leftovers:
                task.cancel()
            if leftovers:
                loop.run_until_complete(asyncio.gather(*leftovers, return_exceptions=True))
        finally:
            asyncio.set_event_loop(None)
            loop.close()
