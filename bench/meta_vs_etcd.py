"""quorumlog's metadata service (3 members) against etcd (3 members), one run.

Workload: puts of a 100-byte value on keys drawn uniformly from 1,000, from 1,
8, 64 and 256 concurrent clients. Every system is driven by the same load
generator (``bench/_loadgen.py``): N asyncio tasks on one uvloop loop in this
process, each sending one put and waiting for the answer before the next (a
closed loop), every latency recorded. A run stops issuing after ``--seconds``
or ``--max-ops`` puts, whichever comes first, after a short warm-up.

Systems, all on 127.0.0.1, all data directories in one temporary directory
(the same disk), all started once and measured in alternating order:

* **quorumlog**: ``quorumlog.node.up(dir, 3)`` (3 node processes, meta role,
  default config: WAL with fdatasync per Raft ready pass). Clients:
  ``MetaClient.put``, one MetaClient (one multiplexed rpc connection to the
  leader) shared by up to ``--tasks-per-client`` (16) tasks.
* **etcd**: 3 ``etcd`` 3.4 processes, default fsync, driven through its gRPC
  gateway over HTTP/1.1 + JSON (``POST /v3/kv/put``, base64 key and value) with
  aiohttp (keep-alive pool, one connection per task, as HTTP/1.1 has no
  multiplexing). Puts go straight to the leader (found with
  ``/v3/maintenance/status``), so no forwarding hop is measured.
* **pysyncobj** (the pure-Python peer): 3 processes, each a PySyncObj node with
  a ``ReplDict`` and a small asyncio front end (length-prefixed frames, one
  connection per task); puts go to the leader. PySyncObj keeps its log in
  memory and **does not fsync** (no journal file): it is a lower bound on
  what a Python Raft costs without durability, not a like-for-like peer.

Reported per system and concurrency: puts/s, p50/p99/max latency (ms), CPU per
put of the load generator and of the 3 server processes (the box has 2 cores
shared by everything), each the median of ``--repeats`` runs. Ratios:
throughput quorumlog/etcd, latency etcd/quorumlog (>1 means quorumlog is
faster). The targets of the issue are reported, not enforced.

Run::

    ./scripts/uv run --frozen python bench/meta_vs_etcd.py [--quick] \
        [--json out.json] [--markdown out.md] [--repeats 3] [--seconds 10]

etcd comes from Debian's ``etcd-server`` package; when ``etcd`` is not on PATH
the setup step runs ``apt-get install -y etcd-server`` (root or passwordless
sudo) and stops with a clear message if that fails (or pass ``--etcd PATH``, or
``--systems quorumlog,pysyncobj``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import math
import os
import platform
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from _loadgen import VALUE_BYTES, Put, RunResult, free_ports, measure, percentile

BENCH = "meta_vs_etcd"
CONCURRENCIES = (1, 8, 64, 256)
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 10.0
FRAME = struct.Struct("<I")
TARGETS = {  # from the issue; reported, not enforced
    "throughput": ({64, 256}, 3.0),  # quorumlog/etcd puts/s >= 3 at 64 and 256 clients
    "p99": (set(CONCURRENCIES), 1.0),  # etcd/quorumlog p99 >= 1 (no worse) everywhere
    "p50": ({1}, 1.0),  # etcd/quorumlog p50 >= 1 with one client
}

Close = Callable[[], Awaitable[None]]


class SetupError(RuntimeError):
    """A system could not be installed or started; the message says what to do."""


def _wait_exit(proc: subprocess.Popen[Any], timeout_s: float) -> None:
    """SIGTERM, then SIGKILL after ``timeout_s``; always reaps."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(timeout=timeout_s)


def _http_json(url: str, body: bytes | None = None, timeout_s: float = 1.0) -> Any:
    request = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET")
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.loads(response.read())


# ----------------------------------------------------------------- quorumlog


class QuorumlogSystem:
    name = "quorumlog"
    note = "3 node processes, WAL fdatasync per Raft ready pass"

    def __init__(self, tasks_per_client: int) -> None:
        self.tasks_per_client = tasks_per_client
        self.directory: Path | None = None
        self.addresses: list[str] = []
        self._pids: list[int] = []

    def start(self, root: Path) -> None:
        from quorumlog import node as cluster

        self.directory = root / "quorumlog"
        try:
            cluster.up(self.directory, 3)
        except Exception as exc:
            raise SetupError(f"quorumlog cluster did not start: {exc}") from exc
        self.addresses = cluster.meta_addresses(self.directory)
        self._pids = [info.pid for info in cluster.load(self.directory)]

    def stop(self) -> None:
        from quorumlog import node as cluster

        if self.directory is not None and (self.directory / "cluster.json").exists():
            cluster.down(self.directory)

    def pids(self) -> list[int]:
        return self._pids

    async def connect(self, clients: int) -> tuple[Put, Close]:
        from quorumlog.meta import MetaClient

        per = self.tasks_per_client
        metas = [MetaClient(self.addresses) for _ in range(math.ceil(clients / per))]

        async def put(index: int, key: str, value: bytes) -> object:
            return await metas[index // per].put(key, value)

        async def close() -> None:
            await asyncio.gather(*(m.close() for m in metas), return_exceptions=True)

        return put, close

    async def revision(self) -> int:
        from quorumlog.meta import MetaClient

        async with MetaClient(self.addresses) as meta:
            statuses = [await meta.status(a) for a in self.addresses]
        return max(s.revision for s in statuses)


# ----------------------------------------------------------------------- etcd


def ensure_etcd(explicit: str | None) -> str:
    """The etcd binary; installs Debian's etcd-server when there is none."""
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise SetupError(f"--etcd {explicit} is not an executable file")
        return explicit
    found = shutil.which("etcd")
    if found:
        return found
    print("etcd is not installed: running `apt-get install -y etcd-server` ...", flush=True)
    prefix: list[str] = []
    if os.geteuid() != 0:
        if shutil.which("sudo") is None:
            raise SetupError(
                "etcd is not installed and this user is not root (no sudo): install it with "
                "`apt-get install etcd-server`, pass --etcd PATH, or run with "
                "--systems quorumlog,pysyncobj"
            )
        prefix = ["sudo", "-n"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    last = ""
    for command in (["apt-get", "install", "-y", "etcd-server"],
                    ["apt-get", "update"],
                    ["apt-get", "install", "-y", "etcd-server"]):
        try:
            done = subprocess.run(prefix + command, env=env, capture_output=True, text=True,
                                  timeout=600, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            last = repr(exc)
            continue
        last = (done.stderr or done.stdout).strip()[-800:]
        if command[1] == "install" and done.returncode == 0 and shutil.which("etcd"):
            return shutil.which("etcd") or "etcd"
    raise SetupError(
        "could not install etcd (apt-get install -y etcd-server failed). Install it by hand, "
        "pass --etcd PATH, or run with --systems quorumlog,pysyncobj. apt-get said:\n" + last
    )


class EtcdSystem:
    name = "etcd"
    note = "etcd 3.4, 3 members, default fsync; HTTP/JSON gateway via aiohttp, to the leader"

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.procs: list[subprocess.Popen[bytes]] = []
        self.client_urls: list[str] = []
        self.leader_url = ""
        self.version = ""

    def start(self, root: Path) -> None:
        ports = free_ports(6)
        names = ["m1", "m2", "m3"]
        peers = [f"http://127.0.0.1:{p}" for p in ports[3:]]
        self.client_urls = [f"http://127.0.0.1:{p}" for p in ports[:3]]
        initial = ",".join(f"{n}={u}" for n, u in zip(names, peers, strict=True))
        token = f"bench-{os.getpid()}-{time.monotonic_ns()}"
        base = root / "etcd"
        base.mkdir(parents=True, exist_ok=True)
        for name, client, peer in zip(names, self.client_urls, peers, strict=True):
            with (base / f"{name}.log").open("ab") as log:
                self.procs.append(subprocess.Popen(
                    [self.binary, "--name", name, "--data-dir", str(base / name),
                     "--listen-client-urls", client, "--advertise-client-urls", client,
                     "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                     "--initial-cluster", initial, "--initial-cluster-state", "new",
                     "--initial-cluster-token", token, "--logger", "zap",
                     "--log-outputs", "stderr"],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=True,
                ))
        self._wait_healthy(base)
        self.leader_url = self._find_leader()
        with contextlib.suppress(OSError, ValueError, KeyError):
            self.version = _http_json(self.client_urls[0] + "/version")["etcdserver"]

    def _wait_healthy(self, base: Path) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        pending = list(self.client_urls)
        while pending:
            for proc, name in zip(self.procs, ("m1", "m2", "m3"), strict=True):
                if proc.poll() is not None:
                    raise SetupError(f"etcd member {name} exited with {proc.returncode}; "
                                     f"see {base / (name + '.log')}")
            if time.monotonic() > deadline:
                raise SetupError(f"etcd did not become healthy within {START_TIMEOUT_S:.0f} s "
                                 f"(still waiting for {pending}); logs in {base}")
            url = pending[0]
            try:
                if _http_json(url + "/health").get("health") == "true":
                    pending.pop(0)
                    continue
            except (OSError, ValueError):
                pass
            time.sleep(0.1)

    def _find_leader(self) -> str:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for url in self.client_urls:
                try:
                    status = _http_json(url + "/v3/maintenance/status", b"{}")
                except (OSError, ValueError):
                    continue
                if status.get("leader") and status["leader"] == status["header"]["member_id"]:
                    return url
            time.sleep(0.1)
        raise SetupError("etcd has no leader")

    def stop(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        for proc in self.procs:
            _wait_exit(proc, STOP_TIMEOUT_S)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    async def connect(self, clients: int) -> tuple[Put, Close]:
        import aiohttp

        self.leader_url = await asyncio.to_thread(self._find_leader)  # may have moved
        url = self.leader_url + "/v3/kv/put"
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=clients, limit_per_host=clients),
            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
            headers={"Content-Type": "application/json"},
        )
        value_cache: dict[bytes, str] = {}

        async def put(index: int, key: str, value: bytes) -> object:
            encoded = value_cache.get(value)
            if encoded is None:
                encoded = value_cache[value] = base64.b64encode(value).decode()
            body = f'{{"key":"{base64.b64encode(key.encode()).decode()}","value":"{encoded}"}}'

            async with session.post(url, data=body.encode()) as response:
                payload = await response.read()
                if response.status != 200:
                    raise RuntimeError(f"etcd put: HTTP {response.status}: {payload[:200]!r}")
            return payload

        async def close() -> None:
            await session.close()

        return put, close

    async def revision(self) -> int:
        status = await asyncio.to_thread(
            _http_json, self.leader_url + "/v3/maintenance/status", b"{}", 5.0
        )
        return int(status["header"]["revision"])


# ------------------------------------------------------------------ pysyncobj


def pysyncobj_node(index: int, raft_ports: list[int], client_port: int) -> None:
    """A PySyncObj node process: a ReplDict, and a tiny asyncio front end.

    Frames are a 4-byte little-endian length, then b"P" + key length (2 bytes)
    + key + value (put, answered b"K" or b"E" + reason) or b"S" (status,
    answered with JSON). Exits when its stdin (a pipe from the benchmark)
    closes, so it never outlives the benchmark.
    """
    from pysyncobj import SyncObj, SyncObjConf
    from pysyncobj.batteries import ReplDict

    addresses = [f"127.0.0.1:{p}" for p in raft_ports]
    store = ReplDict()
    # appendEntriesUseBatch=False: send each command's AppendEntries at once (a
    # pipe wakes the Raft thread). The default (True) sends only every
    # appendEntriesPeriod (100 ms), which measured ~100 ms per put at every
    # concurrency; this is the better of the two for PySyncObj.
    conf = SyncObjConf(dynamicMembershipChange=False, appendEntriesUseBatch=False)
    node = SyncObj(addresses[index], [a for i, a in enumerate(addresses) if i != index],
                   conf=conf, consumers=[store])

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                (length,) = FRAME.unpack(await reader.readexactly(4))
                body = await reader.readexactly(length)
                if body[:1] == b"P":
                    (key_len,) = struct.unpack_from("<H", body, 1)
                    key = body[3:3 + key_len].decode()
                    done: asyncio.Future[Any] = loop.create_future()

                    def callback(result: Any, error: Any, done: Any = done) -> None:
                        loop.call_soon_threadsafe(_settle, done, error)

                    store.set(key, body[3 + key_len:], callback=callback)
                    error = await done
                    answer = b"K" if error == 0 else b"E" + str(error).encode()
                else:
                    st = node.getStatus()
                    leader = st["leader"]
                    answer = json.dumps({
                        "self": str(st["self"]), "leader": str(leader) if leader else "",
                        "has_quorum": bool(st["has_quorum"]),
                        "commit_idx": st["commit_idx"],
                    }).encode()
                writer.write(FRAME.pack(len(answer)) + answer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def serve() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", client_port)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until EOF
        server.close()

    try:
        import uvloop

        uvloop.run(serve())
    except ImportError:
        asyncio.run(serve())
    node.destroy()


def _settle(future: asyncio.Future[Any], error: Any) -> None:
    if not future.done():
        future.set_result(error)


class _FrameConnection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def call(self, body: bytes) -> bytes:
        self.writer.write(FRAME.pack(len(body)) + body)
        (length,) = FRAME.unpack(await self.reader.readexactly(4))
        return await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


class PySyncObjSystem:
    name = "pysyncobj"
    note = ("PySyncObj 3 processes, in-memory log, NO fsync (not durable), "
            "appendEntriesUseBatch=False; asyncio front end, to the leader")

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.client_ports: list[int] = []
        self.leader_port = 0
        self.version = ""

    def start(self, root: Path) -> None:
        try:
            import pysyncobj
        except ImportError as exc:
            raise SetupError(f"pysyncobj is not installed ({exc}); `./scripts/setup.sh` "
                             "installs the dev extra") from exc
        self.version = getattr(pysyncobj, "__version__", "")
        if not self.version:
            with contextlib.suppress(Exception):
                from importlib.metadata import version

                self.version = version("pysyncobj")
        ports = free_ports(6)
        raft_ports, self.client_ports = ports[:3], ports[3:]
        base = root / "pysyncobj"
        base.mkdir(parents=True, exist_ok=True)
        for i in range(3):
            with (base / f"node-{i + 1}.log").open("ab") as log:
                self.procs.append(subprocess.Popen(
                    [sys.executable, os.path.abspath(__file__), "--pysyncobj-node", str(i),
                     ",".join(map(str, raft_ports)), str(self.client_ports[i])],
                    stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True, cwd=base,
                ))
        self.leader_port = self._wait_leader(base)

    def _status(self, port: int) -> dict[str, Any]:
        async def ask() -> dict[str, Any]:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", port), 1.0)
            conn = _FrameConnection(reader, writer)
            try:
                result: dict[str, Any] = json.loads(await asyncio.wait_for(conn.call(b"S"), 1.0))
                return result
            finally:
                conn.close()

        return asyncio.run(ask())

    def _wait_leader(self, base: Path) -> int:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for i, proc in enumerate(self.procs):
                if proc.poll() is not None:
                    raise SetupError(f"pysyncobj node {i + 1} exited with {proc.returncode}; "
                                     f"see {base / f'node-{i + 1}.log'}")
            try:
                statuses = [self._status(p) for p in self.client_ports]
            except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError):
                time.sleep(0.2)
                continue
            leaders = {s["leader"] for s in statuses}
            if len(leaders) == 1 and "" not in leaders and all(s["has_quorum"]
                                                               for s in statuses):
                for port, st in zip(self.client_ports, statuses, strict=True):
                    if st["self"] == st["leader"]:
                        return port
            time.sleep(0.2)
        raise SetupError(f"pysyncobj elected no leader within {START_TIMEOUT_S:.0f} s; "
                         f"logs in {base}")

    def stop(self) -> None:
        for proc in self.procs:
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
        for proc in self.procs:
            _wait_exit(proc, STOP_TIMEOUT_S)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    async def connect(self, clients: int) -> tuple[Put, Close]:
        conns = []
        for _ in range(clients):
            reader, writer = await asyncio.open_connection("127.0.0.1", self.leader_port)
            conns.append(_FrameConnection(reader, writer))

        async def put(index: int, key: str, value: bytes) -> object:
            raw = key.encode()
            answer = await asyncio.wait_for(
                conns[index].call(b"P" + struct.pack("<H", len(raw)) + raw + value),
                REQUEST_TIMEOUT_S,
            )
            if answer != b"K":
                raise RuntimeError(f"pysyncobj put failed: {answer!r}")
            return answer

        async def close() -> None:
            for conn in conns:
                conn.close()

        return put, close

    async def revision(self) -> int:
        status = await asyncio.to_thread(self._status, self.leader_port)
        return int(status["commit_idx"])


# ---------------------------------------------------------------------- main


def fsync_probe(directory: Path, count: int = 50) -> float:
    """Median fdatasync latency (ms) of a 200-byte append in ``directory``."""
    path = directory / "fsync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    times = []
    try:
        for _ in range(count):
            os.write(fd, b"x" * 200)
            t0 = time.perf_counter()
            os.fdatasync(fd)
            times.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        path.unlink()
    return statistics.median(times) * 1000


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=BENCH, description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="short runs, 1 repeat")
    p.add_argument("--repeats", type=int, default=3, help="runs per case (median); quick: 1")
    p.add_argument("--seconds", type=float, default=None,
                   help="time bound of one run (default 10, quick 3)")
    p.add_argument("--max-ops", type=int, default=None,
                   help="count bound of one run (default 100000, quick 20000)")
    p.add_argument("--clients", default=",".join(map(str, CONCURRENCIES)),
                   help="comma-separated concurrencies")
    p.add_argument("--systems", default="quorumlog,etcd,pysyncobj",
                   help="comma-separated subset of quorumlog,etcd,pysyncobj")
    p.add_argument("--tasks-per-client", type=int, default=16,
                   help="tasks sharing one quorumlog MetaClient (one rpc connection)")
    p.add_argument("--etcd", help="path of the etcd binary (default: PATH, else apt-get)")
    p.add_argument("--dir", type=Path, help="parent of the temporary data directory")
    p.add_argument("--keep", action="store_true", help="keep data directories and logs")
    p.add_argument("--json", type=Path, help="write results as JSON here")
    p.add_argument("--markdown", type=Path, help="write results as Markdown here")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats = 1
    args.seconds = args.seconds or (3.0 if args.quick else 10.0)
    args.max_ops = args.max_ops or (20_000 if args.quick else 100_000)
    args.clients = [int(c) for c in args.clients.split(",") if c]
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = set(args.systems) - {"quorumlog", "etcd", "pysyncobj"}
    if unknown:
        p.error(f"unknown systems {sorted(unknown)}")
    return args


async def run_all(args: argparse.Namespace, systems: list[Any]) -> dict[str, Any]:
    runs: list[RunResult] = []
    acked: dict[str, int] = {s.name: 0 for s in systems}
    first_revision = {s.name: await s.revision() for s in systems}
    for clients in args.clients:
        warmup = min(max(4 * clients, 200), args.max_ops)
        for repeat in range(args.repeats):
            order = systems if repeat % 2 == 0 else systems[::-1]
            for system in order:
                put, close = await system.connect(clients)
                try:
                    counted = _counting(put, acked, system.name)
                    result = await measure(
                        system.name, counted, clients=clients, max_ops=args.max_ops,
                        max_seconds=args.seconds, warmup_ops=warmup,
                        server_pids=system.pids(), seed=repeat + 1,
                    )
                finally:
                    await close()
                runs.append(result)
                s = result.summary()
                print(f"  {system.name:>9} {clients:>3} clients (run {repeat + 1}): "
                      f"{s['puts_per_s']:>9,.1f} puts/s  p50 {s['p50_ms']:>8.2f} ms  "
                      f"p99 {s['p99_ms']:>8.2f} ms  errors {s['errors']}", flush=True)
    checks = {}
    for system in systems:
        applied = await system.revision() - first_revision[system.name]
        checks[system.name] = {"acknowledged_puts": acked[system.name],
                               "applied_delta": applied,
                               "ok": applied >= acked[system.name]}
    return {"runs": runs, "checks": checks}


def _counting(put: Put, acked: dict[str, int], name: str) -> Put:
    async def counted(index: int, key: str, value: bytes) -> object:
        result = await put(index, key, value)
        acked[name] += 1
        return result

    return counted


def summarize(
    runs: list[RunResult], systems: list[str], clients: list[int]
) -> list[dict[str, Any]]:
    cases = []
    for c in clients:
        for name in systems:
            mine = [r for r in runs if r.system == name and r.clients == c]
            if not mine:
                continue
            summaries = [r.summary() for r in mine]
            row: dict[str, Any] = {"system": name, "clients": c, "runs": len(mine)}
            for metric in ("puts_per_s", "p50_ms", "p99_ms", "max_ms",
                           "client_cpu_us_per_put", "server_cpu_us_per_put"):
                row[metric] = statistics.median(float(s[metric]) for s in summaries)
            row["puts_per_s_min"] = min(float(s["puts_per_s"]) for s in summaries)
            row["puts_per_s_max"] = max(float(s["puts_per_s"]) for s in summaries)
            row["errors"] = sum(int(s["errors"]) for s in summaries)
            row["ops"] = sum(int(s["ops"]) for s in summaries)
            row["p99_all_runs_ms"] = percentile(
                [x for r in mine for x in r.latencies_s], 99) * 1000
            cases.append(row)
    return cases


def ratios(cases: list[dict[str, Any]], clients: list[int]) -> list[dict[str, Any]]:
    by = {(c["system"], c["clients"]): c for c in cases}
    out = []
    for c in clients:
        q, e, s = by.get(("quorumlog", c)), by.get(("etcd", c)), by.get(("pysyncobj", c))
        if q is None:
            continue
        row: dict[str, Any] = {"clients": c}
        if e is not None:
            row["throughput_q_over_etcd"] = q["puts_per_s"] / e["puts_per_s"]
            row["p50_etcd_over_q"] = e["p50_ms"] / q["p50_ms"]
            row["p99_etcd_over_q"] = e["p99_ms"] / q["p99_ms"]
            for metric, key in (("throughput", "throughput_q_over_etcd"),
                                ("p50", "p50_etcd_over_q"), ("p99", "p99_etcd_over_q")):
                where, target = TARGETS[metric]
                if c in where:
                    row[f"{metric}_target"] = target
                    row[f"{metric}_met"] = row[key] >= target
        if s is not None:
            row["throughput_q_over_pysyncobj"] = q["puts_per_s"] / s["puts_per_s"]
            row["p50_pysyncobj_over_q"] = s["p50_ms"] / q["p50_ms"]
        out.append(row)
    return out


def _fmt_ratio(row: dict[str, Any], key: str, metric: str) -> str:
    if key not in row:
        return "-"
    text = f"{row[key]:.2f}"
    if f"{metric}_target" in row:
        text += f" ({'ok' if row[f'{metric}_met'] else 'MISS'} >= {row[f'{metric}_target']:g})"
    return text


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"### benchmark `{BENCH}` (median of {report['config']['repeats']} run(s) per case)",
        "",
        "| system | clients | puts/s | puts/s range | p50 ms | p99 ms | max ms "
        "| client CPU µs/put | server CPU µs/put | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in report["cases"]:
        lines.append(
            f"| {c['system']} | {c['clients']} | {c['puts_per_s']:,.0f} | "
            f"{c['puts_per_s_min']:,.0f}..{c['puts_per_s_max']:,.0f} | {c['p50_ms']:.2f} | "
            f"{c['p99_ms']:.2f} | {c['max_ms']:.1f} | {c['client_cpu_us_per_put']:,.0f} | "
            f"{c['server_cpu_us_per_put']:,.0f} | {c['errors']} |"
        )
    lines += [
        "",
        "| clients | puts/s quorumlog/etcd | p50 etcd/quorumlog | p99 etcd/quorumlog "
        "| puts/s quorumlog/pysyncobj |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in report["ratios"]:
        lines.append(
            f"| {r['clients']} | {_fmt_ratio(r, 'throughput_q_over_etcd', 'throughput')} | "
            f"{_fmt_ratio(r, 'p50_etcd_over_q', 'p50')} | "
            f"{_fmt_ratio(r, 'p99_etcd_over_q', 'p99')} | "
            + (f"{r['throughput_q_over_pysyncobj']:.2f}"
               if "throughput_q_over_pysyncobj" in r else "-") + " |"
        )
    lines += ["", "Systems:", ""]
    lines += [f"- **{name}**: {note}" for name, note in report["systems"].items()]
    m = report["machine"]
    lines += [
        "",
        f"Machine: {m['cpus']} CPUs, Python {m['python']}, {m['platform']}; "
        f"fdatasync of a 200-byte append in the data directory: {m['fdatasync_ms']:.2f} ms "
        "(median). Config: "
        + ", ".join(f"{k}={v}" for k, v in report["config"].items()),
    ]
    checks = report.get("checks", {})
    if checks:
        lines.append("Applied-vs-acknowledged check: " + ", ".join(
            f"{n} {'ok' if c['ok'] else 'FAILED'} ({c['acknowledged_puts']} acked, "
            f"{c['applied_delta']} applied)" for n, c in checks.items()) + ".")
    for name, why in report.get("skipped", {}).items():
        lines.append(f"Left out: {name}: {why}")
    return "\n".join(lines) + "\n"


def print_tables(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 120))
    t = Table(title=f"{BENCH} (median of {report['config']['repeats']})")
    for col in ("system", "clients", "puts/s", "range", "p50 ms", "p99 ms", "max ms",
                "client CPU µs/put", "server CPU µs/put", "errors"):
        t.add_column(col, justify="left" if col == "system" else "right")
    for c in report["cases"]:
        t.add_row(c["system"], str(c["clients"]), f"{c['puts_per_s']:,.0f}",
                  f"{c['puts_per_s_min']:,.0f}..{c['puts_per_s_max']:,.0f}",
                  f"{c['p50_ms']:.2f}", f"{c['p99_ms']:.2f}", f"{c['max_ms']:.1f}",
                  f"{c['client_cpu_us_per_put']:,.0f}", f"{c['server_cpu_us_per_put']:,.0f}",
                  str(c["errors"]))
    console.print(t)
    r_table = Table(title="ratios (>1: quorumlog better)")
    for col in ("clients", "puts/s q/etcd", "p50 etcd/q", "p99 etcd/q", "puts/s q/pysyncobj"):
        r_table.add_column(col, justify="right")
    for r in report["ratios"]:
        r_table.add_row(
            str(r["clients"]), _fmt_ratio(r, "throughput_q_over_etcd", "throughput"),
            _fmt_ratio(r, "p50_etcd_over_q", "p50"), _fmt_ratio(r, "p99_etcd_over_q", "p99"),
            f"{r['throughput_q_over_pysyncobj']:.2f}" if "throughput_q_over_pysyncobj" in r
            else "-")
    console.print(r_table)
    for name, check in report.get("checks", {}).items():
        if not check["ok"]:
            console.print(f"[red]{name}: {check['acknowledged_puts']} puts acknowledged but "
                          f"only {check['applied_delta']} applied[/red]")
    for name, why in report.get("skipped", {}).items():
        console.print(f"left out: {name}: {why}")


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str]) -> int:
    if argv[:1] == ["--pysyncobj-node"]:
        pysyncobj_node(int(argv[1]), [int(p) for p in argv[2].split(",")], int(argv[3]))
        return 0
    args = parse_args(argv)
    from quorumlog import rpc
    from quorumlog.log import configure

    configure("WARNING")
    signal.signal(signal.SIGTERM, _raise_interrupt)  # clean up on SIGTERM like on Ctrl-C
    root = Path(tempfile.mkdtemp(prefix="meta-vs-etcd-", dir=args.dir))
    systems: list[Any] = []
    skipped: dict[str, str] = {}
    started: list[Any] = []
    try:
        for name in args.systems:
            if name == "quorumlog":
                systems.append(QuorumlogSystem(args.tasks_per_client))
            elif name == "etcd":
                systems.append(EtcdSystem(ensure_etcd(args.etcd)))
            else:
                systems.append(PySyncObjSystem())
        for system in list(systems):
            print(f"starting {system.name} ...", flush=True)
            started.append(system)
            try:
                system.start(root)
            except SetupError as exc:
                if system.name != "pysyncobj":
                    raise
                skipped[system.name] = str(exc)  # the optional peer: report, go on
                systems.remove(system)
        fsync_ms = fsync_probe(root)
        print(f"measuring {', '.join(s.name for s in systems)} at {args.clients} clients, "
              f"{args.repeats} run(s) of <= {args.seconds:g} s / {args.max_ops} puts each",
              flush=True)
        outcome = rpc.run(run_all(args, systems))
    except SetupError as exc:
        print(f"{BENCH}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{BENCH}: interrupted; stopping every cluster", file=sys.stderr)
        return 130
    finally:
        for system in reversed(started):
            try:
                system.stop()
            except Exception as exc:
                print(f"stopping {system.name} failed: {exc!r}", file=sys.stderr)
        if args.keep:
            print(f"data and logs kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    names = [s.name for s in systems]
    cases = summarize(outcome["runs"], names, args.clients)
    notes = {s.name: s.note + (f" (version {s.version})" if getattr(s, "version", "") else "")
             for s in systems}
    if "quorumlog" in notes:
        notes["quorumlog"] += f"; one MetaClient per {args.tasks_per_client} tasks"
    report = {
        "benchmark": BENCH,
        "machine": {"python": platform.python_version(), "platform": platform.platform(),
                    "cpus": os.cpu_count(), "fdatasync_ms": round(fsync_ms, 3)},
        "config": {"repeats": args.repeats, "seconds": args.seconds, "max_ops": args.max_ops,
                   "clients": args.clients, "keys": 1000, "value_bytes": VALUE_BYTES,
                   "tasks_per_meta_client": args.tasks_per_client},
        "systems": notes,
        "skipped": skipped,
        "cases": cases,
        "ratios": ratios(cases, args.clients),
        "checks": outcome["checks"],
        "runs": [r.summary() for r in outcome["runs"]],
    }
    print_tables(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    if args.markdown:
        args.markdown.write_text(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
