"""The ``quorumlog`` command line (typer app). Each component adds a sub-app here."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from quorumlog.errors import QuorumlogError

EXIT_CODES_HELP = (
    "Exit codes: 0 success; 1 the command failed (an error line says why), the thing "
    "asked for is absent (meta get, table get, meta del of nothing), a compare failed "
    "(meta txn, meta put --expect-version) or a confirmation was declined; 2 bad "
    "command line (unknown command or option, bad option value). Destructive commands "
    "ask first unless --yes: ledger delete, stream delete, stream unsubscribe, table drop, "
    "meta del --prefix.")

app = typer.Typer(
    name="quorumlog",
    help="quorumlog: replicated durable logs and key-value tables.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    epilog=EXIT_CODES_HELP,
)

err_console = Console(stderr=True)


def _version_callback(value: bool) -> None:
    if value:
        from quorumlog import __version__

        typer.echo(f"quorumlog {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True,
        help="Print the version and exit.",
    ),
    log_level: str = typer.Option("WARNING", "--log-level", help="Logging level."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars (they are "
                               "drawn on stderr only when it is a terminal)."),
    security: Path | None = typer.Option(
        None, "--security", envvar="QUORUMLOG_SECURITY_FILE",
        help="TOML file with a \\[security] table (TLS, token) for connecting to the cluster; "
        "QUORUMLOG_SECURITY__<FIELD> variables override its fields.",
    ),
) -> None:
    """quorumlog: replicated durable logs and key-value tables."""
    if "--help" in sys.argv[1:]:
        return  # click runs this before a subcommand's --help: nothing to set up for help
    from quorumlog.cli._output import set_quiet
    from quorumlog.log import configure  # structlog: loaded by commands, not by --help

    set_quiet(quiet)

    configure(log_level)
    if security is not None:
        from quorumlog import config, rpc

        rpc.set_default_security(config.load(rpc.RpcSecurityConfig, security,
                                             section="security"))


def _register() -> None:
    """Attach each component's sub-app (one line per component)."""
    app.add_typer(__import__("quorumlog.cli._wal", fromlist=["app"]).app, name="wal")
    app.add_typer(__import__("quorumlog.cli._sim", fromlist=["app"]).app, name="sim")
    app.add_typer(__import__("quorumlog.cli._ledger", fromlist=["app"]).app, name="ledger")
    app.add_typer(__import__("quorumlog.cli._bookie", fromlist=["app"]).app, name="bookie")
    app.add_typer(__import__("quorumlog.cli._stream", fromlist=["app"]).app, name="stream")
    app.add_typer(__import__("quorumlog.cli._table", fromlist=["app"]).app, name="table")
    app.add_typer(__import__("quorumlog.cli._dup", fromlist=["app"]).app, name="dup")
    app.add_typer(__import__("quorumlog.cli._recovery", fromlist=["app"]).app, name="recovery")
    app.command("audit")(__import__("quorumlog.cli._recovery", fromlist=["app"]).audit_command)
    from quorumlog.cli import _cluster, _console, _meta

    _cluster.register(app)
    _console.register(app)
    app.add_typer(_meta.app, name="meta")


_register()


def main() -> None:
    """Entry point: a QuorumlogError becomes a one-line message and exit code 1."""
    try:
        app()
    except QuorumlogError as exc:
        # Escaped: messages name config sections ("[node] listen") that rich
        # would otherwise take for markup and drop.
        err_console.print(f"[bold red]error:[/] {escape(exc.message)}")
        sys.exit(1)
