"""Streams on a real local cluster (3 node processes: meta + bookies on 127.0.0.1).

One cluster for the whole module; each test uses its own stream.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from quorumlog import node as cluster
from quorumlog import rpc
from quorumlog.bookie._protocol import ledger_key
from quorumlog.stream import (
    BadPositionError,
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
from quorumlog.stream._entry import OutgoingMessage
from quorumlog.stream._layout import pending_prefix
from quorumlog.stream._link import JobLedgerWriter, abort_job_ledgers, link_job_ledgers
from quorumlog.stream._reader import PartitionReader

CHILD = Path(__file__).with_name("stream_child.py")
DEADLINE_S = 30.0


@pytest.fixture(scope="module")
def meta(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    directory = tmp_path_factory.mktemp("streams") / "cluster"
    cluster.up(directory, 3)
    try:
        yield cluster.meta_addresses(directory)
    finally:
        cluster.down(directory)


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
    rest, _ = proc.communicate(timeout=DEADLINE_S)
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
    lines = _read_lines(child, 25)
    lines += _kill(child)
    acked = {line["acked"] for line in lines if "acked" in line}
    assert acked

    async def resume() -> None:
        async with await StreamClient.connect(meta) as client:
            consumer = await client.subscribe("subs", "s1", config=ConsumerConfig(
                lease_wait_ms=10_000, ack_flush_ms=0))
            got = []
            while True:
                message = await consumer.receive(wait_ms=1500)
                if message is None:
                    break
                got.append(message)
                await consumer.ack(message)
            await consumer.close()
            values = {m.value.decode() for m in got}
            assert values.isdisjoint(acked)  # acknowledged before the crash: never again
            assert values | acked == {str(i) for i in range(40)}  # nothing lost
            for partition in (0, 1):
                keys = [m.seq_position.key for m in got if m.partition == partition]
                assert keys == sorted(keys)
            # Everything acked now: a third consumer gets nothing.
            again = await client.subscribe("subs", "s1")
            assert await again.receive(wait_ms=300) is None
            await again.close()

    rpc.run(resume())


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


def test_delete_stream_removes_ledgers(meta: list[str]) -> None:
    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("gone", small(entries=2))
            producer = await client.producer("gone")
            for i in range(5):
                await producer.send(b"%d" % i)
            await producer.close()
            deleted = await client.delete_stream("gone")
            assert len(deleted) >= 3
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
