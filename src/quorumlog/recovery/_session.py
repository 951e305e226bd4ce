"""A meta session owned by this node's recovery service: the auditor's lease
and the workers' task locks are ephemeral keys bound to it, so a SIGKILLed
node loses them when meta expires the session (``lease_ttl_ms``)."""

from __future__ import annotations

import asyncio
import contextlib

from quorumlog.errors import QuorumlogError
from quorumlog.log import get_logger
from quorumlog.meta import CLOSE_REVOKE_DEADLINE_S
from quorumlog.recovery._store import RecoveryMeta

_log = get_logger(__name__)

KEEPALIVES_PER_TTL = 3


class RecoverySession:
    def __init__(self, meta: RecoveryMeta, ttl_ms: int) -> None:
        self._meta = meta
        self._ttl_ms = ttl_ms
        self.session_id = 0
        self._task: asyncio.Task[None] | None = None

    async def current(self) -> int:
        """The live session id (a new session if the last one was lost)."""
        if not self.session_id:
            self.session_id = await self._meta.create_session(self._ttl_ms)
            _log.info("recovery_session_opened", session=self.session_id)
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
                _log.info("recovery_keepalive_failed", session=session_id, error=exc.message)
                continue
            if not alive and self.session_id == session_id:
                _log.warning("recovery_session_lost", session=session_id)
                self.session_id = 0  # its locks and the auditor lease are gone with it

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
            with contextlib.suppress(QuorumlogError):  # else the lease ends it
                await self._meta.revoke_session(self.session_id,
                                                deadline_s=CLOSE_REVOKE_DEADLINE_S)
            self.session_id = 0
