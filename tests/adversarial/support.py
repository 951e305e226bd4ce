"""What the adversarial tests share: talking to a real node as a hostile
client (raw sockets), reading its memory, and checking it still serves."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

from quorumlog import node as cluster
from quorumlog import rpc
from quorumlog.ledger import LedgerClient
from quorumlog.meta import MetaClient
from quorumlog.stream import StreamClient, StreamConfig
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


async def serves(info: cluster.NodeInfo, round_: int, *, full: bool = True) -> None:
    """The node still serves meta traffic and, with ``full``, ledger traffic (create,
    append, close, read back) and stream traffic (create, produce, read back)."""
    await meta_round_trip(info, f"/health/{round_}", b"v%d" % round_)
    if not full:
        return
    async with LedgerClient.connect([info.address]) as client:
        handle = await client.create_ledger(1, 1, 1, password=b"fuzz")
        entries = [b"entry-%d-%d" % (round_, i) for i in range(3)]
        for entry in entries:
            await handle.append(entry)
        await handle.close()
        reader = await client.open_ledger(handle.id, password=b"fuzz")
        got = [e.payload for e in await reader.read_batch(0, len(entries) - 1)]
        assert got == entries
    async with await StreamClient.connect([info.address]) as streams:
        name = f"health-{round_}"
        await streams.create_stream(name, StreamConfig(ensemble_size=1, write_quorum=1,
                                                       ack_quorum=1))
        producer = await streams.producer(name)
        await producer.send(b"message-%d" % round_)
        await producer.close()
        async with await streams.reader(name) as stream_reader:
            message = await stream_reader.read_next(int(HEALTHY_DEADLINE_S * 1000))
        assert message is not None and message.value == b"message-%d" % round_
