"""One node process: an rpc server hosting the configured roles.

Roles share the process's rpc server, Raft host (one ticker, one I/O thread,
one connection pool) and Prometheus endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from typing import Any

from prometheus_client import Gauge, start_http_server

from quorumlog import rpc
from quorumlog.log import configure, get_logger
from quorumlog.meta._service import MetaService
from quorumlog.node._config import NodeConfig, parse_address
from quorumlog.raft._driver import HostConfig, RaftHost

_log = get_logger(__name__)

RAFT_TERM = Gauge("quorumlog_raft_term", "Raft term", ["group"], registry=rpc.metrics_registry)
RAFT_COMMIT = Gauge("quorumlog_raft_commit_index", "Raft commit index", ["group"],
                    registry=rpc.metrics_registry)
RAFT_APPLIED = Gauge("quorumlog_raft_applied_index", "Raft applied index", ["group"],
                     registry=rpc.metrics_registry)
RAFT_LEADER = Gauge("quorumlog_raft_is_leader", "1 when this node leads the group", ["group"],
                    registry=rpc.metrics_registry)
METRICS_INTERVAL_S = 1.0


async def serve(cfg: NodeConfig) -> None:
    """Run the node until SIGTERM/SIGINT."""
    assert cfg.meta is not None
    members = cfg.meta.member_map()
    host = RaftHost(
        cfg.node.id,
        members,
        cfg.data_path / "raft",
        config=HostConfig(
            tick_interval_ms=cfg.meta.tick_interval_ms,
            election_timeout_ticks=cfg.meta.election_timeout_ticks,
            snapshot_entries=cfg.meta.snapshot_entries,
        ),
    )
    meta = MetaService(host)
    handlers: dict[type[rpc.Request[Any]], Any] = {**host.handlers(), **meta.handlers()}
    server = rpc.Server(handlers)
    listen_host, listen_port = parse_address(cfg.node.listen)
    await server.start(listen_host, listen_port)
    await host.start()
    meta.start(set(members) if cfg.meta.bootstrap else None)
    if cfg.node.metrics_listen:
        m_host, m_port = parse_address(cfg.node.metrics_listen)
        start_http_server(m_port, addr=m_host, registry=rpc.metrics_registry)
    _log.info("node_started", node=cfg.node.id, listen=cfg.node.listen, roles=cfg.node.roles)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    metrics = loop.create_task(_export_metrics(host))
    stopping: asyncio.Future[Any] = loop.create_task(stop.wait())
    failed: asyncio.Future[Any] = host.failed
    await asyncio.wait([stopping, failed], return_when=asyncio.FIRST_COMPLETED)
    if host.failed.done() and host.failed.exception() is not None:
        _log.critical("node_failed", node=cfg.node.id, error=repr(host.failed.exception()))
        raise SystemExit(70)  # EX_SOFTWARE: the supervisor restarts us from disk
    _log.info("node_stopping", node=cfg.node.id)
    metrics.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await metrics
    await meta.close()
    await server.close()
    await host.close()


async def _export_metrics(host: RaftHost) -> None:
    while True:
        for status in host.status():
            group = str(status["group"])
            RAFT_TERM.labels(group).set(status["term"])
            RAFT_COMMIT.labels(group).set(status["commit_index"])
            RAFT_APPLIED.labels(group).set(status["applied_index"])
            RAFT_LEADER.labels(group).set(1 if status["role"] == "leader" else 0)
        await asyncio.sleep(METRICS_INTERVAL_S)


def run_node(cfg: NodeConfig) -> None:
    configure(cfg.node.log_level, json=True)
    rpc.run(serve(cfg))
