"""Session deadlines, kept by the leader only (as etcd's lessor).

The state machine knows which sessions exist and their TTL, never when they
expire: expiry depends on a clock, and the log must stay a pure function. The
leader keeps deadlines here, refreshed by client keep-alives, and proposes
``RevokeSession`` for the expired ones. A new leader does not know when the old
one last heard a keep-alive, so on promotion it grants every session a full
TTL from now: expiry may come late after a leader change, never early.
"""

from __future__ import annotations

import heapq


class LeaseKeeper:
    """Deadlines of live sessions on the current leader; times in ms."""

    def __init__(self) -> None:
        self._deadline_ms: dict[int, int] = {}
        self._ttl_ms: dict[int, int] = {}
        self._heap: list[tuple[int, int]] = []  # (deadline, session); stale rows skipped
        # Reported by expired() and not yet revoked: a keep-alive is too late for
        # them (the revoke may already be in the log), so it is refused rather
        # than answered "alive" for a session whose keys are about to vanish.
        self._expiring: set[int] = set()
        self.active = False

    def promote(self, now_ms: int, sessions: dict[int, int]) -> None:
        """Become the keeper: every session gets a full TTL from ``now_ms``."""
        self.active = True
        self._deadline_ms.clear()
        self._expiring.clear()
        self._ttl_ms = dict(sessions)
        self._heap = []
        for session_id, ttl_ms in sorted(sessions.items()):
            self._set(session_id, now_ms + ttl_ms)

    def demote(self) -> None:
        self.active = False
        self._deadline_ms.clear()
        self._expiring.clear()
        self._ttl_ms.clear()
        self._heap = []

    def created(self, session_id: int, ttl_ms: int, now_ms: int) -> None:
        if self.active:
            self._ttl_ms[session_id] = ttl_ms
            self._set(session_id, now_ms + ttl_ms)

    def revoked(self, session_id: int) -> None:
        self._deadline_ms.pop(session_id, None)
        self._ttl_ms.pop(session_id, None)
        self._expiring.discard(session_id)

    def keepalive(self, session_id: int, now_ms: int) -> int | None:
        """Refresh a session; returns its TTL, or None if unknown/expired here
        (past its deadline counts as expired, swept or not)."""
        ttl = self._ttl_ms.get(session_id)
        if not self.active or ttl is None or session_id in self._expiring:
            return None
        if self._deadline_ms.get(session_id, now_ms + 1) <= now_ms:
            return None
        self._set(session_id, now_ms + ttl)
        return ttl

    def expired(self, now_ms: int) -> list[int]:
        """Sessions past their deadline (each reported until revoked)."""
        out: list[int] = []
        while self._heap and self._heap[0][0] <= now_ms:
            deadline, session_id = heapq.heappop(self._heap)
            if self._deadline_ms.get(session_id) == deadline:
                out.append(session_id)
                self._expiring.add(session_id)
                # keep reporting until the revoke applies: re-arm shortly after
                self._set(session_id, now_ms + 1)
        return sorted(out)

    def remaining_ms(self, session_id: int, now_ms: int) -> int | None:
        deadline = self._deadline_ms.get(session_id)
        return None if deadline is None else max(0, deadline - now_ms)

    def _set(self, session_id: int, deadline_ms: int) -> None:
        self._deadline_ms[session_id] = deadline_ms
        heapq.heappush(self._heap, (deadline_ms, session_id))
