"""The single writer of one stream partition (Pulsar's managed ledger, write side).

Lifecycle:

1. **Lease.** The writer puts the ephemeral key ``writers/<p>`` bound to its
   meta session (one session per producer, kept alive by the producer). The
   key's create revision is the writer's token: every change the writer makes
   to the ledger list compares it, so a writer that lost its lease changes
   nothing. If another writer holds the key, ``open`` waits for it to vanish
   (its session expires when it dies), or with ``steal`` replaces it.
2. **Takeover.** If the list ends with an open ledger, the new writer opens it
   with recovery: the bookies fence it (the old writer's appends fail from then
   on), recovery settles its last entry and closes it. The writer records its
   final length, entry count and publish times in the list and appends a new
   open ledger, in one compare-and-swap.
3. **Appends** are pipelined on the open ledger; entry ids are assigned in
   order, so the writer knows the id of every append it issued. An entry
   submitted while nothing is queued is issued and sent to the bookies in
   the same call; otherwise the pump task issues the queue in order.
4. **Rollover** (``RolloverPolicy``): wait for the appends in flight, close the
   ledger, create the next one, record both in one compare-and-swap of the
   partition's head (one meta transaction of at most two keys: the head, and
   now and then an archive run taking the head's oldest ledgers; see
   ``_layout``), however many ledgers the partition holds.
5. **Failure or fencing.** When an append fails (the ledger was fenced by a
   new writer or by a Spark commit, or the bookies failed), the writer opens
   its own ledger with recovery to learn its final last entry X. Appends with
   entry id <= X are durable: they complete normally. If the writer still
   holds its lease, it continues in a new ledger and sends the rest again, in
   order (no loss, no duplicate). Otherwise the rest fail with
   ProducerFencedError.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import socket
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from quorumlog import rpc
from quorumlog.errors import QuorumlogError, UsageError, invariant
from quorumlog.ledger import LedgerClient, WriteHandle
from quorumlog.log import get_logger
from quorumlog.meta import DeleteOp, PutOp
from quorumlog.stream._entry import decode_entry
from quorumlog.stream._errors import (
    MessageTooLargeError,
    ProducerFencedError,
    WriterBusyError,
    WriterStuckError,
)
from quorumlog.stream._layout import (
    LEDGER_META_PARTITION,
    LEDGER_META_STREAM,
    LedgerStats,
    PartitionHead,
    StreamRecord,
    WriterLease,
    config_key,
    writer_key,
)
from quorumlog.stream._meta import (
    created_at,
    load_head,
    update_partition,
    version_is,
    watch_key_once,
)
from quorumlog.stream._metrics import stream_metrics
from quorumlog.stream._position import Position

log = get_logger(__name__)

RECOVERY_ATTEMPTS_MAX = 5  # failed append -> recover -> new ledger, in a row, before giving up
# Recoveries in a row with no entry written in between: the same entries failed
# in that many fresh ledgers, so another ledger will not help (an entry a bookie
# refuses, a cluster without enough bookies). The writer stops with
# WriterStuckError instead of creating ledgers in a loop.
RECOVERIES_WITHOUT_PROGRESS_MAX = 3
RECOVERY_BACKOFF_MS_FIRST = 100  # wait before the 2nd such recovery, doubled for each next
RECOVERY_BACKOFF_MS_MAX = 2_000
SETTLE_TIMEOUT_S = 30.0  # wait for appends in flight when switching ledgers
LEASE_POLL_WAIT_MS = 1000
EXACT_SIZE_ENTRIES_MAX = 10_000  # a recovered ledger's byte size is counted up to this
ROLLOVER_CHECK_S = 1.0  # an idle writer checks the time-based rollover this often


def owner_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}"


class EntryInfo(msgspec.Struct, frozen=True, gc=False):
    """What the writer needs to know about an entry for the ledger list.

    Outside the garbage collector (three ints, no cycle possible): one is
    made per entry and lives until the entry is durable.
    """

    messages: int
    first_publish_ms: int
    last_publish_ms: int


EntryCallback = Callable[[Position | None, QuorumlogError | None], None]
"""``callback(position, None)`` once an entry is durable, ``callback(None, error)``
when it failed (``PartitionWriter.submit_with_callback``)."""


@dataclass(slots=True)
class _Pending:
    """One entry: queued, in flight on a ledger, or confirmed (waiting for the
    entries before it). Its outcome goes to ``result`` or ``callback``."""

    payload: bytes
    info: EntryInfo
    result: asyncio.Future[Position] | None
    callback: EntryCallback | None = None
    entry_id: int = -1
    ledger_id: int = -1  # -1 while queued: no ledger's outcome applies to it
    in_flight: bool = False  # issued to ledger_id, no outcome yet
    confirmed: bool = False

    def succeed(self, position: Position) -> None:
        callback, self.callback = self.callback, None
        if callback is not None:
            callback(position, None)
        elif self.result is not None and not self.result.done():
            self.result.set_result(position)

    def fail(self, error: QuorumlogError) -> None:
        callback, self.callback = self.callback, None
        if callback is not None:
            callback(None, error)
        elif self.result is not None and not self.result.done():
            self.result.set_exception(error)


@dataclass(slots=True)
class _LedgerTotals:
    """Numbers of the confirmed prefix of the current ledger."""

    entries: int = 0
    size_bytes: int = 0
    first_publish_ms: int = 0
    last_publish_ms: int = 0
    last_entry_messages: int = 0

    def add(self, pending: _Pending) -> None:
        if self.entries == 0:
            self.first_publish_ms = pending.info.first_publish_ms
        self.entries += 1
        self.size_bytes += len(pending.payload)
        self.last_publish_ms = pending.info.last_publish_ms
        self.last_entry_messages = pending.info.messages

    def stats(self, ledger_id: int, created_ms: int) -> LedgerStats:
        return LedgerStats(
            ledger_id=ledger_id, entries=self.entries, size_bytes=self.size_bytes,
            first_publish_ms=self.first_publish_ms, last_publish_ms=self.last_publish_ms,
            last_entry_messages=self.last_entry_messages, created_ms=created_ms,
        )


@dataclass(slots=True)
class _Current:
    handle: WriteHandle
    ledger_id: int
    created_ms: int
    # The append callback of every entry issued to this ledger (the writer's
    # _on_append_result with this ledger's id): one per ledger instead of a
    # partial, a bound method and an argument tuple per entry.
    on_append_result: Callable[[int, QuorumlogError | None], None]
    issued: int = 0  # entries issued (next entry id)
    issued_bytes: int = 0
    totals: _LedgerTotals = field(default_factory=_LedgerTotals)


class PartitionWriter:
    """Writes entries to one partition; see the module docstring for the protocol."""

    def __init__(self, client: LedgerClient, record: StreamRecord, partition: int,
                 session_id: int, *, owner: str | None = None) -> None:
        self._client = client
        self._clock = client.clock
        self._meta = client.meta
        self._record = record
        self._config = record.config
        self.stream = record.name
        self.partition = partition
        self._session_id = session_id
        self._owner = owner or owner_name()
        self._key = writer_key(record.name, partition)
        self._token = 0  # create revision of our writer key
        self._current: _Current | None = None
        self._pending: deque[_Pending] = deque()
        self._switching: asyncio.Event = asyncio.Event()
        self._switching.set()  # set = appends may go
        self._switch_lock = asyncio.Lock()
        self._failed: QuorumlogError | None = None
        self._recovery_task: asyncio.Task[None] | None = None
        self._queue: deque[_Pending] = deque()
        self._queued = asyncio.Event()
        self._pump_task: asyncio.Task[None] | None = None
        self._closing = False
        self._last_publish_ms = 0
        self._recoveries_without_progress = 0
        self._in_flight = 0  # entries of _pending issued and without an outcome
        self._outcome_waiters: list[asyncio.Future[None]] = []
        self.rollovers = 0

    # ----- open: lease and takeover ------------------------------------------------------

    async def open(self, *, steal: bool = False, wait_ms: int = 0, lazy: bool = False) -> None:
        """Take the lease; take the partition over now, or (``lazy``) at the first append.

        A lazy writer holds the lease (no one else may write the partition) but
        creates no ledger until it has an entry to write: a producer that sends
        to one partition of many, or closes without sending, leaves the other
        partitions' ledger lists as they were instead of closing and opening an
        empty ledger in each.
        """
        await self._acquire_lease(steal=steal, wait_ms=wait_ms)
        if lazy:
            await load_head(self._meta, self.stream, self.partition)  # refuse what we can't read
        else:
            await self._take_over()
        self._pump_task = asyncio.get_running_loop().create_task(self._pump())

    async def _acquire_lease(self, *, steal: bool, wait_ms: int) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        lease = WriterLease(owner=self._owner, acquired_ms=self._clock.wall_ms()).encode()
        while True:
            kv = await self._meta.get(self._key)
            compares = ([created_at(self._key, kv.create_revision)] if kv
                        else [version_is(self._key, 0)])
            if kv is None or steal:
                ops = [] if kv is None else [DeleteOp(key=self._key)]
                result = await self._meta.txn(
                    compares=compares,
                    success=[*ops, PutOp(key=self._key, value=lease, session_id=self._session_id)],
                )
                if result.succeeded:
                    mine = await self._meta.get(self._key)
                    invariant(mine is not None and mine.session_id == self._session_id,
                              "the writer key must be ours right after the transaction")
                    assert mine is not None
                    self._token = mine.create_revision
                    log.info("writer_lease_acquired", stream=self.stream,
                             partition=self.partition, stolen=kv is not None)
                    return
                continue
            remaining_ms = int((deadline - loop.time()) * 1000)
            if remaining_ms <= 0:
                holder = WriterLeaseText.describe(kv.value)
                raise WriterBusyError(
                    f"stream {self.stream!r} partition {self.partition} has a writer ({holder}); "
                    "it is taken over when that writer's lease expires (or pass steal=True)"
                )
            await watch_key_once(self._meta, self._key, start_revision=kv.mod_revision + 1,
                                 wait_ms=min(remaining_ms, LEASE_POLL_WAIT_MS))

    async def _take_over(self) -> None:
        head, _ = await load_head(self._meta, self.stream, self.partition)
        previous = head.open_ledger
        recovered: LedgerStats | None = None
        if previous is not None:
            recovered = await recover_ledger_stats(self._client, self._record,
                                                   previous.ledger_id, previous.created_ms)
            log.info("writer_takeover_recovered", stream=self.stream, partition=self.partition,
                     ledger_id=previous.ledger_id, entries=recovered.entries)
        await self._start_ledger(closing=recovered, takeover=True)

    async def _start_ledger(self, *, closing: LedgerStats | None, takeover: bool) -> None:
        """Create the next ledger and record it (and ``closing``) in the list."""
        created = self._clock.wall_ms()
        handle = await self._client.create_ledger(
            ensemble=self._config.ensemble_size, write_quorum=self._config.write_quorum,
            ack_quorum=self._config.ack_quorum, digest=self._config.digest.value,
            password=self._record.password,
            metadata={LEDGER_META_STREAM: self.stream.encode(),
                      LEDGER_META_PARTITION: str(self.partition).encode()},
        )
        ledger_id: int = handle.id

        def edit(head: PartitionHead) -> PartitionHead:
            current = head.open_ledger
            if current is not None:
                if closing is None or current.ledger_id != closing.ledger_id:
                    raise ProducerFencedError(
                        f"stream {self.stream!r} partition {self.partition}: ledger "
                        f"{current.ledger_id} is open in the list and is not this writer's"
                    )
                head = head.with_ledger_closed(closing, self._clock.wall_ms())
            return head.with_ledger_opened(ledger_id, created, takeover=takeover)

        try:
            await update_partition(self._meta, self.stream, self.partition, edit,
                                   compares=[created_at(self._key, self._token)],
                                   on_conflict=self._check_lease)
        except BaseException:
            with contextlib.suppress(QuorumlogError):
                await self._client.delete_ledger(ledger_id, force=True)
            raise
        self._current = _Current(
            handle=handle, ledger_id=ledger_id, created_ms=created,
            on_append_result=functools.partial(self._on_append_result, ledger_id))

    async def _check_lease(self) -> None:
        kv = await self._meta.get(self._key)
        if kv is None or kv.create_revision != self._token:
            raise ProducerFencedError(
                f"stream {self.stream!r} partition {self.partition}: this writer lost its lease "
                "to another writer"
            )

    # ----- appends -------------------------------------------------------------------------

    def next_publish_ms(self) -> int:
        """A publish time for a new message: wall clock, never before the previous one."""
        self._last_publish_ms = max(self._clock.wall_ms(), self._last_publish_ms)
        return self._last_publish_ms

    def submit(self, payload: bytes, info: EntryInfo) -> asyncio.Future[Position]:
        """Queue one entry; the future gives its (ledger_id, entry_id) once durable."""
        result: asyncio.Future[Position] = asyncio.get_running_loop().create_future()
        self._submit(_Pending(payload=payload, info=info, result=result))
        return result

    def submit_with_callback(self, payload: bytes, info: EntryInfo,
                             callback: EntryCallback) -> None:
        """Queue one entry, as ``submit``; its outcome goes to ``callback``, called
        by the code that learns it (the ledger handle confirming the entry, in
        partition order), not a loop pass later as a future's done-callback
        would be. The callback may submit again; it should not raise."""
        self._submit(_Pending(payload=payload, info=info, result=None, callback=callback))

    def _submit(self, pending: _Pending) -> None:
        """Queue ``pending``, or issue it at once.

        Entries are issued in submission order, so the order of submits is the
        order in the partition: at once when nothing is queued and the ledger
        is ready (no switch, no rollover due, room in the handle), otherwise
        by the pump task, which issues the queue in order.
        """
        if self._failed is not None:
            raise self._failed
        invariant(self._pump_task is not None, "submit before open")
        entry_max_bytes = self._client.config.entry_max_bytes
        if len(pending.payload) > entry_max_bytes:
            # Refused here, not by the ledger handle: a failed append means "recover
            # and continue in a new ledger", which cannot fix an entry's size.
            raise MessageTooLargeError(
                f"stream {self.stream!r} partition {self.partition}: an entry of "
                f"{len(pending.payload)} bytes is over the ledger entry limit "
                f"entry_max_bytes={entry_max_bytes}; nothing was sent")
        current = self._current
        if (current is not None and not self._queue and self._switching.is_set()
                and not self._closing and not self.due_for_rollover()
                and self._issue(current, pending)):
            # Nothing waits before it and the ledger can take it: issued and sent
            # now, not a loop pass later by the pump (on a busy loop a pass is
            # milliseconds). The order is the pump's: the queue is empty.
            current.handle.send_queued()
            return
        self._queue.append(pending)
        self._queued.set()

    async def append(self, payload: bytes, info: EntryInfo) -> Position:
        return await self.submit(payload, info)

    async def _pump(self) -> None:
        while True:
            if not self._queue:
                self._queued.clear()
                if self._closing:
                    return
                try:
                    async with asyncio.timeout(ROLLOVER_CHECK_S):
                        await self._queued.wait()
                except TimeoutError:
                    if self.due_for_rollover():
                        await self.roll_over()
                continue  # woken by an entry or by close: look again
            if self._current is None and self._failed is None:
                await self._take_over_lazily()
            await self._switching.wait()
            if self._failed is not None:
                queue, self._queue = self._queue, deque()
                for pending in queue:
                    pending.fail(self._failed)
                continue
            if self.due_for_rollover():
                await self.roll_over()
                continue
            current = self._current
            assert current is not None
            # Stop at a full ledger: the rest of the queue goes to the next one
            # (the loop's next turn rolls over), so a burst never overfills it.
            while self._queue and self._switching.is_set() and not self.due_for_rollover():
                if not self._issue(current, self._queue[0]):
                    current.handle.send_queued()
                    await self._wait_for_room()
                    break
                self._queue.popleft()
            current.handle.send_queued()
            await asyncio.sleep(0)

    async def _take_over_lazily(self) -> None:
        """The first entry of a lazily opened writer: take the partition over now."""
        async with self._switch_lock:
            try:
                await self._check_lease()
                await self._take_over()
            except QuorumlogError as exc:
                log.warning("writer_takeover_failed", stream=self.stream,
                            partition=self.partition, error=exc.message)
                self._fail(exc)

    async def _wait_for_room(self) -> None:
        """The ledger handle has its maximum of appends outstanding: wait for one."""
        if self._in_flight:
            await self._next_outcome(SETTLE_TIMEOUT_S)

    async def _next_outcome(self, timeout_s: float) -> None:
        """Wait until an append in flight gets its outcome (or ``timeout_s``)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._outcome_waiters.append(waiter)
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await waiter
        finally:
            with contextlib.suppress(ValueError):
                self._outcome_waiters.remove(waiter)

    def _issue(self, current: _Current, pending: _Pending) -> bool:
        """Start the append; False if the ledger handle has no room right now."""
        entry_id, ledger_id = current.issued, current.ledger_id
        callback = current.on_append_result
        failed: QuorumlogError | None = None
        try:
            issued = current.handle.append_with_callback(pending.payload, callback)
        except rpc.BackpressureError:
            return False
        except QuorumlogError:
            # The handle failed already: recovery sorts out what is durable.
            failed = LedgerWriteFailed(f"ledger {ledger_id} failed")
        else:
            invariant(issued == entry_id, f"ledger {ledger_id} gave entry id {issued} to an "
                      f"append, the writer expected {entry_id}")
        pending.entry_id = entry_id
        pending.ledger_id = ledger_id
        pending.in_flight = True
        self._in_flight += 1
        current.issued += 1
        current.issued_bytes += len(pending.payload)
        self._pending.append(pending)
        if failed is not None:
            asyncio.get_running_loop().call_soon(callback, entry_id, failed)
        return True

    def _on_append_result(self, ledger_id: int, entry_id: int,
                          error: QuorumlogError | None) -> None:
        """The ledger handle's outcome for one append (called synchronously by it)."""
        pending = self._in_flight_entry(ledger_id, entry_id)
        if pending is None:
            return  # from a ledger the entry has left: recovery settled or resent it
        pending.in_flight = False
        self._in_flight -= 1
        if self._outcome_waiters:
            waiters, self._outcome_waiters = self._outcome_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
        if error is not None:
            self._start_recovery()
            return
        pending.confirmed = True
        self._recoveries_without_progress = 0
        self._complete_prefix()

    def _in_flight_entry(self, ledger_id: int, entry_id: int) -> _Pending | None:
        """The entry in flight as ``entry_id`` of ledger ``ledger_id``, if any.

        ``_pending`` holds consecutive entry ids of the current ledger (issued
        in order; a ledger switch starts with it empty), so the entry's place
        is its id minus the first one's.
        """
        pendings = self._pending
        if not pendings:
            return None
        index = entry_id - pendings[0].entry_id
        if not 0 <= index < len(pendings):
            return None
        pending = pendings[index]
        if pending.ledger_id != ledger_id:
            return None
        invariant(pending.entry_id == entry_id,
                  f"ledger {ledger_id}: the writer's entries in flight are not consecutive "
                  f"(entry {entry_id} found {pending.entry_id} in its place)")
        return pending if pending.in_flight else None

    def _complete_prefix(self) -> None:
        current = self._current
        while self._pending and self._pending[0].confirmed:
            done = self._pending.popleft()
            if current is not None and done.ledger_id == current.ledger_id:
                current.totals.add(done)
            done.succeed(Position(done.ledger_id, done.entry_id))

    async def _settle(self) -> None:
        """Wait until every append in flight has an outcome (at most SETTLE_TIMEOUT_S)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETTLE_TIMEOUT_S
        while self._in_flight:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            await self._next_outcome(remaining)

    # ----- rollover -----------------------------------------------------------------------

    async def roll_over(self) -> None:
        """Close the current ledger and continue in a new one (no-op if another
        switch is under way)."""
        async with self._switch_lock:
            current = self._current
            if current is None or self._failed is not None or not self._switching.is_set():
                return
            if current.issued == 0:
                return
            self._switching.clear()
            try:
                await self._settle()
                if any(not p.confirmed for p in self._pending):
                    return  # an append failed: recovery takes over (it sets _switching)
                try:
                    await current.handle.close()
                except QuorumlogError as exc:
                    log.warning("writer_close_failed", stream=self.stream,
                                partition=self.partition, error=exc.message)
                    self._start_recovery()
                    return
                await self._start_ledger(
                    closing=current.totals.stats(current.ledger_id, current.created_ms),
                    takeover=False,
                )
                self.rollovers += 1
                stream_metrics(self.stream).rollovers += 1
                log.info("writer_rolled_over", stream=self.stream, partition=self.partition,
                         closed=current.ledger_id, entries=current.totals.entries)
            except ProducerFencedError as exc:
                self._fail(exc)
            finally:
                if self._recovery_task is None:
                    self._switching.set()

    def _start_recovery(self) -> None:
        if self._recovery_task is None and self._failed is None:
            self._switching.clear()
            self._recovery_task = asyncio.get_running_loop().create_task(self._recover())

    def due_for_rollover(self) -> bool:
        current = self._current
        return current is not None and self._config.rollover.should_roll(
            current.issued, current.issued_bytes, self._clock.wall_ms() - current.created_ms)

    # ----- failure: recover own ledger, continue or stop -------------------------------

    async def _recover(self) -> None:
        try:
            for attempt in range(RECOVERY_ATTEMPTS_MAX):
                try:
                    await self._recover_once()
                    return
                except (ProducerFencedError, WriterStuckError) as exc:
                    self._fail(exc)
                    return
                except QuorumlogError as exc:
                    log.warning("writer_recovery_failed", stream=self.stream,
                                partition=self.partition, attempt=attempt, error=exc.message)
                    if attempt == RECOVERY_ATTEMPTS_MAX - 1:
                        self._fail(exc)
                        return
                    await asyncio.sleep(0.05 * 2**attempt)
        finally:
            self._recovery_task = None
            self._switching.set()

    async def _recover_once(self) -> None:
        await self._settle()
        current = self._current
        invariant(current is not None, "recovery needs a current ledger")
        assert current is not None
        self._recoveries_without_progress += 1
        rounds = self._recoveries_without_progress
        if rounds > RECOVERIES_WITHOUT_PROGRESS_MAX:
            raise WriterStuckError(
                f"stream {self.stream!r} partition {self.partition}: appends failed in "
                f"{rounds - 1} fresh ledgers in a row with no entry written; the writer stopped "
                "(a new ledger does not fix this). Check the bookies (quorumlog bookie list) "
                "and entry_max_bytes of the ledger client and bookies, then create a new "
                "producer")
        if rounds > 1:
            await asyncio.sleep(min(RECOVERY_BACKOFF_MS_FIRST * 2 ** (rounds - 2),
                                    RECOVERY_BACKOFF_MS_MAX) / 1000)
        try:
            handle = await self._client.open_ledger(current.ledger_id,
                                                    password=self._record.password,
                                                    recovery=True)
        except QuorumlogError:
            if await self._meta.get(config_key(self.stream)) is None:
                raise ProducerFencedError(
                    f"stream {self.stream!r} was deleted while this producer wrote to it; "
                    "messages not yet acknowledged were not written") from None
            raise
        last = int(handle.last_add_confirmed)
        resend: list[_Pending] = []
        for pending in list(self._pending):
            # Recovery decides now: a late outcome from the old ledger must not count.
            pending.in_flight = False
            if pending.ledger_id == current.ledger_id and pending.entry_id <= last:
                pending.confirmed = True
            else:
                resend.append(pending)
        self._in_flight = 0
        self._complete_prefix()
        invariant(current.totals.entries == last + 1,
                  f"ledger {current.ledger_id}: recovered {last + 1} entries, writer confirmed "
                  f"{current.totals.entries}")
        log.info("writer_recovered_own_ledger", stream=self.stream, partition=self.partition,
                 ledger_id=current.ledger_id, entries=last + 1, resend=len(resend))
        try:
            await self._check_lease()
        except ProducerFencedError as exc:
            self._fail(exc)
            return
        self._pending.clear()
        head, _ = await load_head(self._meta, self.stream, self.partition)
        still_open = head.open_ledger
        closing = (current.totals.stats(current.ledger_id, current.created_ms)
                   if still_open is not None and still_open.ledger_id == current.ledger_id
                   else None)
        if still_open is not None and closing is None:
            raise ProducerFencedError(
                f"stream {self.stream!r} partition {self.partition}: ledger "
                f"{still_open.ledger_id} is open in the list but is not this writer's"
            )
        await self._start_ledger(closing=closing, takeover=False)
        new = self._current
        assert new is not None
        for pending in reversed(resend):
            pending.confirmed = False
            pending.ledger_id = pending.entry_id = -1
            self._queue.appendleft(pending)  # the pump sends them first, in order
        if resend:
            self._queued.set()

    def _fail(self, error: QuorumlogError) -> None:
        if self._failed is None:
            self._failed = error
        pendings, self._pending = self._pending, deque()
        self._in_flight = 0
        for pending in pendings:
            pending.in_flight = False
            pending.fail(self._failed)
        self._switching.set()

    # ----- close -------------------------------------------------------------------------

    async def close(self) -> None:
        """Wait for appends in flight, close the ledger, record it, release the lease."""
        self._closing = True
        self._queued.set()
        if self._pump_task is not None:
            await asyncio.wait([self._pump_task], timeout=SETTLE_TIMEOUT_S)
        async with self._switch_lock:
            if self._recovery_task is not None:
                await asyncio.wait([self._recovery_task], timeout=SETTLE_TIMEOUT_S)
            await self._settle()
            current = self._current
            if self._failed is None and current is not None and not self._pending:
                with contextlib.suppress(QuorumlogError):
                    await current.handle.close()
                    stats = current.totals.stats(current.ledger_id, current.created_ms)

                    def edit(head: PartitionHead) -> PartitionHead | None:
                        now = head.open_ledger
                        if now is None or now.ledger_id != current.ledger_id:
                            return None
                        return head.with_ledger_closed(stats, self._clock.wall_ms())

                    await update_partition(self._meta, self.stream, self.partition, edit,
                                           compares=[created_at(self._key, self._token)],
                                           on_conflict=self._check_lease)
            if self._failed is None:
                self._failed = UsageError("the producer is closed")
            self._fail(self._failed)
            with contextlib.suppress(QuorumlogError):
                await self._meta.txn(compares=[created_at(self._key, self._token)],
                                     success=[DeleteOp(key=self._key)])

    @property
    def failed(self) -> QuorumlogError | None:
        return self._failed

    @property
    def entries_queued(self) -> int:
        """Entries submitted and not yet issued to a ledger (the pump's queue)."""
        return len(self._queue)

    @property
    def entries_in_flight(self) -> int:
        """Entries issued to the ledger and without an outcome yet."""
        return self._in_flight

    @property
    def ledger_id(self) -> int | None:
        return self._current.ledger_id if self._current else None


class LedgerWriteFailed(QuorumlogError):  # noqa: N818 - internal marker, never raised to users
    """An append could not start because the ledger handle had failed."""


class WriterLeaseText:
    @staticmethod
    def describe(value: bytes) -> str:
        try:
            lease = msgspec.msgpack.decode(value, type=WriterLease)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return "unknown owner"
        return f"owner {lease.owner}"


async def recover_ledger_stats(client: LedgerClient, record: StreamRecord, ledger_id: int,
                               created_ms: int) -> LedgerStats:
    """Fence and recover a ledger, then read what the ledger list records of it."""
    handle = await client.open_ledger(ledger_id, password=record.password, recovery=True)
    last = int(handle.last_add_confirmed)
    if last < 0:
        return LedgerStats(ledger_id=ledger_id, entries=0, size_bytes=0, first_publish_ms=0,
                           last_publish_ms=0, last_entry_messages=0, created_ms=created_ms)
    first_entry = (await handle.read_batch(0, 0))[0]
    last_entry = first_entry if last == 0 else (await handle.read_batch(last, last))[0]
    first_messages = decode_entry(bytes(first_entry.payload))
    last_messages = decode_entry(bytes(last_entry.payload))
    size = int(handle.metadata.length_bytes)
    if size < 0:  # recovery does not record the length: count it, or estimate a big ledger
        if last < EXACT_SIZE_ENTRIES_MAX:
            size = 0
            async for entry in handle.read(0, last):
                size += len(entry.payload)
        else:
            size = (len(first_entry.payload) + len(last_entry.payload)) * (last + 1) // 2
    return LedgerStats(
        ledger_id=ledger_id, entries=last + 1, size_bytes=size,
        first_publish_ms=first_messages[0].publish_time_ms,
        last_publish_ms=last_messages[-1].publish_time_ms,
        last_entry_messages=len(last_messages), created_ms=created_ms,
    )
