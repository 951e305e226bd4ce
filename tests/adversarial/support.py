"""What the adversarial tests share: talking to a real node as a hostile
client (raw sockets), reading its memory, and checking it still serves."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

from quorumlog import node as cluster
from quorumlog import rpc
from quorumlog.meta import MetaClient
from rpc.support import read_until_eof  # noqa: F401  (re-exported for the tests)

HEALTHY_DEADLINE_S = 20.0


def proc_status_kib(pid: int, field: str) -> int:
    """A ``VmRSS``/``VmHWM``-style line of /proc/<pid>/status, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def reset_peak_rss(pid: int) -> None:
    """Start VmHWM again from the current RSS (Linux: ``5`` > clear_refs)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def _metric(info: cluster.NodeInfo, series: str) -> float:
    with urllib.request.urlopen(f"http://{info.metrics}/metrics", timeout=5) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def server_received_bytes(info: cluster.NodeInfo) -> float:
    """The node's ``quorumlog_rpc_received_bytes_total{side="server"}``."""
    return _metric(info, 'quorumlog_rpc_received_bytes_total{side="server"}')


def server_open_connections(info: cluster.NodeInfo) -> float:
    """Connections the node's rpc server holds (its own clients' are apart)."""
    return _metric(info, 'quorumlog_rpc_open_connections{side="server"}')


def host_port(info: cluster.NodeInfo) -> tuple[str, int]:
    host, port = info.address.rsplit(":", 1)
    return host, int(port)


async def meta_round_trip(info: cluster.NodeInfo, key: str, value: bytes) -> None:
    """A put and a linearizable get through the node (retried by the client
    while the node settles): the node still serves meta traffic."""
    async with MetaClient([info.address], pool=rpc.Pool(), deadline_s=HEALTHY_DEADLINE_S) as meta:
        await meta.put(key, value)
        kv = await meta.get(key)
        assert kv is not None and kv.value == value


async def open_raw(info: cluster.NodeInfo) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = host_port(info)
    return await asyncio.open_connection(host, port)
