"""Event loop helpers: run on uvloop when it is installed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def _uvloop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # uvloop is not built for this platform (Windows)
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new uvloop loop (asyncio's when uvloop is unavailable)."""
    factory = _uvloop_factory()
    return asyncio.new_event_loop() if factory is None else factory()


def install_uvloop() -> bool:
    """Make new event loops uvloop loops; False when uvloop is unavailable."""
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


def run(main: Coroutine[Any, Any, T], *, debug: bool | None = None) -> T:
    """Run ``main`` to completion on a fresh uvloop loop (asyncio's otherwise)."""
    with asyncio.Runner(debug=debug, loop_factory=_uvloop_factory()) as runner:
        return runner.run(main)
