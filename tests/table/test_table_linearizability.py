"""Linearizability of table operations under leader kills, on real node processes.

Three nodes on 127.0.0.1 (meta, bookie, table); one table of one partition,
so every kill hits the leader of every key. A few concurrent clients run
``set``, ``get``, ``check_and_set`` and ``incr`` on a handful of keys while the
test SIGKILLs the partition's leader and restarts it, a few times. The
history (call and return times on one clock; a write whose client gave up is
indeterminate, a get that gave up is dropped) goes to the project's checker
(``quorumlog.sim.check_history``).

How the table's operations map onto the checker's register model (values are
decimal integers): ``set v`` is a put; ``get`` a get; ``check_and_set`` with
``BYTES_EQUAL`` is a compare-and-set; an ``incr`` by 1 that returned ``r`` is a
compare-and-set ``r-1 -> r`` that succeeded (it read ``r-1`` and wrote ``r``
atomically). An ``incr`` applied twice (the client's retry after a leader
died between applying and answering, without exactly-once writes) leaves a
value that no operation wrote, and the checker rejects the history.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorumlog import node as cluster
from quorumlog.errors import DeadlineExceededError
from quorumlog.sim import Operation, OpKind, check_history
from quorumlog.table import CheckType, TableClient

TABLE = "linear"
KEYS = [b"k0", b"k1", b"k2"]
SORT_KEY = b"v"
CLIENTS = 4
REQUEST_TIMEOUT_S = 2.0  # one attempt; a killed leader refuses connections at once
OPERATION_DEADLINE_S = 30.0  # covers a re-election and a restart
KILL_ROUNDS = 2
KILL_ROUNDS_SLOW = 6
OPERATIONS_BETWEEN_KILLS = 60  # completed operations before the next kill
SETTLE_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def cluster_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    directory = tmp_path_factory.mktemp("table-linear")
    with cluster.running(directory, 3):
        yield directory


class _Recorder:
    def __init__(self) -> None:
        self.history: list[Operation] = []
        self.completed = 0
        self.incr_unknown = 0
        self.stop = False


async def _client_loop(index: int, tables: TableClient, recorder: _Recorder, seed: int) -> None:
    rng = random.Random(seed)
    while not recorder.stop:
        key = rng.choice(KEYS)
        name = key.decode()
        kind = rng.choice(["get", "set", "cas", "incr"])
        value, expected = rng.randrange(1000), rng.randrange(1000)
        inputs: dict[str, object] = {"get": None, "set": value, "cas": (expected, value)}
        call = time.monotonic()
        try:
            if kind == "get":
                raw = await tables.get(TABLE, key, SORT_KEY)
                op = Operation(index, OpKind.GET, name, None,
                               None if raw is None else int(raw), call, time.monotonic())
            elif kind == "set":
                await tables.set(TABLE, key, SORT_KEY, b"%d" % value)
                op = Operation(index, OpKind.PUT, name, value, None, call, time.monotonic())
            elif kind == "cas":
                result = await tables.check_and_set(
                    TABLE, key, check_sort_key=SORT_KEY, check_type=CheckType.BYTES_EQUAL,
                    operand=b"%d" % expected, set_sort_key=SORT_KEY, value=b"%d" % value)
                op = Operation(index, OpKind.CAS, name, (expected, value), result.succeeded,
                               call, time.monotonic())
            else:
                counter = await tables.incr(TABLE, key, SORT_KEY, 1)
                op = Operation(index, OpKind.CAS, name, (counter - 1, counter), True, call,
                               time.monotonic())
        except DeadlineExceededError:
            if kind == "incr":
                recorder.incr_unknown += 1  # the register model cannot express it
                continue
            op = Operation(index, _KINDS[kind], name, inputs[kind], None, call, None)
        recorder.history.append(op)
        recorder.completed += 1


_KINDS = {"get": OpKind.GET, "set": OpKind.PUT, "cas": OpKind.CAS}


async def _kill_leader_rounds(cluster_dir: Path, tables: TableClient, recorder: _Recorder,
                              rounds: int) -> None:
    table_id = (await tables.table_info(TABLE)).record.table_id
    for _ in range(rounds):
        target = recorder.completed + OPERATIONS_BETWEEN_KILLS
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while recorder.completed < target and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert recorder.completed >= target, "operations stalled before a kill"
        await tables.get(TABLE, KEYS[0], SORT_KEY)  # learns the current leader
        leader = tables._leaders.get((table_id, 0))
        assert leader is not None, "the client knows no leader of the partition"
        victim = next(n for n in cluster.load(cluster_dir) if n.address == leader)
        os.kill(victim.pid, signal.SIGKILL)
        target = recorder.completed + OPERATIONS_BETWEEN_KILLS // 2
        while recorder.completed < target and time.monotonic() < deadline:
            await asyncio.sleep(0.05)  # operations go on under the new leader
        await asyncio.to_thread(cluster.restart_node, cluster_dir, victim.id,
                                serving_timeout_s=SETTLE_TIMEOUT_S)


async def _run(cluster_dir: Path, rounds: int, *, exactly_once: bool) -> _Recorder:
    addresses = cluster.meta_addresses(cluster_dir)
    recorder = _Recorder()
    async with TableClient(addresses) as admin:
        await admin.create_table(TABLE, partitions=1, replicas=3)
        for key in KEYS:
            await admin.set(TABLE, key, SORT_KEY, b"0")
        recorder.history += [Operation(-1, OpKind.PUT, key.decode(), 0, None, 0.0, 0.0)
                             for key in KEYS]
        clients = [TableClient(addresses, request_timeout_s=REQUEST_TIMEOUT_S,
                               deadline_s=OPERATION_DEADLINE_S, exactly_once=exactly_once)
                   for _ in range(CLIENTS)]
        try:
            loops = [asyncio.create_task(_client_loop(i, c, recorder, seed=i))
                     for i, c in enumerate(clients)]
            try:
                await _kill_leader_rounds(cluster_dir, admin, recorder, rounds)
            finally:
                recorder.stop = True
                await asyncio.gather(*loops)
        finally:
            for client in clients:
                await client.close()
        await admin.drop_table(TABLE)
    return recorder


def _check(cluster_dir: Path, rounds: int) -> None:
    recorder = asyncio.run(_run(cluster_dir, rounds, exactly_once=True))
    assert recorder.incr_unknown == 0, "an incr gave up past its deadline"
    incrs = sum(1 for op in recorder.history if op.kind is OpKind.CAS and op.output is True)
    assert incrs > 0
    result = check_history(recorder.history)
    assert result.ok, f"{result.verdict}: {result.explanation}"


def test_table_operations_are_linearizable_under_leader_kills(cluster_dir: Path) -> None:
    _check(cluster_dir, KILL_ROUNDS)


@pytest.mark.slow
def test_table_operations_are_linearizable_under_many_leader_kills(cluster_dir: Path) -> None:
    _check(cluster_dir, KILL_ROUNDS_SLOW)
