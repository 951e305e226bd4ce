"""The audit's repair drops extra copies once their ledger is fully replicated,
with real node processes (the audit's own per-fragment functions, without
Spark: the Spark job runs the same ones, tests/recovery/test_audit.py)."""

from __future__ import annotations

from pathlib import Path

from quorumlog import node as cluster
from quorumlog import proto, rpc
from quorumlog.ledger import LedgerClient, master_key
from quorumlog.recovery import (
    ReplicaReport,
    ReplicationTask,
    audit_extra,
    audit_fragment,
    delete_extra_copies,
    task_key,
)

from .support import cli, payload, running_cluster, write_ledgers

ENTRIES = 12
TIMEOUT_S = 10.0


async def _plant_extra(client: LedgerClient, ledger_id: int) -> str:
    """Copy every entry of the ledger to a bookie no fragment names (recovery
    adds, as an interrupted re-replication leaves them); that bookie."""
    ctx = client.context
    metadata, _ = await ctx.load_metadata(ledger_id)
    ensemble = metadata.ensembles[0].bookies
    outsider = next(c.address for c in await ctx.candidates(None) if c.address not in ensemble)
    envelopes = []
    for entry_id in range(ENTRIES):
        source = metadata.write_set_bookies(entry_id)[0]
        reply = await ctx.bookies.read_entry(source, ledger_id, entry_id, timeout_s=TIMEOUT_S)
        envelopes.append((entry_id, bytes(reply.envelope)))
    errors = await ctx.bookies.add_entries(outsider, ledger_id, master_key(b"pw"), envelopes,
                                           flags=proto.FLAG_RECOVERY, timeout_s=TIMEOUT_S)
    assert errors == [None] * ENTRIES
    return outsider


async def _audit(client: LedgerClient, ledger_id: int) -> list[ReplicaReport]:
    metadata, _ = await client.context.load_metadata(ledger_id)
    registered = [c.address for c in await client.context.candidates(None)]
    reports = await audit_fragment(client, metadata, 0, reads_in_flight_max=8,
                                   timeout_s=TIMEOUT_S)
    return reports + await audit_extra(client, metadata, registered, timeout_s=TIMEOUT_S)


def test_repair_drops_an_extra_copy_and_keeps_the_replicas(tmp_path: Path) -> None:
    with running_cluster(tmp_path / "cluster", 4) as directory:
        meta = cluster.meta_addresses(directory)
        # Paused: the task planted below stays filed.
        assert cli("recovery", "disable", "--dir", str(directory)).returncode == 0
        clean, under_repair = rpc.run(write_ledgers(meta, 2, ENTRIES))

        async def scenario() -> None:
            async with LedgerClient.connect(meta) as client:
                extra = await _plant_extra(client, clean)
                kept = await _plant_extra(client, under_repair)
                task = ReplicationTask(ledger_id=under_repair, bookies=(kept,), created_ms=0)
                assert await client.meta.cas(task_key(under_repair), 0, task.encode())
                problems = [r for ledger_id in (clean, under_repair)
                            for r in await _audit(client, ledger_id) if r.status != "ok"]
                assert {(r.ledger_id, r.bookie, r.status) for r in problems} == {
                    (clean, extra, "extra"), (under_repair, kept, "extra")}

                dropped = await delete_extra_copies(client, client.meta, problems,
                                                    timeout_s=TIMEOUT_S)
                assert dropped == [(clean, extra)]  # not the ledger under repair
                pool = client.context.bookies.pool  # type: ignore[attr-defined]
                info = await pool.call(extra, proto.LedgerInfoRequest(ledger_id=clean),
                                       timeout_s=TIMEOUT_S)
                assert not info.exists
                still = await pool.call(kept, proto.LedgerInfoRequest(ledger_id=under_repair),
                                        timeout_s=TIMEOUT_S)
                assert still.exists
                # The real replicas are untouched: a second audit finds every one ok.
                again = await _audit(client, clean)
                assert [r.status for r in again] == ["ok"] * len(again) and len(again) == 3
                handle = await client.open_ledger(clean, password=b"pw", recovery=False)
                read = [e.payload async for e in handle.read(0, ENTRIES - 1)]
                assert read == [payload(clean, e) for e in range(ENTRIES)]
                assert not await client.meta.list_keys("/underreplicated-locks/")

        rpc.run(scenario())
