"""The recovery role of a bookie node: an auditor candidate and a replication
worker, sharing one meta session (see docs/recovery.md)."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable, Sequence

from quorumlog.clock import SYSTEM_CLOCK, Clock
from quorumlog.errors import QuorumlogError
from quorumlog.ledger import LedgerClient
from quorumlog.log import get_logger
from quorumlog.recovery._auditor import Auditor
from quorumlog.recovery._check import ReplicaChecker
from quorumlog.recovery._config import RecoveryConfig
from quorumlog.recovery._session import RecoverySession
from quorumlog.recovery._store import RecoveryMeta
from quorumlog.recovery._worker import ReplicationWorker

_log = get_logger(__name__)


class RecoveryService:
    def __init__(self, node_id: str, meta_addresses: Sequence[str],
                 config: RecoveryConfig) -> None:
        config.validate()
        self.node_id = node_id
        self._addresses = list(meta_addresses)
        self._config = config
        self._tasks: list[asyncio.Task[None]] = []
        self._client: LedgerClient | None = None
        self._session: RecoverySession | None = None

    async def start(self) -> None:
        client = await LedgerClient.connect(self._addresses)
        self._client = client
        self.start_with(client, client.meta)

    def start_with(self, client: LedgerClient, meta: RecoveryMeta, *,
                   clock: Clock = SYSTEM_CLOCK, rng: random.Random | None = None) -> None:
        """Run the auditor candidate, the worker and the check on ``client`` and
        ``meta`` (the simulator passes its own, with its virtual ``clock``)."""
        self._session = RecoverySession(meta, self._config.lease_ttl_ms)
        rng = rng or random.Random()
        auditor = Auditor(self.node_id, meta, self._session, self._config, clock)
        worker = ReplicationWorker(self.node_id, client, meta, self._session, self._config,
                                   clock=clock, rng=random.Random(rng.getrandbits(64)))
        checker = ReplicaChecker(client, meta, self._config, clock=clock,
                                 rng=random.Random(rng.getrandbits(64)))
        loop = asyncio.get_running_loop()

        async def audit() -> None:
            if await auditor.elected():
                await auditor.audit_once()

        async def work() -> None:
            await worker.work_once()

        async def check() -> None:
            if await auditor.elected():
                await checker.check_once()

        self._tasks = [
            loop.create_task(_every(self._config.audit_interval_ms, "audit", audit)),
            loop.create_task(_every(self._config.worker_poll_interval_ms, "replicate", work)),
        ]
        if self._config.check_interval_ms > 0:
            self._tasks.append(loop.create_task(_every(
                self._config.check_interval_ms, "check", check, first_after_interval=True)))

    @property
    def session_id(self) -> int:
        """The recovery session's id (0 before the first round, or after a loss)."""
        return self._session.session_id if self._session is not None else 0

    def abort(self) -> None:
        """Stop at once, as a SIGKILL would: the loops are cancelled where they
        stand, nothing is released; the session, the auditor lease and any task
        lock expire in meta after ``lease_ttl_ms`` (the simulator's node crash)."""
        for task in self._tasks:
            task.cancel()
        if self._session is not None:
            self._session.abort()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._session is not None:
            await self._session.close()
        if self._client is not None:
            await self._client.close()


async def _every(interval_ms: int, what: str, step: Callable[[], Awaitable[None]], *,
                 first_after_interval: bool = False) -> None:
    """Run ``step`` every ``interval_ms``; an operating error is logged and retried."""
    if first_after_interval:
        await asyncio.sleep(interval_ms / 1000)
    while True:
        try:
            await step()
        except QuorumlogError as exc:
            _log.warning("recovery_step_failed", step=what, error=exc.message)
        await asyncio.sleep(interval_ms / 1000)
