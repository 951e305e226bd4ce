"""Shared helpers of the recovery tests that run real node processes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from pathlib import Path

from quorumlog import node as cluster
from quorumlog.ledger import LedgerClient, LedgerMetadata
from quorumlog.meta import MetaClient
from quorumlog.proto import ledger_key

RECOVERY_ENV = {
    "QUORUMLOG_RECOVERY__LOST_BOOKIE_RECOVERY_DELAY_MS": "3000",
    "QUORUMLOG_RECOVERY__AUDIT_INTERVAL_MS": "300",
    "QUORUMLOG_RECOVERY__WORKER_POLL_INTERVAL_MS": "300",
    "QUORUMLOG_RECOVERY__LEASE_TTL_MS": "2000",
    "QUORUMLOG_RECOVERY__OPEN_LEDGER_GRACE_MS": "2000",
}


@contextlib.contextmanager
def running_cluster(directory: Path, nodes: int,
                    env: Mapping[str, str] = RECOVERY_ENV) -> Iterator[Path]:
    """``nodes`` node processes started with ``env`` (inherited), stopped after."""
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)  # the node processes inherit it
    try:
        cluster.up(directory, nodes)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    try:
        yield directory
    finally:
        cluster.down(directory)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "quorumlog", *args], capture_output=True,
                          text=True, timeout=120)


def payload(ledger_id: int, entry_id: int) -> bytes:
    return f"ledger {ledger_id} entry {entry_id} ".encode() * 8


async def metadata_of(meta: MetaClient, ledger_id: int) -> LedgerMetadata:
    kv = await meta.get(ledger_key(ledger_id))
    assert kv is not None
    return LedgerMetadata.decode(kv.value)


async def poll(condition: Callable[[], Awaitable[bool]], deadline_s: float, what: str,
               interval_s: float = 0.2) -> None:
    """Wait until ``condition()`` holds, failing after ``deadline_s``."""
    deadline = time.monotonic() + deadline_s
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {deadline_s} s")
        await asyncio.sleep(interval_s)


async def write_ledgers(meta: list[str], count: int, entries: int, *, ensemble: int = 3,
                        quorum: int = 2, mixed_digests: bool = False) -> list[int]:
    """``count`` closed ledgers (E=ensemble, Qw=Qa=quorum) of ``entries`` entries
    each (``payload``); with ``mixed_digests`` every other one uses HMAC."""
    async with LedgerClient.connect(meta) as client:
        ids = []
        for i in range(count):
            digest = "hmac-sha256" if mixed_digests and i % 2 else "crc32c"
            handle = await client.create_ledger(ensemble, quorum, quorum, password=b"pw",
                                                digest=digest)
            for e in range(entries):
                await handle.append(payload(handle.id, e))
            await handle.close()
            ids.append(handle.id)
        return ids
