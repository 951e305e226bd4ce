"""The client connection: request ids, pending futures, deadlines, backpressure.

``connect()`` opens TCP (and TLS), sends the hello and returns a
:class:`Connection`. Many tasks may call on one connection at once; requests
are pipelined and responses matched by request id in any order. When the
connection closes, every pending request fails with ConnectionClosedError.
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from quorumlog.errors import DeadlineExceededError, ProtocolError, UsageError

from ._config import RpcConfig, RpcSecurityConfig
from ._errors import (
    AuthenticationError,
    BackpressureError,
    ConnectFailedError,
    ConnectionClosedError,
    error_from_wire,
)
from ._frame import (
    MAX_FRAME_BYTES_WIRE,
    MAX_REQUEST_ID,
    MIN_FRAME_LIMIT_BYTES,
    ONEWAY_REQUEST_ID,
    Frame,
    FrameError,
)
from ._messages import (
    PROTOCOL_VERSION,
    ErrorResponse,
    HelloRequest,
    Message,
    Request,
    encode_known,
    registry,
)
from ._protocol import BytesLike, FramedProtocol, log
from ._security import client_ssl_context
from ._window import Window

R = TypeVar("R", bound=Message)
Reply = tuple[Message, memoryview]


@dataclass(slots=True)
class _Pending:
    future: asyncio.Future[Reply]
    request_cls: type[Message]
    response_cls: type[Message]
    timeout_s: float
    timer: asyncio.TimerHandle


class _ClientProtocol(FramedProtocol):
    side = "client"

    def __init__(self, config: RpcConfig) -> None:
        super().__init__(config)
        self.window = Window(config.max_in_flight_requests)
        self.send_limit_bytes = config.max_frame_bytes
        self._pending: dict[int, _Pending] = {}
        self._writable_waiters: list[asyncio.Future[None]] = []
        self._request_ids = itertools.count(1)

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    @property
    def write_paused(self) -> bool:
        return self._write_paused

    async def wait_writable(self, deadline: float) -> None:
        """Wait while the transport holds more than write_buffer_high_water_bytes."""
        if not self._write_paused:
            return
        waiter = self._loop.create_future()
        self._writable_waiters.append(waiter)
        try:
            async with asyncio.timeout_at(deadline):
                await waiter
        except TimeoutError:
            raise DeadlineExceededError(
                f"{self.peer} did not read our requests before the deadline"
            ) from None

    def resume_writing(self) -> None:
        super().resume_writing()
        self._wake_writers(None)

    def _wake_writers(self, error: Exception | None) -> None:
        waiters, self._writable_waiters = self._writable_waiters, []
        for waiter in waiters:
            if waiter.done():
                continue
            if error is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(error)

    def start(
        self, request: Request[Any], payload: BytesLike | None, timeout_s: float
    ) -> tuple[int, asyncio.Future[Reply]]:
        """Queue ``request`` (the caller holds a window slot); return its future."""
        if self.closing:
            raise ConnectionClosedError(f"connection to {self.peer} is closed: {self.close_reason}")
        entry = registry.by_cls(type(request))
        if entry.response_cls is None:
            raise UsageError(f"{entry.cls.__name__} is not a request")
        payload_bytes = _nbytes(payload)
        request_id = next(self._request_ids)
        if request_id > MAX_REQUEST_ID:
            raise UsageError("request ids exhausted on this connection; open a new one")
        frame = encode_known(request, entry.type_id, request_id, payload_bytes)
        if len(frame) + payload_bytes > self.send_limit_bytes:
            raise UsageError(
                f"{entry.cls.__name__} of {len(frame) + payload_bytes} bytes exceeds "
                f"max_frame_bytes {self.send_limit_bytes}"
            )
        future: asyncio.Future[Reply] = self._loop.create_future()
        timer = self._loop.call_later(timeout_s, self._expire, request_id)
        self._pending[request_id] = _Pending(
            future, entry.cls, entry.response_cls, timeout_s, timer
        )
        self._metrics.requests[entry.cls.__name__] += 1
        self._send(frame, payload, payload_bytes)
        return request_id, future

    def send_oneway(self, request: Request[Any], payload: BytesLike | None) -> None:
        """Queue ``request`` with request id 0: the server runs it and sends nothing back."""
        if self.closing:
            raise ConnectionClosedError(f"connection to {self.peer} is closed: {self.close_reason}")
        entry = registry.by_cls(type(request))
        if entry.response_cls is None:
            raise UsageError(f"{entry.cls.__name__} is not a request")
        payload_bytes = _nbytes(payload)
        frame = encode_known(request, entry.type_id, ONEWAY_REQUEST_ID, payload_bytes)
        if len(frame) + payload_bytes > self.send_limit_bytes:
            raise UsageError(
                f"{entry.cls.__name__} of {len(frame) + payload_bytes} bytes exceeds "
                f"max_frame_bytes {self.send_limit_bytes}"
            )
        self._metrics.requests[entry.cls.__name__] += 1
        self._send(frame, payload, payload_bytes)

    def abandon(self, request_id: int) -> None:
        """The caller stopped waiting (cancelled): free the slot now."""
        pending = self._pop(request_id)
        if pending is not None and not pending.future.done():
            pending.future.cancel()

    def _pop(self, request_id: int) -> _Pending | None:
        pending = self._pending.pop(request_id, None)
        if pending is not None:
            pending.timer.cancel()
            self.window.release()
        return pending

    def _expire(self, request_id: int) -> None:
        pending = self._pop(request_id)
        if pending is None or pending.future.done():
            return
        self._metrics.timeouts += 1
        pending.future.set_exception(
            DeadlineExceededError(
                f"{pending.request_cls.__name__} to {self.peer} got no response "
                f"within {pending.timeout_s:.3f}s"
            )
        )

    def _on_frame(self, frame: Frame) -> None:
        entry = registry.by_id(frame.type_id)
        if entry is None:
            raise FrameError(f"unknown message type id {frame.type_id}")
        if entry.response_cls is not None:
            raise FrameError(f"server sent a request ({entry.cls.__name__})")
        pending = self._pending.get(frame.request_id)
        if pending is None:
            return  # the caller gave up (deadline, cancel); drop the late response
        if entry.cls is not ErrorResponse and entry.cls is not pending.response_cls:
            raise FrameError(
                f"{entry.cls.__name__} does not answer {pending.request_cls.__name__}"
            )
        message = entry.decode(frame.body)
        self._pop(frame.request_id)
        if pending.future.done():
            return
        if isinstance(message, ErrorResponse):
            self._metrics.errors[message.code] += 1
            pending.future.set_exception(error_from_wire(message))
        else:
            pending.future.set_result((message, frame.payload))

    def _on_closed(self) -> None:
        error = ConnectionClosedError(
            f"connection to {self.peer} closed: {self.close_reason}; retry on a new connection"
        )
        self.window.fail(error)
        self._wake_writers(error)
        pending, self._pending = self._pending, {}
        for item in pending.values():
            item.timer.cancel()
            if not item.future.done():
                item.future.set_exception(error)


class Connection:
    """One client connection; share it between tasks (see the module docstring)."""

    def __init__(self, protocol: _ClientProtocol, config: RpcConfig) -> None:
        self._protocol = protocol
        self._config = config
        self._loop = asyncio.get_running_loop()

    @property
    def peer(self) -> str:
        return self._protocol.peer

    @property
    def closed(self) -> bool:
        return self._protocol.closing

    @property
    def in_flight(self) -> int:
        """Requests sent and not yet answered, timed out or failed."""
        return self._protocol.in_flight

    async def call(
        self,
        request: Request[R],
        *,
        payload: BytesLike | None = None,
        timeout_s: float | None = None,
    ) -> R:
        """Send ``request`` and return its response; raises the server's error."""
        response, _ = await self.call_with_payload(request, payload=payload, timeout_s=timeout_s)
        return response

    async def call_with_payload(
        self,
        request: Request[R],
        *,
        payload: BytesLike | None = None,
        timeout_s: float | None = None,
    ) -> tuple[R, memoryview]:
        """Like :meth:`call`, also returning the response's raw payload.

        The deadline covers waiting for in-flight capacity and the response.
        ``payload`` is written as it is: do not change it until the call returns.
        """
        timeout = self._timeout(timeout_s)
        deadline = self._loop.time() + timeout
        await self._protocol.window.acquire(deadline)
        try:
            await self._protocol.wait_writable(deadline)
            request_id, future = self._protocol.start(
                request, payload, max(deadline - self._loop.time(), 0.0)
            )
        except BaseException:
            self._protocol.window.release()
            raise
        try:
            response, data = await future
        except asyncio.CancelledError:
            self._protocol.abandon(request_id)
            raise
        return response, data  # type: ignore[return-value]

    def send_nowait(
        self,
        request: Request[R],
        *,
        payload: BytesLike | None = None,
        timeout_s: float | None = None,
    ) -> asyncio.Future[tuple[R, memoryview]]:
        """Queue ``request`` now and return the future of (response, payload).

        Raises BackpressureError when the in-flight window is full or the peer
        is not reading, instead of waiting. The future fails like :meth:`call`.
        """
        if self._protocol.write_paused:
            raise BackpressureError(f"{self.peer} is not reading our requests fast enough")
        if not self._protocol.window.try_acquire():
            raise BackpressureError(
                f"{self._config.max_in_flight_requests} requests in flight to {self.peer}"
            )
        try:
            _, future = self._protocol.start(request, payload, self._timeout(timeout_s))
        except BaseException:
            self._protocol.window.release()
            raise
        return future  # type: ignore[return-value]

    def send_oneway(self, request: Request[Any], *, payload: BytesLike | None = None) -> None:
        """Send ``request`` without wanting a response (request id 0).

        For messages whose answer travels as a request of its own (Raft): it
        saves the server a response frame and a send per message. Nothing says
        whether it arrived; the server logs a handler's failure. Raises
        ConnectionClosedError (retriable) on a closed connection and
        BackpressureError when the peer is not reading.
        """
        if self._protocol.write_paused:
            raise BackpressureError(f"{self.peer} is not reading our requests fast enough")
        self._protocol.send_oneway(request, payload)

    def flush(self) -> None:
        """Write what is queued now, not at the end of this loop iteration.

        Frames queued in one loop iteration normally go out together when the
        iteration's callbacks have run (write coalescing). A caller that is
        about to block the loop (an fsync on the loop thread) or to do a
        batch of other work first flushes here, so the peer starts on its
        part meanwhile (the Raft leader's AppendEntries before its own fsync).
        """
        self._protocol.flush_now()

    async def call_many(
        self, requests: Sequence[Request[R]], *, timeout_s: float | None = None
    ) -> list[R]:
        """Pipeline ``requests`` and return their responses in the same order.

        If any fails, the first error (in request order) is raised after all
        have finished.
        """
        results = await asyncio.gather(
            *(self.call(request, timeout_s=timeout_s) for request in requests),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return results  # type: ignore[return-value]

    async def close(self) -> None:
        """Close the connection at once: unsent requests are dropped and every
        pending request fails with ConnectionClosedError."""
        self.close_nowait()
        await self._protocol.wait_lost()

    def close_nowait(self) -> None:
        self._protocol.close_with_reason("closed by the caller", "local", abort=True)

    def _timeout(self, timeout_s: float | None) -> float:
        timeout = self._config.default_request_timeout_s if timeout_s is None else timeout_s
        if timeout <= 0:
            raise UsageError(f"timeout_s must be positive, got {timeout}")
        return timeout

    async def _hello(self, token: str | None, timeout_s: float) -> None:
        hello = HelloRequest(
            protocol_version=PROTOCOL_VERSION,
            max_frame_bytes=self._config.max_frame_bytes,
            token=token,
        )
        response = await self.call(hello, timeout_s=timeout_s)
        if not MIN_FRAME_LIMIT_BYTES <= response.max_frame_bytes <= MAX_FRAME_BYTES_WIRE:
            raise ProtocolError(
                f"server {self.peer} announced max_frame_bytes {response.max_frame_bytes}; "
                f"it must be in [{MIN_FRAME_LIMIT_BYTES}, {MAX_FRAME_BYTES_WIRE}]"
            )
        self._protocol.send_limit_bytes = min(
            self._config.max_frame_bytes, response.max_frame_bytes
        )


async def connect(
    host: str,
    port: int,
    *,
    config: RpcConfig | None = None,
    security: RpcSecurityConfig | None = None,
) -> Connection:
    """Open a connection: TCP, TLS when configured, then the hello (with token).

    Raises ConnectFailedError (retriable) when the server cannot be reached and
    AuthenticationError when it refuses the token or the TLS certificates.
    """
    config = config or RpcConfig()
    config.validate()
    security = security or RpcSecurityConfig()
    security.validate()
    context = client_ssl_context(security)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + config.connect_timeout_s
    where = f"{host}:{port}"
    try:
        async with asyncio.timeout_at(deadline):
            _, protocol = await loop.create_connection(
                lambda: _ClientProtocol(config),
                host,
                port,
                ssl=context,
                server_hostname=(security.tls_server_hostname or host) if context else None,
            )
    except TimeoutError:
        raise ConnectFailedError(
            f"connect to {where} timed out after {config.connect_timeout_s}s"
        ) from None
    except ssl.SSLError as exc:
        raise AuthenticationError(f"TLS handshake with {where} failed: {exc}") from None
    except OSError as exc:
        raise ConnectFailedError(f"cannot connect to {where}: {exc}") from None
    connection = Connection(protocol, config)
    await _handshake(
        connection,
        protocol,
        token=security.token,
        timeout_s=deadline - loop.time(),
        where=where,
        tls=context is not None,
    )
    log().debug("rpc_connected", peer=where, tls=context is not None)
    return connection


async def _handshake(
    connection: Connection,
    protocol: _ClientProtocol,
    *,
    token: str | None,
    timeout_s: float,
    where: str,
    tls: bool,
) -> None:
    try:
        await connection._hello(token, max(timeout_s, 0.001))
    except BaseException as exc:
        protocol.close_with_reason(f"hello failed: {exc}", "local", abort=True)
        if tls and _tls_refusal(protocol.close_exception):
            raise AuthenticationError(
                f"TLS connection to {where} ended during the hello "
                f"({protocol.close_exception}): the server refused our client certificate "
                "(check tls_cert_path and that its CA is the server's tls_ca_path)"
            ) from None
        if isinstance(exc, DeadlineExceededError):
            raise ConnectFailedError(f"no hello from {where}: {exc.message}") from None
        raise


def _tls_refusal(exc: BaseException | None) -> bool:
    """How a refused client certificate shows up on the client.

    With TLS 1.3 the client's handshake completes before the server checks
    the client certificate; the server then aborts the connection, so the
    client sees the server's alert (SSLError) or, when the abort discards the
    alert, a reset, while waiting for the hello response.
    """
    return isinstance(exc, ssl.SSLError | ConnectionResetError)


def _nbytes(payload: BytesLike | None) -> int:
    if payload is None:
        return 0
    return payload.nbytes if isinstance(payload, memoryview) else len(payload)

