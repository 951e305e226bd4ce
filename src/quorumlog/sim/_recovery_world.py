"""The simulated world of an auto-recovery run: meta with sessions, and nodes.

- :class:`SimRecoveryMeta` is the ledger world's meta store
  (:class:`~quorumlog.sim._ledger_world.SimMetaStore`: atomic CAS with
  latency, bookie registrations while a bookie is up) plus what the auditor
  and the workers need from meta: ordered range reads, and sessions with a
  TTL owning ephemeral keys (the auditor lease, the task locks), which vanish
  when the session expires or is revoked - as in ``quorumlog.meta``, a write
  naming an expired session is refused.
- :class:`NodeMeta` is one recovery node's connection to it: when the node
  crashes, every call it makes from then on is cancelled (a SIGKILLed
  process sends nothing more; a request already on the way still lands).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from quorumlog.errors import QuorumlogError
from quorumlog.meta import KeyValue
from quorumlog.sim._ledger_world import SimMetaStore


@dataclass(frozen=True, slots=True)
class RangeKeys:
    """The ``kvs`` of a range read (``quorumlog.meta``'s ``RangeResult`` shape)."""

    kvs: list[KeyValue]


class SessionNotFoundError(QuorumlogError):
    """A write named a session that expired or was revoked (meta refuses it)."""


@dataclass(slots=True)
class _Session:
    ttl_ms: int
    expires_ms: int
    keys: set[str] = field(default_factory=set)


class SimRecoveryMeta(SimMetaStore):
    """Meta for a recovery run (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sessions: dict[int, _Session] = {}
        self._owner: dict[str, int] = {}  # ephemeral key -> session
        self._next_session = 1
        self.keepalives_blocked: set[int] = set()  # sessions whose keep-alives are lost
        self.on_write: list[Any] = []  # callbacks(key, old value or None, new value)

    def _now_ms(self) -> int:
        return int(self.network.loop.time() * 1000 + 1e-9)

    def _expire(self) -> None:
        now = self._now_ms()
        for session_id, session in list(self._sessions.items()):
            if session.expires_ms <= now:
                self._drop_session(session_id, "expired")

    def _drop_session(self, session_id: int, why: str) -> None:
        session = self._sessions.pop(session_id)
        for key in sorted(session.keys):
            if self._owner.get(key) == session_id:
                del self._owner[key]
                self._data.pop(key, None)
        self.tracer.event(self._now_ms(), f"META session {session_id} {why}; "
                                          f"keys gone: {sorted(session.keys)}")

    def _write(self, key: str, value: bytes, current: tuple[bytes, int, int, int] | None) -> None:
        for callback in self.on_write:
            callback(key, current[0] if current else None, value)
        super()._write(key, value, current)

    async def get(self, key: str) -> KeyValue | None:
        self._expire()
        return await super().get(key)

    async def cas(self, key: str, expected_version: int, value: bytes, *,
                  session_id: int = 0) -> bool:
        await self._latency()
        self._expire()
        if session_id and session_id not in self._sessions:
            await self._latency()
            raise SessionNotFoundError(f"session {session_id} does not exist (expired or "
                                       "revoked); create a new session")
        current = self._data.get(key)
        ok = (current[1] if current else 0) == expected_version
        if ok:
            self._write(key, value, current)
            old_owner = self._owner.pop(key, None)
            if old_owner is not None and old_owner in self._sessions:
                self._sessions[old_owner].keys.discard(key)
            if session_id:
                self._owner[key] = session_id
                self._sessions[session_id].keys.add(key)
        await self._latency()
        return ok

    async def list_keys(self, prefix: str, *, limit: int = 0) -> list[KeyValue]:
        self._expire()
        return await super().list_keys(prefix, limit=limit)

    async def range(self, key: str, *, end: str = "", limit: int = 0) -> tuple[RangeKeys, int]:
        await self._latency()
        self._expire()
        keys = [k for k in sorted(self._data) if key <= k < end] if end else (
            [key] if key in self._data else [])
        kvs = [kv for k in keys if (kv := self._kv(k)) is not None]
        await self._latency()
        return RangeKeys(kvs[:limit] if limit else kvs), self._revision

    async def delete(self, key: str, *, prefix: bool = False) -> int:
        self._expire()
        count = await super().delete(key, prefix=prefix)
        for gone in [k for k in self._owner if k not in self._data]:
            session = self._sessions.get(self._owner.pop(gone))
            if session is not None:
                session.keys.discard(gone)
        return count

    async def create_session(self, ttl_ms: int) -> int:
        await self._latency()
        session_id = self._next_session
        self._next_session += 1
        self._sessions[session_id] = _Session(ttl_ms, self._now_ms() + ttl_ms)
        await self._latency()
        return session_id

    async def keepalive(self, session_id: int) -> bool:
        await self._latency()
        self._expire()
        session = self._sessions.get(session_id)
        if session is not None and session_id not in self.keepalives_blocked:
            session.expires_ms = self._now_ms() + session.ttl_ms
        await self._latency()
        return session is not None

    async def revoke_session(self, session_id: int, *,
                             deadline_s: float | None = None) -> None:
        await self._latency()
        if session_id in self._sessions:
            self._drop_session(session_id, "revoked")
        await self._latency()

    def put_now(self, key: str, value: bytes) -> None:
        """Write ``key`` at once (the setup's view: no latency)."""
        self._write(key, value, self._data.get(key))

    def values(self, prefix: str) -> dict[str, bytes]:
        """Keys under ``prefix`` as stored now (no latency; for the checker)."""
        return {k: v[0] for k, v in sorted(self._data.items()) if k.startswith(prefix)}


class NodeMeta:
    """One recovery node's view of meta: every call fails as cancelled once the
    node is dead (see the module docstring)."""

    def __init__(self, meta: SimRecoveryMeta) -> None:
        self._meta = meta
        self.alive = True

    def _check(self) -> None:
        if not self.alive:
            raise asyncio.CancelledError

    async def get(self, key: str) -> KeyValue | None:
        self._check()
        return await self._meta.get(key)

    async def cas(self, key: str, expected_version: int, value: bytes, *,
                  session_id: int = 0) -> bool:
        self._check()
        return await self._meta.cas(key, expected_version, value, session_id=session_id)

    async def next_id(self, name: str, count: int = 1) -> int:
        self._check()
        return await self._meta.next_id(name, count)

    async def list_keys(self, prefix: str, *, limit: int = 0) -> list[KeyValue]:
        self._check()
        return await self._meta.list_keys(prefix, limit=limit)

    async def range(self, key: str, *, end: str = "", limit: int = 0) -> tuple[RangeKeys, int]:
        self._check()
        return await self._meta.range(key, end=end, limit=limit)

    async def delete(self, key: str, *, prefix: bool = False) -> int:
        self._check()
        return await self._meta.delete(key, prefix=prefix)

    async def create_session(self, ttl_ms: int) -> int:
        self._check()
        return await self._meta.create_session(ttl_ms)

    async def keepalive(self, session_id: int) -> bool:
        self._check()
        return await self._meta.keepalive(session_id)

    async def revoke_session(self, session_id: int, *,
                             deadline_s: float | None = None) -> None:
        self._check()
        await self._meta.revoke_session(session_id, deadline_s=deadline_s)
