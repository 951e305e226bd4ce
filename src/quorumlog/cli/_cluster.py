"""``quorumlog node``, ``up``, ``down``, ``status``, ``stop``, ``restart``, ``add-node``:
node processes and the local cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from quorumlog.cli._output import (
    Column,
    JsonFlag,
    OutputOption,
    emit,
    field,
    human_ratio,
    joined,
    output_format,
)

console = Console()

DirOption = typer.Option(
    None, "--dir", help="Cluster directory (default: $QUORUMLOG_CLUSTER_DIR or .quorumlog/cluster)."
)


def _dir(directory: Path | None) -> Path:
    from quorumlog.node import DEFAULT_DIR

    return directory or DEFAULT_DIR


node_app = typer.Typer(
    help="Run a node process (--config), or stop/restart one node of the local cluster.",
    invoke_without_command=True)


@node_app.callback()
def node(
    ctx: typer.Context,
    config: Path | None = typer.Option(None, "--config", help="The node's TOML config file."),
) -> None:
    """Run one node process (roles from its config) until SIGTERM:
    ``quorumlog node --config node.toml``; ``node stop ID`` and ``node restart ID``
    act on a node of the local cluster."""
    if ctx.invoked_subcommand is not None:
        if config is not None:
            raise typer.BadParameter(f"--config runs a node; it does not go with "
                                     f"'node {ctx.invoked_subcommand}'")
        return
    if config is None:
        raise typer.BadParameter("give --config FILE to run a node, or a command: "
                                 "node stop ID, node restart ID")
    from quorumlog.node import load_node_config, run_node

    run_node(load_node_config(config))


@node_app.command("stop")
def node_stop(
    node_id: int = typer.Argument(..., help="The node id to stop."),
    directory: Path | None = DirOption,
) -> None:
    """Stop one node of the local cluster (same as ``quorumlog stop --node ID``)."""
    _stop(node_id, directory)


@node_app.command("restart")
def node_restart(
    node_id: int = typer.Argument(..., help="The node id to start again."),
    directory: Path | None = DirOption,
) -> None:
    """Start a stopped node again (same as ``quorumlog restart --node ID``)."""
    _restart(node_id, directory)


def up(
    nodes: int = typer.Option(
        3, "--nodes",
        help="Number of node processes: meta on the first 3 (1 when fewer), bookie on all."),
    directory: Path | None = DirOption,
) -> None:
    """Start a local cluster on 127.0.0.1 in the background and wait until healthy.

    Healthy: a meta leader is elected and every bookie is registered and writable.
    """
    from quorumlog import node as cluster

    with console.status(f"starting {nodes} node(s), waiting for meta and bookies..."):
        infos = cluster.up(_dir(directory), nodes)
    table = Table(title=f"quorumlog cluster in {_dir(directory).resolve()}")
    for col in ("node", "pid", "address", "metrics", "roles"):
        table.add_column(col)
    scheme = _scheme()
    for i in infos:
        table.add_row(str(i.id), str(i.pid), i.address, f"{scheme}://{i.metrics}/metrics",
                      ",".join(i.roles))
    console.print(table)
    console.print("meta members: " + ",".join(i.address for i in infos))


def down(directory: Path | None = DirOption) -> None:
    """Stop the local cluster (SIGTERM, then SIGKILL after a deadline)."""
    from quorumlog import node as cluster

    stopped = cluster.down(_dir(directory))
    console.print(f"stopped {len(stopped)} node process(es)")


def status(
    directory: Path | None = DirOption,
    output: str = OutputOption,
    as_json: bool = JsonFlag,
) -> None:
    """Show every node: roles, address, meta Raft role and term (DOWN for a node
    that is not running), bookie state and disk use.

    ``-o wide`` adds pid, metrics URL, leader, commit/applied index, revision and
    ledgers; ``-o json``/``-o yaml`` print every raw field.
    """
    from quorumlog import node as cluster

    fmt = output_format(output, as_json)
    rows = cluster.status(_dir(directory))
    emit(console, fmt, "nodes", rows, STATUS_COLUMNS, title="quorumlog nodes")


def _meta_cell(row: dict[str, Any]) -> str:
    if not row.get("alive"):
        return "DOWN"
    role = row.get("meta_role")
    if role is None:
        return "-"
    return f"{role} t{row.get('term', '?')}"


def _bookie_field(name: str, fmt: Any = str) -> Any:
    def show(row: dict[str, Any]) -> str:
        bookie = row.get("bookie")
        if not isinstance(bookie, dict) or bookie.get(name) is None:
            return "-"
        return str(fmt(bookie[name]))

    return show


STATUS_COLUMNS = (
    field("id", no_wrap=True),
    field("roles", joined),
    field("address", no_wrap=True),
    Column("meta", _meta_cell),
    Column("bookie", _bookie_field("state")),
    Column("disk", _bookie_field("disk_usage", human_ratio)),
    field("alive", lambda v: "yes" if v else "NO", wide_only=True),
    field("pid", wide_only=True),
    field("metrics", lambda v: f"{_scheme()}://{v}/metrics", wide_only=True),
    field("leader", wide_only=True),
    field("commit_index", header="commit", wide_only=True),
    field("applied_index", header="applied", wide_only=True),
    field("revision", wide_only=True),
    Column("ledgers", _bookie_field("ledgers"), wide_only=True),
)


def _scheme() -> str:
    from quorumlog import node as cluster

    security = cluster.cluster_security()
    return "https" if security is not None and security.tls_enabled else "http"


def restart(
    node_id: int = typer.Option(..., "--node", help="The node id to start again."),
    directory: Path | None = DirOption,
) -> None:
    """Start a stopped or killed node of the local cluster again (same config and data).

    Waits until every role of the node answers; a node that exits during
    start-up is reported with its error line and a non-zero exit code.
    """
    _restart(node_id, directory)


def _restart(node_id: int, directory: Path | None) -> None:
    from quorumlog import node as cluster

    with console.status(f"starting node {node_id}, waiting until it serves..."):
        info = cluster.restart_node(_dir(directory), node_id,
                                    serving_timeout_s=cluster.RESTART_TIMEOUT_S)
    console.print(f"node {info.id} started again and serving, pid {info.pid}")


def stop(
    node_id: int = typer.Option(..., "--node", help="The node id to stop."),
    directory: Path | None = DirOption,
) -> None:
    """Stop one node of the local cluster (SIGTERM, then SIGKILL after a deadline).

    Its config and data stay; `quorumlog restart --node ID` starts it again.
    Stopping a node that is not running is not an error (exit code 0), as with
    `systemctl stop`.
    """
    _stop(node_id, directory)


def _stop(node_id: int, directory: Path | None) -> None:
    from quorumlog import node as cluster

    if cluster.stop_node(_dir(directory), node_id):
        console.print(f"node {node_id} stopped")
    else:
        console.print(f"node {node_id} was not running")


def add_node(directory: Path | None = DirOption) -> None:
    """Start one more node that will join the meta group once added as a member."""
    from quorumlog import node as cluster

    info = cluster.add_node(_dir(directory))
    console.print(f"node {info.id} started at {info.address} (pid {info.pid}); make it a member "
                  f"with: quorumlog meta member add {info.id} {info.address}")


def register(app: typer.Typer) -> None:
    app.command("add-node")(add_node)
    app.command("restart")(restart)
    app.command("stop")(stop)
    app.add_typer(node_app, name="node")
    app.command("up")(up)
    app.command("down")(down)
    app.command("status")(status)
