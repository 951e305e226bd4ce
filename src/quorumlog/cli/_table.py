"""``quorumlog table``: create, list, inspect and drop tables; set, get, delete,
scan and increment records."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table

from quorumlog.cli._meta import DirOption, MembersOption, _members

if TYPE_CHECKING:
    from quorumlog.table import BlockingTableClient, TableLayout

app = typer.Typer(help="Pegasus-style key-value tables on multi-raft.", no_args_is_help=True)
console = Console()


def _client(members: str | None, directory: Path | None) -> BlockingTableClient:
    from quorumlog.table import BlockingTableClient

    return BlockingTableClient(_members(members, directory))


def _b(text: str) -> bytes:
    return text.encode()


def _show(value: bytes) -> str:
    return value.decode(errors="backslashreplace")


@app.command()
def create(
    name: str,
    partitions: int = typer.Option(8, help="Partitions P (hash of hash_key)."),
    replicas: int = typer.Option(3, help="Replicas R of each partition (one Raft group)."),
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
) -> None:
    """Create a table: place every partition on the table nodes."""
    with _client(members, directory) as client:
        layout = client.create_table(name, partitions=partitions, replicas=replicas)
    console.print(f"created table {name!r} (id {layout.record.table_id}) with "
                  f"{partitions} partition(s) x {replicas} replica(s)")


@app.command("list")
def list_(members: str | None = MembersOption, directory: Path | None = DirOption) -> None:
    """List the tables."""
    with _client(members, directory) as client:
        layouts = client.list_tables()
    table = Table("name", "id", "partitions", "replicas", "created_ms")
    for layout in layouts:
        r = layout.record
        table.add_row(layout.name, str(r.table_id), str(r.partitions), str(r.replicas),
                      str(r.created_ms))
    console.print(table)


@app.command()
def info(name: str, members: str | None = MembersOption,
         directory: Path | None = DirOption) -> None:
    """Show a table's partitions and their members."""
    with _client(members, directory) as client:
        layout: TableLayout = client.table_info(name)
    r = layout.record
    console.print(f"table {name!r}: id {r.table_id}, {r.partitions} partition(s), "
                  f"{r.replicas} replica(s)")
    table = Table("partition", "members (node ids)", "epoch")
    for p, part in enumerate(layout.partitions):
        table.add_row(str(p), ", ".join(map(str, part.members)), str(part.epoch))
    console.print(table)


@app.command()
def drop(name: str, members: str | None = MembersOption,
         directory: Path | None = DirOption) -> None:
    """Drop a table (its replicas stop serving it)."""
    with _client(members, directory) as client:
        client.drop_table(name)
    console.print(f"dropped table {name!r}")


@app.command("set")
def set_(table: str, hash_key: str, sort_key: str, value: str,
         ttl_s: int = typer.Option(0, "--ttl-s", help="Time to live in seconds (0: none)."),
         members: str | None = MembersOption, directory: Path | None = DirOption) -> None:
    """Set one record."""
    with _client(members, directory) as client:
        client.set(table, _b(hash_key), _b(sort_key), _b(value), ttl_s=ttl_s)


StaleOption = typer.Option(
    False, "--stale", help="Read from any replica's own store (a follower read): it "
    "answers while the leader is unreachable but may miss recent writes.")


@app.command()
def get(table: str, hash_key: str, sort_key: str, members: str | None = MembersOption,
        directory: Path | None = DirOption, stale: bool = StaleOption) -> None:
    """Print one record's value (exit code 1 when absent)."""
    with _client(members, directory) as client:
        value = client.get(table, _b(hash_key), _b(sort_key), stale_ok=stale)
    if value is None:
        console.print("(absent)")
        raise typer.Exit(1)
    typer.echo(_show(value))


@app.command("del")
def delete(table: str, hash_key: str, sort_key: str, members: str | None = MembersOption,
           directory: Path | None = DirOption) -> None:
    """Delete one record."""
    with _client(members, directory) as client:
        client.delete(table, _b(hash_key), _b(sort_key))


@app.command()
def scan(table: str, hash_key: str,
         start: str = typer.Option("", help="First sort key (inclusive)."),
         stop: str | None = typer.Option(None, help="Sort key to stop before."),
         members: str | None = MembersOption, directory: Path | None = DirOption,
         stale: bool = StaleOption) -> None:
    """Print the records of one hash_key (sort_key<TAB>value), in sort-key order."""
    with _client(members, directory) as client:
        rows = client.scan(table, _b(hash_key), start=_b(start),
                           stop=None if stop is None else _b(stop), stale_ok=stale)
    for sort_key, value in rows:
        typer.echo(f"{_show(sort_key)}\t{_show(value)}")


@app.command()
def incr(table: str, hash_key: str, sort_key: str,
         by: int = typer.Option(1, "--by", help="Increment (may be negative)."),
         members: str | None = MembersOption, directory: Path | None = DirOption) -> None:
    """Add to a decimal counter (absent counts as 0); print the new value."""
    with _client(members, directory) as client:
        typer.echo(str(client.incr(table, _b(hash_key), _b(sort_key), by)))
