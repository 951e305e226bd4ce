"""Decommission against real node processes: `quorumlog bookie decommission`
refuses when too few bookies would remain, drains a bookie that keeps serving
reads, keeps new ledgers off it, and says when it can be stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorumlog import node as cluster
from quorumlog import rpc
from quorumlog.ledger import LedgerClient
from quorumlog.meta import MetaClient
from quorumlog.proto import BOOKIE_DRAINING_PREFIX

from .support import cli, metadata_of, payload, poll, running_cluster, write_ledgers

ENTRIES = 30
DRAIN_DEADLINE_S = 60.0


@pytest.fixture
def four_nodes(tmp_path: Path) -> Iterator[Path]:
    with running_cluster(tmp_path / "cluster", 4) as directory:
        yield directory


async def _naming(meta_addresses: list[str], ledgers: list[int], bookie: str) -> list[int]:
    async with MetaClient(meta_addresses) as meta:
        return [i for i in ledgers
                if any(bookie in f.bookies for f in (await metadata_of(meta, i)).ensembles)]


async def _delete(meta: list[str], ledger_id: int) -> None:
    async with LedgerClient.connect(meta) as client:
        await client.delete_ledger(ledger_id)


async def _read_all(meta: list[str], ledgers: list[int], skip: str) -> None:
    """Every entry of every ledger reads back from every bookie of its write set,
    none of which is ``skip``."""
    async with LedgerClient.connect(meta) as client:
        for ledger_id in ledgers:
            handle = await client.open_ledger(ledger_id, password=b"pw")
            metadata = handle.metadata
            got = [e.payload async for e in handle.read(0, metadata.last_entry_id)]
            assert got == [payload(ledger_id, e) for e in range(ENTRIES)]
            for entry_id in range(ENTRIES):
                for bookie in metadata.write_set_bookies(entry_id):
                    assert bookie != skip
                    reply = await client.context.bookies.read_entry(
                        bookie, ledger_id, entry_id, timeout_s=5)
                    assert reply.envelope


@pytest.mark.slow  # ~40 s: two clusters of writes and a full drain
def test_decommission_drains_a_bookie(four_nodes: Path) -> None:
    infos = cluster.load(four_nodes)
    victim_info = infos[3]  # node 4: a bookie, no meta member
    victim = victim_info.address
    meta = cluster.meta_addresses(four_nodes)
    ledgers = rpc.run(write_ledgers(meta, 6, ENTRIES, mixed_digests=True))
    # E=4: on every bookie, the victim too.
    wide = rpc.run(write_ledgers(meta, 1, ENTRIES, ensemble=4))[0]

    refused = cli("bookie", "decommission", victim, "--dir", str(four_nodes))
    assert refused.returncode == 1
    assert "ensemble size 4" in refused.stderr + refused.stdout, refused
    unknown = cli("bookie", "decommission", "127.0.0.1:1", "--dir", str(four_nodes))
    assert unknown.returncode == 1 and "no bookie" in unknown.stderr + unknown.stdout
    rpc.run(_delete(meta, wide))

    named = rpc.run(_naming(meta, ledgers, victim))
    assert named, "random placement put the victim in no ensemble"
    drain = subprocess.Popen(
        [sys.executable, "-m", "quorumlog", "bookie", "decommission", victim,
         "--dir", str(four_nodes)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        async def draining() -> bool:
            async with MetaClient(meta) as client:
                return bool(await client.list_keys(BOOKIE_DRAINING_PREFIX))

        rpc.run(poll(draining, DRAIN_DEADLINE_S, "draining key written"))
        # New ledgers avoid the draining bookie (3 others remain for E=3).
        fresh = rpc.run(write_ledgers(meta, 4, ENTRIES, mixed_digests=True))
        assert rpc.run(_naming(meta, fresh, victim)) == []
        out, _ = drain.communicate(timeout=DRAIN_DEADLINE_S)
    finally:
        if drain.poll() is None:
            drain.kill()
            drain.wait()
    assert drain.returncode == 0, out
    assert "can be stopped" in out, out
    assert rpc.run(_naming(meta, ledgers, victim)) == []
    # The drained bookie is no longer needed: kill it and read everything.
    os.kill(victim_info.pid, signal.SIGKILL)
    rpc.run(_read_all(meta, ledgers + fresh, victim))


def test_decommission_no_wait_and_cancel(four_nodes: Path) -> None:
    victim = cluster.load(four_nodes)[3].address
    meta = cluster.meta_addresses(four_nodes)
    assert cli("recovery", "disable", "--dir", str(four_nodes)).returncode == 0
    started = cli("bookie", "decommission", victim, "--no-wait", "--dir", str(four_nodes))
    assert started.returncode == 0, started
    assert "recovery is disabled" in started.stdout
    status = json.loads(cli("recovery", "status", "--json", "--dir", str(four_nodes)).stdout)
    assert victim in status["draining"]
    fresh = rpc.run(write_ledgers(meta, 3, ENTRIES, mixed_digests=True))
    assert rpc.run(_naming(meta, fresh, victim)) == []
    cancelled = cli("bookie", "decommission", victim, "--cancel", "--dir", str(four_nodes))
    assert cancelled.returncode == 0 and "cancelled" in cancelled.stdout, cancelled
    # (The victim may be the auditor too: look at the draining list only.)
    after = json.loads(cli("recovery", "status", "--json", "--dir", str(four_nodes)).stdout)
    assert victim not in after["draining"]
