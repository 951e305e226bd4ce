"""Producer: routes messages to partitions, batches them into entries.

One producer holds the writer lease of every partition of its stream (one meta
session, kept alive here). A keyed message goes to ``crc32c(key) % P``;
messages without a key go round robin. Messages bound for one partition are
packed into one entry until ``batch_messages_max`` / ``batch_bytes_max``
(Pulsar: batchingMaxMessages = 1000, batchingMaxBytes = 128 KiB). When a
batch goes depends on the partition's link, not on a timer alone:

- fewer than ``batch_eager_entries_max`` of the partition's entries in flight
  (the link is idle or nearly so): the batch goes at the end of the loop pass
  that started it, so what was sent in one pass shares one entry and nothing
  waits for a timer;
- otherwise the batch keeps filling, and goes as soon as one of the entries in
  flight completes (ack clocking), or ``batch_delay_ms`` after its first
  message (Pulsar's batchingMaxPublishDelay = 1 ms) if none completes first.

So at low and medium load a message waits for no timer, and under load the
entries grow instead of the queue. A send completes when its entry is durable
(acknowledged by the ack quorum) and gives the message's :class:`MessageId`.
Batches leave in the order they were started, whichever rule sends them.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections import deque
from collections.abc import Mapping

import msgspec

from quorumlog.config import Config, require
from quorumlog.errors import QuorumlogError, UsageError, invariant
from quorumlog.ledger import LedgerClient
from quorumlog.log import get_logger
from quorumlog.stream._entry import (
    ENTRY_HEADER_BYTES,
    KEY_MAX_BYTES,
    MESSAGE_HEADER_BYTES,
    OutgoingMessage,
    checked_message_bytes,
    encode_entry,
)
from quorumlog.stream._errors import MessageTooLargeError, ProducerFencedError
from quorumlog.stream._layout import StreamRecord
from quorumlog.stream._meta import load_record
from quorumlog.stream._metrics import BACKLOG_INTERVAL_S, set_backlog, stream_metrics
from quorumlog.stream._position import Position
from quorumlog.stream._retention import RoundRobin, partition_for_key
from quorumlog.stream._subscriptions import list_subscriptions
from quorumlog.stream._writer import EntryInfo, PartitionWriter, owner_name

log = get_logger(__name__)

_VALUE_TYPES = (bytes, bytearray, memoryview)


class ProducerConfig(Config, frozen=True):
    batching: bool = True
    batch_messages_max: int = 1000  # Pulsar batchingMaxMessages
    batch_bytes_max: int = 128 * 1024  # Pulsar batchingMaxBytes
    batch_delay_ms: float = 1.0  # Pulsar batchingMaxPublishDelayMicros = 1000
    # A batch goes at the end of its loop pass while fewer than this many of
    # the partition's entries are in flight; at or above it, the batch waits
    # for an entry to complete (or batch_delay_ms). Small: each eager entry
    # costs the bookies a request, and past a few in flight a bigger entry
    # serves the messages better than another small one.
    batch_eager_entries_max: int = 4
    pending_messages_max: int = 10_000  # sends beyond this wait (bounded memory)
    lease_wait_ms: int = 30_000  # how long open waits for another writer's lease
    # How often the producer (the owner of the stream's writes) recomputes the
    # backlog gauges of every subscription (quorumlog_stream_backlog_entries):
    # a few meta reads per partition and subscription, so seconds, not per
    # message; 0 turns it off.
    backlog_interval_ms: int = int(BACKLOG_INTERVAL_S * 1000)

    def validate(self) -> None:
        require(self.batch_messages_max >= 1, "batch_messages_max must be >= 1")
        require(self.batch_bytes_max >= 1, "batch_bytes_max must be >= 1")
        require(self.batch_delay_ms >= 0, "batch_delay_ms must be >= 0")
        require(self.batch_eager_entries_max >= 0,
                "batch_eager_entries_max must be >= 0 (0: always wait for batch_delay_ms "
                "or an entry to complete)")
        require(self.pending_messages_max >= 1, "pending_messages_max must be >= 1")
        require(self.lease_wait_ms >= 0, "lease_wait_ms must be >= 0")
        require(self.backlog_interval_ms >= 0, "backlog_interval_ms must be >= 0 (0: off)")


class MessageId(msgspec.Struct, frozen=True, gc=False):
    """Where a sent message landed.

    A msgspec Struct left out of the garbage collector (it holds a str, an int
    and a Position: no cycle possible): one is made per message, and a frozen
    dataclass cost 0.56 µs to build against 0.07 µs, and one more tracked
    object per message for the collector.
    """

    stream: str
    partition: int
    position: Position

    def to_json(self) -> dict[str, object]:
        return {"stream": self.stream, "partition": self.partition, **self.position.to_json()}


class _Batch:
    """The messages of one partition that go in one entry.

    Once sent, the batch is its entry's callback (``EntryCallback``): it
    carries the futures and the producer, so an entry costs no partial,
    bound method and argument tuple for the garbage collector to track. The
    producer reference is set only when the batch leaves the producer's open
    batches, so no reference cycle forms.
    """

    __slots__ = ("bytes", "futures", "messages", "partition", "producer", "scheduled", "timer")

    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.messages: list[OutgoingMessage] = []
        self.futures: list[asyncio.Future[MessageId]] = []
        self.bytes = 0
        self.scheduled = False  # its flush is arranged (end of pass, timer or completion)
        self.timer: asyncio.TimerHandle | None = None
        self.producer: Producer | None = None  # set when sent: who gets the outcome

    def __call__(self, position: Position | None, error: QuorumlogError | None) -> None:
        """The entry's outcome (the partition writer calls it)."""
        producer = self.producer
        invariant(producer is not None, "a batch gets an outcome only once it was sent")
        assert producer is not None
        producer._resolve(self, position, error)


class Producer:
    """Sends messages to one stream. Create with ``await StreamClient.producer(name)``."""

    def __init__(self, client: LedgerClient, record: StreamRecord, config: ProducerConfig,
                 session_id: int) -> None:
        self._client = client
        self._record = record
        self._config = config
        self._session_id = session_id
        self.stream = record.name
        self.partitions = record.config.partitions
        self._writers: list[PartitionWriter] = []
        self._batches = [_Batch(partition) for partition in range(self.partitions)]
        # Entries submitted to each partition's writer and not yet completed.
        self._entries_in_flight = [0] * self.partitions
        self._entries_sent = 0  # entries this producer submitted (all partitions)
        self._loop = asyncio.get_running_loop()
        # The context a batch's flush runs in (the producer's; call_soon without
        # one copies the current context: one more tracked object per batch).
        self._context = contextvars.copy_context()
        # Room for sends: messages queued or in flight, at most pending_messages_max.
        # A counter, not an asyncio.Semaphore: a send with room takes it without
        # a coroutine, and a whole entry's messages give it back in one step.
        self._room_free = config.pending_messages_max
        self._room_waiters: deque[asyncio.Future[None]] = deque()
        self._round_robin = RoundRobin()
        self._keepalive: asyncio.Task[None] | None = None
        self._backlog: asyncio.Task[None] | None = None
        self._metrics = stream_metrics(record.name)
        self._metrics.producers += 1  # until close()
        self._outstanding: set[asyncio.Future[MessageId]] = set()
        # The ledger client's limit for one entry (its config does not change).
        self._entry_max_bytes = client.config.entry_max_bytes
        self._closed = False

    @classmethod
    async def open(cls, client: LedgerClient, stream: str, *, steal: bool = False,
                   config: ProducerConfig | None = None) -> Producer:
        config = config or ProducerConfig()
        config.validate()
        record = await load_record(client.meta, stream)
        session_id = await client.meta.create_session(record.config.writer_lease_ttl_ms)
        producer = cls(client, record, config, session_id)
        producer._keepalive = asyncio.get_running_loop().create_task(producer._keep_alive())
        if config.backlog_interval_ms:
            producer._backlog = asyncio.get_running_loop().create_task(producer._backlog_loop())
        owner = owner_name()
        try:
            for partition in range(record.config.partitions):
                writer = PartitionWriter(client, record, partition, session_id, owner=owner)
                # Without steal, a partition is taken over at its first message, so a
                # short-lived producer (one CLI call) adds a ledger only where it writes.
                # With steal, at once: the live writer it replaces is fenced now.
                await writer.open(steal=steal, wait_ms=config.lease_wait_ms, lazy=not steal)
                producer._writers.append(writer)
        except BaseException:
            await producer.close()
            raise
        return producer

    async def _keep_alive(self) -> None:
        interval = self._record.config.writer_lease_ttl_ms / 3000
        while not self._closed:
            await asyncio.sleep(interval)
            try:
                alive = await self._client.meta.keepalive(self._session_id)
            except QuorumlogError as exc:
                log.warning("producer_keepalive_failed", stream=self.stream, error=exc.message)
                continue
            if not alive:
                log.warning("producer_lease_expired", stream=self.stream)
                error = ProducerFencedError(
                    f"stream {self.stream!r}: the producer's lease expired (no keepalive for "
                    f"{self._record.config.writer_lease_ttl_ms} ms); create a new producer"
                )
                for writer in self._writers:
                    writer._fail(error)
                return

    async def _backlog_loop(self) -> None:
        """Recompute the subscriptions' backlog gauges every ``backlog_interval_ms``."""
        interval_s = self._config.backlog_interval_ms / 1000
        while not self._closed:
            await asyncio.sleep(interval_s)
            try:
                subscriptions = await list_subscriptions(self._client, self.stream)
            except QuorumlogError as exc:
                log.debug("producer_backlog_failed", stream=self.stream, error=exc.message)
                continue
            set_backlog(self.stream, {s.name: s.backlog_entries for s in subscriptions})

    # ----- sending ------------------------------------------------------------------------

    async def send(self, value: bytes, *, key: bytes | str | None = None,
                   properties: Mapping[str, str] | None = None,
                   partition: int | None = None) -> MessageId:
        """Send one message and wait until it is durable."""
        return await (await self.send_async(value, key=key, properties=properties,
                                            partition=partition))

    async def send_async(self, value: bytes, *, key: bytes | str | None = None,
                         properties: Mapping[str, str] | None = None,
                         partition: int | None = None) -> asyncio.Future[MessageId]:
        """Queue one message (waiting for room if ``pending_messages_max`` are in
        flight); the returned future completes when it is durable."""
        if self._closed:
            raise UsageError("the producer is closed")
        if not isinstance(value, _VALUE_TYPES):
            raise UsageError(f"a message value must be bytes, got {type(value).__name__}")
        key_bytes = key.encode() if isinstance(key, str) else key
        if partition is None:
            partition = partition_for_key(key_bytes, self.partitions, self._round_robin.next())
        elif not 0 <= partition < self.partitions:
            raise UsageError(f"partition {partition} out of range 0..{self.partitions - 1}")
        writer = self._writers[partition]
        if writer.failed is not None:
            raise writer.failed
        if type(value) is not bytes:
            value = bytes(value)
        if properties:
            props: dict[str, str] | None = dict(properties)
            size = self._checked_size(OutgoingMessage(value, key=key_bytes, properties=props))
        else:  # the common case, checked without a message object or encoding
            props = None
            size = MESSAGE_HEADER_BYTES + len(value)
            if key_bytes is not None:
                if len(key_bytes) > KEY_MAX_BYTES:
                    raise UsageError(f"a message key has {len(key_bytes)} bytes; at most "
                                     f"{KEY_MAX_BYTES}")
                size += len(key_bytes)
            if ENTRY_HEADER_BYTES + size > self._entry_max_bytes:
                self._checked_size(OutgoingMessage(value, key=key_bytes))  # raises
        if self._room_free <= 0 or self._room_waiters:
            await self._wait_for_room()  # the publish time is taken after the wait
        message = OutgoingMessage(value, key=key_bytes, properties=props,
                                  publish_time_ms=writer.next_publish_ms())
        self._room_free -= 1
        loop = self._loop
        future: asyncio.Future[MessageId] = loop.create_future()
        self._outstanding.add(future)
        if (self._batches[partition].messages
                and ENTRY_HEADER_BYTES + self._batches[partition].bytes + size
                > self._entry_max_bytes):
            self._flush(partition)  # the message would not fit in this batch's entry
        batch = self._batches[partition]
        batch.messages.append(message)
        batch.futures.append(future)
        batch.bytes += size
        config = self._config
        if (not config.batching or len(batch.messages) >= config.batch_messages_max
                or batch.bytes >= config.batch_bytes_max):
            self._flush(partition)
        elif not batch.scheduled:
            batch.scheduled = True
            if self._entries_in_flight[partition] < config.batch_eager_entries_max:
                # end of this pass
                loop.call_soon(self._flush_batch, partition, batch, context=self._context)
            else:  # the link is busy: an entry's completion or the timer sends it
                batch.timer = loop.call_later(config.batch_delay_ms / 1000,
                                              self._flush_batch, partition, batch,
                                              context=self._context)
        return future

    def _checked_size(self, message: OutgoingMessage) -> int:
        """The message's bytes in an entry; refuses one that no entry can hold.

        The limit is the ledger client's ``entry_max_bytes`` (what one ledger
        entry may carry) minus the stream entry header: checked here, before
        anything is queued, because no retry and no new ledger can make such a
        message fit.
        """
        size = checked_message_bytes(message)
        entry_max_bytes = self._entry_max_bytes
        if ENTRY_HEADER_BYTES + size > entry_max_bytes:
            raise MessageTooLargeError(
                f"stream {self.stream!r}: a message of {len(message.value)} value bytes takes "
                f"{ENTRY_HEADER_BYTES + size} bytes as an entry, over the ledger entry limit "
                f"entry_max_bytes={entry_max_bytes}; nothing was sent. Split the message (at "
                f"most {entry_max_bytes - ENTRY_HEADER_BYTES} bytes of value, key and "
                "properties with their headers), or raise entry_max_bytes of the ledger client "
                "and of every bookie")
        return size

    async def _wait_for_room(self) -> None:
        """Wait (first come, first served) until a send may take room."""
        while True:
            waiter = self._loop.create_future()
            self._room_waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                self._wake_room_waiters()  # pass on a wake-up this send cannot use
                raise
            finally:
                with contextlib.suppress(ValueError):
                    self._room_waiters.remove(waiter)
            if self._room_free > 0:
                return

    def _finish(self, futures: list[asyncio.Future[MessageId]]) -> None:
        """The messages of one batch have their outcome: give their room back."""
        self._outstanding.difference_update(futures)
        self._room_free += len(futures)
        self._wake_room_waiters()

    def _wake_room_waiters(self) -> None:
        woken = 0
        for waiter in self._room_waiters:
            if woken >= self._room_free:
                break
            if not waiter.done():
                waiter.set_result(None)
                woken += 1

    def _flush_batch(self, partition: int, batch: _Batch) -> None:
        """Send ``batch`` if it is still the partition's open batch (a size limit
        or ``flush()`` may have sent it already)."""
        if self._batches[partition] is batch:
            self._flush(partition)

    def _flush(self, partition: int) -> None:
        batch = self._batches[partition]
        if batch.timer is not None:
            batch.timer.cancel()
            batch.timer = None
        if not batch.messages:
            return
        self._batches[partition] = _Batch(partition)
        try:
            payload = encode_entry(batch.messages)
        except QuorumlogError as exc:
            for future in batch.futures:
                if not future.done():
                    future.set_exception(exc)
            self._finish(batch.futures)
            return
        info = EntryInfo(messages=len(batch.messages),
                         first_publish_ms=batch.messages[0].publish_time_ms,
                         last_publish_ms=batch.messages[-1].publish_time_ms)
        batch.messages.clear()  # in the payload now; the batch lives until its entry is durable
        writer = self._writers[partition]
        self._entries_in_flight[partition] += 1
        self._entries_sent += 1
        try:
            batch.producer = self
            writer.submit_with_callback(payload, info, batch)
        except QuorumlogError as exc:
            self._entries_in_flight[partition] -= 1
            self._entries_sent -= 1
            for future in batch.futures:
                if not future.done():
                    future.set_exception(exc)
            self._finish(batch.futures)

    def _resolve(self, batch: _Batch, position: Position | None,
                 error: QuorumlogError | None) -> None:
        """An entry's outcome, called by the partition's writer as soon as it
        knows it (not a loop pass later): the messages' futures complete now."""
        partition, futures = batch.partition, batch.futures
        self._entries_in_flight[partition] -= 1
        waiting = self._batches[partition]
        if (waiting.messages and waiting.timer is not None
                and self._entries_in_flight[partition] < self._config.batch_eager_entries_max):
            self._flush(partition)  # an entry left the link: the waiting batch goes now
        self._finish(futures)
        if error is not None or position is None:
            failure = error or UsageError("an entry completed without a position")
            for future in futures:
                if not future.done():
                    future.set_exception(failure)
            return
        self._metrics.in_messages += len(futures)
        self._metrics.in_bytes += batch.bytes
        stream, ledger_id, entry_id = self.stream, position.ledger_id, position.entry_id
        for index, future in enumerate(futures):
            if not future.done():
                future.set_result(MessageId(stream, partition,
                                            Position(ledger_id, entry_id, index)))

    async def flush(self) -> None:
        """Send every batched message now and wait until all sent ones are durable."""
        for partition in range(self.partitions):
            self._flush(partition)
        outstanding = set(self._outstanding)
        if outstanding:
            await asyncio.wait(outstanding)

    async def close(self) -> None:
        """Flush, close every partition's ledger, release the leases and the session."""
        if self._closed:
            return
        for partition in range(len(self._writers)):
            self._flush(partition)
        self._closed = True
        self._metrics.producers -= 1
        for writer in self._writers:
            await writer.close()
        for task in (self._keepalive, self._backlog):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        with contextlib.suppress(QuorumlogError):
            await self._client.meta.revoke_session(self._session_id)

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def writers(self) -> list[PartitionWriter]:
        return list(self._writers)

    @property
    def entries_in_flight(self) -> int:
        """Entries submitted to the partitions' writers and not yet completed."""
        return sum(self._entries_in_flight)

    @property
    def entries_sent(self) -> int:
        """Entries (batches of messages) this producer submitted so far."""
        return self._entries_sent
