"""Streams on a real local cluster (3 node processes: meta + bookies on 127.0.0.1).

One cluster for the whole module; each test uses its own stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from quorumlog import node as cluster
from quorumlog import rpc
from quorumlog.clock import ManualClock
from quorumlog.errors import UsageError
from quorumlog.ledger import BlockingLedgerClient
from quorumlog.meta import PutOp
from quorumlog.proto import ledger_key
from quorumlog.stream import (
    BadPositionError,
    BlockingStreamClient,
    ConsumerConfig,
    DataLossError,
    JobEndedError,
    Position,
    ProducerConfig,
    ProducerFencedError,
    RetentionPolicy,
    RolloverPolicy,
    StreamClient,
    StreamConfig,
    StreamExistsError,
    StreamNotFoundError,
    WriterBusyError,
)
from quorumlog.stream import _admin as stream_admin
from quorumlog.stream._admin import PENDING_TTL_MS
from quorumlog.stream._entry import OutgoingMessage
from quorumlog.stream._errors import MessageFormatError
from quorumlog.stream._layout import (
    RUN_LEDGERS_MAX,
    TAIL_LEDGERS_KEEP,
    LedgerInfo,
    LedgerRun,
    LedgerStats,
    LedgerStatus,
    PartitionHead,
    archive_prefix,
    config_key,
    partition_key,
    pending_prefix,
    run_key,
    stream_prefix,
)
from quorumlog.stream._ledgers import LedgerList
from quorumlog.stream._link import (
    LINK_LEDGERS_MAX,
    JobLedgerWriter,
    abort_job_ledgers,
    link_job_ledgers,
)
from quorumlog.stream._reader import PartitionReader

CHILD = Path(__file__).with_name("stream_child.py")
DEADLINE_S = 30.0


@pytest.fixture(scope="module")
def meta(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    # These tests trim by hand and check what each trim deleted: no background
    # trimmer (tests/stream/test_stream_trimmer.py tests that one).
    with contextlib.ExitStack() as stack:
        with mock.patch.dict(os.environ, {"QUORUMLOG_TRIMMER__ENABLED": "false"}):
            addresses = stack.enter_context(
                cluster.running(tmp_path_factory.mktemp("streams") / "cluster", 3))
        yield addresses


def small(partitions: int = 1, entries: int = 5, **retention: Any) -> StreamConfig:
    return StreamConfig(
        partitions=partitions, writer_lease_ttl_ms=1000,
        rollover=RolloverPolicy(max_entries=entries, min_time_ms=0),
        retention=RetentionPolicy(**retention) if retention else RetentionPolicy(),
    )


async def read_all(client: StreamClient, stream: str, start: Any = "earliest",
                   expect: int | None = None, wait_ms: int = 1500) -> list[Any]:
    out = []
    async with await client.reader(stream, start) as reader:
        while expect is None or len(out) < expect:
            message = await reader.read_next(wait_ms)
            if message is None:
                break
            out.append(message)
    return out


def test_blocking_clients_run_on_one_loop_thread(meta: list[str]) -> None:
    """BlockingStreamClient and BlockingLedgerClient run on rpc.LoopThread:
    data goes through, a blocking call from the loop is refused, close twice is fine."""
    with BlockingStreamClient(meta) as client:
        client.create_stream("blocking", small())
        with client.producer("blocking") as producer:
            producer.send_many([b"a", b"b"])
        with client.reader("blocking") as reader:
            got = [reader.read_next(int(DEADLINE_S * 1000)) for _ in range(2)]
        assert [m.value for m in got if m is not None] == [b"a", b"b"]

        async def reenter() -> list[str]:
            return client.list_streams()

        with pytest.raises(rpc.LoopReentryError, match="list_streams"):
            client.run(reenter())
        assert "blocking" in client.list_streams()
    client.close()
    with BlockingLedgerClient(meta) as ledgers:
        writer = ledgers.create_ledger(3, 2, 2)
        writer.append(b"x")
        writer.close()
        assert [e.payload for e in ledgers.open_ledger(writer.id).read(0, 0)] == [b"x"]
    ledgers.close()


def test_rollover_order_positions_and_seek(meta: list[str]) -> None:
    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("roll", small(entries=5))
            with pytest.raises(StreamExistsError):
                await client.create_stream("roll", small())
            producer = await client.producer("roll")
            ids = [await producer.send(b"m%d" % i, key=b"k", properties={"i": str(i)})
                   for i in range(23)]
            # A batch of 10 in one entry.
            futures = [await producer.send_async(b"b%d" % i) for i in range(10)]
            batch_ids = await asyncio.gather(*futures)
            await producer.close()
            info = await client.stream_info("roll")
            ledgers = info["partitions"][0]["ledgers"]
            assert [lg.get("entries", 0) for lg in ledgers[:4]] == [5, 5, 5, 5]
            assert sum(lg.get("entries", 0) for lg in ledgers) == 24
            assert all(lg["status"] == "closed" for lg in ledgers)
            assert len({i.position.ledger_id for i in ids}) == 5  # 23 entries -> 5 ledgers
            assert {i.position.entry_id for i in batch_ids} == {batch_ids[0].position.entry_id}
            assert [i.position.batch_index for i in batch_ids] == list(range(10))

            got = await read_all(client, "roll", expect=33)
            assert [m.value for m in got] == [b"m%d" % i for i in range(23)] + [
                b"b%d" % i for i in range(10)]
            assert [m.position for m in got] == [i.position for i in [*ids, *batch_ids]]
            assert got[5].properties == {"i": "5"} and got[5].key == b"k"
            times = [m.publish_time_ms for m in got]
            assert times == sorted(times)

            # From a position (inclusive), across ledger boundaries, and mid-batch.
            from_mid = await read_all(client, "roll", ids[7].position, expect=26)
            assert [m.value for m in from_mid][:2] == [b"m7", b"m8"] and len(from_mid) == 26
            mid_batch = await read_all(client, "roll", batch_ids[4].position, expect=6)
            assert [m.value for m in mid_batch] == [b"b%d" % i for i in range(4, 10)]
            # From a publish time: every message published at or after it.
            cut = got[12].publish_time_ms
            by_time = await read_all(client, "roll", cut, expect=33)
            assert [m.value for m in by_time] == [m.value for m in got
                                                  if m.publish_time_ms >= cut]
            latest = await read_all(client, "roll", "latest", wait_ms=200)
            assert latest == []
            with pytest.raises(BadPositionError):
                await client.reader("roll", Position(999_999, 0))
            with pytest.raises(StreamNotFoundError):
                await client.producer("no-such-stream")

    rpc.run(main())


def test_tailing_reader_sees_new_messages_and_ledgers(meta: list[str]) -> None:
    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("tail", small(entries=3))
            reader = await client.reader("tail", "latest")
            producer = await client.producer("tail")
            received: list[bytes] = []

            async def consume() -> None:
                while len(received) < 10:
                    message = await reader.read_next(DEADLINE_S * 1000)
                    assert message is not None
                    received.append(message.value)

            task = asyncio.create_task(consume())
            for i in range(10):
                await producer.send(b"t%d" % i)
                await asyncio.sleep(0.01)
            await asyncio.wait_for(task, DEADLINE_S)
            assert received == [b"t%d" % i for i in range(10)]
            await producer.close()
            await reader.close()

    rpc.run(main())


async def _create(meta: list[str], name: str, config: StreamConfig) -> None:
    async with await StreamClient.connect(meta) as client:
        await client.create_stream(name, config)


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(CHILD), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True)


def _read_lines(proc: subprocess.Popen[str], count: int) -> list[dict[str, Any]]:
    assert proc.stdout is not None
    out = []
    deadline = time.monotonic() + DEADLINE_S
    while len(out) < count and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        out.append(json.loads(line))
    assert len(out) >= count, f"child printed {len(out)} lines, expected {count}"
    return out


def _kill(proc: subprocess.Popen[str]) -> list[dict[str, Any]]:
    """SIGKILL the child; return what it printed after the lines already read."""
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.stdout is not None
    # The same buffered reader _read_lines used (communicate() would read the
    # descriptor and miss what readline had buffered: acknowledged sends lost
    # from the count, and the check weaker than it says).
    rest = proc.stdout.read()
    proc.wait(timeout=DEADLINE_S)
    return [json.loads(line) for line in rest.splitlines() if line.strip()]


def test_takeover_after_writer_crash_loses_no_acked_message(meta: list[str]) -> None:
    rpc.run(_create(meta, "crash", small(partitions=2, entries=20)))
    child = _spawn("produce", ",".join(meta), "crash")
    acked = _read_lines(child, 60)
    acked += _kill(child)  # killed mid-stream: its last ledger per partition stays open

    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            before = await client.stream_info("crash")
            open_ledgers = [p["ledgers"][-1] for p in before["partitions"]]
            assert all(lg.get("status", "open") == "open" for lg in open_ledgers)
            # The new writer waits for the dead writer's lease to expire, then
            # fences and recovers its ledger.
            producer = await client.producer("crash",
                                             config=ProducerConfig(lease_wait_ms=10_000))
            after_ids = [await producer.send(b"new%d" % i, key=b"k%d" % i) for i in range(6)]
            await producer.close()
            info = await client.stream_info("crash")
            for part in info["partitions"]:
                assert part["writer_epoch"] >= 2
            messages = await read_all(client, "crash")
            by_value = {m.value.decode(): m for m in messages}
            for line in acked:  # every acknowledged send is there, at its position
                m = by_value[line["value"]]
                assert (m.partition, m.position.to_json()) == (
                    line["partition"], {k: line[k] for k in ("ledger", "entry", "batch")})
            for partition in (0, 1):  # order kept: v-numbers increase in each partition
                numbers = [int(m.value[1:]) for m in messages
                           if m.partition == partition and m.value.startswith(b"v")]
                assert numbers == sorted(numbers)
                tail = [m.value for m in messages if m.partition == partition][-3:]
                assert any(v.startswith(b"new") for v in tail) or partition not in {
                    i.partition for i in after_ids}

    rpc.run(main())


def test_takeover_fences_live_writer(meta: list[str]) -> None:
    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("fence", small(entries=1000))
            old = await client.producer("fence")
            with pytest.raises(WriterBusyError):
                await client.producer("fence", config=ProducerConfig(lease_wait_ms=0))
            acked: list[bytes] = []
            failures: list[BaseException] = []

            async def keep_sending() -> None:
                i = 0
                while not failures and i < 5000:
                    try:
                        await old.send(b"old%d" % i)
                        acked.append(b"old%d" % i)
                    except ProducerFencedError as exc:
                        failures.append(exc)
                    i += 1

            task = asyncio.create_task(keep_sending())
            while len(acked) < 20:
                await asyncio.sleep(0.01)
            new = await client.producer("fence", steal=True)
            await new.send(b"new0")
            await asyncio.wait_for(task, DEADLINE_S)
            assert failures, "the old writer must be fenced"
            with pytest.raises(ProducerFencedError):
                await old.send(b"after")
            await new.send(b"new1")
            await new.close()
            await old.close()
            values = [m.value for m in await read_all(client, "fence")]
            assert values[: len(acked)] == acked  # every acked old message, in order
            assert values[-2:] == [b"new0", b"new1"]
            assert len(values) == len(acked) + 2  # nothing unacked slipped in twice

    rpc.run(main())


def test_consumer_resumes_after_crash(meta: list[str]) -> None:
    async def fill() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("subs", small(partitions=2, entries=4))
            producer = await client.producer("subs")
            for i in range(40):
                await producer.send(b"%d" % i, key=b"%d" % i)
            await producer.close()

    rpc.run(fill())
    child = _spawn("consume", ",".join(meta), "subs", "s1")
    lines = _read_lines(child, 1)
    assert lines[0] == {"ready": True}
    lines = _read_lines(child, 50)  # "acking" + "acked" per message
    lines += _kill(child)
    acked = {line["acked"] for line in lines if "acked" in line}
    assert acked
    # An ack the child was making when it was killed may or may not have been
    # persisted: that message may come again or not, but nothing else may.
    in_doubt = {line["acking"] for line in lines if "acking" in line} - acked
    assert len(in_doubt) <= 1

    async def resume() -> None:
        async with await StreamClient.connect(meta) as client:
            consumer = await client.subscribe("subs", "s1", config=ConsumerConfig(
                lease_wait_ms=10_000, ack_flush_ms=0))
            got = []
            # Until every message not acked before the crash came, then quiet
            # for 1.5 s (the one in doubt may come too). A quiet spell before
            # that (a partition's next ledger opening on a loaded machine) is
            # not the end, only the deadline is.
            owed = {str(i) for i in range(40)} - acked - in_doubt
            deadline = time.monotonic() + DEADLINE_S
            while True:
                message = await consumer.receive(wait_ms=1500)
                if message is None:
                    if owed <= {m.value.decode() for m in got} \
                            or time.monotonic() > deadline:
                        break
                    continue
                got.append(message)
                await consumer.ack(message)
            await consumer.close()
            values = {m.value.decode() for m in got}
            assert values.isdisjoint(acked)  # acknowledged before the crash: never again
            assert values | acked | in_doubt == {str(i) for i in range(40)}  # nothing lost
            for partition in (0, 1):
                keys = [m.seq_position.key for m in got if m.partition == partition]
                assert keys == sorted(keys)
            # Everything acked now: a third consumer gets nothing.
            again = await client.subscribe("subs", "s1")
            assert await again.receive(wait_ms=300) is None
            await again.close()

    rpc.run(resume())


def test_retention_by_age_follows_the_injected_clock(meta: list[str]) -> None:
    """Close stamps and the trimmer's "now" come from the client's clock: a
    ManualClock ages a stream by 7 days in no time (before, only trim's
    ``at_ms`` could move "now", and close stamps were always the wall clock)."""
    clock = ManualClock(wall_ms=1_700_000_000_000)
    week_ms = RetentionPolicy().time_ms

    async def main() -> None:
        async with await StreamClient.connect(meta, clock=clock) as client:
            await client.create_stream("aged", small(entries=2))  # default: keep 7 days
            producer = await client.producer("aged")
            for i in range(6):  # 3 ledgers of 2 entries (close rolls no empty one over)
                await producer.send(b"%d" % i)
            await producer.close()
            ledgers = (await client.stream_info("aged"))["partitions"][0]["ledgers"]
            assert [lg.get("entries", 0) for lg in ledgers] == [2, 2, 2]
            created = await client.ledger_client.ledger_metadata(ledgers[0]["ledger_id"])
            assert created.created_ms == clock.wall_ms()  # the ledger protocol's stamp too
            assert (await client.trim("aged")).deleted_ledgers == []
            clock.advance(ms=week_ms - 1)
            assert (await client.trim("aged")).deleted_ledgers == []
            clock.advance(ms=1)
            report = await client.trim("aged")
            # Every ledger but the last (it anchors "latest") is a week old now.
            assert report.deleted_ledgers == [lg["ledger_id"] for lg in ledgers[:2]]
            for ledger in ledgers[:2]:
                assert await client.ledger_client.meta.get(ledger_key(ledger["ledger_id"])) is None

    asyncio.run(main())


def test_retention_deletes_exactly_consumed_ledgers(meta: list[str]) -> None:
    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("ret", small(entries=4, time_ms=0))
            slow = await client.subscribe("ret", "slow", config=ConsumerConfig(
                initial_position="earliest", ack_flush_ms=0))
            producer = await client.producer("ret")
            for i in range(20):  # 5 closed ledgers of 4 entries, then an open one
                await producer.send(b"%d" % i)
            ledger_ids = [lg["ledger_id"] for lg in
                          (await client.stream_info("ret"))["partitions"][0]["ledgers"]]
            # The slow cursor acknowledges 0..9: ledgers 0 and 1 fully, ledger 2 half.
            for _ in range(10):
                message = await slow.receive(wait_ms=5000)
                assert message is not None
                await slow.ack(message)
            report = await client.trim("ret")
            assert report.deleted_ledgers == ledger_ids[:2]
            for ledger_id in ledger_ids[:2]:
                assert await client.ledger_client.meta.get(ledger_key(ledger_id)) is None
            for ledger_id in ledger_ids[2:]:
                assert await client.ledger_client.meta.get(ledger_key(ledger_id)) is not None
            assert (await client.trim("ret")).deleted_ledgers == []  # the cursor needs the rest
            # A new reader from "earliest" starts at the first ledger kept.
            first = await read_all(client, "ret", expect=1)
            assert first[0].value == b"8"
            # A reader positioned in a trimmed ledger: data loss is an error...
            record = await client.get_stream("ret")
            reader = PartitionReader(client.ledger_client, record, 0,
                                     _seq_pos(0, 1, ledger_ids[0]))
            with pytest.raises(DataLossError):
                await reader.next_batch(100)
            # ... unless the reader skips it.
            skipping = PartitionReader(client.ledger_client, record, 0,
                                       _seq_pos(0, 1, ledger_ids[0]), skip_data_loss=True)
            assert (await skipping.next_batch(100))[0].value == b"8"
            # TTL acknowledges old messages on the slow cursor; then retention frees more.
            await slow.close()
            time.sleep(0.05)
            ttl = RetentionPolicy(time_ms=0, message_ttl_ms=1)
            report = await client.trim("ret", retention=ttl)
            assert report.expired_cursors == 1
            assert report.deleted_ledgers == ledger_ids[2:4]  # the open and last ones stay
            await producer.close()

    rpc.run(main())


def _seq_pos(seq: int, entry: int, ledger_id: int) -> Any:
    from quorumlog.stream import SeqPosition

    return SeqPosition(seq, entry, 0, ledger_id)


def test_linked_job_ledgers_are_atomic_and_live_writer_continues(meta: list[str]) -> None:
    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("link", small(partitions=2, entries=1000))
            record = await client.get_stream("link")
            producer = await client.producer("link")
            for i in range(5):
                await producer.send(b"before%d" % i, partition=0)
            writers = {}
            for partition in (0, 1):
                w = JobLedgerWriter(client.ledger_client, record, partition, "job1")
                await w.open()
                for i in range(30):
                    await w.add(OutgoingMessage(b"job%d-%d" % (partition, i),
                                                publish_time_ms=1))
                writers[partition] = w
            stats = {p: [await w.close()] for p, w in writers.items()}
            # Not linked yet: invisible.
            assert all(not m.value.startswith(b"job")
                       for m in await read_all(client, "link", wait_ms=300))
            assert await link_job_ledgers(client.ledger_client, record, "job1", stats)
            # The live producer was fenced by the link and goes on in a new ledger.
            for i in range(5):
                await producer.send(b"after%d" % i, partition=0)
            await producer.close()
            values = [m.value for m in await read_all(client, "link") if m.partition == 0]
            assert values == ([b"before%d" % i for i in range(5)]
                              + [b"job0-%d" % i for i in range(30)]
                              + [b"after%d" % i for i in range(5)])
            # A streaming write's batch id makes a second link of the same batch a no-op.
            w = JobLedgerWriter(client.ledger_client, record, 1, "job2")
            await w.open()
            await w.add(OutgoingMessage(b"once"))
            once = {1: [await w.close()]}
            assert await link_job_ledgers(client.ledger_client, record, "job2", once,
                                          sink=("q", 7))
            w = JobLedgerWriter(client.ledger_client, record, 1, "job3")
            await w.open()
            await w.add(OutgoingMessage(b"once"))
            dup = {1: [await w.close()]}
            assert not await link_job_ledgers(client.ledger_client, record, "job3", dup,
                                              sink=("q", 7))
            ones = [m for m in await read_all(client, "link") if m.value == b"once"]
            assert len(ones) == 1
            assert await client.ledger_client.meta.get(ledger_key(dup[1][0].ledger_id)) is None
            # Abort deletes the job's ledgers, linked nowhere.
            w = JobLedgerWriter(client.ledger_client, record, 0, "job4")
            await w.open()
            await w.add(OutgoingMessage(b"never"))
            aborted = {0: [await w.close()]}
            assert await abort_job_ledgers(client.ledger_client, record, "job4", aborted) == [
                aborted[0][0].ledger_id]
            assert all(m.value != b"never" for m in await read_all(client, "link"))
            # A task attempt still running after its job ended (committed or aborted)
            # cannot mark a ledger pending: it deletes its own ledger and fails.
            before = set(await client.ledger_client.list_ledgers())
            for ended in ("job1", "job4"):
                late = JobLedgerWriter(client.ledger_client, record, 0, ended)
                with pytest.raises(JobEndedError, match="already ended"):
                    await late.open()
            assert set(await client.ledger_client.list_ledgers()) == before
            assert await client.ledger_client.meta.list_keys(pending_prefix("link")) == []
            # Aborting a committed job deletes nothing.
            assert await abort_job_ledgers(client.ledger_client, record, "job1", stats) == []
            values_after = [m.value for m in await read_all(client, "link") if m.partition == 0]
            assert values_after == values

    rpc.run(main())


def test_orphan_collection_ends_a_job_that_outlived_it(meta: list[str]) -> None:
    """A write job still running when its pending ledgers become orphans (older
    than PENDING_TTL_MS; the background trimmer collects them unasked): trim
    ends the job before deleting them, so its commit fails instead of linking
    deleted ledgers into the stream."""
    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("longjob", small())
            record = await client.get_stream("longjob")
            writer = JobLedgerWriter(client.ledger_client, record, 0, "slowjob")
            await writer.open()
            await writer.add(OutgoingMessage(b"late"))
            stats = {0: [await writer.close()]}
            ledger_id = stats[0][0].ledger_id
            later = client.ledger_client.clock.wall_ms() + PENDING_TTL_MS + 1
            report = await client.trim("longjob", at_ms=later)
            assert report.orphans_deleted == [ledger_id]
            assert await client.ledger_client.meta.get(ledger_key(ledger_id)) is None
            with pytest.raises(UsageError, match="already ended"):
                await link_job_ledgers(client.ledger_client, record, "slowjob", stats)
            head = (await client.stream_info("longjob"))["partitions"][0]
            assert head["ledgers"] == [] and head["entries"] == 0
            assert await read_all(client, "longjob", wait_ms=300) == []
            # A late task attempt of the ended job cannot mark a ledger pending.
            with pytest.raises(JobEndedError, match="already ended"):
                await JobLedgerWriter(client.ledger_client, record, 0, "slowjob").open()

    rpc.run(main())


def test_delete_stream_removes_ledgers(meta: list[str]) -> None:
    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("gone", small(entries=2))
            producer = await client.producer("gone")
            for i in range(5):
                await producer.send(b"%d" % i)
            await producer.close()
            seen: list[tuple[int, int]] = []
            deleted = await client.delete_stream(
                "gone", progress=lambda done, total: seen.append((done, total)))
            assert len(deleted) >= 3
            # The progress callback counts every listed ledger up to its total.
            total = seen[0][1]
            assert seen[0] == (0, total) and seen[-1] == (total, total) and total >= 3
            assert [done for done, _ in seen] == list(range(total + 1))
            for ledger_id in deleted:
                assert await client.ledger_client.meta.get(ledger_key(ledger_id)) is None
            assert "gone" not in await client.list_streams()
            with pytest.raises(StreamNotFoundError):
                await client.reader("gone")

    rpc.run(main())


def test_cli_create_produce_tail_info_trim_delete(meta: list[str]) -> None:
    from typer.testing import CliRunner

    from quorumlog.cli import app

    runner = CliRunner()
    members = ["--members", ",".join(meta)]

    def cli(*args: str, stdin: str | None = None) -> str:
        result = runner.invoke(app, [*args, *members], input=stdin)
        assert result.exit_code == 0, result.output
        return result.output

    cli("stream", "create", "clistream", "--partitions", "2", "--rollover-entries", "2",
        "--rollover-min-ms", "0")
    assert "clistream" in json.loads(cli("stream", "list", "--json"))
    ids = [json.loads(line) for line in cli("stream", "produce", "clistream", "--key", "k",
                                            "--property", "a=b", stdin="one\ntwo\nthree\n"
                                            ).splitlines()]
    assert [i["partition"] for i in ids] == [ids[0]["partition"]] * 3  # one key, one partition
    lines = cli("stream", "tail", "clistream", "--from", "earliest", "--count", "3").splitlines()
    assert [json.loads(line)["value"] for line in lines] == ["one", "two", "three"]
    assert json.loads(lines[0])["properties"] == {"a": "b"}
    info = json.loads(cli("stream", "info", "clistream", "--json"))
    assert info["config"]["partitions"] == 2
    assert "ledgers" in cli("stream", "info", "clistream")
    consumed = cli("stream", "consume", "clistream", "-s", "sub", "--initial", "earliest",
                   "--count", "3").splitlines()
    assert len(consumed) == 3
    assert "deleted ledgers" in cli("stream", "trim", "clistream", "--retention-time-ms", "0")
    cli("stream", "delete", "clistream", "--yes")
    result = runner.invoke(app, ["stream", "info", "nope", *members])
    assert result.exit_code != 0


# ----- partitions of many ledgers -------------------------------------------------------------

SYNTHETIC_LEDGER_BASE = 10**12  # ids far above the cluster's real ledgers (these have no data)
SYNTHETIC_ENTRIES = 10
SYNTHETIC_BYTES = 1000
LINK_BATCH_LEDGERS = 1500
SYNTHETIC_RUNS_PER_TXN = 4  # ~1.5 MiB of runs per meta transaction while synthesizing
ROLLOVER_KEYS_MAX = 2  # the head, and now and then one archive run
ROLLOVER_BYTES_MAX = 64 * 1024
WATCH_WAIT_MS = 10_000


def _synthetic_stats(first: int, count: int, base_ms: int) -> list[LedgerStats]:
    return [LedgerStats(ledger_id=SYNTHETIC_LEDGER_BASE + i, entries=SYNTHETIC_ENTRIES,
                        size_bytes=SYNTHETIC_BYTES, first_publish_ms=base_ms + i,
                        last_publish_ms=base_ms + i, last_entry_messages=1, created_ms=base_ms)
            for i in range(first, first + count)]


async def _link_synthetic(client: StreamClient, name: str, count: int, base_ms: int) -> None:
    """``count`` closed ledgers linked into partition 0 the way a Spark commit
    links them (they hold no entries: nothing here reads them)."""
    record = await client.get_stream(name)
    meta = client.ledger_client.meta
    for first in range(0, count, LINK_BATCH_LEDGERS):
        stats = _synthetic_stats(first, min(LINK_BATCH_LEDGERS, count - first), base_ms)
        _, revision = await meta.range(config_key(name))
        assert await link_job_ledgers(client.ledger_client, record, f"synthetic-{first}",
                                      {0: stats})
        # The commit wrote one key of the list (the head) for 1,500 ledgers; the
        # run that took them over the tail came in the tidy transaction after it.
        writes = await _list_writes_since(client, name, revision)
        assert len(writes[min(writes)]) == 1, writes


async def _write_synthetic(client: StreamClient, name: str, count: int, base_ms: int) -> None:
    """``count`` closed ledgers written straight into meta: archive runs in
    bounded transactions, then the head that makes them part of the list."""
    meta = client.ledger_client.meta
    infos = [LedgerInfo(seq=i, ledger_id=SYNTHETIC_LEDGER_BASE + i, status=LedgerStatus.CLOSED,
                        entries=SYNTHETIC_ENTRIES, size_bytes=SYNTHETIC_BYTES,
                        first_publish_ms=base_ms + i, last_publish_ms=base_ms + i,
                        last_entry_messages=1, created_ms=base_ms, closed_ms=base_ms + i,
                        entries_before=SYNTHETIC_ENTRIES * i, publish_max_ms=base_ms + i)
             for i in range(count)]
    archived = infos[:-TAIL_LEDGERS_KEEP]
    runs = [LedgerRun(ledgers=tuple(archived[i:i + RUN_LEDGERS_MAX]))
            for i in range(0, len(archived), RUN_LEDGERS_MAX)]
    for i in range(0, len(runs), SYNTHETIC_RUNS_PER_TXN):
        await meta.txn(success=[PutOp(key=run_key(name, 0, run.last_seq), value=run.encode())
                                for run in runs[i:i + SYNTHETIC_RUNS_PER_TXN]])
    head = PartitionHead(tail=tuple(infos[-TAIL_LEDGERS_KEEP:]), next_seq=count,
                         entries_total=SYNTHETIC_ENTRIES * count,
                         kept_bytes=SYNTHETIC_BYTES * count, publish_max_ms=base_ms + count - 1,
                         ledger_id_max=SYNTHETIC_LEDGER_BASE + count - 1)
    kv = await meta.get(partition_key(name, 0))
    assert kv is not None
    assert await meta.cas(partition_key(name, 0), kv.version, head.encode())


async def _list_writes_since(client: StreamClient, name: str, revision: int,
                             transactions: int = 1) -> dict[int, list[tuple[str, int]]]:
    """Keys of partition 0's list (head and runs) written after ``revision``,
    per transaction (revision): [(key, value bytes)], once at least
    ``transactions`` transactions are seen.

    A watch may be served by a follower that has not applied the last writes
    yet; it waits until it has one, and a transaction is applied whole, so
    watching on from the last revision seen finds each one complete."""
    meta = client.ledger_client.meta
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WATCH_WAIT_MS / 1000
    out: dict[int, list[tuple[str, int]]] = {}
    start = revision + 1
    while len(out) < transactions:
        remaining_ms = int((deadline - loop.time()) * 1000)
        assert remaining_ms > 0, f"saw {len(out)} of {transactions} transactions: {out}"
        events, _ = await meta.watch_once(stream_prefix(name), prefix=True,
                                          start_revision=start, wait_ms=remaining_ms)
        for event in events:
            key = event.kv.key
            start = max(start, event.kv.mod_revision + 1)
            if key == partition_key(name, 0) or key.startswith(archive_prefix(name, 0)):
                out.setdefault(event.kv.mod_revision, []).append((key, len(event.kv.value)))
    return out


async def _exercise_large_partition(client: StreamClient, name: str, count: int,
                                    base_ms: int) -> dict[str, float]:
    """Open, roll over, seek and trim a partition of ``count`` (synthetic)
    ledgers; check that each step reads and writes a bounded part of the
    list; return the times taken in ms."""
    times: dict[str, float] = {}
    meta = client.ledger_client.meta
    info = (await client.stream_info(name))["partitions"][0]
    assert info["ledger_count"] == count and info["entries"] == SYNTHETIC_ENTRIES * count
    assert len(info["ledgers"]) == 1000 and info["ledgers"][-1]["seq"] == count - 1

    started = time.perf_counter()
    producer = await client.producer(name)
    times["producer_open_ms"] = (time.perf_counter() - started) * 1000
    first_real = await producer.send(b"first")
    writer = producer.writers[0]
    _, revision = await meta.range(config_key(name))
    started = time.perf_counter()
    await writer.roll_over()
    times["rollover_ms"] = (time.perf_counter() - started) * 1000
    assert writer.rollovers == 1
    writes = await _list_writes_since(client, name, revision)
    assert len(writes) == 1, writes  # one transaction
    written = writes[min(writes)]
    assert len(written) <= ROLLOVER_KEYS_MAX and sum(b for _, b in written) <= ROLLOVER_BYTES_MAX
    second_real = await producer.send(b"second")
    await producer.close()

    async def open_reader(label: str, start: Any) -> Any:
        began = time.perf_counter()
        reader = await client.reader(name, start)
        times[label] = (time.perf_counter() - began) * 1000
        [part] = reader.partition_readers
        await reader.close()
        return part.next_position

    assert await open_reader("open_earliest_ms", "earliest") == (0, 0)
    middle = count // 2 + 7
    in_archive = Position(SYNTHETIC_LEDGER_BASE + middle, 3)
    assert await open_reader("open_at_position_ms", in_archive) == (middle, 3)
    assert await open_reader("open_latest_ms", "latest") == (count + 1, 1)
    ledgers = LedgerList(meta, name, 0)
    began = time.perf_counter()
    at_time = await ledgers.first_at_publish(base_ms + middle)
    times["seek_publish_time_ms"] = (time.perf_counter() - began) * 1000
    assert at_time is not None and at_time.seq == middle
    # Reading the real messages after the synthetic ledgers, from a position.
    got = await read_all(client, name, first_real.position, expect=2)
    assert [m.value for m in got] == [b"first", b"second"]
    assert [m.position for m in got] == [first_real.position, second_real.position]

    # Trim the first 300 ledgers (by size): one bounded transaction.
    kept = (await client.stream_info(name))["partitions"][0]["size_bytes"]
    _, revision = await meta.range(config_key(name))
    began = time.perf_counter()
    report = await client.trim(name, retention=RetentionPolicy(
        time_ms=-1, size_bytes=kept - 300 * SYNTHETIC_BYTES))
    times["trim_300_ms"] = (time.perf_counter() - began) * 1000
    assert report.deleted_ledgers == [SYNTHETIC_LEDGER_BASE + i for i in range(300)]
    writes = await _list_writes_since(client, name, revision)
    # One transaction: the head and the first run (rewritten without its first 300).
    assert len(writes) == 1 and len(writes[min(writes)]) <= 3, writes
    assert (await client.stream_info(name))["partitions"][0]["first_seq"] == 300
    # A trimmed ledger's position: the real ledgers after the synthetic ones
    # have smaller ids, so the search by id cannot be trusted and the miss
    # walks the whole archive.
    assert not (await LedgerList(meta, name, 0).refresh()).ids_ascending
    began = time.perf_counter()
    with pytest.raises(BadPositionError):
        await client.reader(name, Position(SYNTHETIC_LEDGER_BASE + 5, 0))
    times["open_trimmed_position_ms"] = (time.perf_counter() - began) * 1000
    assert await open_reader("open_earliest_after_trim_ms", "earliest") == (300, 0)
    return times


def test_partition_beyond_one_meta_value(meta: list[str]) -> None:
    """10,500 ledgers in one partition, linked by commits of 1,500 like Spark's.
    The old layout kept the list in one meta value and failed at about 6,000
    (value over meta's 1 MiB limit); each step here reads and writes a
    bounded part of the list."""
    async def main() -> dict[str, float]:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("large", small(entries=1000))
            base_ms = int(time.time() * 1000) - 10**8
            began = time.perf_counter()
            await _link_synthetic(client, "large", 10_500, base_ms)
            build_ms = (time.perf_counter() - began) * 1000
            # A commit past one transaction's bounds fails before writing anything
            # (the ledger count checked next is unchanged).
            record = await client.get_stream("large")
            too_many = _synthetic_stats(20_000, LINK_LEDGERS_MAX + 1, base_ms)
            with pytest.raises(UsageError, match=f"links at most {LINK_LEDGERS_MAX}"):
                await link_job_ledgers(client.ledger_client, record, "too-big", {0: too_many})
            times = await _exercise_large_partition(client, "large", 10_500, base_ms)
            return {"build_ms": build_ms, **times}

    times = rpc.run(main())
    print("\n10,500 ledgers: " + ", ".join(f"{k}={v:.0f}" for k, v in times.items()))


@pytest.mark.parametrize("count", [100_000, pytest.param(1_000_000, marks=pytest.mark.slow)])
def test_partition_of_many_ledgers(meta: list[str], count: int) -> None:
    """100,000 (and, in the slow run, 1,000,000) ledgers written straight into
    meta (synthetic records in bounded transactions): open, rollover, seeks
    and trim each read and write a bounded part of the list."""
    name = f"huge{count}"

    async def main() -> dict[str, float]:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream(name, small(entries=1000))
            base_ms = int(time.time() * 1000) - 10**9
            began = time.perf_counter()
            await _write_synthetic(client, name, count, base_ms)
            build_ms = (time.perf_counter() - began) * 1000
            times = await _exercise_large_partition(client, name, count, base_ms)
            return {"build_ms": build_ms, **times}

    times = rpc.run(main())
    print(f"\n{count:,} ledgers: " + ", ".join(f"{k}={v:.0f}" for k, v in times.items()))


def test_reading_and_trimming_through_archive_runs(meta: list[str]) -> None:
    """60 real ledgers of one entry each: the head keeps the last few, the
    rest move to archive runs while a reader tails. Every read path (tail from
    earliest, a position and a publish time in the archive) and a trim that
    deletes a run and rewrites another give the same messages as the walk."""
    count = 60  # the tail is archived at 33 and 58 ledgers

    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("archived", small(entries=1))
            tailing = await client.reader("archived", "earliest")
            producer = await client.producer("archived")
            ids = [await producer.send(b"a%d" % i) for i in range(count)]
            await producer.close()
            head = await LedgerList(client.ledger_client.meta, "archived", 0).refresh()
            assert head.tail_first_seq > 2 * (TAIL_LEDGERS_KEEP + 1)  # two runs or more
            tailed = []
            while len(tailed) < count:  # it read while ledgers moved into runs
                message = await tailing.read_next(DEADLINE_S * 1000)
                assert message is not None
                tailed.append(message)
            await tailing.close()
            assert [m.position for m in tailed] == [i.position for i in ids]

            from_position = await read_all(client, "archived", ids[10].position, expect=count)
            assert [m.value for m in from_position] == [b"a%d" % i for i in range(10, count)]
            cut = tailed[20].publish_time_ms
            by_time = await read_all(client, "archived", cut, expect=count)
            assert [m.value for m in by_time] == [m.value for m in tailed
                                                  if m.publish_time_ms >= cut]
            # A cursor that acknowledged the first 30: retention deletes exactly
            # those ledgers, from the archive, in steps of 20 (one transaction each).
            consumer = await client.subscribe("archived", "c", config=ConsumerConfig(
                initial_position="earliest", ack_flush_ms=0))
            for _ in range(30):
                message = await consumer.receive(wait_ms=5000)
                assert message is not None
                await consumer.ack(message)
            await consumer.close()
            _, revision = await client.ledger_client.meta.range(config_key("archived"))
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(stream_admin, "TRIM_LEDGERS_PER_TXN", 20)
                report = await client.trim("archived", retention=RetentionPolicy(time_ms=0))
            assert report.deleted_ledgers == [i.position.ledger_id for i in ids[:30]]
            writes = await _list_writes_since(client, "archived", revision, transactions=2)
            assert len(writes) == 2 and all(len(keys) <= 3 for keys in writes.values()), writes
            rest = await read_all(client, "archived", expect=count)
            assert [m.value for m in rest] == [b"a%d" % i for i in range(30, count)]
            with pytest.raises(BadPositionError):
                await client.reader("archived", ids[5].position)

    rpc.run(main())


def test_old_layout_stream_fails_clearly_and_can_be_deleted(meta: list[str]) -> None:
    """A partition value in the version-1 layout (the whole list in one value)
    is not read as anything else: opening fails saying what to do, and
    deleting the stream deletes its ledgers."""
    import msgspec

    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            record = await client.create_stream("legacy", small())
            handle = await client.ledger_client.create_ledger(
                ensemble=2, write_quorum=2, ack_quorum=2, password=record.password)
            await handle.close()
            old = msgspec.msgpack.encode({
                "ledgers": [{"seq": 0, "ledger_id": handle.id, "status": "closed"}],
                "next_seq": 1, "trimmed_entries": 0, "writer_epoch": 0, "format_version": 1})
            await client.ledger_client.meta.put(partition_key("legacy", 0), old)
            for opening in (client.reader("legacy"), client.producer("legacy")):
                with pytest.raises(MessageFormatError, match=r"layout version 1.*stream delete"):
                    await opening
            assert await client.delete_stream("legacy") == [handle.id]
            assert await client.ledger_client.meta.get(ledger_key(handle.id)) is None

    rpc.run(main())


def test_a_burst_of_pipelined_sends_rolls_over_at_max_entries(meta: list[str]) -> None:
    """A queue of sends issued at once still goes to ledgers of at most
    ``max_entries`` (the writer's pump used to issue the whole queue into the
    current ledger: 300 entries in a ledger of 10), in order."""
    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("burst", small(partitions=1, entries=10))
            producer = await client.producer("burst", config=ProducerConfig(batching=False))
            await asyncio.gather(*[await producer.send_async(b"%d" % i) for i in range(300)])
            await producer.close()
            info = await client.stream_info("burst")
            sizes = [ledger["entries"] for ledger in info["partitions"][0]["ledgers"]]
            assert sum(sizes) == 300 and max(sizes) == 10, sizes
            assert [m.value for m in await read_all(client, "burst")] == [
                b"%d" % i for i in range(300)]

    rpc.run(main())
