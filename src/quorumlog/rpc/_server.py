"""The server: one protocol object per accepted connection, one task per request.

A connection starts with a hello (version and token). After it, each request
frame runs its handler in a task; responses go out in completion order, matched
by request id. A connection with ``server_max_in_flight_requests`` handlers
running (or whose peer does not read its responses) stops reading until they
finish. A frame that breaks the protocol closes that connection only.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeAlias, TypeVar

import msgspec

from quorumlog.errors import (
    ConfigError,
    InvariantViolation,
    ProtocolError,
    QuorumlogError,
    UsageError,
)

from ._config import RpcConfig, RpcSecurityConfig
from ._errors import (
    AuthenticationError,
    RemoteInternalError,
    ResponseTooLargeError,
    UnsupportedRequestError,
    error_to_wire,
)
from ._frame import (
    MAX_FRAME_BYTES_WIRE,
    MIN_FRAME_LIMIT_BYTES,
    ONEWAY_REQUEST_ID,
    Frame,
    FrameError,
)
from ._messages import (
    PROTOCOL_VERSION,
    HelloRequest,
    HelloResponse,
    Message,
    MessageType,
    Request,
    encode_frame,
    encode_known,
    registry,
)
from ._protocol import BytesLike, FramedProtocol, log
from ._security import server_ssl_context, token_matches

# Until its hello is accepted a peer may send only small frames, so an
# unauthenticated connection cannot make the server buffer max_frame_bytes.
HELLO_MAX_FRAME_BYTES = 4096

T = TypeVar("T")
R = TypeVar("R")


class DeferredAnswer(Generic[T, R]):
    """A plain handler's answer taken from another future, say a Raft
    proposal's (what :func:`answer_from` returns)."""

    __slots__ = ("convert", "convert_error", "on_error", "source")

    def __init__(self, source: asyncio.Future[T], convert: Callable[[T], R],
                 on_error: Callable[[BaseException], None] | None,
                 convert_error: Callable[[BaseException], R] | None = None) -> None:
        self.source = source
        self.convert = convert
        self.on_error = on_error
        self.convert_error = convert_error


def answer_from(source: asyncio.Future[T], convert: Callable[[T], R], *,
                on_error: Callable[[BaseException], None] | None = None,
                convert_error: Callable[[BaseException], R] | None = None,
                ) -> DeferredAnswer[T, R]:
    """A plain handler's deferred answer (no task) built from another future,
    say a Raft proposal's: the server answers ``convert(source.result())``
    once ``source`` is done, or the error ``source`` failed with (after
    ``on_error``), or with ``convert_error`` the answer it makes of that error;
    nothing when ``source`` is cancelled. The server waits on ``source``
    itself (one callback, no future of its own per request) and never cancels
    it: a connection that closes meanwhile gets no answer."""
    return DeferredAnswer(source, convert, on_error, convert_error)


@dataclass(frozen=True, slots=True)
class RequestContext:
    """What a handler knows besides the request."""

    peer: str  # "host:port" of the client
    request_id: int
    payload: memoryview  # the raw trailing payload; empty when none was sent


HandlerResult: TypeAlias = Message | tuple[Message, BytesLike]
Handler: TypeAlias = Callable[[Any, RequestContext], Awaitable[HandlerResult]]
"""An ``async def`` handler (the server runs it as a task), or a plain function
that returns an ``asyncio.Future`` of the result (the server answers when it
is done: no task, no coroutine to resume - for the hot write path of the
metadata service, whose answer is a Raft proposal's future anyway). A plain
function may also raise at once; it must not block."""


class Server:
    """Serves ``handlers`` (request class -> async handler) on one listening socket.

    A handler returns the response message, or ``(response, payload)`` to
    attach a raw payload. Raising a :class:`QuorumlogError` sends that error to
    the caller; any other exception is logged and sent as RemoteInternalError.
    """

    def __init__(
        self,
        handlers: Mapping[type[Request[Any]], Handler],
        *,
        config: RpcConfig | None = None,
        security: RpcSecurityConfig | None = None,
    ) -> None:
        self.config = config or RpcConfig()
        self.config.validate()
        self.security = security or RpcSecurityConfig()
        self.security.validate()
        self._handlers = _check_handlers(handlers)
        # Request classes whose handler is a plain function (not ``async def``).
        self._plain = frozenset(
            cls for cls, handler in self._handlers.items()
            if not inspect.iscoroutinefunction(handler))
        self._ssl = server_ssl_context(self.security)
        self._server: asyncio.Server | None = None
        self._connections: set[_ServerProtocol] = set()
        # Receive buffers held by all connections (FrameReader.held_bytes summed),
        # bounded by config.server_max_buffered_bytes.
        self.buffered_bytes = 0

    @property
    def port(self) -> int:
        """The port listened on (the one chosen by the OS when started with 0)."""
        if self._server is None or not self._server.sockets:
            raise UsageError("server is not started")
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        if self._server is not None:
            raise UsageError("server already started")
        loop = asyncio.get_running_loop()
        try:
            self._server = await loop.create_server(
                lambda: _ServerProtocol(self),
                host,
                port,
                ssl=self._ssl,
                ssl_handshake_timeout=self.config.handshake_timeout_s if self._ssl else None,
            )
        except OSError as exc:
            raise ConfigError(
                f"cannot listen on {host}:{port}: {exc.strerror or exc}; "
                "choose another address or port"
            ) from None
        log().info("rpc_server_started", host=host, port=self.port, tls=self._ssl is not None)

    async def close(self) -> None:
        """Stop listening, close every connection (their pending calls fail on the
        client side), cancel running handlers and wait for them."""
        if self._server is None:
            return
        self._server.close()
        connections = list(self._connections)
        tasks = [task for conn in connections for task in conn.tasks]
        for conn in connections:
            conn.close_with_reason("server closing", "local")
        for task in tasks:
            task.cancel()
        waits = [*tasks, *(asyncio.ensure_future(c.wait_lost()) for c in connections)]
        if waits:
            _, still_running = await asyncio.wait(waits, timeout=self.config.close_timeout_s)
            for task in still_running:
                task.cancel()  # a handler that ignores cancellation is left behind
        await self._server.wait_closed()
        self._server = None

    # ---------------------------------------------------------------- internal

    def _attach(self, conn: _ServerProtocol) -> bool:
        if len(self._connections) >= self.config.server_max_connections:
            return False
        self._connections.add(conn)
        return True

    def _detach(self, conn: _ServerProtocol) -> None:
        self._connections.discard(conn)

    def _handler_for(self, cls: type[Message]) -> Handler | None:
        return self._handlers.get(cls)


def _check_handlers(handlers: Mapping[type[Request[Any]], Handler]) -> dict[type[Message], Handler]:
    checked: dict[type[Message], Handler] = {}
    for cls, handler in handlers.items():
        if not (isinstance(cls, type) and issubclass(cls, Request)):
            raise UsageError(f"handler key {cls!r} is not a Request class")
        registry.by_cls(cls)  # raises UsageError for unregistered classes
        if cls is HelloRequest:
            raise UsageError("HelloRequest is handled by the rpc layer itself")
        if not callable(handler):
            raise UsageError(f"handler for {cls.__name__} is not callable")
        checked[cls] = handler
    return checked


class _ServerProtocol(FramedProtocol):
    side = "server"

    def __init__(self, server: Server) -> None:
        super().__init__(server.config)
        self._server = server
        self._max_in_flight = server.config.server_max_in_flight_requests
        self._hello_done = False
        self._reading_paused = False
        self._send_limit_bytes = server.config.max_frame_bytes
        # Tasks, futures of plain handlers, or DeferredAnswers (not awaited on close).
        self._in_flight: dict[int, asyncio.Future[Any] | DeferredAnswer[Any, Any]] = {}
        self._oneway_seq = 0  # keys of one-way handlers in _in_flight: -1, -2, ...
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._reader.set_max_frame_bytes(min(HELLO_MAX_FRAME_BYTES, server.config.max_frame_bytes))
        self._held_bytes = 0  # this connection's share of server.buffered_bytes

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def tasks(self) -> list[asyncio.Future[Any]]:
        return [t for t in self._in_flight.values() if isinstance(t, asyncio.Future)]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if not self._server._attach(self):
            self.close_with_reason(
                f"server_max_connections ({self._server.config.server_max_connections}) reached",
                "limit",
            )
            return
        self._handshake_timer = self._loop.call_later(
            self._server.config.handshake_timeout_s, self._handshake_expired
        )

    def _handshake_expired(self) -> None:
        if not self._hello_done:
            self.close_with_reason("no hello within handshake_timeout_s", "handshake")

    def _on_closed(self) -> None:
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
        self._drop_buffer()
        self._server._detach(self)
        # Running handlers finish (a storage write must not be cut in half);
        # their responses are dropped. Server.close() cancels them.

    # ---------------------------------------------------------------- reading

    def _can_dispatch(self) -> bool:
        return len(self._in_flight) < self._max_in_flight and not self._write_paused

    def get_buffer(self, sizehint: int) -> memoryview:
        buffer = self._reader.get_buffer()
        held = self._reader.held_bytes
        if held != self._held_bytes:
            self._server.buffered_bytes += held - self._held_bytes
            self._held_bytes = held
        return buffer

    def buffer_updated(self, nbytes: int) -> None:
        super().buffer_updated(nbytes)
        self._update_reading()
        self._check_buffered()

    def _drop_buffer(self) -> None:
        self._server.buffered_bytes -= self._held_bytes
        self._held_bytes = 0
        self._reader.release()

    def _check_buffered(self) -> None:
        """Over the server's buffer budget, the connection holding the largest
        buffer for an incomplete frame pays: it is closed at once (nothing of
        that frame was served) and its buffer dropped. Checked after each read,
        so the budget is passed by at most one buffer step."""
        server = self._server
        limit = server.config.server_max_buffered_bytes
        if server.buffered_bytes <= limit:
            return
        receiving = [c for c in server._connections
                     if not c.closing and c._reader.incomplete_frame_bytes]
        if not receiving:
            return  # completed frames' buffers: they go as their handlers finish
        offender = max(receiving, key=lambda conn: conn._held_bytes)
        offender.close_with_reason(
            f"server receive buffers full: {server.buffered_bytes} bytes held > "
            f"server_max_buffered_bytes {limit}; this connection held "
            f"{offender._held_bytes} bytes for an incomplete frame of "
            f"{offender._reader.incomplete_frame_bytes} bytes",
            "limit",
            abort=True,
        )
        offender._drop_buffer()

    def pause_writing(self) -> None:
        super().pause_writing()
        self._update_reading()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._drain_frames()
        self._update_reading()

    def _update_reading(self) -> None:
        """Read while handlers have room and the peer reads its responses."""
        transport = self._transport
        if transport is None or self.closing:
            return
        want_paused = not self._can_dispatch()
        if want_paused and not self._reading_paused:
            transport.pause_reading()
            self._reading_paused = True
        elif not want_paused and self._reading_paused:
            transport.resume_reading()
            self._reading_paused = False

    def _on_frame(self, frame: Frame) -> None:
        entry = registry.by_id(frame.type_id)
        if entry is None:
            raise FrameError(f"unknown message type id {frame.type_id}")
        if entry.response_cls is None:
            raise FrameError(f"{entry.cls.__name__} is not a request")
        request = entry.decode(frame.body)
        if not self._hello_done:
            self._on_hello(frame.request_id, request)
        elif isinstance(request, HelloRequest):
            raise FrameError("second HelloRequest on one connection")
        else:
            self._dispatch(frame, entry, request)

    # ---------------------------------------------------------------- hello

    def _on_hello(self, request_id: int, request: Message) -> None:
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
        if not isinstance(request, HelloRequest):
            self._refuse(
                request_id,
                AuthenticationError(
                    f"the first frame must be a HelloRequest, not {type(request).__name__}"
                ),
            )
            return
        refusal = self._hello_refusal(request)
        if refusal is not None:
            self._refuse(request_id, refusal)
            return
        self._hello_done = True
        self._reader.set_max_frame_bytes(self._server.config.max_frame_bytes)
        self._send_limit_bytes = min(self._send_limit_bytes, request.max_frame_bytes)
        response = HelloResponse(
            protocol_version=PROTOCOL_VERSION, max_frame_bytes=self._server.config.max_frame_bytes
        )
        self._send(encode_frame(response, request_id, 0), None, 0)

    def _hello_refusal(self, request: HelloRequest) -> QuorumlogError | None:
        if request.protocol_version != PROTOCOL_VERSION:
            return ProtocolError(
                f"protocol version {request.protocol_version} is not supported "
                f"(server speaks {PROTOCOL_VERSION}); upgrade the older side"
            )
        if not MIN_FRAME_LIMIT_BYTES <= request.max_frame_bytes <= MAX_FRAME_BYTES_WIRE:
            return ProtocolError(
                f"hello announces max_frame_bytes {request.max_frame_bytes}; it must be in "
                f"[{MIN_FRAME_LIMIT_BYTES}, {MAX_FRAME_BYTES_WIRE}] (check the client's rpc "
                "max_frame_bytes)"
            )
        if not token_matches(self._server.security.token, request.token):
            return AuthenticationError(
                "authentication failed: wrong or missing token (check security.token)"
            )
        return None

    def _refuse(self, request_id: int, refusal: QuorumlogError) -> None:
        """Answer the hello with a clear error, then close once it is written."""
        self._send_error(request_id, refusal)
        kind = "auth" if isinstance(refusal, AuthenticationError) else "handshake"
        self.close_with_reason(refusal.message, kind)

    # ---------------------------------------------------------------- requests

    def _dispatch(self, frame: Frame, entry: MessageType, request: Message) -> None:
        request_id = frame.request_id
        if request_id == ONEWAY_REQUEST_ID:
            self._dispatch_oneway(frame, entry, request)
            return
        if request_id in self._in_flight:
            raise FrameError(f"request id {request_id} reused while still in flight")
        self._metrics.requests[entry.cls.__name__] += 1
        handler = self._server._handler_for(entry.cls)
        if handler is None:
            self._send_error(
                request_id,
                UnsupportedRequestError(f"this server has no handler for {entry.cls.__name__}"),
            )
            return
        context = RequestContext(self.peer, request_id, frame.payload)
        if entry.cls in self._server._plain:
            self._start_deferred(handler, entry, request, context)
            return
        task = self._loop.create_task(self._serve(handler, entry, request, context))
        self._in_flight[request_id] = task

    def _start_deferred(self, handler: Handler, entry: MessageType, request: Message,
                        context: RequestContext) -> None:
        """A plain handler: call it now; answer when the future it returns is done."""
        request_id = context.request_id
        try:
            outcome: object = handler(request, context)
        except QuorumlogError as exc:
            self._send_error(request_id, exc)
            return
        except Exception as exc:
            self._send_internal_error(request_id, entry, exc)
            return
        if type(outcome) is DeferredAnswer:
            self._in_flight[request_id] = outcome
            outcome.source.add_done_callback(
                functools.partial(self._answer_from, request_id, entry, outcome))
            return
        if not isinstance(outcome, asyncio.Future):
            if inspect.isawaitable(outcome):  # a coroutine after all: run it as a task
                task = self._loop.create_task(self._await(outcome))
                self._in_flight[request_id] = task
                task.add_done_callback(functools.partial(self._answer, request_id, entry))
                return
            self._send_result(request_id, entry, outcome)
            return
        self._in_flight[request_id] = outcome
        outcome.add_done_callback(functools.partial(self._answer, request_id, entry))

    def _answer_from(self, request_id: int, entry: MessageType,
                     deferred: DeferredAnswer[Any, Any], source: asyncio.Future[Any]) -> None:
        """Send what a :class:`DeferredAnswer`'s source came to, converted."""
        try:
            if source.cancelled():
                return
            error = source.exception()
            convert_error = deferred.convert_error
            if error is not None:
                if deferred.on_error is not None:
                    deferred.on_error(error)
                if convert_error is None:
                    if not self.closing:
                        self._send_failure(request_id, entry, error)
                    return
            try:  # the conversion counts, even if unsent
                if error is None:
                    result = deferred.convert(source.result())
                elif convert_error is not None:
                    result = convert_error(error)
            except Exception as exc:
                if not self.closing:
                    self._send_internal_error(request_id, entry, exc)
            else:
                if not self.closing:
                    self._send_result(request_id, entry, result)
        finally:
            self._finish(request_id)

    def _send_failure(self, request_id: int, entry: MessageType, error: BaseException) -> None:
        if isinstance(error, InvariantViolation) or not isinstance(error, QuorumlogError):
            self._send_internal_error(request_id, entry, error)
        else:
            self._send_error(request_id, error)

    @staticmethod
    async def _await(awaitable: Awaitable[Any]) -> Any:
        return await awaitable

    def _answer(self, request_id: int, entry: MessageType,
                future: asyncio.Future[HandlerResult]) -> None:
        """Send a deferred handler's outcome (nothing once the connection closed)."""
        try:
            if future.cancelled():
                return  # the server is closing
            error = future.exception()
            if error is None:
                if not self.closing:
                    self._send_result(request_id, entry, future.result())
            elif not self.closing:
                self._send_failure(request_id, entry, error)
        finally:
            self._finish(request_id)

    def _dispatch_oneway(self, frame: Frame, entry: MessageType, request: Message) -> None:
        """Run a one-way request's handler; nothing is sent back, failures are logged.

        One-way handlers count against the same in-flight bound as others
        (under a key of their own), so a flood of them pauses reading too."""
        self._metrics.requests[entry.cls.__name__] += 1
        handler = self._server._handler_for(entry.cls)
        if handler is None:
            log().warning("rpc_oneway_unsupported", request=entry.cls.__name__, peer=self.peer)
            return
        self._oneway_seq -= 1  # negative keys: never a client request id
        key = self._oneway_seq
        context = RequestContext(self.peer, ONEWAY_REQUEST_ID, frame.payload)
        task = self._loop.create_task(self._serve_oneway(handler, entry, request, context, key))
        self._in_flight[key] = task

    async def _serve_oneway(self, handler: Handler, entry: MessageType, request: Message,
                            context: RequestContext, key: int) -> None:
        try:
            await handler(request, context)
        except InvariantViolation as exc:
            log().error("rpc_handler_failed", request=entry.cls.__name__, peer=self.peer,
                        request_id=ONEWAY_REQUEST_ID, exc_info=exc)
        except QuorumlogError as exc:
            log().warning("rpc_oneway_refused", request=entry.cls.__name__, peer=self.peer,
                          error=exc.message)
        except Exception as exc:
            log().error("rpc_handler_failed", request=entry.cls.__name__, peer=self.peer,
                        request_id=ONEWAY_REQUEST_ID, exc_info=exc)
        finally:
            self._finish(key)

    async def _serve(
        self, handler: Handler, entry: MessageType, request: Message, context: RequestContext
    ) -> None:
        request_id = context.request_id
        try:
            result = await handler(request, context)
        except InvariantViolation as exc:
            self._send_internal_error(request_id, entry, exc)
        except QuorumlogError as exc:
            self._send_error(request_id, exc)
        except Exception as exc:
            self._send_internal_error(request_id, entry, exc)
        else:
            self._send_result(request_id, entry, result)
        finally:
            self._finish(request_id)

    def _finish(self, request_id: int) -> None:
        del self._in_flight[request_id]
        if self._reading_paused:
            self._drain_frames()
            self._update_reading()

    def _send_result(self, request_id: int, entry: MessageType, result: object) -> None:
        response, payload = _split_result(result)
        problem: Exception | None = None
        if type(response) is not entry.response_cls:
            expected = entry.response_cls.__name__ if entry.response_cls else "?"
            problem = TypeError(f"handler returned {type(response).__name__}, expected {expected}")
        elif payload is not None and not isinstance(payload, bytes | bytearray | memoryview):
            problem = TypeError(f"payload must be bytes-like, not {type(payload).__name__}")
        if problem is not None:
            self._send_internal_error(request_id, entry, problem)
            return
        payload_bytes = _nbytes(payload)
        try:
            type_id = entry.response_cls.type_id  # type: ignore[union-attr]
            frame = encode_known(response, type_id, request_id, payload_bytes)  # type: ignore[arg-type]
        except (msgspec.EncodeError, TypeError, ValueError, OverflowError) as exc:
            self._send_internal_error(request_id, entry, exc)
            return
        if len(frame) + payload_bytes > self._send_limit_bytes:
            size = len(frame) + payload_bytes
            limit = self._send_limit_bytes
            log().warning("rpc_response_too_large", request=entry.cls.__name__, peer=self.peer,
                          request_id=request_id, bytes=size, limit=limit)
            self._send_error(request_id, ResponseTooLargeError(
                f"the answer to {entry.cls.__name__} would be {size:,} bytes, over the "
                f"connection's limit of {limit:,} (max_frame_bytes); ask for less at once"))
            return
        self._send(frame, payload, payload_bytes)  # type: ignore[arg-type]

    def _send_error(self, request_id: int, exc: QuorumlogError) -> None:
        wire = error_to_wire(exc)
        self._metrics.errors[wire.code] += 1
        self._send(encode_frame(wire, request_id, 0), None, 0)

    def _send_internal_error(self, request_id: int, entry: MessageType, exc: BaseException) -> None:
        log().error(
            "rpc_handler_failed",
            request=entry.cls.__name__,
            peer=self.peer,
            request_id=request_id,
            exc_info=exc,
        )
        message = f"{entry.cls.__name__} handler failed: {type(exc).__name__}: {exc}"
        self._send_error(request_id, RemoteInternalError(message))


def _split_result(result: object) -> tuple[object, object]:
    if isinstance(result, tuple) and len(result) == 2:
        return result[0], result[1]
    return result, None


def _nbytes(payload: object) -> int:
    if isinstance(payload, memoryview):
        return payload.nbytes
    if isinstance(payload, bytes | bytearray):
        return len(payload)
    return 0
