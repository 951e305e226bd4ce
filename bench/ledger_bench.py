"""The ledger client on a local cluster: appends, latency, tailing, recovery.

Setup: ``quorumlog up``-style cluster of 3 node processes on 127.0.0.1 (meta
and a bookie on each; the bookie journal fsyncs every group commit), and
this process as the client (``LedgerClient`` on uvloop).

Cases, for (E, Qw, Qa) = (3, 3, 2) and (3, 2, 2):

* **appends**: 100 B, 1 KiB and 64 KiB entries, with 1 append outstanding
  (each awaited) and with many outstanding (``append_async`` up to a window):
  appends/s, MB/s, p50/p99 of append -> confirmed, and this process's CPU
  time per append (``time.process_time``: the client's own cost, which
  does not depend on how loaded the machine is the way wall time does);
* **latency at half rate** (3,2,2), 1 KiB: appends sent open-loop at half the
  rate the many-outstanding case reached; p50/p99;
* **tail latency** (3,2,2), 1 KiB: a writer appends open-loop, a reader in the
  same process follows with ``wait_for_entry`` (long polls); p50/p99 of
  append called -> entry seen by the reader;
* **recovery**: a writer sends 1,000 entries at once (all carry LAC -1, so
  the bookies know no LAC), is aborted, and ``open_ledger(recovery=True)``
  fences, reads and rewrites all 1,000 and closes: seconds.

Baselines in the same run: one bookie's add rate (raw ``AddEntryRequest``\\ s
over one rpc connection, ``send_nowait`` with a window, no ledger client), the
same bookie's rate for raw batches of 64 (``AddEntriesRequest``, 256 entries
in flight: what the ledger client's batching can reach per bookie), and
etcd puts of the same size (3 members, HTTP gateway; only when ``etcd`` is on
PATH). Targets from the issue (reported, not enforced): >= 50,000 appends/s
of 1 KiB at (3,2,2); p99 <= 10 ms at half that rate; recovery of 1,000
unconfirmed entries <= 1 s.

Run: ``./scripts/uv run --frozen python bench/ledger_bench.py [--quick]
[--json out.json] [--markdown out.md] [--no-etcd]``. ``--quick`` finishes in
about a minute. Every loop is bounded by a count and a time budget.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # meta_vs_etcd's own imports
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console
from rich.table import Table

from quorumlog import node as cluster
from quorumlog import rpc
from quorumlog.ledger import DigestType, LedgerClient, LedgerClientConfig
from quorumlog.log import configure
from quorumlog.proto import AddEntriesRequest, AddEntryRequest, encode_entry

KIB = 1024
SHAPES = ((3, 3, 2), (3, 2, 2))
SIZES = (100, KIB, 64 * KIB)
CASE_BUDGET_S = 20.0  # wall-clock bound of one measurement
PASSWORD = b"bench"
console = Console(width=200)
now = time.perf_counter  # uvloop's loop.time() has millisecond resolution


@dataclass(slots=True)
class Row:
    case: str
    shape: str
    size: str
    outstanding: str
    rate_per_s: float
    mb_per_s: float
    p50_ms: float | None
    p99_ms: float | None
    count: int
    note: str = ""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _stopwatch(latencies: list[float], sent: float) -> Callable[[Any], None]:
    def done(_: Any) -> None:
        latencies.append(now() - sent)

    return done


def _size_name(size: int) -> str:
    return f"{size // KIB} KiB" if size >= KIB else f"{size} B"


# ----- ledger cases -----------------------------------------------------------------


async def appends(client: LedgerClient, shape: tuple[int, int, int], size: int,
                  outstanding: int, count: int) -> Row:
    """Closed loop: ``outstanding`` appends in flight; latency = append -> confirmed."""
    handle = await client.create_ledger(*shape, password=PASSWORD)
    data = os.urandom(size)
    await handle.append(data)  # connections open
    latencies: list[float] = []
    in_flight: list[asyncio.Future[int]] = []
    deadline = now() + CASE_BUDGET_S
    start = now()
    cpu_start = time.process_time()
    done = 0
    for _ in range(count):
        if now() > deadline:
            break
        sent = now()
        future = handle.append_async(data)
        future.add_done_callback(_stopwatch(latencies, sent))
        in_flight.append(future)
        if len(in_flight) >= outstanding:
            await in_flight[0]
            in_flight = [f for f in in_flight if not f.done()]
        done += 1
    await asyncio.gather(*in_flight)
    took = now() - start
    cpu_us = (time.process_time() - cpu_start) / max(done, 1) * 1e6
    await handle.close()
    return Row("appends", _shape(shape), _size_name(size), str(outstanding), done / took,
               done * size / took / 1e6, percentile(latencies, 0.5) * 1000,
               percentile(latencies, 0.99) * 1000, done,
               note=f"client CPU {cpu_us:.1f} us/append")


async def open_loop(client: LedgerClient, shape: tuple[int, int, int], size: int,
                    rate: float, count: int, *, tail: bool) -> Row:
    """Appends sent at ``rate``/s; latency to confirmation, or (``tail``) to a
    long-polling reader in this process seeing the entry."""
    handle = await client.create_ledger(*shape, password=PASSWORD)
    data = os.urandom(size)
    sent_at: dict[int, float] = {}
    latencies: list[float] = []
    futures: list[asyncio.Future[int]] = []
    reader_task = None
    if tail:
        reader = await client.open_ledger(handle.id, password=PASSWORD, recovery=False)

        async def follow() -> None:
            after = -1
            while after < count - 1:
                entry = await reader.wait_for_entry(after=after, timeout_ms=1000)
                if entry is None:
                    continue
                latencies.append(now() - sent_at[entry.entry_id])
                after = entry.entry_id

        reader_task = asyncio.ensure_future(follow())
    tick_s = 0.001
    per_tick = max(1, round(rate * tick_s))
    start = now()
    deadline = start + CASE_BUDGET_S
    sent = 0
    while sent < count and now() < deadline:
        due = start + sent / rate
        if due > now():
            await asyncio.sleep(due - now())
        for _ in range(min(per_tick, count - sent)):
            entry_id = sent
            sent_at[entry_id] = now()
            future = handle.append_async(data)
            if not tail:
                future.add_done_callback(_stopwatch(latencies, sent_at[entry_id]))
            futures.append(future)
            sent += 1
    await asyncio.gather(*futures)
    took = now() - start
    if reader_task is not None:
        await asyncio.wait_for(reader_task, CASE_BUDGET_S)
    await handle.close()
    case = "tail (append -> reader)" if tail else "latency at half rate"
    return Row(case, _shape(shape), _size_name(size), f"{rate:,.0f}/s open loop",
               sent / took, sent * size / took / 1e6, percentile(latencies, 0.5) * 1000,
               percentile(latencies, 0.99) * 1000, sent)


async def recovery(addresses: list[str], shape: tuple[int, int, int], entries: int) -> Row:
    """Seconds to recover a ledger whose ``entries`` entries no bookie knows as confirmed."""
    config = LedgerClientConfig(explicit_lac_interval_ms=0)
    async with LedgerClient.connect(addresses, config=config) as writer:
        handle = await writer.create_ledger(*shape, password=PASSWORD)
        await asyncio.gather(*(handle.append_async(os.urandom(KIB)) for _ in range(entries)))
        await handle.abort()  # no close, no explicit LAC: a crashed writer
    async with LedgerClient.connect(addresses) as client:
        start = time.perf_counter()
        recovered = await client.open_ledger(handle.id, password=PASSWORD)
        took = time.perf_counter() - start
    if recovered.last_add_confirmed != entries - 1:
        raise RuntimeError(f"recovered {recovered.last_add_confirmed}, wrote {entries - 1}")
    return Row("recovery of unconfirmed entries", _shape(shape), "1 KiB", f"{entries}",
               entries / took, 0.0, None, None, entries, note=f"{took:.3f} s")


def _shape(shape: tuple[int, int, int]) -> str:
    return "({},{},{})".format(*shape)


# ----- baselines ----------------------------------------------------------------------


async def single_bookie(address: str, size: int, window: int, count: int) -> Row:
    """Raw adds to one bookie: one connection, ``send_nowait`` up to ``window``."""
    connection = await rpc.connect(*_host_port(address))
    ledger_id = random.randrange(10**12, 10**13)
    key = b"bench-master-key"
    payload = os.urandom(size)
    envelopes = [encode_entry(ledger_id, i, i - 1, payload, digest=DigestType.CRC32C)
                 for i in range(count)]
    latencies: list[float] = []
    in_flight: list[asyncio.Future[Any]] = []
    start = now()
    deadline = start + CASE_BUDGET_S
    done = 0
    try:
        for i, envelope in enumerate(envelopes):
            if now() > deadline:
                break
            while len(in_flight) >= window:
                await in_flight[0]
                in_flight = [f for f in in_flight if not f.done()]
            sent = now()
            future = connection.send_nowait(
                AddEntryRequest(ledger_id=ledger_id, entry_id=i, master_key=key),
                payload=envelope, timeout_s=30)
            future.add_done_callback(_stopwatch(latencies, sent))
            in_flight.append(future)
            done += 1
        await asyncio.gather(*in_flight)
    finally:
        await connection.close()
    took = now() - start
    return Row("baseline: one bookie, raw adds", "1 bookie", _size_name(size), str(window),
               done / took, done * size / took / 1e6, percentile(latencies, 0.5) * 1000,
               percentile(latencies, 0.99) * 1000, done)


BATCH_BASELINE_ENTRIES = 64
"""Entries per AddEntriesRequest in the batched baseline (a writer with 256
outstanding at (3,2,2) sends each bookie batches of about this size)."""


async def single_bookie_batched(address: str, size: int, window: int, count: int, *,
                                per_batch: int = BATCH_BASELINE_ENTRIES) -> Row:
    """Raw batches of adds to one bookie: ``AddEntriesRequest``\\ s of
    ``per_batch`` entries, up to ``window`` entries in flight."""
    connection = await rpc.connect(*_host_port(address))
    ledger_id = random.randrange(10**12, 10**13)
    key = b"bench-master-key"
    payload = os.urandom(size)
    envelopes = [encode_entry(ledger_id, i, i - 1, payload, digest=DigestType.CRC32C)
                 for i in range(count)]
    latencies: list[float] = []
    in_flight: list[asyncio.Future[Any]] = []
    start = now()
    deadline = start + CASE_BUDGET_S
    done = 0
    try:
        for first in range(0, count, per_batch):
            if now() > deadline:
                break
            while len(in_flight) * per_batch >= window:
                await in_flight[0]
                in_flight = [f for f in in_flight if not f.done()]
            batch = envelopes[first:first + per_batch]
            sent = now()
            future = connection.send_nowait(
                AddEntriesRequest(ledger_id=ledger_id,
                                  entry_ids=list(range(first, first + len(batch))),
                                  sizes=[len(e) for e in batch], master_key=key),
                payload=b"".join(batch), timeout_s=30)
            future.add_done_callback(_stopwatch(latencies, sent))
            in_flight.append(future)
            done += len(batch)
        results = await asyncio.gather(*in_flight)
        if any(code for response, _ in results for code in response.codes):
            raise RuntimeError("the bookie refused entries of a batched baseline")
    finally:
        await connection.close()
    took = now() - start
    return Row("baseline: one bookie, raw batched adds", "1 bookie", _size_name(size),
               f"{window} ({per_batch}/batch)", done / took, done * size / took / 1e6,
               percentile(latencies, 0.5) * 1000, percentile(latencies, 0.99) * 1000, done)


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


async def etcd_puts(root: Path, size: int, clients: int, count: int) -> Row | None:
    if shutil.which("etcd") is None:
        return None
    from bench.meta_vs_etcd import EtcdSystem

    system = EtcdSystem(shutil.which("etcd") or "etcd")
    await asyncio.to_thread(system.start, root)
    try:
        put, close = await system.connect(clients)
        value = os.urandom(size)
        latencies: list[float] = []
        counter = iter(range(count))
        deadline = now() + CASE_BUDGET_S

        async def worker(index: int) -> None:
            for n in counter:
                if now() > deadline:
                    return
                sent = now()
                await put(index, f"/bench/{n % 1000}", value)
                latencies.append(now() - sent)

        start = now()
        await asyncio.gather(*(worker(i) for i in range(clients)))
        took = now() - start
        await close()
    finally:
        await asyncio.to_thread(system.stop)
    done = len(latencies)
    return Row("baseline: etcd puts", f"etcd {system.version or '3.x'} x3",
               _size_name(size), f"{clients} clients", done / took, done * size / took / 1e6,
               percentile(latencies, 0.5) * 1000, percentile(latencies, 0.99) * 1000, done)


# ----- driver -------------------------------------------------------------------------


async def run_all(args: argparse.Namespace, directory: Path) -> list[Row]:
    quick = args.quick
    addresses = cluster.meta_addresses(directory)
    rows: list[Row] = []

    def note(row: Row) -> Row:
        rows.append(row)
        p = "" if row.p99_ms is None else f" p50 {row.p50_ms:.2f} ms p99 {row.p99_ms:.2f} ms"
        console.print(f"  {row.case} {row.shape} {row.size} x{row.outstanding}: "
                      f"{row.rate_per_s:,.0f}/s {row.mb_per_s:,.1f} MB/s{p} {row.note}")
        return row

    async with LedgerClient.connect(addresses) as client:
        bookies = list((await client.create_ledger(3, 3, 3)).metadata.current_ensemble)
        for size in SIZES:
            window = 256 if size < 64 * KIB else 32
            count = (6_000 if quick else 40_000) if size < 64 * KIB else (
                600 if quick else 4_000)
            note(await single_bookie(bookies[0], size, window, count))
        note(await single_bookie_batched(bookies[0], KIB, 256, 6_000 if quick else 40_000))
        peak: dict[tuple[tuple[int, int, int], int], float] = {}
        for shape in SHAPES:
            for size in SIZES:
                small = size < 64 * KIB
                note(await appends(client, shape, size, 1, 300 if quick else 2_000))
                many = 256 if small else 32
                count = (6_000 if quick else 40_000) if small else (600 if quick else 4_000)
                row = note(await appends(client, shape, size, many, count))
                peak[(shape, size)] = row.rate_per_s
        half = peak[((3, 2, 2), KIB)] / 2
        note(await open_loop(client, (3, 2, 2), KIB, half, 3_000 if quick else 20_000,
                             tail=False))
        note(await open_loop(client, (3, 2, 2), KIB, 1_000, 1_000 if quick else 5_000,
                             tail=True))
        note(await open_loop(client, (3, 2, 2), KIB, half, 3_000 if quick else 20_000,
                             tail=True))
    for shape in SHAPES:
        note(await recovery(addresses, shape, 1_000))
    if not args.no_etcd:
        etcd_root = directory.parent / "etcd"
        for clients in (1, 64):
            etcd = await etcd_puts(etcd_root / str(clients), KIB, clients,
                                   500 if quick else (3_000 if clients == 1 else 20_000))
            if etcd is None:
                console.print("  etcd is not on PATH: no etcd baseline")
                break
            note(etcd)
    return rows


def print_table(rows: list[Row]) -> None:
    table = Table(title="ledger benchmark")
    for column in ("case", "E,Qw,Qa", "entry", "outstanding", "ops/s", "MB/s", "p50 ms",
                   "p99 ms", "note"):
        table.add_column(column, justify="left" if column in ("case", "note") else "right")
    for r in rows:
        table.add_row(r.case, r.shape, r.size, r.outstanding, f"{r.rate_per_s:,.0f}",
                      f"{r.mb_per_s:,.1f}", _ms(r.p50_ms), _ms(r.p99_ms), r.note)
    console.print(table)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def verdicts(rows: list[Row]) -> list[str]:
    out = []
    many = [r for r in rows if r.case == "appends" and r.shape == "(3,2,2)"
            and r.size == "1 KiB" and r.outstanding != "1"]
    bookie = [r for r in rows if r.case == "baseline: one bookie, raw adds" and r.size == "1 KiB"]
    batched = [r for r in rows if r.case == "baseline: one bookie, raw batched adds"]
    if many:
        rate = many[0].rate_per_s
        ratio = (f" ({rate / bookie[0].rate_per_s:.2f} x one bookie's raw add rate"
                 if bookie else "")
        if bookie and batched:
            ratio += f", {rate / batched[0].rate_per_s:.2f} x its raw batched add rate"
        ratio += ")" if bookie else ""
        out.append(f"1 KiB appends at (3,2,2): {rate:,.0f}/s{ratio}; target >= 50,000/s: "
                   + ("met" if rate >= 50_000 else "NOT met"))
    half = [r for r in rows if r.case == "latency at half rate"]
    if half and half[0].p99_ms is not None:
        out.append(f"p99 at half that rate: {half[0].p99_ms:.2f} ms; target <= 10 ms: "
                   + ("met" if half[0].p99_ms <= 10 else "NOT met"))
    for r in rows:
        if r.case.startswith("recovery"):
            took = float(r.note.split()[0])
            out.append(f"recovery of 1,000 unconfirmed entries {r.shape}: {took:.3f} s; "
                       "target <= 1 s: " + ("met" if took <= 1 else "NOT met"))
    return out


def markdown(rows: list[Row], lines: list[str], meta: dict[str, Any]) -> str:
    out = [f"Ledger benchmark ({meta['when']}, {meta['machine']}, "
           f"{'quick' if meta['quick'] else 'full'} run)", "",
           "| case | E,Qw,Qa | entry | outstanding | ops/s | MB/s | p50 ms | p99 ms | note |",
           "|---|---|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        out.append(f"| {r.case} | {r.shape} | {r.size} | {r.outstanding} | "
                   f"{r.rate_per_s:,.0f} | {r.mb_per_s:,.1f} | {_ms(r.p50_ms)} | "
                   f"{_ms(r.p99_ms)} | {r.note} |")
    out += ["", *[f"- {line}" for line in lines]]
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="ledger_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small counts (about a minute)")
    parser.add_argument("--json", type=Path, help="write the rows as JSON here")
    parser.add_argument("--markdown", type=Path, help="write a Markdown table here")
    parser.add_argument("--no-etcd", action="store_true", help="skip the etcd baseline")
    args = parser.parse_args(argv)
    configure("WARNING")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ledger-bench-", dir=os.environ.get("TMPDIR")) as tmp:
        directory = Path(tmp) / "cluster"
        console.print(f"starting 3 nodes in {directory} ...")
        cluster.up(directory, 3)
        try:
            rows = rpc.run(run_all(args, directory))
        finally:
            with contextlib.suppress(Exception):
                cluster.down(directory)
    lines = verdicts(rows)
    print_table(rows)
    for line in lines:
        console.print(line)
    meta = {"when": time.strftime("%Y-%m-%d %H:%M"), "quick": args.quick,
            "machine": f"{platform.python_implementation()} {platform.python_version()}, "
                       f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
            "seconds": round(time.monotonic() - started, 1)}
    console.print(f"done in {meta['seconds']} s ({meta['machine']})")
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows],
                                         "verdicts": lines}, indent=2))
    if args.markdown:
        args.markdown.write_text(markdown(rows, lines, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

