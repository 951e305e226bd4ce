"""Consumer: a named subscription (cursor) on every partition of a stream.

A subscription is exclusive: the consumer holds the ephemeral key
``cursors/<sub>/owner`` on its meta session (a second consumer waits for it or
gets SubscriptionBusyError). Per partition it reads from just after the
persisted mark-delete, skips messages the persisted ranges acknowledge, and
tracks acknowledgements (``AckTracker``). Acknowledgements are persisted every
``ack_flush_ms`` (Pulsar's ackGroupTime, 100 ms) and on close, or at once with
``ack_flush_ms=0``; after a crash the messages acknowledged since the last
flush are delivered again (at-least-once).
"""

from __future__ import annotations

import asyncio
import contextlib

from quorumlog.config import Config, require
from quorumlog.errors import QuorumlogError, UsageError
from quorumlog.ledger import LedgerClient
from quorumlog.log import get_logger
from quorumlog.meta import PutOp
from quorumlog.stream._cursor import AckTracker, CursorState
from quorumlog.stream._errors import SubscriptionBusyError
from quorumlog.stream._layout import (
    StreamRecord,
    WriterLease,
    check_name,
    cursor_key,
    cursor_owner_key,
)
from quorumlog.stream._ledgers import LedgerList
from quorumlog.stream._meta import (
    created_at,
    load_record,
    version_is,
    watch_key_once,
)
from quorumlog.stream._metrics import stream_metrics
from quorumlog.stream._position import EARLIEST, LATEST, SeqPosition
from quorumlog.stream._reader import (
    LedgerHandles,
    Message,
    PartitionReader,
    Reader,
    end_position,
    first_position,
)
from quorumlog.stream._writer import owner_name

log = get_logger(__name__)

CURSOR_CAS_ATTEMPTS_MAX = 32


class ConsumerConfig(Config, frozen=True):
    initial_position: str = LATEST  # where a new subscription starts (Pulsar's default)
    ack_flush_ms: int = 100  # Pulsar acknowledgmentGroupTime
    unacked_messages_max: int = 50_000  # Pulsar maxUnackedMessagesPerConsumer
    lease_ttl_ms: int = 10_000
    lease_wait_ms: int = 30_000

    def validate(self) -> None:
        require(self.initial_position in (EARLIEST, LATEST),
                "initial_position must be 'earliest' or 'latest'")
        require(self.ack_flush_ms >= 0, "ack_flush_ms must be >= 0")
        require(self.unacked_messages_max >= 1, "unacked_messages_max must be >= 1")
        require(self.lease_ttl_ms >= 500, "lease_ttl_ms must be >= 500")


async def load_or_create_cursor(client: LedgerClient, record: StreamRecord, subscription: str,
                                partition: int, initial: str) -> tuple[CursorState, int]:
    """The persisted cursor (state, version); a new one starts at ``initial``."""
    key = cursor_key(record.name, subscription, partition)
    for _ in range(CURSOR_CAS_ATTEMPTS_MAX):
        kv = await client.meta.get(key)
        if kv is not None:
            return CursorState.decode(kv.value), kv.version
        ledgers = LedgerList(client.meta, record.name, partition)
        head = await ledgers.refresh()
        if initial == LATEST:
            start = await end_position(LedgerHandles(client, record), head)
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
                 config: ConsumerConfig, session_id: int, owner_revision: int) -> None:
        self._client = client
        self._record = record
        self.stream = record.name
        self.subscription = subscription
        self._config = config
        self._session_id = session_id
        self._owner_revision = owner_revision
        self._trackers: dict[int, AckTracker] = {}
        self._reader: Reader | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._keepalive: asyncio.Task[None] | None = None
        self._closed = False
        self._lost: QuorumlogError | None = None
        self._metrics = stream_metrics(record.name)
        self._counted = False  # in quorumlog_stream_consumers (from _start to close)

    @classmethod
    async def open(cls, client: LedgerClient, stream: str, subscription: str, *,
                   config: ConsumerConfig | None = None) -> Consumer:
        config = config or ConsumerConfig()
        config.validate()
        check_name("subscription", subscription)
        record = await load_record(client.meta, stream)
        session_id = await client.meta.create_session(config.lease_ttl_ms)
        try:
            revision = await _acquire_owner(client, record.name, subscription, session_id,
                                            config.lease_wait_ms)
            consumer = cls(client, record, subscription, config=config, session_id=session_id,
                           owner_revision=revision)
            await consumer._start()
        except BaseException:
            with contextlib.suppress(QuorumlogError):
                await client.meta.revoke_session(session_id)
            raise
        return consumer

    async def _start(self) -> None:
        parts = []
        for partition in range(self._record.config.partitions):
            state, _ = await load_or_create_cursor(self._client, self._record, self.subscription,
                                                   partition, self._config.initial_position)
            tracker = AckTracker(state, ranges_max=self._record.config.cursor_ranges_max,
                                 pending_max=self._config.unacked_messages_max)
            self._trackers[partition] = tracker
            ledgers = LedgerList(self._client.meta, self.stream, partition)
            head = await ledgers.refresh()
            if state.mark_delete is not None:
                md = state.mark_delete
                start = SeqPosition(md.seq, md.entry_id, md.batch_index + 1, md.ledger_id)
            else:
                start = state.start or SeqPosition(head.first_seq, 0, 0, 0)
            if start.seq < head.first_seq:
                start = SeqPosition(head.first_seq, 0, 0, 0)
            parts.append(PartitionReader(self._client, self._record, partition, start,
                                         skip_data_loss=True, ledgers=ledgers))
        self._reader = Reader(parts)
        loop = asyncio.get_running_loop()
        self._keepalive = loop.create_task(self._keep_alive())
        if self._config.ack_flush_ms > 0:
            self._flusher = loop.create_task(self._flush_loop())
        self._metrics.consumers += 1
        self._counted = True

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
        """The next message (any partition); None if none arrived in ``wait_ms``
        (None: wait as long as it takes)."""
        if self._closed:
            raise UsageError("the consumer is closed")
        if self._lost is not None:
            raise self._lost
        reader = self._reader
        assert reader is not None
        loop = asyncio.get_running_loop()
        deadline = None if wait_ms is None else loop.time() + wait_ms / 1000
        while True:
            reader.pause(any(t.full for t in self._trackers.values()))
            remaining = 500 if deadline is None else int((deadline - loop.time()) * 1000)
            if remaining <= 0:
                return None
            message = await reader.read_next(min(remaining, 500))
            if message is None:
                continue
            tracker = self._trackers[message.partition]
            position = message.seq_position
            if tracker.should_skip(position.key):
                if tracker.mark_delete is None or position.key > tracker.mark_delete.key:
                    tracker.delivered(position, acked=True)
                continue
            tracker.delivered(position)
            return message

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> Message:
        message = await self.receive()
        assert message is not None
        return message

    async def ack(self, message: Message) -> None:
        """Acknowledge one message (persisted within ``ack_flush_ms``)."""
        tracker = self._trackers[message.partition]
        if not tracker.ack(message.seq_position):
            raise UsageError(f"message {message.position} was not delivered to this consumer "
                             "or is already acknowledged")
        if self._config.ack_flush_ms == 0:
            await self.flush_acks()

    async def ack_cumulative(self, message: Message) -> None:
        """Acknowledge every message of the partition up to this one."""
        self._trackers[message.partition].ack_cumulative(message.seq_position)
        if self._config.ack_flush_ms == 0:
            await self.flush_acks()

    async def flush_acks(self) -> None:
        """Persist every cursor that changed since the last flush."""
        for partition, tracker in self._trackers.items():
            if tracker.dirty:
                tracker.dirty = False
                try:
                    await self._persist(partition, tracker)
                except BaseException:
                    tracker.dirty = True
                    raise

    async def _persist(self, partition: int, tracker: AckTracker) -> None:
        key = cursor_key(self.stream, self.subscription, partition)
        owner = cursor_owner_key(self.stream, self.subscription)
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
                compares=[created_at(owner, self._owner_revision),
                          version_is(key, kv.version if kv else 0)],
                success=[PutOp(key=key, value=state.encode())],
            )
            if result.succeeded:
                return
            owner_kv = await self._client.meta.get(owner)
            if owner_kv is None or owner_kv.create_revision != self._owner_revision:
                self._lost = SubscriptionBusyError(
                    f"subscription {self.subscription!r} of {self.stream!r} is now held by "
                    "another consumer; acknowledgements since the last flush are not saved")
                raise self._lost
        raise SubscriptionBusyError(f"cursor {key} kept changing; acknowledgement not saved")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._counted:
            self._metrics.consumers -= 1
        for task in (self._flusher, self._keepalive):
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
