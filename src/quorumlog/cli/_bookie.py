"""``quorumlog bookie``: list bookies, inspect one, force GC, scrub."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from quorumlog.cli._meta import MembersOption, _members

app = typer.Typer(help="Administer bookies (the ledger storage nodes).", no_args_is_help=True)
console = Console()

DirOption = typer.Option(
    None, "--dir", help="Local cluster directory (default: $QUORUMLOG_CLUSTER_DIR or "
    ".quorumlog/cluster)."
)
BookieOption = typer.Option(..., "--bookie", help="The bookie's address (host:port).")
JsonOption = typer.Option(False, "--json", help="Print JSON instead of a table.")
TIMEOUT_S = 10.0
ADMIN_TIMEOUT_S = 600.0  # GC and scrub read whole entry logs


def _call(address: str, request: Any, timeout_s: float = TIMEOUT_S) -> Any:
    from quorumlog import rpc

    async def main() -> Any:
        pool = rpc.Pool()
        try:
            return await pool.call(address, request, timeout_s=timeout_s)
        finally:
            await pool.close()

    return rpc.run(main())


def _echo_json(data: object) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=True))


@app.command("list")
def list_bookies(
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
    as_json: bool = JsonOption,
) -> None:
    """List the bookies registered in meta (address, read-only, labels)."""
    from quorumlog.bookie._protocol import BOOKIE_REGISTRY_PREFIX, BookieRegistration
    from quorumlog.meta._client import BlockingMetaClient

    with BlockingMetaClient(_members(members, directory)) as meta:
        kvs = meta.list_keys(BOOKIE_REGISTRY_PREFIX)
    registrations = [BookieRegistration.decode(kv.value) for kv in kvs]
    if as_json:
        _echo_json({"bookies": [
            {"id": r.id, "address": r.address, "read_only": r.read_only, "labels": r.labels}
            for r in registrations]})
        return
    table = Table(title=f"{len(registrations)} registered bookie(s)")
    for col in ("id", "address", "read_only", "labels"):
        table.add_column(col)
    for r in registrations:
        labels = ",".join(f"{k}={v}" for k, v in sorted(r.labels.items()))
        table.add_row(r.id, r.address, str(r.read_only), labels)
    console.print(table)


@app.command()
def info(bookie: str = BookieOption, as_json: bool = JsonOption) -> None:
    """Status of one bookie: registration, read-only, disk usage, directories, counters."""
    from quorumlog.bookie._protocol import BookieStatusRequest

    st = _call(bookie, BookieStatusRequest())
    data = {"bookie_id": st.bookie_id, "registered": st.registered, "read_only": st.read_only,
            "labels": st.labels, "ledgers": st.ledgers, "disk_usage": st.disk_usage,
            "journal_dir": st.journal_dir, "ledger_dir": st.ledger_dir, "stats": st.stats}
    if as_json:
        _echo_json(data)
        return
    table = Table(title=f"bookie {st.bookie_id}", show_header=False)
    table.add_column("field")
    table.add_column("value")
    for key, value in data.items():
        if key != "stats":
            table.add_row(key, str(value))
    for key, value in sorted(st.stats.items()):
        table.add_row(key, f"{value:,}")
    console.print(table)


@app.command()
def ledger(
    ledger_id: int = typer.Argument(..., help="The ledger id."),
    bookie: str = BookieOption,
    as_json: bool = JsonOption,
) -> None:
    """What one bookie holds of a ledger: exists, fenced, LAC, last entry."""
    from quorumlog.bookie._protocol import LedgerInfoRequest

    r = _call(bookie, LedgerInfoRequest(ledger_id=ledger_id))
    data = {"ledger_id": r.ledger_id, "exists": r.exists, "fenced": r.fenced, "lac": r.lac,
            "last_entry_id": r.last_entry_id}
    if as_json:
        _echo_json(data)
    else:
        table = Table(title=f"ledger {ledger_id} on {bookie}")
        for col in data:
            table.add_column(col)
        table.add_row(*(str(v) for v in data.values()))
        console.print(table)
    if not r.exists:
        raise typer.Exit(1)


@app.command()
def gc(bookie: str = BookieOption, as_json: bool = JsonOption) -> None:
    """Run garbage collection now: drop ledgers deleted in meta, compact entry logs."""
    from quorumlog.bookie._protocol import GcRequest

    r = _call(bookie, GcRequest(), ADMIN_TIMEOUT_S)
    data = {"deleted_ledgers": r.deleted_ledgers, "compacted_logs": r.compacted_logs,
            "reclaimed_bytes": r.reclaimed_bytes}
    if as_json:
        _echo_json(data)
        return
    console.print(f"deleted {r.deleted_ledgers} ledger(s), compacted {r.compacted_logs} "
                  f"entry log(s), reclaimed {r.reclaimed_bytes:,} bytes")


@app.command()
def scrub(bookie: str = BookieOption, as_json: bool = JsonOption) -> None:
    """Check every indexed entry against the entry logs (CRC, ids); exit 1 on problems."""
    from quorumlog.bookie._protocol import ScrubRequest

    r = _call(bookie, ScrubRequest(), ADMIN_TIMEOUT_S)
    if as_json:
        _echo_json({"ok": r.ok, "entries_checked": r.entries_checked, "problems": r.problems})
    elif r.ok:
        console.print(f"ok: {r.entries_checked:,} entries checked")
    else:
        console.print(f"[bold red]{len(r.problems)} problem(s)[/] "
                      f"({r.entries_checked:,} entries checked):")
        for problem in r.problems:
            console.print(f"  {problem}")
    if not r.ok:
        raise typer.Exit(1)
