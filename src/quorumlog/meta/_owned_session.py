"""A meta session a node's background service owns and keeps alive.

The service's leases (an elected role such as the recovery auditor or the
stream trimmer) and locks are ephemeral keys bound to it, so a SIGKILLed node
loses them when meta expires the session (its TTL); a clean stop revokes it.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Protocol

from quorumlog.errors import QuorumlogError
from quorumlog.log import get_logger
from quorumlog.meta._client import CLOSE_REVOKE_DEADLINE_S

_log = get_logger(__name__)

KEEPALIVES_PER_TTL = 3


class SessionMeta(Protocol):
    """What an owned session needs of a meta client."""

    async def get(self, key: str) -> Any: ...  # KeyValue | None

    async def cas(self, key: str, expected_version: int, value: bytes, *,
                  session_id: int = 0) -> bool: ...

    async def create_session(self, ttl_ms: int) -> int: ...

    async def keepalive(self, session_id: int) -> bool: ...

    async def revoke_session(self, session_id: int, *,
                             deadline_s: float | None = None) -> None: ...


class OwnedSession:
    """``owner`` names the service in its log lines (``meta_session_opened`` ...)."""

    def __init__(self, meta: SessionMeta, ttl_ms: int, *, owner: str) -> None:
        self._meta = meta
        self._ttl_ms = ttl_ms
        self.owner = owner
        self.session_id = 0
        self._task: asyncio.Task[None] | None = None
        self._held: dict[str, int] = {}  # key -> the session it was taken in

    async def hold(self, key: str, value: bytes) -> bool:
        """Hold (or take) the ephemeral ``key`` with ``value``: an elected role's
        lease. False while another owner holds it; a lease held in a session that
        was lost is taken again once meta has removed it with that session."""
        session_id = await self.current()
        if self._held.get(key) == session_id:
            current = await self._meta.get(key)
            if current is not None and current.value == value:
                return True
        if await self._meta.cas(key, 0, value, session_id=session_id):
            self._held[key] = session_id
            _log.info("meta_lease_taken", owner=self.owner, key=key, session=session_id)
            return True
        return False

    async def current(self) -> int:
        """The live session id (a new session if the last one was lost)."""
        if not self.session_id:
            self.session_id = await self._meta.create_session(self._ttl_ms)
            _log.info("meta_session_opened", owner=self.owner, session=self.session_id)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._keep_alive())
        return self.session_id

    async def _keep_alive(self) -> None:
        while True:
            await asyncio.sleep(self._ttl_ms / 1000 / KEEPALIVES_PER_TTL)
            session_id = self.session_id
            if not session_id:
                continue
            try:
                alive = await self._meta.keepalive(session_id)
            except QuorumlogError as exc:
                _log.info("meta_session_keepalive_failed", owner=self.owner, session=session_id,
                          error=exc.message)
                continue
            if not alive and self.session_id == session_id:
                _log.warning("meta_session_lost", owner=self.owner, session=session_id)
                self.session_id = 0  # its ephemeral keys are gone with it

    def abort(self) -> None:
        """Stop the keep-alives without revoking: the session expires in meta."""
        if self._task is not None:
            self._task.cancel()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.session_id:
            with contextlib.suppress(QuorumlogError):  # else the TTL ends it
                await self._meta.revoke_session(self.session_id,
                                                deadline_s=CLOSE_REVOKE_DEADLINE_S)
            self.session_id = 0
