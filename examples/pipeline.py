"""The example pipeline: local cluster -> stream -> Spark -> stream + Parquet.

1. starts a local cluster (3 node processes: meta + bookies on 127.0.0.1),
2. creates the stream ``events`` (2 partitions) and produces JSON events,
3. a Spark job reads the stream (Arrow batches straight from the bookies),
   aggregates per action, and writes the result both to the stream
   ``event-stats`` (one atomic batch write) and to Parquet,
4. reads both results back and prints them,
5. tiered storage: a Spark job offloads the closed ledgers of ``events`` to
   Parquet files, the bookies' copies are deleted (a deletion lag of 0 for
   the demo), and Spark reads ``events`` again, now from the files; then it
   stops the cluster.

    ./scripts/uv run --frozen python examples/pipeline.py [--events 5000] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sys
import time
from pathlib import Path

from quorumlog import node as cluster
from quorumlog import rpc
from quorumlog.log import configure
from quorumlog.stream import StreamClient, StreamConfig

ACTIONS = ("view", "click", "cart", "buy")


async def produce(meta: list[str], events: int, seed: int) -> float:
    rng = random.Random(seed)
    async with await StreamClient.connect(meta) as client:
        names = await client.list_streams()
        for name in ("events", "event-stats"):
            if name in names:
                await client.delete_stream(name)
        await client.create_stream("events", StreamConfig(partitions=2))
        await client.create_stream("event-stats", StreamConfig(partitions=1))
        producer = await client.producer("events")
        started = time.perf_counter()
        futures = []
        for i in range(events):
            user = f"user-{rng.randrange(50)}"
            event = {"user": user, "action": rng.choice(ACTIONS),
                     "amount": round(rng.uniform(1, 100), 2), "n": i}
            futures.append(await producer.send_async(json.dumps(event).encode(), key=user,
                                                     properties={"source": "example"}))
        await asyncio.gather(*futures)
        await producer.close()
        return time.perf_counter() - started


async def drop_bookie_copies(meta: list[str]) -> list[int]:
    """What the nodes' trimmer does once the deletion lag has passed."""
    async with await StreamClient.connect(meta) as client:
        return (await client.trim("events")).offloaded_copies_deleted


async def read_stats(meta: list[str]) -> list[dict[str, object]]:
    async with await StreamClient.connect(meta) as client:
        rows = []
        async with await client.reader("event-stats", "earliest") as reader:
            while (message := await reader.read_next(1000)) is not None:
                rows.append(json.loads(message.value))
        return rows


def spark_job(meta: list[str], parquet: Path) -> tuple[int, float, int, str]:
    from pyspark.sql import functions as F  # noqa: N812

    from quorumlog.spark import local_session, offload, read_stream

    spark = local_session("local[2]", "quorumlog-example")
    try:
        started = time.perf_counter()
        # The JVM reader when the jar was built (scripts/setup.sh with a JDK),
        # else the Python source: the same rows (docs/spark.md).
        events = read_stream(spark, meta=",".join(meta), stream="events")
        schema = "user string, action string, amount double, n long"
        parsed = events.select(F.from_json(F.col("value").cast("string"), schema).alias("e"),
                               "publish_time").select("e.*", "publish_time")
        stats = (parsed.groupBy("action")
                 .agg(F.count("*").alias("events"), F.countDistinct("user").alias("users"),
                      F.round(F.sum("amount"), 2).alias("amount"),
                      F.min("publish_time").alias("first_seen"))
                 .orderBy("action"))
        stats.cache()
        stats.write.mode("overwrite").parquet(str(parquet))
        (stats.select(F.col("action").alias("key"),
                      F.to_json(F.struct("action", "events", "users", "amount")).alias("value"))
         .write.format("quorumlog").option("meta", ",".join(meta))
         .option("stream", "event-stats").mode("append").save())
        count = events.count()
        elapsed = time.perf_counter() - started
        print("\naggregate (Spark, written to Parquet and to the stream 'event-stats'):")
        stats.show(truncate=False)
        back = spark.read.parquet(str(parquet)).count()
        print(f"Parquet at {parquet}: {back} rows")
        result = offload(spark, meta, "events", str(parquet.parent / "tier"), deletion_lag_ms=0)
        dropped = rpc.run(drop_bookie_copies(meta))
        again = (spark.read.format("quorumlog").option("meta", ",".join(meta))
                 .option("stream", "events").load().count())
        summary = (f"   {result.offloaded} ledgers ({result.entries} entries, "
                   f"{result.file_bytes:,} bytes of Parquet) under {result.target};\n"
                   f"   {len(dropped)} bookie copies deleted; Spark read {again} events "
                   "from the files")
        return count, elapsed, again, summary
    finally:
        spark.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--dir", type=Path, default=Path(".quorumlog/example-cluster"))
    parser.add_argument("--out", type=Path, default=Path(".quorumlog/example-output"))
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    configure("WARNING")
    if shutil.which("java") is None:
        print("Spark needs Java 17+ (apt-get install openjdk-17-jre-headless)", file=sys.stderr)
        return 1
    print(f"1. starting a local cluster of 3 nodes in {args.dir} ...")
    if (args.dir / "cluster.json").exists():
        cluster.down(args.dir)
    shutil.rmtree(args.dir, ignore_errors=True)
    started = time.perf_counter()
    nodes = cluster.up(args.dir, 3)
    meta = cluster.meta_addresses(args.dir)
    print(f"   {len(nodes)} nodes up in {time.perf_counter() - started:.1f} s; meta {meta}")
    try:
        print(f"2. producing {args.events} events to stream 'events' (2 partitions) ...")
        seconds = rpc.run(produce(meta, args.events, args.seed))
        print(f"   {args.events} events durable in {seconds:.2f} s "
              f"({args.events / seconds:,.0f} events/s)")
        print("3. Spark: read 'events', aggregate per action, write 'event-stats' + Parquet ...")
        parquet = (args.out / "event-stats.parquet").resolve()
        count, elapsed, offloaded_count, offload_summary = spark_job(meta, parquet)
        print(f"   Spark read {count} events and wrote the aggregate in {elapsed:.1f} s")
        stats = rpc.run(read_stats(meta))
        print("4. stream 'event-stats' read back with a stream reader:")
        for row in stats:
            print(f"   {row}")
        if sum(int(row["events"]) for row in stats) != args.events:  # type: ignore[call-overload]
            print("ERROR: the aggregate does not add up to the events produced", file=sys.stderr)
            return 1
        print("5. tiered storage (in the same Spark session): the closed ledgers of 'events' "
              "offloaded to Parquet,\n   the bookies' copies deleted, 'events' read again:")
        print(offload_summary)
        if offloaded_count != args.events:
            print(f"ERROR: {offloaded_count} events read after the offload, not {args.events}",
                  file=sys.stderr)
            return 1
        print(f"done: {args.events} events -> {len(stats)} aggregate rows in 'event-stats' "
              f"and {parquet}")
        return 0
    finally:
        if args.keep:
            print(f"cluster left running in {args.dir} (quorumlog down --dir {args.dir})")
        else:
            cluster.down(args.dir)


if __name__ == "__main__":
    sys.exit(main())
