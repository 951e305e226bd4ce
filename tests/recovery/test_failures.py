"""Crashes during recovery, with real processes: a replication worker SIGKILLed
mid-copy, and the node holding the auditor lease SIGKILLed mid-run."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorumlog import node as cluster
from quorumlog import rpc
from quorumlog.errors import QuorumlogError
from quorumlog.ledger import LedgerClient
from quorumlog.meta import MetaClient
from quorumlog.proto import ledger_key
from quorumlog.recovery import AUDITOR_KEY, TASK_PREFIX, ReplicationTask, task_key

from .support import RECOVERY_ENV, metadata_of, poll, running_cluster

DEADLINE_S = 60.0
BIG_ENTRIES = 40
BIG_ENTRY_BYTES = 2048
# 8 KiB/s with 4-entry (8 KiB) batches: the lost replica's ~27 entries take
# ~7 s to copy, so a kill after the first batch lands mid-copy.
SLOW_ENV = {"QUORUMLOG_RECOVERY__THROTTLE_BYTES_PER_S": "8192",
            "QUORUMLOG_RECOVERY__COPY_BATCH_ENTRIES_MAX": "4"}
WORKER_SCRIPT = """
import asyncio, sys
from quorumlog.recovery import RecoveryConfig, RecoveryService

async def main():
    config = RecoveryConfig(lost_bookie_recovery_delay_ms=1000, audit_interval_ms=300,
                            worker_poll_interval_ms=300, lease_ttl_ms=2000,
                            throttle_bytes_per_s=8192, copy_batch_entries_max=4)
    service = RecoveryService(sys.argv[1], sys.argv[2].split(","), config)
    await service.start()
    await asyncio.Event().wait()

asyncio.run(main())
"""


def _big(ledger_id: int, entry_id: int) -> bytes:
    return (f"{ledger_id}/{entry_id}:".encode() * BIG_ENTRY_BYTES)[:BIG_ENTRY_BYTES]


def _worker(name: str, meta: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-c", WORKER_SCRIPT, name, ",".join(meta)],
                                stdout=out, stderr=subprocess.STDOUT)


async def _write_big(meta: list[str], count: int, write_quorum: int = 2) -> list[int]:
    async with LedgerClient.connect(meta) as client:
        ids = []
        for _ in range(count):
            handle = await client.create_ledger(3, write_quorum, 2, password=b"pw")
            for e in range(BIG_ENTRIES):
                await handle.append(_big(handle.id, e))
            await handle.close()
            ids.append(handle.id)
        return ids


async def _holds(client: LedgerClient, bookie: str, ledger_id: int, entry_id: int) -> bool:
    try:
        await client.context.bookies.read_entry(bookie, ledger_id, entry_id, timeout_s=5)
    except QuorumlogError:
        return False
    return True


async def _check_readable(meta: list[str], ledgers: list[int], dead: set[str]) -> None:
    """Every entry reads back, and every bookie of its write set (none dead) holds it."""
    async with LedgerClient.connect(meta) as client:
        for ledger_id in ledgers:
            handle = await client.open_ledger(ledger_id, password=b"pw")
            metadata = handle.metadata
            got = [e.payload async for e in handle.read(0, metadata.last_entry_id)]
            assert got == [_big(ledger_id, e) for e in range(BIG_ENTRIES)]
            for entry_id in range(BIG_ENTRIES):
                for bookie in metadata.write_set_bookies(entry_id):
                    assert bookie not in dead, (ledger_id, entry_id, bookie)
                    assert await _holds(client, bookie, ledger_id, entry_id)


@pytest.fixture
def quiet_cluster(tmp_path: Path) -> Iterator[Path]:
    """Four nodes whose own recovery role is off: the test runs the workers."""
    env = {**RECOVERY_ENV, "QUORUMLOG_RECOVERY__ENABLED": "false"}
    with running_cluster(tmp_path / "cluster", 4, env) as directory:
        yield directory


@pytest.mark.slow  # ~35 s: a throttled copy, a lease expiry and a second copy
def test_worker_killed_mid_copy_is_taken_over(quiet_cluster: Path, tmp_path: Path) -> None:
    infos = cluster.load(quiet_cluster)
    victim_info = infos[3]
    victim = victim_info.address
    meta = cluster.meta_addresses(quiet_cluster)
    ledgers = rpc.run(_write_big(meta, 3))

    async def first_naming() -> int:
        async with MetaClient(meta) as client:
            for ledger_id in ledgers:
                if victim in (await metadata_of(client, ledger_id)).ensembles[0].bookies:
                    return ledger_id
        raise AssertionError("random placement put the victim in no ensemble")

    target_ledger = rpc.run(first_naming())
    os.kill(victim_info.pid, signal.SIGKILL)
    versions: dict[int, int] = {}

    async def remember_versions() -> None:
        async with MetaClient(meta) as client:
            for ledger_id in ledgers:
                kv = await client.get(ledger_key(ledger_id))
                assert kv is not None
                versions[ledger_id] = kv.version

    rpc.run(remember_versions())

    async def slots_naming_victim() -> dict[int, int]:
        async with MetaClient(meta) as client:
            return {i: sum(f.bookies.count(victim)
                           for f in (await metadata_of(client, i)).ensembles) for i in ledgers}

    slots = rpc.run(slots_naming_victim())
    worker_a = _worker("worker-a", meta, tmp_path / "worker-a.log")
    worker_b: subprocess.Popen[bytes] | None = None
    try:
        async def copy_started() -> tuple[str, list[int]]:
            """The replacement worker A chose, once it holds part of the copy."""
            async with LedgerClient.connect(meta) as client:
                metadata = await metadata_of(client.meta, target_ledger)
                position = metadata.ensembles[0].bookies.index(victim)
                entries = [e for e in range(BIG_ENTRIES)
                           if metadata.schedule.stores(e, position)]
                deadline = time.monotonic() + DEADLINE_S
                while time.monotonic() < deadline:
                    kv = await client.meta.get(task_key(target_ledger))
                    if kv is not None:
                        chosen = list(ReplicationTask.decode(kv.value).replacements.values())
                        if chosen and await _holds(client, chosen[0], target_ledger,
                                                   entries[0]):
                            return chosen[0], entries
                    await asyncio.sleep(0.05)
                raise AssertionError("worker A never started copying")

        replacement, entries = rpc.run(copy_started())
        worker_a.send_signal(signal.SIGKILL)
        worker_a.wait()

        async def copied_part() -> list[bool]:
            async with LedgerClient.connect(meta) as client:
                return [await _holds(client, replacement, target_ledger, e) for e in entries]

        held = rpc.run(copied_part())
        assert held[0] and not all(held), f"the kill did not land mid-copy: {held}"

        async def unchanged() -> None:  # the swap comes after the copy
            async with MetaClient(meta) as client:
                kv = await client.get(ledger_key(target_ledger))
                assert kv is not None and kv.version == versions[target_ledger]

        rpc.run(unchanged())

        worker_b = _worker("worker-b", meta, tmp_path / "worker-b.log")

        async def all_done() -> bool:
            async with MetaClient(meta) as client:
                if await client.list_keys(TASK_PREFIX):
                    return False
                for ledger_id in ledgers:
                    metadata = await metadata_of(client, ledger_id)
                    if any(victim in f.bookies for f in metadata.ensembles):
                        return False
                return True

        rpc.run(poll(all_done, DEADLINE_S, "worker B finishes every task", interval_s=0.3))

        async def changed_once() -> None:
            async with MetaClient(meta) as client:
                for ledger_id in ledgers:
                    kv = await client.get(ledger_key(ledger_id))
                    assert kv is not None
                    metadata = await metadata_of(client, ledger_id)
                    # one compare-and-swap per replaced slot, never a second one
                    assert kv.version == versions[ledger_id] + slots[ledger_id], (
                        ledger_id, kv.version, versions[ledger_id], slots[ledger_id])
                    if ledger_id == target_ledger:  # B copied to A's choice, and swapped once
                        assert replacement in metadata.ensembles[0].bookies
                auditor = await client.get(AUDITOR_KEY)
                assert auditor is not None and auditor.value == b"worker-b"

        rpc.run(changed_once())
        rpc.run(_check_readable(meta, ledgers, {victim}))
    finally:
        for proc in (worker_a, worker_b):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.slow  # ~45 s: five nodes, two losses, a lease expiry
def test_auditor_killed_mid_run_another_takes_over(tmp_path: Path) -> None:
    env = {**RECOVERY_ENV, "QUORUMLOG_RECOVERY__THROTTLE_BYTES_PER_S": "32768",
           "QUORUMLOG_RECOVERY__COPY_BATCH_ENTRIES_MAX": "4"}
    with running_cluster(tmp_path / "cluster", 5, env) as directory:
        infos = cluster.load(directory)
        meta = cluster.meta_addresses(directory)
        # Qw=3: two lost bookies of one ensemble still leave a copy of every entry.
        ledgers = rpc.run(_write_big(meta, 6, write_quorum=3))

        async def auditor_now() -> str:
            async with MetaClient(meta) as client:
                deadline = time.monotonic() + DEADLINE_S
                while (kv := await client.get(AUDITOR_KEY)) is None:
                    assert time.monotonic() < deadline, "no auditor elected"
                    await asyncio.sleep(0.1)
                return kv.value.decode()

        first_auditor = rpc.run(auditor_now())
        auditor_info = next(i for i in infos if i.address == first_auditor)
        victim_info = next(i for i in infos[3:] if i.address != first_auditor)
        os.kill(victim_info.pid, signal.SIGKILL)

        async def tasks_filed() -> bool:
            async with MetaClient(meta) as client:
                return bool(await client.list_keys(TASK_PREFIX))

        rpc.run(poll(tasks_filed, DEADLINE_S, "the auditor files tasks", interval_s=0.05))
        os.kill(auditor_info.pid, signal.SIGKILL)  # mid-run: tasks filed, copies throttled
        assert rpc.run(tasks_filed()), "recovery finished before the auditor was killed"

        async def new_auditor() -> bool:
            async with MetaClient(meta) as client:
                kv = await client.get(AUDITOR_KEY)
                return kv is not None and kv.value.decode() != first_auditor

        rpc.run(poll(new_auditor, DEADLINE_S, "another node takes the auditor lease"))
        dead = {victim_info.address, first_auditor}

        async def recovered() -> bool:
            async with MetaClient(meta) as client:
                if await client.list_keys(TASK_PREFIX):
                    return False
                for ledger_id in ledgers:
                    metadata = await metadata_of(client, ledger_id)
                    if any(dead & set(f.bookies) for f in metadata.ensembles):
                        return False
                return True

        rpc.run(poll(recovered, DEADLINE_S, "recovery of both lost bookies", interval_s=0.3))
        rpc.run(_check_readable(meta, ledgers, dead))
