"""The metadata state machine: a deterministic, replicated KV store.

Applied by every member in log order, so it must be a pure function of the
log: no clocks, no randomness, no iteration over unordered sets in outputs.
Semantics follow etcd v3:

* every write transaction that changes something gets the next *revision*;
  each key keeps create/mod revisions and a *version* (number of puts since
  creation; 0 means absent);
* a transaction checks all compares, then applies all success (or failure)
  operations — all or nothing;
* sessions (etcd leases) own ephemeral keys; revoking a session deletes them.
  Expiry is decided by the leader's clock and replicated as RevokeSession, so
  the state machine itself never reads a clock;
* an event history (bounded in events and in bytes) serves watches from a
  revision; older revisions are compacted and a watch starting there gets a
  clear error;
* requests carry (session, seq, first outstanding seq): a retry of any write
  the client has not acknowledged returns its first result instead of
  applying twice (``_client_sessions``: bounded in bytes, expiring with the
  session's lease).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

import msgspec
from sortedcontainers import SortedDict

from quorumlog.config import Config, require
from quorumlog.errors import QuorumlogError, invariant
from quorumlog.meta._client_sessions import SESSION_EXPIRED, ClientSessionTable, SessionRow
from quorumlog.meta._commands import (
    Command,
    Compact,
    CompactResult,
    Compare,
    CompareOp,
    CompareTarget,
    CreateSession,
    DeleteOp,
    DeleteResult,
    ErrorResult,
    Event,
    EventType,
    IdResult,
    KeyValue,
    NextId,
    OpResult,
    PutOp,
    PutResult,
    RangeOp,
    RangeResult,
    Request,
    Result,
    RevokeSession,
    SessionResult,
    Txn,
    TxnResult,
)

Applied = tuple[Result, list[Event]]
"""What applying one request returns: its result and the events it made."""

EVENT_OVERHEAD_BYTES = 64
"""What one history event costs beyond its keys and values (revisions, version,
session, framing), for the history's byte bound."""


class CompactedError(QuorumlogError):
    """A watch or read asked for a revision older than the compacted history."""


class MetaLimits(Config, frozen=True):
    key_max_bytes: int = 4096  # paths, not documents
    value_max_bytes: int = 1024 * 1024  # ledger metadata with many fragments fits easily
    txn_ops_max: int = 128  # etcd's default --max-txn-ops
    range_limit_max: int = 10_000  # one response stays bounded
    # Watch history kept for resumption; it is part of every snapshot, so it is
    # kept modest (a watcher further behind re-reads and resumes from now).
    # Bounded by events and by bytes (keys and values of each event and of its
    # previous version): 10,000 events of 1 MiB values would be 20 GiB.
    history_events_max: int = 10_000
    history_bytes_max: int = 32 * 1024 * 1024
    # Exactly-once client sessions (see _client_sessions): results of writes a
    # client has not acknowledged are kept for its retries. They are part of
    # every snapshot, so they are bounded in bytes: a session over its own
    # bound (a client that never acknowledges) is evicted, and beyond the
    # total the least recently used sessions are; a larger result is answered
    # once and retries get a clear error.
    client_session_bytes_max: int = 1024 * 1024
    client_sessions_bytes_max: int = 16 * 1024 * 1024
    client_response_bytes_max: int = 64 * 1024
    session_ttl_ms_min: int = 500
    session_ttl_ms_max: int = 3_600_000
    id_block_max: int = 1_000_000

    def validate(self) -> None:
        require(self.key_max_bytes > 0, "key_max_bytes must be positive")
        require(self.value_max_bytes > 0, "value_max_bytes must be positive")
        require(self.txn_ops_max >= 1, "txn_ops_max must be >= 1")
        require(self.range_limit_max >= 1, "range_limit_max must be >= 1")
        require(self.history_events_max >= 1, "history_events_max must be >= 1")
        require(
            0 < self.client_response_bytes_max <= self.client_session_bytes_max
            <= self.client_sessions_bytes_max,
            "need 0 < client_response_bytes_max <= client_session_bytes_max "
            "<= client_sessions_bytes_max",
        )
        require(self.history_bytes_max >= 1, "history_bytes_max must be >= 1")
        require(
            0 < self.session_ttl_ms_min <= self.session_ttl_ms_max,
            "need 0 < session_ttl_ms_min <= session_ttl_ms_max",
        )


class _Session(msgspec.Struct, kw_only=True):
    ttl_ms: int
    keys: list[str] = msgspec.field(default_factory=list)


class _Snapshot(msgspec.Struct, kw_only=True):
    applied_index: int
    revision: int
    compacted_revision: int
    kvs: list[KeyValue]
    sessions: dict[int, _Session]
    next_session_id: int
    ids: dict[str, int]
    client_sessions: list[SessionRow] = []
    history: list[tuple[int, list[Event]]]


class _InvalidRequestError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class MetaStateMachine:
    """Apply requests in log order; serve reads from the current state."""

    def __init__(self, limits: MetaLimits | None = None) -> None:
        self.limits = limits or MetaLimits()
        self._reset()

    def _reset(self) -> None:
        self.applied_index = 0
        self.revision = 0
        self.compacted_revision = 0
        self._kvs: SortedDict = SortedDict()  # key -> KeyValue
        self._sessions: dict[int, _Session] = {}
        self._next_session_id = 1
        self._ids: dict[str, int] = {}
        self._client_sessions = ClientSessionTable(
            session_bytes_max=self.limits.client_session_bytes_max,
            sessions_bytes_max=self.limits.client_sessions_bytes_max,
            response_bytes_max=self.limits.client_response_bytes_max,
        )
        self._history: deque[tuple[int, list[Event]]] = deque()
        # Bytes of each history record, in the same order (computed once, not
        # again when the record is dropped: once per write at the bound).
        self._history_sizes: deque[int] = deque()
        self._history_events = 0
        self._history_bytes = 0
        self._pending_events: list[Event] = []

    # ----- applying -------------------------------------------------------

    def apply(self, index: int, data: bytes) -> Applied | list[Applied]:
        """Apply the request encoded in log entry ``index``; return result and
        events. A combined entry (``raft.combine_msgpack``) applies its requests in
        order, each with its own revision, and returns one pair per request."""
        invariant(index > self.applied_index, f"apply index {index} <= {self.applied_index}")
        self.applied_index = index
        try:
            request = _LOG_ENTRY_DECODER.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return self._apply_undecodable(data, exc)
        if isinstance(request, list):
            return [self._apply_request(r) for r in request]
        return self._apply_request(request)

    def _apply_undecodable(self, data: bytes, exc: Exception) -> Applied | list[Applied]:
        """An entry that does not decode as a whole: one error, or, for a
        combined entry, one error per request that does not decode while the
        others apply (each request is on its own; a leader checks every
        request before it proposes it, so this is for entries written by
        another version)."""
        try:
            parts = _COMBINED_PARTS_DECODER.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return _malformed(exc), []
        applied: list[Applied] = []
        for part in parts:
            try:
                request = _REQUEST_DECODER.decode(part)
            except (msgspec.DecodeError, msgspec.ValidationError) as part_exc:
                applied.append((_malformed(part_exc), []))
            else:
                applied.append(self._apply_request(request))
        return applied

    def _apply_request(self, request: Request) -> Applied:
        if not request.session_id:
            return self._apply_command(request.command)
        answered = self._answered(request)
        if answered is not None:
            return answered, []
        result, events = self._apply_command(request.command)
        self._client_sessions.store(request, result)
        return result, events

    def _answered(self, request: Request) -> Result | None:
        """A kept result or an error for a session request, None to apply it."""
        if request.session_id not in self._client_sessions:
            why = (
                "was evicted from the session table (client_session_bytes_max / "
                "client_sessions_bytes_max)"
                if request.session_id in self._sessions
                else "expired or was revoked"
            )
            return ErrorResult(
                code=SESSION_EXPIRED,
                message=f"client session {request.session_id} {why}; request seq "
                f"{request.seq} was not applied now, and the outcome of an earlier attempt "
                "of it is unknown: read the keys it touches, then retry in a new session",
            )
        return self._client_sessions.answered(request)

    def _apply_command(self, command: Command) -> tuple[Result, list[Event]]:
        self._pending_events = []
        try:
            result = self._dispatch(command)
        except _InvalidRequestError as exc:
            invariant(not self._pending_events, "a rejected request must change nothing")
            return ErrorResult(code=exc.code, message=str(exc)), []
        events = self._pending_events
        self._pending_events = []
        if events:
            self._record_history(events)
        return result, events

    def _dispatch(self, command: Command) -> Result:
        if isinstance(command, Txn):
            return self._txn(command)
        if isinstance(command, CreateSession):
            return self._create_session(command)
        if isinstance(command, RevokeSession):
            return self._revoke_session(command.session_id)
        if isinstance(command, NextId):
            return self._next_id(command)
        invariant(isinstance(command, Compact), f"unknown command {command!r}")
        return self._compact(command)

    # ----- transactions ---------------------------------------------------

    def _txn(self, txn: Txn) -> TxnResult:
        self._validate_txn(txn)
        succeeded = all(self._compare(c) for c in txn.compares)
        ops = txn.success if succeeded else txn.failure
        writes = any(not isinstance(op, RangeOp) for op in ops)
        revision = self.revision + 1 if writes else self.revision
        results = tuple(self._op(op, revision) for op in ops)
        if self._pending_events:
            self.revision = revision
        return TxnResult(succeeded=succeeded, results=results, revision=self.revision)

    def _validate_txn(self, txn: Txn) -> None:
        lim = self.limits
        total = len(txn.success) + len(txn.failure) + len(txn.compares)
        if total > lim.txn_ops_max:
            raise _InvalidRequestError(
                "too_many_ops", f"{total} operations > txn_ops_max {lim.txn_ops_max}"
            )
        keys = [c.key for c in txn.compares] + [op.key for op in (*txn.success, *txn.failure)]
        for key in keys:
            _check_key(key, lim.key_max_bytes)
        for op in (*txn.success, *txn.failure):
            if isinstance(op, PutOp):
                if len(op.value) > lim.value_max_bytes:
                    raise _InvalidRequestError(
                        "value_too_large",
                        f"value of {op.key!r} is {len(op.value)} bytes > {lim.value_max_bytes}",
                    )
                if op.session_id and op.session_id not in self._sessions:
                    raise _InvalidRequestError(
                        "session_not_found",
                        f"session {op.session_id} does not exist (expired or revoked); "
                        "create a new session",
                    )

    def _compare(self, c: Compare) -> bool:
        kv: KeyValue | None = self._kvs.get(c.key)
        left: int | bytes
        right: int | bytes
        if c.target is CompareTarget.VALUE:
            if kv is None:
                return c.op is CompareOp.NOT_EQUAL
            left, right = kv.value, c.value
        elif c.target is CompareTarget.VERSION:
            left, right = (kv.version if kv else 0), c.version
        elif c.target is CompareTarget.MOD_REVISION:
            left, right = (kv.mod_revision if kv else 0), c.revision
        else:
            left, right = (kv.create_revision if kv else 0), c.revision
        return _cmp(c.op, left, right)

    def _op(self, op: PutOp | DeleteOp | RangeOp, revision: int) -> OpResult:
        if isinstance(op, RangeOp):
            return self.range(op)
        if isinstance(op, PutOp):
            return self._put(op, revision)
        return self._delete(op, revision)

    def _put(self, op: PutOp, revision: int) -> PutResult:
        prev: KeyValue | None = self._kvs.get(op.key)
        if prev is not None and prev.session_id and prev.session_id != op.session_id:
            self._unbind(prev.session_id, op.key)
        kv = KeyValue(
            key=op.key,
            value=op.value,
            create_revision=prev.create_revision if prev else revision,
            mod_revision=revision,
            version=prev.version + 1 if prev else 1,
            session_id=op.session_id,
        )
        self._kvs[op.key] = kv
        if op.session_id and (prev is None or prev.session_id != op.session_id):
            self._sessions[op.session_id].keys.append(op.key)
        self._pending_events.append(Event(type=EventType.PUT, kv=kv, prev=prev))
        return PutResult(prev=prev if op.prev_kv else None)

    def _delete(self, op: DeleteOp, revision: int) -> DeleteResult:
        keys = list(self._prefix_keys(op.key)) if op.prefix else (
            [op.key] if op.key in self._kvs else []
        )
        prevs = []
        for key in keys:
            prev = self._kvs.pop(key)
            if prev.session_id:
                self._unbind(prev.session_id, key)
            tomb = KeyValue(key=key, value=b"", create_revision=0, mod_revision=revision, version=0)
            self._pending_events.append(Event(type=EventType.DELETE, kv=tomb, prev=prev))
            prevs.append(prev)
        return DeleteResult(deleted=len(keys), prev=tuple(prevs) if op.prev_kv else ())

    # ----- reads ----------------------------------------------------------

    def get(self, key: str) -> KeyValue | None:
        kv: KeyValue | None = self._kvs.get(key)
        return kv

    def range(self, op: RangeOp) -> RangeResult:
        """Keys in order: one key, a prefix, or [key, end); bounded by limit."""
        limit = min(op.limit or self.limits.range_limit_max, self.limits.range_limit_max)
        if op.prefix:
            keys: Iterator[str] = self._prefix_keys(op.key)
        elif op.end:
            keys = self._kvs.irange(op.key, op.end, inclusive=(True, False))
        else:
            keys = iter([op.key] if op.key in self._kvs else [])
        out: list[KeyValue] = []
        count = 0
        for key in keys:
            count += 1
            if len(out) < limit:
                kv = self._kvs[key]
                out.append(msgspec.structs.replace(kv, value=b"") if op.keys_only else kv)
        return RangeResult(kvs=tuple(out), more=count > len(out), count=count)

    def _prefix_keys(self, prefix: str) -> Iterator[str]:
        key: str
        for key in self._kvs.irange(minimum=prefix):
            if not key.startswith(prefix):
                return
            yield key

    # ----- sessions, ids, compaction --------------------------------------

    def _create_session(self, cmd: CreateSession) -> SessionResult:
        lim = self.limits
        if not lim.session_ttl_ms_min <= cmd.ttl_ms <= lim.session_ttl_ms_max:
            raise _InvalidRequestError(
                "bad_ttl",
                f"session ttl {cmd.ttl_ms} ms outside [{lim.session_ttl_ms_min}, "
                f"{lim.session_ttl_ms_max}]",
            )
        session_id = self._next_session_id
        self._next_session_id += 1
        self._sessions[session_id] = _Session(ttl_ms=cmd.ttl_ms)
        self._client_sessions.open(session_id)
        return SessionResult(session_id=session_id, ttl_ms=cmd.ttl_ms)

    def _revoke_session(self, session_id: int) -> SessionResult:
        session = self._sessions.pop(session_id, None)
        self._client_sessions.close(session_id)
        if session is None:
            return SessionResult(session_id=session_id, ttl_ms=0, found=False)
        revision = self.revision + 1
        for key in sorted(session.keys):
            kv: KeyValue | None = self._kvs.get(key)
            if kv is not None and kv.session_id == session_id:
                self._delete(DeleteOp(key=key), revision)
        if self._pending_events:
            self.revision = revision
        return SessionResult(session_id=session_id, ttl_ms=session.ttl_ms)

    def _unbind(self, session_id: int, key: str) -> None:
        session = self._sessions.get(session_id)
        if session is not None and key in session.keys:
            session.keys.remove(key)

    def sessions(self) -> dict[int, int]:
        """Live sessions and their TTL in ms (the leader tracks their deadlines)."""
        return {sid: s.ttl_ms for sid, s in sorted(self._sessions.items())}

    def _next_id(self, cmd: NextId) -> IdResult:
        _check_key(cmd.name, self.limits.key_max_bytes)
        if not 1 <= cmd.count <= self.limits.id_block_max:
            raise _InvalidRequestError(
                "bad_count", f"id block of {cmd.count} outside [1, {self.limits.id_block_max}]"
            )
        first = self._ids.get(cmd.name, 0) + 1
        self._ids[cmd.name] = first + cmd.count - 1
        return IdResult(first=first)

    def _compact(self, cmd: Compact) -> CompactResult:
        if cmd.revision > self.revision:
            raise _InvalidRequestError(
                "future_revision", f"cannot compact to {cmd.revision} > current {self.revision}"
            )
        while self._history and self._history[0][0] <= cmd.revision:
            self._drop_oldest_history()
        self.compacted_revision = max(self.compacted_revision, cmd.revision)
        return CompactResult(compacted_revision=self.compacted_revision)

    # ----- watch history ----------------------------------------------------

    def _record_history(self, events: list[Event]) -> None:
        size = _events_bytes(events)
        self._history.append((self.revision, events))
        self._history_sizes.append(size)
        self._history_events += len(events)
        self._history_bytes += size
        limits = self.limits
        while len(self._history) > 1 and (
            self._history_events > limits.history_events_max
            or self._history_bytes > limits.history_bytes_max
        ):
            self._drop_oldest_history()

    def _drop_oldest_history(self) -> None:
        revision, events = self._history.popleft()
        self._history_events -= len(events)
        self._history_bytes -= self._history_sizes.popleft()
        self.compacted_revision = max(self.compacted_revision, revision)

    @property
    def history_bytes(self) -> int:
        """Bytes the watch history counts against ``history_bytes_max``."""
        return self._history_bytes

    def events_since(self, start_revision: int, key: str, *, prefix: bool) -> list[Event]:
        """Events with revision >= start for a key or prefix, in revision order."""
        if start_revision <= self.compacted_revision:
            raise CompactedError(
                f"revision {start_revision} is compacted (history starts after "
                f"{self.compacted_revision}); re-read the current state and watch from "
                f"revision {self.revision + 1}"
            )
        # From the newest back to the start: a watch asks for what happened
        # since it last looked (or since the write that woke it), so this
        # visits the new revisions only, not the whole history (10,000
        # revisions by default).
        found: list[list[Event]] = []
        for revision, events in reversed(self._history):
            if revision < start_revision:
                break
            matched = [ev for ev in events
                       if ev.kv.key == key or (prefix and ev.kv.key.startswith(key))]
            if matched:
                found.append(matched)
        found.reverse()
        return [ev for matched in found for ev in matched]

    # ----- snapshots --------------------------------------------------------

    def snapshot(self) -> bytes:
        snap = _Snapshot(
            applied_index=self.applied_index,
            revision=self.revision,
            compacted_revision=self.compacted_revision,
            kvs=list(self._kvs.values()),
            sessions=self._sessions,
            next_session_id=self._next_session_id,
            ids=self._ids,
            client_sessions=self._client_sessions.snapshot(),
            history=list(self._history),
        )
        return _ENCODER.encode(snap)

    def restore(self, data: bytes) -> None:
        """Replace the state by a snapshot; empty data is the initial (bootstrap) state."""
        if not data:
            self._reset()
            return
        snap = msgspec.msgpack.decode(data, type=_Snapshot)
        self.applied_index = snap.applied_index
        self.revision = snap.revision
        self.compacted_revision = snap.compacted_revision
        self._kvs = SortedDict((kv.key, kv) for kv in snap.kvs)
        self._sessions = dict(snap.sessions)
        self._next_session_id = snap.next_session_id
        self._ids = dict(snap.ids)
        self._client_sessions.restore(snap.client_sessions)
        self._history = deque(snap.history)
        self._history_sizes = deque(_events_bytes(evs) for _, evs in self._history)
        self._history_events = sum(len(evs) for _, evs in self._history)
        self._history_bytes = sum(self._history_sizes)

    def rebase_for_restore(self, *, bump_ids: int, bump_revision: int,
                           member_prefix: str) -> None:
        """Prepare a restored state to start a new group (``meta snapshot restore``).

        Writes made after the backup are gone from this state, but not from
        the world: ledgers and tables created after it hold ids on bookies and
        table nodes, clients hold sessions and watch revisions. So, as etcd's
        ``--bump-revision --mark-compacted``: every id counter and the session
        counter move ``bump_ids`` ahead (a new ledger, table or session never
        reuses one handed out after the backup), the revision moves
        ``bump_revision`` ahead and the watch history is compacted up to it (a
        watcher resuming from a revision handed out after the backup gets
        CompactedError and lists again, rather than silently missing events).
        The member address keys under ``member_prefix`` (members added at run
        time) are dropped: the new group's members come from its nodes'
        configs, as a new group's do.
        """
        if bump_ids < 0 or bump_revision < 0:
            raise ValueError("bumps must be >= 0")
        self._ids = {name: value + bump_ids for name, value in self._ids.items()}
        self._next_session_id += bump_ids
        self.revision += bump_revision
        for key in list(self._prefix_keys(member_prefix)):
            del self._kvs[key]
        self._history.clear()
        self._history_sizes.clear()
        self._history_events = 0
        self._history_bytes = 0
        self.compacted_revision = self.revision

    def __len__(self) -> int:
        return len(self._kvs)


def _events_bytes(events: list[Event]) -> int:
    total = 0
    for event in events:
        total += EVENT_OVERHEAD_BYTES + len(event.kv.key.encode()) + len(event.kv.value)
        if event.prev is not None:
            total += len(event.prev.key.encode()) + len(event.prev.value)
    return total


def _check_key(key: str, key_max_bytes: int) -> None:
    if not key:
        raise _InvalidRequestError("bad_key", "keys must not be empty")
    if len(key.encode()) > key_max_bytes:
        raise _InvalidRequestError("bad_key", f"key of {len(key.encode())} bytes > {key_max_bytes}")


def _cmp(op: CompareOp, left: int | bytes, right: int | bytes) -> bool:
    if op is CompareOp.EQUAL:
        return left == right
    if op is CompareOp.NOT_EQUAL:
        return left != right
    if op is CompareOp.LESS:
        return left < right  # type: ignore[operator]
    return left > right  # type: ignore[operator]


_ENCODER = msgspec.msgpack.Encoder()
_REQUEST_DECODER = msgspec.msgpack.Decoder(Request)
# A log entry: one Request (a msgpack map), or a combined entry (a msgpack
# array of Requests, ``raft.combine_msgpack``: the writes a leader's ready pass
# proposes together, see MetaService._on_write).
_LOG_ENTRY_DECODER = msgspec.msgpack.Decoder(Request | list[Request])
_COMBINED_PARTS_DECODER = msgspec.msgpack.Decoder(list[msgspec.Raw])


def _malformed(exc: Exception) -> ErrorResult:
    return ErrorResult(code="malformed", message=f"malformed request: {exc}")

