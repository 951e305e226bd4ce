"""Tiered storage: offloading a stream's closed ledgers to Parquet against the
raw disk, and reading the stream back from the files against the bookies.

Setup, all on 127.0.0.1 in one temporary directory: ``quorumlog up`` with 3
node processes (the background trimmer off). A batched producer writes
``--mib`` MiB of 1 KiB random (incompressible) messages to a stream of one
partition (ledgers E/Qw/Qa 2/2/2, rolled over at 8 MiB); the producer is
closed, so every ledger is closed.

Measured in the same run:

* read from the bookies: a ``Reader`` from "earliest" to the end (MiB/s of
  message values);
* offload: ``StreamClient.offload`` (in this process, 4 ledgers at a time:
  each read from the bookies, written to Parquet, read back and checked,
  then committed), MiB/s of entry payloads;
* the raw disk's sequential write + fsync rate of as many bytes, in the same
  directory (the baseline of the offload rate);
* read from Parquet: the same ``Reader`` again, now reading every ledger from
  its file (the baseline: the read from the bookies).

Printed: the rates and two ratios, last::

    RATIO offload_vs_disk: <offload MiB/s / disk MiB/s>
    RATIO read_parquet_vs_bookies: <Parquet read MiB/s / bookie read MiB/s>

No issue sets a target for these; they are reported, not enforced.

Run::

    ./scripts/uv run --frozen python bench/offload_bench.py [--quick] [--mib N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import disk_write_rate

BENCH = "offload_bench"
MESSAGE_BYTES = 1024
LEDGER_BYTES = 8 * 1024 * 1024
READ_WAIT_MS = 2000


async def read_everything(client: object, stream: str, messages: int) -> tuple[int, float]:
    """(value bytes, seconds) of reading ``messages`` messages from "earliest"."""
    started = time.perf_counter()
    size = count = 0
    async with await client.reader(stream, "earliest") as reader:  # type: ignore[attr-defined]
        while count < messages:
            batch = await reader.read_batch(READ_WAIT_MS)
            if not batch:
                raise SystemExit(f"{BENCH}: the stream ended at {count} of {messages} messages")
            count += len(batch)
            size += sum(len(message.value) for message in batch)
    return size, time.perf_counter() - started


async def scenario(meta: list[str], root: Path, total_bytes: int) -> dict[str, float]:
    from quorumlog.stream import ProducerConfig, RolloverPolicy, StreamClient, StreamConfig

    messages = max(1, total_bytes // MESSAGE_BYTES)
    async with await StreamClient.connect(meta) as client:
        await client.create_stream("bench", StreamConfig(
            partitions=1, rollover=RolloverPolicy(max_bytes=LEDGER_BYTES, min_time_ms=0)))
        producer = await client.producer("bench", config=ProducerConfig(batch_delay_ms=5))
        rng = random.Random(17)  # every message different: nothing for zstd to share
        started = time.perf_counter()
        pending = []
        for _ in range(messages):
            pending.append(await producer.send_async(rng.randbytes(MESSAGE_BYTES)))
            if len(pending) >= 4096:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
        await producer.close()
        print(f"wrote {messages:,} messages of {MESSAGE_BYTES} B in "
              f"{time.perf_counter() - started:.1f} s", flush=True)

        bookie_bytes, bookie_s = await read_everything(client, "bench", messages)
        started = time.perf_counter()
        outcomes = await client.offload("bench", str(root / "tier"))
        offload_s = time.perf_counter() - started
        failed = [o for o in outcomes if o.status != "offloaded"]
        if failed:
            raise SystemExit(f"{BENCH}: not offloaded: {failed}")
        parquet_bytes, parquet_s = await read_everything(client, "bench", messages)
        assert parquet_bytes == bookie_bytes
    return {"ledgers": float(len(outcomes)),
            "payload": float(sum(o.payload_bytes for o in outcomes)),
            "files": float(sum(o.file_bytes for o in outcomes)),
            "offload_s": offload_s, "values": float(bookie_bytes),
            "bookie_s": bookie_s, "parquet_s": parquet_s}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="64 MiB (about a minute)")
    p.add_argument("--mib", type=int, default=256, help="MiB of messages written (256)")
    args = p.parse_args(argv)
    if args.quick:
        args.mib = 64
    if args.mib < 1:
        p.error("--mib must be >= 1")
    from quorumlog import node as cluster
    from quorumlog import rpc

    os.environ["QUORUMLOG_TRIMMER__ENABLED"] = "false"  # the node processes inherit it
    with tempfile.TemporaryDirectory(prefix="offload-bench-") as tmp:
        root = Path(tmp)
        with cluster.running(root / "cluster", 3) as meta:
            result = rpc.run(scenario(meta, root, args.mib * 2**20))
        disk = disk_write_rate(root, int(result["payload"]))
    mib = 2**20
    offload_rate = result["payload"] / result["offload_s"]
    bookie_rate = result["values"] / result["bookie_s"]
    parquet_rate = result["values"] / result["parquet_s"]
    print(f"offload: {result['ledgers']:.0f} ledgers, {result['payload'] / mib:.1f} MiB of "
          f"entries in {result['offload_s']:.1f} s = {offload_rate / mib:.1f} MiB/s "
          f"(Parquet files {result['files'] / mib:.1f} MiB); raw disk write+fsync "
          f"{disk / mib:.1f} MiB/s")
    print(f"read the stream: from the bookies {bookie_rate / mib:.1f} MiB/s "
          f"({result['bookie_s']:.1f} s), from Parquet {parquet_rate / mib:.1f} MiB/s "
          f"({result['parquet_s']:.1f} s)")
    print(f"RATIO offload_vs_disk: {offload_rate / disk:.3f}")
    print(f"RATIO read_parquet_vs_bookies: {parquet_rate / bookie_rate:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
