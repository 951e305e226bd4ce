"""What client and server connections share: receiving frames into chunks,
write coalescing, and closing with a reason.

The connection owns framing, correlation and buffers; it makes no protocol
decisions (STYLE.md, aiokafka). Subclasses implement ``_on_frame`` and
``_on_closed`` and may hold back frames with ``_can_dispatch``.
"""

from __future__ import annotations

import abc
import asyncio
import typing
from typing import Any

from quorumlog.errors import invariant
from quorumlog.log import get_logger

from . import _metrics as metrics
from ._config import RpcConfig
from ._frame import Frame, FrameError, FrameReader


def log() -> Any:
    """The rpc logger, looked up per event: events are rare (connects, closes,
    handler failures) and a fresh lookup honours the logging configuration in
    force, including structlog.testing.capture_logs()."""
    return get_logger("quorumlog.rpc")


BytesLike = bytes | bytearray | memoryview

# Close reasons that mean the peer misbehaved or a server bound was hit: logged
# as warnings.
PEER_FAULTS = frozenset({"protocol", "auth", "handshake", "limit"})


class FramedProtocol(asyncio.BufferedProtocol, abc.ABC):
    side = "?"

    def __init__(self, config: RpcConfig) -> None:
        self._config = config
        self._loop = asyncio.get_running_loop()
        self._reader = FrameReader(
            max_frame_bytes=config.max_frame_bytes, chunk_bytes=config.read_chunk_bytes
        )
        self._transport: asyncio.Transport | None = None
        self._out: list[BytesLike] = []
        self._out_bytes = 0
        self._flush_scheduled = False
        self._write_paused = False
        self.peer = "?"
        self.closing = False
        self.close_reason = ""
        self.close_exception: BaseException | None = None
        self._lost = self._loop.create_future()
        self._metrics = metrics.side(self.side)

    # ------------------------------------------------------------ asyncio side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = typing.cast(asyncio.Transport, transport)
        self._transport.set_write_buffer_limits(high=self._config.write_buffer_high_water_bytes)
        self.peer = _format_peer(transport.get_extra_info("peername"))
        self._metrics.connections.add(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._reader.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self._reader.buffer_updated(nbytes)
        self._metrics.received_bytes += nbytes
        self._drain_frames()

    def eof_received(self) -> bool:
        buffered = self._reader.buffered_bytes
        if buffered and self._can_dispatch():  # every whole frame was taken
            reason = f"peer closed mid-frame with {buffered} bytes buffered"
            self.close_with_reason(reason, "protocol")
        elif buffered:
            reason = f"peer closed with {buffered} bytes of requests not yet served"
            self.close_with_reason(reason, "eof")
        else:
            self.close_with_reason("peer closed the connection", "eof")
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closing:
            self.closing = True
            self.close_reason = f"connection lost: {exc}" if exc else "connection lost"
            self._metrics.closed["error" if exc else "eof"] += 1
        self.close_exception = exc
        self._out.clear()
        self._metrics.connections.discard(self)
        self._on_closed()
        if not self._lost.done():
            self._lost.set_result(None)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False

    # ------------------------------------------------------------ frames in

    def _drain_frames(self) -> None:
        try:
            while not self.closing and self._can_dispatch():
                frame = self._reader.next_frame()
                if frame is None:
                    return
                self._on_frame(frame)
        except FrameError as exc:
            self.close_with_reason(exc.message, "protocol")

    def _can_dispatch(self) -> bool:
        return True

    @property
    @abc.abstractmethod
    def in_flight(self) -> int:
        """Requests awaiting a response (client) or in a handler (server)."""

    @abc.abstractmethod
    def _on_frame(self, frame: Frame) -> None:
        """Handle one complete frame; raise FrameError if the peer broke protocol."""

    @abc.abstractmethod
    def _on_closed(self) -> None:
        """The transport is gone: fail or drop whatever is pending."""

    # ------------------------------------------------------------ frames out

    def _send(self, frame: bytearray, payload: BytesLike | None, payload_bytes: int) -> None:
        """Queue one frame; frames queued in one loop iteration go out together."""
        self._out.append(frame)
        if payload_bytes:
            invariant(payload is not None, "payload_bytes without a payload")
            self._out.append(payload)  # type: ignore[arg-type]
        self._out_bytes += len(frame) + payload_bytes
        if self._out_bytes >= self._config.write_coalesce_max_bytes:
            self._flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def flush_now(self) -> None:
        """Write the queued frames at once (the scheduled flush then finds none)."""
        if self._out:
            self._flush()

    def _flush(self) -> None:
        self._flush_scheduled = False
        if not self._out:
            return
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.writelines(self._out)
            self._metrics.sent_bytes += self._out_bytes
        self._out = []
        self._out_bytes = 0

    # ------------------------------------------------------------ closing

    def close_with_reason(
        self, reason: str, kind: str, *, abort: bool = False
    ) -> None:
        """Close after writing what is queued (or at once with ``abort``); log
        why (a warning when the peer is at fault)."""
        if self.closing:
            return
        self.closing = True
        self.close_reason = reason
        self._metrics.closed[kind] += 1
        logger = log()
        event = logger.warning if kind in PEER_FAULTS else logger.debug
        event("rpc_connection_closed", side=self.side, peer=self.peer, kind=kind,
              reason=reason)
        if self._transport is None:
            return
        if abort:
            self._out.clear()
            self._transport.abort()
        else:
            self._flush()
            self._transport.close()
            # close() waits for queued bytes; a peer that does not read must not
            # keep the connection (and its pending requests) alive forever.
            self._loop.call_later(self._config.close_timeout_s, self._abort_if_open)

    def _abort_if_open(self) -> None:
        if not self._lost.done() and self._transport is not None:
            self._transport.abort()

    async def wait_lost(self) -> None:
        await asyncio.shield(self._lost)


def _format_peer(peername: Any) -> str:
    if isinstance(peername, tuple) and len(peername) >= 2:
        host, port = peername[0], peername[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(peername)
