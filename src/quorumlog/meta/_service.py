"""The metadata service on a Raft group: rpc handlers on each member.

Writes (transactions, sessions, ids, compaction) are proposed to the group's
leader and answered with the state machine's result. Reads are linearizable by
default, in the node's ``read_mode``: ``read_index`` (a ReadIndex barrier on
the leader — one heartbeat round — then a local read) or ``lease`` (the
leader serves from its own state while its lease holds, see
``_read_lease``; a ReadIndex round when it does not, which also renews it).
A read with ``serializable=True`` is served by whichever member receives it,
from its own state, without asking anyone: it may be stale, and it works
while that member is cut off from the leader. Watches are long-polls by revision: a
client asks for the events of a key or prefix from revision ``r``; the member
answers at once if it has some, or parks the request until one applies or the
wait times out. Resuming after a reconnect is asking again from the last
revision seen + 1, on any member.

A member that is not the leader passes writes, linearizable reads and session
keep-alives on to the leader it knows and relays the answer (as ZooKeeper
followers and etcd members do), so a client that reaches any member is served
while it cannot reach the leader itself (a partition between the client and
the leader only). A request is passed on once at most (``forwarded``): a member
that gets a forwarded request and is not the leader, or that knows no leader,
answers NotLeaderError carrying the leader's address, and clients follow it.
Forwarding changes no outcome: a write carries its session and sequence
number, so a write that reaches the log twice (a retry after a forward whose
answer was lost) is applied once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import msgspec

from quorumlog import rpc
from quorumlog.clock import SYSTEM_CLOCK, Clock
from quorumlog.errors import DeadlineExceededError, QuorumlogError, TransientError, UsageError
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
from quorumlog.meta._member_marker import marker_path, write_marker
from quorumlog.meta._metrics import META_METRICS, register_member, unregister_member
from quorumlog.meta._read_lease import ReadLease, lease_duration_s
from quorumlog.meta._state import (
    Applied,
    CompactedError,
    MetaLimits,
    MetaStateMachine,
)
from quorumlog.raft import (
    ConfChange,
    ConfChangeSingle,
    ConfChangeType,
    RaftHost,
    Role,
    combine_msgpack,
)

META_GROUP_ID = 1
WATCH_WAIT_MS_MAX = 60_000  # a parked watch answers (maybe empty) within this
WATCH_EVENTS_MAX = 10_000  # events per watch response
_log = get_logger(__name__)

ReadMode = Literal["read_index", "lease"]
READ_MODES: tuple[ReadMode, ...] = ("read_index", "lease")
# Clocks disagree on rates; the lease is cut by this bound (see _read_lease).
# Crystal oscillators drift by well under 0.1 %; 10 % also covers NTP slewing
# and a busy host oversleeping a tick.
LEASE_CLOCK_DRIFT_PERCENT = 10
# The boot-time clock keeps counting while the process is stopped or the
# machine suspended, so a leader never wakes up believing in an old lease.
LEASE_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


def lease_clock_s() -> float:
    return time.clock_gettime(LEASE_CLOCK)

# Renew the lease in the background once less than this part of it is left,
# so steady read traffic never waits for a heartbeat round.
LEASE_RENEW_FRACTION = 0.5


class MetaRequestFailedError(QuorumlogError):
    """The state machine refused a request (bad key, session gone, ...)."""

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code or "failed"


class MetaSnapshotGoneError(QuorumlogError):
    """The leader no longer holds the backup being fetched (it changed, or the
    backup's hold ran out): take a new one."""


rpc.register_error(1100, CompactedError)
rpc.register_error(1101, MetaRequestFailedError, ("code",))
rpc.register_error(1102, MetaSnapshotGoneError)


# ----- wire messages (type ids 1100-1199) -------------------------------------


class MetaWriteResponse(rpc.Message, frozen=True):
    type_id: ClassVar[int] = 1101
    result: bytes  # msgpack-encoded Result
    # Set by a member that passed the request on: the leader's address, so a
    # client that reaches the leader sends it there itself next time.
    leader: str = ""


class MetaWriteRequest(rpc.Request[MetaWriteResponse], frozen=True):
    type_id: ClassVar[int] = 1100
    request: bytes  # msgpack-encoded Request (client id, seq, command)
    forwarded: bool = False  # passed on by a member that is not the leader


class MetaRangeResponse(rpc.Message, frozen=True):
    type_id: ClassVar[int] = 1103
    result: RangeResult
    revision: int
    leader: str = ""  # as MetaWriteResponse.leader


class MetaRangeRequest(rpc.Request[MetaRangeResponse], frozen=True):
    type_id: ClassVar[int] = 1102
    op: RangeOp
    serializable: bool = False
    forwarded: bool = False  # passed on by a member that is not the leader


class MetaKeepAliveResponse(rpc.Message, frozen=True):
    type_id: ClassVar[int] = 1105
    ttl_ms: int  # 0: the session is gone


class MetaKeepAliveRequest(rpc.Request[MetaKeepAliveResponse], frozen=True):
    type_id: ClassVar[int] = 1104
    session_id: int
    forwarded: bool = False  # passed on by a member that is not the leader


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
    read_mode: str = "read_index"
    # Linearizable reads this member served, by how leadership was confirmed.
    lease_reads: int = 0
    read_index_reads: int = 0
    learners: list[int] = []
    # Node id -> rpc address of the members this node knows (voters and learners).
    addresses: dict[int, str] = {}


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


class MetaSnapshotResponse(rpc.Message, frozen=True):
    type_id: ClassVar[int] = 1113
    snapshot_id: int  # names the state taken for the first chunk; later chunks ask by it
    total_bytes: int
    offset: int
    chunk: bytes
    member: int  # the member (the leader) that took it
    applied_index: int
    revision: int
    keys: int
    leader: str = ""  # as MetaWriteResponse.leader


class MetaSnapshotRequest(rpc.Request[MetaSnapshotResponse], frozen=True):
    """One chunk of the leader's state (``quorumlog meta snapshot save``):
    ``snapshot_id`` 0 takes a new one, after a linearizable read barrier, so it
    holds every write acknowledged before the request."""

    type_id: ClassVar[int] = 1112
    snapshot_id: int = 0
    offset: int = 0
    forwarded: bool = False  # passed on by a member that is not the leader


SNAPSHOT_CHUNK_BYTES = 4 * 1024 * 1024
SNAPSHOT_HELD_S = 120.0  # a taken state is kept this long for its later chunks
SNAPSHOTS_HELD_MAX = 2


@dataclass
class _HeldSnapshot:
    data: bytes
    applied_index: int
    revision: int
    keys: int
    expires_s: float


MEMBER_KEY_PREFIX = "/_meta/members/"
_MEMBER_ACTIONS = {
    "add": ConfChangeType.ADD_NODE,
    "add_learner": ConfChangeType.ADD_LEARNER,
    "promote": ConfChangeType.ADD_NODE,
    "remove": ConfChangeType.REMOVE_NODE,
}


class _ParkedWatches:
    """Parked watch requests by what they watch, as etcd's watcher groups: an
    applied write wakes the watches on its key and on prefixes of its key, not
    every parked watch (before, each applied pass woke them all, and each
    rescanned the new revisions: a cost per write times the watches parked).

    A watch's future gets the revision of the first event that woke it (it
    looks from there: whatever it waited through touched other keys only),
    or None from :meth:`wake_all` (state restored from a snapshot: look again
    from where it was)."""

    __slots__ = ("_exact", "_prefixes")

    def __init__(self) -> None:
        self._exact: dict[str, set[asyncio.Future[int | None]]] = {}
        self._prefixes: dict[str, set[asyncio.Future[int | None]]] = {}

    def park(self, key: str, prefix: bool, future: asyncio.Future[int | None]) -> None:
        table = self._prefixes if prefix else self._exact
        table.setdefault(key, set()).add(future)

    def unpark(self, key: str, prefix: bool, future: asyncio.Future[int | None]) -> None:
        table = self._prefixes if prefix else self._exact
        futures = table.get(key)
        if futures is not None:
            futures.discard(future)
            if not futures:
                del table[key]

    def wake(self, events: list[Event]) -> None:
        """Wake the watches these events (one revision's) touch."""
        exact, prefixes = self._exact, self._prefixes
        if not exact and not prefixes:
            return
        for event in events:
            key = event.kv.key
            futures = exact.pop(key, None)
            if futures:
                _wake(futures, event.kv.mod_revision)
            if prefixes:
                for watched in [p for p in prefixes if key.startswith(p)]:
                    _wake(prefixes.pop(watched), event.kv.mod_revision)

    def wake_all(self) -> None:
        for table in (self._exact, self._prefixes):
            for futures in table.values():
                _wake(futures, None)
            table.clear()


def _wake(futures: set[asyncio.Future[int | None]], revision: int | None) -> None:
    for future in futures:
        if not future.done():
            future.set_result(revision)


class _WatchableMachine(MetaStateMachine):
    """The state machine, waking parked watches and tracking sessions on apply."""

    def __init__(self, service: MetaService, limits: MetaLimits) -> None:
        super().__init__(limits)
        self._service = service

    def apply(self, index: int, data: bytes) -> Applied | list[Applied]:
        outcome = super().apply(index, data)
        if isinstance(outcome, list):
            for result, events in outcome:
                self._service.applied(result, events)
        else:
            self._service.applied(*outcome)
        return outcome

    def restore(self, data: bytes) -> None:
        super().restore(data)
        self._service.restored()


class MetaService:
    """The metadata role of one node process."""

    def __init__(
        self,
        host: RaftHost,
        *,
        limits: MetaLimits | None = None,
        read_mode: ReadMode = "read_index",
        lease_clock_drift_percent: int = LEASE_CLOCK_DRIFT_PERCENT,
        lease_clock: Callable[[], float] = lease_clock_s,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        if read_mode not in READ_MODES:
            raise UsageError(f"read_mode must be one of {list(READ_MODES)}, got {read_mode!r}")
        self.host = host
        self.machine = _WatchableMachine(self, limits or MetaLimits())
        self.leases = LeaseKeeper()
        self.read_mode: ReadMode = read_mode
        self.read_lease = ReadLease(lease_duration_s(
            election_timeout_ticks=host.config.election_timeout_ticks,
            tick_interval_ms=host.config.tick_interval_ms,
            clock_drift_percent=lease_clock_drift_percent,
        ))
        self._lease_clock = lease_clock
        self._clock = clock  # session lease expiry (monotonic)
        self.lease_reads = 0
        self.read_index_reads = 0
        self._started = False  # the Raft group is hosted (see start)
        # The member guard runs with nothing of the group on disk (_member_guard):
        # its status says "fresh", so that members starting together answer each other.
        self.checking_fresh = False
        self._watches = _ParkedWatches()  # parked watch requests, by key
        self._apply_wakeup: asyncio.Future[None] | None = None  # lease reads wait on it
        self._expiry_task: asyncio.Task[None] | None = None
        self._start_task: asyncio.Task[None] | None = None
        self._renewal: asyncio.Task[None] | None = None
        self._watches_open = 0  # watch requests parked now (metrics)
        self._sessions_count = 0  # live sessions after the last session command (metrics)
        self._leader_seen = 0  # the last leader id this member saw (metrics)
        # Requests passed on to the leader (the same security as Raft's own pool).
        self._forward_pool = rpc.Pool()
        self._held_snapshots: dict[int, _HeldSnapshot] = {}  # by snapshot id (backups)
        register_member(self)

    def _now_ms(self) -> int:
        return int(self._clock.monotonic_s() * 1000)

    def handlers(self) -> dict[type[rpc.Request[Any]], Any]:
        return {
            MetaWriteRequest: self._on_write,
            MetaRangeRequest: self._on_range,
            MetaKeepAliveRequest: self._on_keepalive,
            MetaWatchRequest: self._on_watch,
            MetaStatusRequest: self._on_status,
            MetaMemberRequest: self._on_member,
            MetaSnapshotRequest: self._on_snapshot,
        }

    def start(self, voters: set[int] | None) -> None:
        """Host the meta group (in lease mode after a hold-off, see below)."""
        self.host.on_role_change = self._role_changed
        self.host.resolver = self._resolve_member
        loop = asyncio.get_running_loop()
        if self.read_mode == "lease":
            # A member that acknowledged a leader's heartbeat and then restarted
            # has forgotten it, and would vote at once, inside the lease it
            # helped grant. So a member in lease mode stays out of the group
            # (no votes, no acks, requests get a retriable error) for one full
            # election timeout after it starts: longer than any lease.
            holdoff_s = self.host.config.election_timeout_ticks * (
                self.host.config.tick_interval_ms / 1000)
            self._start_task = loop.create_task(self._start_after(holdoff_s, voters))
        else:
            self._host_group(voters)
        self._expiry_task = loop.create_task(self._expire_sessions())

    async def _start_after(self, holdoff_s: float, voters: set[int] | None) -> None:
        await asyncio.sleep(holdoff_s)
        try:
            self._host_group(voters)
        except QuorumlogError as exc:  # storage: the node must stop, as for a failed pass
            if not self.host.failed.done():
                self.host.failed.set_exception(exc)

    def _host_group(self, voters: set[int] | None) -> None:
        # Clients read from the leader (followers only for serializable reads
        # and watches, which may lag anyway): followers learn a commit from
        # the next AppendEntries or heartbeat, one message and one pass per
        # follower per commit fewer (RaftConfig.broadcast_commit).
        self.host.add_group(META_GROUP_ID, voters, self.machine, broadcast_commit=False,
                            combine=combine_msgpack)
        # From now on this data directory has held the group: if its Raft data is
        # ever gone, the member must not come back as its old self (_member_guard).
        write_marker(marker_path(Path(self.host.data_dir)), self.host.node_id)
        self._started = True

    def _require_started(self) -> None:
        if not self._started:
            raise TransientError(
                f"meta on node {self.host.node_id} is starting (lease read mode: a member "
                "waits one election timeout after a restart before it joins); retry"
            )

    @property
    def member_id(self) -> int:
        return self.host.node_id

    def gauges(self) -> dict[str, float]:
        """The member's metric gauges (see ``meta/_metrics.py``); attribute reads
        only, safe from the scrape thread."""
        values = {"watches_open": float(self._watches_open),
                  "sessions": float(self._sessions_count),
                  "revision": float(self.machine.revision)}
        if self._started:
            with contextlib.suppress(UsageError):  # not hosted (yet, or any more)
                node = self.host.group(META_GROUP_ID).node
                values.update(is_leader=float(node.role is Role.LEADER),
                              leader_id=float(node.leader_id), term=float(node.term))
        return values

    async def close(self) -> None:
        unregister_member(self)
        tasks = [t for t in (self._expiry_task, self._start_task, self._renewal) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._forward_pool.close()

    # ----- callbacks from the state machine (on the event loop) --------------

    def applied(self, result: Result, events: list[Event]) -> None:
        if isinstance(result, SessionResult):
            self._sessions_count = len(self.machine.sessions())
        if isinstance(result, SessionResult) and self.leases.active:
            if result.ttl_ms and result.found and result.session_id in self.machine.sessions():
                self.leases.created(result.session_id, result.ttl_ms, self._now_ms())
            elif result.session_id not in self.machine.sessions():
                self.leases.revoked(result.session_id)
        if events:
            self._watches.wake(events)
        wakeup, self._apply_wakeup = self._apply_wakeup, None
        if wakeup is not None and not wakeup.done():
            wakeup.set_result(None)

    def restored(self) -> None:
        self._sessions_count = len(self.machine.sessions())
        if self.leases.active:
            self.leases.promote(self._now_ms(), self.machine.sessions())
        self._watches.wake_all()

    def _role_changed(self, group_id: int, role: Role, leader_id: int) -> None:
        if group_id != META_GROUP_ID:
            return
        if leader_id and leader_id != self._leader_seen:
            META_METRICS.leader_changes += 1
            self._leader_seen = leader_id
        if role is Role.LEADER:
            self.leases.promote(self._now_ms(), self.machine.sessions())
        else:
            self.leases.demote()
            self.read_lease.drop()

    async def _expire_sessions(self) -> None:
        interval = self.host.config.tick_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            if not self.leases.active:
                continue
            for session_id in self.leases.expired(self._now_ms()):
                try:
                    await self.propose(RevokeSession(session_id=session_id))
                except QuorumlogError as exc:
                    _log.info("session_revoke_retry", session=session_id, error=exc.message)

    async def propose(self, command: Command) -> Result:
        data = REQUEST_ENCODER.encode(Request(command=command))  # no session: not deduplicated
        result, _ = await self._propose(data)
        return result  # type: ignore[no-any-return]

    async def _propose(self, data: bytes) -> tuple[Any, Any]:
        """Propose to the meta group, counted and timed (``quorumlog_meta_proposals``)."""
        loop = asyncio.get_running_loop()
        started_s = loop.time()
        try:
            outcome = await self.host.propose(META_GROUP_ID, data)
        except QuorumlogError:
            META_METRICS.proposals_failed += 1
            raise
        META_METRICS.proposals_ok += 1
        META_METRICS.proposal_latency.observe(loop.time() - started_s)
        return outcome  # type: ignore[no-any-return]

    # ----- handlers ----------------------------------------------------------

    def _on_write(
        self, request: MetaWriteRequest, ctx: rpc.RequestContext
    ) -> asyncio.Future[MetaWriteResponse] | rpc.DeferredAnswer[Any, MetaWriteResponse]:
        """A plain function answering from its proposal's future (rpc runs no
        task for it): the hot path of every write, one proposal and one callback. The
        writes queued before the next ready pass share one log entry (the
        group's combiner, ``raft.combine_msgpack``): one entry, WAL record and
        replication per pass instead of per write; each keeps its own
        revision and result (``MetaStateMachine.apply``)."""
        self._require_started()
        try:
            decoded = _REQUEST_DECODER.decode(request.request)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise UsageError(f"malformed meta request: {exc}") from None
        META_METRICS.requests[type(decoded.command).__name__] += 1
        leader = self._leader_to_forward_to(request.forwarded)
        if leader is not None:
            return asyncio.ensure_future(self._forward(leader, request))
        started_s = asyncio.get_running_loop().time()
        try:
            proposal = self.host.propose_nowait(META_GROUP_ID, request.request, combine=True)
        except QuorumlogError:
            META_METRICS.proposals_failed += 1
            raise
        return rpc.answer_from(proposal, functools.partial(_write_response, started_s),
                               on_error=_count_failed_write)

    async def _on_range(
        self, request: MetaRangeRequest, ctx: rpc.RequestContext
    ) -> MetaRangeResponse:
        self._require_started()
        META_METRICS.requests["Range"] += 1
        if not request.serializable:
            leader = self._leader_to_forward_to(request.forwarded)
            if leader is not None:
                forwarded: MetaRangeResponse = await self._forward(leader, request)
                return forwarded
            await self._linearizable()
        return MetaRangeResponse(
            result=self.machine.range(request.op), revision=self.machine.revision
        )

    async def _forward(self, leader: str, request: Any) -> Any:
        """Pass a client's write or read on to the leader; the answer names the
        leader, so the client sends its next requests there (one hop less, and
        this member's CPU) unless it cannot reach it (see MetaClient)."""
        response = await self._forward_pool.call(
            leader, msgspec.structs.replace(request, forwarded=True),
            timeout_s=self._forward_timeout_s)
        return msgspec.structs.replace(response, leader=leader)

    def _leader_to_forward_to(self, forwarded: bool) -> str | None:
        """The leader's address when this member should pass a client's request
        on to it: not the leader itself, a leader known, not forwarded already."""
        if forwarded:
            return None
        node = self.host.group(META_GROUP_ID).node
        if node.role is Role.LEADER or not node.leader_id:
            return None
        return self.host.address_of(node.leader_id)

    @property
    def _forward_timeout_s(self) -> float:
        """A forwarded request waits as long as a proposal may take on the leader."""
        return self.host.config.proposal_timeout_ms / 1000

    # ----- linearizable reads ------------------------------------------------

    async def _linearizable(self) -> None:
        """Return once the local state holds every write acknowledged before the call."""
        if self.read_mode == "lease":
            read_index = self._lease_read_index()
            if read_index is not None:
                await self._wait_applied(read_index)
                self.lease_reads += 1
                return
        await self._read_index()
        self.read_index_reads += 1

    def _lease_read_index(self) -> int | None:
        """The commit index, if this member is the leader and its lease holds."""
        node = self.host.group(META_GROUP_ID).node
        if node.role is not Role.LEADER:
            return None
        now_s = self._lease_clock()
        remaining_s = self.read_lease.remaining_s(now_s=now_s, leadership=(node.term, node.epoch))
        if remaining_s <= 0:
            return None
        if remaining_s < self.read_lease.duration_s * LEASE_RENEW_FRACTION and (
            self._renewal is None or self._renewal.done()
        ):
            self._renewal = asyncio.get_running_loop().create_task(self._renew_lease())
        # A lease is only granted after a ReadIndex round, which waits for the
        # first commit of the leader's term: the commit index is complete.
        index: int = node.commit_index
        return index

    async def _read_index(self) -> None:
        """A ReadIndex round; in lease mode it also renews the lease."""
        node = self.host.group(META_GROUP_ID).node
        start_s, leadership = self._lease_clock(), (node.term, node.epoch)
        await self.host.read_barrier(META_GROUP_ID)
        # Confirmed: the round's heartbeats left after start_s, in this term
        # (a lost leadership fails the barrier instead). A configuration
        # change meanwhile: the quorum may have been of either; no lease.
        if (node.term, node.epoch) == leadership:
            self.read_lease.extend(start_s=start_s, leadership=leadership)

    async def _renew_lease(self) -> None:
        try:
            await self._read_index()
        except QuorumlogError as exc:
            _log.debug("meta_lease_renewal_failed", error=exc.message)

    async def _wait_applied(self, index: int) -> None:
        """Wait until this member has applied ``index`` (normally it already has)."""
        group = self.host.group(META_GROUP_ID)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.host.config.proposal_timeout_ms / 1000
        # Conf change entries are applied without the state machine (no
        # wake-up): re-check each tick as well.
        tick_s = self.host.config.tick_interval_ms / 1000
        while group.applied_index < index:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise DeadlineExceededError(
                    f"meta on node {self.host.node_id}: index {index} not applied in time "
                    f"(applied {group.applied_index}); retry"
                )
            if self._apply_wakeup is None:
                self._apply_wakeup = loop.create_future()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(remaining, tick_s)):
                    await asyncio.shield(self._apply_wakeup)

    async def _on_keepalive(
        self, request: MetaKeepAliveRequest, ctx: rpc.RequestContext
    ) -> MetaKeepAliveResponse:
        self._require_started()
        META_METRICS.requests["KeepAlive"] += 1
        leader = self._leader_to_forward_to(request.forwarded)
        if leader is not None:
            return await self._forward_pool.call(
                leader, msgspec.structs.replace(request, forwarded=True),
                timeout_s=self._forward_timeout_s)
        group = self.host.group(META_GROUP_ID)
        self.host.require_leader(group)
        ttl = self.leases.keepalive(request.session_id, self._now_ms())
        return MetaKeepAliveResponse(ttl_ms=ttl or 0)

    async def _on_watch(
        self, request: MetaWatchRequest, ctx: rpc.RequestContext
    ) -> MetaWatchResponse:
        self._require_started()
        META_METRICS.requests["Watch"] += 1
        self._watches_open += 1
        try:
            return await self._watch(request)
        finally:
            self._watches_open -= 1

    async def _watch(self, request: MetaWatchRequest) -> MetaWatchResponse:
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
            # Nothing up to the current revision matched: park until a write
            # touches the key (or prefix). Writes to other keys do not wake
            # it, so what it waits through never needs scanning: it looks from
            # the revision that woke it (a snapshot restore wakes it with
            # None: look again from here).
            start = max(start, self.machine.revision + 1)
            woken: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
            self._watches.park(request.key, request.prefix, woken)
            try:
                async with asyncio.timeout(remaining):
                    revision = await woken
            except TimeoutError:
                # No write touched the key since ``start``: nothing to report.
                return MetaWatchResponse(events=[], revision=self.machine.revision)
            finally:
                self._watches.unpark(request.key, request.prefix, woken)
            if revision is not None:
                start = max(start, revision)

    def _resolve_member(self, node_id: int) -> str | None:
        kv = self.machine.get(f"{MEMBER_KEY_PREFIX}{node_id}")
        return kv.value.decode() if kv is not None else None

    async def _on_member(
        self, request: MetaMemberRequest, ctx: rpc.RequestContext
    ) -> MetaMemberResponse:
        self._require_started()
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

    async def _on_snapshot(
        self, request: MetaSnapshotRequest, ctx: rpc.RequestContext
    ) -> MetaSnapshotResponse:
        """A chunk of a backup of the state (etcd's ``snapshot save``), on the leader."""
        self._require_started()
        META_METRICS.requests["Snapshot"] += 1
        leader = self._leader_to_forward_to(request.forwarded)
        if leader is not None:
            forwarded: MetaSnapshotResponse = await self._forward(leader, request)
            return forwarded
        now_s = time.monotonic()
        for snapshot_id in [i for i, h in self._held_snapshots.items() if h.expires_s < now_s]:
            del self._held_snapshots[snapshot_id]
        if request.snapshot_id == 0:
            self.host.require_leader(self.host.group(META_GROUP_ID))
            await self._linearizable()
            machine = self.machine
            held = _HeldSnapshot(machine.snapshot(), machine.applied_index, machine.revision,
                                 len(machine), now_s + SNAPSHOT_HELD_S)
            while len(self._held_snapshots) >= SNAPSHOTS_HELD_MAX:
                del self._held_snapshots[next(iter(self._held_snapshots))]
            snapshot_id = secrets.randbits(62) + 1
            self._held_snapshots[snapshot_id] = held
        else:
            snapshot_id = request.snapshot_id
            found = self._held_snapshots.get(snapshot_id)
            if found is None:
                raise MetaSnapshotGoneError(
                    f"meta snapshot {snapshot_id} is no longer held by member "
                    f"{self.host.node_id} (the leader changed, or it was taken over "
                    f"{SNAPSHOT_HELD_S:.0f} s ago); take a new one")
            held = found
            held.expires_s = now_s + SNAPSHOT_HELD_S
        if not 0 <= request.offset <= len(held.data):
            raise UsageError(f"offset {request.offset} outside the snapshot's "
                             f"{len(held.data)} bytes")
        return MetaSnapshotResponse(
            snapshot_id=snapshot_id, total_bytes=len(held.data), offset=request.offset,
            chunk=held.data[request.offset:request.offset + SNAPSHOT_CHUNK_BYTES],
            member=self.host.node_id, applied_index=held.applied_index,
            revision=held.revision, keys=held.keys)

    async def _on_status(
        self, request: MetaStatusRequest, ctx: rpc.RequestContext
    ) -> MetaStatusResponse:
        if not self._started:
            return MetaStatusResponse(
                node_id=self.host.node_id, role="fresh" if self.checking_fresh else "starting",
                term=0, leader=0, commit_index=0,
                applied_index=0, revision=0, voters=[], read_mode=self.read_mode,
            )
        status = self.host.status()[0]
        return MetaStatusResponse(
            node_id=self.host.node_id, role=status["role"], term=status["term"],
            leader=status["leader"], commit_index=status["commit_index"],
            applied_index=status["applied_index"], revision=self.machine.revision,
            voters=status["voters"], read_mode=self.read_mode, lease_reads=self.lease_reads,
            read_index_reads=self.read_index_reads, learners=status["learners"],
            addresses={n: a for n in (*status["voters"], *status["learners"])
                       if (a := self.host.address_of(n)) is not None},
        )




_RESULT_ENCODER = msgspec.msgpack.Encoder()
_REQUEST_DECODER = msgspec.msgpack.Decoder(Request)


def _write_response(started_s: float, outcome: tuple[Any, Any]) -> MetaWriteResponse:
    """A write's answer from its proposal's outcome, counted and timed
    (``quorumlog_meta_proposals``) as :meth:`MetaService._propose` does."""
    META_METRICS.proposals_ok += 1
    META_METRICS.proposal_latency.observe(asyncio.get_running_loop().time() - started_s)
    result, _ = outcome
    return MetaWriteResponse(result=_RESULT_ENCODER.encode(result))


def _count_failed_write(_: BaseException) -> None:
    META_METRICS.proposals_failed += 1
