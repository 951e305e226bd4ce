"""``quorumlog node``, ``up``, ``down``, ``status``, ``stop``, ``restart``, ``add-node``:
node processes and the local cluster."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

console = Console()

DirOption = typer.Option(
    None, "--dir", help="Cluster directory (default: $QUORUMLOG_CLUSTER_DIR or .quorumlog/cluster)."
)


def _dir(directory: Path | None) -> Path:
    from quorumlog.node import DEFAULT_DIR

    return directory or DEFAULT_DIR


def node(config: Path = typer.Option(..., "--config", help="The node's TOML config file.")) -> None:
    """Run one node process (roles from its config) until SIGTERM."""
    from quorumlog.node import load_node_config, run_node

    run_node(load_node_config(config))


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
    security = cluster.cluster_security()
    scheme = "https" if security is not None and security.tls_enabled else "http"
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
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Show every node: pid, roles, address, Raft role, term, commit index, bookie state."""
    from quorumlog import node as cluster

    rows = cluster.status(_dir(directory))
    if as_json:
        typer.echo(json.dumps({"nodes": rows}, indent=2))
        return
    table = Table(title="quorumlog nodes")
    cols = ("id", "pid", "alive", "roles", "address", "meta_role", "term", "leader",
            "commit_index", "applied_index", "revision", "bookie")
    for col in cols:
        table.add_column(col)
    for r in rows:
        table.add_row(*[_cell(r, c) for c in cols])
    console.print(table)


def _cell(row: dict[str, object], column: str) -> str:
    value = row.get(column, "-")
    if column == "roles" and isinstance(value, list):
        return ",".join(str(v) for v in value)
    if column == "bookie" and isinstance(value, dict):
        return str(value.get("state", "-"))
    return str(value)


def restart(
    node_id: int = typer.Option(..., "--node", help="The node id to start again."),
    directory: Path | None = DirOption,
) -> None:
    """Start a stopped or killed node of the local cluster again (same config and data).

    Waits until every role of the node answers; a node that exits during
    start-up is reported with its error line and a non-zero exit code.
    """
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
    """
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
    app.command("node")(node)
    app.command("up")(up)
    app.command("down")(down)
    app.command("status")(status)
