"""The write handle: pipelined appends, ack quorums, in-order LAC, ensemble
changes and close. Recovery reuses it to rewrite recovered entries.

One :class:`_PendingAdd` per entry in flight (BookKeeper's ``PendingAddOp``).
Entry ``i`` goes to the Qw bookies starting at ensemble index ``i mod E``; it
is durable once Qa of them acked (``AckSet``); the LAC moves over every
leading durable entry, in order, and each append's future completes with its
entry id as the LAC passes it.

Batching: an add is not sent the moment it is made; it is queued for each
bookie of its write set, and at the end of the loop pass (``call_soon``)
every bookie gets what was queued for it as one ``AddEntriesRequest`` (a
queue of one goes as a plain ``AddEntryRequest``), in entry order, split at
``proto.ADD_BATCH_ENTRIES_MAX`` entries or ``ADD_BATCH_BYTES_MAX`` bytes.
The bookie answers per entry; each entry's answer goes through the same
``_on_add_result`` as a single add's (acks, fencing, ensemble change), and a
failed request counts as a failure of each of its entries. Pipelined appends
and the recovery rewrites of one pass thus share requests and fsyncs.

Ensemble change: a bookie error or timeout before the entry has Qa acks
replaces that bookie: a new fragment starting at LAC + 1 is written to meta by
compare-and-swap on the version this handle holds, then the unconfirmed
entries are resent to the replaced indexes. While a change runs, nothing is
sent and no entry completes (BookKeeper's ``blockAddCompletions``), so every
entry past the new fragment's first one ends up on the new ensemble. An error
after Qa acks is remembered and replaces the bookie before the next append.

Recovery handles never publish an ensemble change by itself: the new
fragments stay in the handle and reach meta only in the compare-and-swap that
closes the ledger, after every rewritten entry has Qa acks on them
(BookKeeper's ``newEnsemblesFromRecovery``). While a ledger is IN_RECOVERY its
metadata therefore names the ensembles the old writer wrote to, whose write
sets can vouch for every acknowledged entry: Qa of each write set hold it, so
Qf = Qw - Qa + 1 "no such entry" answers prove an entry was never
acknowledged. A published fragment whose replacement bookie has not yet
received the entries would break that proof for a concurrent recoverer (it
would count the newcomer's "no such entry" and truncate the ledger).

A handle whose ledger was fenced (a bookie answers ``LedgerFencedError``, or
the metadata left the OPEN state under us) fails every pending append with
``LedgerFencedError`` and refuses new ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import enum
import functools
from collections import deque
from collections.abc import Callable
from typing import Any

from quorumlog import chunks, rpc
from quorumlog import proto as wire
from quorumlog.errors import QuorumlogError, UsageError, invariant
from quorumlog.ledger._bookie_client import BookieOutcome, outcome_of
from quorumlog.ledger._context import LedgerContext
from quorumlog.ledger._errors import (
    LedgerClosedError,
    LedgerRecoveryError,
    LedgerWriteError,
    MetadataConflictError,
)
from quorumlog.ledger._metadata import (
    LedgerMetadata,
    LedgerState,
    master_key,
)
from quorumlog.ledger._metrics import LEDGER_METRICS
from quorumlog.ledger._placement import NotEnoughBookiesError, choose_replacement
from quorumlog.ledger._quorum import AckSet
from quorumlog.proto import (
    DigestType,
    LedgerFencedError,
    NoSuchLedgerError,
    UnauthorizedError,
    encode_entry,
    mac_key,
)

RACK_LABELS = {"random": None, "rack_aware": "rack", "zone_aware": "zone"}
"""Placement policy name -> the bookie label that names its failure domain."""


def known_placement(name: str) -> str:
    """``name`` if it is a placement policy this client knows, else "random"."""
    return name if name in RACK_LABELS else "random"


class HandleState(enum.Enum):
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"
    DETACHED = "detached"  # stopped writing, ledger left OPEN (open_for_append resumes)
    FAILED = "failed"


class ClosedByOtherError(QuorumlogError):
    """Recovery only: another client closed the ledger first (carries its metadata)."""

    def __init__(self, message: str, *, metadata: LedgerMetadata, version: int) -> None:
        super().__init__(message)
        self.metadata = metadata
        self.version = version


AddCallback = Callable[[int, QuorumlogError | None], None]
"""``callback(entry_id, None)`` when an append is confirmed, ``callback(entry_id,
error)`` when the handle failed before it was (see ``append_with_callback``)."""


class _PendingAdd:
    """One entry on its way to its write set; its outcome goes to ``future`` or,
    for ``append_with_callback``, to ``callback``."""

    __slots__ = ("acks", "callback", "done", "entry_id", "envelope", "future", "sent_to",
                 "size", "started_s")

    def __init__(
        self, entry_id: int, envelope: bytes, size: int, *, ack_quorum: int,
        ensemble_size: int, future: asyncio.Future[int] | None, callback: AddCallback | None,
        started_s: float,
    ) -> None:
        self.entry_id = entry_id
        self.envelope = envelope
        self.size = size
        self.acks = AckSet(ack_quorum)
        self.sent_to: list[str | None] = [None] * ensemble_size  # by ensemble index
        self.future = future
        self.callback = callback
        self.done = False
        self.started_s = started_s  # loop time of the append: the add latency starts here


class _SingleAddAnswer:
    """The done-callback of one plain add request: it hands the answer to the
    handle with the entry, ensemble index and bookie it was for. One object
    per request for the garbage collector, where a partial of a bound method
    with its argument tuple is three."""

    __slots__ = ("bookie", "handle", "index", "pending")

    def __init__(self, handle: WriteHandle, pending: _PendingAdd, index: int,
                 bookie: str) -> None:
        self.handle = handle
        self.pending = pending
        self.index = index
        self.bookie = bookie

    def __call__(self, future: asyncio.Future[Any]) -> None:
        self.handle._on_add_done(self.pending, self.index, self.bookie, future)


_Queued = tuple[_PendingAdd, int, bytes]
"""An add waiting for the end of the loop pass: the entry, the ensemble index
it goes to, and its envelope."""


def _batches(queue: list[_Queued]) -> list[list[_Queued]]:
    """Split one bookie's queued adds into batches: entry ids strictly ascending
    (a resend queued behind a newer entry is put in its place; a later queueing
    of the same entry replaces an earlier one), at most ADD_BATCH_ENTRIES_MAX
    entries and ADD_BATCH_BYTES_MAX bytes (a larger entry goes alone)."""
    ordered = queue
    previous = -1
    for queued in queue:  # appends of one pass come ascending: no dict, no sort
        if queued[0].entry_id <= previous:
            by_entry = {item[0].entry_id: item for item in queue}
            ordered = [by_entry[entry_id] for entry_id in sorted(by_entry)]
            break
        previous = queued[0].entry_id
    if not ordered:
        return []
    return chunks.by_size(ordered, lambda queued: len(queued[2]), wire.ADD_BATCH_BYTES_MAX,
                          wire.ADD_BATCH_ENTRIES_MAX)


class WriteHandle:
    """An open ledger this client writes (see the module docstring).

    ``append`` waits for room when too many adds are outstanding;
    ``append_async`` returns a future at once (raising ``BackpressureError``
    when there is no room). ``close`` waits for outstanding adds, then writes
    LAC and length into the metadata (state CLOSED).
    """

    def __init__(
        self, ctx: LedgerContext, metadata: LedgerMetadata, version: int, password: bytes,
        *, placement: str = "random", recovery: bool = False, lac: int = -1,
        length_known: bool = True,
    ) -> None:
        invariant(placement in RACK_LABELS, f"unknown placement {placement!r}")
        self._ctx = ctx
        self._config = ctx.config
        self._loop = asyncio.get_running_loop()
        self._metadata = metadata
        self._version = version
        self._ensemble = metadata.current_ensemble
        self._schedule = metadata.schedule
        self._write_sets = [self._schedule.write_set(i) for i in range(metadata.ensemble_size)]
        self._ensemble_size = self._schedule.ensemble_size  # E, Qa: fixed for the ledger's life
        self._ack_quorum = self._schedule.ack_quorum
        self._rack_label = RACK_LABELS[placement]
        self._master_key = master_key(password)
        self._digest = metadata.digest
        self._mac_key = mac_key(password) if metadata.digest is DigestType.HMAC_SHA256 else b""
        self._recovery = recovery
        self._flags = wire.FLAG_RECOVERY if recovery else 0
        self._expected_state = LedgerState.IN_RECOVERY if recovery else LedgerState.OPEN
        self._add_timeout_s = self._config.add_timeout_ms / 1000
        self._state = HandleState.OPEN
        self._error: QuorumlogError | None = None
        self._lac = lac
        self._next_entry_id = lac + 1
        self._length_bytes = max(metadata.length_bytes, 0)
        self._length_known = length_known and not recovery
        self._pending: deque[_PendingAdd] = deque()
        self._outstanding_bytes = 0
        self._room_waiters: deque[asyncio.Future[None]] = deque()
        self._idle_waiters: list[asyncio.Future[None]] = []
        # Ensemble changes.
        self._changing = False
        self._failed: dict[int, str] = {}  # index -> bookie that failed before Qa
        self._delayed_failures: dict[int, str] = {}  # failed after Qa: next append
        self._bad_bookies: set[str] = set()
        self._changes = 0
        self._background: set[asyncio.Task[Any]] = set()
        # Explicit LAC for tailing readers.
        self._lac_piggybacked = lac  # highest LAC carried by an envelope sent
        self._adds_since_tick = 0
        self._lac_timer: asyncio.TimerHandle | None = None
        # Adds queued in this loop pass, per bookie, and batches sent (a count).
        self._outbox: dict[str, list[_Queued]] = {}
        self._flush_handle: asyncio.Handle | None = None  # the end-of-pass send, if queued
        self._batches_sent = 0
        # The context the answers of this handle's adds run in: the one it was
        # made in. add_done_callback without one copies the current context,
        # one more object per request for the garbage collector to track.
        self._context = contextvars.copy_context()

    # ----- properties ---------------------------------------------------------

    @property
    def id(self) -> int:
        return self._metadata.ledger_id

    @property
    def metadata(self) -> LedgerMetadata:
        return self._metadata

    @property
    def metadata_version(self) -> int:
        return self._version

    @property
    def last_add_confirmed(self) -> int:
        return self._lac

    @property
    def length_bytes(self) -> int:
        """Payload bytes of the confirmed entries (-1: unknown, for a handle that
        resumed or recovered a ledger)."""
        return self._length_bytes if self._length_known else -1

    @property
    def is_closed(self) -> bool:
        return self._state is HandleState.CLOSED

    @property
    def outstanding_adds(self) -> int:
        return len(self._pending)

    @property
    def add_batches_sent(self) -> int:
        """How many batches of adds (two or more entries to one bookie) this
        handle sent."""
        return self._batches_sent

    @property
    def ensemble_changes(self) -> int:
        return self._changes

    @property
    def failure(self) -> QuorumlogError | None:
        """Why the handle failed (None while it works)."""
        return self._error

    def __repr__(self) -> str:
        return (f"WriteHandle(id={self.id}, lac={self._lac}, state={self._state.value}, "
                f"ensemble={list(self._ensemble)})")

    # ----- appends ------------------------------------------------------------

    def append_async(self, payload: bytes | bytearray | memoryview) -> asyncio.Future[int]:
        """Append now; the future completes with the entry id once confirmed.

        Raises BackpressureError (retriable) when ``outstanding_adds_max`` or
        ``outstanding_bytes_max`` would be passed; ``append`` waits instead.
        """
        size = self._admit(payload, "await append() or the earlier futures first")
        return self._append(payload, size)

    async def append(self, payload: bytes | bytearray | memoryview) -> int:
        """Append one entry and return its id once it is confirmed (Qa acks,
        every earlier entry confirmed). Waits (FIFO) while the handle has too
        many adds outstanding."""
        self._check_writable()
        size = self._check_size(payload)
        while self._room_waiters or not self._has_room(size):
            waiter = self._loop.create_future()
            self._room_waiters.append(waiter)
            try:
                await waiter
            finally:
                with contextlib.suppress(ValueError):
                    self._room_waiters.remove(waiter)
            self._check_writable()
            if self._has_room(size):
                break
        return await self._append(payload, size)

    def _check_writable(self) -> None:
        if self._state is HandleState.OPEN:
            return
        if self._state is HandleState.FAILED and self._error is not None:
            raise self._error
        raise LedgerClosedError(f"ledger {self.id} is {self._state.value}: no more appends")

    def _check_size(self, payload: bytes | bytearray | memoryview) -> int:
        size = payload.nbytes if isinstance(payload, memoryview) else len(payload)
        if size > self._config.entry_max_bytes:
            raise UsageError(
                f"entry of {size} bytes exceeds entry_max_bytes {self._config.entry_max_bytes}"
            )
        return size

    def _admit(self, payload: bytes | bytearray | memoryview, hint: str) -> int:
        """The payload's size, once the handle is writable and has room for it;
        BackpressureError (retriable, ending with ``hint``) when it has not."""
        self._check_writable()
        size = self._check_size(payload)
        if not self._has_room(size):
            raise rpc.BackpressureError(
                f"ledger {self.id}: {len(self._pending)} adds / {self._outstanding_bytes} bytes "
                f"outstanding; {hint}")
        return size

    def _has_room(self, size: int) -> bool:
        if not self._pending:
            return True
        return (len(self._pending) < self._config.outstanding_adds_max
                and self._outstanding_bytes + size <= self._config.outstanding_bytes_max)

    def append_with_callback(self, payload: bytes | bytearray | memoryview,
                             callback: AddCallback) -> int:
        """Append now, as ``append_async``, and return the entry id at once.

        Instead of a future, ``callback(entry_id, None)`` is called when the
        entry is confirmed, by the code that confirms it (in entry order, after
        the handle's own bookkeeping: the LAC has moved, room is given back),
        or ``callback(entry_id, error)`` when the handle fails before that. A
        future's done-callback waits a loop pass; on a busy event loop that
        pass is milliseconds, for every entry. The callback may append to this
        handle; it should not raise (an exception is reported to the loop's
        exception handler and the next callbacks still run).
        """
        size = self._admit(payload, "wait for earlier appends first")
        entry_id = self._next_entry_id
        self._add(entry_id, self._envelope(entry_id, payload), size, self._lac,
                  callback=callback)
        return entry_id

    def _envelope(self, entry_id: int, payload: bytes | bytearray | memoryview) -> bytes:
        if isinstance(payload, bytearray):
            payload = memoryview(payload)
        elif isinstance(payload, memoryview) and payload.itemsize != 1:
            payload = payload.cast("B")
        return encode_entry(
            self.id, entry_id, self._lac, payload, digest=self._digest, key=self._mac_key
        )

    def _append(self, payload: bytes | bytearray | memoryview, size: int) -> asyncio.Future[int]:
        entry_id = self._next_entry_id
        return self._future_of(self._add(entry_id, self._envelope(entry_id, payload), size,
                                         self._lac))

    def add_recovered(self, entry_id: int, envelope: bytes, size: int) -> asyncio.Future[int]:
        """Recovery: rewrite an entry found on some bookie to its whole write set."""
        invariant(self._recovery, "add_recovered is for recovery handles only")
        self._check_writable()
        return self._future_of(self._add(entry_id, envelope, size, -1))

    @staticmethod
    def _future_of(pending: _PendingAdd) -> asyncio.Future[int]:
        future = pending.future
        invariant(future is not None, "an add without a callback has a future")
        assert future is not None
        return future

    def _add(self, entry_id: int, envelope: bytes, size: int, lac: int,
             callback: AddCallback | None = None) -> _PendingAdd:
        invariant(entry_id == self._next_entry_id,
                  f"entry {entry_id} added out of order (next is {self._next_entry_id})")
        self._next_entry_id += 1
        loop = self._loop
        future: asyncio.Future[int] | None = None if callback else loop.create_future()
        ensemble_size = self._ensemble_size
        pending = _PendingAdd(entry_id, envelope, size, ack_quorum=self._ack_quorum,
                              ensemble_size=ensemble_size, future=future, callback=callback,
                              started_s=loop.time())
        self._pending.append(pending)
        self._outstanding_bytes += size
        self._adds_since_tick += 1
        self._lac_piggybacked = max(self._lac_piggybacked, lac)
        if self._delayed_failures and not self._changing:
            self._start_change()
        if not self._changing:
            self._send(pending, self._write_sets[entry_id % ensemble_size])
        return pending

    def _send(self, pending: _PendingAdd, indexes: tuple[int, ...] | list[int]) -> None:
        """Queue the entry for the bookies at ``indexes``; everything queued in
        one loop pass goes out at its end, one batch per bookie (``_flush``).
        The envelope is taken now: a queued entry may be confirmed (and its
        envelope dropped) by other bookies before the flush."""
        ensemble = self._ensemble
        outbox = self._outbox
        for index in indexes:
            bookie = ensemble[index]
            pending.sent_to[index] = bookie
            queue = outbox.get(bookie)
            if queue is None:
                outbox[bookie] = queue = []
            queue.append((pending, index, pending.envelope))
        if self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush, context=self._context)

    def send_queued(self) -> None:
        """Send the adds queued so far now instead of at the end of the loop pass.

        For a caller that batched its entries itself (the stream writer sends
        what one pass of its producer gathered): it saves the loop pass the
        batch would wait for, which on a busy event loop is milliseconds.
        Entries appended after this call go at the end of the pass as usual.
        """
        handle = self._flush_handle
        if handle is not None:
            handle.cancel()
            self._flush()

    def _flush(self) -> None:
        """Send what this loop pass queued: per bookie, in entry order, in
        batches bounded by ``ADD_BATCH_ENTRIES_MAX`` and ``ADD_BATCH_BYTES_MAX``."""
        self._flush_handle = None
        outbox, self._outbox = self._outbox, {}
        if self._state is HandleState.FAILED:
            return  # every pending add already failed
        for bookie, queue in outbox.items():
            for batch in _batches(queue):
                self._send_batch(bookie, batch)

    def _send_batch(self, bookie: str, batch: list[_Queued]) -> None:
        timeout_s = self._add_timeout_s
        if len(batch) == 1:  # a batch of one travels as a plain add
            pending, index, envelope = batch[0]
            single = self._ctx.bookies.add_entry(
                bookie, self.id, pending.entry_id, self._master_key, envelope,
                flags=self._flags, timeout_s=timeout_s)
            single.add_done_callback(_SingleAddAnswer(self, pending, index, bookie),
                                     context=self._context)
            return
        self._batches_sent += 1
        entries = [(pending.entry_id, envelope) for pending, _, envelope in batch]
        bookies = self._ctx.bookies
        # The rpc transport hands the answer over from the request's own callback
        # (one loop pass sooner); any other transport answers with a future.
        then = getattr(bookies, "add_entries_then", None)
        if then is not None:
            then(bookie, self.id, self._master_key, entries, flags=self._flags,
                 timeout_s=timeout_s, then=functools.partial(self._on_batch_answer, batch, bookie))
            return
        future = bookies.add_entries(bookie, self.id, self._master_key, entries,
                                     flags=self._flags, timeout_s=timeout_s)
        future.add_done_callback(functools.partial(self._on_batch_done, batch, bookie),
                                 context=self._context)

    def _on_batch_done(self, batch: list[_Queued], bookie: str,
                       future: asyncio.Future[list[QuorumlogError | None]]) -> None:
        if future.cancelled():
            self._on_batch_answer(batch, bookie, None, rpc.ConnectionClosedError(
                f"a batch of adds to bookie {bookie} was cancelled"))
        elif (error := future.exception()) is not None:
            self._on_batch_answer(batch, bookie, None, error)
        else:
            self._on_batch_answer(batch, bookie, future.result(), None)

    def _on_batch_answer(self, batch: list[_Queued], bookie: str,
                         results: list[QuorumlogError | None] | None,
                         error: BaseException | None) -> None:
        """Each entry of the batch gets its own outcome, in order (as if it had
        been answered alone); a failed request (``results`` None) fails every
        entry of it."""
        errors: list[BaseException | None] = (
            list(results) if results is not None else [error] * len(batch))
        invariant(len(errors) == len(batch), "a batch answer has one result per entry")
        if self._state is HandleState.FAILED:
            return  # every pending add already failed
        # Acks are counted entry by entry and the LAC moved once, after them (not
        # a drain per entry); an error is handled only after the acks before it
        # have confirmed what they can, as if each entry had been answered alone.
        ack_seen = False
        for (pending, index, _), entry_error in zip(batch, errors, strict=True):
            if entry_error is None:
                if (pending.sent_to[index] == bookie and not pending.done
                        and pending.acks.complete_and_check(index)):
                    ack_seen = True
                continue
            if ack_seen:
                self._drain_if_head_durable()
                ack_seen = False
            self._on_add_result(pending, index, bookie, entry_error)
        if ack_seen:
            self._drain_if_head_durable()

    def _drain_if_head_durable(self) -> None:
        if self._pending and self._pending[0].acks.complete:
            self._drain()

    def _on_add_done(
        self, pending: _PendingAdd, index: int, bookie: str, future: asyncio.Future[Any]
    ) -> None:
        if future.cancelled():
            error: BaseException | None = rpc.ConnectionClosedError(
                f"add to bookie {bookie} was cancelled")
        else:
            error = future.exception()
        self._on_add_result(pending, index, bookie, error)

    def _on_add_result(
        self, pending: _PendingAdd, index: int, bookie: str, error: BaseException | None
    ) -> None:
        if pending.sent_to[index] != bookie or self._state is HandleState.FAILED:
            return  # an answer from a replaced bookie, or nobody is waiting
        if error is None:
            if not pending.done and pending.acks.complete_and_check(index) and (
                    self._pending and self._pending[0] is pending):
                self._drain()
            return
        outcome = outcome_of(error)
        if outcome is BookieOutcome.FENCED:
            self._fail(LedgerFencedError(
                f"ledger {self.id} is fenced (bookie {bookie} refused entry "
                f"{pending.entry_id}): another client opened it with recovery; "
                "this writer can no longer add to it"))
            return
        if outcome is BookieOutcome.UNAUTHORIZED:
            self._fail(UnauthorizedError(
                f"bookie {bookie} refused ledger {self.id}'s master key: {error}"))
            return
        self._ctx.log.debug("ledger_add_failed", ledger=self.id, entry=pending.entry_id,
                           bookie=bookie, error=str(error), acked=len(pending.acks.acked))
        if pending.done or pending.acks.complete:
            if self._ensemble[index] == bookie:
                self._delayed_failures[index] = bookie
            return
        pending.acks.fail_and_check(index)
        if self._ensemble[index] == bookie:
            self._failed[index] = bookie
            self._bad_bookies.add(bookie)
            self._start_change()

    def _drain(self) -> None:
        """Complete every leading durable entry, in order; the LAC follows."""
        if self._changing or self._state is HandleState.FAILED:
            return
        pending = self._pending
        advanced = False
        now_s = self._loop.time()
        latency = LEDGER_METRICS.add_latency
        confirmed = confirmed_bytes = 0
        callbacks: list[_PendingAdd] = []
        while pending and pending[0].acks.complete:
            add = pending.popleft()
            latency.observe(now_s - add.started_s)
            confirmed += 1
            confirmed_bytes += add.size
            add.done = True
            add.envelope = b""
            self._lac = add.entry_id
            self._length_bytes += add.size
            self._outstanding_bytes -= add.size
            future = add.future
            if future is None:
                callbacks.append(add)
            elif not future.done():
                future.set_result(add.entry_id)
            advanced = True
        if not advanced:
            return
        LEDGER_METRICS.adds_ok += confirmed
        LEDGER_METRICS.added_bytes += confirmed_bytes
        try:
            self._after_drain()
        finally:
            self._call_back(callbacks, None)

    def _call_back(self, adds: list[_PendingAdd], error: QuorumlogError | None) -> None:
        """Outcomes for ``append_with_callback``, in entry order, once the handle's
        own state is settled (a callback may append)."""
        for add in adds:
            callback = add.callback
            add.callback = None
            if callback is None:
                continue
            try:
                callback(add.entry_id, error)
            except Exception as exc:  # a caller's bug must not stop the other outcomes
                self._loop.call_exception_handler({
                    "message": f"ledger {self.id}: an append callback raised", "exception": exc})

    def _after_drain(self) -> None:
        """The handle's bookkeeping after entries were confirmed."""
        if self._room_waiters:
            waiters, self._room_waiters = self._room_waiters, deque()
            for waiter in waiters:  # woken in FIFO order; each re-checks for room
                if not waiter.done():
                    waiter.set_result(None)
        if not self._pending:
            self._wake_idle()
        if self._config.explicit_lac_interval_ms and self._lac_timer is None:
            self._lac_timer = self._loop.call_later(
                self._config.explicit_lac_interval_ms / 1000, self._explicit_lac_tick)

    def _wake_idle(self) -> None:
        waiters, self._idle_waiters = self._idle_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _wait_idle(self) -> None:
        """Until nothing is outstanding (or the handle failed)."""
        while (self._pending or self._changing) and self._state is not HandleState.FAILED:
            waiter = self._loop.create_future()
            self._idle_waiters.append(waiter)
            await waiter

    # ----- explicit LAC -------------------------------------------------------

    def _explicit_lac_tick(self) -> None:
        self._lac_timer = None
        if self._state is not HandleState.OPEN or self._recovery:
            return
        if self._lac <= self._lac_piggybacked:
            return
        interval_s = self._config.explicit_lac_interval_ms / 1000
        if self._adds_since_tick:
            # Adds are flowing and carry the LAC; look again later.
            self._adds_since_tick = 0
            self._lac_timer = self._loop.call_later(interval_s, self._explicit_lac_tick)
            return
        self._send_explicit_lac()

    def _send_explicit_lac(self) -> None:
        lac = self._lac
        self._lac_piggybacked = lac
        for bookie in self._ensemble:
            self._spawn(self._write_lac(bookie, lac))

    async def _write_lac(self, bookie: str, lac: int) -> None:
        try:
            await self._ctx.bookies.write_lac(
                bookie, self.id, self._master_key, lac,
                timeout_s=self._config.read_timeout_ms / 1000)
        except QuorumlogError as exc:
            self._ctx.log.debug("ledger_write_lac_failed", ledger=self.id, bookie=bookie,
                                error=str(exc))

    def _spawn(self, coro: Any) -> None:
        task = self._loop.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ----- ensemble change ----------------------------------------------------

    def _start_change(self) -> None:
        if self._changing or self._state in (HandleState.FAILED, HandleState.CLOSED,
                                             HandleState.DETACHED):
            return
        self._changing = True
        self._spawn(self._run_changes())

    async def _run_changes(self) -> None:
        replaced: set[int] = set()
        try:
            while True:
                failed = {i: b for i, b in sorted({**self._delayed_failures,
                                                   **self._failed}.items())
                          if self._ensemble[i] == b}
                self._failed.clear()
                self._delayed_failures.clear()
                if not failed:
                    break
                self._changes += 1
                LEDGER_METRICS.ensemble_changes += 1
                if self._changes > self._config.ensemble_changes_max:
                    raise LedgerWriteError(
                        f"ledger {self.id}: more than {self._config.ensemble_changes_max} "
                        f"ensemble changes; last failed bookies {sorted(failed.values())}")
                replaced.update(await self._change_ensemble(failed))
        except QuorumlogError as exc:
            self._changing = False
            self._fail(exc)
            return
        except asyncio.CancelledError:
            self._changing = False
            raise
        self._changing = False
        if self._state is HandleState.FAILED:
            return
        self._resend(replaced)
        if self._pending and self._pending[0].acks.complete:
            self._drain()
        elif not self._pending:
            self._wake_idle()

    def _resend(self, replaced: set[int]) -> None:
        for pending in self._pending:
            write_set = self._write_sets[pending.entry_id % self._schedule.ensemble_size]
            if all(pending.sent_to[i] is None for i in write_set):
                self._send(pending, write_set)  # appended during the change
                continue
            indexes = [i for i in write_set if i in replaced]
            for index in indexes:
                pending.acks.remove(index)
            if indexes:
                self._send(pending, indexes)

    async def _change_ensemble(self, failed: dict[int, str]) -> set[int]:
        """Replace ``failed`` bookies in a new fragment from LAC + 1; return the
        indexes whose bookie changed."""
        replacements = await self._choose_replacements(failed)
        new = self._metadata.with_replaced_bookies(replacements, self._lac)
        if self._recovery:
            # Kept private until the close (see the module docstring): a
            # published recovery fragment would name bookies that cannot vouch
            # for the entries of its write sets.
            self._metadata = new
        else:
            await self._write_metadata(new)
        self._ctx.log.info(
            "ledger_ensemble_changed", ledger=self.id, first_entry=self._lac + 1,
            replaced={failed[i]: b for i, b in sorted(replacements.items())},
            changes=self._changes, recovery=self._recovery)
        self._ensemble = self._metadata.current_ensemble
        return set(replacements)

    async def _choose_replacements(self, failed: dict[int, str]) -> dict[int, str]:
        config = self._config
        error: NotEnoughBookiesError | None = None
        for attempt in range(config.replacement_attempts_max):
            candidates = await self._ctx.candidates(self._rack_label)
            healthy = [c for c in candidates if c.address not in self._bad_bookies]
            ensemble = list(self._ensemble)
            replacements: dict[int, str] = {}
            try:
                for index in sorted(failed):
                    pool = healthy if _enough(healthy, ensemble) else candidates
                    choice = choose_replacement(
                        pool, ensemble, index, self._ctx.rng,
                        write_quorum=self._schedule.write_quorum,
                        min_racks=config.placement_min_racks if self._rack_label else 1)
                    ensemble[index] = choice
                    replacements[index] = choice
                return replacements
            except NotEnoughBookiesError as exc:
                error = exc
                self._bad_bookies.clear()  # give bookies that failed earlier another chance
            backoff_ms = min(config.replacement_backoff_ms * 2 ** attempt, 2_000)
            await asyncio.sleep(backoff_ms / 1000)
        raise LedgerWriteError(
            f"ledger {self.id}: cannot replace failed bookies {sorted(failed.values())}: "
            f"{error.message if error else 'no candidates'}")

    async def _write_metadata(self, new: LedgerMetadata) -> None:
        """CAS ``new`` over the version we hold; re-read and judge on conflict."""
        key = wire.ledger_key(self.id)
        value = new.encode()
        for _ in range(self._config.metadata_cas_attempts_max):
            try:
                applied: bool | None = await self._ctx.meta.cas(key, self._version, value)
            except QuorumlogError as exc:
                if not exc.retriable:
                    raise
                applied = None  # unknown outcome: look
            if applied:
                self._metadata, self._version = new, self._version + 1
                return
            kv = await self._ctx.meta.get(key)
            if kv is None:
                raise NoSuchLedgerError(f"ledger {self.id} was deleted while being written")
            if kv.value == value:  # our write landed (an unknown outcome)
                self._metadata, self._version = new, int(kv.version)
                return
            current = LedgerMetadata.decode(kv.value)
            if applied is None and int(kv.version) == self._version:
                continue  # it did not land: try again
            self._on_metadata_conflict(current, int(kv.version))
        raise MetadataConflictError(
            f"ledger {self.id}: metadata kept changing; gave up after "
            f"{self._config.metadata_cas_attempts_max} compare-and-swap attempts")

    def _on_metadata_conflict(self, current: LedgerMetadata, version: int) -> None:
        """Someone else changed the metadata: decide what it means for us."""
        if self._recovery:
            if current.is_closed:
                raise ClosedByOtherError(
                    f"ledger {self.id} was closed by another client at entry "
                    f"{current.last_entry_id}", metadata=current, version=version)
            raise LedgerRecoveryError(
                f"ledger {self.id}: another client changed the metadata during recovery "
                f"(state {current.state}); open it with recovery again")
        if current.state is not LedgerState.OPEN:
            raise LedgerFencedError(
                f"ledger {self.id} is {current.state.value}: another client opened it with "
                "recovery; this writer can no longer add to it")
        raise LedgerWriteError(
            f"ledger {self.id}: another client changed its metadata while this client "
            "was writing it; only one writer may hold a ledger")

    # ----- close and failure ----------------------------------------------------

    async def close(self) -> None:
        """Wait for outstanding adds, then record LAC and length: state CLOSED.

        A conflict where another client closed the ledger with the same last
        entry is fine; with a different last entry it is LedgerFencedError.
        """
        if self._state is HandleState.CLOSED:
            return
        if self._state is HandleState.OPEN:
            self._state = HandleState.CLOSING
        try:
            await self._wait_idle()
            if self._recovery and isinstance(self._error, ClosedByOtherError):
                raise self._error  # another recoverer finished first: its result stands
            if self._recovery and self._error is not None:
                # Closing now would cut off recovered entries that did not reach
                # Qa again: they may have been acknowledged to the old writer.
                raise LedgerRecoveryError(
                    f"ledger {self.id}: rewriting recovered entries failed "
                    f"({self._error.message}); open it with recovery again") from self._error
            if not self._recovery and self._lac > self._lac_piggybacked:
                await self._announce_lac()
            await self._write_close()
        finally:
            self._stop_background()
        self._state = HandleState.CLOSED
        self._ctx.log.debug("ledger_closed", ledger=self.id, last_entry=self._lac)

    async def detach(self) -> None:
        """Stop writing but leave the ledger OPEN: wait for outstanding adds and
        record the LAC on every bookie of the ensemble, so that another
        process can continue with ``LedgerClient.open_for_append``."""
        if self._state is HandleState.FAILED and self._error is not None:
            raise self._error
        self._check_writable()
        self._state = HandleState.CLOSING
        try:
            await self._wait_idle()
            if self._error is not None:
                raise self._error
            lac = self._lac
            self._lac_piggybacked = lac
            results = await asyncio.gather(*(
                self._ctx.bookies.write_lac(bookie, self.id, self._master_key, lac,
                                            timeout_s=self._config.read_timeout_ms / 1000)
                for bookie in self._ensemble), return_exceptions=True)
            if lac >= 0 and all(isinstance(r, BaseException) for r in results):
                raise LedgerWriteError(
                    f"ledger {self.id}: could not record LAC {lac} on any bookie "
                    f"({results[0]}); recover the ledger instead of resuming it")
        finally:
            self._stop_background()
        self._state = HandleState.DETACHED

    async def _announce_lac(self) -> None:
        """Best effort: tell the ensemble the final LAC so tailing readers see it."""
        lac = self._lac
        self._lac_piggybacked = lac
        await asyncio.gather(*(self._write_lac(b, lac) for b in self._ensemble))

    async def _write_close(self) -> None:
        new = self._metadata.closed(self._lac, self.length_bytes)
        try:
            await self._write_metadata(new)
        except ClosedByOtherError:
            raise
        except LedgerFencedError:
            current, version = await self._ctx.load_metadata(self.id)
            if current.is_closed and current.last_entry_id == self._lac:
                self._metadata, self._version = current, version
                return
            if current.is_closed:
                raise LedgerFencedError(
                    f"ledger {self.id} was closed by another client at entry "
                    f"{current.last_entry_id}, but this writer had confirmed up to "
                    f"{self._lac}") from None
            raise

    def _fail(self, error: QuorumlogError, *, quiet: bool = False) -> None:
        if self._state in (HandleState.FAILED, HandleState.CLOSED, HandleState.DETACHED):
            return
        self._state = HandleState.FAILED
        self._error = error
        log = self._ctx.log.debug if quiet else self._ctx.log.warning
        log("ledger_handle_failed", ledger=self.id, lac=self._lac,
            pending=len(self._pending), error=error.message)
        pending, self._pending = self._pending, deque()
        LEDGER_METRICS.adds_failed += len(pending)
        if not quiet:
            LEDGER_METRICS.errors[type(error).__name__] += 1
        callbacks: list[_PendingAdd] = []
        for add in pending:
            add.done = True
            future = add.future
            if future is None:
                callbacks.append(add)
            elif not future.done():
                future.set_exception(error)
                future.exception()  # retrieved here; callers still get it when they await
        self._outstanding_bytes = 0
        waiters, self._room_waiters = self._room_waiters, deque()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)  # the appender re-checks and raises
        self._wake_idle()
        self._call_back(callbacks, error)

    def _stop_background(self) -> None:
        if self._lac_timer is not None:
            self._lac_timer.cancel()
            self._lac_timer = None
        for task in list(self._background):
            task.cancel()

    async def abort(self) -> None:
        """Stop without closing the metadata (as a crashed writer would)."""
        self._fail(LedgerClosedError(f"ledger {self.id}: the write handle was aborted"),
                   quiet=True)
        self._stop_background()


def _enough(candidates: list[Any], ensemble: list[str]) -> bool:
    members = set(ensemble)
    return any(c.writable and c.address not in members for c in candidates)
