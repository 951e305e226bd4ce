"""``/healthz`` and ``/readyz`` next to ``/metrics`` on the node's HTTP port.

- ``/healthz`` (liveness, as Kubernetes and etcd use it): 200 while the
  node's event loop runs; 503 when it has not turned for
  ``LOOP_STALE_AFTER_S`` (a loop blocked by a bug or a stuck disk call), which
  is when restarting the process is the right answer.
- ``/readyz`` (readiness): 200 when every role of the node can serve: meta
  knows a leader of its Raft group, the bookie is registered in meta and
  writable. 503 otherwise, with the reasons. A node that is alive but not
  ready should get no traffic but must not be restarted for it.

When the cluster uses TLS (``[security] tls_enabled``) the endpoint is
HTTPS with the node's certificate and the same client-certificate rule as
the rpc port; when it has a ``token``, ``/metrics`` answers 401 unless the
request carries ``Authorization: Bearer <token>`` (Prometheus:
``authorization: {credentials: ...}`` in the scrape config). ``/healthz`` and
``/readyz`` carry no data worth a secret and stay open to probes.

Both answer JSON. The checks run on the event loop (``Health.refresh``, every
``REFRESH_INTERVAL_S``); the HTTP thread only reads their last result, so it
never touches the roles' state from another thread.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import ssl
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


def http_app(registry: CollectorRegistry, health: Health,
             token: str | None = None) -> Callable[..., Iterable[bytes]]:
    """The WSGI app; with ``token``, /metrics needs ``Authorization: Bearer``."""
    metrics = make_wsgi_app(registry)
    expected = f"Bearer {token}".encode() if token else None

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path in ("/healthz", "/readyz"):
            ok, body = health.live() if path == "/healthz" else health.ready()
            status = "200 OK" if ok else "503 Service Unavailable"
            start_response(status, [("Content-Type", "application/json")])
            return [json.dumps(body).encode() + b"\n"]
        if path in ("/metrics", "/"):
            if expected is not None and not hmac.compare_digest(
                    environ.get("HTTP_AUTHORIZATION", "").encode(), expected):
                start_response("401 Unauthorized", [("Content-Type", "text/plain"),
                                                     ("WWW-Authenticate", "Bearer")])
                return [b"unauthorized: send Authorization: Bearer <the cluster token>\n"]
            result: Iterable[bytes] = metrics(environ, start_response)
            return result
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found: try /metrics, /healthz or /readyz\n"]

    return app


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes and probes every few seconds are not worth a log line."""


class _Server(ThreadingWSGIServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that fails the TLS handshake or hangs up mid-request costs
        nothing but its own connection (no traceback on the node's stderr)."""


def start_http(host: str, port: int, registry: CollectorRegistry, health: Health, *,
               ssl_context: ssl.SSLContext | None = None,
               token: str | None = None) -> tuple[ThreadingWSGIServer, threading.Thread]:
    """Serve /metrics, /healthz and /readyz on a daemon thread (OSError if the port
    is taken); HTTPS with ``ssl_context``, /metrics behind ``token``."""
    server = make_server(host, port, http_app(registry, health, token), _Server,
                         handler_class=_QuietHandler)
    if ssl_context is not None:
        # The handshake runs on the request's own thread (its first read), so a
        # client that never completes it cannot stall the accept loop.
        server.socket = ssl_context.wrap_socket(server.socket, server_side=True,
                                                do_handshake_on_connect=False)
    thread = threading.Thread(target=server.serve_forever, name="node-http", daemon=True)
    thread.start()
    return server, thread
