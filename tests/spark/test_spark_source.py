"""The quorumlog PySpark data source against a real local cluster.

One cluster (3 node processes) and one SparkSession (``local[2,2]``: 2 threads,
a failed task is tried twice) for the whole module. Skips only when pyspark or
Java is missing (``QUORUMLOG_SPARK=0 ./scripts/setup.sh`` leaves pyspark out).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (the spark extra)")
pytest.importorskip("pyarrow", reason="pyarrow is not installed (the spark extra)")
if shutil.which("java") is None:
    pytest.skip("no java on PATH: Spark needs Java 17+", allow_module_level=True)

from quorumlog import node as cluster
from quorumlog import rpc
from quorumlog.proto import ledger_key
from quorumlog.stream import (
    RetentionPolicy,
    RolloverPolicy,
    StreamClient,
    StreamConfig,
)
from quorumlog.stream._layout import pending_prefix

from .sessions import spark_session

ROW_KEYS = ("partition", "ledger_id", "entry_id", "batch_index", "key", "value")


@pytest.fixture(scope="module")
def meta(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    # These tests trim by hand and check what each trim deleted: no background
    # trimmer (tests/stream/test_stream_trimmer.py tests that one).
    with contextlib.ExitStack() as stack:
        with mock.patch.dict(os.environ, {"QUORUMLOG_TRIMMER__ENABLED": "false"}):
            addresses = stack.enter_context(
                cluster.running(tmp_path_factory.mktemp("spark") / "cluster", 3))
        yield addresses


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    yield from spark_session("local[2,2]", "quorumlog-tests")


def run(meta: list[str], body: Any) -> Any:
    async def main() -> Any:
        async with await StreamClient.connect(meta) as client:
            return await body(client)

    return rpc.run(main())


def config(partitions: int = 2, entries: int = 6, **retention: Any) -> StreamConfig:
    return StreamConfig(partitions=partitions, writer_lease_ttl_ms=1000,
                        rollover=RolloverPolicy(max_entries=entries, min_time_ms=0),
                        retention=RetentionPolicy(**retention) if retention
                        else RetentionPolicy())


def reader(spark: Any, meta: list[str], stream: str, **options: str) -> Any:
    frame = spark.read.format("quorumlog").option("meta", ",".join(meta)).option(
        "stream", stream)
    for name, value in options.items():
        frame = frame.option(name, value)
    return frame.load()


async def all_messages(client: StreamClient, stream: str) -> list[Any]:
    out = []
    async with await client.reader(stream, "earliest") as r:
        while (message := await r.read_next(1000)) is not None:
            out.append(message)
    return out


def as_tuples(messages: list[Any]) -> set[tuple[Any, ...]]:
    return {(m.partition, m.position.ledger_id, m.position.entry_id, m.position.batch_index,
             m.key, m.value) for m in messages}


def row_tuples(rows: list[Any]) -> set[tuple[Any, ...]]:
    return {tuple(bytes(r[k]) if isinstance(r[k], bytearray) else r[k] for k in ROW_KEYS)
            for r in rows}


def test_batch_read_equals_produced_across_ledgers_and_takeover(spark: Any,
                                                                 meta: list[str]) -> None:
    async def fill(client: StreamClient) -> list[Any]:
        await client.create_stream("events", config(entries=6))
        first = await client.producer("events")
        for i in range(40):
            await first.send(b"a%d" % i, key=b"user%d" % (i % 5), properties={"n": str(i)})
        batch = [await first.send_async(b"batched%d" % i) for i in range(25)]
        await asyncio.gather(*batch)
        # A second writer takes the partitions over: the first one is fenced,
        # its open ledgers are recovered and closed, new ledgers follow.
        second = await client.producer("events", steal=True)
        for i in range(30):
            await second.send(b"b%d" % i, key=b"user%d" % (i % 5))
        await second.close()
        await first.close()
        return await all_messages(client, "events")

    produced = run(meta, fill)
    assert len(produced) == 95
    frame = reader(spark, meta, "events", maxRowsPerPartition="4")
    assert frame.rdd.getNumPartitions() >= 10  # one task per <= 4 entries of one ledger
    rows = frame.collect()
    assert len(rows) == 95
    assert row_tuples(rows) == as_tuples(produced)
    by_value = {bytes(r["value"]): r for r in rows}
    assert by_value[b"a7"]["properties"] == {"n": "7"}
    assert by_value[b"a7"]["stream"] == "events"
    assert len({r["ledger_id"] for r in rows}) >= 8  # crossed many ledger boundaries

    # Positions: from a JSON start (inclusive) to a JSON end (exclusive), per partition.
    p0 = sorted((m for m in produced if m.partition == 0), key=lambda m: m.seq_position)
    start, end = p0[3].position, p0[20].position
    ranged = reader(spark, meta, "events",
                    startingPositions=json.dumps({"0": start.to_json(), "1": "latest"}),
                    endingPositions=json.dumps({"0": end.to_json()})).collect()
    assert sorted(bytes(r["value"]) for r in ranged) == sorted(m.value for m in p0[3:20])
    # Publish time: option and pushed-down filter give the same rows as Spark's own filter.
    cut = sorted(m.publish_time_ms for m in produced)[50]
    expected = {m.value for m in produced if m.publish_time_ms >= cut}
    pushed = frame.filter(f"publish_time >= timestamp_millis({cut})").collect()
    assert {bytes(r["value"]) for r in pushed} == expected
    by_time = reader(spark, meta, "events", startingTime=str(cut)).collect()
    assert {bytes(r["value"]) for r in by_time} >= expected
    only_p1 = frame.filter("partition = 1").collect()
    assert {bytes(r["value"]) for r in only_p1} == {m.value for m in produced
                                                    if m.partition == 1}
    # Filters that prune every ledger plan no task: Spark reads the empty
    # InputPartition(None) it substitutes, which holds no rows (it failed the
    # query before).
    assert frame.filter("partition = 99").count() == 0
    assert frame.filter("ledger_id = -5").collect() == []
    run(meta, lambda client: client.create_stream("events-empty", config()))
    assert reader(spark, meta, "events-empty").collect() == []


def test_streaming_read_restarts_exactly_once(spark: Any, meta: list[str],
                                              tmp_path: Path) -> None:
    async def produce(client: StreamClient, prefix: bytes, count: int,
                      create: bool) -> None:
        if create:
            await client.create_stream("clicks", config(entries=5))
        producer = await client.producer("clicks")
        for i in range(count):
            await producer.send(prefix + b"%d" % i, key=b"%d" % i)
        await producer.close()

    run(meta, lambda c: produce(c, b"x", 40, True))
    checkpoint, sink = tmp_path / "ckpt", tmp_path / "out"

    def run_query() -> int:
        stream = (spark.readStream.format("quorumlog").option("meta", ",".join(meta))
                  .option("stream", "clicks").option("startingPositions", "earliest")
                  .option("maxEntriesPerTrigger", "12").load())
        query = (stream.select("partition", "ledger_id", "entry_id", "batch_index", "value")
                 .writeStream.format("parquet").option("path", str(sink))
                 .option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None
        return len(query.recentProgress)

    batches = run_query()
    assert batches >= 4  # 40 entries, at most 12 per trigger
    first = spark.read.parquet(str(sink)).collect()
    assert sorted(bytes(r["value"]) for r in first) == sorted(b"x%d" % i for i in range(40))
    run(meta, lambda c: produce(c, b"y", 25, False))
    run_query()  # restarts from the checkpoint
    rows = spark.read.parquet(str(sink)).collect()
    values = [bytes(r["value"]) for r in rows]
    assert len(values) == len(set(values)) == 65  # each entry exactly once
    assert set(values) == {b"x%d" % i for i in range(40)} | {b"y%d" % i for i in range(25)}


def test_batch_write_is_all_or_nothing(spark: Any, meta: list[str], tmp_path: Path) -> None:
    from pyspark.sql import functions as F  # noqa: N812
    from pyspark.sql.types import StringType

    run(meta, lambda c: c.create_stream("sink", config(entries=1000)))
    marker = tmp_path / "failed-once"

    def fail_once(value: str) -> str:
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is not None and context.partitionId() == 1 and not marker.exists():
            marker.touch()
            raise RuntimeError("injected task failure (first attempt)")
        return value

    def fail_always(value: str) -> str:
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is not None and context.partitionId() == 1 and value.endswith("7"):
            raise RuntimeError("injected task failure (every attempt)")
        return value

    source = spark.createDataFrame([(f"k{i}", f"w{i}") for i in range(300)],
                                   "key string, value string").repartition(3)

    # A task fails once and is retried (local[2,2]): every row lands exactly once.
    (source.withColumn("value", F.udf(fail_once, StringType())("value")).write
     .format("quorumlog").option("meta", ",".join(meta)).option("stream", "sink")
     .mode("append").save())
    assert marker.exists()

    async def check(client: StreamClient) -> list[bytes]:
        return [m.value for m in await all_messages(client, "sink")]

    values = run(meta, check)
    written = [v for v in values if v.startswith(b"w")]
    assert sorted(written) == sorted(b"w%d" % i for i in range(300))
    # A task that always fails: the job fails, nothing of it is visible.
    with pytest.raises(Exception, match="injected task failure"):
        (source.withColumn("value", F.udf(fail_always, StringType())("value")).write
         .format("quorumlog").option("meta", ",".join(meta)).option("stream", "sink")
         .mode("append").save())
    after = run(meta, check)
    assert sorted(after) == sorted(values)

    async def leftovers(client: StreamClient) -> tuple[list[Any], list[int]]:
        pending = await client.ledger_client.meta.list_keys(pending_prefix("sink"))
        listed = {lg["ledger_id"] for p in (await client.stream_info("sink"))["partitions"]
                  for lg in p["ledgers"]}
        orphans = []
        for ledger_id in await client.ledger_client.list_ledgers():
            kv = await client.ledger_client.meta.get(ledger_key(ledger_id))
            if kv is not None and b"sink" in kv.value and ledger_id not in listed:
                orphans.append(ledger_id)
        return pending, orphans

    pending, orphans = run(meta, leftovers)
    assert pending == [] and orphans == []


def test_streaming_write_never_duplicates_a_committed_batch(spark: Any, meta: list[str],
                                                            tmp_path: Path) -> None:
    async def setup(client: StreamClient) -> None:
        await client.create_stream("src", config(partitions=1, entries=4))
        await client.create_stream("dst", config(partitions=1, entries=1000))
        producer = await client.producer("src")
        for i in range(20):
            await producer.send(b"s%d" % i)
        await producer.close()

    run(meta, setup)
    checkpoint = tmp_path / "ckpt"

    def run_query() -> None:
        query = (spark.readStream.format("quorumlog").option("meta", ",".join(meta))
                 .option("stream", "src").option("startingPositions", "earliest")
                 .option("maxEntriesPerTrigger", "8").load().select("key", "value")
                 .writeStream.format("quorumlog").option("meta", ",".join(meta))
                 .option("stream", "dst").option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None

    run_query()
    # Forget that the last micro-batch was committed (as if the driver died right
    # after our commit): the restarted query runs that batch again.
    commits = sorted((p for p in (checkpoint / "commits").iterdir() if p.name.isdigit()),
                     key=lambda p: int(p.name))
    assert len(commits) >= 3  # 20 entries, at most 8 per trigger
    commits[-1].unlink()
    (checkpoint / "commits" / f".{commits[-1].name}.crc").unlink(missing_ok=True)
    run_query()

    async def values(client: StreamClient) -> list[bytes]:
        return [m.value for m in await all_messages(client, "dst")]

    got = run(meta, values)
    assert sorted(got) == sorted(b"s%d" % i for i in range(20))


def test_fail_on_data_loss_after_trim(spark: Any, meta: list[str], tmp_path: Path) -> None:
    async def produce(client: StreamClient, start: int, create: bool) -> None:
        if create:
            await client.create_stream("trimmed", config(partitions=1, entries=3, time_ms=0))
        producer = await client.producer("trimmed")
        for i in range(start, start + 15):
            await producer.send(b"%d" % i)
        await producer.close()

    run(meta, lambda c: produce(c, 0, True))
    checkpoint, sink = tmp_path / "ckpt", tmp_path / "out"

    def run_query(**options: str) -> Any:
        frame = (spark.readStream.format("quorumlog").option("meta", ",".join(meta))
                 .option("stream", "trimmed").option("startingPositions", "earliest"))
        for name, value in options.items():
            frame = frame.option(name, value)
        query = (frame.load().select("value").writeStream.format("parquet")
                 .option("path", str(sink)).option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())
        query.awaitTermination(120)
        return query

    assert run_query().exception() is None
    run(meta, lambda c: produce(c, 15, False))
    report = run(meta, lambda c: c.trim("trimmed"))  # retention 0, no cursor: trims old ledgers
    assert report.deleted_ledgers
    # Retention keeps the last ledger (it anchors "latest"): what it still holds of
    # 15..29 is read after the gap; the rest is gone.
    kept = {m.value for m in run(meta, lambda c: all_messages(c, "trimmed"))}
    assert kept < {b"%d" % i for i in range(15, 30)}
    with pytest.raises(Exception, match="failOnDataLoss") as failure:
        run_query()
    assert "were trimmed" in str(failure.value)
    run(meta, lambda c: produce(c, 30, False))  # new data after the gap
    skipped = run_query(failOnDataLoss="false")
    assert skipped.exception() is None
    values = {bytes(r["value"]) for r in spark.read.parquet(str(sink)).collect()}
    assert values == {b"%d" % i for i in range(15)} | kept | {b"%d" % i for i in range(30, 45)}


def test_bad_input_gives_clear_errors(spark: Any, meta: list[str]) -> None:
    with pytest.raises(Exception, match="does not exist"):
        reader(spark, meta, "no-such-stream").collect()
    run(meta, lambda c: c.create_stream("bad", config()))
    with pytest.raises(Exception, match="startingPositions"):
        reader(spark, meta, "bad", startingPositions='{"0": {ledger').collect()
    with pytest.raises(Exception, match="partition 7"):
        reader(spark, meta, "bad", startingPositions='{"7": "earliest"}').collect()
    with pytest.raises(Exception, match="maxRowsPerPartition"):
        reader(spark, meta, "bad", maxRowsPerPartition="zero").collect()
    wrong = spark.createDataFrame([(1, "x")], "id int, value string")
    with pytest.raises(Exception, match="cannot write columns"):
        wrong.write.format("quorumlog").option("meta", ",".join(meta)).option(
            "stream", "bad").mode("append").save()
    no_value = spark.createDataFrame([("k",)], "key string")
    with pytest.raises(Exception, match="needs a 'value' column"):
        no_value.write.format("quorumlog").option("meta", ",".join(meta)).option(
            "stream", "bad").mode("append").save()
    with pytest.raises(Exception, match="append-only"):
        spark.createDataFrame([("v",)], "value string").write.format("quorumlog").option(
            "meta", ",".join(meta)).option("stream", "bad").mode("overwrite").save()


def test_reads_in_a_session_with_pushdown_off(spark: Any, meta: list[str]) -> None:
    """Spark's default is Python filter pushdown off: ``register`` must then
    give a source Spark accepts, which reads and filters the same rows."""
    from quorumlog.spark import PUSHDOWN_SETTING, QuorumlogDataSource, register

    async def fill(client: StreamClient) -> list[Any]:
        await client.create_stream("plain", config(entries=4))
        producer = await client.producer("plain")
        for i in range(12):
            await producer.send(b"p%d" % i, key=b"k%d" % (i % 3))
        await producer.close()
        return await all_messages(client, "plain")

    produced = run(meta, fill)
    try:
        spark.conf.set(PUSHDOWN_SETTING, "false")
        # The pushdown-capable source is what Spark refuses in such a session.
        spark.dataSource.register(QuorumlogDataSource)
        with pytest.raises(Exception, match="DATA_SOURCE_PUSHDOWN_DISABLED"):
            reader(spark, meta, "plain").filter("partition = 1").collect()
        register(spark)
        frame = reader(spark, meta, "plain")
        assert row_tuples(frame.collect()) == as_tuples(produced)
        only_p1 = frame.filter("partition = 1").collect()
        assert {bytes(r["value"]) for r in only_p1} == {m.value for m in produced
                                                        if m.partition == 1}
    finally:
        spark.conf.set(PUSHDOWN_SETTING, "true")
        register(spark)


def test_offload_job_then_reads_from_parquet_after_the_bookies_lose_the_ledgers(
        spark: Any, meta: list[str], tmp_path: Path) -> None:
    """Tiered storage: the Spark offload job copies every closed ledger to
    Parquet; batch and streaming reads return the same rows from the files once
    the bookies' copies are deleted (the offloaded tasks read no bookie)."""
    from quorumlog.spark import offload

    async def fill(client: StreamClient) -> list[Any]:
        await client.create_stream("cold", config(entries=5))
        producer = await client.producer("cold")
        for i in range(30):
            await producer.send(b"c%d" % i, key=b"k%d" % (i % 3), properties={"n": str(i)})
        await asyncio.gather(*[await producer.send_async(b"cb%d" % i) for i in range(20)])
        await producer.close()
        return await all_messages(client, "cold")

    produced = run(meta, fill)
    assert len(produced) == 50
    before = reader(spark, meta, "cold", maxRowsPerPartition="3").collect()
    assert row_tuples(before) == as_tuples(produced)

    a_file = tmp_path / "a-file"
    a_file.write_bytes(b"")
    refused = offload(spark, meta, "cold", str(a_file), deletion_lag_ms=0)
    assert refused.offloaded == 0 and len(refused.failed) == refused.candidates >= 6
    assert all("cannot write the offload file" in error for _, error in refused.failed)
    result = offload(spark, meta, "cold", str(tmp_path / "tier"), deletion_lag_ms=0, tasks=3)
    assert result.failed == [] and result.offloaded == result.candidates >= 6
    assert result.entries == sum(o.entries for o in result.outcomes)
    assert len(list((tmp_path / "tier").rglob("*.parquet"))) == result.offloaded
    again = offload(spark, meta, "cold", str(tmp_path / "tier"))
    assert again.candidates == 0 and again.offloaded == 0

    async def drop_copies(client: StreamClient) -> list[int]:
        report = await client.trim("cold")
        for ledger_id in report.offloaded_copies_deleted:
            assert await client.ledger_client.meta.get(ledger_key(ledger_id)) is None
        return report.offloaded_copies_deleted

    assert sorted(run(meta, drop_copies)) == sorted(o.ledger_id for o in result.outcomes)
    after = reader(spark, meta, "cold", maxRowsPerPartition="3").collect()
    assert row_tuples(after) == row_tuples(before)
    assert {bytes(r["value"]): r["properties"] for r in after}[b"c7"] == {"n": "7"}
    pushed = reader(spark, meta, "cold").filter("partition = 0").collect()
    assert row_tuples(pushed) == {t for t in row_tuples(before) if t[0] == 0}

    query = (spark.readStream.format("quorumlog").option("meta", ",".join(meta))
             .option("stream", "cold").option("startingPositions", "earliest").load()
             .writeStream.format("parquet").option("path", str(tmp_path / "out"))
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    streamed = spark.read.parquet(str(tmp_path / "out")).collect()
    assert row_tuples(streamed) == row_tuples(before)


def test_read_compacted_reads_the_view_then_the_messages_after_it(spark: Any,
                                                                   meta: list[str]) -> None:
    """Pulsar's readCompacted for a batch read: up to each partition's horizon the
    compacted view (messages of ledgers retention trimmed included), then every
    message after it; the rows are those of a compacted stream reader."""
    async def fill(client: StreamClient) -> tuple[list[Any], list[Any]]:
        await client.create_stream("changelog", config(entries=4))
        producer = await client.producer("changelog")
        for i in range(30):
            value = b"" if i == 28 else b"v%d" % i  # user3's last is a tombstone
            await producer.send(value, key=b"user%d" % (i % 5))
        await producer.send(b"no key")
        await producer.close()
        await client.compact("changelog")
        await client.trim("changelog", retention=RetentionPolicy(time_ms=0, size_bytes=0))
        producer = await client.producer("changelog")
        for i in range(10):
            await producer.send(b"after%d" % i, key=b"user%d" % i)
        await producer.close()
        async with await client.reader("changelog", "earliest", read_compacted=True) as r:
            compacted = []
            while (message := await r.read_next(1000)) is not None:
                compacted.append(message)
        return compacted, await all_messages(client, "changelog")

    compacted, plain = run(meta, fill)
    assert len(compacted) == 4 + 1 + 10  # users 0-2 and 4, the keyless one, then 10 more
    rows = reader(spark, meta, "changelog", readCompacted="true",
                  maxRowsPerPartition="3").collect()
    assert len(rows) == len(compacted) and row_tuples(rows) == as_tuples(compacted)
    assert {bytes(r["key"]) for r in rows if r["key"] is not None
            and bytes(r["value"]).startswith(b"v")} == {b"user0", b"user1", b"user2", b"user4"}
    assert row_tuples(reader(spark, meta, "changelog").collect()) == as_tuples(plain)
    assert len(plain) < 31 + 10  # the trim took most of the first 31: only the view has them
