"""quorumlog against its peers in one run: NATS JetStream and etcd (issue 17).

Every system runs on 127.0.0.1 in one temporary directory (the same disk),
started by this script and stopped at the end, also on Ctrl-C or an error:

* **quorumlog**: ``quorumlog.node.up(dir, 3)`` (3 node processes, meta and a
  bookie on each; the bookie acknowledges an add after its journal's
  fdatasync), through ``bench/meta_vs_etcd.py``'s ``QuorumlogSystem``;
* **NATS JetStream**: 3 Debian ``nats-server`` 2.9 processes as one cluster
  with JetStream, file storage, one stream with 3 replicas (R3); client
  nats-py (the ``bench`` extra) connected to all three;
* **etcd**: 3 Debian ``etcd`` 3.4 members, through ``meta_vs_etcd``'s
  ``EtcdSystem`` (HTTP/JSON gateway, puts to the leader);
* **one bookie** alone (``bench/bookie_bench.py``'s ``BookieProcess``) for the
  bookie add rate.

Workloads (the same on both sides, counts and seconds bounded per case):

1. *appends*: quorumlog ledger appends at (3,2,2) (``ledger_bench.appends``:
   ``append_async`` with a window) vs JetStream publish-with-ack to the R3
   stream; 100 B and 1 KiB; 1 and 256 in flight;
2. *stream produce*: a quorumlog stream (1 partition) producer, not batched
   (one entry per message) and batched (``ProducerConfig(batching=True)``),
   256 and ``WIDE_WINDOW`` messages in flight, vs JetStream publish at the
   same in-flight counts. nats-py has no client-side batching: publishing
   with many acks outstanding is JetStream's batched equivalent;
3. *end to end*: a producer paced open-loop at half of the system's peak
   100 B produce rate and a tailing reader in this process (quorumlog: a
   stream ``Reader``; JetStream: an ordered push consumer); p50/p99 of
   send -> acknowledged and of send -> received, after one acknowledged
   warm-up message on each system (a producer's first message takes its
   partition over, once);
4. *bookie adds*: 100 B adds to one bookie as ``AddEntriesRequest`` batches of
   ``ADD_BATCH_ENTRIES_MAX`` (256) entries, as the ledger client sends them
   (``ledger_bench.single_bookie_batched``);
5. *meta puts* vs etcd puts, 100 B values, at 1, 64 and 256 clients
   (``meta_vs_etcd.run_all``).

Every measured loop, of every system, starts with ``gc.collect(); gc.freeze()``
(``freeze_heap``): the garbage-collector setting docs/stream.md gives a
latency-sensitive producer process, applied alike to the quorumlog and NATS
clients of this process. Acks are timed with one done-callback for every
future (``Window``), so the timing adds no object per message for the
collector.

Durability differs and the table says so: quorumlog acknowledges an add or a
meta put after an fdatasync on a quorum; nats-server 2.9.10 acknowledges an
R3 publish once a quorum appended it to the stream's Raft WAL with write(2)
and fsyncs only from timers (the message store every 2 min, set in
``server/stream.go``; the stream's Raft WAL every 5 min, set in
``server/jetstream_cluster.go``; 2.9 has no option to change them,
``sync_interval`` came in 2.10), so an acknowledged JetStream message is in
the page cache of a quorum of servers, not on disk.

The last lines are one per target of issue 17:
``TARGET name: value (goal) ok|MISS`` (reported, not enforced; the Spark
targets are ``bench/spark_bench.py``'s).

Install the peers first: ``./scripts/setup-bench.sh`` (apt-get
nats-server etcd-server, and the bench extra). Run::

    ./scripts/uv run --frozen --extra bench python bench/peers_bench.py [--quick]
        [--repeats N] [--json out.json] [--markdown out.md] [--keep]

``--quick`` (one repeat, small counts) finishes in under 2 minutes; the
default run takes the median of 3 repeats of every case.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import functools
import gc
import importlib.util
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # meta_vs_etcd's own imports
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console
from rich.table import Table

from _loadgen import cpu_seconds, free_ports
from bench.bookie_bench import BookieProcess
from bench.ledger_bench import appends, single_bookie_batched
from bench.meta_vs_etcd import (
    EtcdSystem,
    QuorumlogSystem,
    SetupError,
    _wait_exit,
    ratios,
    summarize,
)
from bench.meta_vs_etcd import run_all as meta_run_all
from quorumlog import rpc
from quorumlog.errors import invariant
from quorumlog.ledger import LedgerClient
from quorumlog.log import configure
from quorumlog.proto import ADD_BATCH_ENTRIES_MAX
from quorumlog.stream import ProducerConfig, RolloverPolicy, StreamClient, StreamConfig

BENCH = "peers_bench"
KIB = 1024
SIZES = (100, KIB)
WINDOW = 256  # "256 in flight" of the issue
WIDE_WINDOW = 4096  # the batched producer's peak needs more than 256 in flight
SHAPE = (3, 2, 2)
META_CLIENTS = (1, 64, 256)
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
DRAIN_TIMEOUT_S = 30.0  # waiting for acknowledgements after the last send
CASE_BUDGET_S = 8.0  # wall-clock bound of one measured case (default run)
QUICK_CASE_BUDGET_S = 2.0
TICK_S = 0.001  # pacing step of the open-loop producers
TAG_BYTES = 16  # the e2e payload starts with its send index
# The e2e cases send one message first and wait for its ack, outside the counts:
# a quorumlog producer's first message takes its partition over (30-70 ms, once),
# and every paced message queued behind that would otherwise land in the p99.
WARMUP_INDEX = 10**15
JS_STREAM = "PEERS"
JS_SUBJECTS = "peers.>"
DURABLE_QUORUMLOG = "fsync per ack"
DURABLE_META = "fsync per ack"
DURABLE_ETCD = "fsync per ack"
DURABLE_JETSTREAM = "no fsync per write (timer: 2 min store, 5 min WAL)"
DURABILITY_LEGEND = (
    "durability: quorumlog acknowledges a ledger append / stream message after the journal "
    "fdatasync on Qa bookies, a bookie add after its journal group commit's fdatasync, a meta "
    "put after the Raft WAL fdatasync on a majority; etcd 3.4 fsyncs its WAL per commit; "
    "nats-server 2.9.10 (JetStream) acknowledges an R3 publish once a quorum of the stream's "
    "servers appended it to the stream's Raft WAL with write(2), i.e. into the page cache; it "
    "fsyncs from timers only: the stream's message store every 2 min (stream.go sets "
    "SyncInterval 2 min), the stream's Raft WAL every 5 min (jetstream_cluster.go); 2.9 has no "
    "option to change either (sync_interval came in 2.10)."
)
console = Console(width=200)
now = time.perf_counter


@dataclass(slots=True)
class Row:
    system: str
    workload: str
    size: str
    in_flight: str
    ops_per_s: float
    mb_per_s: float
    p50_ms: float | None
    p99_ms: float | None
    durability: str
    count: int = 0
    note: str = ""
    cpu_us_per_op: float | None = None  # this process + the system's server processes


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile, ``q`` in 0..1; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def size_name(size: int) -> str:
    return f"{size // KIB} KiB" if size >= KIB else f"{size} B"


# ------------------------------------------------------------------ load loops


class Window:
    """Futures in flight, at most ``size``; records send -> done latencies.

    One done-callback and one context serve every future (its send time is
    kept by future): a partial per send and the context ``add_done_callback``
    copies would be two objects per message for the garbage collector of this
    process, a load none of the measured systems has of its own.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.in_flight = 0
        self._sent_at: dict[asyncio.Future[Any], float] = {}
        self._context = contextvars.copy_context()
        self.errors = 0
        self.last_error: BaseException | None = None
        self.latencies_s: list[float] = []
        self.room = asyncio.Event()
        self.room.set()
        self.idle = asyncio.Event()
        self.idle.set()

    def track(self, future: asyncio.Future[Any], sent: float) -> None:
        self.in_flight += 1
        self.idle.clear()
        if self.in_flight >= self.size:
            self.room.clear()
        self._sent_at[future] = sent
        future.add_done_callback(self._done, context=self._context)

    def _done(self, future: asyncio.Future[Any]) -> None:
        sent = self._sent_at.pop(future)
        self.in_flight -= 1
        if future.cancelled() or future.exception() is not None:
            self.errors += 1
            self.last_error = None if future.cancelled() else future.exception()
        else:
            self.latencies_s.append(now() - sent)
        if self.in_flight < self.size:
            self.room.set()
        if self.in_flight == 0:
            self.idle.set()

    async def drain(self) -> None:
        await asyncio.wait_for(self.idle.wait(), DRAIN_TIMEOUT_S)
        if self.errors:
            raise RuntimeError(f"{self.errors} sends failed; last: {self.last_error!r}")


Submit = Callable[[int], Awaitable[asyncio.Future[Any]]]


def freeze_heap() -> None:
    """The collector setting docs/stream.md gives latency-sensitive producers,
    applied before every measured loop whatever the system: collect what the
    set-up left, then freeze the survivors out of later collections (a full
    collection of this process's ~45,000 start-up objects takes 10-25 ms on
    the 2-CPU test box and lands in the p99 of whichever client is running)."""
    gc.collect()
    gc.freeze()


async def pipelined(submit: Submit, *, window: int, count: int, budget_s: float
                    ) -> tuple[int, float, list[float]]:
    """Closed loop: up to ``window`` sends in flight; (sent, seconds, latencies)."""
    freeze_heap()
    w = Window(window)
    start = now()
    deadline = start + budget_s
    sent = 0
    while sent < count and now() < deadline:
        await w.room.wait()
        t0 = now()
        w.track(await submit(sent), t0)
        sent += 1
    await w.drain()
    return sent, now() - start, w.latencies_s


async def paced(submit: Submit, *, rate_per_s: float, count: int, budget_s: float
                ) -> tuple[int, float, list[float], dict[int, float]]:
    """Open loop at ``rate_per_s``; (sent, seconds, ack latencies, send time per index)."""
    freeze_heap()
    w = Window(count + 1)
    sent_at: dict[int, float] = {}
    start = now()
    deadline = start + budget_s
    sent = 0
    while sent < count and now() < deadline:
        due = start + sent / rate_per_s
        if due > now():
            await asyncio.sleep(due - now())
        while sent < count and start + sent / rate_per_s <= now():
            t0 = now()
            sent_at[sent] = t0
            w.track(await submit(sent), t0)
            sent += 1
    await w.drain()
    return sent, now() - start, w.latencies_s, sent_at


def tagged(index: int, size: int) -> bytes:
    return b"%016d" % index + b"x" * (size - TAG_BYTES)


# ------------------------------------------------------------------ NATS JetStream


def nats_binary() -> str:
    if importlib.util.find_spec("nats") is None:
        raise SetupError("nats-py is not installed: run ./scripts/setup-bench.sh (the bench "
                         "extra), or run this with ./scripts/uv run --frozen --extra bench")
    found = shutil.which("nats-server")
    if found is None:
        raise SetupError("nats-server is not installed: run ./scripts/setup-bench.sh "
                         "(apt-get install nats-server)")
    return found


class JetStreamCluster:
    """3 nats-server processes on 127.0.0.1 as one JetStream cluster."""

    name = "JetStream"

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.procs: list[subprocess.Popen[bytes]] = []
        self.urls: list[str] = []
        self.version = ""

    def start(self, root: Path) -> None:
        ports = free_ports(6)
        self.urls = [f"nats://127.0.0.1:{p}" for p in ports[:3]]
        routes = ", ".join(f'"nats-route://127.0.0.1:{p}"' for p in ports[3:])
        base = root / "nats"
        base.mkdir(parents=True, exist_ok=True)
        for i in range(3):
            name = f"n{i + 1}"
            config = base / f"{name}.conf"
            config.write_text(
                f'server_name: "{name}"\nlisten: "127.0.0.1:{ports[i]}"\n'
                f'jetstream {{ store_dir: "{base / name}" }}\n'
                f'cluster {{ name: "peers-bench"\n  listen: "127.0.0.1:{ports[3 + i]}"\n'
                f"  routes: [{routes}] }}\n")
            with (base / f"{name}.log").open("ab") as log:
                self.procs.append(subprocess.Popen(
                    [self.binary, "-c", str(config)], stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, start_new_session=True))
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            self.version = subprocess.run([self.binary, "--version"], capture_output=True,
                                          text=True, timeout=10, check=False).stdout.split()[-1]

    def stop(self) -> None:
        for proc in self.procs:
            _wait_exit(proc, STOP_TIMEOUT_S)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    async def connect(self) -> tuple[Any, Any]:
        """(connection, JetStream context) once the R3 stream exists and has a leader."""
        import nats
        from nats.js.api import StorageType
        from nats.js.api import StreamConfig as JsStreamConfig

        deadline = time.monotonic() + START_TIMEOUT_S
        last: BaseException | None = None
        while time.monotonic() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise SetupError(f"nats-server exited with {proc.returncode}; logs in the "
                                     "data directory (run with --keep)")
            try:
                nc = await nats.connect(servers=self.urls, connect_timeout=2,
                                        max_reconnect_attempts=5)
            except Exception as exc:  # not listening yet
                last = exc
                await asyncio.sleep(0.2)
                continue
            js = nc.jetstream(timeout=10, publish_async_max_pending=WIDE_WINDOW)
            try:
                await js.add_stream(JsStreamConfig(
                    name=JS_STREAM, subjects=[JS_SUBJECTS], num_replicas=3,
                    storage=StorageType.FILE))
                info = await js.stream_info(JS_STREAM)
                if info.cluster is not None and info.cluster.leader:
                    await js.publish("peers.ready", b"x")
                    return nc, js
            except Exception as exc:  # no JetStream meta leader yet
                last = exc
            await nc.close()
            await asyncio.sleep(0.3)
        raise SetupError(f"JetStream did not become ready within {START_TIMEOUT_S:.0f} s: "
                         f"{last!r}")


async def js_publish(js: Any, size: int, window: int, count: int, budget_s: float,
                     workload: str) -> Row:
    subject = f"peers.pub.{size}.{window}"
    payload = os.urandom(size)

    async def submit(_: int) -> asyncio.Future[Any]:
        if window == 1:  # one in flight: the plain request/reply publish
            return asyncio.ensure_future(js.publish(subject, payload))
        future: asyncio.Future[Any] = await js.publish_async(subject, payload)
        return future

    await js.publish(subject, payload)
    done, seconds, latencies = await pipelined(submit, window=window, count=count,
                                               budget_s=budget_s)
    await js.purge_stream(JS_STREAM)
    return Row("JetStream", workload, size_name(size), str(window), done / seconds,
               done * size / seconds / 1e6, percentile(latencies, 0.5) * 1000,
               percentile(latencies, 0.99) * 1000, DURABLE_JETSTREAM, done,
               "publish with ack, R3 file stream")


async def js_end_to_end(js: Any, size: int, rate_per_s: float, count: int, budget_s: float
                        ) -> Row:
    subject = "peers.e2e"
    received: list[float] = []
    sent_at: dict[int, float] = {}
    seen = asyncio.Event()

    async def on_message(msg: Any) -> None:
        index = int(msg.data[:TAG_BYTES])
        if index in sent_at:
            received.append(now() - sent_at[index])
        if len(received) >= count:
            seen.set()

    subscription = await js.subscribe(subject, cb=on_message, ordered_consumer=True)
    payload_for = functools.partial(tagged, size=size)
    await (await js.publish_async(subject, payload_for(WARMUP_INDEX)))  # not in sent_at

    async def submit(index: int) -> asyncio.Future[Any]:
        sent_at[index] = now()
        future: asyncio.Future[Any] = await js.publish_async(subject, payload_for(index))
        return future

    sent, seconds, acks, _ = await paced(submit, rate_per_s=rate_per_s, count=count,
                                         budget_s=budget_s)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(seen.wait(), DRAIN_TIMEOUT_S if len(received) < sent else 0.1)
    await subscription.unsubscribe()
    await js.purge_stream(JS_STREAM)
    return e2e_row("JetStream", size, rate_per_s, sent, seconds, acks, received,
                   DURABLE_JETSTREAM, "ordered push consumer")


# ------------------------------------------------------------------ quorumlog


async def stream_produce(client: StreamClient, name: str, size: int, window: int,
                         batching: bool, count: int, budget_s: float) -> Row:
    await client.create_stream(name, StreamConfig(
        partitions=1, rollover=RolloverPolicy(max_entries=1_000_000, min_time_ms=0)))
    producer = await client.producer(name, config=ProducerConfig(
        batching=batching, pending_messages_max=max(window, 1) * 2))
    value = os.urandom(size)
    await (await producer.send_async(value))

    async def submit(_: int) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = await producer.send_async(value)
        return future

    try:
        done, seconds, latencies = await pipelined(submit, window=window, count=count,
                                                   budget_s=budget_s)
    finally:
        await producer.close()
    workload = "stream produce, batched" if batching else "stream produce, not batched"
    return Row("quorumlog", workload, size_name(size), str(window), done / seconds,
               done * size / seconds / 1e6, percentile(latencies, 0.5) * 1000,
               percentile(latencies, 0.99) * 1000, DURABLE_QUORUMLOG, done,
               "1 partition, ledgers (2,2,2): the stream default")


async def stream_end_to_end(client: StreamClient, name: str, size: int, rate_per_s: float,
                            count: int, budget_s: float) -> Row:
    await client.create_stream(name, StreamConfig(
        partitions=1, rollover=RolloverPolicy(max_entries=1_000_000, min_time_ms=0)))
    producer = await client.producer(name, config=ProducerConfig(batching=True))
    reader = await client.reader(name, "latest")
    sent_at: dict[int, float] = {}
    received: list[float] = []
    stop = asyncio.Event()

    await (await producer.send_async(tagged(WARMUP_INDEX, size)))  # see WARMUP_INDEX

    async def follow() -> None:
        while not stop.is_set():
            for message in await reader.read_batch(200):
                index = int(bytes(message.value[:TAG_BYTES]))
                if index != WARMUP_INDEX:
                    received.append(now() - sent_at[index])

    async def submit(index: int) -> asyncio.Future[Any]:
        sent_at[index] = now()
        future: asyncio.Future[Any] = await producer.send_async(tagged(index, size))
        return future

    follower = asyncio.ensure_future(follow())
    try:
        sent, seconds, acks, _ = await paced(submit, rate_per_s=rate_per_s, count=count,
                                             budget_s=budget_s)
        deadline = now() + DRAIN_TIMEOUT_S
        while len(received) < sent and now() < deadline and not follower.done():
            await asyncio.sleep(0.01)
    finally:
        stop.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(follower, 1.0)
        await reader.close()
        await producer.close()
    return e2e_row("quorumlog", size, rate_per_s, sent, seconds, acks, received,
                   DURABLE_QUORUMLOG, "batched producer, tailing stream Reader")


def e2e_row(system: str, size: int, rate_per_s: float, sent: int, seconds: float,
            acks: list[float], received: list[float], durability: str, how: str) -> Row:
    return Row(system, "end to end at half peak", size_name(size),
               f"{rate_per_s:,.0f}/s open loop", sent / seconds, sent * size / seconds / 1e6,
               percentile(received, 0.5) * 1000, percentile(received, 0.99) * 1000,
               durability, sent,
               f"{how}; p50/p99 send->received; send->ack p50 "
               f"{percentile(acks, 0.5) * 1000:.2f} p99 {percentile(acks, 0.99) * 1000:.2f} ms; "
               f"{len(received)}/{sent} received")


def ledger_row(row: Any, workload: str) -> Row:
    return Row("quorumlog", workload, row.size, row.outstanding, row.rate_per_s, row.mb_per_s,
               row.p50_ms, row.p99_ms, DURABLE_QUORUMLOG, row.count, f"ledger {row.shape}")


# ------------------------------------------------------------------ driver


@dataclass(slots=True)
class Plan:
    repeats: int
    budget_s: float
    count: int  # bound of one pipelined case
    ledger_count: int  # ledger_bench.appends' own time bound is 20 s: bound it by count
    one_count: int  # bound of one case with 1 in flight
    e2e_count: int
    bookie_count: int
    meta_seconds: float
    meta_max_ops: int


def plan_for(args: argparse.Namespace) -> Plan:
    if args.quick:
        return Plan(1, QUICK_CASE_BUDGET_S, 40_000, 10_000, 400, 4_000, 60_000, 2.0, 20_000)
    return Plan(args.repeats, CASE_BUDGET_S, 400_000, 80_000, 2_000, 20_000, 400_000, 8.0, 100_000)


def median_row(rows: list[Row]) -> Row:
    """The median of repeats: rates and percentiles each by their median."""
    if len(rows) == 1:
        return rows[0]

    def med(values: list[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return statistics.median(present) if present else None

    return replace(rows[0], ops_per_s=statistics.median(r.ops_per_s for r in rows),
                   mb_per_s=statistics.median(r.mb_per_s for r in rows),
                   p50_ms=med([r.p50_ms for r in rows]), p99_ms=med([r.p99_ms for r in rows]),
                   count=sum(r.count for r in rows),
                   cpu_us_per_op=med([r.cpu_us_per_op for r in rows]),
                   note=rows[0].note + f"; median of {len(rows)}")


Make = Callable[[int], Awaitable[Row]]  # repeat index -> one measured row


async def with_cpu(make: Make, repeat: int, server_pids: list[int]) -> Row:
    """``make(repeat)`` with its CPU per op: this process + ``server_pids``
    (utime + stime from /proc), setup of the case included."""
    cpu0, server0 = time.process_time(), cpu_seconds(server_pids)
    row = await make(repeat)
    spent = time.process_time() - cpu0 + cpu_seconds(server_pids) - server0
    return replace(row, cpu_us_per_op=spent / max(row.count, 1) * 1e6)


async def paired(times: int, cases: list[tuple[Make, list[int]]]) -> list[Row]:
    """Each case ``times`` times, the order reversed on every other repeat so
    drift in the machine's load hits all alike; the median row of each."""
    runs: list[list[Row]] = [[] for _ in cases]
    for repeat in range(times):
        order = list(enumerate(cases))
        for index, (make, pids) in order if repeat % 2 == 0 else order[::-1]:
            runs[index].append(await with_cpu(make, repeat, pids))
    out = [median_row(rows) for rows in runs]
    for row in out:
        p = "" if row.p50_ms is None else f" p50 {row.p50_ms:.2f} p99 {row.p99_ms or 0:.2f} ms"
        console.print(f"  {row.system} {row.workload} {row.size} x{row.in_flight}: "
                      f"{row.ops_per_s:,.0f}/s{p} cpu {row.cpu_us_per_op or 0:,.0f} us/op")
    return out


async def data_cases(plan: Plan, q_pids: list[int], addresses: list[str], j_pids: list[int],
                     js: Any) -> list[Row]:
    rows: list[Row] = []
    r, budget = plan.repeats, plan.budget_s
    async with await StreamClient.connect(addresses) as streams:
        client: LedgerClient = streams.ledger_client
        for size in SIZES:
            for window in (1, WINDOW):
                count = plan.one_count if window == 1 else plan.count
                rows += await paired(r, [
                    (lambda _, s=size, w=window: _ledger(
                        client, s, w, plan.one_count if w == 1 else plan.ledger_count), q_pids),
                    (lambda _, s=size, w=window, c=count: js_publish(
                        js, s, w, c, budget, "publish (vs ledger append, stream produce)"),
                     j_pids)])
            cases: list[tuple[Make, list[int]]] = [(lambda _, s=size: js_publish(
                js, s, WIDE_WINDOW, plan.count, budget, "publish (vs batched produce)"), j_pids)]
            for batching, window in ((False, WINDOW), (True, WINDOW), (True, WIDE_WINDOW)):
                cases.append((lambda i, s=size, b=batching, w=window: stream_produce(
                    streams, f"produce-{s}-{int(b)}-{w}-{i}", s, w, b, plan.count, budget),
                    q_pids))
            rows += await paired(r, cases)
        q_peak = peak(rows, "quorumlog", "stream produce, batched", 100)
        j_peak = peak(rows, "JetStream", "publish", 100)
        rows += await paired(r, [
            (lambda i: stream_end_to_end(streams, f"e2e-{i}", 100, q_peak / 2,
                                         min(plan.e2e_count, int(q_peak)), budget), q_pids),
            (lambda _: js_end_to_end(js, 100, j_peak / 2, min(plan.e2e_count, int(j_peak)),
                                     budget), j_pids)])
    return rows


async def _ledger(client: LedgerClient, size: int, window: int, count: int) -> Row:
    return ledger_row(await appends(client, SHAPE, size, window, count), "ledger append")


def peak(rows: list[Row], system: str, workload_prefix: str, size: int) -> float:
    rates = [r.ops_per_s for r in rows if r.system == system
             and r.workload.startswith(workload_prefix) and r.size == size_name(size)]
    return max(rates, default=1.0)


async def bookie_case(plan: Plan, root: Path, started: list[Any]) -> Row:
    proc = await asyncio.to_thread(BookieProcess, root / "bookie")
    started.append(proc)  # stopped by main() too, if this is interrupted
    try:
        async def once(_: int) -> Row:
            row = await single_bookie_batched(proc.address, 100, 4 * ADD_BATCH_ENTRIES_MAX,
                                              plan.bookie_count,
                                              per_batch=ADD_BATCH_ENTRIES_MAX)
            return Row("quorumlog", "bookie adds (one bookie)", row.size, row.outstanding,
                       row.rate_per_s, row.mb_per_s, row.p50_ms, row.p99_ms,
                       "fsync per ack (journal group commit)", row.count,
                       "AddEntriesRequest batches, 1 connection")

        return (await paired(plan.repeats, [(once, [proc.proc.pid])]))[0]
    finally:
        await asyncio.to_thread(proc.stop)
        started.remove(proc)


async def meta_cases(plan: Plan, quorumlog: QuorumlogSystem, etcd: EtcdSystem
                     ) -> tuple[list[Row], list[dict[str, Any]]]:
    args = argparse.Namespace(clients=list(META_CLIENTS), repeats=plan.repeats,
                              max_ops=plan.meta_max_ops, seconds=plan.meta_seconds)
    outcome = await meta_run_all(args, [quorumlog, etcd])
    for name, check in outcome["checks"].items():
        if not check["ok"]:
            raise RuntimeError(f"{name}: {check['acknowledged_puts']} puts acknowledged, "
                               f"{check['applied_delta']} applied")
    cases = summarize(outcome["runs"], ["quorumlog", "etcd"], list(META_CLIENTS))
    rows = [Row("quorumlog" if c["system"] == "quorumlog" else "etcd", "meta put (100 B value)",
                "100 B", f"{c['clients']} client{'s' if c['clients'] > 1 else ''}", c["puts_per_s"],
                c["puts_per_s"] * 100 / 1e6, c["p50_ms"], c["p99_ms"],
                DURABLE_META if c["system"] == "quorumlog" else DURABLE_ETCD, c["ops"],
                "MetaClient" if c["system"] == "quorumlog" else "HTTP/JSON gateway, to leader",
                c["client_cpu_us_per_put"] + c["server_cpu_us_per_put"])
            for c in cases]
    return rows, ratios(cases, list(META_CLIENTS))


# ------------------------------------------------------------------ targets


def find(rows: list[Row], system: str, workload: str, size: int, in_flight: str) -> Row | None:
    for r in rows:
        if (r.system == system and r.workload.startswith(workload)
                and r.size == size_name(size) and r.in_flight == in_flight):
            return r
    return None


def peak_row(rows: list[Row], system: str, workload_prefix: str, size: int) -> Row | None:
    mine = [r for r in rows if r.system == system and r.workload.startswith(workload_prefix)
            and r.size == size_name(size)]
    return max(mine, key=lambda r: r.ops_per_s, default=None)


def cpu_notes(rows: list[Row]) -> list[str]:
    """The throughput ratios again, from CPU per op instead of ops/s: what the
    ratio would be if both systems got the same CPU (load-independent on a
    shared machine, where ops/s follow whatever the other processes leave)."""
    out = []
    pairs = (("ledger_append_1k_256",
              find(rows, "quorumlog", "ledger append", KIB, str(WINDOW)),
              find(rows, "JetStream", "publish", KIB, str(WINDOW))),
             ("stream_produce_100b_batched",
              peak_row(rows, "quorumlog", "stream produce, batched", 100),
              peak_row(rows, "JetStream", "publish", 100)))
    for name, ours, theirs in pairs:
        if ours and theirs and ours.cpu_us_per_op and theirs.cpu_us_per_op:
            out.append(f"cpu {name}: {theirs.cpu_us_per_op / ours.cpu_us_per_op:.2f}x at equal "
                       f"CPU ({ours.cpu_us_per_op:,.0f} vs {theirs.cpu_us_per_op:,.0f} µs/op)")
    bookie = next((r for r in rows if r.workload.startswith("bookie adds")), None)
    if bookie and bookie.cpu_us_per_op:
        cores = os.cpu_count() or 1
        out.append(f"cpu bookie_add_100b: {bookie.cpu_us_per_op:,.1f} µs/op (client + bookie): "
                   f"{cores * 1e6 / bookie.cpu_us_per_op:,.0f}/s if {cores} cores were free")
    return out


def targets(rows: list[Row], meta_ratios: list[dict[str, Any]]) -> list[str]:
    out: list[str] = []

    def line(name: str, value: float | None, goal: str, ok: bool | None, unit: str = "") -> None:
        if value is None or ok is None:
            out.append(f"TARGET {name}: not measured ({goal}) MISS")
            return
        out.append(f"TARGET {name}: {value:,.2f}{unit} ({goal}) {'ok' if ok else 'MISS'}")

    def rate_ratio(a: Row | None, b: Row | None) -> float | None:
        return a.ops_per_s / b.ops_per_s if a and b and b.ops_per_s else None

    ratio = rate_ratio(find(rows, "quorumlog", "ledger append", KIB, str(WINDOW)),
                       find(rows, "JetStream", "publish", KIB, str(WINDOW)))
    line("ledger_append_1k_256", ratio, ">= 2.0", None if ratio is None else ratio >= 2.0, "x")
    bookie = next((r for r in rows if r.workload.startswith("bookie adds")), None)
    value = bookie.ops_per_s if bookie else None
    line("bookie_add_100b", value, ">= 100000/s", None if value is None else value >= 100_000,
         "/s")
    q = peak(rows, "quorumlog", "stream produce, batched", 100)
    j = peak(rows, "JetStream", "publish", 100)
    ratio = q / j if j else None
    line("stream_produce_100b_batched", ratio, ">= 4.0 (peak vs JetStream's peak)",
         None if ratio is None else ratio >= 4.0, "x")
    e2e = next((r for r in rows if r.system == "quorumlog" and r.workload.startswith("end")),
               None)
    ack_p99 = _ack_p99(e2e)
    line("stream_produce_batched_p99_half_peak_ms", ack_p99, "<= 10, send->ack",
         None if ack_p99 is None else ack_p99 <= 10, " ms")
    a, b = (find(rows, "quorumlog", "ledger append", KIB, "1"),
            find(rows, "JetStream", "publish", KIB, "1"))
    ratio = a.p50_ms / b.p50_ms if a and b and a.p50_ms and b.p50_ms else None
    line("one_at_a_time_1k_p50", ratio, "<= 1.5, quorumlog/JetStream",
         None if ratio is None else ratio <= 1.5, "x")
    by = {m["clients"]: m for m in meta_ratios}
    for clients in (64, 256):
        ratio = by.get(clients, {}).get("throughput_q_over_etcd")
        line(f"meta_put_{clients}clients", ratio, ">= 3.0 vs etcd",
             None if ratio is None else ratio >= 3.0, "x")
    inverse = by.get(1, {}).get("p50_etcd_over_q")
    ratio = 1 / inverse if inverse else None
    line("meta_put_1client_p50", ratio, "<= 1.0, quorumlog/etcd",
         None if ratio is None else ratio <= 1.0, "x")
    return out


def _ack_p99(row: Row | None) -> float | None:
    if row is None or "p99 " not in row.note:
        return None
    return float(row.note.split("send->ack p50 ")[1].split(" p99 ")[1].split(" ms")[0])


# ------------------------------------------------------------------ output


COLUMNS = ("system", "workload", "size", "in flight", "ops/s", "MB/s", "p50 ms", "p99 ms",
           "CPU µs/op", "durability", "note")


def cells(r: Row) -> list[str]:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    return [r.system, r.workload, r.size, r.in_flight, f"{r.ops_per_s:,.0f}",
            f"{r.mb_per_s:,.1f}", ms(r.p50_ms), ms(r.p99_ms),
            "-" if r.cpu_us_per_op is None else f"{r.cpu_us_per_op:,.0f}", r.durability, r.note]


def print_table(rows: list[Row], title: str) -> None:
    table = Table(title=title)
    for column in COLUMNS:
        table.add_column(column, justify="right" if column in (
            "ops/s", "MB/s", "p50 ms", "p99 ms", "CPU µs/op") else "left")
    for r in rows:
        table.add_row(*cells(r))
    console.print(table)


def markdown(rows: list[Row], lines: list[str], title: str) -> str:
    out = [title, "", "| " + " | ".join(COLUMNS) + " |",
           "|---|---|---|---|---:|---:|---:|---:|---:|---|---|"]
    out += ["| " + " | ".join(cells(r)) + " |" for r in rows]
    out += ["", DURABILITY_LEGEND, "", "```", *lines, "```"]
    return "\n".join(out) + "\n"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=BENCH, description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1 repeat, small counts (< 2 min)")
    p.add_argument("--repeats", type=int, default=3, help="runs per case (median); quick: 1")
    p.add_argument("--dir", type=Path, help="parent of the temporary data directory")
    p.add_argument("--keep", action="store_true", help="keep data directories and logs")
    p.add_argument("--json", type=Path, help="write rows and targets as JSON here")
    p.add_argument("--markdown", type=Path, help="write the table and targets as Markdown")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    return args


async def run(plan: Plan, root: Path, started: list[Any]) -> tuple[list[Row], list[str]]:
    # SIGTERM cancels this task, as asyncio.Runner does for Ctrl-C. A handler
    # that raises KeyboardInterrupt (meta_vs_etcd's) can land inside uvloop's
    # get_buffer() call, which swallows it and kills that rpc connection instead.
    task = asyncio.current_task()
    invariant(task is not None, "run() is the main task")
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    etcd_binary = shutil.which("etcd")
    if etcd_binary is None:
        raise SetupError("etcd is not installed: run ./scripts/setup-bench.sh "
                         "(apt-get install etcd-server)")
    jet = JetStreamCluster(nats_binary())
    quorumlog = QuorumlogSystem(tasks_per_client=16)
    etcd = EtcdSystem(etcd_binary)
    for system in (quorumlog, jet, etcd):
        console.print(f"starting {system.name} ...")
        started.append(system)
        await asyncio.to_thread(system.start, root)
    nc, js = await jet.connect()
    try:
        rows = await data_cases(plan, quorumlog.pids(), quorumlog.addresses, jet.pids(), js)
    finally:
        await nc.close()
    rows.append(await bookie_case(plan, root, started))
    meta_rows, meta_ratios = await meta_cases(plan, quorumlog, etcd)
    rows += meta_rows
    return rows, targets(rows, meta_ratios)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    plan = plan_for(args)
    configure("WARNING")
    began = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="peers-bench-", dir=args.dir))
    started: list[Any] = []
    try:
        rows, lines = rpc.run(run(plan, root, started))
    except SetupError as exc:
        print(f"{BENCH}: {exc}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, asyncio.CancelledError):
        print(f"{BENCH}: interrupted; stopping every cluster", file=sys.stderr)
        return 130
    except Exception as exc:  # a case failed: say which error, stop everything, exit 1
        traceback.print_exc()
        print(f"{BENCH}: a case failed ({exc!r}); every cluster is being stopped "
              "(--keep keeps their logs)", file=sys.stderr)
        return 1
    finally:
        for system in reversed(started):
            try:
                system.stop()
            except Exception as exc:
                name = getattr(system, "name", type(system).__name__)
                print(f"stopping {name} failed: {exc!r}", file=sys.stderr)
        if args.keep:
            print(f"data and logs kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    title = (f"{BENCH} ({time.strftime('%Y-%m-%d %H:%M')}, {'quick' if args.quick else 'full'}, "
             f"{plan.repeats} repeat(s), {platform.python_implementation()} "
             f"{platform.python_version()}, {os.cpu_count()} CPUs, load average "
             f"{os.getloadavg()[0]:.1f}, {time.monotonic() - began:.0f} s)")
    print_table(rows, title)
    console.print(DURABILITY_LEGEND, highlight=False)
    if args.json:
        args.json.write_text(json.dumps({"title": title, "rows": [asdict(r) for r in rows],
                                         "cpu_notes": cpu_notes(rows), "targets": lines},
                                        indent=2))
    if args.markdown:
        args.markdown.write_text(markdown(rows, cpu_notes(rows) + lines, title))
    for line in cpu_notes(rows) + lines:
        console.print(line, highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
