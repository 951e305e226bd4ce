"""The metadata service on a Raft group: rpc handlers on each member.

Writes (transactions, sessions, ids, compaction) are proposed to the group's
leader and answered with the state machine's result. Reads are linearizable by
default (a ReadIndex barrier on the leader, then a local read) or
serializable on any member on request. Watches are long-polls by revision: a
client asks for the events of a key or prefix from revision ``r``; the member
answers at once if it has some, or parks the request until one applies or the
wait times out. Resuming after a reconnect is asking again from the last
revision seen + 1, on any member.

A member that is not the leader answers writes and linearizable reads with
NotLeaderError carrying the leader's address; clients follow it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, ClassVar

import msgspec

from quorumlog import rpc
from quorumlog.errors import QuorumlogError, UsageError
from quorumlog.log import get_logger
from quorumlog.meta._commands import (
    REQUEST_ENCODER,
    Command,
    Event,
    PutOp,
    RangeOp,
    RangeResult,
    Request,
    Result,
    RevokeSession,
    SessionResult,
    Txn,
)
from quorumlog.meta._leases import LeaseKeeper
from quorumlog.meta._state import CompactedError, MetaLimits, MetaStateMachine
from quorumlog.raft._driver import RaftHost
from quorumlog.raft._types import ConfChange, ConfChangeSingle, ConfChangeType, Role

META_GROUP_ID = 1
WATCH_WAIT_MS_MAX = 60_000  # a parked watch answers (maybe empty) within this
WATCH_EVENTS_MAX = 10_000  # events per watch response
_log = get_logger(__name__)


class MetaRequestFailedError(QuorumlogError):
    """The state machine refused a request (bad key, session gone, ...)."""

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code or "failed"


rpc.register_error(1100, CompactedError)
rpc.register_error(1101, MetaRequestFailedError, ("code",))


# ----- wire messages (type ids 1100-1199) -------------------------------------


class MetaWriteResponse(rpc.Message, frozen=True):
    type_id: ClassVar[int] = 1101
    result: bytes  # msgpack-encoded Result


class MetaWriteRequest(rpc.Request[MetaWriteResponse], frozen=True):
    type_id: ClassVar[int] = 1100
    request: bytes  # msgpack-encoded Request (client id, seq, command)


class MetaRangeResponse(rpc.Message, frozen=True):
    type_id: ClassVar[int] = 1103
    result: RangeResult
    revision: int


class MetaRangeRequest(rpc.Request[MetaRangeResponse], frozen=True):
    type_id: ClassVar[int] = 1102
    op: RangeOp
    serializable: bool = False


class MetaKeepAliveResponse(rpc.Message, frozen=True):
    type_id: ClassVar[int] = 1105
    ttl_ms: int  # 0: the session is gone


class MetaKeepAliveRequest(rpc.Request[MetaKeepAliveResponse], frozen=True):
    type_id: ClassVar[int] = 1104
    session_id: int


class MetaWatchResponse(rpc.Message, frozen=True):
    type_id: ClassVar[int] = 1107
    events: list[Event]
    revision: int  # the member's revision when answering: resume from revision + 1


class MetaWatchRequest(rpc.Request[MetaWatchResponse], frozen=True):
    type_id: ClassVar[int] = 1106
    key: str
    prefix: bool
    start_revision: int
    wait_ms: int


class MetaStatusResponse(rpc.Message, frozen=True):
    type_id: ClassVar[int] = 1109
    node_id: int
    role: str
    term: int
    leader: int
    commit_index: int
    applied_index: int
    revision: int
    voters: list[int]


class MetaStatusRequest(rpc.Request[MetaStatusResponse], frozen=True):
    type_id: ClassVar[int] = 1108


class MetaMemberResponse(rpc.Message, frozen=True):
    type_id: ClassVar[int] = 1111
    voters: list[int]
    learners: list[int]


class MetaMemberRequest(rpc.Request[MetaMemberResponse], frozen=True):
    """Change the meta group: add (voter), add_learner, promote, remove."""

    type_id: ClassVar[int] = 1110
    action: str
    node_id: int
    address: str = ""


MEMBER_KEY_PREFIX = "/_meta/members/"
_MEMBER_ACTIONS = {
    "add": ConfChangeType.ADD_NODE,
    "add_learner": ConfChangeType.ADD_LEARNER,
    "promote": ConfChangeType.ADD_NODE,
    "remove": ConfChangeType.REMOVE_NODE,
}


class _WatchableMachine(MetaStateMachine):
    """The state machine, waking parked watches and tracking sessions on apply."""

    def __init__(self, service: MetaService, limits: MetaLimits) -> None:
        super().__init__(limits)
        self._service = service

    def apply(self, index: int, data: bytes) -> tuple[Result, list[Event]]:
        result, events = super().apply(index, data)
        self._service.applied(result, events)
        return result, events

    def restore(self, data: bytes) -> None:
        super().restore(data)
        self._service.restored()


class MetaService:
    """The metadata role of one node process."""

    def __init__(self, host: RaftHost, *, limits: MetaLimits | None = None) -> None:
        self.host = host
        self.machine = _WatchableMachine(self, limits or MetaLimits())
        self.leases = LeaseKeeper()
        self._watch_wakeup: asyncio.Future[None] | None = None  # parked watches wait on it
        self._expiry_task: asyncio.Task[None] | None = None

    def handlers(self) -> dict[type[rpc.Request[Any]], Any]:
        return {
            MetaWriteRequest: self._on_write,
            MetaRangeRequest: self._on_range,
            MetaKeepAliveRequest: self._on_keepalive,
            MetaWatchRequest: self._on_watch,
            MetaStatusRequest: self._on_status,
            MetaMemberRequest: self._on_member,
        }

    def start(self, voters: set[int] | None) -> None:
        self.host.on_role_change = self._role_changed
        self.host.resolver = self._resolve_member
        self.host.add_group(META_GROUP_ID, voters, self.machine)
        self._expiry_task = asyncio.get_running_loop().create_task(self._expire_sessions())

    async def close(self) -> None:
        if self._expiry_task is not None:
            self._expiry_task.cancel()
            await asyncio.gather(self._expiry_task, return_exceptions=True)

    # ----- callbacks from the state machine (on the event loop) --------------

    def applied(self, result: Result, events: list[Event]) -> None:
        if isinstance(result, SessionResult) and self.leases.active:
            if result.ttl_ms and result.found and result.session_id in self.machine.sessions():
                self.leases.created(result.session_id, result.ttl_ms, _now_ms())
            elif result.session_id not in self.machine.sessions():
                self.leases.revoked(result.session_id)
        if events:
            self._wake_watches()

    def restored(self) -> None:
        if self.leases.active:
            self.leases.promote(_now_ms(), self.machine.sessions())
        self._wake_watches()

    def _wake_watches(self) -> None:
        """Wake every parked watch; costs nothing when none is parked."""
        wakeup, self._watch_wakeup = self._watch_wakeup, None
        if wakeup is not None and not wakeup.done():
            wakeup.set_result(None)

    def _role_changed(self, group_id: int, role: Role, leader_id: int) -> None:
        if group_id != META_GROUP_ID:
            return
        if role is Role.LEADER:
            self.leases.promote(_now_ms(), self.machine.sessions())
        else:
            self.leases.demote()

    async def _expire_sessions(self) -> None:
        interval = self.host.config.tick_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            if not self.leases.active:
                continue
            for session_id in self.leases.expired(_now_ms()):
                try:
                    await self.propose(RevokeSession(session_id=session_id))
                except QuorumlogError as exc:
                    _log.info("session_revoke_retry", session=session_id, error=exc.message)

    async def propose(self, command: Command) -> Result:
        data = REQUEST_ENCODER.encode(Request(command=command))  # no session: not deduplicated
        result, _ = await self.host.propose(META_GROUP_ID, data)
        return result  # type: ignore[no-any-return]

    # ----- handlers ----------------------------------------------------------

    async def _on_write(
        self, request: MetaWriteRequest, ctx: rpc.RequestContext
    ) -> MetaWriteResponse:
        try:
            msgspec.msgpack.decode(request.request, type=Request)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise UsageError(f"malformed meta request: {exc}") from None
        result, _ = await self.host.propose(META_GROUP_ID, request.request)
        return MetaWriteResponse(result=_RESULT_ENCODER.encode(result))

    async def _on_range(
        self, request: MetaRangeRequest, ctx: rpc.RequestContext
    ) -> MetaRangeResponse:
        if not request.serializable:
            await self.host.read_barrier(META_GROUP_ID)
        return MetaRangeResponse(
            result=self.machine.range(request.op), revision=self.machine.revision
        )

    async def _on_keepalive(
        self, request: MetaKeepAliveRequest, ctx: rpc.RequestContext
    ) -> MetaKeepAliveResponse:
        group = self.host.group(META_GROUP_ID)
        self.host.require_leader(group)
        ttl = self.leases.keepalive(request.session_id, _now_ms())
        return MetaKeepAliveResponse(ttl_ms=ttl or 0)

    async def _on_watch(
        self, request: MetaWatchRequest, ctx: rpc.RequestContext
    ) -> MetaWatchResponse:
        wait_s = min(max(request.wait_ms, 0), WATCH_WAIT_MS_MAX) / 1000
        deadline = asyncio.get_running_loop().time() + wait_s
        start = max(request.start_revision, 1)
        while True:
            events = self.machine.events_since(start, request.key, prefix=request.prefix)
            remaining = deadline - asyncio.get_running_loop().time()
            if events or remaining <= 0:
                return MetaWatchResponse(
                    events=events[:WATCH_EVENTS_MAX],
                    revision=events[WATCH_EVENTS_MAX - 1].kv.mod_revision
                    if len(events) > WATCH_EVENTS_MAX else self.machine.revision,
                )
            if self._watch_wakeup is None:
                self._watch_wakeup = asyncio.get_running_loop().create_future()
            # shield: a timed-out watch must not cancel the future others wait on
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._watch_wakeup), remaining)

    def _resolve_member(self, node_id: int) -> str | None:
        kv = self.machine.get(f"{MEMBER_KEY_PREFIX}{node_id}")
        return kv.value.decode() if kv is not None else None

    async def _on_member(
        self, request: MetaMemberRequest, ctx: rpc.RequestContext
    ) -> MetaMemberResponse:
        change_type = _MEMBER_ACTIONS.get(request.action)
        if change_type is None:
            raise UsageError(
                f"unknown member action {request.action!r}; use one of {sorted(_MEMBER_ACTIONS)}"
            )
        if request.action in ("add", "add_learner"):
            if not request.address:
                raise UsageError("adding a member needs its address (host:port)")
            key = f"{MEMBER_KEY_PREFIX}{request.node_id}"
            await self.propose(Txn(success=(PutOp(key=key, value=request.address.encode()),)))
        change = ConfChange(changes=(ConfChangeSingle(type=change_type, node_id=request.node_id),))
        conf = await self.host.change_membership(META_GROUP_ID, change)
        return MetaMemberResponse(voters=sorted(conf.voters), learners=sorted(conf.learners))

    async def _on_status(
        self, request: MetaStatusRequest, ctx: rpc.RequestContext
    ) -> MetaStatusResponse:
        status = self.host.status()[0]
        return MetaStatusResponse(
            node_id=self.host.node_id, role=status["role"], term=status["term"],
            leader=status["leader"], commit_index=status["commit_index"],
            applied_index=status["applied_index"], revision=self.machine.revision,
            voters=status["voters"],
        )


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


_RESULT_ENCODER = msgspec.msgpack.Encoder()
