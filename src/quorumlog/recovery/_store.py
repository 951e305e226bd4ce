"""The meta operations auto-recovery needs, as a protocol.

``quorumlog.meta.MetaClient`` has them all; the simulator passes its own
store (``quorumlog.sim``'s recovery world) so that the auditor, the workers
and the check run unchanged against simulated meta, bookies and time.
"""

from __future__ import annotations

from typing import Any, Protocol


class RecoveryMeta(Protocol):
    """Keys with versions and compare-and-swap, ordered range reads, and
    sessions owning ephemeral keys (the auditor lease, the task locks)."""

    async def get(self, key: str) -> Any: ...  # KeyValue | None

    async def cas(self, key: str, expected_version: int, value: bytes, *,
                  session_id: int = 0) -> bool: ...

    async def next_id(self, name: str, count: int = 1) -> int: ...

    async def list_keys(self, prefix: str, *, limit: int = 0) -> list[Any]: ...

    async def range(self, key: str, *, end: str = "", limit: int = 0) -> tuple[Any, int]: ...

    async def delete(self, key: str, *, prefix: bool = False) -> int: ...

    async def create_session(self, ttl_ms: int) -> int: ...

    async def keepalive(self, session_id: int) -> bool: ...

    async def revoke_session(self, session_id: int, *,
                             deadline_s: float | None = None) -> None: ...
