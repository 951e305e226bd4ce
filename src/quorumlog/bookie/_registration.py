"""A bookie's registration in meta: an ephemeral key kept alive by a session.

``/bookies/available/<bookie id>`` holds a msgpack ``BookieRegistration``
(id = the rpc address, labels, read-only state, the instance id of the
bookie's cookie) and is bound to a meta
session with a TTL. A task keeps the session alive (a keep-alive every third
of the TTL). The bookie counts as registered from the moment the key is
written until either

- a keep-alive answers that the session is gone (expired or revoked), or
- no keep-alive has succeeded for a whole TTL (meta unreachable: the session
  may have expired there without us hearing it),

and then refuses adds until a keep-alive confirms the session again or, once
meta answers that it is gone, a new session is registered. An unconfirmed
session is not given up: revoking it would delete the key while meta may still
hold it (a meta leader cut off by a partition leaves every bookie unconfirmed
for an election), and the bookie would vanish from the candidates of every
ensemble change in the meantime.
Read-only changes are published by rewriting the key under the same session.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from quorumlog.clock import SYSTEM_CLOCK, Clock
from quorumlog.errors import QuorumlogError
from quorumlog.log import get_logger
from quorumlog.meta import CLOSE_REVOKE_DEADLINE_S, MetaClient
from quorumlog.proto import BOOKIE_REGISTRATIONS_PREFIX, BOOKIE_REGISTRY_PREFIX, BookieRegistration

_log = get_logger(__name__)

# Deadline of one meta operation made by the registration task; keep-alives
# must not wait longer than the TTL they protect.
OPERATION_DEADLINE_FRACTION = 0.5


def registration_key(bookie_id: str) -> str:
    return f"{BOOKIE_REGISTRY_PREFIX}{bookie_id}"


class Registration:
    """Keeps one bookie registered; ``registered`` is what adds check."""

    def __init__(
        self,
        meta_addresses: list[str],
        *,
        bookie_id: str,
        instance_id: str,
        labels: dict[str, str],
        ttl_ms: int,
        retry_ms: int,
        read_only: Callable[[], bool],
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._clock = clock
        self._meta = MetaClient(meta_addresses,
                                deadline_s=ttl_ms / 1000 * OPERATION_DEADLINE_FRACTION)
        self.bookie_id = bookie_id
        self.instance_id = instance_id
        self.key = registration_key(bookie_id)
        self._labels = dict(labels)
        self._ttl_s = ttl_ms / 1000
        self._retry_s = retry_ms / 1000
        self._read_only = read_only
        self._session_id = 0
        self._published_read_only: bool | None = None
        self._last_keepalive = 0.0
        self._registered = False
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self._confirmed = asyncio.Event()  # set by each registration and keep-alive
        self._closed = False
        self.registrations = 0  # how many times a new session was registered

    @property
    def registered(self) -> bool:
        # Without a keep-alive for a whole TTL, meta may have expired us.
        return self._registered and self._clock.monotonic_s() - self._last_keepalive < self._ttl_s

    @property
    def session_id(self) -> int:
        return self._session_id

    async def wait_registered(self) -> None:
        """Wait until :attr:`registered` (woken by registrations and keep-alives)."""
        while not self.registered:
            self._confirmed.clear()
            await self._confirmed.wait()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def read_only_changed(self) -> None:
        """Publish the read-only flag again (called when it flips)."""
        self._changed.set()

    async def close(self) -> None:
        """Stop keeping the session alive and revoke it (the key vanishes at once).

        Idempotent: the node process closes the registration before its rpc
        server (meta may be served by the same process), and again on close.
        """
        if self._closed:
            return
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._registered = False
        if self._session_id:
            # Best effort: without a meta quorum (every node stopping) the
            # session's lease ends it instead; a stop must not wait for meta.
            with contextlib.suppress(QuorumlogError):
                await self._meta.revoke_session(self._session_id,
                                                deadline_s=CLOSE_REVOKE_DEADLINE_S)
        await self._meta.close()

    # ------------------------------------------------------------------ task

    async def _run(self) -> None:
        while True:
            try:
                await self._register()
                await self._keep_alive()
            except QuorumlogError as exc:
                _log.warning("bookie_registration_failed", bookie=self.bookie_id,
                             error=exc.message)
            except Exception:  # never let the registration task die: retry
                _log.exception("bookie_registration_error", bookie=self.bookie_id)
            self._registered = False
            await asyncio.sleep(self._retry_s)

    async def _register(self) -> None:
        """A new session, then the key under it; the old session is revoked first."""
        self._registered = False
        old, self._session_id = self._session_id, 0
        if old:
            with contextlib.suppress(QuorumlogError):
                await self._meta.revoke_session(old)
        started = self._clock.monotonic_s()
        session_id = await self._meta.create_session(int(self._ttl_s * 1000))
        self._session_id = session_id
        # Counted before the key appears: the auditor must never miss a return.
        await self._meta.put(f"{BOOKIE_REGISTRATIONS_PREFIX}{self.bookie_id}", b"")
        await self._publish()
        self._last_keepalive = started  # the session's TTL started no later than this
        self._registered = True
        self._confirmed.set()
        self.registrations += 1
        _log.info("bookie_registered", bookie=self.bookie_id, session=session_id,
                  read_only=self._published_read_only)

    async def _publish(self) -> None:
        read_only = self._read_only()
        value = BookieRegistration(id=self.bookie_id, address=self.bookie_id,
                                   labels=self._labels, read_only=read_only,
                                   instance_id=self.instance_id).encode()
        await self._meta.put(self.key, value, session_id=self._session_id)
        self._published_read_only = read_only

    async def _keep_alive(self) -> None:
        """Until the session is lost: keep-alives, and republish read-only changes."""
        interval = self._ttl_s / 3
        unconfirmed = False  # logged once per stretch without a keep-alive
        while True:
            # Due a third of a TTL after the last successful keep-alive (or the
            # session's creation), however long publishing took.
            wait_s = self._last_keepalive + interval - self._clock.monotonic_s()
            if wait_s > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait_s):
                        await self._changed.wait()
            self._changed.clear()
            sent = self._clock.monotonic_s()
            try:
                alive = await self._meta.keepalive(self._session_id)
            except QuorumlogError as exc:
                if not self.registered and not unconfirmed:
                    unconfirmed = True
                    _log.warning("bookie_session_unconfirmed", bookie=self.bookie_id,
                                 session=self._session_id,
                                 reason=f"no keep-alive for a TTL: {exc.message}")
                await asyncio.sleep(self._retry_s)
                continue
            if not alive:
                _log.warning("bookie_session_lost", bookie=self.bookie_id,
                             reason="meta says the session expired")
                self._registered = False
                return
            self._last_keepalive = sent
            if unconfirmed:
                unconfirmed = False
                _log.info("bookie_session_confirmed", bookie=self.bookie_id,
                          session=self._session_id)
            self._confirmed.set()
            if self._read_only() != self._published_read_only:
                await self._publish()
