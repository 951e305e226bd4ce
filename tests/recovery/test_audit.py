"""The Spark audit job against a real cluster and a real local Spark session:
a planted missing + corrupt replica and an extra copy are reported (summary,
problem rows, Parquet), and --repair gets the bad replica re-replicated and
the extra copies of whole ledgers dropped."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (the spark extra)")
if shutil.which("java") is None:
    pytest.skip("no java on PATH: Spark needs Java 17+", allow_module_level=True)

from quorumlog import node as cluster
from quorumlog import rpc
from quorumlog.bookie import LedgerStorage
from quorumlog.ledger import LedgerClient, master_key
from quorumlog.meta import MetaClient
from quorumlog.proto import FLAG_RECOVERY
from quorumlog.recovery import TASK_PREFIX

from .support import RECOVERY_ENV, cli, metadata_of, poll, running_cluster, write_ledgers

ENTRIES = 20
DEADLINE_S = 60.0
AUDIT_ENV = {**RECOVERY_ENV, "QUORUMLOG_RECOVERY__LOST_BOOKIE_RECOVERY_DELAY_MS": "600000"}


@pytest.fixture
def audited_cluster(tmp_path: Path) -> Iterator[Path]:
    with running_cluster(tmp_path / "cluster", 4, AUDIT_ENV) as directory:
        yield directory


async def _ensembles(meta: list[str], ledgers: list[int]) -> dict[int, tuple[str, ...]]:
    async with MetaClient(meta) as client:
        return {i: (await metadata_of(client, i)).ensembles[0].bookies for i in ledgers}


async def _recovery_add(meta: list[str], ledger_id: int, entry_id: int, source: str,
                        target: str, *, tamper: bool) -> None:
    """Copy one entry's envelope from ``source`` to ``target`` (a recovery add),
    with one payload byte flipped when ``tamper``."""
    async with LedgerClient.connect(meta) as client:
        reply = await client.context.bookies.read_entry(source, ledger_id, entry_id, timeout_s=5)
        envelope = bytearray(reply.envelope)
        if tamper:
            envelope[-1] ^= 0xFF
        results = await client.context.bookies.add_entries(
            target, ledger_id, master_key(b"pw"), [(entry_id, bytes(envelope))],
            flags=FLAG_RECOVERY, timeout_s=5)
        assert results == [None]


@pytest.mark.slow  # ~2 min on 2 busy cores: a node restart, four Spark jobs (one via the CLI)
def test_audit_reports_and_repairs(audited_cluster: Path, tmp_path: Path) -> None:
    from quorumlog.spark import audit, local_session

    directory = audited_cluster
    infos = cluster.load(directory)
    meta = cluster.meta_addresses(directory)
    assert cli("recovery", "disable", "--dir", str(directory)).returncode == 0
    ledgers = rpc.run(write_ledgers(meta, 6, ENTRIES, mixed_digests=True))
    ensembles = rpc.run(_ensembles(meta, ledgers))
    # An HMAC ledger: a bookie cannot check a MAC (it has no key), so a tampered
    # envelope reaches its storage, as a bit flip on disk would.
    damaged, victim_info = next(
        (ledger_id, info) for info in reversed(infos) for ledger_id in ledgers[1::2]
        if info.address in ensembles[ledger_id])
    victim = victim_info.address
    # Missing: drop the ledger from the stopped victim's storage.
    cluster.stop_node(directory, victim_info.id)
    storage = LedgerStorage(Path(victim_info.config).parent / "data" / "ledgers")
    try:
        assert storage.delete_ledger(damaged)
    finally:
        storage.close()
    cluster.restart_node(directory, victim_info.id, serving_timeout_s=DEADLINE_S)
    # Corrupt: one entry of the victim's share comes back with a flipped byte.
    md = rpc.run(_metadata(meta, damaged))
    position = md.ensembles[0].bookies.index(victim)
    share = [e for e in range(ENTRIES) if md.schedule.stores(e, position)]
    survivor = next(b for b in md.write_set_bookies(share[0]) if b != victim)
    rpc.run(_recovery_add(meta, damaged, share[0], survivor, victim, tamper=True))
    # Extra: a bookie outside another ledger's ensemble gets one of its entries.
    other = next(i for i in ledgers if i != damaged)
    outsider = next(i.address for i in infos if i.address not in ensembles[other])
    rpc.run(_recovery_add(meta, other, 0, ensembles[other][0], outsider, tamper=False))

    spark = local_session("local[2]", "quorumlog-audit-test")
    try:
        report_path = str(tmp_path / "audit.parquet")
        result = audit(spark, meta, output=report_path)
        assert result.ledgers == len(ledgers) and result.ledgers_open == 0
        assert result.fragments == len(ledgers)
        replicas = len(ledgers) * 3 + 1  # every ensemble member, and the extra copy
        assert result.replicas == replicas
        assert result.by_status == {"ok": replicas - 2, "corrupt": 1, "extra": 1}
        bad = {(p.ledger_id, p.bookie): p for p in result.problems}
        assert set(bad) == {(damaged, victim), (other, outsider)}
        corrupt = bad[(damaged, victim)]
        assert (corrupt.status, corrupt.expected, corrupt.held, corrupt.corrupt,
                corrupt.missing, corrupt.first_bad_entry) == (
            "corrupt", len(share), 0, 1, len(share) - 1, share[0])
        assert bad[(other, outsider)].status == "extra"
        rows = spark.read.parquet(report_path)
        assert rows.count() == replicas
        assert rows.filter(rows.status != "ok").count() == 2

        repaired = cli("audit", "--repair", "--json", "--dir", str(directory))
        assert repaired.returncode == 0, repaired.stderr
        summary = json.loads(repaired.stdout.strip().splitlines()[-1])
        assert summary["tasks_filed"] == [damaged]
        # The planted extra copy's ledger is healthy: repair drops that copy.
        assert summary["extra_deleted"] == [[other, outsider]]
        assert cli("recovery", "enable", "--dir", str(directory)).returncode == 0

        async def fixed() -> bool:
            async with MetaClient(meta) as client:
                if await client.list_keys(TASK_PREFIX):
                    return False
                return victim not in (await metadata_of(client, damaged)).ensembles[0].bookies

        rpc.run(poll(fixed, DEADLINE_S, "the workers re-replicate the bad replica",
                     interval_s=0.3))
        after = audit(spark, meta, repair=True)
        # Left: the bad replica's remains on the victim, no longer named; its ledger
        # is whole again, so this repair drops them, and nothing is left.
        assert [(p.ledger_id, p.bookie, p.status) for p in after.problems] == [
            (damaged, victim, "extra")]
        assert after.extra_deleted == [(damaged, victim)]
        assert audit(spark, meta).problems == []
    finally:
        spark.stop()


async def _metadata(meta: list[str], ledger_id: int) -> Any:
    async with MetaClient(meta) as client:
        return await metadata_of(client, ledger_id)
