"""Helpers for ledger client tests on virtual time (simulated bookies and meta)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from quorumlog.ledger import LedgerClient, LedgerClientConfig
from quorumlog.sim import LedgerWorld, run_virtual

T = TypeVar("T")

FAST = LedgerClientConfig(add_timeout_ms=200, read_timeout_ms=200, speculative_read_delay_ms=20,
                          explicit_lac_interval_ms=10, replacement_backoff_ms=10)


def in_world(test: Callable[[LedgerWorld], Awaitable[T]], *, bookies: int = 5,
             seed: int = 0) -> T:
    """Run ``test(world)`` on a fresh virtual-time loop (deterministic, instant)."""

    async def main() -> T:
        world = LedgerWorld(bookies=bookies, seed=seed)
        return await test(world)

    result: T = run_virtual(main())
    return result


def client(world: LedgerWorld, name: str = "c", **config: Any) -> LedgerClient:
    result: LedgerClient = world.client(name, FAST.replace(**config) if config else FAST)
    return result


async def wait_until(condition: Callable[[], bool], *, timeout_s: float = 10.0) -> None:
    """Poll (virtual time) until ``condition()``; fail after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        if loop.time() > deadline:
            raise AssertionError("condition not reached before the deadline")
        await asyncio.sleep(0.001)
