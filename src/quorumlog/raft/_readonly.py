"""ReadIndex bookkeeping of a leader in ``safe`` mode (etcd readOnly).

A read request records the commit index at arrival; the leader then sends a
heartbeat carrying the request's context. When a quorum answers that
heartbeat, the leader was still the leader when the request arrived, so the
recorded index is safe to read at. Requests are confirmed in arrival order: a
confirmation of a later request confirms every earlier one.
"""

from __future__ import annotations

from collections import deque

from quorumlog.errors import invariant


class ReadIndexStatus:
    __slots__ = ("acks", "context", "index", "requester")

    def __init__(self, index: int, requester: int, context: bytes) -> None:
        self.index = index
        self.requester = requester
        self.context = context
        self.acks: dict[int, bool] = {}


class ReadOnly:
    __slots__ = ("_max_pending", "_pending", "_queue")

    def __init__(self, max_pending: int) -> None:
        self._max_pending = max_pending
        self._pending: dict[bytes, ReadIndexStatus] = {}
        self._queue: deque[bytes] = deque()

    def full(self) -> bool:
        return len(self._queue) >= self._max_pending

    def contains(self, context: bytes) -> bool:
        return context in self._pending

    def add_request(self, index: int, requester: int, context: bytes) -> None:
        invariant(context not in self._pending, "read index context already pending")
        invariant(not self.full(), "read index queue full")
        self._pending[context] = ReadIndexStatus(index, requester, context)
        self._queue.append(context)

    def recv_ack(self, node_id: int, context: bytes) -> dict[int, bool] | None:
        status = self._pending.get(context)
        if status is None:
            return None
        status.acks[node_id] = True
        return status.acks

    def advance(self, context: bytes) -> list[ReadIndexStatus]:
        """Pop every request up to and including ``context``."""
        if context not in self._pending:
            return []
        released: list[ReadIndexStatus] = []
        while self._queue:
            ctx = self._queue.popleft()
            released.append(self._pending.pop(ctx))
            if ctx == context:
                break
        return released

    def last_pending_context(self) -> bytes:
        return self._queue[-1] if self._queue else b""

    def pending_count(self) -> int:
        return len(self._queue)
