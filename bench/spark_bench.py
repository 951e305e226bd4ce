"""Streams and the Spark data source on a local cluster: a benchmark, not a test.

Measured in one run, on a fresh local cluster (3 node processes on 127.0.0.1):

1. producer throughput: messages of 100 B sent pipelined, one entry per
   message (``--batching`` packs them), until durable;
2. end-to-end latency at half the peak rate: a producer paced at peak/2 and a
   tailing reader; send -> durable (ack) and send -> received, p50 / p99;
3. Spark batch read of every entry of the stream (``local[2]``, Arrow batches
   built column-wise from the bookies' buffers) against reading the same rows
   from Parquet files in the same run, for a stream of one message per entry
   and for one filled by the batching producer (issue 17's targets: one per
   entry >= 0.5 of Parquet; batched >= 1M rows/s). Both are forced through
   Spark's ``noop`` sink, so every column is materialized. Each stream is read
   twice: through the Python source (``format("quorumlog")``) and, when the
   session has ``jvm/build/quorumlog-spark.jar``, through the JVM reader
   (``quorumlog.spark.read_stream``). The last lines are
   ``TARGET name (reader): value (goal) ok|MISS``.

    ./scripts/uv run --frozen python bench/spark_bench.py            # 1M entries
    ./scripts/uv run --frozen python bench/spark_bench.py --quick    # 100k, short
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from quorumlog import node as cluster
from quorumlog import rpc
from quorumlog.log import configure
from quorumlog.stream import ProducerConfig, RolloverPolicy, StreamClient, StreamConfig

VALUE_BYTES = 100
SEND_WINDOW = 5000  # pipelined sends in flight while filling


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def fill(meta: list[str], stream: str, count: int, batching: bool) -> float:
    """Send ``count`` messages of 100 B; returns messages/s until all durable."""
    async with await StreamClient.connect(meta) as client:
        await client.create_stream(stream, StreamConfig(
            partitions=2, rollover=RolloverPolicy(max_entries=100_000, min_time_ms=0)))
        producer = await client.producer(stream, config=ProducerConfig(
            batching=batching, pending_messages_max=SEND_WINDOW))
        value = b"x" * VALUE_BYTES
        started = time.perf_counter()
        futures = []
        for i in range(count):
            futures.append(await producer.send_async(value, key=b"%d" % (i % 1024)))
            if len(futures) >= SEND_WINDOW:
                await asyncio.gather(*futures)
                futures.clear()
        await asyncio.gather(*futures)
        elapsed = time.perf_counter() - started
        await producer.close()
        return count / elapsed


async def latency(meta: list[str], rate_per_s: float, seconds: float
                  ) -> tuple[list[float], list[float]]:
    """(send->ack ms, send->receive ms) for a producer paced at ``rate_per_s``."""
    async with await StreamClient.connect(meta) as client:
        await client.create_stream("latency", StreamConfig(partitions=1))
        producer = await client.producer("latency")
        reader = await client.reader("latency", "latest")
        sent: dict[bytes, float] = {}
        acks: list[float] = []
        e2e: list[float] = []
        total = max(1, int(rate_per_s * seconds))

        async def receive() -> None:
            while len(e2e) < total:
                batch = await reader.read_batch(5000)
                if not batch:
                    return
                now = time.perf_counter()
                e2e.extend((now - sent[m.value[:16]]) * 1000 for m in batch)

        async def on_ack(start: float, future: asyncio.Future[object]) -> None:
            await future
            acks.append((time.perf_counter() - start) * 1000)

        receiver = asyncio.create_task(receive())
        await asyncio.sleep(0.2)
        interval = 1.0 / rate_per_s
        started = time.perf_counter()
        pending = []
        for i in range(total):
            target = started + i * interval
            delay = target - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tag = b"%016d" % i
            now = time.perf_counter()
            sent[tag] = now
            future = await producer.send_async(tag + b"x" * (VALUE_BYTES - 16))
            pending.append(asyncio.create_task(on_ack(now, future)))
        await asyncio.gather(*pending)
        await asyncio.wait_for(receiver, 30)
        await reader.close()
        await producer.close()
        return acks, e2e


CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
GROUPS = ("nodes", "jvm", "python")


def _proc_stat(pid: int) -> tuple[int, float, float] | None:
    """(parent pid, own CPU s, CPU s of reaped children) of a process, from /proc."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # after "pid (comm) "
    utime, stime, cutime, cstime = (int(v) for v in fields[11:15])
    return (int(fields[1]), (utime + stime) / CLOCK_TICKS_PER_S,
            (cutime + cstime) / CLOCK_TICKS_PER_S)


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _proc_stat(int(entry))
            if stat is not None:
                tree.setdefault(stat[0], []).append(int(entry))
    return tree


def cpu_seconds(node_pids: list[int]) -> dict[str, float]:
    """CPU seconds so far of the three process groups of a read: the node
    processes (bookie + meta), Spark's JVM (a child of this process) and
    Spark's Python workers (the JVM's descendants, with their reaped children)."""
    tree = _children()
    out = dict.fromkeys(GROUPS, 0.0)
    for pid in node_pids:
        stat = _proc_stat(pid)
        out["nodes"] += stat[1] if stat else 0.0
    for jvm in tree.get(os.getpid(), []):
        stat = _proc_stat(jvm)
        if stat is None or "java" not in Path(f"/proc/{jvm}/comm").read_text(errors="replace"):
            continue
        out["jvm"] += stat[1]
        stack = list(tree.get(jvm, []))
        while stack:
            pid = stack.pop()
            child = _proc_stat(pid)
            if child is not None:
                out["python"] += child[1] + child[2]
                stack += tree.get(pid, [])
    return out


def spark_read(meta: list[str], streams: list[str], rows: int, workdir: Path,
               node_pids: list[int], repeats: int = 2
               ) -> dict[str, tuple[float, float, dict[str, float], float | None]]:
    """Per stream: (seconds to read it through Spark, seconds to read the same
    rows from Parquet, CPU µs per row of each process group in the fastest
    Spark read, seconds to read it with the JVM reader or None without it),
    each the best of ``repeats`` runs into the noop sink."""
    from quorumlog.spark import local_session, read_stream
    from quorumlog.spark._jvm import jvm_available

    spark = local_session("local[2]", "quorumlog-bench",
                          **{"spark.ui.showConsoleProgress": "false"})

    def load(stream: str) -> object:
        return (spark.read.format("quorumlog").option("meta", ",".join(meta))
                .option("stream", stream).load())  # default task sizes, as Parquet's

    def timed(make: object) -> tuple[float, dict[str, float]]:
        best, best_cpu = float("inf"), dict.fromkeys(GROUPS, 0.0)
        for _ in range(repeats):
            before = cpu_seconds(node_pids)
            started = time.perf_counter()
            make().write.format("noop").mode("overwrite").save()  # type: ignore[operator]
            elapsed = time.perf_counter() - started
            after = cpu_seconds(node_pids)
            if elapsed < best:
                best = elapsed
                best_cpu = {g: (after[g] - before[g]) * 1e6 / rows for g in GROUPS}
        return best, best_cpu

    try:
        results = {}
        for stream in streams:
            frame = load(stream)
            parquet = str(workdir / f"{stream}.parquet")
            frame.write.mode("overwrite").parquet(parquet)  # type: ignore[attr-defined]
            counted = frame.count()  # type: ignore[attr-defined]
            assert counted == rows, f"Spark read {counted} rows of {stream}, expected {rows}"
            stream_s, cpu = timed(lambda s=stream: load(s))
            parquet_s, parquet_cpu = timed(lambda p=parquet: spark.read.parquet(p))
            jvm_s: float | None = None
            if jvm_available(spark):
                jvm_frame = read_stream(spark, jvm=True, meta=",".join(meta), stream=stream)
                assert jvm_frame.count() == rows, f"the JVM reader read {stream} short"
                jvm_s, jvm_cpu = timed(lambda s=stream: read_stream(
                    spark, jvm=True, meta=",".join(meta), stream=s))
            print(f"  {stream}: CPU µs/row nodes {cpu['nodes']:.2f}, JVM {cpu['jvm']:.2f}, "
                  f"Python workers {cpu['python']:.2f} (parquet: JVM "
                  f"{parquet_cpu['jvm']:.2f}); load average {os.getloadavg()[0]:.1f}")
            if jvm_s is not None:
                print(f"  {stream}, JVM reader: CPU µs/row nodes {jvm_cpu['nodes']:.2f}, "
                      f"JVM {jvm_cpu['jvm']:.2f}, Python workers {jvm_cpu['python']:.2f}")
            results[stream] = (stream_s, parquet_s, cpu, jvm_s)
        return results
    finally:
        spark.stop()


def target(name: str, value: float, goal: float, shown: str, goal_shown: str) -> str:
    return f"TARGET {name}: {shown} ({goal_shown}) {'ok' if value >= goal else 'MISS'}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100k entries, short latency run")
    parser.add_argument("--entries", type=int, default=0, help="entries to read with Spark")
    parser.add_argument("--batching", action="store_true",
                        help="let the producer pack messages into entries")
    parser.add_argument("--cluster", type=Path, default=None,
                        help="reuse this local cluster (started and filled by an earlier "
                             "--keep run): only the Spark reads run")
    parser.add_argument("--keep", action="store_true",
                        help="leave the cluster running and print its directory")
    parser.add_argument("--repeats", type=int, default=2, help="Spark reads per measure")
    args = parser.parse_args()
    configure("WARNING")
    entries = args.entries or (100_000 if args.quick else 1_000_000)
    keep = args.keep or args.cluster is not None
    workdir = Path(tempfile.mkdtemp(prefix="quorumlog-spark-bench-"))
    directory = args.cluster or (Path(tempfile.mkdtemp(prefix="quorumlog-spark-bench-cluster-"))
                                 if keep else workdir / "cluster")
    if args.cluster is None:
        print(f"starting a local cluster of 3 nodes in {directory} ...")
        cluster.up(directory, 3)
    meta = cluster.meta_addresses(directory)
    try:
        single, batched = ("bench-single", "bench") if args.batching else ("bench",
                                                                           "bench-batched")
        if args.cluster is None:
            produce(meta, entries, 3.0 if args.quick else 10.0, args.batching)
        if shutil.which("java") is None:
            print("no java: skipping the Spark read part")
            return 0
        node_pids = [n.pid for n in cluster.load(directory)]
        result = spark_read(meta, [single, batched], entries, workdir, node_pids,
                            args.repeats)
        lines = []
        for stream, label in ((single, "one message per entry"), (batched, "batched entries")):
            stream_s, parquet_s, _, jvm_s = result[stream]
            stream_rate, parquet_rate = entries / stream_s, entries / parquet_s
            print(f"spark read of {entries} rows, {label}: stream {stream_s:.2f} s "
                  f"({stream_rate:,.0f} rows/s), parquet {parquet_s:.2f} s "
                  f"({parquet_rate:,.0f} rows/s): stream/parquet = "
                  f"{stream_rate / parquet_rate:.2f}")
            if jvm_s is not None:
                print(f"spark read of {entries} rows, {label}, JVM reader (read_stream): "
                      f"{jvm_s:.2f} s ({entries / jvm_s:,.0f} rows/s): stream/parquet = "
                      f"{parquet_s / jvm_s:.2f}")
            for reader, seconds in (("Python source", stream_s), ("JVM reader", jvm_s)):
                if seconds is None:
                    lines.append(f"TARGET ({reader}): not built (jvm/build.sh)")
                    continue
                rate = entries / seconds
                if stream == single:
                    ratio = rate / parquet_rate
                    lines.append(target(f"spark read one message per entry / parquet "
                                        f"({reader})", ratio, 0.5, f"{ratio:.2f}", ">= 0.50"))
                else:
                    lines.append(target(f"spark read batched entries ({reader})", rate,
                                        1_000_000, f"{rate:,.0f} rows/s",
                                        ">= 1,000,000 rows/s"))
        print(f"load average {os.getloadavg()[0]:.1f} (1 min)")
        for line in lines:
            print(line)
        return 0
    finally:
        if keep:
            print(f"cluster left running in {directory} (quorumlog down --dir {directory})")
        else:
            cluster.down(directory)
        shutil.rmtree(workdir, ignore_errors=True)


def produce(meta: list[str], entries: int, latency_s: float, batching: bool) -> None:
    """Fill both streams (the producer and latency lines are about ``batching``)."""
    rate = rpc.run(fill(meta, "bench", entries, batching))
    print(f"producer: {entries} messages of {VALUE_BYTES} B, "
          f"{'batched' if batching else 'one entry each'}: {rate:,.0f} msg/s")
    half = rate / 2
    acks, e2e = rpc.run(latency(meta, half, latency_s))
    print(f"latency at {half:,.0f} msg/s (half of peak), {len(e2e)} messages: "
          f"send->ack p50 {statistics.median(acks):.2f} ms p99 {percentile(acks, 0.99):.2f}"
          f" ms; send->receive p50 {statistics.median(e2e):.2f} ms "
          f"p99 {percentile(e2e, 0.99):.2f} ms (target p99 <= 10 ms)")
    other = "bench-batched" if not batching else "bench-single"
    other_rate = rpc.run(fill(meta, other, entries, not batching))
    print(f"producer, {'batched' if not batching else 'one entry each'} "
          f"(stream {other}): {other_rate:,.0f} msg/s")


if __name__ == "__main__":
    sys.exit(main())
