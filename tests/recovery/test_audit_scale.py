"""The Spark audit job at scale: 10,000 closed ledgers of synthetic data on 3
real node processes, scrubbed by a local Spark session within the budget
(docs/recovery.md gives the time it took)."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (the spark extra)")
if shutil.which("java") is None:
    pytest.skip("no java on PATH: Spark needs Java 17+", allow_module_level=True)

from quorumlog import node as cluster
from quorumlog import rpc
from quorumlog.ledger import LedgerClient

from .support import RECOVERY_ENV, running_cluster

LEDGERS = 10_000
ENTRIES = 2
WRITERS_IN_FLIGHT_MAX = 64
AUDIT_BUDGET_S = 180.0
"""The scrub's own time (not the writing before it) must stay under this."""
SCALE_ENV = {**RECOVERY_ENV, "QUORUMLOG_RECOVERY__LOST_BOOKIE_RECOVERY_DELAY_MS": "600000"}


async def _write(meta: list[str]) -> list[int]:
    """``LEDGERS`` closed ledgers (E=3, Qw=Qa=2) of ``ENTRIES`` small entries."""
    limit = asyncio.Semaphore(WRITERS_IN_FLIGHT_MAX)

    async def one(client: LedgerClient, index: int) -> int:
        async with limit:
            handle = await client.create_ledger(3, 2, 2, password=b"pw")
            for e in range(ENTRIES):
                await handle.append(b"synthetic %d/%d" % (index, e))
            await handle.close()
            return handle.id

    async with LedgerClient.connect(meta) as client:
        return list(await asyncio.gather(*(one(client, i) for i in range(LEDGERS))))


@pytest.mark.slow  # ~1 min: 10,000 ledgers written, then one Spark audit of them all
def test_audit_scrubs_ten_thousand_ledgers(tmp_path: Path) -> None:
    from quorumlog.spark import audit, local_session

    with running_cluster(tmp_path / "cluster", 3, SCALE_ENV) as directory:
        meta = cluster.meta_addresses(directory)
        started = time.monotonic()
        ledgers = rpc.run(_write(meta))
        written_s = time.monotonic() - started
        assert len(set(ledgers)) == LEDGERS
        spark = local_session("local[2]", "quorumlog-audit-scale")
        try:
            started = time.monotonic()
            result = audit(spark, meta)
            audit_s = time.monotonic() - started
        finally:
            spark.stop()
        print(f"\n{LEDGERS} ledgers written in {written_s:.1f} s; audited in {audit_s:.1f} s "
              f"({result.entries_read} entries read, {result.replicas} replicas)")
        assert result.ledgers == LEDGERS and result.fragments == LEDGERS
        assert result.by_status == {"ok": LEDGERS * 3}  # every bookie of every ensemble
        assert result.entries_read == LEDGERS * ENTRIES * 2  # Qw copies of each entry
        assert audit_s < AUDIT_BUDGET_S
