"""Real meta services for the tests: in this process, or a cluster of nodes.

``one_member`` runs a one-member meta group in this process (real WAL, rpc on
127.0.0.1) with an injected lease clock. ``running_cluster`` starts node
processes (``python -m quorumlog node``, as ``quorumlog up`` does); faults
are real signals: SIGKILL (crash), SIGSTOP/SIGCONT (a process that stops
answering, as if cut off).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import quorumlog.clock
from quorumlog import node as cluster
from quorumlog import rpc
from quorumlog.errors import QuorumlogError
from quorumlog.meta import MetaLimits
from quorumlog.meta._service import MetaService, MetaStatusRequest, MetaStatusResponse
from quorumlog.node._cluster import free_port
from quorumlog.raft import HostConfig, RaftHost
from rpc.support import wait_until

DEADLINE_S = 30.0  # one fault or recovery step of a test
POLL_INTERVAL_S = 0.1
# Asking a stopped process waits for the rpc connect timeout (10 s): polls
# that may meet one ask only the members they name, with this timeout.
MEMBER_STATUS_TIMEOUT_S = 0.5

Rows = list[dict[str, Any]]
TICK_MS = 20  # in-process members tick fast: an election timeout is 200 ms
ELECTION_TICKS = 10


@dataclass
class Clock:
    now_s: float = 1000.0

    def __call__(self) -> float:
        return self.now_s


@dataclass
class Member:
    service: MetaService
    address: str
    clock: Clock


@asynccontextmanager
async def one_member(
    root: Path, read_mode: str = "read_index", limits: MetaLimits | None = None,
    session_clock: quorumlog.clock.Clock = quorumlog.clock.SYSTEM_CLOCK,
) -> AsyncIterator[Member]:
    address = f"127.0.0.1:{free_port()}"
    host = RaftHost(1, {1: address}, root / "raft",
                    config=HostConfig(tick_interval_ms=TICK_MS,
                                      election_timeout_ticks=ELECTION_TICKS))
    clock = Clock()
    service = MetaService(host, read_mode=read_mode,  # type: ignore[arg-type]
                          limits=limits, lease_clock=clock, clock=session_clock)
    server = rpc.Server({**host.handlers(), **service.handlers()})
    await server.start("127.0.0.1", int(address.rsplit(":", 1)[1]))
    await host.start()
    service.start({1})
    try:
        yield Member(service, address, clock)
    finally:
        await server.close()
        await service.close()
        await host.close()


@contextmanager
def running_cluster(directory: Path, nodes: int = 3) -> Iterator[Path]:
    cluster.up(directory, nodes)
    try:
        yield directory
    finally:
        for info in cluster.load(directory):  # a stopped process cannot take SIGTERM
            _signal(info.pid, signal.SIGCONT)
        cluster.down(directory)


async def status_rows(directory: Path) -> Rows:
    """``quorumlog status`` rows (blocking calls: run off the event loop)."""
    rows: Rows = await asyncio.get_running_loop().run_in_executor(None, cluster.status, directory)
    return rows


async def until_status(
    directory: Path, predicate: Callable[[Rows], bool], what: str, timeout_s: float = DEADLINE_S
) -> Rows:
    """Poll the cluster's status until ``predicate(rows)``; the rows that passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = await status_rows(directory)
        if predicate(rows):
            return rows
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; status: {rows}")
        await asyncio.sleep(POLL_INTERVAL_S)


async def until_members(
    addresses: list[str],
    predicate: Callable[[list[MetaStatusResponse | None]], bool],
    what: str,
    timeout_s: float = DEADLINE_S,
) -> list[MetaStatusResponse | None]:
    """Poll the meta status of the named members (None: no answer) until
    ``predicate``; for clusters with stopped members (``until_status`` would
    wait on each stopped one)."""
    pool = rpc.Pool()

    async def one(address: str) -> MetaStatusResponse | None:
        try:
            return await pool.call(address, MetaStatusRequest(), timeout_s=MEMBER_STATUS_TIMEOUT_S)
        except QuorumlogError:
            return None

    deadline = time.monotonic() + timeout_s
    try:
        while True:
            statuses = list(await asyncio.gather(*(one(a) for a in addresses)))
            if predicate(statuses):
                return statuses
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; statuses: {statuses}")
            await asyncio.sleep(POLL_INTERVAL_S)
    finally:
        await pool.close()


def leader_of(rows: Rows) -> dict[str, Any] | None:
    leaders = [r for r in rows if r.get("meta_role") == "leader"]
    return leaders[0] if len(leaders) == 1 else None


def all_members_settled(rows: Rows) -> bool:
    """One leader, every meta member its leader or follower."""
    meta = [r for r in rows if "meta" in r["roles"]]
    return leader_of(rows) is not None and all(
        r.get("meta_role") in ("leader", "follower") for r in meta)


async def kill_and_restart_leader(
    directory: Path, progress: Callable[[], int], operations_after_kill: int
) -> int:
    """SIGKILL the meta leader; wait until ``progress()`` grew by the given
    number of operations without it, then restart it and wait for it to rejoin.
    Returns the id of the node killed."""
    rows = await until_status(directory, lambda r: leader_of(r) is not None, "a leader")
    leader = leader_of(rows)
    assert leader is not None
    before = progress()
    os.kill(int(leader["pid"]), signal.SIGKILL)
    await wait_until(lambda: progress() >= before + operations_after_kill,
                     timeout_s=DEADLINE_S, what="progress after killing the leader")
    await asyncio.get_running_loop().run_in_executor(
        None, cluster.restart_node, directory, int(leader["id"]))
    await until_status(directory, all_members_settled, "the killed node to rejoin")
    return int(leader["id"])


def stop(pid: int) -> None:
    _signal(pid, signal.SIGSTOP)


def resume(pid: int) -> None:
    _signal(pid, signal.SIGCONT)


def _signal(pid: int, sig: signal.Signals) -> None:
    with suppress(ProcessLookupError):
        os.kill(pid, sig)
