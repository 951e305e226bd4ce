"""``quorumlog console``: the web console (docs/console.md)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from quorumlog.cli._meta import DirOption, MembersOption, _members

if TYPE_CHECKING:
    from quorumlog.console import Console


def console(
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8080, "--port", help="Port to listen on (0: any free port)."),
    interval_s: float = typer.Option(
        5.0, "--interval", help="Seconds between two samples of the cluster (charts, refresh)."),
) -> None:
    """Serve the web console: members, bookies, streams (backlog and rate charts),
    ledgers, tables, recovery and duplication lag; every page as JSON under /api/.

    Runs until Ctrl-C; prints the URL once the first sample is in.
    """
    from quorumlog import rpc
    from quorumlog.console import ConsoleConfig, serve

    config = ConsoleConfig(members=tuple(_members(members, directory)), host=host, port=port,
                           interval_s=interval_s)

    def ready(running: Console) -> None:
        typer.echo(f"quorumlog console on http://{host}:{running.port}/ "
                   f"(JSON: /api/snapshot); Ctrl-C stops it", err=False)

    try:
        rpc.run(serve(config, ready))
    except KeyboardInterrupt:
        typer.echo("console stopped")


def register(app: typer.Typer) -> None:
    app.command("console")(console)
