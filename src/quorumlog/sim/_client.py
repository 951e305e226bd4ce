"""Simulated clients of the replicated key-value store.

A client runs one operation at a time: put, get or CAS on a small set of keys
(contention makes anomalies visible). It sends the request to the node it
believes leads, follows ``leader_hint`` redirections, and on a per-attempt
timeout tries the next node. Every attempt of one operation carries the same
``(client_id, seq)``, so the state machine applies a write once however many
attempts reach the log. When the operation deadline passes without a definite
answer, the operation is recorded with an unknown outcome (``ret=None``) and
the client moves on.

Every operation ends up in :attr:`SimClient.history` as a
:class:`~quorumlog.sim.Operation` for the linearizability checker; values
written are unique (``"<client>.<seq>"``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from quorumlog.errors import invariant
from quorumlog.sim._config import SimConfig
from quorumlog.sim._kv import KvCommand, KvOp, KvResult, KvValue
from quorumlog.sim._linearizability import Operation, OpKind

CLIENT_ID_BASE = 1_000
"""Network endpoints of clients start here; Raft node ids stay below."""

CLIENT_REDIRECT_BACKOFF_MS = 5
"""Pause before retrying after a "not leader" answer, so a client never spins."""

NO_LEADER = 0


@dataclass(frozen=True, slots=True)
class ClientRequest:
    command: KvCommand
    read_index: bool  # serve a get through ReadIndex instead of the log

    @property
    def client_id(self) -> int:
        return self.command.client_id

    @property
    def seq(self) -> int:
        return self.command.seq


@dataclass(frozen=True, slots=True)
class ClientResponse:
    client_id: int
    seq: int
    ok: bool  # False: this node cannot serve it (not the leader); try leader_hint
    result: KvResult
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
        config, rng = self._config, self._rng
        key = f"k{rng.randrange(config.keys)}"
        roll = rng.random()
        value = f"{self.client_id}.{self._seq}"
        if roll < config.client_get_probability:
            command = KvCommand(self.client_id, self._seq, KvOp.GET, key)
            return ClientRequest(command, read_index=rng.random() < config.read_index_probability)
        if roll < config.client_get_probability + config.client_cas_probability:
            expected = self._last_seen.get(key)
            command = KvCommand(self.client_id, self._seq, KvOp.CAS, key, value, expected)
            return ClientRequest(command, read_index=False)
        command = KvCommand(self.client_id, self._seq, KvOp.PUT, key, value)
        return ClientRequest(command, read_index=False)

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

    def _finish(self, now_ms: int, flight: _InFlight, result: KvResult) -> None:
        command = flight.request.command
        if command.op is KvOp.GET:
            invariant(not isinstance(result, bool), "a get answered with a bool")
            self._last_seen[command.key] = None if isinstance(result, bool) else result
        elif command.op is KvOp.PUT or result is True:
            self._last_seen[command.key] = command.value
        self._record(flight, result, ret=self._stamp())
        self._in_flight = None
        self.completed += 1
        self.last_completed_ms = now_ms
        self.wake_ms = now_ms + self._rng.randint(0, self._config.client_think_ms_max)

    def _give_up(self, now_ms: int, flight: _InFlight) -> None:
        self._record(flight, None, ret=None)
        self._in_flight = None
        self.wake_ms = now_ms + self._rng.randint(0, self._config.client_think_ms_max)

    def _record(self, flight: _InFlight, result: KvResult, *, ret: float | None) -> None:
        command = flight.request.command
        if command.op is KvOp.PUT:
            operation = Operation(
                self.client_id, OpKind.PUT, command.key, command.value, None, flight.call, ret
            )
        elif command.op is KvOp.GET:
            operation = Operation(
                self.client_id, OpKind.GET, command.key, None, result, flight.call, ret
            )
        else:
            operation = Operation(
                self.client_id, OpKind.CAS, command.key, (command.expected, command.value),
                result if ret is not None else None, flight.call, ret,
            )
        self.history.append(operation)
        if self._trace is not None:
            outcome = "unknown outcome" if ret is None else f"-> {result!r}"
            self._trace(f"client {self.client_id} done {_describe(flight.request)} {outcome}")


def _describe(request: ClientRequest) -> str:
    command = request.command
    if command.op is KvOp.PUT:
        return f"seq={command.seq} put {command.key}={command.value}"
    if command.op is KvOp.GET:
        via = "read-index" if request.read_index else "log"
        return f"seq={command.seq} get {command.key} via {via}"
    return f"seq={command.seq} cas {command.key} {command.expected!r}->{command.value}"
