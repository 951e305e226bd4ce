"""``/healthz`` and ``/readyz`` next to ``/metrics`` on the node's HTTP port.

- ``/healthz`` (liveness, as Kubernetes and etcd use it): 200 while the
  node's event loop runs; 503 when it has not turned for
  ``LOOP_STALE_AFTER_S`` (a loop blocked by a bug or a stuck disk call), which
  is when restarting the process is the right answer.
- ``/readyz`` (readiness): 200 when every role of the node can serve: meta
  knows a leader of its Raft group, the bookie is registered in meta and
  writable. 503 otherwise, with the reasons. A node that is alive but not
  ready should get no traffic but must not be restarted for it.

Both answer JSON. The checks run on the event loop (``Health.refresh``, every
``REFRESH_INTERVAL_S``); the HTTP thread only reads their last result, so it
never touches the roles' state from another thread.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

REFRESH_INTERVAL_S = 1.0
LOOP_STALE_AFTER_S = 10.0  # >> REFRESH_INTERVAL_S: a loaded loop is not a dead one

Check = Callable[[], str | None]  # a reason the node is not ready, or None


class Health:
    """What the HTTP thread answers; refreshed by a task on the event loop."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._checks: list[tuple[str, Check]] = []
        self._beat_s = clock()
        self._not_ready: list[str] = ["starting"]

    def add_check(self, name: str, check: Check) -> None:
        self._checks.append((name, check))

    def refresh(self) -> None:
        """Run the readiness checks; called on the event loop."""
        reasons = []
        for name, check in self._checks:
            try:
                reason = check()
            except Exception as exc:  # a failing check is a reason, never a crash
                reason = f"check failed: {exc!r}"
            if reason is not None:
                reasons.append(f"{name}: {reason}")
        self._not_ready = reasons
        self._beat_s = self._clock()

    def live(self) -> tuple[bool, dict[str, Any]]:
        age_s = self._clock() - self._beat_s
        ok = age_s < LOOP_STALE_AFTER_S
        return ok, {"status": "ok" if ok else "stalled", "loop_last_turn_s_ago": round(age_s, 3)}

    def ready(self) -> tuple[bool, dict[str, Any]]:
        live, _ = self.live()
        reasons = list(self._not_ready) if live else ["the event loop is not turning"]
        return not reasons, {"status": "ready" if not reasons else "not ready",
                             "reasons": reasons}

    async def run(self) -> None:
        while True:
            self.refresh()
            await asyncio.sleep(REFRESH_INTERVAL_S)


def http_app(registry: CollectorRegistry, health: Health) -> Callable[..., Iterable[bytes]]:
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path in ("/healthz", "/readyz"):
            ok, body = health.live() if path == "/healthz" else health.ready()
            status = "200 OK" if ok else "503 Service Unavailable"
            start_response(status, [("Content-Type", "application/json")])
            return [json.dumps(body).encode() + b"\n"]
        if path in ("/metrics", "/"):
            result: Iterable[bytes] = metrics(environ, start_response)
            return result
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found: try /metrics, /healthz or /readyz\n"]

    return app


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes and probes every few seconds are not worth a log line."""


def start_http(host: str, port: int, registry: CollectorRegistry,
               health: Health) -> tuple[ThreadingWSGIServer, threading.Thread]:
    """Serve /metrics, /healthz and /readyz on a daemon thread (OSError if the port
    is taken)."""
    server = make_server(host, port, http_app(registry, health), ThreadingWSGIServer,
                         handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="node-http", daemon=True)
    thread.start()
    return server, thread
