"""Entry points: :class:`StreamClient` (asyncio) and :class:`BlockingStreamClient`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, TypeVar

from quorumlog import rpc
from quorumlog.clock import Clock
from quorumlog.errors import UsageError
from quorumlog.ledger import LedgerClient
from quorumlog.stream import _admin, _compaction, _offload, _stats, _subscriptions
from quorumlog.stream._config import OffloadPolicy, RetentionPolicy, StreamConfig
from quorumlog.stream._consumer import Consumer, ConsumerConfig
from quorumlog.stream._layout import CompactionRecord, OffloadRecord, StreamRecord
from quorumlog.stream._meta import load_record
from quorumlog.stream._position import EARLIEST, SeqPosition
from quorumlog.stream._producer import MessageId, Producer, ProducerConfig
from quorumlog.stream._reader import Message, Reader, StartSpec
from quorumlog.stream._subscriptions import SubscriptionInfo
from quorumlog.stream._table_view import TableView

T = TypeVar("T")
LOOP_THREAD_NAME = "quorumlog-stream-client"


class StreamClient:
    """Streams over a :class:`LedgerClient` (which it does not own unless
    created by :meth:`connect`)::

        async with await StreamClient.connect(meta_addresses) as client:
            await client.create_stream("events", StreamConfig(partitions=4))
            producer = await client.producer("events")
            await producer.send(b"hello", key="user-1", properties={"k": "v"})
            consumer = await client.subscribe("events", "my-sub")
            async for message in consumer:
                await consumer.ack(message)
    """

    def __init__(self, ledger_client: LedgerClient, *, own: bool = False) -> None:
        self.ledger_client = ledger_client
        self._own = own

    @classmethod
    async def connect(cls, meta_addresses: Sequence[str], *,
                      clock: Clock | None = None) -> StreamClient:
        """A client with its own ledger client; every time the stream logic
        stamps or compares (ledger close times, cursors, retention, TTL) comes
        from ``clock`` (the system clock by default), via ``ledger_client.clock``."""
        return cls(await LedgerClient.connect(list(meta_addresses), clock=clock), own=True)

    async def close(self) -> None:
        if self._own:
            await self.ledger_client.close()

    async def __aenter__(self) -> StreamClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ----- administration ---------------------------------------------------------------

    async def create_stream(self, name: str, config: StreamConfig | None = None) -> StreamRecord:
        return await _admin.create_stream(self.ledger_client, name, config or StreamConfig())

    async def get_stream(self, name: str) -> StreamRecord:
        return await load_record(self.ledger_client.meta, name)

    async def update_stream(self, name: str, *, retention: RetentionPolicy | None = None,
                            offload: OffloadPolicy | None = None,
                            compaction_threshold_bytes: int | None = None) -> StreamRecord:
        """Change a live stream's retention and TTL, its automatic offload policy or
        its automatic compaction threshold (the nodes' trimmer applies them at its
        next round); the updated record."""
        return await _admin.update_stream(self.ledger_client, name, retention=retention,
                                          offload=offload,
                                          compaction_threshold_bytes=compaction_threshold_bytes)

    async def list_streams(self) -> list[str]:
        return await _admin.list_streams(self.ledger_client)

    async def stream_info(self, name: str) -> dict[str, Any]:
        return await _admin.stream_info(self.ledger_client, name)

    async def trim(self, name: str, *, retention: RetentionPolicy | None = None,
                   at_ms: int | None = None) -> _admin.TrimReport:
        return await _admin.trim_stream(self.ledger_client, name, retention=retention,
                                        at_ms=at_ms)

    async def offload(self, name: str, target: str, *, keep_bytes: int = 0,
                      deletion_lag_ms: int = _offload.DELETION_LAG_MS_DEFAULT,
                      partitions: Sequence[int] | None = None,
                      in_flight: int = 4) -> list[_offload.OffloadOutcome]:
        """Offload the stream's closed ledgers to Parquet files under ``target``
        (tiered storage, in this process; ``quorumlog.spark.offload`` spreads
        the same work over Spark tasks). Newest closed ledgers holding up to
        ``keep_bytes`` per partition stay on the bookies only; the bookies'
        copy of an offloaded ledger goes ``deletion_lag_ms`` after it (trim)."""
        target = _offload.normalize_target(target)
        record = await load_record(self.ledger_client.meta, name)
        todo = await _offload.offload_candidates(self.ledger_client, record,
                                                 keep_bytes=keep_bytes, partitions=partitions)
        slots = asyncio.Semaphore(max(1, in_flight))

        async def one(partition: int, info: Any) -> _offload.OffloadOutcome:
            async with slots:
                return await _offload.offload_ledger(self.ledger_client, record, partition,
                                                     info, target,
                                                     deletion_lag_ms=deletion_lag_ms)

        return list(await asyncio.gather(*(one(p, info) for p, info in todo)))

    async def sweep_offload_orphans(self, name: str, target: str, *,
                                    older_than_ms: int = _offload.ORPHAN_AGE_MS_DEFAULT
                                    ) -> list[str]:
        """Delete the stream's Parquet files under ``target`` that no offload
        record names, once older than ``older_than_ms`` (left by an offload run
        that died before its commit); their urls."""
        await load_record(self.ledger_client.meta, name)
        return await _offload.sweep_orphans(self.ledger_client.meta, name, target,
                                            self.ledger_client.clock.wall_ms(),
                                            older_than_ms=older_than_ms)

    async def offloaded(self, name: str) -> list[OffloadRecord]:
        """The stream's offloaded ledgers (their records), in ledger id order."""
        await load_record(self.ledger_client.meta, name)
        return await _offload.offloaded_records(self.ledger_client.meta, name)

    async def compact(self, name: str, *, partitions: Sequence[int] | None = None,
                      progress: Callable[[int], None] | None = None
                      ) -> list[_compaction.CompactionOutcome]:
        """Compact the stream (Pulsar's ``topics compact``): per partition, a compacted
        ledger with the latest message of every key up to the last readable entry
        (an empty value removes its key), read with ``reader(...,
        read_compacted=True)``. Partitions one after the other; ``progress(n)``
        after each batch of ``n`` messages read."""
        record = await load_record(self.ledger_client.meta, name)
        chosen = list(range(record.config.partitions)) if partitions is None else list(partitions)
        for partition in chosen:
            if not 0 <= partition < record.config.partitions:
                raise UsageError(f"stream {name!r} has no partition {partition}")
        return [await _compaction.compact_partition(self.ledger_client, record, partition,
                                                    progress=progress)
                for partition in chosen]

    async def compaction_status(self, name: str) -> dict[int, CompactionRecord]:
        """Each compacted partition's record: compacted ledger, horizon, counts."""
        record = await load_record(self.ledger_client.meta, name)
        return await _compaction.compaction_records(self.ledger_client, record)

    async def subscriptions(self, name: str) -> list[SubscriptionInfo]:
        """Every subscription of the stream: cursors, backlog in entries, connected."""
        return await _subscriptions.list_subscriptions(self.ledger_client, name)

    async def stats(self, name: str, *, interval_s: float = 1.0) -> dict[str, Any]:
        """Rates (in: entries, messages, bytes per second; out: acknowledged entries
        per second per subscription), backlog and storage per partition and in total,
        from two samples ``interval_s`` apart (Pulsar's ``topics stats``)."""
        return await _stats.stream_stats(self.ledger_client, name, interval_s=interval_s)

    async def unsubscribe(self, name: str, subscription: str, *, force: bool = False) -> None:
        """Delete a subscription's cursors; refused while a consumer holds it unless
        ``force`` (:class:`StreamInUseError`)."""
        await _subscriptions.unsubscribe(self.ledger_client, name, subscription, force=force)

    async def reset_cursor(self, name: str, subscription: str, to: StartSpec, *,
                           force: bool = False) -> list[SeqPosition]:
        """Start the subscription again at ``to`` ('earliest', 'latest', a publish time
        in ms); refused while a consumer holds it unless ``force``."""
        return await _subscriptions.reset_cursor(self.ledger_client, name, subscription, to,
                                                 force=force)

    async def delete_stream(self, name: str, *, force: bool = False,
                            progress: Callable[[int, int], None] | None = None) -> list[int]:
        """Delete the stream and its ledgers; refuses while producers or consumers
        are live on it (:class:`StreamInUseError`) unless ``force``.
        ``progress(done, total)`` follows the ledger deletes."""
        return await _admin.delete_stream(self.ledger_client, name, force=force,
                                          progress=progress)

    # ----- data -----------------------------------------------------------------------------

    async def producer(self, stream: str, *, steal: bool = False,
                       config: ProducerConfig | None = None) -> Producer:
        return await Producer.open(self.ledger_client, stream, steal=steal, config=config)

    async def subscribe(self, stream: str, subscription: str, *,
                        config: ConsumerConfig | None = None) -> Consumer:
        return await Consumer.open(self.ledger_client, stream, subscription, config=config)

    async def table_view(self, stream: str) -> TableView:
        """The stream as a key -> latest value map kept up to date (Pulsar's
        ``TableView``): caught up with everything readable when called."""
        record = await load_record(self.ledger_client.meta, stream)
        return await TableView.open(self.ledger_client, record)

    async def reader(self, stream: str, start: StartSpec | Mapping[int, StartSpec] = EARLIEST,
                     *, partitions: list[int] | None = None,
                     skip_data_loss: bool = False, read_compacted: bool = False) -> Reader:
        """A reader from ``start``. ``read_compacted`` (Pulsar's ``readCompacted``):
        up to each partition's compaction horizon, only the compacted view (the
        latest message of every key); after it, every message."""
        record = await load_record(self.ledger_client.meta, stream)
        return await Reader.open(self.ledger_client, record, start, partitions=partitions,
                                 skip_data_loss=skip_data_loss, read_compacted=read_compacted)


class BlockingStreamClient:
    """The same, blocking: a StreamClient on an event loop in its own thread.

    Producers, consumers and readers come back wrapped (``BlockingProducer``
    and friends) with the same methods, blocking.
    """

    def __init__(self, meta_addresses: Sequence[str]) -> None:
        self._loop = rpc.LoopThread(LOOP_THREAD_NAME)
        try:
            self._client: StreamClient = self.run(StreamClient.connect(meta_addresses))
        except BaseException:
            self._loop.close()
            raise

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the client's loop thread and wait for it."""
        return self._loop.call(coro)

    def close(self) -> None:
        if self._loop.closed:
            return
        try:
            self.run(self._client.close())
        finally:
            self._loop.close()

    def __enter__(self) -> BlockingStreamClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def async_client(self) -> StreamClient:
        return self._client

    def create_stream(self, name: str, config: StreamConfig | None = None) -> StreamRecord:
        return self.run(self._client.create_stream(name, config))

    def get_stream(self, name: str) -> StreamRecord:
        return self.run(self._client.get_stream(name))

    def update_stream(self, name: str, *, retention: RetentionPolicy | None = None,
                      offload: OffloadPolicy | None = None,
                      compaction_threshold_bytes: int | None = None) -> StreamRecord:
        return self.run(self._client.update_stream(
            name, retention=retention, offload=offload,
            compaction_threshold_bytes=compaction_threshold_bytes))

    def list_streams(self) -> list[str]:
        return self.run(self._client.list_streams())

    def stream_info(self, name: str) -> dict[str, Any]:
        return self.run(self._client.stream_info(name))

    def trim(self, name: str, *, retention: RetentionPolicy | None = None,
             at_ms: int | None = None) -> _admin.TrimReport:
        return self.run(self._client.trim(name, retention=retention, at_ms=at_ms))

    def offload(self, name: str, target: str, *, keep_bytes: int = 0,
                deletion_lag_ms: int = _offload.DELETION_LAG_MS_DEFAULT,
                partitions: Sequence[int] | None = None) -> list[_offload.OffloadOutcome]:
        return self.run(self._client.offload(name, target, keep_bytes=keep_bytes,
                                             deletion_lag_ms=deletion_lag_ms,
                                             partitions=partitions))

    def offloaded(self, name: str) -> list[OffloadRecord]:
        return self.run(self._client.offloaded(name))

    def sweep_offload_orphans(self, name: str, target: str, *,
                              older_than_ms: int = _offload.ORPHAN_AGE_MS_DEFAULT) -> list[str]:
        return self.run(self._client.sweep_offload_orphans(name, target,
                                                           older_than_ms=older_than_ms))

    def compact(self, name: str, *, partitions: Sequence[int] | None = None
                ) -> list[_compaction.CompactionOutcome]:
        return self.run(self._client.compact(name, partitions=partitions))

    def compaction_status(self, name: str) -> dict[int, CompactionRecord]:
        return self.run(self._client.compaction_status(name))

    def subscriptions(self, name: str) -> list[SubscriptionInfo]:
        return self.run(self._client.subscriptions(name))

    def stats(self, name: str, *, interval_s: float = 1.0) -> dict[str, Any]:
        return self.run(self._client.stats(name, interval_s=interval_s))

    def unsubscribe(self, name: str, subscription: str, *, force: bool = False) -> None:
        self.run(self._client.unsubscribe(name, subscription, force=force))

    def reset_cursor(self, name: str, subscription: str, to: StartSpec, *,
                     force: bool = False) -> list[SeqPosition]:
        return self.run(self._client.reset_cursor(name, subscription, to, force=force))

    def delete_stream(self, name: str, *, force: bool = False) -> list[int]:
        return self.run(self._client.delete_stream(name, force=force))

    def producer(self, stream: str, *, steal: bool = False,
                 config: ProducerConfig | None = None) -> BlockingProducer:
        return BlockingProducer(self, self.run(self._client.producer(stream, steal=steal,
                                                                     config=config)))

    def subscribe(self, stream: str, subscription: str, *,
                  config: ConsumerConfig | None = None) -> BlockingConsumer:
        return BlockingConsumer(self, self.run(self._client.subscribe(stream, subscription,
                                                                      config=config)))

    def table_view(self, stream: str) -> BlockingTableView:
        return BlockingTableView(self, self.run(self._client.table_view(stream)))

    def reader(self, stream: str, start: StartSpec | Mapping[int, StartSpec] = EARLIEST, *,
               partitions: list[int] | None = None,
               skip_data_loss: bool = False, read_compacted: bool = False) -> BlockingReader:
        return BlockingReader(self, self.run(self._client.reader(
            stream, start, partitions=partitions, skip_data_loss=skip_data_loss,
            read_compacted=read_compacted)))


class BlockingTableView:
    """A :class:`TableView` of a :class:`BlockingStreamClient` (its reads are of the
    map as the client's loop thread keeps it; listeners run on that thread)."""

    def __init__(self, owner: BlockingStreamClient, view: TableView) -> None:
        self._owner = owner
        self.view = view

    def get(self, key: bytes | str) -> bytes | None:
        return self.view.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self.view

    def __len__(self) -> int:
        return len(self.view)

    def snapshot(self) -> dict[bytes, bytes]:
        return self._owner.run(_snapshot(self.view))

    def refresh(self, *, timeout_s: float = 60.0) -> None:
        self._owner.run(self.view.refresh(timeout_s=timeout_s))

    def close(self) -> None:
        self._owner.run(self.view.close())

    def __enter__(self) -> BlockingTableView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _snapshot(view: TableView) -> dict[bytes, bytes]:
    return view.snapshot()  # on the loop: no change in the middle of the copy


class BlockingProducer:
    def __init__(self, owner: BlockingStreamClient, producer: Producer) -> None:
        self._owner = owner
        self.producer = producer

    def send(self, value: bytes, *, key: bytes | str | None = None,
             properties: Mapping[str, str] | None = None,
             partition: int | None = None) -> MessageId:
        return self._owner.run(self.producer.send(value, key=key, properties=properties,
                                                  partition=partition))

    def send_many(self, values: Sequence[bytes], *, key: bytes | str | None = None
                  ) -> list[MessageId]:
        """Send many messages pipelined (batched), wait for all."""
        async def go() -> list[MessageId]:
            futures = [await self.producer.send_async(v, key=key) for v in values]
            return list(await asyncio.gather(*futures))

        return self._owner.run(go())

    def flush(self) -> None:
        self._owner.run(self.producer.flush())

    def close(self) -> None:
        self._owner.run(self.producer.close())

    def __enter__(self) -> BlockingProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class BlockingConsumer:
    def __init__(self, owner: BlockingStreamClient, consumer: Consumer) -> None:
        self._owner = owner
        self.consumer = consumer

    def receive(self, wait_ms: int | None = None) -> Message | None:
        return self._owner.run(self.consumer.receive(wait_ms))

    @property
    def partitions(self) -> list[int]:
        """The partitions this consumer reads now (a failover consumer: its share)."""
        async def read() -> list[int]:  # on the loop thread, which changes them
            return self.consumer.partitions

        return self._owner.run(read())

    def ack(self, message: Message) -> None:
        self._owner.run(self.consumer.ack(message))

    def ack_cumulative(self, message: Message) -> None:
        self._owner.run(self.consumer.ack_cumulative(message))

    def seek(self, to: StartSpec) -> list[SeqPosition]:
        return self._owner.run(self.consumer.seek(to))

    def negative_ack(self, message: Message) -> None:
        async def nack() -> None:  # on the loop thread, which owns the consumer's state
            self.consumer.negative_ack(message)

        self._owner.run(nack())

    def flush_acks(self) -> None:
        self._owner.run(self.consumer.flush_acks())

    def close(self) -> None:
        self._owner.run(self.consumer.close())

    def __enter__(self) -> BlockingConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class BlockingReader:
    def __init__(self, owner: BlockingStreamClient, reader: Reader) -> None:
        self._owner = owner
        self.reader = reader

    def read_next(self, wait_ms: int = 500) -> Message | None:
        return self._owner.run(self.reader.read_next(wait_ms))

    def read_batch(self, wait_ms: int = 500) -> list[Message]:
        return self._owner.run(self.reader.read_batch(wait_ms))

    def close(self) -> None:
        self._owner.run(self.reader.close())

    def __enter__(self) -> BlockingReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
