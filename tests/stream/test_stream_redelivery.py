"""Negative acknowledgements and acknowledgement timeouts against real node
processes: the message comes again after the delay with its redelivery count,
later messages are not held back, an acknowledged one never comes again, and
the cursor ends with nothing left."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from unittest import mock

import pytest

from quorumlog import node as cluster
from quorumlog import rpc
from quorumlog.errors import ConfigError, UsageError
from quorumlog.stream import (
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
