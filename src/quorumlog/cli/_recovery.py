"""``quorumlog recovery``: auto-recovery status, under-replicated ledgers, and a
cluster-wide pause switch (docs/recovery.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from quorumlog.cli._meta import DirOption, MembersOption, _members

app = typer.Typer(help="Auto-recovery of lost bookie replicas.", no_args_is_help=True)
console = Console()
JsonOption = typer.Option(False, "--json", help="Print JSON.")


def _run(members: str | None, directory: Path | None, action: Any) -> Any:
    from quorumlog import rpc
    from quorumlog.meta import MetaClient

    async def main() -> Any:
        async with MetaClient(_members(members, directory)) as meta:
            return await action(meta)

    return rpc.run(main())


@app.command()
def status(members: str | None = MembersOption, directory: Path | None = DirOption,
           as_json: bool = JsonOption) -> None:
    """The auditor, missing and draining bookies, and tasks by state."""
    from quorumlog.recovery import recovery_status

    state = _run(members, directory, recovery_status)
    row = {"enabled": state.enabled, "auditor": state.auditor, "missing": state.missing,
           "draining": state.draining, "tasks": state.tasks}
    if as_json:
        typer.echo(json.dumps(row))
        return
    console.print(f"recovery: {'enabled' if state.enabled else '[bold]disabled[/]'}; "
                  f"auditor: {state.auditor or '(none elected)'}")
    for bookie, since_ms in sorted(state.missing.items()):
        console.print(f"missing bookie {bookie} since {since_ms} (wall ms)")
    for bookie in state.draining:
        console.print(f"draining bookie {bookie}")
    console.print("tasks: " + (", ".join(f"{k} {v}" for k, v in sorted(state.tasks.items()))
                               or "none"))


@app.command("list-underreplicated")
def list_underreplicated(members: str | None = MembersOption,
                         directory: Path | None = DirOption,
                         as_json: bool = JsonOption) -> None:
    """Every under-replicated ledger: the bookies to replace, state, attempts, error."""
    from quorumlog.recovery import underreplicated

    tasks = _run(members, directory, underreplicated)
    rows = [{"ledger": t.ledger_id, "bookies": list(t.bookies), "state": t.state.value,
             "attempts": t.attempts, "created_ms": t.created_ms, "error": t.error}
            for t in tasks]
    if as_json:
        typer.echo(json.dumps({"ledgers": rows}))
        return
    table = Table("ledger", "bookies", "state", "attempts", "error")
    for r in rows:
        table.add_row(str(r["ledger"]), ", ".join(r["bookies"]), r["state"],
                      str(r["attempts"]), r["error"])
    console.print(table)


def _switch(enabled: bool, members: str | None, directory: Path | None) -> None:
    from quorumlog.recovery import set_recovery_enabled

    _run(members, directory, lambda meta: set_recovery_enabled(meta, enabled))
    console.print(f"recovery {'enabled' if enabled else 'disabled'} for the cluster")


@app.command()
def disable(members: str | None = MembersOption, directory: Path | None = DirOption) -> None:
    """Pause the auditor and every replication worker (a meta key they honour)."""
    _switch(False, members, directory)


@app.command()
def enable(members: str | None = MembersOption, directory: Path | None = DirOption) -> None:
    """Resume the auditor and the replication workers."""
    _switch(True, members, directory)
