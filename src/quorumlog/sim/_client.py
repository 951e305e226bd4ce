"""Simulated clients of the metadata service's state machine.

A client runs one operation at a time: put, get, CAS or delete on a small set
of keys (contention makes anomalies visible), as the real
:class:`~quorumlog.meta.MetaStateMachine` commands a meta client sends: a
:class:`~quorumlog.meta.Request` around a single-key transaction (a put; a
range read of the key; a compare of the value - or of version 0 for "absent" -
then a put; a delete). Before its first operation a client opens an
exactly-once session (``CreateSession``, through the log, as ``MetaClient``
does); every write then carries ``(session, seq, first_outstanding_seq=seq)``,
so the state machine applies a write once however many attempts reach the
log, and refuses a late copy of an operation the client has moved on from.

It sends the request to the node it believes leads, follows ``leader_hint``
redirections, and on a per-attempt timeout tries the next node. When the
operation deadline passes without a definite answer, the operation is
recorded with an unknown outcome (``ret=None``) and the client moves on.

Every operation ends up in :attr:`SimClient.history` as a
:class:`~quorumlog.sim.Operation` for the linearizability checker; values
written are unique (``"<client>.<seq>"``).
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgspec

from quorumlog.errors import invariant
from quorumlog.meta import (
    Compare,
    CompareOp,
    CompareTarget,
    CreateSession,
    DeleteOp,
    ErrorResult,
    KeyValue,
    PutOp,
    RangeOp,
    RangeResult,
    Request,
    Result,
    SessionResult,
    Txn,
    TxnResult,
)
from quorumlog.sim._config import SimConfig
from quorumlog.sim._invariants import fail
from quorumlog.sim._linearizability import Operation, OpKind

CLIENT_ID_BASE = 1_000
"""Network endpoints of clients start here; Raft node ids stay below."""

CLIENT_REDIRECT_BACKOFF_MS = 5
"""Pause before retrying after a "not leader" answer, so a client never spins."""

CLIENT_SESSION_TTL_MS = 60_000
"""TTL of a client's exactly-once session; the simulator never expires sessions
(no lease keeper runs), the value only has to pass ``MetaLimits``."""

NO_LEADER = 0

_ENCODER = msgspec.msgpack.Encoder()

KvValue = str | None
ClientResult = Result | KeyValue | None
"""What a node answers: the state machine's result of an applied request, or,
for a ReadIndex get, the key's current KeyValue (None: absent)."""

class ClientOp(enum.StrEnum):
    OPEN_SESSION = "open-session"
    PUT = "put"
    GET = "get"
    CAS = "cas"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class ClientRequest:
    """One attempt of a client operation.

    ``payload`` is the encoded :class:`~quorumlog.meta.Request` that goes into
    the log; a ReadIndex get (``read_index``) is served from the state machine
    instead, by ``key``.
    """

    client_id: int
    seq: int
    op: ClientOp
    key: str
    payload: bytes
    read_index: bool = False
    value: KvValue = None
    expected: KvValue = None


@dataclass(frozen=True, slots=True)
class ClientResponse:
    client_id: int
    seq: int
    ok: bool  # False: this node cannot serve it (not the leader); try leader_hint
    result: ClientResult
    leader_hint: int = NO_LEADER


@dataclass(slots=True)
class _InFlight:
    request: ClientRequest
    call: float
    deadline_ms: int
    attempt_deadline_ms: int
    target: int
    redirected: bool = False


class SimClient:
    """One client; the simulator calls ``wake`` at ``wake_ms`` and delivers responses."""

    def __init__(
        self,
        client_id: int,
        rng: random.Random,
        config: SimConfig,
        stamp: Callable[[], float],
        trace: Callable[[str], None] | None = None,
    ) -> None:
        invariant(client_id >= CLIENT_ID_BASE, "client ids must not collide with node ids")
        self.client_id = client_id
        self.history: list[Operation] = []
        self.wake_ms = rng.randint(0, config.client_think_ms_max)
        self.completed = 0
        self.last_completed_ms = -1
        self._rng = rng
        self._config = config
        self._stamp = stamp
        self._trace = trace
        self._seq = 0
        self._session_id = 0  # 0: none yet, the next operation opens one
        self._leader_guess = NO_LEADER
        self._last_seen: dict[str, KvValue] = {}
        self._in_flight: _InFlight | None = None
        self._stopped = False

    @property
    def busy(self) -> bool:
        return self._in_flight is not None

    def stop(self) -> None:
        """Start no new operations (the one in flight still finishes)."""
        self._stopped = True

    def wake(self, now_ms: int, members: Sequence[int]) -> list[tuple[int, ClientRequest]]:
        """Start, retry or give up on an operation; returns (node, request) to send."""
        if now_ms < self.wake_ms:
            return []
        flight = self._in_flight
        if flight is None:
            return self._start(now_ms, members)
        if now_ms >= flight.deadline_ms:
            self._give_up(now_ms, flight)
            return []
        if not flight.redirected:
            flight.target = self._next_target(flight.target, members)
        return self._send(now_ms, flight)

    def on_response(self, now_ms: int, response: ClientResponse) -> None:
        flight = self._in_flight
        if flight is None or response.seq != flight.request.seq:
            return  # an answer to an attempt of an operation already finished
        if response.ok:
            self._finish(now_ms, flight, response.result)
            return
        flight.redirected = response.leader_hint != NO_LEADER
        if flight.redirected:
            flight.target = response.leader_hint
            self._leader_guess = response.leader_hint
        self.wake_ms = min(self.wake_ms, now_ms + CLIENT_REDIRECT_BACKOFF_MS)

    def finish_run(self) -> None:
        """The run ended: an operation still in flight has an unknown outcome."""
        if self._in_flight is not None:
            self._record(self._in_flight, None, ret=None)
            self._in_flight = None

    # -- internals --------------------------------------------------------------

    def _start(self, now_ms: int, members: Sequence[int]) -> list[tuple[int, ClientRequest]]:
        if self._stopped or not members:
            self.wake_ms = now_ms + self._config.tick_interval_ms
            return []
        self._seq += 1
        request = self._new_request()
        target = self._leader_guess
        if (
            target not in members
            or self._rng.random() < self._config.client_random_target_probability
        ):
            target = members[self._rng.randrange(len(members))]
        flight = _InFlight(
            request=request,
            call=self._stamp(),
            deadline_ms=now_ms + self._config.client_operation_deadline_ms,
            attempt_deadline_ms=now_ms,
            target=target,
            redirected=True,
        )
        self._in_flight = flight
        if self._trace is not None:
            self._trace(f"client {self.client_id} starts {_describe(request)}")
        return self._send(now_ms, flight)

    def _new_request(self) -> ClientRequest:
        config, rng, seq = self._config, self._rng, self._seq
        if not self._session_id:
            payload = _ENCODER.encode(
                Request(command=CreateSession(ttl_ms=CLIENT_SESSION_TTL_MS)))
            return ClientRequest(self.client_id, seq, ClientOp.OPEN_SESSION, "", payload)
        key = f"k{rng.randrange(config.keys)}"
        roll = rng.random()
        value = f"{self.client_id}.{seq}"
        if roll < config.client_get_probability:
            if rng.random() < config.read_index_probability:
                return ClientRequest(self.client_id, seq, ClientOp.GET, key, b"", read_index=True)
            txn = Txn(success=(RangeOp(key=key),))
            return ClientRequest(self.client_id, seq, ClientOp.GET, key, self._encode(txn))
        roll -= config.client_get_probability
        if roll < config.client_cas_probability:
            expected = self._last_seen.get(key)
            compare = (
                Compare(key=key, target=CompareTarget.VERSION, op=CompareOp.EQUAL, version=0)
                if expected is None
                else Compare(key=key, target=CompareTarget.VALUE, op=CompareOp.EQUAL,
                             value=expected.encode())
            )
            txn = Txn(compares=(compare,), success=(PutOp(key=key, value=value.encode()),))
            return ClientRequest(self.client_id, seq, ClientOp.CAS, key, self._encode(txn),
                                 value=value, expected=expected)
        roll -= config.client_cas_probability
        if roll < config.client_delete_probability:
            txn = Txn(success=(DeleteOp(key=key),))
            return ClientRequest(self.client_id, seq, ClientOp.DELETE, key, self._encode(txn))
        txn = Txn(success=(PutOp(key=key, value=value.encode()),))
        return ClientRequest(self.client_id, seq, ClientOp.PUT, key, self._encode(txn),
                             value=value)

    def _encode(self, txn: Txn) -> bytes:
        """A write of this client's session: one operation outstanding at a time, so
        every earlier answer is acknowledged (or given up on) and may be forgotten."""
        return _ENCODER.encode(Request(
            session_id=self._session_id, seq=self._seq, first_outstanding_seq=self._seq,
            command=txn))

    def _next_target(self, current: int, members: Sequence[int]) -> int:
        if not members:
            return current
        if current in members:
            return members[(members.index(current) + 1) % len(members)]
        return members[self._rng.randrange(len(members))]

    def _send(self, now_ms: int, flight: _InFlight) -> list[tuple[int, ClientRequest]]:
        flight.redirected = False
        flight.attempt_deadline_ms = now_ms + self._config.client_attempt_timeout_ms
        self.wake_ms = min(flight.attempt_deadline_ms, flight.deadline_ms)
        return [(flight.target, flight.request)]

    def _finish(self, now_ms: int, flight: _InFlight, result: ClientResult) -> None:
        request = flight.request
        if isinstance(result, ErrorResult):
            fail("client-result", f"client {self.client_id} {_describe(request)}: the state "
                 f"machine answered {result.code}: {result.message}")
        if request.op is ClientOp.OPEN_SESSION:
            _expect(isinstance(result, SessionResult), request, result)
            self._session_id = result.session_id if isinstance(result, SessionResult) else 0
            if self._trace is not None:
                self._trace(f"client {self.client_id} opened session {self._session_id}")
        else:
            outcome: object = _outcome(request, result)
            if request.op is ClientOp.GET:
                self._last_seen[request.key] = outcome if isinstance(outcome, str) else None
            elif request.op is ClientOp.DELETE:
                self._last_seen[request.key] = None
            elif request.op is ClientOp.PUT or outcome is True:
                self._last_seen[request.key] = request.value
            self._record(flight, outcome, ret=self._stamp())
            self.completed += 1
        self._in_flight = None
        self.last_completed_ms = now_ms
        self.wake_ms = now_ms + self._rng.randint(0, self._config.client_think_ms_max)

    def _give_up(self, now_ms: int, flight: _InFlight) -> None:
        if flight.request.op is not ClientOp.OPEN_SESSION:
            self._record(flight, None, ret=None)
        self._in_flight = None
        self.wake_ms = now_ms + self._rng.randint(0, self._config.client_think_ms_max)

    def _record(self, flight: _InFlight, outcome: object, *, ret: float | None) -> None:
        request = flight.request
        if request.op is ClientOp.PUT:
            operation = Operation(
                self.client_id, OpKind.PUT, request.key, request.value, None, flight.call, ret
            )
        elif request.op is ClientOp.DELETE:
            operation = Operation(
                self.client_id, OpKind.DELETE, request.key, None, None, flight.call, ret
            )
        elif request.op is ClientOp.GET:
            operation = Operation(
                self.client_id, OpKind.GET, request.key, None, outcome, flight.call, ret
            )
        else:
            operation = Operation(
                self.client_id, OpKind.CAS, request.key, (request.expected, request.value),
                outcome if ret is not None else None, flight.call, ret,
            )
        self.history.append(operation)
        if self._trace is not None:
            text = "unknown outcome" if ret is None else f"-> {outcome!r}"
            self._trace(f"client {self.client_id} done {_describe(request)} {text}")


def _outcome(request: ClientRequest, result: ClientResult) -> object:
    """What an answer means for the register model: the value read (None:
    absent), whether a CAS succeeded, or None for a put or delete."""
    if request.read_index:
        if isinstance(result, KeyValue):
            return result.value.decode()
        _expect(result is None, request, result)
        return None
    if not isinstance(result, TxnResult):
        _expect(False, request, result)
        return None
    if request.op is ClientOp.CAS:
        return result.succeeded
    if request.op is ClientOp.GET:
        ranged = result.results[0]
        if not isinstance(ranged, RangeResult):
            _expect(False, request, ranged)
            return None
        return ranged.kvs[0].value.decode() if ranged.kvs else None
    return None


def _expect(condition: bool, request: ClientRequest, answer: object) -> None:
    """invariant(), with the message formatted only when it fails (per operation)."""
    if not condition:
        invariant(False, f"{_describe(request)} answered {answer!r}")


def _describe(request: ClientRequest) -> str:
    seq = f"seq={request.seq}"
    if request.op is ClientOp.OPEN_SESSION:
        return f"{seq} open session"
    if request.op is ClientOp.PUT:
        return f"{seq} put {request.key}={request.value}"
    if request.op is ClientOp.DELETE:
        return f"{seq} delete {request.key}"
    if request.op is ClientOp.GET:
        via = "read-index" if request.read_index else "log"
        return f"{seq} get {request.key} via {via}"
    return f"{seq} cas {request.key} {request.expected!r}->{request.value}"
