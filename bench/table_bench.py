"""quorumlog tables (3 table nodes, 8 partitions) against etcd (3 members), one run.

Workload: sets and gets of a 100-byte value on keys drawn uniformly from
1,000, from 64 and 256 concurrent clients. Both systems are driven by the
same closed-loop load generator (``bench/_loadgen.py``): N asyncio tasks on
one uvloop loop in this process, each sending one request and waiting for the
answer before the next, every latency recorded. A run stops after
``--seconds`` or ``--max-ops`` requests, whichever comes first, after a short
warm-up. Before the gets, every key is written once, so every get finds its
value.

Systems, all on 127.0.0.1, data directories in one temporary directory:

* **table**: ``quorumlog.node.up(dir, 3)`` (3 node processes with the meta,
  bookie and table roles, default config), one table of 8 partitions x 3
  replicas in ``--copysets`` Raft groups (1 by default: one copyset holding the
  8 partitions in one RocksDB state machine; ``--copysets 8``: one group per
  partition), WAL fdatasync per ready pass. Clients: ``TableClient.set`` /
  ``get`` (the key is the hash key, the sort key empty; gets are linearizable
  reads at the group's leader), one TableClient shared by up to ``--tasks-per-client`` tasks.
* **etcd**: 3 ``etcd`` 3.4 members started as ``bench/meta_vs_etcd.py`` does
  (installed with apt-get when missing), default fsync, through its HTTP/JSON
  gateway with aiohttp, to the leader: ``/v3/kv/put`` and ``/v3/kv/range``
  (linearizable, etcd's default).

Printed: per system, operation and concurrency, ops/s and p50/p99 (ms), the
median of ``--repeats`` runs; ratios table/etcd; and last one line per target::

    TARGET table_set_vs_etcd_put: <ratio> (>= 3.0) ok|MISS

(the smallest set/put ratio over 64 and 256 clients). Targets are reported,
not enforced.

Run::

    ./scripts/uv run --frozen python bench/table_bench.py [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import statistics
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from _loadgen import KEY_NAMES, VALUE, VALUE_BYTES, Put, RunResult, measure
from meta_vs_etcd import (
    REQUEST_TIMEOUT_S,
    EtcdSystem,
    QuorumlogSystem,
    SetupError,
    ensure_etcd,
)

BENCH = "table_bench"
CONCURRENCIES = (64, 256)
PARTITIONS = 8
# The 8 partitions live in one copyset: with 3 nodes and 3 replicas every group
# has the same members, and a group's Raft costs are per entry (docs/table.md,
# "Partitions and copysets"); --copysets 8 runs one group per partition.
COPYSETS = 1
TABLE = "bench"
OPERATIONS = ("set", "get")
TARGETS = {  # name: (operation, ratio table/etcd at least, at every concurrency)
    "table_set_vs_etcd_put": ("set", 3.0),
}
PRELOAD_CLIENTS = 32

Close = Callable[[], Awaitable[None]]
Ops = dict[str, Put]


class TableSystem(QuorumlogSystem):
    """The same 3-node local cluster as the meta benchmark's, with a table of
    PARTITIONS partitions in ``copysets`` Raft groups."""

    name = "table"

    def __init__(self, tasks_per_client: int, copysets: int) -> None:
        super().__init__(tasks_per_client)
        self.copysets = copysets

    def start(self, root: Path) -> None:
        from quorumlog.table import BlockingTableClient

        super().start(root)
        with BlockingTableClient(self.addresses) as tables:
            tables.create_table(TABLE, partitions=PARTITIONS, replicas=3,
                                copysets=self.copysets)

    async def connect(self, clients: int) -> tuple[Ops, Close]:  # type: ignore[override]
        from quorumlog.table import TableClient

        per = self.tasks_per_client
        tables = [TableClient(self.addresses) for _ in range(math.ceil(clients / per))]

        async def set_(index: int, key: str, value: bytes) -> object:
            await tables[index // per].set(TABLE, key.encode(), b"", value)
            return None

        async def get(index: int, key: str, value: bytes) -> object:
            found = await tables[index // per].get(TABLE, key.encode(), b"")
            if found != value:
                raise RuntimeError(f"table get {key}: {found!r}")
            return found

        async def close() -> None:
            await asyncio.gather(*(t.close() for t in tables), return_exceptions=True)

        return {"set": set_, "get": get}, close


class EtcdKv:
    """EtcdSystem's members, with gets (``/v3/kv/range``) besides its puts."""

    name = "etcd"

    def __init__(self, binary: str) -> None:
        self.etcd = EtcdSystem(binary)

    def start(self, root: Path) -> None:
        self.etcd.start(root)

    def stop(self) -> None:
        self.etcd.stop()

    def pids(self) -> list[int]:
        return self.etcd.pids()

    async def connect(self, clients: int) -> tuple[Ops, Close]:
        import aiohttp

        put, close_put = await self.etcd.connect(clients)
        url = self.etcd.leader_url + "/v3/kv/range"
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=clients, limit_per_host=clients),
            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
            headers={"Content-Type": "application/json"},
        )
        expected = base64.b64encode(VALUE).decode()

        async def get(index: int, key: str, value: bytes) -> object:
            body = f'{{"key":"{base64.b64encode(key.encode()).decode()}"}}'
            async with session.post(url, data=body.encode()) as response:
                payload = await response.read()
                if response.status != 200:
                    raise RuntimeError(f"etcd range: HTTP {response.status}: {payload[:200]!r}")
            kvs = json.loads(payload).get("kvs") or [{}]
            if kvs[0].get("value") != expected:
                raise RuntimeError(f"etcd range {key}: {payload[:200]!r}")
            return payload

        async def close() -> None:
            await session.close()
            await close_put()

        return {"set": put, "get": get}, close


async def preload(ops: Ops) -> None:
    """Write every key once, so that every get finds its value."""
    keys = iter(KEY_NAMES)

    async def worker(index: int) -> None:
        for key in keys:
            await ops["set"](index, key, VALUE)

    await asyncio.gather(*(worker(i) for i in range(PRELOAD_CLIENTS)))


async def run_all(args: argparse.Namespace, systems: list[Any]) -> list[RunResult]:
    results: list[RunResult] = []
    for repeat in range(args.repeats):
        # Alternate the order per repeat, so drift hits both systems alike.
        for system in systems if repeat % 2 == 0 else systems[::-1]:
            ops, close = await system.connect(max(CONCURRENCIES))
            try:
                await preload(ops)
                for operation in OPERATIONS:
                    for clients in CONCURRENCIES:
                        label = "put" if system.name == "etcd" and operation == "set" else operation
                        result = await measure(
                            f"{system.name} {label}", ops[operation], clients=clients,
                            max_ops=args.max_ops, max_seconds=args.seconds,
                            warmup_ops=args.warmup_ops, server_pids=system.pids(),
                            seed=repeat + 1)
                        print(f"  {result.system:10} {clients:4} clients: "
                              f"{result.rate:9.0f} ops/s  p99 {result.percentile_ms(99):7.2f} ms"
                              f"  errors {result.errors}", flush=True)
                        results.append(result)
            finally:
                await close()
    return results


def summarize(results: list[RunResult]) -> dict[tuple[str, int], dict[str, float]]:
    """Median over repeats of ops/s, p50 and p99 per (system op, clients)."""
    grouped: dict[tuple[str, int], list[RunResult]] = {}
    for result in results:
        grouped.setdefault((result.system, result.clients), []).append(result)
    return {
        key: {
            "ops_per_s": statistics.median(r.rate for r in runs),
            "p50_ms": statistics.median(r.percentile_ms(50) for r in runs),
            "p99_ms": statistics.median(r.percentile_ms(99) for r in runs),
            "errors": sum(r.errors for r in runs),
        }
        for key, runs in grouped.items()
    }


def report(summary: dict[tuple[str, int], dict[str, float]]) -> tuple[list[str], dict[str, Any]]:
    lines = [f"{'operation':12} {'clients':>7} {'table ops/s':>12} {'p50 ms':>8} "
             f"{'p99 ms':>8} {'etcd ops/s':>11} {'p50 ms':>8} {'p99 ms':>8} {'ratio':>6}"]
    ratios: dict[str, float] = {}
    for operation in OPERATIONS:
        etcd_name = "put" if operation == "set" else "get"
        for clients in CONCURRENCIES:
            table = summary[(f"table {operation}", clients)]
            etcd = summary[(f"etcd {etcd_name}", clients)]
            ratio = table["ops_per_s"] / etcd["ops_per_s"] if etcd["ops_per_s"] else math.inf
            ratios[f"{operation}@{clients}"] = ratio
            lines.append(
                f"{operation + '/' + etcd_name:12} {clients:7} {table['ops_per_s']:12.0f} "
                f"{table['p50_ms']:8.2f} {table['p99_ms']:8.2f} {etcd['ops_per_s']:11.0f} "
                f"{etcd['p50_ms']:8.2f} {etcd['p99_ms']:8.2f} {ratio:6.2f}")
    targets = {}
    for name, (operation, minimum) in TARGETS.items():
        worst = min(ratios[f"{operation}@{c}"] for c in CONCURRENCIES)
        targets[name] = {"ratio": round(worst, 3), "minimum": minimum, "ok": worst >= minimum}
    return lines, {"ratios": ratios, "targets": targets}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="short runs, 1 repeat (< 2 minutes)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seconds", type=float, default=10.0, help="per run (bounded)")
    p.add_argument("--max-ops", type=int, default=100_000, help="per run (bounded)")
    p.add_argument("--warmup-ops", type=int, default=500)
    p.add_argument("--tasks-per-client", type=int, default=16)
    p.add_argument("--copysets", type=int, default=COPYSETS,
                   help=f"Raft groups holding the {PARTITIONS} partitions (default "
                        f"{COPYSETS}; {PARTITIONS}: one group per partition)")
    p.add_argument("--etcd", default=None, help="the etcd binary (default: from PATH)")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.seconds, args.max_ops, args.warmup_ops = 1, 4.0, 20_000, 200
    if args.repeats < 1 or args.seconds <= 0 or args.max_ops < 1 or args.tasks_per_client < 1:
        p.error("--repeats, --seconds, --max-ops and --tasks-per-client must be positive")
    if not 1 <= args.copysets <= PARTITIONS:
        p.error(f"--copysets must be in 1..{PARTITIONS}")
    return args


def main(argv: list[str]) -> int:
    import uvloop

    args = parse_args(argv)
    try:
        systems: list[Any] = [TableSystem(args.tasks_per_client, args.copysets),
                              EtcdKv(ensure_etcd(args.etcd))]
    except SetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="table-bench-") as root:
        started: list[Any] = []
        try:
            for system in systems:
                print(f"starting {system.name} ...", flush=True)
                system.start(Path(root))
                started.append(system)
            results = uvloop.run(run_all(args, systems))
        except SetupError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        finally:
            for system in started:
                system.stop()
    lines, outcome = report(summarize(results))
    print(f"\n{BENCH}: {VALUE_BYTES}-byte values, {len(KEY_NAMES)} keys, {PARTITIONS} "
          f"partitions in {args.copysets} Raft group(s) (copysets) x 3 replicas, etcd 3 "
          f"members; median of {args.repeats} run(s)")
    print("\n".join(lines))
    if args.json is not None:
        args.json.write_text(json.dumps({
            "bench": BENCH, "args": {k: str(v) for k, v in vars(args).items()},
            "runs": [r.summary() for r in results], **outcome}, indent=2))
    for name, target in outcome["targets"].items():
        verdict = "ok" if target["ok"] else "MISS"
        print(f"TARGET {name}: {target['ratio']:.2f} (>= {target['minimum']}) {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
