"""Duplication lag and its cost on the source's writes, one run.

Two local clusters on 127.0.0.1 (3 node processes each: meta, bookie, table;
cluster ids 1 and 2; ``quorumlog.node.up``), tables of 8 partitions x 3
replicas on both. The same closed-loop load (``--clients`` asyncio tasks
setting 100-byte values on 1,000 hash keys, ``TableClient.set``) runs for
``--seconds`` against table ``base`` (no duplication: the baseline) and
table ``dupd`` (duplicated to the other cluster), alternately, ``--repeats``
times. During the ``dupd`` runs every partition's ``lag_ms`` (the age of the
oldest applied write its leader's shipper has not had confirmed, as the
shipper last wrote it to meta) is sampled every 100 ms; after each run the
time until every partition's pending decrees are 0 is the drain time.

Printed: ops/s of both tables and their ratio (dupd/base), lag p50/p99 over
the samples, the drain time, and last::

    TARGET dup_lag_p99_ms: <ms> (< 1000) ok|MISS
    TARGET dup_write_cost_ratio: <ratio> (>= 0.8) ok|MISS

Targets are reported, not enforced. Run::

    ./scripts/uv run --frozen python bench/dup_bench.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

from quorumlog import node as cluster
from quorumlog.table import TableClient

PARTITIONS = 8
KEYS = 1_000
VALUE = b"v" * 100
LAG_SAMPLE_INTERVAL_S = 0.1
DRAIN_DEADLINE_S = 120.0
LAG_P99_TARGET_MS = 1_000
COST_RATIO_TARGET = 0.8


def addresses_toml(addresses: list[str]) -> str:
    return "[" + ", ".join(f'"{a}"' for a in addresses) + "]"


async def closed_loop(client: TableClient, table: str, clients: int, seconds: float) -> float:
    """Sets per second from ``clients`` tasks over ``seconds``."""
    done = 0
    stop_at = time.monotonic() + seconds

    async def task(index: int) -> None:
        nonlocal done
        i = index
        while time.monotonic() < stop_at:
            await client.set(table, b"k%d" % (i % KEYS), b"", VALUE)
            done += 1
            i += clients

    start = time.monotonic()
    await asyncio.gather(*(task(i) for i in range(clients)))
    return done / (time.monotonic() - start)


async def sample_lag(client: TableClient, dup_id: int, stop: asyncio.Event,
                     samples: list[int]) -> None:
    while not stop.is_set():
        progress = await client.dup_progress("dupd", dup_id)
        samples.extend(p.lag_ms for p in progress.values())
        await asyncio.sleep(LAG_SAMPLE_INTERVAL_S)


async def drain_s(client: TableClient, dup_id: int) -> float:
    start = time.monotonic()
    while True:
        progress = await client.dup_progress("dupd", dup_id)
        if all(p.pending_decrees == 0 for p in progress.values()):
            return time.monotonic() - start
        if time.monotonic() - start > DRAIN_DEADLINE_S:
            return float("inf")
        await asyncio.sleep(LAG_SAMPLE_INTERVAL_S)


def percentile(values: list[int], fraction: float) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]) if ordered else 0.0


async def measure(one: list[str], two: list[str], args: argparse.Namespace) -> int:
    async with TableClient(one) as source, TableClient(two) as remote:
        await source.create_table("base", partitions=PARTITIONS, replicas=3)
        await source.create_table("dupd", partitions=PARTITIONS, replicas=3)
        await remote.create_table("dupd", partitions=PARTITIONS, replicas=3)
        dup = await source.add_dup("dupd", "two")
        base_rates, dup_rates, samples, drains = [], [], [], []
        for _ in range(args.repeats):
            base_rates.append(await closed_loop(source, "base", args.clients, args.seconds))
            stop = asyncio.Event()
            sampler = asyncio.create_task(sample_lag(source, dup.dup_id, stop, samples))
            dup_rates.append(await closed_loop(source, "dupd", args.clients, args.seconds))
            stop.set()
            await sampler
            drains.append(await drain_s(source, dup.dup_id))
    base, dupd = statistics.median(base_rates), statistics.median(dup_rates)
    ratio = dupd / base if base else 0.0
    p50, p99 = percentile(samples, 0.5), percentile(samples, 0.99)
    print(f"sets/s without duplication: {base:,.0f}; with: {dupd:,.0f}; ratio {ratio:.2f} "
          f"({args.clients} clients, {args.seconds:.0f} s, median of {args.repeats})")
    print(f"lag_ms over {len(samples)} samples: p50 {p50:.0f}, p99 {p99:.0f}; drain after "
          f"the run: {', '.join(f'{d:.1f} s' for d in drains)}")
    print(f"TARGET dup_lag_p99_ms: {p99:.0f} (< {LAG_P99_TARGET_MS}) "
          f"{'ok' if p99 < LAG_P99_TARGET_MS else 'MISS'}")
    print(f"TARGET dup_write_cost_ratio: {ratio:.2f} (>= {COST_RATIO_TARGET}) "
          f"{'ok' if ratio >= COST_RATIO_TARGET else 'MISS'}")
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 repeat of 5 s")
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.repeats = 5.0, 1
    with tempfile.TemporaryDirectory(prefix="dup-bench-") as root:
        one_dir, two_dir = Path(root) / "one", Path(root) / "two"
        try:
            with mock.patch.dict(os.environ, {"QUORUMLOG_TABLE__CLUSTER_ID": "2"}):
                cluster.up(two_dir, 3)
            two = cluster.meta_addresses(two_dir)
            with mock.patch.dict(os.environ, {"QUORUMLOG_TABLE__CLUSTER_ID": "1",
                              "QUORUMLOG_CLUSTERS__TWO": addresses_toml(two)}):
                cluster.up(one_dir, 3)
            return asyncio.run(measure(cluster.meta_addresses(one_dir), two, args))
        finally:
            cluster.down(one_dir)
            cluster.down(two_dir)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
