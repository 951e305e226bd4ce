"""Load for the observability tests: a ledger, a stream with a subscription, a table.

Every component's counters move: ledger adds, reads and a recovery; stream
messages in and out, a rollover and a backlog; meta writes, reads, sessions
and watches (through the clients); table writes and reads.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from quorumlog.ledger import BlockingLedgerClient, LedgerClientConfig
from quorumlog.stream import (
    BlockingConsumer,
    BlockingProducer,
    BlockingStreamClient,
    ConsumerConfig,
    ProducerConfig,
    RolloverPolicy,
    StreamConfig,
)
from quorumlog.table import BlockingTableClient

LEDGER_ENTRIES = 20
ENTRY_BYTES = 100
STREAM_MESSAGES = 30
CONSUMED_MESSAGES = 10
TABLE_KEYS = 10
BACKLOG_INTERVAL_MS = 200
DEADLINE_S = 30.0


@dataclass(slots=True)
class OpenStream:
    """The client, producer and consumer the stream load leaves open."""

    client: BlockingStreamClient
    producer: BlockingProducer
    consumer: BlockingConsumer

    def close(self) -> None:
        self.consumer.close()
        self.producer.close()
        self.client.close()


def ledger_load(meta: list[str]) -> None:
    """Append, read back, and recover a second ledger left open.

    No explicit LAC: an idle writer sends its LAC after 20 ms, and recovery
    then finds nothing past it to rewrite, so the left-open ledger's entry
    would count once or twice depending on how long the recovering open took
    (a full run on a quiet machine saw 21 adds instead of 22)."""
    config = LedgerClientConfig(explicit_lac_interval_ms=0)
    with BlockingLedgerClient(meta, config=config) as ledgers:
        writer = ledgers.create_ledger(3, 2, 2)
        for _ in range(LEDGER_ENTRIES):
            writer.append(b"x" * ENTRY_BYTES)
        writer.close()
        reader = ledgers.open_ledger(writer.id, recovery=False)
        assert len(list(reader.read(0, LEDGER_ENTRIES - 1))) == LEDGER_ENTRIES
        left_open = ledgers.create_ledger(3, 2, 2)
        left_open.append(b"y")
        ledgers.open_ledger(left_open.id, recovery=True)  # fences and closes it


def stream_load(meta: list[str], name: str, subscription: str) -> OpenStream:
    """Produce, consume part, roll over; returns what it opened (the producer
    keeps computing the backlog) for the caller to close."""
    streams = BlockingStreamClient(meta)
    rollover = RolloverPolicy(max_entries=10, min_time_ms=0)
    streams.create_stream(name, StreamConfig(rollover=rollover))
    consumer = streams.subscribe(name, subscription,
                                 config=ConsumerConfig(initial_position="earliest"))
    producer = streams.producer(name, config=ProducerConfig(
        batching=False, backlog_interval_ms=BACKLOG_INTERVAL_MS))
    for i in range(STREAM_MESSAGES):
        producer.send(b"m%d" % i)
    received = 0
    deadline = time.monotonic() + DEADLINE_S
    while received < CONSUMED_MESSAGES and time.monotonic() < deadline:
        message = consumer.receive(wait_ms=500)
        if message is not None:
            consumer.ack(message)
            received += 1
    assert received == CONSUMED_MESSAGES
    consumer.flush_acks()
    return OpenStream(streams, producer, consumer)


def table_load(meta: list[str], name: str) -> None:
    with BlockingTableClient(meta) as tables:
        tables.create_table(name, partitions=2, replicas=3)
        for i in range(TABLE_KEYS):
            tables.set(name, b"h%d" % i, b"s", b"v")
        for i in range(TABLE_KEYS):
            assert tables.get(name, b"h%d" % i, b"s") == b"v"
