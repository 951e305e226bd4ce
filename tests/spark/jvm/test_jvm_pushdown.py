"""Filter pushdown into the JVM reader (``jvm/.../Pushdown.java``) against a
real local cluster.

For each filter the JVM reader's rows equal the Python source's (every
column); the pruning shows in the Spark partitions the scan plans (small
tasks, so there are many) and in the plan's description. Filters it cannot
use (Or) are left to Spark; one that keeps nothing reads no partition.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from .support import rows, run, skip_without_the_reader

skip_without_the_reader()

from quorumlog.spark._jvm import jvm_plan, read_stream  # noqa: E402
from quorumlog.stream import (  # noqa: E402
    ProducerConfig,
    RolloverPolicy,
    StreamClient,
    StreamConfig,
)

STREAM = "jvm-pushdown"
SMALL = {"maxRowsPerPartition": "3", "arrowBatchRows": "5"}  # many Spark partitions

@pytest.fixture(scope="module")
def events(meta: list[str]) -> list[Any]:
    """The stream's messages: many small ledgers, single then batched entries."""
    async def body(client: StreamClient) -> list[Any]:
        await client.create_stream(STREAM, StreamConfig(
            partitions=2, rollover=RolloverPolicy(max_entries=7, min_time_ms=0)))
        single = await client.producer(STREAM)
        for i in range(60):
            await single.send(b"v%d" % i, key=None if i % 4 == 0 else b"k%d" % (i % 9),
                              properties={"n": str(i)} if i % 3 == 0 else None)
        await single.close()
        batched = await client.producer(STREAM, config=ProducerConfig(batching=True))
        for round_ in range(20):  # a round is an entry per partition: 20 batched entries
            await asyncio.gather(*[await batched.send_async(b"b%d.%d" % (round_, i),
                                                            key=b"k%d" % (i % 5))
                                   for i in range(20)])
        await batched.close()
        out = []
        async with await client.reader(STREAM, "earliest") as reader:
            while (message := await reader.read_next(1000)) is not None:
                out.append(message)
        return out

    produced: list[Any] = run(meta, body)
    assert len(produced) == 460
    return produced




def jvm_frame(spark: Any, meta: list[str], condition: str | None, **options: str) -> Any:
    frame = read_stream(spark, jvm=True, meta=",".join(meta), stream=STREAM,
                        **{**SMALL, **options})
    return frame if condition is None else frame.filter(condition)


def both(spark: Any, meta: list[str], condition: str, **options: str
         ) -> tuple[list[Any], list[Any]]:
    """The rows of the JVM reader (small tasks) and of the Python source."""
    python = read_stream(spark, jvm=False, meta=",".join(meta), stream=STREAM, **options)
    return rows(jvm_frame(spark, meta, condition, **options)), rows(python.filter(condition))


def tasks(spark: Any, meta: list[str], condition: str | None, **options: str) -> int:
    return int(jvm_frame(spark, meta, condition, **options).rdd.getNumPartitions())


def explained(spark: Any, meta: list[str], condition: str) -> str:
    return str(jvm_frame(spark, meta, condition)._jdf.queryExecution().executedPlan()
               .toString())


def planned(meta: list[str], keep: Callable[[dict[str, Any]], bool]) -> int:
    """Spark partitions of the unfiltered plan holding a range ``keep`` keeps."""
    plan, _ = jvm_plan({"meta": ",".join(meta), "stream": STREAM, **SMALL})
    assert plan is not None
    return sum(any(keep(r) for r in p["ranges"]) for p in json.loads(plan)["partitions"])


def ledgers(events: list[Any], partition: int) -> list[int]:
    return sorted({m.position.ledger_id for m in events if m.partition == partition})


def test_partition_and_ledger_filters_skip_the_other_ranges(
        spark: Any, meta: list[str], events: list[Any]) -> None:
    everything = tasks(spark, meta, None)
    assert everything > 20

    jvm, python = both(spark, meta, "partition = 1")
    assert jvm == python and len(jvm) == sum(m.partition == 1 for m in events) > 0
    assert tasks(spark, meta, "partition = 1") == planned(
        meta, lambda r: r["partition"] == 1) < everything
    assert "pushed" in explained(spark, meta, "partition = 1")

    one = ledgers(events, 0)[3]
    jvm, python = both(spark, meta, f"ledger_id = {one}")
    assert jvm == python and len(jvm) == sum(m.position.ledger_id == one for m in events) > 0
    assert tasks(spark, meta, f"ledger_id = {one}") == planned(
        meta, lambda r: r["ledger_id"] == one) < everything

    two = {ledgers(events, 0)[1], ledgers(events, 1)[-2]}
    condition = "ledger_id IN ({})".format(", ".join(map(str, sorted(two))))
    jvm, python = both(spark, meta, condition)
    assert jvm == python and {row[2] for row in jvm} == two
    assert tasks(spark, meta, condition) == planned(meta, lambda r: r["ledger_id"] in two)

    # Comparisons on partition and ledger_id prune too.
    first = ledgers(events, 1)[0]
    condition = f"partition >= 1 AND ledger_id > {first}"
    jvm, python = both(spark, meta, condition)
    assert jvm == python and jvm
    assert tasks(spark, meta, condition) == planned(
        meta, lambda r: r["partition"] >= 1 and r["ledger_id"] > first)


def test_entry_filters_narrow_ranges_and_keep_batch_bounds(
        spark: Any, meta: list[str], events: list[Any]) -> None:
    everything = tasks(spark, meta, None)
    condition = "entry_id >= 2 AND entry_id < 5"
    jvm, python = both(spark, meta, condition)
    assert jvm == python and len(jvm) == sum(2 <= m.position.entry_id < 5 for m in events)
    assert tasks(spark, meta, condition) < everything
    jvm, python = both(spark, meta, "entry_id IN (1, 6)")
    assert jvm == python and {row[3] for row in jvm} == {1, 6}

    # Starts and ends inside producer batches: the filter keeps the planned
    # entry, so its first_batch / end_batch still apply; moving off it drops them.
    batched = sorted((m for m in events if m.partition == 0 and m.position.batch_index > 0),
                     key=lambda m: m.seq_position)
    start = next((m for m in batched if m.position.entry_id == 0 and m.position.batch_index >= 3),
                 batched[2]).position
    end = batched[-3].position
    positions = {"startingPositions": json.dumps({"0": start.to_json(), "1": "latest"}),
                 "endingPositions": json.dumps({"0": end.to_json()})}
    for condition in (f"entry_id = {start.entry_id}", f"entry_id > {start.entry_id}",
                      f"entry_id <= {end.entry_id}", f"entry_id < {end.entry_id}",
                      f"entry_id >= {start.entry_id} AND entry_id <= {end.entry_id}"):
        jvm, python = both(spark, meta, condition, **positions)
        assert jvm == python and jvm, condition
    jvm, _ = both(spark, meta, f"entry_id = {start.entry_id}", **positions)
    assert any(row[2] == start.ledger_id and row[4] == start.batch_index for row in jvm)
    assert not any(row[2] == start.ledger_id and row[3] == start.entry_id
                   and row[4] < start.batch_index for row in jvm)


@pytest.mark.parametrize("java8", [False, True], ids=["Timestamp", "Instant"])
def test_publish_time_filters_tighten_the_window(
        spark: Any, meta: list[str], events: list[Any], java8: bool) -> None:
    times = sorted(m.publish_time_ms for m in events)
    low, high = times[100], times[300]
    assert times[0] < low < high < times[-1]
    spark.conf.set("spark.sql.datetime.java8API.enabled", str(java8).lower())
    try:
        condition = (f"publish_time >= timestamp_millis({low}) "
                     f"AND publish_time < timestamp_millis({high})")
        jvm, python = both(spark, meta, condition)
        assert jvm == python and len(jvm) == sum(low <= t < high for t in times)
        assert "publish_time" in explained(spark, meta, condition)
        # Bounds a microsecond off a row's millisecond keep that row, or not.
        us = low * 1000
        for condition in (f"publish_time = timestamp_millis({low})",
                          f"publish_time <= timestamp_millis({low})",
                          f"publish_time > timestamp_micros({us - 1})",
                          f"publish_time > timestamp_micros({us})",
                          f"publish_time >= timestamp_micros({us + 1})",
                          f"publish_time < timestamp_micros({us + 1})",
                          f"publish_time < timestamp_micros({us})",
                          f"publish_time <= timestamp_micros({us - 1})",
                          f"publish_time = timestamp_micros({us + 1})"):
            jvm, python = both(spark, meta, condition)
            assert jvm == python, condition
    finally:
        spark.conf.unset("spark.sql.datetime.java8API.enabled")


def test_filters_it_cannot_use_are_left_to_spark(
        spark: Any, meta: list[str], events: list[Any]) -> None:
    everything = tasks(spark, meta, None)
    condition = "partition = 1 OR entry_id = 3"
    jvm, python = both(spark, meta, condition)
    assert jvm == python and len(jvm) == sum(m.partition == 1 or m.position.entry_id == 3
                                             for m in events)
    assert tasks(spark, meta, condition) == everything
    assert "pushed" not in explained(spark, meta, condition)
    # Half an And still prunes; Not is left to Spark.
    condition = "partition = 0 AND (entry_id = 1 OR entry_id = 4)"
    jvm, python = both(spark, meta, condition)
    assert jvm == python and jvm
    assert tasks(spark, meta, condition) == planned(meta, lambda r: r["partition"] == 0)
    jvm, python = both(spark, meta, "NOT (partition = 1)")
    assert jvm == python and jvm


def test_a_filter_that_keeps_nothing_reads_no_partition(
        spark: Any, meta: list[str], events: list[Any]) -> None:
    for condition in ("partition = 99", "entry_id > 100000 AND partition = 0"):
        assert tasks(spark, meta, condition) == 0
        jvm, python = both(spark, meta, condition)
        assert jvm == python == []
        assert jvm_frame(spark, meta, condition).count() == 0
