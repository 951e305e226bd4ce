"""Auto-recovery against real node processes: SIGKILL a bookie, keep it down,
and watch the auditor and workers bring every ledger back to full write quorum."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorumlog import node as cluster
from quorumlog import rpc
from quorumlog.ledger import LedgerClient
from quorumlog.meta import MetaClient
from quorumlog.proto import BOOKIE_REGISTRY_PREFIX
from quorumlog.recovery import TASK_PREFIX, recovery_status

from .support import cli, metadata_of, payload, running_cluster

DEADLINE_S = 60.0
# Longer than the recovery delay plus several audit rounds: what a paused
# auditor would have filed by then, an enabled one would have.
DISABLED_WAIT_S = 4.5
ENTRIES = 40


@pytest.fixture
def four_nodes(tmp_path: Path) -> Iterator[Path]:
    with running_cluster(tmp_path / "cluster", 4) as directory:
        yield directory


async def _write_ledgers(meta: list[str], closed: int) -> tuple[list[int], int]:
    async with LedgerClient.connect(meta) as client:
        ids = []
        for i in range(closed):
            digest = "hmac-sha256" if i % 2 else "crc32c"
            handle = await client.create_ledger(3, 2, 2, password=b"pw", digest=digest)
            for e in range(ENTRIES):
                await handle.append(payload(handle.id, e))
            await handle.close()
            ids.append(handle.id)
        open_handle = await client.create_ledger(3, 2, 2, password=b"pw")
        for e in range(ENTRIES):
            await open_handle.append(payload(open_handle.id, e))
        await open_handle.detach()  # left OPEN, as by a writer that died
        return ids, open_handle.id


async def _wait_replicated(meta_addresses: list[str], ledgers: list[int], victim: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    async with MetaClient(meta_addresses) as meta:
        while time.monotonic() < deadline:
            tasks = await meta.list_keys(TASK_PREFIX)
            named = [i for i in ledgers
                     if any(victim in f.bookies for f in (await metadata_of(meta, i)).ensembles)]
            if not tasks and not named:
                return
            await asyncio.sleep(0.3)
        status = await recovery_status(meta)
        raise AssertionError(f"not replicated in {DEADLINE_S} s: tasks {len(tasks)}, "
                             f"ledgers naming {victim}: {named}; status {status}")


async def _check_full_quorum(meta_addresses: list[str], ledgers: list[int],
                             victim: str) -> None:
    async with LedgerClient.connect(meta_addresses) as client:
        live = {kv.key.removeprefix(BOOKIE_REGISTRY_PREFIX)
                for kv in await client.meta.list_keys(BOOKIE_REGISTRY_PREFIX)}
        assert victim not in live
        for ledger_id in ledgers:
            handle = await client.open_ledger(ledger_id, password=b"pw")
            metadata = handle.metadata
            assert metadata.is_closed
            for fragment in metadata.ensembles:
                assert set(fragment.bookies) <= live, (ledger_id, fragment)
            got = [e.payload async for e in handle.read(0, metadata.last_entry_id)]
            assert got == [payload(ledger_id, e) for e in range(ENTRIES)]
            # every replica of every entry holds it (full write quorum), read directly
            for entry_id in range(ENTRIES):
                for bookie in metadata.write_set_bookies(entry_id):
                    reply = await client.context.bookies.read_entry(
                        bookie, ledger_id, entry_id, timeout_s=5)
                    assert reply.envelope


def test_killed_bookie_is_replicated_away(four_nodes: Path) -> None:
    infos = cluster.load(four_nodes)
    victim_info = infos[3]  # node 4: a bookie, no meta member
    victim = victim_info.address
    meta_addresses = cluster.meta_addresses(four_nodes)
    closed, open_id = rpc.run(_write_ledgers(meta_addresses, 8))
    ledgers = [*closed, open_id]

    async def naming() -> list[int]:
        async with MetaClient(meta_addresses) as meta:
            return [i for i in ledgers
                    if any(victim in f.bookies for f in (await metadata_of(meta, i)).ensembles)]

    named = rpc.run(naming())
    assert named, "random placement put the victim in no ensemble"
    assert cli("recovery", "disable", "--dir", str(four_nodes)).returncode == 0
    os.kill(victim_info.pid, signal.SIGKILL)
    # Paused: past the delay (and several audit rounds) nothing is filed or changed.
    time.sleep(DISABLED_WAIT_S)
    assert json.loads(cli("recovery", "list-underreplicated", "--json", "--dir",
                           str(four_nodes)).stdout) == {"ledgers": []}
    assert rpc.run(naming()) == named
    status = json.loads(cli("recovery", "status", "--json", "--dir", str(four_nodes)).stdout)
    assert status["enabled"] is False and status["auditor"]
    assert cli("recovery", "enable", "--dir", str(four_nodes)).returncode == 0
    rpc.run(_wait_replicated(meta_addresses, ledgers, victim))
    rpc.run(_check_full_quorum(meta_addresses, ledgers, victim))


LARGE_ENTRIES = 30  # about 20 on each bookie of an ensemble of 3: 20 MB a copy
LARGE_ENTRY_BYTES = 1_000_000


def _large(ledger_id: int, entry_id: int) -> bytes:
    return (b"%d:%d:" % (ledger_id, entry_id)).ljust(LARGE_ENTRY_BYTES, b"x")


def test_ledgers_of_large_entries_are_replicated_away(four_nodes: Path) -> None:
    """Entries of 1 MB: a worker's copy batch (up to 64 entries) must not become
    one add request past the rpc frame limit (16 MiB). Before, it did: "
    AddEntriesRequest of ... bytes exceeds max_frame_bytes", the task failed and
    was retried forever, and the ledgers stayed under-replicated."""
    infos = cluster.load(four_nodes)
    victim_info = infos[3]
    victim = victim_info.address
    meta_addresses = cluster.meta_addresses(four_nodes)

    async def write() -> list[int]:
        async with LedgerClient.connect(meta_addresses) as client:
            ids: list[int] = []
            named = False
            while len(ids) < 3 or not named:
                assert len(ids) < 8, "random placement kept the victim out of 8 ledgers"
                handle = await client.create_ledger(3, 2, 2, password=b"pw")
                for e in range(LARGE_ENTRIES):
                    await handle.append(_large(handle.id, e))
                await handle.close()
                ids.append(handle.id)
                named = named or any(victim in f.bookies for f in handle.metadata.ensembles)
            return ids

    ledgers = rpc.run(write())
    os.kill(victim_info.pid, signal.SIGKILL)
    rpc.run(_wait_replicated(meta_addresses, ledgers, victim))

    async def check() -> None:
        async with LedgerClient.connect(meta_addresses) as client:
            for ledger_id in ledgers:
                handle = await client.open_ledger(ledger_id, password=b"pw")
                assert all(victim not in f.bookies for f in handle.metadata.ensembles)
                for entry_id in range(LARGE_ENTRIES):
                    for bookie in handle.metadata.write_set_bookies(entry_id):
                        reply = await client.context.bookies.read_entry(
                            bookie, ledger_id, entry_id, timeout_s=5)
                        assert reply.envelope
                got = [e.payload async for e in handle.read(0, LARGE_ENTRIES - 1)]
                assert got == [_large(ledger_id, e) for e in range(LARGE_ENTRIES)]

    rpc.run(check())
