"""Negative acknowledgements and acknowledgement timeouts against real node
processes: the message comes again after the delay with its redelivery count,
later messages are not held back, an acknowledged one never comes again, and
the cursor ends with nothing left; past ``dead_letter_max_redeliveries`` it
goes to the dead-letter stream instead and is acknowledged."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Iterator
from unittest import mock

import msgspec
import pytest

from quorumlog import node as cluster
from quorumlog import rpc
from quorumlog.errors import ConfigError, UsageError
from quorumlog.stream import (
    ORIGIN_MESSAGE_ID,
    REAL_TOPIC,
    Consumer,
    ConsumerConfig,
    Message,
    ProducerConfig,
    StreamClient,
    StreamConfig,
)

DEADLINE_S = 30.0


@pytest.fixture(scope="module")
def meta(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    with contextlib.ExitStack() as stack:
        with mock.patch.dict(os.environ, {"QUORUMLOG_TRIMMER__ENABLED": "false"}):
            addresses = stack.enter_context(
                cluster.running(tmp_path_factory.mktemp("redelivery") / "cluster", 3))
        yield addresses


async def produce(client: StreamClient, stream: str, count: int) -> None:
    await client.create_stream(stream, StreamConfig(writer_lease_ttl_ms=1000))
    producer = await client.producer(stream)
    for i in range(count):
        await producer.send(b"m%d" % i)
    await producer.close()


async def next_message(consumer: Consumer, wait_s: float = DEADLINE_S) -> Message:
    message = await consumer.receive(wait_ms=int(wait_s * 1000))
    assert message is not None, "nothing arrived"
    return message


def test_a_negatively_acknowledged_message_comes_again_after_the_delay(
        meta: list[str]) -> None:
    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            await produce(client, "nack", 5)
            consumer = await client.subscribe("nack", "s", config=ConsumerConfig(
                initial_position="earliest", ack_flush_ms=0,
                negative_ack_redelivery_delay_ms=400))
            first = [await next_message(consumer) for _ in range(3)]
            assert [m.value for m in first] == [b"m0", b"m1", b"m2"]
            assert all(m.redelivery_count == 0 for m in first)
            await consumer.ack(first[0])
            consumer.negative_ack(first[1])
            nacked_at = time.monotonic()
            with pytest.raises(UsageError, match="already acknowledged"):
                consumer.negative_ack(first[0])
            # Later messages are not held back by the one to come again.
            rest = [await next_message(consumer) for _ in range(2)]
            assert [m.value for m in rest] == [b"m3", b"m4"]
            again = await next_message(consumer)
            assert (again.value, again.redelivery_count) == (b"m1", 1)
            assert time.monotonic() - nacked_at >= 0.35
            assert again.position == first[1].position
            consumer.negative_ack(again)
            twice = await next_message(consumer)
            assert (twice.value, twice.redelivery_count) == (b"m1", 2)
            for message in (twice, first[2], *rest):
                await consumer.ack(message)
            # m1 was acknowledged after it came again: it does not come a third time.
            assert await consumer.receive(wait_ms=800) is None
            await consumer.close()
            [sub] = await client.subscriptions("nack")
            assert sub.backlog_entries == 0

            # Every message acknowledged, the nacked one too: a new consumer of the
            # subscription gets nothing.
            again_consumer = await client.subscribe("nack", "s", config=ConsumerConfig(
                ack_flush_ms=0))
            assert await again_consumer.receive(wait_ms=300) is None
            await again_consumer.close()

    rpc.run(main())


def test_messages_not_acknowledged_in_time_come_again(meta: list[str]) -> None:
    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            await produce(client, "timeout", 3)
            consumer = await client.subscribe("timeout", "s", config=ConsumerConfig(
                initial_position="earliest", ack_flush_ms=0, ack_timeout_ms=1000))
            delivered = [await next_message(consumer) for _ in range(3)]
            started = time.monotonic()
            await consumer.ack(delivered[0])
            again = [await next_message(consumer) for _ in range(2)]
            assert time.monotonic() - started >= 0.9
            assert [(m.value, m.redelivery_count) for m in again] == [(b"m1", 1), (b"m2", 1)]
            await consumer.ack(again[1])
            third = await next_message(consumer)  # m1 still not acknowledged: again
            assert (third.value, third.redelivery_count) == (b"m1", 2)
            await consumer.ack(third)
            assert await consumer.receive(wait_ms=1500) is None
            await consumer.close()
            [sub] = await client.subscriptions("timeout")
            assert sub.backlog_entries == 0

    rpc.run(main())


def test_bad_redelivery_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="ack_timeout_ms"):
        ConsumerConfig(ack_timeout_ms=10).validate()
    with pytest.raises(ConfigError, match="negative_ack_redelivery_delay_ms"):
        ConsumerConfig(negative_ack_redelivery_delay_ms=-1).validate()


def test_a_consumer_seeks_back_forward_and_by_publish_time(meta: list[str]) -> None:
    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("seek", StreamConfig(writer_lease_ttl_ms=1000))
            producer = await client.producer("seek", config=ProducerConfig(batching=False))
            sent = [await producer.send(b"m%d" % i) for i in range(10)]
            consumer = await client.subscribe("seek", "s", config=ConsumerConfig(
                initial_position="earliest", ack_flush_ms=0))
            first = [await next_message(consumer) for _ in range(10)]
            for message in first:
                await consumer.ack(message)
            assert await consumer.receive(wait_ms=300) is None

            await consumer.seek("earliest")  # everything again, acknowledged or not
            assert [(await next_message(consumer)).value for _ in range(10)] == \
                [m.value for m in first]
            middle = first[5]
            await consumer.seek(middle.publish_time_ms)
            again = await next_message(consumer)  # the first message at or after it
            expected = next(m for m in first if m.publish_time_ms >= middle.publish_time_ms)
            assert again.position == expected.position
            await consumer.seek(sent[7].position)
            assert (await next_message(consumer)).value == b"m7"
            await consumer.seek("latest")
            assert await consumer.receive(wait_ms=300) is None
            await producer.send(b"after")
            assert (await next_message(consumer)).value == b"after"
            with pytest.raises(UsageError, match="seek to"):
                await consumer.seek("yesterday")
            await consumer.close()
            # The seek was persisted: the subscription goes on after "after".
            reopened = await client.subscribe("seek", "s")
            assert (await next_message(reopened)).value == b"after"
            await reopened.close()
            await producer.close()

            workers = await client.subscribe("seek", "w", config=ConsumerConfig(
                subscription_type="failover", consumer_name="a"))
            with pytest.raises(UsageError, match="reset_cursor"):
                await workers.seek("earliest")
            await workers.close()

    rpc.run(main())


def dead_lettered(stream: str) -> float:
    """This process's quorumlog_stream_dead_lettered_messages_total for ``stream``."""
    value = rpc.metrics_registry.get_sample_value(
        "quorumlog_stream_dead_lettered_messages_total", {"stream": stream})
    return value or 0.0


async def read_all(client: StreamClient, stream: str, count: int) -> list[Message]:
    """The first ``count`` messages of ``stream`` (waiting for them, bounded)."""
    reader = await client.reader(stream, "earliest")
    got: list[Message] = []
    deadline = time.monotonic() + DEADLINE_S
    while len(got) < count and time.monotonic() < deadline:
        got.extend([m] if (m := await reader.read_next(200)) is not None else [])
    extra = await reader.read_next(300)
    await reader.close()
    assert len(got) == count and extra is None, (
        f"{stream}: {[m.value for m in got]} and then {extra}")
    return got


async def wait_all_acked(consumer: Consumer) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while any(consumer.unacked(p) for p in consumer.partitions):
        assert time.monotonic() < deadline, {p: consumer.unacked(p) for p in consumer.partitions}
        assert await consumer.receive(wait_ms=100) is None


def test_a_message_nacked_past_the_limit_goes_to_the_dead_letter_stream(
        meta: list[str]) -> None:
    """Pulsar's DeadLetterPolicy(maxRedeliverCount=2): the poison message is
    delivered 3 times, then lands in "<stream>-<subscription>-DLQ" with its key,
    value and properties plus REAL_TOPIC and ORIGIN_MESSAGE_ID, and is
    acknowledged on the subscription; the others flow past it."""
    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("dl", StreamConfig(writer_lease_ttl_ms=1000))
            producer = await client.producer("dl", config=ProducerConfig(batching=False))
            for i in range(5):
                await producer.send(b"m%d" % i, key=b"k%d" % i, properties={"n": str(i)})
            await producer.close()
            before = dead_lettered("dl")
            consumer = await client.subscribe("dl", "s", config=ConsumerConfig(
                initial_position="earliest", ack_flush_ms=0,
                negative_ack_redelivery_delay_ms=0, dead_letter_max_redeliveries=2))
            deliveries: list[tuple[bytes, int]] = []
            poison: Message | None = None
            while len(deliveries) < 7:  # 4 acked + the poison 3 times
                message = await next_message(consumer)
                deliveries.append((message.value, message.redelivery_count))
                if message.value == b"m2":
                    poison = poison or message
                    consumer.negative_ack(message)
                else:
                    await consumer.ack(message)
            await wait_all_acked(consumer)
            assert sorted(c for v, c in deliveries if v == b"m2") == [0, 1, 2]
            assert sorted(v for v, _ in deliveries if v != b"m2") == [b"m0", b"m1", b"m3", b"m4"]
            assert dead_lettered("dl") == before + 1
            await consumer.close()
            assert poison is not None
            [letter] = await read_all(client, "dl-s-DLQ", 1)
            assert (letter.value, letter.key) == (b"m2", b"k2")
            assert dict(letter.properties) == {
                "n": "2", REAL_TOPIC: "dl",
                ORIGIN_MESSAGE_ID: f"0:{poison.position.ledger_id}:"
                                   f"{poison.position.entry_id}:0"}
            # Acknowledged: a new consumer of the subscription gets nothing.
            again = await client.subscribe("dl", "s", config=ConsumerConfig(ack_flush_ms=0))
            assert await again.receive(wait_ms=500) is None
            await again.close()
            [sub] = [s for s in await client.subscriptions("dl") if s.name == "s"]
            assert sub.backlog_entries == 0

    rpc.run(main())


def test_ack_timeouts_past_the_limit_go_to_a_named_dead_letter_stream(
        meta: list[str]) -> None:
    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            await produce(client, "dlt", 3)
            consumer = await client.subscribe("dlt", "s", config=ConsumerConfig(
                initial_position="earliest", ack_flush_ms=0, ack_timeout_ms=1000,
                dead_letter_max_redeliveries=1, dead_letter_stream="poison"))
            seen: list[tuple[bytes, int]] = []
            deadline = time.monotonic() + DEADLINE_S
            while time.monotonic() < deadline and len(seen) < 4:  # m1 twice, never acked
                message = await next_message(consumer)
                seen.append((message.value, message.redelivery_count))
                if message.value != b"m1":
                    await consumer.ack(message)
            await wait_all_acked(consumer)
            await consumer.close()
            assert sorted(seen) == [(b"m0", 0), (b"m1", 0), (b"m1", 1), (b"m2", 0)]
            [letter] = await read_all(client, "poison", 1)
            assert letter.value == b"m1" and letter.properties[REAL_TOPIC] == "dlt"

    rpc.run(main())


def test_close_sends_the_dead_letters_queued_so_far(meta: list[str]) -> None:
    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            await produce(client, "dlc", 1)
            consumer = await client.subscribe("dlc", "s", config=ConsumerConfig(
                initial_position="earliest", ack_flush_ms=0,
                negative_ack_redelivery_delay_ms=0, dead_letter_max_redeliveries=1))
            for count in (0, 1):
                message = await next_message(consumer)
                assert message.redelivery_count == count
                consumer.negative_ack(message)
            assert await consumer.receive(wait_ms=1) is None  # queued for the dead letters
            await consumer.close()  # at once: the dead-letter stream does not exist yet
            [letter] = await read_all(client, "dlc-s-DLQ", 1)
            assert letter.value == b"m0"
            [sub] = await client.subscriptions("dlc")
            assert sub.backlog_entries == 0

    rpc.run(main())


def test_a_message_the_dead_letter_stream_refuses_is_delivered_again(meta: list[str]) -> None:
    """Properties at their 64 KiB limit leave no room for REAL_TOPIC and
    ORIGIN_MESSAGE_ID: the dead-letter stream refuses the message for good
    (MessageTooLargeError's kind, a UsageError). It must not be stuck
    unacknowledged nor lost: it comes again as an ordinary redelivery."""
    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("dlr", StreamConfig(writer_lease_ttl_ms=1000))
            producer = await client.producer("dlr", config=ProducerConfig(batching=False))
            await producer.send(b"m0", properties={"p": "x" * 65_530})  # 65,536 encoded
            await producer.close()
            consumer = await client.subscribe("dlr", "s", config=ConsumerConfig(
                initial_position="earliest", ack_flush_ms=0,
                negative_ack_redelivery_delay_ms=0, dead_letter_max_redeliveries=1))
            counts = []
            for _ in range(4):
                message = await next_message(consumer)
                counts.append(message.redelivery_count)
                consumer.negative_ack(message)
            assert counts == [0, 1, 2, 3]  # after 1: refused by the dead letters, then as usual
            message = await next_message(consumer)
            await consumer.ack(message)
            await wait_all_acked(consumer)
            await consumer.close()
            await read_all(client, "dlr-s-DLQ", 0)

    rpc.run(main())


def test_failover_consumers_share_one_dead_letter_stream(meta: list[str]) -> None:
    """Two failover consumers of a 2-partition stream nack everything: each
    message reaches the dead-letter stream once, though the two consumers take
    turns holding its writer lease."""
    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("dlf", StreamConfig(partitions=2,
                                                           writer_lease_ttl_ms=1000))
            producer = await client.producer("dlf", config=ProducerConfig(batching=False))
            for i in range(10):
                await producer.send(b"m%d" % i, partition=i % 2)
            await producer.close()
            config = ConsumerConfig(initial_position="earliest", ack_flush_ms=0,
                                    subscription_type="failover",
                                    negative_ack_redelivery_delay_ms=0,
                                    dead_letter_max_redeliveries=1)
            consumers = [await client.subscribe("dlf", "s", config=msgspec.structs.replace(
                config, consumer_name=name)) for name in ("a", "b")]
            deadline = time.monotonic() + DEADLINE_S
            while sorted(p for c in consumers for p in c.partitions) != [0, 1]:
                assert time.monotonic() < deadline, [c.partitions for c in consumers]
                for consumer in consumers:  # let the balancers settle
                    if (early := await consumer.receive(wait_ms=50)) is not None:
                        consumer.negative_ack(early)

            async def nack_all(consumer: Consumer) -> None:
                while (message := await consumer.receive(wait_ms=2000)) is not None:
                    consumer.negative_ack(message)

            await asyncio.gather(*(nack_all(c) for c in consumers))
            letters = await read_all(client, "dlf-s-DLQ", 10)
            assert sorted(m.value for m in letters) == sorted(b"m%d" % i for i in range(10))
            assert len({m.properties[ORIGIN_MESSAGE_ID] for m in letters}) == 10
            for consumer in consumers:
                await wait_all_acked(consumer)
                await consumer.close()

    rpc.run(main())


def test_bad_dead_letter_settings_are_refused(meta: list[str]) -> None:
    with pytest.raises(ConfigError, match="dead_letter_max_redeliveries"):
        ConsumerConfig(dead_letter_max_redeliveries=-1).validate()
    with pytest.raises(UsageError, match="dead-letter stream name 'no way'"):
        ConsumerConfig(dead_letter_stream="no way").validate()

    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("dlbad", StreamConfig(writer_lease_ttl_ms=1000))
            with pytest.raises(UsageError, match="cannot be 'dlbad' itself"):
                await client.subscribe("dlbad", "s", config=ConsumerConfig(
                    dead_letter_max_redeliveries=1, dead_letter_stream="dlbad"))
            # Refused before anything was held: the subscription is free.
            consumer = await client.subscribe("dlbad", "s", config=ConsumerConfig(
                lease_wait_ms=0))
            await consumer.close()

    rpc.run(main())
