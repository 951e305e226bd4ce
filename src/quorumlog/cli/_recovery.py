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
             "attempts": t.attempts, "created_ms": t.created_ms, "error": t.error,
             "misplaced": list(t.misplaced)}
            for t in tasks]
    if as_json:
        typer.echo(json.dumps({"ledgers": rows}))
        return
    table = Table("ledger", "bookies", "state", "attempts", "error")
    for r in rows:
        moved = " (misplaced: moved)" if r["misplaced"] else ""
        table.add_row(str(r["ledger"]), ", ".join(r["bookies"]) + moved, r["state"],
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


PROBLEM_ROWS_SHOWN_MAX = 50


def audit_command(
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
    output: str | None = typer.Option(
        None, "--output", help="Write the report (one row per replica) as Parquet here "
        "(a path or any URL Spark writes)."),
    repair: bool = typer.Option(
        False, "--repair", help="File under-replication tasks for missing or corrupt "
        "replicas (the recovery workers copy them elsewhere) and drop the extra copies "
        "of ledgers found fully replicated."),
    master: str = typer.Option("local[2]", "--master", help="Spark master of the job."),
    tasks: int | None = typer.Option(None, "--tasks", help="Spark tasks (default: one per "
                                     "fragment, at most 256)."),
    as_json: bool = JsonOption,
) -> None:
    """Scrub every closed ledger with Spark: read every replica, check digests and
    entry counts, report missing, corrupt and extra replicas (docs/recovery.md)."""
    from quorumlog.spark import audit, local_session

    spark = local_session(master, "quorumlog-audit")
    try:
        result = audit(spark, _members(members, directory), output=output, repair=repair,
                       tasks=tasks)
    finally:
        spark.stop()
    problems = [{name: getattr(p, name) for name in (
        "ledger_id", "fragment_index", "bookie", "status", "expected", "held", "missing",
        "corrupt", "unreachable", "first_bad_entry", "detail")} for p in result.problems]
    if as_json:
        typer.echo(json.dumps({
            "ledgers": result.ledgers, "ledgers_open": result.ledgers_open,
            "fragments": result.fragments, "replicas": result.replicas,
            "entries_read": result.entries_read, "by_status": result.by_status,
            "problems": problems, "tasks_filed": result.tasks_filed,
            "extra_deleted": [list(pair) for pair in result.extra_deleted],
            "output": result.output, "seconds": round(result.seconds, 3)}))
    else:
        summary = Table("ledgers", "open (skipped)", "fragments", "replicas", "entries read",
                        *sorted(result.by_status), "seconds", title="audit")
        summary.add_row(str(result.ledgers), str(result.ledgers_open), str(result.fragments),
                        str(result.replicas), str(result.entries_read),
                        *(str(result.by_status[k]) for k in sorted(result.by_status)),
                        f"{result.seconds:.1f}")
        console.print(summary)
        if problems:
            table = Table("ledger", "fragment", "bookie", "status", "expected", "held",
                          "missing", "corrupt", "first bad", "detail",
                          title=f"{len(problems)} problem replica(s)")
            for p in problems[:PROBLEM_ROWS_SHOWN_MAX]:
                table.add_row(*(str(p[k]) for k in (
                    "ledger_id", "fragment_index", "bookie", "status", "expected", "held",
                    "missing", "corrupt", "first_bad_entry", "detail")))
            console.print(table)
        if result.output:
            console.print(f"report: {result.output}", highlight=False)
        if repair:
            console.print(f"repair: {len(result.tasks_filed)} task(s) filed, "
                          f"{len(result.extra_deleted)} extra copy(ies) dropped",
                          highlight=False)
    if result.problems and not repair:
        raise typer.Exit(2)
