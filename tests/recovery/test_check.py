"""The periodic replica check against real node processes: entries silently
gone from a live, registered bookie are found and copied elsewhere."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from quorumlog import node as cluster
from quorumlog import rpc
from quorumlog.bookie import LedgerStorage
from quorumlog.errors import QuorumlogError
from quorumlog.ledger import LedgerClient
from quorumlog.meta import MetaClient
from quorumlog.proto import (
    BOOKIE_REGISTRATIONS_PREFIX,
    NoSuchEntryError,
    NoSuchLedgerError,
    ledger_key,
)
from quorumlog.recovery import TASK_PREFIX

from .support import RECOVERY_ENV, cli, metadata_of, payload, poll, running_cluster, write_ledgers

ENTRIES = 30
DEADLINE_S = 60.0
CHECK_ENV = {
    **RECOVERY_ENV,
    # Far longer than the test: a bookie restart never counts as a loss here,
    # so only the replica check can file the task.
    "QUORUMLOG_RECOVERY__LOST_BOOKIE_RECOVERY_DELAY_MS": "600000",
    "QUORUMLOG_RECOVERY__CHECK_INTERVAL_MS": "1000",
}


@pytest.fixture
def checked_cluster(tmp_path: Path) -> Iterator[Path]:
    with running_cluster(tmp_path / "cluster", 4, CHECK_ENV) as directory:
        yield directory


def test_check_finds_entries_lost_on_a_live_bookie(checked_cluster: Path) -> None:
    directory = checked_cluster
    infos = cluster.load(directory)
    meta = cluster.meta_addresses(directory)
    assert cli("recovery", "disable", "--dir", str(directory)).returncode == 0
    ledgers = rpc.run(write_ledgers(meta, 4, ENTRIES))

    async def versions() -> dict[int, tuple[int, tuple[str, ...]]]:
        async with MetaClient(meta) as client:
            out = {}
            for ledger_id in ledgers:
                kv = await client.get(ledger_key(ledger_id))
                assert kv is not None
                out[ledger_id] = (kv.version,
                                  (await metadata_of(client, ledger_id)).ensembles[0].bookies)
            return out

    before = rpc.run(versions())
    damaged, victim_info = next(
        (ledger_id, info) for info in reversed(infos) for ledger_id in ledgers
        if info.address in before[ledger_id][1])
    victim = victim_info.address

    async def registrations() -> int:
        async with MetaClient(meta) as client:
            kv = await client.get(BOOKIE_REGISTRATIONS_PREFIX + victim)
            return 0 if kv is None else int(kv.version)

    counted = rpc.run(registrations())
    assert counted >= 1  # the bookie counted its registration
    # Plant the loss: drop the ledger from the stopped bookie's storage, behind
    # the protocol's back, and start the bookie again.
    cluster.stop_node(directory, victim_info.id)
    storage = LedgerStorage(Path(victim_info.config).parent / "data" / "ledgers")
    try:
        assert storage.delete_ledger(damaged)
    finally:
        storage.close()
    cluster.restart_node(directory, victim_info.id, serving_timeout_s=DEADLINE_S)

    async def lost_on_victim() -> bool:
        async with LedgerClient.connect(meta) as client:
            metadata = await metadata_of(client.meta, damaged)
            position = metadata.ensembles[0].bookies.index(victim)
            entry_id = next(e for e in range(ENTRIES) if metadata.schedule.stores(e, position))
            try:
                await client.context.bookies.read_entry(victim, damaged, entry_id, timeout_s=5)
            except (NoSuchEntryError, NoSuchLedgerError):
                return True
            except QuorumlogError:
                return False  # not serving yet
            raise AssertionError("the planted loss did not take: the bookie still has it")

    rpc.run(poll(lost_on_victim, DEADLINE_S, "the restarted bookie answers"))
    # Its new registration is counted: an auditor tells this return from an
    # outage that never ended, even if no audit round saw it registered.

    async def counted_again() -> bool:
        return await registrations() > counted

    rpc.run(poll(counted_again, DEADLINE_S, "the restarted bookie counts its registration"))
    assert rpc.run(versions()) == before  # paused: nothing changed yet
    assert cli("recovery", "enable", "--dir", str(directory)).returncode == 0

    async def repaired() -> bool:
        async with MetaClient(meta) as client:
            if await client.list_keys(TASK_PREFIX):
                return False
            return victim not in (await metadata_of(client, damaged)).ensembles[0].bookies

    rpc.run(poll(repaired, DEADLINE_S, "the check files a task and a worker repairs it",
                 interval_s=0.3))
    after = rpc.run(versions())
    assert after[damaged][0] == before[damaged][0] + 1  # one swap
    for ledger_id in ledgers:  # intact replicas were left where they were
        if ledger_id != damaged:
            assert after[ledger_id] == before[ledger_id]

    async def full_quorum() -> None:
        async with LedgerClient.connect(meta) as client:
            handle = await client.open_ledger(damaged, password=b"pw")
            metadata = handle.metadata
            got = [e.payload async for e in handle.read(0, metadata.last_entry_id)]
            assert got == [payload(damaged, e) for e in range(ENTRIES)]
            for entry_id in range(ENTRIES):
                for bookie in metadata.write_set_bookies(entry_id):
                    await client.context.bookies.read_entry(bookie, damaged, entry_id,
                                                            timeout_s=5)

    rpc.run(full_quorum())
