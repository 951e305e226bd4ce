"""A worker's copy skips the replacement's journal (``FLAG_NO_JOURNAL``), so it
must be made durable before the metadata names the replacement: copy ->
``FlushLedgerRequest`` -> metadata compare-and-swap, and a replacement that
restarts between the copy and the flush leaves the metadata alone and the
task is copied again.

The real ``ReplicationWorker`` runs against the simulator's bookies (the
bookie's own rules; memory is lost in a crash unless flushed) and meta on
virtual time.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from quorumlog import proto
from quorumlog.recovery import (
    RecoveryConfig,
    RecoverySession,
    ReplicationTask,
    ReplicationWorker,
    TaskState,
    task_key,
)
from quorumlog.sim import LedgerWorld, run_virtual
from quorumlog.sim._recovery_runner import run_recovery_seed
from quorumlog.sim._recovery_world import SimRecoveryMeta

PASSWORD = b"pw"
ENTRIES = 20
LOST = "b3"
SIM_SEEDS = range(8_100_000, 8_100_012)


class OrderTransport:
    """The world's transport for the worker, noting each add batch (with its
    flags) and flush request, in order, into ``events``."""

    def __init__(self, inner: Any, events: list[tuple[Any, ...]]) -> None:
        self._inner = inner
        self.events = events
        self.before_flush: list[Any] = []  # callables run when a flush is sent

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def add_entries(self, bookie: str, ledger_id: int, key: bytes,
                    entries: list[tuple[int, bytes]], **kw: Any) -> asyncio.Future[Any]:
        self.events.append(("add", bookie, ledger_id, kw["flags"], [e for e, _ in entries]))
        future: asyncio.Future[Any] = self._inner.add_entries(bookie, ledger_id, key, entries,
                                                              **kw)
        return future

    async def flush_ledger(self, bookie: str, ledger_id: int, key: bytes,
                           entry_ids: list[int], **kw: Any) -> int:
        for hook in self.before_flush:
            hook(bookie)
        self.events.append(("flush", bookie, ledger_id, list(entry_ids)))
        result: int = await self._inner.flush_ledger(bookie, ledger_id, key, entry_ids, **kw)
        self.events.append(("flushed", bookie, ledger_id))
        return result


async def _setup(world: LedgerWorld) -> tuple[SimRecoveryMeta, int, list[tuple[Any, ...]]]:
    """A closed E=3/Qw=2 ledger on ``LOST``, whose disk is then lost, and its task;
    meta notes every compare-and-swap of the ledger's metadata in the events."""
    events: list[tuple[Any, ...]] = []
    meta = SimRecoveryMeta(random.Random(1), world.tracer, world.network)
    world.meta = meta
    client = world.client("writer")
    while True:
        handle = await client.create_ledger(3, 2, 2, password=PASSWORD)
        for e in range(ENTRIES):
            await handle.append(bytes([e]) * 500)
        await handle.close()
        if LOST in handle.metadata.ensembles[0].bookies:
            break
    world.bookies[LOST].crash(lose_disk=True)
    task = ReplicationTask(ledger_id=handle.id, bookies=(LOST,), created_ms=world.wall_ms())
    assert await meta.cas(task_key(handle.id), 0, task.encode())
    cas = meta.cas

    async def noting_cas(key: str, expected_version: int, value: bytes, *,
                         session_id: int = 0) -> bool:
        if key == proto.ledger_key(handle.id):
            events.append(("cas", key))
        return await cas(key, expected_version, value, session_id=session_id)

    meta.cas = noting_cas  # type: ignore[method-assign]
    return meta, handle.id, events


def _worker(world: LedgerWorld, meta: SimRecoveryMeta, transport: OrderTransport,
            config: RecoveryConfig) -> ReplicationWorker:
    return ReplicationWorker("w", world.client("worker", transport=transport), meta,
                             RecoverySession(meta, config.lease_ttl_ms), config,
                             clock=world, rng=random.Random(4))


def test_copy_is_unjournaled_then_flushed_before_the_swap() -> None:
    async def scenario() -> None:
        world = LedgerWorld(bookies=5, seed=11)
        meta, ledger_id, events = await _setup(world)
        config = RecoveryConfig(copy_batch_entries_max=4)
        transport = OrderTransport(world.transport("worker"), events)
        assert await _worker(world, meta, transport, config).work_once() == [ledger_id]

        kinds = [event[0] for event in events]
        adds = [event for event in events if event[0] == "add"]
        assert adds and all(flags == proto.FLAG_RECOVERY | proto.FLAG_NO_JOURNAL
                            for _, _, _, flags, _ in adds)
        target = adds[0][1]
        copied = [e for *_, ids in adds for e in ids]
        assert kinds.index("flush") > max(i for i, k in enumerate(kinds) if k == "add")
        assert events[kinds.index("flush")] == ("flush", target, ledger_id, copied)
        assert kinds.index("cas") > kinds.index("flushed"), events
        after = meta.peek(ledger_id)
        assert after is not None and target in after.ensembles[0].bookies
        durable = world.bookies[target].durable_entries(ledger_id)
        assert all(e in durable for e in copied)

    run_virtual(scenario())


def test_journaled_copies_when_configured_send_no_flush() -> None:
    async def scenario() -> None:
        world = LedgerWorld(bookies=5, seed=11)
        meta, ledger_id, events = await _setup(world)
        config = RecoveryConfig(copy_batch_entries_max=4, copy_without_journal=False)
        transport = OrderTransport(world.transport("worker"), events)
        assert await _worker(world, meta, transport, config).work_once() == [ledger_id]
        assert {event[3] for event in events if event[0] == "add"} == {proto.FLAG_RECOVERY}
        assert "flush" not in [event[0] for event in events]

    run_virtual(scenario())


def test_target_restarted_before_the_flush_leaves_metadata_and_copies_again() -> None:
    async def scenario() -> None:
        world = LedgerWorld(bookies=5, seed=11)
        meta, ledger_id, events = await _setup(world)
        before = meta.peek(ledger_id)
        version = (await meta.get(proto.ledger_key(ledger_id)))
        assert before is not None and version is not None
        config = RecoveryConfig(copy_batch_entries_max=4, retry_backoff_ms=100)
        transport = OrderTransport(world.transport("worker"), events)
        restarted: list[str] = []

        def restart_target(bookie: str) -> None:  # SIGKILL and start again, once
            if not restarted:
                world.bookies[bookie].crash()
                world.bookies[bookie].restart()
                restarted.append(bookie)

        transport.before_flush.append(restart_target)
        worker = _worker(world, meta, transport, config)
        assert await worker.work_once() == []
        now = await meta.get(proto.ledger_key(ledger_id))
        assert now is not None and now.version == version.version  # no swap
        kv = await meta.get(task_key(ledger_id))
        assert kv is not None
        task = ReplicationTask.decode(kv.value)
        assert task.state is TaskState.PENDING and task.attempts == 1
        assert "did not make the copy durable" in task.error

        await asyncio.sleep(task.retry_after_ms / 1000 - world.wall_ms() / 1000 + 0.01)
        assert await worker.work_once() == [ledger_id]
        after = meta.peek(ledger_id)
        assert after is not None and LOST not in after.ensembles[0].bookies
        for e in range(ENTRIES):
            for bookie in after.write_set_bookies(e):
                assert e in world.bookies[bookie].durable_entries(ledger_id), (bookie, e)

    run_virtual(scenario())


def test_simulator_catches_a_worker_that_swaps_before_the_flush(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted bug: no flush before the swap. The recovery simulator's
    swap-before-copy check (the newcomer must hold the entry durably when the
    metadata names it) fails; with the flush every seed passes."""
    assert all(run_recovery_seed(seed).passed for seed in SIM_SEEDS)

    async def no_flush(*args: object, **kwargs: object) -> None:
        return None

    monkeypatch.setattr(ReplicationWorker, "_flush", no_flush)
    violations = {run_recovery_seed(seed).violation for seed in SIM_SEEDS}
    assert "swap-before-copy" in violations
