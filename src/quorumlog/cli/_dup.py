"""``quorumlog dup``: duplicate a table to another cluster (Pegasus hot backup;
docs/duplication.md): add, list, status, pause, start, remove,
set-fail-mode, allow-non-idempotent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table

from quorumlog.cli._meta import DirOption, MembersOption, _members

if TYPE_CHECKING:
    from quorumlog.table import BlockingTableClient

app = typer.Typer(help="Duplicate tables to other clusters (asynchronous, last writer wins).",
                  no_args_is_help=True)
console = Console()


def _client(members: str | None, directory: Path | None) -> BlockingTableClient:
    from quorumlog.table import BlockingTableClient

    return BlockingTableClient(_members(members, directory))


@app.command()
def add(
    table: str,
    remote: str = typer.Option(..., "--remote", help="Cluster name from the nodes' [clusters]."),
    checkpoint: bool = typer.Option(
        False, "--checkpoint", help="Copy the records the table holds first (state prepare)."),
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
) -> None:
    """Duplicate TABLE to the cluster REMOTE: writes from now on (state log),
    and with --checkpoint the records it holds first (state prepare)."""
    with _client(members, directory) as client:
        record = client.add_dup(table, remote, checkpoint=checkpoint)
    if checkpoint:
        console.print(f"added duplication {record.dup_id} of {table!r} to {remote!r}: copying "
                      f"the existing records, then the log (`quorumlog dup list {table}` shows "
                      "log when the copy is done)")
    else:
        console.print(f"added duplication {record.dup_id} of {table!r} to {remote!r}: writes "
                      "from now on ship; existing records are not copied (use --checkpoint "
                      "for that)")


@app.command("list")
def list_(table: str, members: str | None = MembersOption,
          directory: Path | None = DirOption) -> None:
    """The duplications of TABLE."""
    with _client(members, directory) as client:
        records = client.list_dups(table)
    out = Table("id", "remote", "state", "fail mode", "created_ms")
    for r in records:
        out.add_row(str(r.dup_id), r.remote, r.state.value, r.fail_mode.value,
                    str(r.created_ms))
    console.print(out)


@app.command()
def status(
    table: str, dup_id: int,
    output: str = typer.Option("table", "-o", "--output", help="table or json."),
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
) -> None:
    """Per partition: confirmed_decree, pending decrees, lag, shipped and skipped."""
    import msgspec

    with _client(members, directory) as client:
        progress = client.dup_progress(table, dup_id)
    if output == "json":
        print(json.dumps({str(p): msgspec.to_builtins(v) for p, v in sorted(progress.items())},
                         indent=2))
        return
    out = Table("partition", "confirmed", "pending", "lag_ms", "shipped", "bytes", "skipped",
                "resyncs", "leader", "error")
    for partition, p in sorted(progress.items()):
        error = "LOG LOST: " + p.error if p.log_lost else p.error
        out.add_row(str(partition), str(p.confirmed_decree), str(p.pending_decrees),
                    str(p.lag_ms), str(p.shipped_mutations), str(p.shipped_bytes),
                    str(p.skipped_mutations), str(p.resyncs), str(p.leader), error)
    console.print(out)


def _move(table: str, dup_id: int, state: str, members: str | None,
          directory: Path | None) -> None:
    from quorumlog.table import DupState

    with _client(members, directory) as client:
        record = client.update_dup(table, dup_id, state=DupState(state))
    console.print(f"duplication {dup_id} of {table!r} is {record.state.value}")


@app.command()
def pause(table: str, dup_id: int, members: str | None = MembersOption,
          directory: Path | None = DirOption) -> None:
    """Stop shipping (the log is still kept for it)."""
    _move(table, dup_id, "pause", members, directory)


@app.command()
def start(table: str, dup_id: int, members: str | None = MembersOption,
          directory: Path | None = DirOption) -> None:
    """Resume shipping from confirmed_decree."""
    _move(table, dup_id, "log", members, directory)


@app.command()
def remove(table: str, dup_id: int, members: str | None = MembersOption,
           directory: Path | None = DirOption) -> None:
    """Stop for good; replicas may compact the log again."""
    _move(table, dup_id, "removed", members, directory)


@app.command("set-fail-mode")
def set_fail_mode(table: str, dup_id: int, mode: str = typer.Argument(
        ..., help="slow (retry, the default) or skip (count and drop)"),
                  members: str | None = MembersOption,
                  directory: Path | None = DirOption) -> None:
    """What a shipper does when the remote refuses or cannot be reached."""
    from quorumlog.errors import UsageError
    from quorumlog.table import FailMode

    if mode not in ("slow", "skip"):
        raise UsageError(f"fail mode {mode!r}: use slow or skip")
    with _client(members, directory) as client:
        client.update_dup(table, dup_id, fail_mode=FailMode(mode))
    console.print(f"duplication {dup_id} of {table!r}: fail mode {mode}")


@app.command("allow-non-idempotent")
def allow_non_idempotent(
    table: str,
    allow: bool = typer.Option(..., "--allow/--refuse",
                               help="Allow incr and check_and_mutate on the duplicated table."),
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
) -> None:
    """Allow (or refuse) increment and check_and_mutate while TABLE is duplicated."""
    from quorumlog.table import TableFlags

    with _client(members, directory) as client:
        client.set_table_flags(table, TableFlags(allow_non_idempotent_writes=allow))
    console.print(f"table {table!r}: non-idempotent writes {'allowed' if allow else 'refused'}")
