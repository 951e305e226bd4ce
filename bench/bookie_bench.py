"""Benchmark of one bookie over 127.0.0.1, driven from a separate process.

The bookie runs in a child process (``run_bookie``, no meta: no registration,
no GC deletions) with its journal and ledger directories on the same disk as
the baseline. This process is the client: one rpc connection, adds pipelined
with ``send_nowait`` up to a window, each add an entry envelope
(``encode_entry``, CRC32C) built before the clock starts.

Cases:

* **adds, 100 B / 1 KiB / 64 KiB** (``WINDOW`` = 1000 in flight): adds/s or
  MB/s of entry envelopes, with the journal's batching observed on the bookie
  (records per fdatasync). The baseline, measured in the same run, is a
  Python loop of ``os.write`` of one batch of the same record sizes (joined) +
  ``os.fdatasync`` into a preallocated file, with the batch size the journal
  reached. 64 KiB runs twice: a burst that fits in the write cache (the
  journal path alone) and a sustained run during which flushes write every
  byte a second time, to entry logs on the same disk. Targets: 100 B >=
  100,000 adds/s; 64 KiB burst >= 0.70 of the baseline's MB/s.
* **latency at half the peak**: 100 B adds sent open-loop at half the rate
  measured for the 100 B case; p50/p99 of the add round trip. Target p99 <= 10 ms.
* **reads, 1 KiB**: pipelined single-entry reads from the write cache (just
  added, no flush), the read cache (flushed, then read twice sequentially so
  read-ahead fills the cache), and entry logs with cold bookie caches (bookie
  restarted, random order; the OS page cache is not dropped).

Every loop is bounded by a count and by a time budget. ``--quick`` uses small
counts and one repeat (under a minute). Run:
``./scripts/uv run --frozen python -m bench.bookie_bench [--quick]``.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import Harness, Sample
from quorumlog import rpc
from quorumlog.bookie import BookieConfig, local_config, run_bookie
from quorumlog.ledger import DigestType
from quorumlog.log import configure
from quorumlog.node._process import tune_for_bookie
from quorumlog.proto import (
    AddEntryRequest,
    BookieStatusRequest,
    ReadEntryRequest,
    encode_entry,
)

KIB = 1024
MIB = 1024 * KIB
KEY = b"bench-master-key"
LEDGERS = 4
WINDOW = 1000  # adds in flight
READ_WINDOW = 128
TIME_BUDGET_S = 20.0
QUICK_TIME_BUDGET_S = 4.0
START_TIMEOUT_S = 60.0
BACKPRESSURE_RETRY_S = 0.0005
ENVELOPE_OVERHEAD_BYTES = 33  # envelope header (29) + CRC32C digest (4)


def bookie_config(directory: Path, *, flush_interval_ms: int) -> BookieConfig:
    config = local_config(directory)
    if flush_interval_ms:
        config = config.replace(flush_interval_ms=flush_interval_ms)
    storage = config.storage.replace(write_cache_max_bytes=1024 * MIB,
                                     read_cache_max_bytes=256 * MIB,
                                     entry_log_max_bytes=512 * MIB)
    return config.replace(storage=storage)


# ----------------------------------------------------------------- bookie process


async def serve(directory: Path, flush_interval_ms: int) -> None:
    config = bookie_config(directory, flush_interval_ms=flush_interval_ms)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with run_bookie(config) as bookie:
        gc.freeze()
        sys.stdout.write(f"ready {bookie.address}\n")
        sys.stdout.flush()
        await stop.wait()


def serve_main(directory: Path, flush_interval_ms: int) -> None:
    """The bookie process. $BOOKIE_BENCH_DEBUG=1: debug logs (flush timings) on
    stderr; $BOOKIE_BENCH_PROFILE=path: a cProfile of the event loop thread."""
    tune_for_bookie()  # as a node process with the bookie role does
    if os.environ.get("BOOKIE_BENCH_DEBUG"):
        configure("DEBUG")
    profile_path = os.environ.get("BOOKIE_BENCH_PROFILE")
    if not profile_path:
        rpc.run(serve(directory, flush_interval_ms))
        return
    import cProfile

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        rpc.run(serve(directory, flush_interval_ms))
    finally:
        profiler.disable()
        profiler.dump_stats(profile_path)


class BookieProcess:
    def __init__(self, directory: Path, *, flush_interval_ms: int = 0) -> None:
        """``flush_interval_ms`` 0: the default of BookieConfig."""
        env = dict(os.environ, MALLOC_TRIM_THRESHOLD_="268435456")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.bookie_bench", "--serve", str(directory),
             str(flush_interval_ms)],
            stdout=subprocess.PIPE, text=True, env=env,
            cwd=Path(__file__).resolve().parent.parent)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        if not line or line[0] != "ready":
            self.proc.kill()
            raise RuntimeError(f"bookie did not start: {line}")
        self.address = line[1]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        assert self.proc.stdout is not None
        self.proc.stdout.close()


async def connect(address: str) -> rpc.Connection:
    host, port = address.rsplit(":", 1)
    return await rpc.connect(host, int(port), config=rpc.RpcConfig(max_in_flight_requests=4096))


# ----------------------------------------------------------------- client loops


@dataclass(slots=True)
class AddRun:
    adds: int
    seconds: float
    envelope_bytes: int
    latencies_s: list[float]
    records_per_fsync: float

    def percentile_ms(self, q: float) -> float:
        ordered = sorted(self.latencies_s)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else 0.0


def envelopes(first_entry: int, count: int, entry_bytes: int) -> list[tuple[int, int, bytes]]:
    data = os.urandom(entry_bytes)
    out = []
    for i in range(first_entry, first_entry + count):
        ledger_id, entry_id = i % LEDGERS + 1, i // LEDGERS
        out.append((ledger_id, entry_id,
                    encode_entry(ledger_id, entry_id, entry_id - 1, data,
                                 digest=DigestType.CRC32C)))
    return out


async def read_sources(address: str) -> dict[str, int]:
    """Where the bookie served reads from so far (its storage counters)."""
    conn = await connect(address)
    stats = (await conn.call(BookieStatusRequest())).stats
    await conn.close()
    return {"write cache": stats["storage_write_cache_hits"],
            "read cache": stats["storage_read_cache_hits"],
            "entry logs": stats["storage_entry_log_reads"]}


async def journal_counts(conn: rpc.Connection) -> tuple[int, int]:
    stats = (await conn.call(BookieStatusRequest())).stats
    return stats["journal_records"], stats["journal_fsyncs"]


async def pipelined_adds(address: str, entries: list[tuple[int, int, bytes]], *,
                         window: int = WINDOW, rate_per_s: float | None = None,
                         budget_s: float) -> AddRun:
    """Adds with up to ``window`` in flight (or open-loop at ``rate_per_s``)."""
    conn = await connect(address)
    loop = asyncio.get_running_loop()
    records_before, fsyncs_before = await journal_counts(conn)
    latencies: list[float] = []
    done = loop.create_future()
    state = {"next": 0, "in_flight": 0, "errors": 0}
    clock = time.perf_counter
    start = clock()

    def on_done(sent: float, future: asyncio.Future[Any]) -> None:
        state["in_flight"] -= 1
        if future.exception() is not None:
            state["errors"] += 1
        latencies.append(clock() - sent)
        if rate_per_s is None:
            pump()
        elif state["next"] >= len(entries) and state["in_flight"] == 0 and not done.done():
            done.set_result(None)

    def send() -> bool:
        ledger_id, entry_id, envelope = entries[state["next"]]
        sent = clock()
        try:
            future = conn.send_nowait(
                AddEntryRequest(ledger_id=ledger_id, entry_id=entry_id, master_key=KEY),
                payload=envelope, timeout_s=60)
        except rpc.BackpressureError:  # the socket buffer is full: retry shortly
            loop.call_later(BACKPRESSURE_RETRY_S, pump)
            return False
        state["next"] += 1
        state["in_flight"] += 1
        future.add_done_callback(functools.partial(on_done, sent))
        return True

    def pump() -> None:
        out_of_time = clock() - start > budget_s
        while state["in_flight"] < window and state["next"] < len(entries) and not out_of_time:
            if not send():
                return
        if state["in_flight"] == 0 and not done.done():
            done.set_result(None)

    if rate_per_s is None:
        pump()
    else:
        interval = 1.0 / rate_per_s
        while state["next"] < len(entries) and clock() - start < budget_s:
            due = start + state["next"] * interval
            while state["next"] < len(entries) and due <= clock():
                if not send():
                    break
                due = start + state["next"] * interval
            await asyncio.sleep(max(0.0, due - clock()))
        if state["in_flight"] == 0:
            done.set_result(None)
    await done
    seconds = clock() - start
    records_after, fsyncs_after = await journal_counts(conn)
    await conn.close()
    if state["errors"]:
        raise RuntimeError(f"{state['errors']} adds failed")
    sent_entries = entries[: state["next"]]
    fsyncs = max(1, fsyncs_after - fsyncs_before)
    return AddRun(adds=len(sent_entries), seconds=seconds,
                  envelope_bytes=sum(len(e[2]) for e in sent_entries), latencies_s=latencies,
                  records_per_fsync=(records_after - records_before) / fsyncs)


async def pipelined_reads(address: str, keys: list[tuple[int, int]], *, budget_s: float) -> int:
    conn = await connect(address)
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    state = {"next": 0, "in_flight": 0, "errors": 0, "done": 0}
    start = time.perf_counter()

    def on_done(future: asyncio.Future[Any]) -> None:
        state["in_flight"] -= 1
        state["done"] += 1
        if future.exception() is not None:
            state["errors"] += 1
        pump()

    def pump() -> None:
        out_of_time = time.perf_counter() - start > budget_s
        while (state["in_flight"] < READ_WINDOW and state["next"] < len(keys)
               and not out_of_time):
            ledger_id, entry_id = keys[state["next"]]
            state["next"] += 1
            state["in_flight"] += 1
            conn.send_nowait(ReadEntryRequest(ledger_id=ledger_id, entry_id=entry_id),
                             timeout_s=60).add_done_callback(on_done)
        if state["in_flight"] == 0 and not done.done():
            done.set_result(None)

    pump()
    await done
    await conn.close()
    if state["errors"]:
        raise RuntimeError(f"{state['errors']} reads failed")
    return state["done"]


# ----------------------------------------------------------------- baseline


def raw_disk_baseline(directory: Path, record_bytes: int, batch_records: int,
                      total_records: int, budget_s: float) -> Sample:
    """os.write of ``batch_records`` records joined + os.fdatasync, preallocated file."""
    path = directory / "baseline.dat"
    size = record_bytes * total_records + MIB
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.posix_fallocate(fd, 0, size)
        os.fsync(fd)
        records = [os.urandom(record_bytes)] * batch_records
        done = 0
        start = time.perf_counter()
        while done < total_records and time.perf_counter() - start < budget_s:
            batch = b"".join(records[: min(batch_records, total_records - done)])
            view = memoryview(batch)
            while view:
                view = view[os.write(fd, view):]
            os.fdatasync(fd)
            done += min(batch_records, total_records - done)
        seconds = time.perf_counter() - start
    finally:
        os.close(fd)
        path.unlink()
    return Sample(units=done, seconds=seconds)


# ----------------------------------------------------------------- cases


class Bench:
    def __init__(self, h: Harness, root: Path) -> None:
        self.h = h
        self.root = root
        self.budget_s = QUICK_TIME_BUDGET_S if h.quick else TIME_BUDGET_S
        self.runs = 0
        self.observed: dict[str, AddRun] = {}

    def fresh_bookie(self, **kwargs: int) -> tuple[BookieProcess, Path]:
        self.runs += 1
        directory = self.root / f"bookie-{self.runs}"
        return BookieProcess(directory, **kwargs), directory

    def add_workload(self, name: str, entry_bytes: int, count: int, *,
                     in_bytes: bool, flush_interval_ms: int = 0) -> Callable[[], Sample]:
        def run() -> Sample:
            bookie, directory = self.fresh_bookie(flush_interval_ms=flush_interval_ms)
            try:
                entries = envelopes(0, count, entry_bytes)
                result = rpc.run(pipelined_adds(bookie.address, entries,
                                                budget_s=self.budget_s))
            finally:
                bookie.stop()
                shutil.rmtree(directory, ignore_errors=True)
            self.observed[name] = result
            units = result.envelope_bytes if in_bytes else result.adds
            return Sample(units=units, seconds=result.seconds)

        return run

    def baseline(self, name: str, entry_bytes: int, count: int, *,
                 in_bytes: bool) -> Callable[[], Sample]:
        def run() -> Sample:
            observed = self.observed.get(name)
            batch = max(1, round(observed.records_per_fsync)) if observed else WINDOW
            record = entry_bytes + ENVELOPE_OVERHEAD_BYTES
            sample = raw_disk_baseline(self.root, record, batch, count, self.budget_s)
            if in_bytes:
                return Sample(units=sample.units * record, seconds=sample.seconds)
            return sample

        return run

    def adds(self, name: str, entry_bytes: int, count: int, *, in_bytes: bool,
             target_ratio: float | None, note: str, flush_interval_ms: int = 0) -> AddRun:
        workload = self.add_workload(name, entry_bytes, count, in_bytes=in_bytes,
                                     flush_interval_ms=flush_interval_ms)
        workload()  # learn the journal's batching first, so the first baseline copies it
        unit = "MB/s" if in_bytes else "adds/s"
        self.h.case(f"{name}, {unit}", unit=unit, workload=workload,
                    baseline=self.baseline(name, entry_bytes, count, in_bytes=in_bytes),
                    target_ratio=target_ratio, scale=1e-6 if in_bytes else 1.0, note=note)
        observed = self.observed[name]
        self.h.console.print(
            f"    {name}: {observed.adds / observed.seconds:,.0f} adds/s = "
            f"{observed.envelope_bytes / observed.seconds / 1e6:,.1f} MB/s, "
            f"{observed.records_per_fsync:,.1f} records per fdatasync, "
            f"p50 {observed.percentile_ms(0.50):.2f} ms, p99 {observed.percentile_ms(0.99):.2f} ms")
        self.derived(f"{name}: p99 latency ({WINDOW} in flight)", "ms",
                     observed.percentile_ms(0.99))
        return observed

    def derived(self, name: str, unit: str, value: float, *, target: float | None = None,
                higher_is_better: bool = True) -> None:
        """A row computed from a measured run (one value, optionally against a target)."""
        self.h.case(name, unit=unit, workload=lambda: Sample(units=value, seconds=1.0),
                    baseline=(lambda: Sample(units=target, seconds=1.0)) if target else None,
                    target_ratio=1.0 if target else None, higher_is_better=higher_is_better)

    def half_peak_latency(self, peak: AddRun, count: int) -> None:
        rate = peak.adds / peak.seconds / 2
        bookie, directory = self.fresh_bookie()
        try:
            entries = envelopes(0, count, 100)
            result = rpc.run(pipelined_adds(bookie.address, entries, window=4096,
                                            rate_per_s=rate, budget_s=self.budget_s))
        finally:
            bookie.stop()
            shutil.rmtree(directory, ignore_errors=True)
        self.h.console.print(
            f"    100 B at {rate:,.0f} adds/s (half of peak): achieved "
            f"{result.adds / result.seconds:,.0f} adds/s, p50 {result.percentile_ms(0.5):.2f} "
            f"ms, p99 {result.percentile_ms(0.99):.2f} ms")
        self.derived("add 100 B at half peak: p50", "ms", result.percentile_ms(0.50))
        self.derived("add 100 B at half peak: p99 (target <= 10 ms)", "ms",
                     result.percentile_ms(0.99), target=10.0, higher_is_better=False)

    def reads(self, count: int) -> None:
        entries = envelopes(0, count, KIB)
        keys = [(lid, eid) for lid, eid, _ in entries]
        shuffled = random.Random(5).sample(keys, len(keys))
        directory = self.root / "reads"
        # Write cache: a long flush interval keeps every entry there.
        bookie = BookieProcess(directory, flush_interval_ms=600_000)
        try:
            rpc.run(pipelined_adds(bookie.address, entries, budget_s=self.budget_s))
            self.read_case("read 1 KiB from the write cache", bookie.address, shuffled)
        finally:
            bookie.stop()  # closing flushes to the entry logs
        bookie = BookieProcess(directory, flush_interval_ms=600_000)
        try:
            rpc.run(pipelined_reads(bookie.address, keys, budget_s=self.budget_s))  # fill
            self.read_case("read 1 KiB from the read cache", bookie.address, keys)
        finally:
            bookie.stop()
        bookie = BookieProcess(directory, flush_interval_ms=600_000)
        try:
            self.read_case("read 1 KiB from entry logs (cold bookie caches)", bookie.address,
                           shuffled, repeatable=False)
        finally:
            bookie.stop()

    def read_case(self, name: str, address: str, keys: list[tuple[int, int]],
                  repeatable: bool = True) -> None:
        def run() -> Sample:
            before = rpc.run(read_sources(address))
            start = time.perf_counter()
            done = rpc.run(pipelined_reads(address, keys, budget_s=self.budget_s))
            seconds = time.perf_counter() - start
            after = rpc.run(read_sources(address))
            served = {k: after[k] - before[k] for k in after}
            self.h.console.print(f"    {name}: served from {served}")
            return Sample(units=done, seconds=seconds)

        if repeatable:
            self.h.case(name, unit="reads/s", workload=run, baseline=None)
        else:  # a second pass would hit the read cache: one run only
            sample = run()
            self.h.case(name, unit="reads/s", workload=lambda: sample, baseline=None)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    configure("WARNING")
    if args and args[0] == "--serve":
        serve_main(Path(args[1]), int(args[2]))
        return 0
    h = Harness("bookie", args)
    quick = h.quick
    counts = {"small": 60_000 if quick else 300_000, "kib": 40_000 if quick else 200_000,
              "burst": 3_000, "sustained": 8_000 if quick else 40_000,
              "reads": 20_000 if quick else 100_000}
    same = "baseline: os.write + os.fdatasync of the same record sizes and batch sizes"
    with tempfile.TemporaryDirectory(prefix="bookie-bench-") as tmp:
        bench = Bench(h, Path(tmp))
        small = bench.adds("add 100 B", 100, counts["small"], in_bytes=False,
                           target_ratio=None, note=same)
        bench.derived("add 100 B: adds/s vs the 100,000 target", "adds/s",
                      small.adds / small.seconds, target=100_000)
        # Before the 64 KiB runs: their writeback would slow fdatasyncs here.
        bench.half_peak_latency(small, counts["small"] // 2)
        bench.adds("add 1 KiB", KIB, counts["kib"], in_bytes=False, target_ratio=None,
                   note=same)
        bench.reads(counts["reads"])
        bench.adds("add 64 KiB, burst within the write cache", 64 * KIB, counts["burst"],
                   in_bytes=True, target_ratio=0.70, note=same, flush_interval_ms=600_000)
        bench.adds("add 64 KiB, sustained (flushes share the disk)", 64 * KIB,
                   counts["sustained"], in_bytes=True, target_ratio=None,
                   note=same + "; the bookie also writes every byte to entry logs")
        return h.finish()


if __name__ == "__main__":
    sys.exit(main())
