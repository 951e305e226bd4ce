"""The console's HTTP server (aiohttp): pages, the JSON API, and the sampler.

A background task reads the cluster every ``interval_s`` (one
:class:`Collector` round) and keeps the latest :class:`Snapshot` and the
:class:`History` the charts draw; requests are answered from those, so a
page load costs the cluster nothing and many browsers cost no more than one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from quorumlog.console import _render
from quorumlog.console._collect import SECTIONS, Collector, Snapshot
from quorumlog.console._history import History
from quorumlog.errors import UsageError
from quorumlog.log import get_logger

INTERVAL_S_DEFAULT = 5.0  # between two samples of the cluster
INTERVAL_S_MIN = 0.2  # a faster sampler would load the meta leader for nothing
REFRESH_S_MIN = 5.0  # pages reload no faster than this, however fast the sampler
FIRST_SAMPLE_TIMEOUT_S = 30.0  # start-up waits this long for the first sample

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class ConsoleConfig:
    members: tuple[str, ...]  # meta addresses
    host: str = "127.0.0.1"
    port: int = 8080  # 0: any free port (see Console.port)
    interval_s: float = INTERVAL_S_DEFAULT

    def validate(self) -> ConsoleConfig:
        if not self.members:
            raise UsageError("the console needs the meta members (--members host:port,...)")
        if self.interval_s < INTERVAL_S_MIN:
            raise UsageError(f"--interval {self.interval_s:g} s: at least {INTERVAL_S_MIN:g} s")
        if not 0 <= self.port <= 65535:
            raise UsageError(f"--port {self.port}: expected 0..65535")
        return self


class Console:
    """The running console: :meth:`start`, then :attr:`port`; :meth:`stop` when done."""

    def __init__(self, config: ConsoleConfig) -> None:
        self.config = config.validate()
        self.history = History()
        self.snapshot: Snapshot | None = None
        self._collector = Collector(list(config.members))
        self._sampled = asyncio.Event()
        self._sampler: asyncio.Task[None] | None = None
        self._runner: web.AppRunner | None = None
        self.port = config.port

    async def sample(self) -> Snapshot:
        """Read the cluster once, keep the snapshot and add it to the history."""
        snap = await self._collector.snapshot()
        self.snapshot = snap
        self.history.add(snap)
        self._sampled.set()
        return snap

    async def _sample_forever(self) -> None:
        while True:
            try:
                snap = await self.sample()
                if snap.errors:
                    log.warning("console sample incomplete", errors=snap.errors)
            except Exception:  # the sampler must outlive any one bad round
                log.exception("console sample failed")
            await asyncio.sleep(self.config.interval_s)

    async def start(self) -> None:
        """Take the first sample, then serve (the first page already has data)."""
        self._sampler = asyncio.create_task(self._sample_forever())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(FIRST_SAMPLE_TIMEOUT_S):
                await self._sampled.wait()
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.config.port)
        await site.start()
        self.port = int(self._runner.addresses[0][1])  # the bound port (port 0: any)

    async def stop(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
        if self._runner is not None:
            await self._runner.cleanup()
        await self._collector.close()

    # ----- HTTP -------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application()
        pages: dict[str, tuple[str, Callable[[Snapshot], str]]] = {
            "/": ("cluster", _render.cluster_body),
            "/streams": ("streams", lambda s: _render.streams_body(s, self.history)),
            "/ledgers": ("ledgers", _render.ledgers_body),
            "/tables": ("tables", lambda s: _render.tables_body(s, self.history)),
            "/recovery": ("recovery", _render.recovery_body),
        }
        for path, (title, body) in pages.items():
            app.router.add_get(path, self._page(path, title, body))
        app.router.add_get("/api/snapshot", self._api(lambda s: s.to_json()))
        app.router.add_get("/api/cluster", self._api(
            lambda s: {"members": s.members, "bookies": s.bookies}))
        for section in SECTIONS:
            app.router.add_get(f"/api/{section}", self._api(_section_view(section)))
        app.router.add_get("/api/history", self._history)
        return app

    def _page(self, path: str, title: str, body: Callable[[Snapshot], str]
              ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(_: web.Request) -> web.Response:
            snap = self.snapshot
            content = ("<p>waiting for the first sample of the cluster...</p>" if snap is None
                       else body(snap))
            refresh_s = max(self.config.interval_s, REFRESH_S_MIN)
            return web.Response(text=_render.page(path, title, content, snap, refresh_s),
                                content_type="text/html")

        return handle

    def _api(self, view: Callable[[Snapshot], dict[str, Any]]
             ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(_: web.Request) -> web.Response:
            snap = self.snapshot
            if snap is None:
                return web.json_response({"error": "no sample of the cluster yet"}, status=503)
            return web.json_response({"taken_ms": snap.taken_ms, **view(snap),
                                      "errors": snap.errors})

        return handle

    async def _history(self, _: web.Request) -> web.Response:
        return web.json_response({"interval_s": self.config.interval_s,
                                  "series": self.history.to_json()})


def _section_view(name: str) -> Callable[[Snapshot], dict[str, Any]]:
    def view(snap: Snapshot) -> dict[str, Any]:
        return {name: getattr(snap, name)}

    return view


async def serve(config: ConsoleConfig, on_ready: Callable[[Console], None] | None = None) -> None:
    """Run the console until cancelled (Ctrl-C in ``quorumlog console``)."""
    console = Console(config)
    await console.start()
    try:
        if on_ready is not None:
            on_ready(console)
        await asyncio.Event().wait()
    finally:
        await console.stop()
