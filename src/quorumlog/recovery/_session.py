"""A meta session owned by this node's recovery service: the auditor's lease
and the workers' task locks are ephemeral keys bound to it, so a SIGKILLed
node loses them when meta expires the session (``lease_ttl_ms``)."""

from __future__ import annotations

from quorumlog.meta import OwnedSession
from quorumlog.recovery._store import RecoveryMeta


class RecoverySession(OwnedSession):
    def __init__(self, meta: RecoveryMeta, ttl_ms: int) -> None:
        super().__init__(meta, ttl_ms, owner="recovery")
