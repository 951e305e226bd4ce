"""One node process: an rpc server hosting the configured roles.

Roles share the process's rpc server and Prometheus endpoint. The meta role
brings a Raft host (one ticker, one I/O thread, one connection pool); the
bookie role a ``BookieService`` that registers with the meta members listed
in ``[meta] members`` (on this node or others).

Start order: the Prometheus endpoint and the rpc server bind their ports
first, before any role touches its data (a metrics port in use is one
``error:`` line naming the port and ``metrics_listen``, exit ``EXIT_CONFIG``,
nothing started);
then the rpc server serves (requests to a role that is not started yet get a
retriable error), Raft host and meta, then the bookie (identity check against
its cookie, journal replay, then registration). Stop order: the bookie's
registration is revoked (while meta still answers, even when it is served by
this process: the bookie leaves at once instead of after its session TTL),
the rpc server (no new requests), then the bookie (final flush), then meta
and the Raft host; the same when a role fails to start. A bookie whose directories
are not its own (wiped, swapped) makes the process exit with ``EXIT_CONFIG``
and a one-line message on stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import signal
import sys
import threading
from typing import Any

import msgspec
from prometheus_client import Gauge
from prometheus_client.exposition import ThreadingWSGIServer

from quorumlog import rpc
from quorumlog.bookie import BookieService, InvalidCookieError
from quorumlog.errors import ConfigError
from quorumlog.log import configure, get_logger
from quorumlog.meta import (
    META_GROUP_ID,
    MetaDataLostError,
    MetaService,
    check_member_data,
    publish_member_record,
)
from quorumlog.node._config import NodeConfig, parse_address
from quorumlog.node._health import Health, start_http
from quorumlog.raft import HostConfig, RaftHost, group_directory
from quorumlog.recovery import RecoveryConfig, RecoveryService
from quorumlog.stream import StreamTrimmer, TrimmerConfig
from quorumlog.table import SchedulerService, TableConfig, TableService, is_table_group
from quorumlog.wal import WalConfig

_log = get_logger(__name__)

RAFT_TERM = Gauge("quorumlog_raft_term", "Raft term", ["group"], registry=rpc.metrics_registry)
RAFT_COMMIT = Gauge("quorumlog_raft_commit_index", "Raft commit index", ["group"],
                    registry=rpc.metrics_registry)
RAFT_APPLIED = Gauge("quorumlog_raft_applied_index", "Raft applied index", ["group"],
                     registry=rpc.metrics_registry)
RAFT_LEADER = Gauge("quorumlog_raft_is_leader", "1 when this node leads the group", ["group"],
                    registry=rpc.metrics_registry)
METRICS_INTERVAL_S = 1.0
EXIT_SOFTWARE = 70  # EX_SOFTWARE: the supervisor restarts us from disk
# EX_CONFIG: the bookie's directories are not its own (InvalidCookieError);
# starting again will not help until the operator acts (systemd:
# RestartPreventExitStatus=78).
EXIT_CONFIG = 78
# How to start a node with the meta role alone (environment override of
# [node] roles), e.g. to reach meta while its bookie refuses to start.
META_ONLY_ENV = "QUORUMLOG_NODE__ROLES='[\"meta\"]'"
# A bookie's flushes and compactions run Python code on maintenance threads.
# With CPython's default 5 ms GIL switch interval, every event loop wake-up
# during a flush may wait 5 ms for the GIL; 1 ms keeps add latency down at
# the cost of a little more switching.
BOOKIE_SWITCH_INTERVAL_S = 0.001
# Every add allocates a few short-lived container objects (task, futures,
# messages); with the default gen0 threshold (700) the collector runs
# hundreds of times a second and a full collection (tens of ms with a large
# write cache) about once a second. A higher gen0 threshold and freezing the
# objects that exist after start-up cut that to a few short pauses.
BOOKIE_GC_THRESHOLDS = (50_000, 20, 100)


class PortInUseError(ConfigError):
    """A port this node is configured to listen on is taken by another process.

    Retrying will not help until the operator frees the port or changes the
    config field named in the message (exit ``EXIT_CONFIG``)."""


def start_metrics(cfg: NodeConfig,
                  health: Health) -> tuple[ThreadingWSGIServer, threading.Thread] | None:
    """Bind and serve the Prometheus endpoint (``[node] metrics_listen``), with
    ``/healthz`` and ``/readyz`` beside it, if configured.

    Called before any role starts, so a port in use stops the node before it
    touches its data: raises PortInUseError.
    """
    if not cfg.node.metrics_listen:
        return None
    host, port = parse_address(cfg.node.metrics_listen)
    try:
        security = cfg.security or rpc.RpcSecurityConfig()
        context = rpc.server_ssl_context(security) if security.tls_enabled else None
        return start_http(host, port, rpc.metrics_registry, health, ssl_context=context,
                          token=security.token)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise PortInUseError(
                f"metrics port {cfg.node.metrics_listen} is in use ([node] metrics_listen = "
                f"\"{cfg.node.metrics_listen}\"): stop the process that holds it, or set "
                "another free host:port in [node] metrics_listen of the node config (\"\" "
                "turns the Prometheus endpoint off)") from None
        raise ConfigError(f"cannot listen on [node] metrics_listen = "
                          f"\"{cfg.node.metrics_listen}\": {exc.strerror}") from None


def tune_for_bookie() -> None:
    """Interpreter settings for a process serving a bookie (see the constants)."""
    sys.setswitchinterval(BOOKIE_SWITCH_INTERVAL_S)
    gc.set_threshold(*BOOKIE_GC_THRESHOLDS)


class _Roles:
    """The roles of this node, built from its config."""

    def __init__(self, cfg: NodeConfig) -> None:
        self.host: RaftHost | None = None
        self.meta: MetaService | None = None
        self.bookie: BookieService | None = None
        self.table: TableService | None = None
        self.recovery: RecoveryService | None = None
        self.trimmer: StreamTrimmer | None = None
        self.scheduler: SchedulerService | None = None
        self.publish: asyncio.Task[None] | None = None  # publish_member_record
        if "meta" in cfg.node.roles:
            assert cfg.meta is not None  # NodeConfig.validate requires it
            self.host = RaftHost(
                cfg.node.id,
                cfg.meta.member_map(),
                cfg.data_path / "raft",
                config=HostConfig(
                    tick_interval_ms=cfg.meta.tick_interval_ms,
                    election_timeout_ticks=cfg.meta.election_timeout_ticks,
                    snapshot_entries=cfg.meta.snapshot_entries,
                    wal=WalConfig(segment_size_bytes=cfg.meta.wal_segment_size_bytes),
                    # One group: its own WAL's fdatasync is the only one a pass has.
                    shared_journal=False,
                ),
            )
            self.meta = MetaService(
                self.host, read_mode=cfg.meta.read_mode,
                lease_clock_drift_percent=cfg.meta.lease_clock_drift_percent,
            )
            # The table scheduler answers heartbeats on whichever member leads meta.
            table_config = cfg.table or TableConfig()
            self.scheduler = SchedulerService(
                self.meta, cfg.meta_addresses, table_config.scheduler_config(),
                heartbeat_interval_ms=table_config.heartbeat_interval_ms)
        if "bookie" in cfg.node.roles:
            self.bookie = BookieService(cfg.bookie_config, meta_addresses=cfg.meta_addresses)
            recovery = cfg.recovery or RecoveryConfig()
            if recovery.enabled:  # auditor candidate + replication worker (docs/recovery.md)
                self.recovery = RecoveryService(cfg.node.advertise_address, cfg.meta_addresses,
                                                recovery)
            trimmer = cfg.trimmer or TrimmerConfig()
            if trimmer.enabled:  # retention and TTL of every stream (docs/stream.md)
                self.trimmer = StreamTrimmer(cfg.node.advertise_address, cfg.meta_addresses,
                                             trimmer)
        if "table" in cfg.node.roles:
            self.table = TableService(cfg.node.id, cfg.node.advertise_address, cfg.meta_addresses,
                                      cfg.data_path, cfg.table or TableConfig(),
                                      clusters=cfg.clusters)

    def handlers(self) -> dict[type[rpc.Request[Any]], Any]:
        handlers: dict[type[rpc.Request[Any]], Any] = {}
        if self.host is not None and self.meta is not None:
            handlers.update(self.host.handlers())
            handlers.update(self.meta.handlers())
        if self.scheduler is not None:
            handlers.update(self.scheduler.handlers())
        if self.bookie is not None:
            handlers.update(self.bookie.handlers())
        if self.table is not None:
            handlers.update(self.table.handlers())
            raft = self.table.host.handlers()
            if self.host is not None:
                raft = {kind: _raft_router(handlers[kind], raft[kind]) for kind in raft}
            handlers.update(raft)
        return handlers

    def add_health_checks(self, health: Health) -> None:
        """What /readyz checks for each role of this node."""
        host, bookie = self.host, self.bookie
        if host is not None:

            def meta_leader() -> str | None:
                leaders = [status["leader"] for status in host.status()]
                return None if leaders and all(leaders) else "no meta leader known"

            health.add_check("meta", meta_leader)
        if bookie is not None:

            def bookie_writable() -> str | None:
                if not bookie.registered:
                    return "not registered in meta"
                return None if bookie.writable else "read-only or not started"

            health.add_check("bookie", bookie_writable)
        table = self.table
        if table is not None:
            health.add_check("table", lambda: None if table.registered
                             else "not registered in meta")

    def failures(self) -> list[asyncio.Future[Any]]:
        out: list[asyncio.Future[Any]] = []
        if self.host is not None:
            out.append(self.host.failed)
        if self.bookie is not None:
            out.append(self.bookie.failed)
        if self.table is not None:
            out.append(self.table.failed)
        return out


def _raft_router(meta_handler: Any, table_handler: Any) -> Any:
    """One handler for a Raft request type served by both the meta host and the
    table host: messages, coalesced heartbeat rows and snapshot transfers go by
    group id (``is_table_group``); an empty request (a peer's sign of life)
    goes to both hosts."""

    async def route(request: Any, ctx: rpc.RequestContext) -> Any:
        messages = getattr(request, "messages", None)
        if messages is None:  # a snapshot transfer request: one group
            handler = table_handler if is_table_group(request.group_id) else meta_handler
            return await handler(request, ctx)
        parts = {}
        for name in ("messages", "heartbeats", "heartbeat_responses"):
            rows = getattr(request, name)
            parts[name] = ([r for r in rows if not is_table_group(r[0])],
                           [r for r in rows if is_table_group(r[0])])
        has_meta = any(meta for meta, _ in parts.values())
        has_table = any(table for _, table in parts.values())
        if not has_meta and not has_table:  # a sign of life: both hosts track it
            first = await meta_handler(request, ctx)
            await table_handler(request, ctx)
            return first
        answers = []
        if has_meta:
            answers.append(await meta_handler(msgspec.structs.replace(
                request, **{name: meta for name, (meta, _) in parts.items()}), ctx))
        if has_table:
            answers.append(await table_handler(msgspec.structs.replace(
                request, **{name: table for name, (_, table) in parts.items()}), ctx))
        if len(answers) == 1:
            return answers[0]
        return msgspec.structs.replace(answers[1],
                                       accepted=answers[0].accepted + answers[1].accepted)

    return route


async def serve(cfg: NodeConfig) -> None:
    """Run the node until SIGTERM/SIGINT (or a role fails: exit code 70).

    A role that fails to start (a bookie refusing its directories, say) stops
    the roles already started and the error propagates (see ``run_node``).
    """
    security = cfg.security or rpc.RpcSecurityConfig()
    rpc.set_default_security(security)  # before the roles build their pools
    health = Health()
    metrics_server = start_metrics(cfg, health)
    try:
        await _serve(cfg, security, health)
    finally:
        if metrics_server is not None:
            metrics_server[0].shutdown()
            metrics_server[0].server_close()


async def _serve(cfg: NodeConfig, security: rpc.RpcSecurityConfig, health: Health) -> None:
    roles = _Roles(cfg)
    roles.add_health_checks(health)
    if roles.bookie is not None:
        tune_for_bookie()
    server = rpc.Server(roles.handlers(), security=security)
    listen_host, listen_port = parse_address(cfg.node.listen)
    await server.start(listen_host, listen_port)  # a port in use: rpc's one-line error
    try:
        await _start_roles(cfg, roles)
    except BaseException as exc:
        _log.critical("node_start_failed", node=cfg.node.id, error=repr(exc))
        await _stop(server, roles)
        raise
    _log.info("node_started", node=cfg.node.id, listen=cfg.node.listen,
              advertise=cfg.node.advertise_address,
              metrics_advertise=cfg.node.metrics_advertise_address, roles=cfg.node.roles)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    metrics = loop.create_task(_export_metrics(roles.host)) if roles.host is not None else None
    probes = loop.create_task(health.run())
    stopping: asyncio.Future[Any] = loop.create_task(stop.wait())
    await asyncio.wait([stopping, *roles.failures()], return_when=asyncio.FIRST_COMPLETED)
    for failure in roles.failures():
        if failure.done() and failure.exception() is not None:
            _log.critical("node_failed", node=cfg.node.id, error=repr(failure.exception()))
            raise SystemExit(EXIT_SOFTWARE)
    _log.info("node_stopping", node=cfg.node.id)
    probes.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await probes
    if metrics is not None:
        metrics.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await metrics
    await _stop(server, roles)


async def _start_roles(cfg: NodeConfig, roles: _Roles) -> None:
    if roles.host is not None and roles.meta is not None:
        assert cfg.meta is not None
        # Before it hosts (and may vote in) the meta group: refuse to come back as its
        # old self if its Raft data is gone (quorumlog.meta._member_guard).
        fresh = not group_directory(roles.host.data_dir, META_GROUP_ID).exists()
        roles.meta.checking_fresh = fresh
        await check_member_data(roles.host.data_dir, cfg.node.id, bootstrap=cfg.meta.bootstrap,
                                members=cfg.meta.member_map())
        roles.meta.checking_fresh = False
        await roles.host.start()
        roles.meta.start(set(cfg.meta.member_map()) if cfg.meta.bootstrap else None)
        # The cluster's memory that this node ran meta, written once (_member_guard).
        roles.publish = asyncio.get_running_loop().create_task(publish_member_record(
            cfg.meta_addresses, cfg.node.id, cfg.node.advertise_address))
    if roles.scheduler is not None:
        roles.scheduler.start()
    if roles.bookie is not None:
        await roles.bookie.start(cfg.node.advertise_address)  # its id: what clients dial
        gc.freeze()  # start-up objects live for good: keep them out of collections
    if roles.recovery is not None:
        await roles.recovery.start()
    if roles.trimmer is not None:
        await roles.trimmer.start()
    if roles.table is not None:
        await roles.table.start()


async def _stop(server: rpc.Server, roles: _Roles) -> None:
    """The bookie leaves meta (while meta, maybe this process's, still answers), then
    the rpc server stops (no new requests), then the bookie, the table role (its
    own Raft host), meta, the meta Raft host. Recovery and the trimmer stop first
    (their locks and leases go)."""
    if roles.publish is not None:
        roles.publish.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await roles.publish
    if roles.recovery is not None:
        await roles.recovery.close()
    if roles.trimmer is not None:
        await roles.trimmer.close()
    if roles.bookie is not None:
        await roles.bookie.unregister()
    await server.close()
    if roles.bookie is not None:
        await roles.bookie.close()
    if roles.table is not None:
        await roles.table.close()
    if roles.scheduler is not None:
        await roles.scheduler.close()
    if roles.meta is not None:
        await roles.meta.close()
    if roles.host is not None:
        await roles.host.close()


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
    """Run the node; a bookie refusing its directories or a port in use exits with
    EXIT_CONFIG.

    Either is printed to stderr as one plain ``error:`` line (no traceback):
    the port and its config field, or what happened to the bookie's
    directories and how to re-add the bookie (``quorumlog bookie format``).
    """
    configure(cfg.node.log_level, json=True)
    try:
        rpc.run(serve(cfg))
    except PortInUseError as exc:
        print(f"error: node {cfg.node.id}: {exc.message}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_CONFIG) from None
    except MetaDataLostError as exc:
        print(f"error: {exc.message}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_CONFIG) from None
    except InvalidCookieError as exc:
        note = ""
        if "meta" in cfg.node.roles:
            note = (" This node also runs meta; if meta has no quorum without it (a one-node "
                    "cluster), start it with the meta role alone to run the format: "
                    f"{META_ONLY_ENV} quorumlog node --config <its node config>.")
        print(f"error: {exc.message}{note}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_CONFIG) from None
