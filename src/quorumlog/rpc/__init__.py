"""quorumlog.rpc: the network layer (asyncio on uvloop).

Typed request/response messages over length-prefixed binary frames, pipelined
on long-lived connections, with optional mutual TLS and a shared token.

Messages are frozen msgspec Structs with a stable wire id; a request names its
response type::

    from typing import ClassVar
    from quorumlog import rpc

    class PingResponse(rpc.Message, frozen=True):
        type_id: ClassVar[int] = 60001
        n: int

    class PingRequest(rpc.Request[PingResponse], frozen=True):
        type_id: ClassVar[int] = 60000
        n: int

    async def ping(request: PingRequest, ctx: rpc.RequestContext) -> PingResponse:
        return PingResponse(n=request.n)            # or (response, payload_bytes)

    server = rpc.Server({PingRequest: ping}, config=rpc.RpcConfig())
    await server.start("127.0.0.1", 0)
    conn = await rpc.connect("127.0.0.1", server.port)
    response = await conn.call(PingRequest(n=1), timeout_s=1.0)          # PingResponse
    response, data = await conn.call_with_payload(PingRequest(n=2), payload=b"entry")
    await conn.close(); await server.close()

Public API:

- ``Message``, ``Request[R]``: message bases (``type_id: ClassVar[int]`` registers).
- ``Server(handlers, *, config=None, security=None)``: ``await start(host, port)``,
  ``port``, ``connection_count``, ``await close()``. A handler is
  ``async (request, RequestContext) -> response | (response, payload)``.
- ``connect(host, port, *, config=None, security=None) -> Connection``:
  ``call``, ``call_with_payload``, ``send_nowait``, ``call_many``, ``close``,
  ``close_nowait``, ``peer``, ``closed``, ``in_flight``.
- ``Pool(*, config=None, security=None)``: one connection per ``"host:port"``,
  reconnecting on demand: ``get``, ``call``, ``call_with_payload``, ``close``.
- ``RpcConfig``, ``RpcSecurityConfig``: every limit and security option.
- ``default_security()`` / ``set_default_security(cfg)``: the security of pools
  built without one (default: ``QUORUMLOG_SECURITY__<FIELD>`` environment
  variables, e.g. ``QUORUMLOG_SECURITY__TOKEN``).
- Errors: ``ConnectionClosedError`` and ``ConnectFailedError`` (retriable),
  ``BackpressureError`` (retriable), ``AuthenticationError``,
  ``RemoteInternalError``, ``UnsupportedRequestError``; ``register_error`` gives
  a package's own error class a wire code. A handler's QuorumlogError is raised
  again, same class, on the client.
- ``install_uvloop()``, ``run(main)``: event loop helpers.
- ``LoopThread(name, *, call_timeout_s=None)``: one event loop on a daemon
  thread for blocking clients: ``call(coro, timeout_s=...)``, ``submit(coro)``,
  ``close()``; errors ``LoopCallTimeoutError`` (the call was cancelled),
  ``LoopReentryError`` (a blocking call from the loop thread itself),
  ``LoopClosedError``.
- ``metrics_registry``: the process's prometheus_client registry (rpc counters, and
  every package's collector); ``LatencyHistogram`` and the ``*_family`` helpers
  build the families of those collectors.

See docs/rpc.md for the wire format, the copy count of payloads and the limits.
"""

from ._client import Connection, connect
from ._config import (
    RpcConfig,
    RpcSecurityConfig,
    default_security,
    set_default_security,
)
from ._errors import (
    AuthenticationError,
    BackpressureError,
    ConnectFailedError,
    ConnectionClosedError,
    RemoteInternalError,
    ResponseTooLargeError,
    UnsupportedRequestError,
    error_from_wire,
    error_to_wire,
    register_error,
)
from ._loop import install_uvloop, run
from ._loop_thread import (
    LoopCallTimeoutError,
    LoopClosedError,
    LoopReentryError,
    LoopThread,
)
from ._messages import ErrorResponse, Message, Request
from ._metrics import (
    LATENCY_BUCKETS_SECONDS,
    LatencyHistogram,
    counter_family,
    gauge_family,
    histogram_family,
    metrics_registry,
)
from ._pool import Pool
from ._security import server_ssl_context
from ._server import DeferredAnswer, RequestContext, Server, answer_from

__all__ = [
    "LATENCY_BUCKETS_SECONDS",
    "AuthenticationError",
    "BackpressureError",
    "ConnectFailedError",
    "Connection",
    "ConnectionClosedError",
    "DeferredAnswer",
    "ErrorResponse",
    "LatencyHistogram",
    "LoopCallTimeoutError",
    "LoopClosedError",
    "LoopReentryError",
    "LoopThread",
    "Message",
    "Pool",
    "RemoteInternalError",
    "Request",
    "RequestContext",
    "ResponseTooLargeError",
    "RpcConfig",
    "RpcSecurityConfig",
    "Server",
    "UnsupportedRequestError",
    "answer_from",
    "connect",
    "counter_family",
    "default_security",
    "error_from_wire",
    "error_to_wire",
    "gauge_family",
    "histogram_family",
    "install_uvloop",
    "metrics_registry",
    "register_error",
    "run",
    "server_ssl_context",
    "set_default_security",
]
