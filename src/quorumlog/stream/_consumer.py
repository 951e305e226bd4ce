"""Consumer: a named subscription (cursor) on every partition of a stream.

Two subscription types, after Pulsar's:

- **exclusive** (the default): one consumer holds the ephemeral key
  ``cursors/<sub>/owner`` on its meta session and reads every partition; a
  second consumer waits for it or gets SubscriptionBusyError.
- **failover**: several consumers share the subscription, each partition read
  by one of them at a time. Each consumer holds ``failover/members/<name>``;
  partition ``p`` goes to the ``p % n``-th of the ``n`` members sorted by
  name (Pulsar's rule for partitioned topics). A consumer reads a partition
  only while it holds that partition's key ``failover/owners/<p>``, taken
  (compare absent) only after the previous owner flushed its acknowledgements
  and deleted it, so two consumers never read or acknowledge one partition at
  once. When a consumer joins, leaves or its lease expires, every member's
  balancer (a watch on ``failover/``) releases what is no longer its and
  claims what became its. Messages delivered but not acknowledged before a
  hand-over are delivered again to the next owner (at-least-once).

The two types exclude each other on one subscription (Pulsar refuses a
consumer of another type too). Per partition a consumer reads from just after
the persisted mark-delete, skips messages the persisted ranges acknowledge,
and tracks acknowledgements (``AckTracker``). Acknowledgements are persisted
every ``ack_flush_ms`` (Pulsar's ackGroupTime, 100 ms), on close and on a
hand-over, or at once with ``ack_flush_ms=0``, each guarded by the
ownership key; after a crash the messages acknowledged since the last flush
are delivered again (at-least-once).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import os
import re
import socket

import msgspec

from quorumlog.config import Config, require
from quorumlog.errors import QuorumlogError, UsageError
from quorumlog.ledger import LedgerClient
from quorumlog.log import get_logger
from quorumlog.meta import CompactedError, DeleteOp, PutOp
from quorumlog.stream._cursor import AckTracker, CursorState, Key
from quorumlog.stream._dead_letter import DeadLetterSender, dead_letter_stream_name
from quorumlog.stream._errors import SubscriptionBusyError
from quorumlog.stream._layout import (
    StreamRecord,
    WriterLease,
    check_name,
    cursor_key,
    cursor_owner_key,
    failover_member_key,
    failover_members_prefix,
    failover_owner_key,
    failover_prefix,
)
from quorumlog.stream._ledgers import LedgerList
from quorumlog.stream._meta import (
    created_at,
    load_record,
    version_is,
    watch_key_once,
)
from quorumlog.stream._metrics import stream_metrics
from quorumlog.stream._position import EARLIEST, LATEST, Position, SeqPosition
from quorumlog.stream._reader import (
    VIEW_START,
    LedgerHandles,
    Message,
    PartitionReader,
    Reader,
    StartSpec,
    end_position,
    first_position,
    load_compaction,
    resolve_start,
)
from quorumlog.stream._writer import owner_name

log = get_logger(__name__)

CURSOR_CAS_ATTEMPTS_MAX = 32
EXCLUSIVE = "exclusive"
FAILOVER = "failover"
SUBSCRIPTION_TYPES = (EXCLUSIVE, FAILOVER)
BALANCE_WATCH_MS = 5_000  # a failover consumer re-checks its partitions at least this often
SEEK_PROBE_WAIT_MS = 200  # a seek by time reads this long for the first message at/after it


def default_consumer_name() -> str:
    """host-pid-random, in the characters a name may use."""
    host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname()).strip("-._") or "consumer"
    return f"{host[:120]}-{os.getpid()}-{os.urandom(4).hex()}"


class ConsumerConfig(Config, frozen=True):
    initial_position: str = LATEST  # where a new subscription starts (Pulsar's default)
    ack_flush_ms: int = 100  # Pulsar acknowledgmentGroupTime
    unacked_messages_max: int = 50_000  # Pulsar maxUnackedMessagesPerConsumer
    lease_ttl_ms: int = 10_000
    lease_wait_ms: int = 30_000
    # "exclusive": one consumer reads every partition; "failover": the partitions
    # are shared out among the subscription's consumers (Pulsar's SubscriptionType)
    subscription_type: str = EXCLUSIVE
    consumer_name: str = ""  # failover: orders the consumers (default host-pid-random)
    # A negatively acknowledged message comes again this long after
    # (Pulsar's negativeAckRedeliveryDelay, 1 min).
    negative_ack_redelivery_delay_ms: int = 60_000
    # Messages not acknowledged this long after their delivery come again
    # (Pulsar's ackTimeout: 0 is off, else at least 1 s). The consumer then
    # keeps each message it delivered until it is acknowledged.
    ack_timeout_ms: int = 0
    # Pulsar's readCompacted: up to each partition's compaction horizon, only
    # the compacted view (the latest message of every key; docs/stream.md,
    # "Topic compaction"), then every message after it. Messages the view
    # left out count as consumed: the cursor moves over them. A new
    # subscription at "earliest" (or a seek to it) starts at the view's first
    # message, even one whose ledger retention has trimmed.
    read_compacted: bool = False
    # Pulsar's DeadLetterPolicy (docs/stream.md, "Dead-letter streams"): a
    # message delivered 1 + this many times that would come again goes to the
    # dead-letter stream instead and is acknowledged here; 0 is off.
    dead_letter_max_redeliveries: int = 0
    # The dead-letter stream (created with one partition when missing); empty:
    # "<stream>-<subscription>-DLQ", Pulsar's default name.
    dead_letter_stream: str = ""

    def validate(self) -> None:
        require(self.initial_position in (EARLIEST, LATEST),
                "initial_position must be 'earliest' or 'latest'")
        require(self.subscription_type in SUBSCRIPTION_TYPES,
                f"subscription_type must be one of {', '.join(SUBSCRIPTION_TYPES)}, "
                f"got {self.subscription_type!r}")
        if self.consumer_name:
            check_name("consumer", self.consumer_name)
        require(self.negative_ack_redelivery_delay_ms >= 0,
                "negative_ack_redelivery_delay_ms must be >= 0")
        require(self.ack_timeout_ms == 0 or self.ack_timeout_ms >= 1000,
                "ack_timeout_ms must be 0 (off) or at least 1000")
        require(self.ack_flush_ms >= 0, "ack_flush_ms must be >= 0")
        require(self.unacked_messages_max >= 1, "unacked_messages_max must be >= 1")
        require(self.lease_ttl_ms >= 500, "lease_ttl_ms must be >= 500")
        require(self.dead_letter_max_redeliveries >= 0,
                "dead_letter_max_redeliveries must be >= 0 (0: off)")
        if self.dead_letter_stream:
            check_name("dead-letter stream", self.dead_letter_stream)


async def load_or_create_cursor(client: LedgerClient, record: StreamRecord, subscription: str,
                                partition: int, initial: str, *,
                                read_compacted: bool = False) -> tuple[CursorState, int]:
    """The persisted cursor (state, version); a new one starts at ``initial``
    (``read_compacted`` and "earliest": before every message, so at the
    compacted view's first one)."""
    key = cursor_key(record.name, subscription, partition)
    for _ in range(CURSOR_CAS_ATTEMPTS_MAX):
        kv = await client.meta.get(key)
        if kv is not None:
            return CursorState.decode(kv.value), kv.version
        ledgers = LedgerList(client.meta, record.name, partition)
        head = await ledgers.refresh()
        if initial == LATEST:
            start = await end_position(LedgerHandles(client, record), head)
        elif read_compacted:
            start = VIEW_START
        else:
            start = await first_position(ledgers)
        state = CursorState(start=start, updated_ms=client.clock.wall_ms())
        if await client.meta.cas(key, 0, state.encode()):
            return state, 1
    raise SubscriptionBusyError(f"could not create cursor {subscription!r} on {record.name!r}")


class Consumer:
    """Receives messages of one stream for one subscription. Create with
    ``await StreamClient.subscribe(stream, subscription)``."""

    def __init__(self, client: LedgerClient, record: StreamRecord, subscription: str, *,
                 config: ConsumerConfig, session_id: int, consumer_name: str = "") -> None:
        self._client = client
        self._record = record
        self.stream = record.name
        self.subscription = subscription
        self.consumer_name = consumer_name
        self._config = config
        self._failover = config.subscription_type == FAILOVER
        self._session_id = session_id
        self._trackers: dict[int, AckTracker] = {}
        # partition -> (key, create revision) this consumer holds it by: the exclusive
        # owner key for every partition, or the partition's failover owner key
        self._owners: dict[int, tuple[str, int]] = {}
        self._lock = asyncio.Lock()  # cursor writes against partition hand-overs
        self._reader: Reader | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._keepalive: asyncio.Task[None] | None = None
        self._balancer: asyncio.Task[None] | None = None
        self._closed = False
        self._lost: QuorumlogError | None = None
        self._metrics = stream_metrics(record.name)
        self._counted = False  # in quorumlog_stream_consumers (from _start to close)
        # Messages to deliver again: (when, tie-break, message), a heap.
        self._redeliver: list[tuple[float, int, Message]] = []
        self._tie = itertools.count()
        self._redelivered: dict[tuple[int, Key], int] = {}  # redelivery counts
        # With ack_timeout_ms: unacknowledged deliveries in delivery order.
        self._delivered_at: dict[tuple[int, Key], tuple[float, Message]] = {}
        self._dead_letters: DeadLetterSender | None = None
        if config.dead_letter_max_redeliveries:
            self._dead_letters = DeadLetterSender(
                client, record.name,
                dead_letter_stream_name(record.name, subscription, config.dead_letter_stream),
                on_sent=self._dead_lettered, wanted=self._unacked_here,
                on_refused=self._dead_letter_refused)
        # Messages the dead-letter stream refused for good: delivered again as usual.
        self._not_dead_letters: set[tuple[int, Key]] = set()

    @classmethod
    async def open(cls, client: LedgerClient, stream: str, subscription: str, *,
                   config: ConsumerConfig | None = None) -> Consumer:
        config = config or ConsumerConfig()
        config.validate()
        check_name("subscription", subscription)
        record = await load_record(client.meta, stream)
        if config.dead_letter_max_redeliveries:  # a bad name fails here, not at a dead letter
            dead_letter_stream_name(record.name, subscription, config.dead_letter_stream)
        session_id = await client.meta.create_session(config.lease_ttl_ms)
        try:
            if config.subscription_type == FAILOVER:
                name = config.consumer_name or default_consumer_name()
                await _join_failover(client, record.name, subscription, name, session_id)
                consumer = cls(client, record, subscription, config=config,
                               session_id=session_id, consumer_name=name)
                await consumer._start_failover()
            else:
                revision = await _acquire_owner(client, record.name, subscription, session_id,
                                                config.lease_wait_ms)
                consumer = cls(client, record, subscription, config=config,
                               session_id=session_id)
                owner = cursor_owner_key(record.name, subscription)
                consumer._owners = {p: (owner, revision)
                                    for p in range(record.config.partitions)}
                await consumer._start()
        except BaseException:
            with contextlib.suppress(QuorumlogError):
                await client.meta.revoke_session(session_id)
            raise
        return consumer

    @property
    def partitions(self) -> list[int]:
        """The partitions this consumer reads now (all of them unless failover)."""
        return sorted(self._owners)

    async def _open_partition(self, partition: int) -> PartitionReader:
        """Load (or create) the partition's cursor and a reader from just after it."""
        state, _ = await load_or_create_cursor(self._client, self._record, self.subscription,
                                               partition, self._config.initial_position,
                                               read_compacted=self._config.read_compacted)
        compacted = (await load_compaction(self._client, self.stream, partition)
                     if self._config.read_compacted else None)
        tracker = AckTracker(state, ranges_max=self._record.config.cursor_ranges_max,
                             pending_max=self._config.unacked_messages_max)
        ledgers = LedgerList(self._client.meta, self.stream, partition)
        head = await ledgers.refresh()
        if state.mark_delete is not None:
            md = state.mark_delete
            start = SeqPosition(md.seq, md.entry_id, md.batch_index + 1, md.ledger_id)
        else:
            start = state.start or SeqPosition(head.first_seq, 0, 0, 0)
        in_view = (compacted is not None and compacted.ledger_id != 0
                   and (start.seq, start.entry_id) <= compacted.horizon_key)
        if start.seq < head.first_seq and not in_view:  # trimmed (the view has it otherwise)
            start = SeqPosition(head.first_seq, 0, 0, 0)
        self._trackers[partition] = tracker
        return PartitionReader(self._client, self._record, partition, start,
                               skip_data_loss=True, ledgers=ledgers, compacted=compacted)

    async def _start(self) -> None:
        parts = [await self._open_partition(p) for p in range(self._record.config.partitions)]
        self._reader = Reader(parts)
        self._start_tasks()

    async def _start_failover(self) -> None:
        partitions = self._record.config.partitions
        self._reader = Reader([], queue_batches_max=2 * partitions + 2)
        revision = await self._balance_once()
        self._start_tasks()
        self._balancer = asyncio.get_running_loop().create_task(self._balance_loop(revision))

    def _start_tasks(self) -> None:
        loop = asyncio.get_running_loop()
        self._keepalive = loop.create_task(self._keep_alive())
        if self._config.ack_flush_ms > 0:
            self._flusher = loop.create_task(self._flush_loop())
        self._metrics.consumers += 1
        self._counted = True

    # ----- failover: which partitions are this consumer's ------------------------------

    async def _balance_once(self) -> int:
        """Release the partitions now assigned to another member, claim the free
        ones assigned to this one; returns the meta revision the members were read at."""
        members_prefix = failover_members_prefix(self.stream, self.subscription)
        result, revision = await self._client.meta.range(members_prefix, prefix=True)
        names = sorted(kv.key[len(members_prefix):] for kv in result.kvs)
        if self.consumer_name not in names:
            self._lost = SubscriptionBusyError(
                f"subscription {self.subscription!r} of {self.stream!r}: consumer "
                f"{self.consumer_name!r} is no longer a member (its lease expired, or the "
                "subscription was reset or deleted with force)")
            return int(revision)
        mine = {p for p in range(self._record.config.partitions)
                if names[p % len(names)] == self.consumer_name}
        for partition in sorted(set(self._owners) - mine):
            await self._release(partition)
        for partition in sorted(mine - set(self._owners)):
            await self._claim(partition)
        return int(revision)

    async def _balance_loop(self, revision: int) -> None:
        meta = self._client.meta
        while not self._closed and self._lost is None:
            with contextlib.suppress(CompactedError):  # re-read below either way
                await meta.watch_once(failover_prefix(self.stream, self.subscription),
                                      prefix=True, start_revision=revision + 1,
                                      wait_ms=BALANCE_WATCH_MS)
            try:
                revision = await self._balance_once()
            except QuorumlogError as exc:
                log.warning("consumer_balance_failed", stream=self.stream,
                            subscription=self.subscription, error=exc.message)
                await asyncio.sleep(0.5)

    async def _claim(self, partition: int) -> None:
        """Take the partition if its previous owner let it go (else the watch on
        ``failover/`` wakes the balancer when it does)."""
        meta = self._client.meta
        key = failover_owner_key(self.stream, self.subscription, partition)
        lease = WriterLease(owner=self.consumer_name,
                            acquired_ms=self._client.clock.wall_ms()).encode()
        result = await meta.txn(compares=[version_is(key, 0)],
                                success=[PutOp(key=key, value=lease, session_id=self._session_id)])
        if not result.succeeded:
            return
        kv = await meta.get(key)
        if kv is None or kv.session_id != self._session_id:
            return
        async with self._lock:
            try:
                part = await self._open_partition(partition)
            except BaseException:
                self._trackers.pop(partition, None)
                with contextlib.suppress(QuorumlogError):
                    await meta.txn(compares=[created_at(key, kv.create_revision)],
                                   success=[DeleteOp(key=key)])
                raise
            self._owners[partition] = (key, kv.create_revision)
            assert self._reader is not None
            self._reader.add(part)
        log.info("consumer_partition_claimed", stream=self.stream,
                 subscription=self.subscription, consumer=self.consumer_name,
                 partition=partition)

    async def _release(self, partition: int) -> None:
        """Stop reading the partition, persist its acknowledgements, then let it go."""
        async with self._lock:
            assert self._reader is not None
            await self._reader.remove(partition)
            tracker = self._trackers[partition]
            if tracker.dirty:
                try:
                    await self._persist(partition, tracker)
                except QuorumlogError as exc:  # delivered again to the next owner
                    log.warning("consumer_release_flush_failed", stream=self.stream,
                                partition=partition, error=exc.message)
            del self._trackers[partition]
            self._forget(partition)
            key, revision = self._owners.pop(partition)
            await self._client.meta.txn(compares=[created_at(key, revision)],
                                        success=[DeleteOp(key=key)])
        log.info("consumer_partition_released", stream=self.stream,
                 subscription=self.subscription, consumer=self.consumer_name,
                 partition=partition)

    # ----- background ----------------------------------------------------------------------

    async def _keep_alive(self) -> None:
        while not self._closed:
            await asyncio.sleep(self._config.lease_ttl_ms / 3000)
            try:
                if not await self._client.meta.keepalive(self._session_id):
                    self._lost = SubscriptionBusyError(
                        f"subscription {self.subscription!r}: this consumer's lease expired")
                    return
            except QuorumlogError as exc:
                log.warning("consumer_keepalive_failed", stream=self.stream, error=exc.message)

    async def _flush_loop(self) -> None:
        while not self._closed:
            await asyncio.sleep(self._config.ack_flush_ms / 1000)
            try:
                await self.flush_acks()
            except QuorumlogError as exc:
                log.warning("consumer_ack_flush_failed", stream=self.stream, error=exc.message)

    # ----- receiving ----------------------------------------------------------------------

    async def receive(self, wait_ms: int | None = None) -> Message | None:
        """The next message (any partition this consumer reads), or one due to come
        again (``redelivery_count`` > 0); None if none arrived in ``wait_ms``
        (None: wait as long as it takes)."""
        if self._closed:
            raise UsageError("the consumer is closed")
        reader = self._reader
        assert reader is not None
        loop = asyncio.get_running_loop()
        deadline = None if wait_ms is None else loop.time() + wait_ms / 1000
        while True:
            if self._lost is not None:
                raise self._lost
            again = self._due_again(loop.time())
            if again is not None:
                return again
            reader.pause(any(t.full for t in self._trackers.values()))
            remaining = 500 if deadline is None else int((deadline - loop.time()) * 1000)
            if remaining <= 0:
                return None
            if self._redeliver:  # wake up for the next message due again
                remaining = min(remaining, max(1, int((self._redeliver[0][0] - loop.time())
                                                      * 1000)))
            if self._delivered_at:
                first_at, _ = next(iter(self._delivered_at.values()))
                remaining = min(remaining, max(1, int(
                    (first_at + self._config.ack_timeout_ms / 1000 - loop.time()) * 1000)))
            message = await reader.read_next(min(remaining, 500))
            if message is None:
                continue
            tracker = self._trackers.get(message.partition)
            if tracker is None:  # fetched just before the partition was handed over
                continue
            position = message.seq_position
            if tracker.should_skip(position.key):
                if tracker.mark_delete is None or position.key > tracker.mark_delete.key:
                    tracker.delivered(position, acked=True)
                continue
            tracker.delivered(position)
            if self._config.ack_timeout_ms:
                self._delivered_at[message.partition, position.key] = (loop.time(), message)
            return message

    def _due_again(self, now: float) -> Message | None:
        """A message whose negative acknowledgement delay or acknowledgement
        timeout has passed and that is still unacknowledged, counted."""
        timeout_s = self._config.ack_timeout_ms / 1000
        while self._delivered_at:
            slot, (at, message) = next(iter(self._delivered_at.items()))
            if at + timeout_s > now:
                break
            del self._delivered_at[slot]
            heapq.heappush(self._redeliver, (now, next(self._tie), message))
        while self._redeliver and self._redeliver[0][0] <= now:
            _, _, message = heapq.heappop(self._redeliver)
            tracker = self._trackers.get(message.partition)
            key = message.seq_position.key
            if tracker is None or not tracker.is_unacked(key):
                continue  # acknowledged meanwhile, or the partition was handed over
            slot = (message.partition, key)
            count = self._redelivered.get(slot, message.redelivery_count) + 1
            self._redelivered[slot] = count
            if (self._dead_letters is not None
                    and count > self._config.dead_letter_max_redeliveries
                    and slot not in self._not_dead_letters):
                # Delivered 1 + max times: to the dead-letter stream, acknowledged once there.
                self._dead_letters.put(msgspec.structs.replace(message, redelivery_count=count - 1))
                continue
            again = msgspec.structs.replace(message, redelivery_count=count)
            if self._config.ack_timeout_ms:
                self._delivered_at[slot] = (now, again)
            self._metrics.redelivered_messages += 1
            return again
        return None

    def negative_ack(self, message: Message) -> None:
        """Have a delivered, unacknowledged message come again after
        ``negative_ack_redelivery_delay_ms`` (Pulsar's negativeAcknowledge), with
        its ``redelivery_count`` one higher. Later messages are not held back."""
        tracker = self._tracker_for(message)
        if tracker is None:
            return  # handed over since: the next owner delivers it again anyway
        key = message.seq_position.key
        if not tracker.is_unacked(key):
            raise UsageError(f"message {message.position} was not delivered to this consumer "
                             "or is already acknowledged")
        self._delivered_at.pop((message.partition, key), None)
        due = (asyncio.get_running_loop().time()
               + self._config.negative_ack_redelivery_delay_ms / 1000)
        heapq.heappush(self._redeliver, (due, next(self._tie), message))

    def _unacked_here(self, message: Message) -> bool:
        """Delivered by this consumer and not acknowledged (its partition still
        this consumer's)."""
        tracker = self._trackers.get(message.partition)
        return tracker is not None and tracker.is_unacked(message.seq_position.key)

    def _dead_letter_refused(self, message: Message) -> None:
        """The dead-letter stream refused the message for good: deliver it again
        now, and from then on as any redelivery (never lost, never stuck)."""
        slot = (message.partition, message.seq_position.key)
        self._not_dead_letters.add(slot)
        self._redelivered[slot] = message.redelivery_count  # the delivery it did not get
        heapq.heappush(self._redeliver, (asyncio.get_running_loop().time(), next(self._tie),
                                         message))

    async def _dead_lettered(self, message: Message) -> None:
        """A dead letter is durable in the dead-letter stream: acknowledge it here
        (unless acknowledged meanwhile, or its partition was handed over: the
        next owner delivers it again)."""
        if not self._unacked_here(message):
            return
        self._trackers[message.partition].ack(message.seq_position)
        self._redelivered.pop((message.partition, message.seq_position.key), None)
        self._metrics.dead_lettered_messages += 1
        if self._config.ack_flush_ms == 0:
            await self.flush_acks()

    def _forget(self, partition: int, up_to: Key | None = None) -> None:
        """Stop timing, counting and redelivering the partition's messages (only
        timing and counting those up to ``up_to`` when given: acknowledged
        cumulatively)."""
        def gone(slot: tuple[int, Key]) -> bool:
            return slot[0] == partition and (up_to is None or slot[1] <= up_to)

        for slot in [s for s in self._delivered_at if gone(s)]:
            del self._delivered_at[slot]
        for slot in [s for s in self._redelivered if gone(s)]:
            del self._redelivered[slot]
        self._not_dead_letters = {s for s in self._not_dead_letters if not gone(s)}
        if up_to is None:  # handed over or sought: its pending redeliveries go too
            self._redeliver = [item for item in self._redeliver
                               if item[2].partition != partition]
            heapq.heapify(self._redeliver)

    def _tracker_for(self, message: Message) -> AckTracker | None:
        tracker = self._trackers.get(message.partition)
        if tracker is None and not (self._failover
                                    and 0 <= message.partition < self._record.config.partitions):
            raise UsageError(f"message {message.position} is not of a partition of "
                             f"stream {self.stream!r}")
        return tracker

    async def ack(self, message: Message) -> None:
        """Acknowledge one message (persisted within ``ack_flush_ms``).

        A failover consumer's acknowledgement of a partition it has handed over
        since is dropped: the next owner delivers that message again."""
        tracker = self._tracker_for(message)
        if tracker is None:
            return
        if not tracker.ack(message.seq_position):
            raise UsageError(f"message {message.position} was not delivered to this consumer "
                             "or is already acknowledged")
        if self._delivered_at or self._redelivered:
            slot = (message.partition, message.seq_position.key)
            self._delivered_at.pop(slot, None)
            self._redelivered.pop(slot, None)
            self._not_dead_letters.discard(slot)
        if self._config.ack_flush_ms == 0:
            await self.flush_acks()

    async def ack_cumulative(self, message: Message) -> None:
        """Acknowledge every message of the partition up to this one."""
        tracker = self._tracker_for(message)
        if tracker is None:
            return
        tracker.ack_cumulative(message.seq_position)
        if self._delivered_at or self._redelivered:
            self._forget(message.partition, message.seq_position.key)
        if self._config.ack_flush_ms == 0:
            await self.flush_acks()

    async def flush_acks(self) -> None:
        """Persist every cursor that changed since the last flush."""
        async with self._lock:
            for partition, tracker in list(self._trackers.items()):
                if tracker.dirty:
                    tracker.dirty = False
                    try:
                        await self._persist(partition, tracker)
                    except BaseException:
                        tracker.dirty = True
                        raise

    async def _persist(self, partition: int, tracker: AckTracker) -> None:
        key = cursor_key(self.stream, self.subscription, partition)
        owner, owner_revision = self._owners[partition]
        for _ in range(CURSOR_CAS_ATTEMPTS_MAX):
            kv = await self._client.meta.get(key)
            state = tracker.state(self._client.clock.wall_ms())
            if kv is not None:
                stored = CursorState.decode(kv.value)
                if stored.mark_delete is not None and (
                        state.mark_delete is None or stored.mark_delete > state.mark_delete):
                    # The trimmer expired messages (TTL): keep its mark-delete.
                    md = stored.mark_delete
                    state = CursorState(mark_delete=md,
                                        ranges=tuple(r for r in state.ranges if r[0] > md),
                                        start=state.start, updated_ms=state.updated_ms)
            result = await self._client.meta.txn(
                compares=[created_at(owner, owner_revision),
                          version_is(key, kv.version if kv else 0)],
                success=[PutOp(key=key, value=state.encode())],
            )
            if result.succeeded:
                return
            owner_kv = await self._client.meta.get(owner)
            if owner_kv is None or owner_kv.create_revision != owner_revision:
                held = (f"partition {partition} of {self.stream!r}" if self._failover
                        else f"subscription {self.subscription!r} of {self.stream!r}")
                self._lost = SubscriptionBusyError(
                    f"{held} is now held by another consumer; acknowledgements since the "
                    "last flush are not saved")
                raise self._lost
        raise SubscriptionBusyError(f"cursor {key} kept changing; acknowledgement not saved")

    async def seek(self, to: StartSpec) -> list[SeqPosition]:
        """Start the subscription again at ``to`` ('earliest', 'latest', a publish
        time in ms: the first message published at or after it, or a Position
        on a one-partition stream), as Pulsar's
        ``consumer.seek``: the cursor of every partition is rewritten (persisted
        at once), unacknowledged deliveries are forgotten, and the next
        ``receive`` reads from there. Exclusive consumers only: a failover one
        reads some partitions, so reset its subscription with
        ``StreamClient.reset_cursor(..., force=True)``. Returns the positions."""
        if self._closed:
            raise UsageError("the consumer is closed")
        if self._lost is not None:
            raise self._lost
        if self._failover:
            raise UsageError("a failover consumer reads only some of the partitions: reset "
                             "the subscription with StreamClient.reset_cursor(..., force=True) "
                             "(quorumlog stream reset-cursor --force) instead")
        if isinstance(to, str) and to not in (EARLIEST, LATEST):
            raise UsageError(f"seek to 'earliest', 'latest', a publish time in ms or a "
                             f"position, got {to!r}")
        if isinstance(to, Position | SeqPosition) and self._record.config.partitions > 1:
            raise UsageError(f"stream {self.stream!r} has {self._record.config.partitions} "
                             "partitions: a position names one ledger of one partition; seek "
                             "to 'earliest', 'latest' or a publish time instead")
        reader = self._reader
        assert reader is not None
        handles = LedgerHandles(self._client, self._record)
        starts = []
        async with self._lock:
            for partition in sorted(self._owners):
                await reader.remove(partition)
            self._redeliver.clear()
            for partition in sorted(self._owners):
                if to == EARLIEST and self._config.read_compacted:
                    starts.append(await self._restart_at(partition, VIEW_START))
                    continue
                start, skip_ms = await resolve_start(self._client, handles, self._record,
                                                     partition, to)
                if skip_ms:  # a publish time: the first message at or after it exactly
                    probe = PartitionReader(self._client, self._record, partition, start,
                                            skip_before_ms=skip_ms, skip_data_loss=True,
                                            handles=handles)
                    found = await probe.next_batch(SEEK_PROBE_WAIT_MS)
                    if found:
                        start = found[0].seq_position
                starts.append(await self._restart_at(partition, start))
        return starts

    async def _restart_at(self, partition: int, start: SeqPosition) -> SeqPosition:
        """seek: rewrite the partition's cursor to start at ``start`` and read on from there
        (the caller holds the lock and removed the partition from the reader)."""
        await self._write_cursor(partition, CursorState(
            start=start, updated_ms=self._client.clock.wall_ms()))
        self._forget(partition)
        assert self._reader is not None
        self._reader.add(await self._open_partition(partition))
        return start

    async def _write_cursor(self, partition: int, state: CursorState) -> None:
        """Replace the partition's cursor, guarded by this consumer's ownership."""
        key = cursor_key(self.stream, self.subscription, partition)
        owner, owner_revision = self._owners[partition]
        for _ in range(CURSOR_CAS_ATTEMPTS_MAX):
            kv = await self._client.meta.get(key)
            result = await self._client.meta.txn(
                compares=[created_at(owner, owner_revision),
                          version_is(key, kv.version if kv else 0)],
                success=[PutOp(key=key, value=state.encode())])
            if result.succeeded:
                return
            owner_kv = await self._client.meta.get(owner)
            if owner_kv is None or owner_kv.create_revision != owner_revision:
                self._lost = SubscriptionBusyError(
                    f"subscription {self.subscription!r} of {self.stream!r} is now held by "
                    "another consumer")
                raise self._lost
        raise SubscriptionBusyError(f"cursor {key} kept changing; not moved")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._counted:
            self._metrics.consumers -= 1
        if self._dead_letters is not None:
            await self._dead_letters.close()
        for task in (self._balancer, self._flusher, self._keepalive):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._reader is not None:
            await self._reader.close()
        try:
            if self._lost is None:
                await self.flush_acks()
        finally:
            with contextlib.suppress(QuorumlogError):
                await self._client.meta.revoke_session(self._session_id)

    async def __aenter__(self) -> Consumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def unacked(self, partition: int) -> list[SeqPosition]:
        return self._trackers[partition].unacked()


async def _acquire_owner(client: LedgerClient, stream: str, subscription: str, session_id: int,
                         wait_ms: int) -> int:
    key = cursor_owner_key(stream, subscription)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_ms / 1000
    lease = WriterLease(owner=owner_name(), acquired_ms=client.clock.wall_ms()).encode()
    while True:
        result = await client.meta.txn(compares=[version_is(key, 0)],
                                       success=[PutOp(key=key, value=lease,
                                                      session_id=session_id)])
        if result.succeeded:
            kv = await client.meta.get(key)
            if kv is not None and kv.session_id == session_id:
                members = await client.meta.list_keys(failover_members_prefix(stream,
                                                                              subscription))
                if members:  # failover consumers joined first: theirs
                    await client.meta.txn(compares=[created_at(key, kv.create_revision)],
                                          success=[DeleteOp(key=key)])
                    raise _type_conflict(stream, subscription, FAILOVER, len(members))
                revision: int = kv.create_revision
                return revision
            continue
        kv = await client.meta.get(key)
        if kv is None:
            continue
        remaining = int((deadline - loop.time()) * 1000)
        if remaining <= 0:
            raise SubscriptionBusyError(
                f"subscription {subscription!r} of stream {stream!r} has a consumer; "
                "subscriptions are exclusive (it is released when that consumer closes or its "
                "lease expires)"
            )
        await watch_key_once(client.meta, key, start_revision=kv.mod_revision + 1,
                             wait_ms=min(remaining, 1000))


def _type_conflict(stream: str, subscription: str, held_by: str,
                   count: int = 1) -> SubscriptionBusyError:
    wanted = EXCLUSIVE if held_by == FAILOVER else FAILOVER
    consumers = f"{count} {held_by} consumer" + ("s" if count != 1 else "")
    article = "an" if wanted == EXCLUSIVE else "a"
    return SubscriptionBusyError(
        f"subscription {subscription!r} of stream {stream!r} has {consumers}; {article} {wanted} "
        f"consumer cannot join it (subscribe with subscription_type={held_by!r}, or use "
        "another subscription)")


async def _join_failover(client: LedgerClient, stream: str, subscription: str, name: str,
                         session_id: int) -> None:
    """Become a member of a failover subscription (its balancer then claims partitions)."""
    owner = cursor_owner_key(stream, subscription)
    key = failover_member_key(stream, subscription, name)
    lease = WriterLease(owner=name, acquired_ms=client.clock.wall_ms()).encode()
    for _ in range(CURSOR_CAS_ATTEMPTS_MAX):
        result = await client.meta.txn(
            compares=[version_is(owner, 0), version_is(key, 0)],
            success=[PutOp(key=key, value=lease, session_id=session_id)])
        if result.succeeded:
            return
        if await client.meta.get(owner) is not None:
            raise _type_conflict(stream, subscription, EXCLUSIVE)
        if await client.meta.get(key) is not None:
            raise SubscriptionBusyError(
                f"subscription {subscription!r} of stream {stream!r} already has a consumer "
                f"named {name!r}; give each failover consumer its own consumer_name")
    raise SubscriptionBusyError(f"could not join subscription {subscription!r} of {stream!r}: "
                                "its keys kept changing")
