"""Clients of the metadata service: asyncio (:class:`MetaClient`) and blocking.

A client takes the member addresses, finds the leader by itself (following
the address carried by NotLeaderError), and retries retriable errors with
exponential backoff until a deadline.

Writes are exactly-once. On its first write a client opens a session (a meta
session with a lease, ``session_ttl_ms``) and keeps it alive in the
background; every write carries (session, seq, lowest seq still waiting for
its answer). A retry reuses its seq, so a write retried across a leader
change is applied once and answered with its first result, however many
callers share the client (see ``_client_sessions``). If the session is gone
when a retry arrives (lease expired, or evicted by the table's byte bound),
the client cannot know whether the first attempt applied and raises
``MetaRequestFailedError(code="session_expired")``; a write that was never
attempted before is sent again in a new session.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

from quorumlog import rpc
from quorumlog.errors import (
    DeadlineExceededError,
    NotLeaderError,
    ProtocolError,
    QuorumlogError,
    UsageError,
)
from quorumlog.log import get_logger
from quorumlog.meta._client_sessions import SESSION_EXPIRED
from quorumlog.meta._commands import (
    REQUEST_ENCODER,
    RESULT_DECODER,
    Command,
    Compact,
    Compare,
    CompareOp,
    CompareTarget,
    CreateSession,
    DeleteOp,
    ErrorResult,
    Event,
    IdResult,
    KeyValue,
    NextId,
    Op,
    PutOp,
    RangeOp,
    RangeResult,
    Request,
    Result,
    RevokeSession,
    SessionResult,
    Txn,
    TxnResult,
)
from quorumlog.meta._service import (
    MetaKeepAliveRequest,
    MetaMemberRequest,
    MetaRangeRequest,
    MetaRequestFailedError,
    MetaSnapshotRequest,
    MetaSnapshotResponse,
    MetaStatusRequest,
    MetaStatusResponse,
    MetaWatchRequest,
    MetaWriteRequest,
)

T = TypeVar("T")
_log = get_logger(__name__)

ATTEMPT_MIN_S = 0.001
BACKOFF_INITIAL_S = 0.02
BACKOFF_MAX_S = 0.5
REQUEST_TIMEOUT_S = 5.0  # one attempt
OPERATION_DEADLINE_S = 20.0  # all attempts of one operation
# Lease of the client's exactly-once session. Longer than any retry window
# (OPERATION_DEADLINE_S) so a retry finds its session unless the client was
# cut off from a quorum for this long; a crashed client's session lingers this
# long (one small table row) before the leader expires it.
SESSION_TTL_MS = 60_000
KEEPALIVES_PER_TTL = 3  # keep-alive every third of the TTL: two may be lost
CLOSE_REVOKE_DEADLINE_S = 1.0  # close() revokes the session, best effort, this long
BLOCKING_LOOP_THREAD_NAME = "quorumlog-meta-client"
# A member that passed a request on names the leader; a leader this client
# failed to reach within this long is not taken from such a hint (a client cut
# off from the leader only keeps going through the members that pass on).
LEADER_HINT_HOLD_OFF_S = 30.0
# Unreachable members remembered beyond the configured ones (leaders named by
# hints may be members that joined later): a bound on the table.
UNREACHABLE_EXTRA_MAX = 16


LIST_PAGE_KEYS = 256
"""Keys per page of :meth:`MetaClient.list_pages` (halved while a page is too large)."""


def _prefix_end(prefix: str) -> str:
    """The first key after every key that starts with ``prefix``."""
    stripped = prefix.rstrip("\U0010ffff")
    if not stripped:
        return "\U0010ffff" * 4
    return stripped[:-1] + chr(ord(stripped[-1]) + 1)


class MetaClient:
    """asyncio client; use as ``async with MetaClient([...]) as meta:``."""

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        pool: rpc.Pool | None = None,
        deadline_s: float = OPERATION_DEADLINE_S,
        session_ttl_ms: int = SESSION_TTL_MS,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        if not addresses:
            raise UsageError("MetaClient needs at least one member address")
        self.addresses = list(addresses)
        self._pool = pool if pool is not None else rpc.Pool()  # an empty Pool is falsy (len 0)
        self._own_pool = pool is None
        self._leader: str | None = None
        self._cursor = 0  # the member tried first while no leader is known
        self._deadline_s = deadline_s
        self._request_timeout_s = request_timeout_s
        self._rng = random.Random()
        # The exactly-once session: its id (0 = none open), the task opening
        # one (shared by concurrent callers), its keep-alive task, and per
        # session the seqs waiting for an answer (a dict keeps insertion
        # order, and seqs are inserted increasing: the first key is the lowest).
        self.session_ttl_ms = session_ttl_ms
        self.session_id = 0
        self._seq = 0
        self._opening: asyncio.Task[int] | None = None
        self._keepalive_task: asyncio.Task[None] | None = None
        self._outstanding: dict[int, dict[int, None]] = {}
        # Members an attempt could not reach, and when (loop time): a member
        # that passed a request on names the leader, and the client goes
        # there next time, unless it failed to reach it lately (cut off from
        # the leader only: stay with the members that pass requests on).
        self._unreachable_since: dict[str, float] = {}

    async def __aenter__(self) -> MetaClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop keeping the session alive, revoke it (best effort), close the pool."""
        tasks = [t for t in (self._keepalive_task, self._opening) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        session_id, self.session_id = self.session_id, 0
        if session_id:
            try:
                await self._send(Request(command=RevokeSession(session_id=session_id)),
                                 deadline_s=CLOSE_REVOKE_DEADLINE_S)
            except QuorumlogError as exc:  # it expires by its lease instead
                _log.info("meta_session_revoke_failed", session=session_id, error=exc.message)
        if self._own_pool:
            await self._pool.close()

    # ----- plumbing ----------------------------------------------------------

    async def _retrying(
        self, attempt: Callable[[str, float], Awaitable[T]], *, leader: bool,
        deadline_s: float | None = None,
    ) -> T:
        """Attempts until one succeeds or the deadline passes. The deadline bounds
        each attempt too: ``attempt(address, left_s)`` makes one call with a
        timeout of at most ``left_s``, so a member that does not answer
        (partitioned, hung) costs at most what is left of the operation, not a
        whole request timeout (the call's own timer: no second one per call)."""
        loop = asyncio.get_running_loop()
        budget_s = self._deadline_s if deadline_s is None else deadline_s
        deadline = loop.time() + budget_s
        backoff = BACKOFF_INITIAL_S
        while True:
            address = self._pick(leader)
            error: QuorumlogError
            try:
                # At least 1 ms: a call's timeout must be positive.
                return await attempt(address, max(deadline - loop.time(), ATTEMPT_MIN_S))
            except NotLeaderError as exc:
                self._leader = exc.leader_hint
                if exc.leader_hint is None:
                    self._failed(address)
                error = exc
            except QuorumlogError as exc:
                if not exc.retriable:
                    raise
                if isinstance(exc, rpc.ConnectionClosedError | DeadlineExceededError):
                    self._unreachable(address)
                self._failed(address)
                error = exc
            if loop.time() + backoff > deadline:
                raise DeadlineExceededError(
                    f"meta operation did not succeed within {budget_s:.1f} s; "
                    f"last error: {error.message}"
                ) from error
            if not isinstance(error, NotLeaderError) or error.leader_hint is None:
                await asyncio.sleep(backoff * (0.5 + self._rng.random()))
                backoff = min(backoff * 2, BACKOFF_MAX_S)

    def _pick(self, leader: bool) -> str:
        if leader and self._leader is not None:
            return self._leader
        return self.addresses[self._cursor % len(self.addresses)]

    def _leader_named(self, leader: str) -> None:
        """A member passed our request on to ``leader``: go there directly."""
        if not leader or leader == self._leader:
            return
        failed_at = self._unreachable_since.get(leader)
        if failed_at is not None:
            if asyncio.get_running_loop().time() - failed_at < LEADER_HINT_HOLD_OFF_S:
                return
            del self._unreachable_since[leader]
        self._leader = leader

    def _unreachable(self, address: str) -> None:
        """An attempt could not reach ``address`` (no connection, no answer)."""
        if (address in self._unreachable_since
                or len(self._unreachable_since) < len(self.addresses) + UNREACHABLE_EXTRA_MAX):
            self._unreachable_since[address] = asyncio.get_running_loop().time()

    def _failed(self, address: str) -> None:
        """Move on from a member that failed an attempt. The cursor outlives the
        operation: the next one starts at the member after it, so a member that
        stays unreachable does not cost every later operation an attempt."""
        if self._leader == address:
            self._leader = None
        if self.addresses[self._cursor % len(self.addresses)] == address:
            self._cursor += 1

    async def _send(
        self, request: Request, *, deadline_s: float | None = None
    ) -> tuple[Result, bool]:
        """Send one write until it is answered; (result, whether an attempt failed)."""
        data = REQUEST_ENCODER.encode(request)
        failed = False

        async def attempt(address: str, left_s: float) -> Result:
            nonlocal failed
            try:
                response = await self._pool.call(
                    address, MetaWriteRequest(request=data),
                    timeout_s=min(self._request_timeout_s, left_s))
            except (QuorumlogError, asyncio.CancelledError):
                # It may have reached the log (also when the operation's deadline
                # cut the attempt short): its outcome is unknown.
                failed = True
                raise
            if response.leader:
                self._leader_named(response.leader)
            result: Result = RESULT_DECODER.decode(response.result)
            return result

        result = await self._retrying(attempt, leader=True, deadline_s=deadline_s)
        return result, failed

    async def _write(self, command: Command, *, deadline_s: float | None = None) -> Result:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self._deadline_s if deadline_s is None else deadline_s)
        while True:
            session_id = await self._session()
            self._seq += 1
            seq = self._seq
            outstanding = self._outstanding.setdefault(session_id, {})
            outstanding[seq] = None
            request = Request(session_id=session_id, seq=seq,
                              first_outstanding_seq=next(iter(outstanding)), command=command)
            try:
                result, failed = await self._send(request,
                                                  deadline_s=max(deadline - loop.time(), 0))
            finally:
                del outstanding[seq]  # answered or given up: acknowledged either way
                if not outstanding and session_id != self.session_id:
                    del self._outstanding[session_id]
            if not isinstance(result, ErrorResult):
                return result
            if result.code != SESSION_EXPIRED:
                raise MetaRequestFailedError(result.message, code=result.code)
            self._session_lost(session_id)
            if failed or loop.time() >= deadline:
                # An earlier attempt may have applied, and nobody remembers now.
                raise MetaRequestFailedError(result.message, code=result.code)
            # Never attempted before and refused now: safe to send in a new session.

    # ----- the exactly-once session ---------------------------------------------

    async def _session(self) -> int:
        """The open session, opening one if needed (one opener for all callers)."""
        if self.session_id:
            return self.session_id
        if self._opening is None:
            self._opening = asyncio.get_running_loop().create_task(self._open_session())
        return await asyncio.shield(self._opening)

    async def _open_session(self) -> int:
        try:
            # Not deduplicated (there is no session yet): a retried open may
            # leave a second session behind, which its lease expires.
            result, _ = await self._send(Request(command=CreateSession(ttl_ms=self.session_ttl_ms)))
            if isinstance(result, ErrorResult):
                raise MetaRequestFailedError(result.message, code=result.code)
            if not isinstance(result, SessionResult):
                raise ProtocolError(f"meta answered a session open with {result!r}")
            self.session_id = result.session_id
            if self._keepalive_task is None or self._keepalive_task.done():
                self._keepalive_task = asyncio.get_running_loop().create_task(
                    self._keep_session_alive())
            return result.session_id
        finally:
            self._opening = None

    def _session_lost(self, session_id: int) -> None:
        if self.session_id == session_id:
            self.session_id = 0
        if not self._outstanding.get(session_id, True):
            del self._outstanding[session_id]

    async def _keep_session_alive(self) -> None:
        interval_s = self.session_ttl_ms / 1000 / KEEPALIVES_PER_TTL
        while True:
            await asyncio.sleep(interval_s)
            session_id = self.session_id
            if not session_id:
                continue
            try:
                alive = await self.keepalive(session_id)
            except QuorumlogError as exc:
                _log.info("meta_session_keepalive_failed", session=session_id, error=exc.message)
                continue
            if not alive:
                self._session_lost(session_id)

    # ----- KV ----------------------------------------------------------------

    async def txn(
        self,
        compares: Sequence[Compare] = (),
        success: Sequence[Op] = (),
        failure: Sequence[Op] = (),
    ) -> TxnResult:
        result = await self._write(
            Txn(compares=tuple(compares), success=tuple(success), failure=tuple(failure))
        )
        assert isinstance(result, TxnResult)
        return result

    async def put(self, key: str, value: bytes, *, session_id: int = 0) -> int:
        """Write ``key``; return the new revision."""
        result = await self.txn(success=[PutOp(key=key, value=value, session_id=session_id)])
        return result.revision

    async def cas(
        self, key: str, expected_version: int, value: bytes, *, session_id: int = 0
    ) -> bool:
        """Write ``key`` only if its version is ``expected_version`` (0: absent)."""
        result = await self.txn(
            compares=[Compare(key=key, target=CompareTarget.VERSION, op=CompareOp.EQUAL,
                              version=expected_version)],
            success=[PutOp(key=key, value=value, session_id=session_id)],
        )
        return result.succeeded

    async def delete(self, key: str, *, prefix: bool = False) -> int:
        result = await self.txn(success=[DeleteOp(key=key, prefix=prefix)])
        deleted = result.results[0]
        return getattr(deleted, "deleted", 0)

    async def range(
        self, key: str, *, prefix: bool = False, end: str = "", limit: int = 0,
        serializable: bool = False,
    ) -> tuple[RangeResult, int]:
        """Keys in order; returns (result, revision the read saw)."""
        request = MetaRangeRequest(
            op=RangeOp(key=key, prefix=prefix, end=end, limit=limit), serializable=serializable
        )

        async def attempt(address: str, left_s: float) -> tuple[RangeResult, int]:
            response = await self._pool.call(
                address, request, timeout_s=min(self._request_timeout_s, left_s))
            if response.leader:
                self._leader_named(response.leader)
            return response.result, response.revision

        return await self._retrying(attempt, leader=not serializable)

    async def get(self, key: str, *, serializable: bool = False) -> KeyValue | None:
        result, _ = await self.range(key, serializable=serializable)
        return result.kvs[0] if result.kvs else None

    async def list_keys(
        self, prefix: str, *, limit: int = 0, serializable: bool = False
    ) -> list[KeyValue]:
        result, _ = await self.range(prefix, prefix=True, limit=limit,
                                     serializable=serializable)
        return list(result.kvs)

    async def list_pages(self, prefix: str, *, limit: int = 0,
                         page_keys: int = LIST_PAGE_KEYS) -> list[KeyValue]:
        """The keys under ``prefix`` like :meth:`list_keys`, fetched in pages that
        fit an rpc frame (a page whose answer is too large is asked again at half
        the size), for prefixes whose values add up past ``max_frame_bytes``.
        Not one snapshot: each page is read at its own revision."""
        out: list[KeyValue] = []
        after: str | None = None
        while not limit or len(out) < limit:
            want = page_keys if not limit else min(page_keys, limit - len(out))
            try:
                if after is None:
                    kvs = await self.list_keys(prefix, limit=want)
                else:
                    result, _ = await self.range(after + "\0", end=_prefix_end(prefix),
                                                 limit=want)
                    kvs = [kv for kv in result.kvs if kv.key.startswith(prefix)]
            except rpc.ResponseTooLargeError:
                if page_keys == 1:
                    raise
                page_keys = max(1, page_keys // 2)
                continue
            out.extend(kvs)
            if len(kvs) < want:
                break
            after = kvs[-1].key
        return out

    # ----- sessions, ids, compaction -----------------------------------------

    async def create_session(self, ttl_ms: int) -> int:
        result = await self._write(CreateSession(ttl_ms=ttl_ms))
        assert isinstance(result, SessionResult)
        return result.session_id

    async def keepalive(self, session_id: int) -> bool:
        """Refresh a session; False if it expired (its ephemeral keys are gone)."""
        request = MetaKeepAliveRequest(session_id=session_id)

        async def attempt(address: str, left_s: float) -> int:
            response = await self._pool.call(
                address, request, timeout_s=min(self._request_timeout_s, left_s))
            return response.ttl_ms

        return await self._retrying(attempt, leader=True) > 0

    async def revoke_session(self, session_id: int, *,
                             deadline_s: float | None = None) -> None:
        """End a session now (its keys vanish). ``deadline_s`` bounds the attempts
        (default: the client's operation deadline); a close that revokes its
        session only to save others the lease's wait passes
        ``CLOSE_REVOKE_DEADLINE_S``: without a meta quorum (a cluster stopping
        all at once) it gives up soon, and the lease ends the session."""
        await self._write(RevokeSession(session_id=session_id), deadline_s=deadline_s)

    async def next_id(self, name: str, count: int = 1) -> int:
        """The first of ``count`` unique increasing ids of sequence ``name``."""
        result = await self._write(NextId(name=name, count=count))
        assert isinstance(result, IdResult)
        return result.first

    async def compact(self, revision: int) -> None:
        await self._write(Compact(revision=revision))

    # ----- watch and status ----------------------------------------------------

    async def watch_once(
        self, key: str, *, prefix: bool = False, start_revision: int, wait_ms: int = 10_000
    ) -> tuple[list[Event], int]:
        """Events from ``start_revision`` on (waiting up to ``wait_ms`` for one)."""
        request = MetaWatchRequest(
            key=key, prefix=prefix, start_revision=start_revision, wait_ms=wait_ms
        )

        async def attempt(address: str, left_s: float) -> tuple[list[Event], int]:
            response = await self._pool.call(
                address, request,
                timeout_s=min(self._request_timeout_s + wait_ms / 1000, left_s))
            return response.events, response.revision

        # A long poll: its attempt may take wait_ms on top of a request.
        return await self._retrying(
            attempt, leader=False,
            deadline_s=max(self._deadline_s, self._request_timeout_s + wait_ms / 1000))

    async def watch(self, key: str, *, prefix: bool = False, start_revision: int) -> Any:
        """Async iterator of events in revision order, resuming across reconnects."""
        next_revision = start_revision
        while True:
            events, _ = await self.watch_once(key, prefix=prefix, start_revision=next_revision)
            for event in events:
                yield event
                next_revision = event.kv.mod_revision + 1

    async def change_member(self, action: str, node_id: int, address: str = "") -> tuple[
        list[int], list[int]
    ]:
        """add | add_learner | promote | remove a meta member; returns (voters, learners).

        Not retried on an unknown outcome (a membership change is not idempotent):
        check ``status`` and try again if it did not happen.
        """
        request = MetaMemberRequest(action=action, node_id=node_id, address=address)

        async def attempt(addr: str, left_s: float) -> tuple[list[int], list[int]]:
            response = await self._pool.call(
                addr, request, timeout_s=min(self._request_timeout_s * 2, left_s))
            return response.voters, response.learners

        return await self._retrying(attempt, leader=True)

    async def snapshot_chunk(self, snapshot_id: int = 0, offset: int = 0) -> MetaSnapshotResponse:
        """One chunk of a backup of the meta state, from the leader
        (``snapshot_id`` 0 takes a new one): see ``meta.save_snapshot``."""
        request = MetaSnapshotRequest(snapshot_id=snapshot_id, offset=offset)

        async def attempt(address: str, left_s: float) -> MetaSnapshotResponse:
            response: MetaSnapshotResponse = await self._pool.call(
                address, request, timeout_s=min(self._request_timeout_s * 2, left_s))
            if response.leader:
                self._leader_named(response.leader)
            return response

        return await self._retrying(attempt, leader=True)

    async def status(self, address: str) -> MetaStatusResponse:
        return await self._pool.call(address, MetaStatusRequest(),
                                     timeout_s=self._request_timeout_s)


class BlockingMetaClient:
    """The same API, blocking: runs a MetaClient on an event loop in a thread."""

    def __init__(
        self, addresses: Sequence[str], *, deadline_s: float = OPERATION_DEADLINE_S
    ) -> None:
        self._loop = rpc.LoopThread(BLOCKING_LOOP_THREAD_NAME)
        try:
            self._client: MetaClient = self._run(_make_client(addresses, deadline_s))
        except BaseException:
            self._loop.close()
            raise

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop.call(coro)

    def __enter__(self) -> BlockingMetaClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._loop.closed:
            return
        try:
            self._run(self._client.close())
        finally:
            self._loop.close()

    def put(self, key: str, value: bytes, *, session_id: int = 0) -> int:
        return self._run(self._client.put(key, value, session_id=session_id))

    def cas(self, key: str, expected_version: int, value: bytes) -> bool:
        return self._run(self._client.cas(key, expected_version, value))

    def get(self, key: str, *, serializable: bool = False) -> KeyValue | None:
        return self._run(self._client.get(key, serializable=serializable))

    def list_pages(self, prefix: str, *, limit: int = 0) -> list[KeyValue]:
        return self._run(self._client.list_pages(prefix, limit=limit))

    def list_keys(
        self, prefix: str, *, limit: int = 0, serializable: bool = False
    ) -> list[KeyValue]:
        return self._run(self._client.list_keys(prefix, limit=limit, serializable=serializable))

    def delete(self, key: str, *, prefix: bool = False) -> int:
        return self._run(self._client.delete(key, prefix=prefix))

    def txn(self, compares: Sequence[Compare] = (), success: Sequence[Op] = (),
            failure: Sequence[Op] = ()) -> TxnResult:
        return self._run(self._client.txn(compares, success, failure))

    def next_id(self, name: str, count: int = 1) -> int:
        return self._run(self._client.next_id(name, count))

    def create_session(self, ttl_ms: int) -> int:
        return self._run(self._client.create_session(ttl_ms))

    def keepalive(self, session_id: int) -> bool:
        return self._run(self._client.keepalive(session_id))

    def change_member(self, action: str, node_id: int, address: str = "") -> tuple[
        list[int], list[int]
    ]:
        return self._run(self._client.change_member(action, node_id, address))

    def watch_once(self, key: str, *, prefix: bool = False, start_revision: int,
                   wait_ms: int = 10_000) -> tuple[list[Event], int]:
        return self._run(self._client.watch_once(key, prefix=prefix,
                                                 start_revision=start_revision, wait_ms=wait_ms))


async def _make_client(addresses: Sequence[str], deadline_s: float) -> MetaClient:
    return MetaClient(addresses, deadline_s=deadline_s)


