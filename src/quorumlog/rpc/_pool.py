"""A pool of client connections, one per address, opened on first use and
again after they close. Higher layers (Raft driver, bookie and meta clients)
share one pool per process."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import TypeVar

from quorumlog.errors import TransientError, UsageError

from ._client import Connection, connect
from ._config import RpcConfig, RpcSecurityConfig, default_security
from ._errors import ConnectFailedError
from ._messages import Message, Request
from ._protocol import BytesLike, log

R = TypeVar("R", bound=Message)

MIN_CALL_TIMEOUT_S = 0.05  # what a call keeps for its answer after a slow connect


def parse_address(address: str) -> tuple[str, int]:
    """``"host:port"`` or ``"[v6]:port"`` -> (host, port)."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise UsageError(f"bad address {address!r}: expected host:port")
    return host.removeprefix("[").removesuffix("]"), int(port_text)


class Pool:
    """Connections keyed by ``"host:port"``; concurrent callers share one connect.

    At ``pool_max_connections`` the least recently used idle connection is
    closed to make room; when every connection is busy, ``get`` raises a
    retriable error.
    """

    def __init__(
        self, *, config: RpcConfig | None = None, security: RpcSecurityConfig | None = None
    ) -> None:
        self.config = config or RpcConfig()
        self.config.validate()
        self.security = security or default_security()
        self.security.validate()
        self._connections: OrderedDict[str, Connection] = OrderedDict()
        self._connecting: dict[str, asyncio.Task[Connection]] = {}
        self._closed = False

    def __len__(self) -> int:
        return len(self._connections)

    def get_nowait(self, address: str) -> Connection | None:
        """The open connection to ``address``, or None (then use :meth:`get`)."""
        connection = self._connections.get(address)
        if connection is None or connection.closed or self._closed:
            return None
        self._connections.move_to_end(address)
        return connection

    async def get(self, address: str) -> Connection:
        """The open connection to ``address``, connecting if there is none."""
        if self._closed:
            raise UsageError("the pool is closed")
        connection = self._connections.get(address)
        if connection is not None and not connection.closed:
            self._connections.move_to_end(address)
            return connection
        task = self._connecting.get(address)
        if task is None:
            self._make_room()
            task = asyncio.get_running_loop().create_task(self._open(address))
            task.add_done_callback(_consume_exception)
            self._connecting[address] = task
        # One caller giving up must not cancel the connect the others wait for.
        return await asyncio.shield(task)

    async def _get_within(self, address: str,
                          timeout_s: float | None) -> tuple[Connection, float | None]:
        """The connection to ``address``, and what is left of ``timeout_s``: the
        call's timeout bounds connecting too, so a caller that tries members in
        turn (meta clients) moves on from a silent one within its own budget
        instead of waiting out ``connect_timeout_s``."""
        connection = self.get_nowait(address)
        if connection is not None:
            return connection, timeout_s  # the common case: no wrapping, no task
        if timeout_s is None:
            return await self.get(address), None
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow
            # the caller's cancellation when the connect finishes at the same
            # moment, and a cancelled reader then runs on (a stream reader's
            # close waited forever for its long-poll loop).
            async with asyncio.timeout(timeout_s):
                connection = await self.get(address)
        except TimeoutError:
            raise ConnectFailedError(
                f"connect to {address} did not finish within the call's {timeout_s:.1f}s"
            ) from None
        return connection, max(timeout_s - (loop.time() - started), MIN_CALL_TIMEOUT_S)

    async def call(
        self,
        address: str,
        request: Request[R],
        *,
        payload: BytesLike | None = None,
        timeout_s: float | None = None,
    ) -> R:
        connection, left_s = await self._get_within(address, timeout_s)
        return await connection.call(request, payload=payload, timeout_s=left_s)

    async def call_with_payload(
        self,
        address: str,
        request: Request[R],
        *,
        payload: BytesLike | None = None,
        timeout_s: float | None = None,
    ) -> tuple[R, memoryview]:
        connection, left_s = await self._get_within(address, timeout_s)
        return await connection.call_with_payload(request, payload=payload, timeout_s=left_s)

    async def close(self) -> None:
        """Close every connection; pending calls fail with ConnectionClosedError."""
        self._closed = True
        for task in self._connecting.values():
            task.cancel()
        connections = list(self._connections.values())
        self._connections.clear()
        await asyncio.gather(*(c.close() for c in connections), return_exceptions=True)

    async def _open(self, address: str) -> Connection:
        try:
            host, port = parse_address(address)
            connection = await connect(host, port, config=self.config, security=self.security)
            if self._closed:
                connection.close_nowait()
                raise UsageError("the pool is closed")
            self._connections[address] = connection
            return connection
        finally:
            del self._connecting[address]

    def _make_room(self) -> None:
        for address in [a for a, c in self._connections.items() if c.closed]:
            del self._connections[address]
        if len(self._connections) + len(self._connecting) < self.config.pool_max_connections:
            return
        for address, connection in self._connections.items():
            if connection.in_flight == 0:
                del self._connections[address]
                connection.close_nowait()
                log().debug("rpc_pool_evicted", peer=address)
                return
        raise TransientError(
            f"pool full: {self.config.pool_max_connections} connections, all busy; "
            "retry later or raise pool_max_connections"
        )


def _consume_exception(task: asyncio.Task[Connection]) -> None:
    if not task.cancelled():
        task.exception()  # the callers got it; do not log it as never retrieved
