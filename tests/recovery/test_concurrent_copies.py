"""One worker copies several ledgers at once (``copy_ledgers_in_flight_max``),
and still swaps each slot exactly once, keeps to its throttle, isolates a
failing ledger from the others, and releases every lock.

The real ``ReplicationWorker`` runs against the simulator's bookies (the
bookie's own rules) and meta on virtual time; the transport it copies through
records every batch of recovery adds it sends.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from quorumlog import proto
from quorumlog.ledger import master_key
from quorumlog.recovery import (
    TASK_PREFIX,
    RecoveryConfig,
    RecoverySession,
    ReplicationTask,
    ReplicationWorker,
    TaskState,
    task_key,
)
from quorumlog.recovery._layout import LOCK_PREFIX
from quorumlog.sim import LedgerWorld, run_virtual
from quorumlog.sim._recovery_world import SimRecoveryMeta

PASSWORD = b"pw"
ENTRIES = 24
PAYLOAD_BYTES = 1000
LOST = "b3"
THROTTLE_BYTES_PER_S = 10_000  # the two copies (about 33 KB) take seconds of virtual time


class RecordingTransport:
    """The world's transport for the worker, recording each recovery-add batch:
    (virtual time, ledger, bytes) at send, and each ledger's copy span (its
    first batch sent to its last batch answered)."""

    def __init__(self, inner: Any, world: LedgerWorld) -> None:
        self._inner = inner
        self._world = world
        self.sent: list[tuple[float, int, int]] = []
        self.spans: dict[int, list[float]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def add_entries(self, bookie: str, ledger_id: int, key: bytes,
                    entries: list[tuple[int, bytes]], **kw: Any) -> asyncio.Future[Any]:
        now_s = self._world.monotonic_s()
        self.sent.append((now_s, ledger_id, sum(len(e) for _, e in entries)))
        self.spans.setdefault(ledger_id, [now_s, now_s])
        future: asyncio.Future[Any] = self._inner.add_entries(bookie, ledger_id, key, entries,
                                                              **kw)

        def landed(_: asyncio.Future[Any]) -> None:
            self.spans[ledger_id][1] = self._world.monotonic_s()

        future.add_done_callback(landed)
        return future


async def _ledgers_on(world: LedgerWorld, bookie: str, count: int) -> list[int]:
    """``count`` closed E=3, Qw=2 ledgers whose ensemble holds ``bookie``."""
    client = world.client("writer")
    ids: list[int] = []
    while len(ids) < count:
        handle = await client.create_ledger(3, 2, 2, password=PASSWORD)
        for e in range(ENTRIES):
            await handle.append(bytes([e % 256]) * PAYLOAD_BYTES)
        await handle.close()
        if bookie in handle.metadata.ensembles[0].bookies:
            ids.append(handle.id)
    return ids


def test_one_worker_copies_ledgers_concurrently_each_swapped_once() -> None:
    async def scenario() -> None:
        world = LedgerWorld(bookies=5, seed=7)
        world.meta = meta = SimRecoveryMeta(random.Random(1), world.tracer, world.network)
        first, second, broken = await _ledgers_on(world, LOST, 3)
        versions = {}
        for ledger_id in (first, second, broken):
            kv = await meta.get(proto.ledger_key(ledger_id))
            assert kv is not None
            versions[ledger_id] = kv.version
        world.bookies[LOST].crash(lose_disk=True)
        # The broken ledger's other replicas are gone too: its copy fails.
        broken_metadata = meta.peek(broken)
        assert broken_metadata is not None
        for other in set(broken_metadata.ensembles[0].bookies) - {LOST}:
            world.bookies[other].delete_ledger(broken, master_key(PASSWORD))
        for ledger_id in (first, second, broken):
            task = ReplicationTask(ledger_id=ledger_id, bookies=(LOST,),
                                   created_ms=world.wall_ms())
            assert await meta.cas(task_key(ledger_id), 0, task.encode())

        config = RecoveryConfig(copy_ledgers_in_flight_max=3, copy_batch_entries_max=4,
                                throttle_bytes_per_s=THROTTLE_BYTES_PER_S)
        transport = RecordingTransport(world.transport("worker"), world)
        worker = ReplicationWorker("w", world.client("worker", transport=transport), meta,
                                   RecoverySession(meta, config.lease_ttl_ms), config,
                                   clock=world, rng=random.Random(4))
        started_s = world.monotonic_s()
        assert sorted(await worker.work_once()) == sorted([first, second])

        (a0, a1), (b0, b1) = transport.spans[first], transport.spans[second]
        assert a0 < b1 and b0 < a1, f"the two copies never overlapped: {transport.spans}"
        for ledger_id in (first, second):
            after = meta.peek(ledger_id)
            assert after is not None and LOST not in after.ensembles[0].bookies
            kv = await meta.get(proto.ledger_key(ledger_id))
            assert kv is not None and kv.version == versions[ledger_id] + 1  # one swap
            held = {b: world.bookies[b].durable_entries(ledger_id)
                    for b in after.ensembles[0].bookies}
            for e in range(ENTRIES):
                assert all(e in held[b] for b in after.write_set_bookies(e)), (ledger_id, e)
        # The failing ledger is reported and its metadata untouched.
        kv = await meta.get(task_key(broken))
        assert kv is not None and ReplicationTask.decode(kv.value).state is TaskState.LOST
        kv = await meta.get(proto.ledger_key(broken))
        assert kv is not None and kv.version == versions[broken]
        assert not await meta.list_keys(LOCK_PREFIX)  # every lock released
        assert [t.key for t in await meta.list_keys(TASK_PREFIX)] == [task_key(broken)]

        # The concurrent copies shared the throttle: by any batch's send, no more
        # bytes had gone out than the rate allows since the worker began.
        sent_bytes = 0
        for at_s, _, size in transport.sent:
            sent_bytes += size
            allowed = THROTTLE_BYTES_PER_S * (at_s - started_s)
            assert sent_bytes <= allowed + 1, (
                f"{sent_bytes} bytes sent {at_s - started_s:.3f} s in: over the throttle")

    run_virtual(scenario())
