"""Exactly-once client sessions: the answers of writes a client may still retry.

After the Raft dissertation, section 6.3. A client (one ``MetaClient``, shared
by any number of concurrent callers) writes under a session it opened; every
write carries ``(session_id, seq, first_outstanding_seq)``. The table keeps,
per session, the encoded result of every applied write the client has not
acknowledged yet, so a retry of *any* outstanding write — not only the latest
— gets its first result instead of being applied again. A client acknowledges
every answer below ``first_outstanding_seq``; those results are dropped, and
a request below that floor is refused (its answer was already delivered).

Invariant: a seq at or above the floor that has no kept result was never
applied. Results are dropped only below the floor or with the whole session,
so a retry never gets a wrong answer: it gets its result, or a clear error.

The table is part of the replicated state: it changes only in ``apply``
(log order), iterates only in insertion order and is in every snapshot, so
every member holds the same table. It is bounded in bytes:

* a result larger than ``client_response_bytes_max`` is answered once and
  kept as a ``response_not_kept`` error for retries;
* a session over ``client_session_bytes_max`` (a client that never
  acknowledges) is evicted;
* beyond ``client_sessions_bytes_max`` in all, the least recently used
  sessions are evicted.

An evicted or expired session answers every later request with
``session_expired`` and applies nothing; the client opens a new session.
Sessions live as long as the meta session (lease) they are opened with.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict

import msgspec

from quorumlog.errors import invariant
from quorumlog.meta._commands import ErrorResult, Request, Result

# Accounting for the byte bounds: the fixed cost of one session (id, floor,
# containers) and of one kept result (seq, dict and heap slots), on top of the
# encoded result itself. Deliberately rounded up: the bound is a budget.
SESSION_OVERHEAD_BYTES = 64
RESPONSE_OVERHEAD_BYTES = 32

# Codes of the errors a client can get from the table (see docs/meta.md).
SESSION_EXPIRED = "session_expired"
ALREADY_ACKNOWLEDGED = "already_acknowledged"
RESPONSE_NOT_KEPT = "response_not_kept"
BAD_SEQUENCE = "bad_sequence"

# Snapshot row of one session: (session id, floor, [(seq, encoded result)]).
SessionRow = tuple[int, int, list[tuple[int, bytes]]]


class _ClientSession:
    __slots__ = ("floor", "responses", "seqs", "size_bytes")

    def __init__(self, floor: int = 1) -> None:
        self.floor = floor  # every seq below it was acknowledged by the client
        self.responses: dict[int, bytes] = {}  # seq -> encoded Result
        self.seqs: list[int] = []  # min-heap of the keys of ``responses``
        self.size_bytes = SESSION_OVERHEAD_BYTES


class ClientSessionTable:
    """Per-session results of unacknowledged writes; see the module docstring."""

    def __init__(
        self, *, session_bytes_max: int, sessions_bytes_max: int, response_bytes_max: int
    ) -> None:
        invariant(
            0 < response_bytes_max <= session_bytes_max <= sessions_bytes_max,
            "need 0 < response_bytes_max <= session_bytes_max <= sessions_bytes_max",
        )
        self.session_bytes_max = session_bytes_max
        self.sessions_bytes_max = sessions_bytes_max
        self.response_bytes_max = response_bytes_max
        self._sessions: OrderedDict[int, _ClientSession] = OrderedDict()  # LRU first
        self.size_bytes = 0

    def __contains__(self, session_id: int) -> bool:
        return session_id in self._sessions

    def __len__(self) -> int:
        return len(self._sessions)

    def open(self, session_id: int) -> None:
        """A new session (its meta session was just created)."""
        invariant(session_id not in self._sessions, f"client session {session_id} exists")
        self._sessions[session_id] = _ClientSession()
        self.size_bytes += SESSION_OVERHEAD_BYTES
        self._enforce_total()

    def close(self, session_id: int) -> None:
        """Forget a session (its lease expired or it was revoked)."""
        session = self._sessions.pop(session_id, None)
        if session is not None:
            self.size_bytes -= session.size_bytes

    def answered(self, request: Request) -> Result | None:
        """The answer to a request that must not be applied, or None to apply it.

        The caller checked that the session exists.
        """
        session = self._sessions[request.session_id]
        if not 1 <= request.first_outstanding_seq <= request.seq:
            return ErrorResult(
                code=BAD_SEQUENCE,
                message=f"session {request.session_id}: first_outstanding_seq "
                f"{request.first_outstanding_seq} must lie in [1, seq {request.seq}]; "
                "this is a client bug",
            )
        self._sessions.move_to_end(request.session_id)
        self._advance_floor(session, request.first_outstanding_seq)
        if request.seq < session.floor:
            return ErrorResult(
                code=ALREADY_ACKNOWLEDGED,
                message=f"session {request.session_id}: request seq {request.seq} is below "
                f"the acknowledged floor {session.floor}; the client already received "
                "its result, so this late copy was not applied",
            )
        cached = session.responses.get(request.seq)
        if cached is None:
            return None
        result: Result = _RESULT_DECODER.decode(cached)
        return result

    def store(self, request: Request, result: Result) -> None:
        """Keep the result of an applied request for its retries; enforce the bounds."""
        session = self._sessions.get(request.session_id)
        if session is None:
            return  # the request revoked its own session
        invariant(request.seq not in session.responses, "a request is applied only once")
        encoded = _ENCODER.encode(result)
        if len(encoded) > self.response_bytes_max:
            encoded = _ENCODER.encode(ErrorResult(
                code=RESPONSE_NOT_KEPT,
                message=f"session {request.session_id}: request seq {request.seq} was "
                f"applied, but its result ({len(encoded)} bytes > client_response_bytes_max "
                f"{self.response_bytes_max}) was not kept for retries; read the keys it "
                "touched to learn the outcome",
            ))
        session.responses[request.seq] = encoded
        heapq.heappush(session.seqs, request.seq)
        size = len(encoded) + RESPONSE_OVERHEAD_BYTES
        session.size_bytes += size
        self.size_bytes += size
        if session.size_bytes > self.session_bytes_max:
            self.close(request.session_id)
        self._enforce_total()

    def _advance_floor(self, session: _ClientSession, floor: int) -> None:
        if floor <= session.floor:
            return
        session.floor = floor
        while session.seqs and session.seqs[0] < floor:
            seq = heapq.heappop(session.seqs)
            size = len(session.responses.pop(seq)) + RESPONSE_OVERHEAD_BYTES
            session.size_bytes -= size
            self.size_bytes -= size

    def _enforce_total(self) -> None:
        while self.size_bytes > self.sessions_bytes_max and self._sessions:
            self.close(next(iter(self._sessions)))  # the least recently used

    # ----- snapshots ----------------------------------------------------------

    def snapshot(self) -> list[SessionRow]:
        """Every session in LRU order, its results in the order they were kept."""
        return [
            (sid, s.floor, list(s.responses.items())) for sid, s in self._sessions.items()
        ]

    def restore(self, rows: list[SessionRow]) -> None:
        self._sessions = OrderedDict()
        self.size_bytes = 0
        for session_id, floor, responses in rows:
            session = _ClientSession(floor)
            for seq, encoded in responses:
                session.responses[seq] = encoded
                session.size_bytes += len(encoded) + RESPONSE_OVERHEAD_BYTES
            session.seqs = sorted(session.responses)  # a sorted list is a valid heap
            self._sessions[session_id] = session
            self.size_bytes += session.size_bytes


_ENCODER = msgspec.msgpack.Encoder()
_RESULT_DECODER = msgspec.msgpack.Decoder(Result)
