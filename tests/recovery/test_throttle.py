"""Re-replication keeps to ``[recovery] throttle_bytes_per_s``, with real node
processes: a lost bookie's fragment of N bytes takes at least N / throttle to
copy, and the nodes' metrics count the bytes."""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from pathlib import Path

from quorumlog import node as cluster
from quorumlog import rpc
from quorumlog.ledger import LedgerClient
from quorumlog.meta import MetaClient
from quorumlog.recovery import TASK_PREFIX

from .support import RECOVERY_ENV, metadata_of, poll, running_cluster

DEADLINE_S = 60.0
THROTTLE_BYTES_PER_S = 256 * 1024
ENTRIES = 48
ENTRY_BYTES = 16 * 1024  # 768 KiB to copy: at least 3 s at the throttle
THROTTLED_ENV = {**RECOVERY_ENV,
                 "QUORUMLOG_RECOVERY__THROTTLE_BYTES_PER_S": str(THROTTLE_BYTES_PER_S),
                 "QUORUMLOG_RECOVERY__COPY_BATCH_ENTRIES_MAX": "8"}
POLL_S = 0.05
METRIC = "quorumlog_recovery_bytes_copied_total"


def _bytes_copied(metrics: str) -> float:
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(METRIC + " "))


def test_rereplication_keeps_to_the_throttle(tmp_path: Path) -> None:
    with running_cluster(tmp_path / "cluster", 3, THROTTLED_ENV) as directory:
        infos = cluster.load(directory)
        meta = cluster.meta_addresses(directory)

        async def write() -> tuple[int, list[str]]:
            async with LedgerClient.connect(meta) as client:
                handle = await client.create_ledger(2, 2, 2, password=b"pw")
                for e in range(ENTRIES):
                    await handle.append(bytes([e % 256]) * ENTRY_BYTES)
                await handle.close()
                return handle.id, list(handle.metadata.ensembles[0].bookies)

        ledger_id, ensemble = rpc.run(write())
        victim = next(i for i in infos if i.address == ensemble[-1])
        survivors = [i for i in infos if i is not victim]
        before = sum(_bytes_copied(i.metrics) for i in survivors)
        os.kill(victim.pid, signal.SIGKILL)

        async def timed_copy() -> float:
            async with MetaClient(meta) as client:
                async def filed() -> bool:
                    return bool(await client.list_keys(TASK_PREFIX))

                async def swapped() -> bool:
                    metadata = await metadata_of(client, ledger_id)
                    return victim.address not in metadata.ensembles[0].bookies

                await poll(filed, DEADLINE_S, "the task is filed", interval_s=POLL_S)
                start = time.monotonic()
                await poll(swapped, DEADLINE_S, "the replica is swapped", interval_s=POLL_S)
                return time.monotonic() - start

        elapsed_s = rpc.run(timed_copy())
        copied = sum(_bytes_copied(i.metrics) for i in survivors) - before
        assert copied >= ENTRIES * ENTRY_BYTES  # envelopes: the payload and a header each
        # The copy began after the task was filed, and is seen at most one poll late.
        floor_s = ENTRIES * ENTRY_BYTES / THROTTLE_BYTES_PER_S - POLL_S
        assert elapsed_s >= floor_s, (
            f"{copied} bytes copied in {elapsed_s:.2f} s: faster than "
            f"{THROTTLE_BYTES_PER_S} bytes/s allows ({floor_s:.2f} s)")
        assert elapsed_s < floor_s + DEADLINE_S / 2
