"""A closed-loop load generator shared by the comparison benchmarks.

The design is the same for every system measured, only the ``put`` callable
differs: ``clients`` asyncio tasks on one event loop, each issuing one put at a
time (wait for the answer, then send the next) on keys drawn uniformly from a
fixed key set, with a fixed value. A run stops issuing when ``max_ops`` puts
were issued or ``max_seconds`` passed, whichever comes first, then waits for
the puts in flight. Every put's latency is recorded (perf_counter around the
awaited call), so percentiles are exact, not sampled.

CPU accounting: the load generator's own process CPU (``time.process_time``)
and the servers' CPU (utime + stime of their pids from ``/proc``) are read
around the run, so a table can show what each put costs on a 2-core box where
clients and servers share the cores.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

KEYS = 1_000
VALUE_BYTES = 100
KEY_NAMES = [f"/bench/key-{i:04d}" for i in range(KEYS)]
VALUE = bytes(random.Random(42).randrange(256) for _ in range(VALUE_BYTES))
ERRORS_MAX = 100  # a run with more failed puts than this is aborted
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

Put = Callable[[int, str, bytes], Awaitable[object]]  # (client index, key, value)


class LoadError(RuntimeError):
    """Too many puts failed: the system under test is not healthy."""


@dataclass(slots=True)
class RunResult:
    """One measured run of one system at one concurrency."""

    system: str
    clients: int
    ops: int
    seconds: float
    errors: int
    latencies_s: list[float] = field(repr=False)
    client_cpu_s: float = 0.0
    server_cpu_s: float = 0.0

    @property
    def rate(self) -> float:
        return self.ops / self.seconds if self.seconds > 0 else 0.0

    def percentile_ms(self, q: float) -> float:
        return percentile(self.latencies_s, q) * 1000

    def summary(self) -> dict[str, float | int | str]:
        ops = max(self.ops, 1)
        return {
            "system": self.system,
            "clients": self.clients,
            "ops": self.ops,
            "seconds": round(self.seconds, 4),
            "errors": self.errors,
            "puts_per_s": round(self.rate, 1),
            "p50_ms": round(self.percentile_ms(50), 3),
            "p99_ms": round(self.percentile_ms(99), 3),
            "max_ms": round(max(self.latencies_s, default=0.0) * 1000, 3),
            "client_cpu_us_per_put": round(self.client_cpu_s / ops * 1e6, 1),
            "server_cpu_us_per_put": round(self.server_cpu_s / ops * 1e6, 1),
        }


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of ``values`` (need not be sorted)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports on 127.0.0.1 (held open together, then released)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def cpu_seconds(pids: Sequence[int]) -> float:
    """utime + stime of ``pids`` (every thread), from /proc; 0 for a pid that is gone."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return total / _CLOCK_TICKS


async def closed_loop(
    put: Put,
    *,
    clients: int,
    max_ops: int,
    max_seconds: float,
    seed: int = 1,
) -> tuple[int, float, int, list[float]]:
    """Run the load; return (puts completed, seconds, errors, latencies in seconds)."""
    loop = asyncio.get_running_loop()
    issued = 0
    errors = 0
    latencies: list[float] = []
    start = time.perf_counter()
    deadline = loop.time() + max_seconds
    perf = time.perf_counter
    keys = KEY_NAMES
    value = VALUE

    async def client(index: int) -> None:
        nonlocal issued, errors
        rng = random.Random(seed * 100_003 + index)
        while issued < max_ops and loop.time() < deadline:
            issued += 1
            key = keys[rng.randrange(KEYS)]
            t0 = perf()
            try:
                await put(index, key, value)
            except Exception as exc:
                errors += 1
                if errors > ERRORS_MAX:
                    raise LoadError(f"more than {ERRORS_MAX} puts failed; last: {exc!r}") from exc
                continue
            latencies.append(perf() - t0)

    tasks = [loop.create_task(client(i)) for i in range(clients)]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    seconds = time.perf_counter() - start
    return len(latencies), seconds, errors, latencies


async def measure(
    system: str,
    put: Put,
    *,
    clients: int,
    max_ops: int,
    max_seconds: float,
    warmup_ops: int,
    server_pids: Sequence[int],
    seed: int = 1,
) -> RunResult:
    """A short warm-up (connections, leader discovery), then the measured run."""
    if warmup_ops > 0:
        await closed_loop(put, clients=clients, max_ops=warmup_ops,
                          max_seconds=max(1.0, max_seconds / 5), seed=seed + 7919)
    cpu0, server0 = time.process_time(), cpu_seconds(server_pids)
    ops, seconds, errors, latencies = await closed_loop(
        put, clients=clients, max_ops=max_ops, max_seconds=max_seconds, seed=seed
    )
    return RunResult(
        system=system, clients=clients, ops=ops, seconds=seconds, errors=errors,
        latencies_s=latencies,
        client_cpu_s=time.process_time() - cpu0,
        server_cpu_s=cpu_seconds(server_pids) - server0,
    )
