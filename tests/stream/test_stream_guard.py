"""Bad input and operator mistakes on streams (issue 13), on a real local cluster.

One message that no ledger entry can hold, a cluster where fresh ledgers do not
help, idle readers on a busy meta service, destructive commands on a stream's
ledgers: each gets a clear error at the edge, and the rest of the cluster keeps
working.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from inprocess_cli import run_cli
from quorumlog import node as cluster
from quorumlog import rpc
from quorumlog.errors import UsageError
from quorumlog.ledger import LedgerClient, LedgerClientConfig
from quorumlog.stream import (
    ConsumerConfig,
    MessageTooLargeError,
    ProducerFencedError,
    RolloverPolicy,
    StreamClient,
    StreamConfig,
    StreamInUseError,
    SubscriptionBusyError,
    SubscriptionNotFoundError,
    WriterStuckError,
)
from quorumlog.stream._writer import RECOVERIES_WITHOUT_PROGRESS_MAX

MIB = 1024 * 1024
DEADLINE_S = 30.0
REFUSAL_S_MAX = 5.0  # an oversize send must fail at once, not after retries


@pytest.fixture(scope="module")
def meta(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    with cluster.running(tmp_path_factory.mktemp("guard") / "cluster", 3) as addresses:
        yield addresses


def config(partitions: int = 1) -> StreamConfig:
    return StreamConfig(partitions=partitions, writer_lease_ttl_ms=1000,
                        rollover=RolloverPolicy(max_entries=1000, min_time_ms=0))


async def ledger_count(client: StreamClient) -> int:
    return len(await client.ledger_client.list_ledgers(limit=100_000))


async def meta_revision(client: StreamClient) -> int:
    _, revision = await client.ledger_client.meta.range("/", prefix=True, limit=1)
    return int(revision)


async def values(client: StreamClient, stream: str, count: int) -> list[bytes]:
    out: list[bytes] = []
    async with await client.reader(stream, "earliest") as reader:
        while len(out) < count:
            message = await reader.read_next(DEADLINE_S * 1000)
            assert message is not None, f"read {len(out)} of {count} messages"
            out.append(message.value)
    return out


def test_oversize_message_is_refused_at_send_and_nothing_else_moves(meta: list[str]) -> None:
    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("big", config())
            producer = await client.producer("big")
            await producer.send(b"before")
            ledgers, revision = await ledger_count(client), await meta_revision(client)
            started = time.monotonic()
            with pytest.raises(MessageTooLargeError, match="entry_max_bytes"):
                await asyncio.wait_for(producer.send(b"x" * (6 * MIB)), REFUSAL_S_MAX)
            with pytest.raises(MessageTooLargeError):
                await asyncio.wait_for(producer.send_async(b"x" * (20 * MIB)), REFUSAL_S_MAX)
            assert time.monotonic() - started < REFUSAL_S_MAX
            # Nothing was sent: no new ledger, no ledger list change.
            assert await ledger_count(client) == ledgers
            assert await meta_revision(client) == revision
            # The producer still works, up to the limit; a small batched message and a
            # large one that fit alone but not together go in two entries.
            limit = client.ledger_client.config.entry_max_bytes
            await producer.send(b"y" * (4 * MIB))
            small = await producer.send_async(b"small")
            large = await producer.send_async(b"z" * (limit - 8 - 20))
            small_id, large_id = await asyncio.wait_for(asyncio.gather(small, large), DEADLINE_S)
            assert small_id.position.entry_id != large_id.position.entry_id
            await producer.send(b"after")
            await producer.close()
            got = await values(client, "big", 5)
            assert [len(v) for v in got] == [6, 4 * MIB, 5, limit - 28, 5]
            assert got[0] == b"before" and got[-1] == b"after"

    rpc.run(main())


def test_writer_stops_when_fresh_ledgers_do_not_help(meta: list[str]) -> None:
    """A ledger client that lets through entries the bookies refuse: the writer
    tries a bounded number of fresh ledgers, then fails with a clear error."""

    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("stuck", config())
            ledgers = await ledger_count(client)
            loose = await LedgerClient.connect(
                meta, config=LedgerClientConfig(entry_max_bytes=8 * MIB))
            async with StreamClient(loose, own=True) as loose_client:
                producer = await loose_client.producer("stuck")
                with pytest.raises(WriterStuckError, match="fresh ledgers"):
                    await asyncio.wait_for(producer.send(b"x" * (6 * MIB)), DEADLINE_S)
                await producer.close()
            # The first ledger, then one per recovery round before the writer stopped.
            created = await ledger_count(client) - ledgers
            assert created <= RECOVERIES_WITHOUT_PROGRESS_MAX + 1
            producer = await client.producer("stuck")
            await producer.send(b"fine")
            await producer.close()
            assert await values(client, "stuck", 1) == [b"fine"]

    rpc.run(main())


def test_cli_produce_of_oversize_message_fails_clearly(meta: list[str]) -> None:
    async def create() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("clibig", config())

    rpc.run(create())
    result = quorumlog("stream", "produce", "clibig", "--members", ",".join(meta),
                       stdin="x" * (6 * MIB) + "\n")
    assert result.returncode == 1
    assert "entry_max_bytes" in result.stderr and "Traceback" not in result.stderr
    result = quorumlog("stream", "produce", "clibig", "fine", "--members", ",".join(meta))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["entry"] == 0


def quorumlog(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """The real command line (its entry point turns errors into exit code 1)."""
    return subprocess.run([sys.executable, "-m", "quorumlog", *args], input=stdin,
                          capture_output=True, text=True, timeout=DEADLINE_S, check=False)


# ----- idle readers on a busy meta service ---------------------------------------------------

BUSY_PUTS = 50  # changes elsewhere before the compaction, so it passes the idle head


async def compact_meta_history(client: StreamClient) -> int:
    """Changes elsewhere, then compact meta's watch history up to now (what the
    history bound does by itself after ``history_events_max`` changes)."""
    meta = client.ledger_client.meta
    for i in range(BUSY_PUTS):
        await meta.put(f"/guard-busy/{i % 5}", b"%d" % i)
    revision = await meta_revision(client)
    await meta.compact(revision)
    return revision


def test_idle_reader_and_consumer_survive_compacted_watch_history(meta: list[str]) -> None:
    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("idle", config())
            producer = await client.producer("idle")
            await producer.send(b"first")
            await producer.close()
            reader = await client.reader("idle", "earliest")
            consumer = await client.subscribe(
                "idle", "sub", config=ConsumerConfig(initial_position="earliest"))
            first = await reader.read_next(DEADLINE_S * 1000)
            assert first is not None and first.value == b"first"
            received = await consumer.receive(DEADLINE_S * 1000)
            assert received is not None and received.value == b"first"
            await consumer.ack(received)
            await compact_meta_history(client)
            # Idle: nothing to read, and no error either.
            assert await reader.read_next(700) is None
            assert await consumer.receive(700) is None
            waiting = asyncio.ensure_future(reader.read_next(DEADLINE_S * 1000))
            consuming = asyncio.ensure_future(consumer.receive(DEADLINE_S * 1000))
            producer = await client.producer("idle")
            await producer.send(b"second")
            await producer.close()
            got = await asyncio.wait_for(waiting, DEADLINE_S)
            assert got is not None and got.value == b"second"
            got = await asyncio.wait_for(consuming, DEADLINE_S)
            assert got is not None and got.value == b"second"
            await consumer.close()
            await reader.close()

    rpc.run(main())


def test_cli_tail_of_idle_stream_survives_compacted_watch_history(meta: list[str]) -> None:
    async def setup() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("idletail", config())
            async with await client.producer("idletail") as producer:
                await producer.send(b"one")

    rpc.run(setup())
    members = ",".join(meta)
    tail = subprocess.Popen(
        [sys.executable, "-m", "quorumlog", "stream", "tail", "idletail", "--from", "earliest",
         "--count", "2", "--members", members],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert tail.stdout is not None
        assert json.loads(tail.stdout.readline())["value"] == "one"

        async def busy_then_produce() -> None:
            async with await StreamClient.connect(meta) as client:
                await compact_meta_history(client)
                async with await client.producer("idletail") as producer:
                    await producer.send(b"two")

        rpc.run(busy_then_produce())
        tail.wait(timeout=DEADLINE_S)  # a few lines: they fit in the pipe
        assert tail.stderr is not None
        # The reader readline used, not communicate(): it may hold buffered lines.
        out, err = tail.stdout.read(), tail.stderr.read()
        assert tail.returncode == 0, err
        assert [json.loads(line)["value"] for line in out.splitlines()] == ["two"]
    finally:
        if tail.poll() is None:
            tail.kill()
            tail.wait()


# ----- destructive commands on a stream's ledgers ----------------------------------------------


def test_deleting_a_stream_ledger_needs_force(meta: list[str]) -> None:
    async def setup() -> int:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("owned", config())
            async with await client.producer("owned") as producer:
                await producer.send(b"keep")
            ledger_id = (await client.stream_info("owned"))["partitions"][0]["ledgers"][0][
                "ledger_id"]
            with pytest.raises(UsageError, match="stream 'owned'"):
                await client.ledger_client.delete_ledger(ledger_id)
            assert await values(client, "owned", 1) == [b"keep"]
            return int(ledger_id)

    ledger_id = rpc.run(setup())
    members = ",".join(meta)
    result = run_cli("ledger", "delete", str(ledger_id), "--yes", "--meta", members)
    assert result.returncode == 1
    assert "stream 'owned'" in result.stderr and "--force" in result.stderr

    async def still_there() -> None:
        async with await StreamClient.connect(meta) as client:
            assert ledger_id in await client.ledger_client.list_ledgers(limit=100_000)
            assert await values(client, "owned", 1) == [b"keep"]

    rpc.run(still_there())
    result = run_cli("ledger", "delete", str(ledger_id), "--yes", "--meta", members,
                     "--force")
    assert result.returncode == 0, result.stderr

    async def gone() -> None:
        async with await StreamClient.connect(meta) as client:
            assert ledger_id not in await client.ledger_client.list_ledgers(limit=100_000)

    rpc.run(gone())


# ----- short-lived producers add ledgers only where they write ----------------------------


def test_cli_produce_adds_a_ledger_only_to_the_partition_it_writes(meta: list[str]) -> None:
    """Three CLI produce calls with one key on a 4-partition stream: three ledgers,
    each holding its message, all in the key's partition (was: 12, mostly empty)."""

    async def create() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("short", config(partitions=4))

    rpc.run(create())
    members = ",".join(meta)
    partitions = set()
    for i in range(3):
        result = run_cli("stream", "produce", "short", f"v{i}", "--key", "k",
                         "--members", members)
        assert result.returncode == 0, result.stderr
        partitions.add(json.loads(result.stdout)["partition"])
    assert len(partitions) == 1

    async def check() -> None:
        async with await StreamClient.connect(meta) as client:
            info = await client.stream_info("short")
            ledgers = [(p["partition"], ledger) for p in info["partitions"]
                       for ledger in p["ledgers"]]
            assert [p for p, _ in ledgers] == [*partitions] * 3, ledgers
            assert [ledger["entries"] for _, ledger in ledgers] == [1, 1, 1]
            # A producer that sends nothing leaves every ledger list as it was.
            async with await client.producer("short"):
                pass
            after = await client.stream_info("short")
            assert [len(p["ledgers"]) for p in after["partitions"]] == [
                len(p["ledgers"]) for p in info["partitions"]]
            assert sorted(await values(client, "short", 3)) == [b"v0", b"v1", b"v2"]

    rpc.run(check())


# ----- deleting a stream that is in use -------------------------------------------------------


def test_deleting_a_stream_in_use_needs_force(meta: list[str]) -> None:
    """A live producer or consumer makes `stream delete` refuse (Pulsar's
    `topics delete` without -f); once they close it goes through, and --force
    deletes at once."""
    members = ",".join(meta)

    async def in_use() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("busy", config(partitions=2))
            producer = await client.producer("busy")
            await producer.send(b"m", partition=1)
            consumer = await client.subscribe(
                "busy", "audit", config=ConsumerConfig(initial_position="earliest"))
            with pytest.raises(StreamInUseError, match=r"partitions \[0, 1\].*'audit'"):
                await client.delete_stream("busy")
            result = await asyncio.to_thread(
                quorumlog, "stream", "delete", "busy", "--yes", "--members", members)
            assert result.returncode == 1
            assert "--force" in result.stderr and "Traceback" not in result.stderr
            assert await values(client, "busy", 1) == [b"m"]  # nothing was deleted
            await consumer.close()
            await producer.close()
            assert await client.delete_stream("busy")
            assert "busy" not in await client.list_streams()

            await client.create_stream("busy2", config())
            producer = await client.producer("busy2")
            await producer.send(b"m")
            result = await asyncio.to_thread(
                quorumlog, "stream", "delete", "busy2", "--yes", "--force", "--members", members)
            assert result.returncode == 0, result.stderr
            assert "busy2" not in await client.list_streams()
            with pytest.raises(ProducerFencedError, match="was deleted"):
                await asyncio.wait_for(producer.send(b"after"), DEADLINE_S)
            await producer.close()

    rpc.run(in_use())


# ----- subscriptions: list with backlog, unsubscribe, reset ---------------------------------


def test_subscriptions_backlog_unsubscribe_and_reset(meta: list[str]) -> None:
    """Backlog counts entries after the mark-delete; unsubscribe and reset-cursor
    refuse while a consumer holds the subscription unless forced, and a forced
    one makes that consumer's next acknowledgement fail."""
    members = ",".join(meta)

    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("subs", config())
            async with await client.producer("subs") as producer:
                for i in range(10):
                    await producer.send(b"%d" % i)
            consumer = await client.subscribe("subs", "audit", config=ConsumerConfig(
                initial_position="earliest", ack_flush_ms=0))
            for _ in range(4):
                message = await consumer.receive(wait_ms=int(DEADLINE_S * 1000))
                assert message is not None
                await consumer.ack(message)
            await consumer.flush_acks()
            [sub] = await client.subscriptions("subs")
            assert (sub.name, sub.connected, sub.backlog_entries) == ("audit", True, 6)
            for action in (client.unsubscribe("subs", "audit"),
                           client.reset_cursor("subs", "audit", "earliest")):
                with pytest.raises(StreamInUseError, match="live consumer"):
                    await action
            result = await asyncio.to_thread(
                quorumlog, "stream", "reset-cursor", "subs", "-s", "audit", "--to", "earliest",
                "--members", members)
            assert result.returncode == 1 and "--force" in result.stderr, result.stderr
            # Forced: the consumer's next acknowledgement fails instead of undoing it.
            result = await asyncio.to_thread(
                quorumlog, "stream", "reset-cursor", "subs", "-s", "audit", "--to", "earliest",
                "--force", "--members", members)
            assert result.returncode == 0, result.stderr
            message = await consumer.receive(wait_ms=int(DEADLINE_S * 1000))
            assert message is not None
            with pytest.raises(SubscriptionBusyError):
                await consumer.ack(message)
                await consumer.flush_acks()
            await consumer.close()
            [sub] = await client.subscriptions("subs")
            assert (sub.connected, sub.backlog_entries) == (False, 10)
            again = await client.subscribe("subs", "audit")
            first = await again.receive(wait_ms=int(DEADLINE_S * 1000))
            assert first is not None and first.value == b"0"  # from the start again
            await again.close()
            await client.reset_cursor("subs", "audit", "latest")
            [sub] = await client.subscriptions("subs")
            assert sub.backlog_entries == 0
            result = await asyncio.to_thread(
                quorumlog, "stream", "unsubscribe", "subs", "-s", "audit", "--yes",
                "--members", members)
            assert result.returncode == 0, result.stderr
            assert await client.subscriptions("subs") == []
            with pytest.raises(SubscriptionNotFoundError):
                await client.unsubscribe("subs", "audit")

    rpc.run(main())
