"""``quorumlog table``: create, list, inspect and drop tables; set, get, delete,
scan and increment records; the scheduler's view (``schedule``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from quorumlog.cli._meta import DirOption, MembersOption, _members
from quorumlog.cli._output import OutputOption as ListOutputOption
from quorumlog.cli._output import emit, field, human_age_ms, human_time_ms, output_format

if TYPE_CHECKING:
    from quorumlog.table import BlockingTableClient, TableLayout, TableScheduleResponse

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


LIST_COLUMNS = (
    field("name", no_wrap=True),
    field("table_id", header="id"),
    field("partitions"),
    field("replicas"),
    field("created_ms", human_age_ms, header="created"),
    field("created_ms", human_time_ms, header="created at", wide_only=True),
)


@app.command("list")
def list_(members: str | None = MembersOption, directory: Path | None = DirOption,
          output: str = ListOutputOption) -> None:
    """List the tables: id, partitions, replicas, age (-o wide|json|yaml)."""
    fmt = output_format(output)
    with _client(members, directory) as client:
        layouts = client.list_tables()
    rows = [{"name": layout.name, "table_id": layout.record.table_id,
             "partitions": layout.record.partitions, "replicas": layout.record.replicas,
             "created_ms": layout.record.created_ms} for layout in layouts]
    emit(console, fmt, "tables", rows, LIST_COLUMNS, title=f"{len(rows)} table(s)")


OutputOption = typer.Option("table", "-o", "--output", help="table (rich, 80 columns) or json.")


def _schedule(members: str | None, directory: Path | None) -> TableScheduleResponse:
    from quorumlog import rpc
    from quorumlog.table import fetch_schedule

    addresses = _members(members, directory)

    async def fetch() -> TableScheduleResponse:
        pool = rpc.Pool()
        try:
            return await fetch_schedule(addresses, pool)
        finally:
            await pool.close()

    return rpc.run(fetch())


def _check_output(output: str) -> None:
    if output not in ("table", "json"):
        raise typer.BadParameter(f"--output must be table or json, got {output!r}")


@app.command()
def info(name: str, members: str | None = MembersOption,
         directory: Path | None = DirOption, output: str = OutputOption) -> None:
    """Show a table's partitions: leader, members, learners, epoch (from the scheduler)."""
    from quorumlog.table import group_id_of

    _check_output(output)
    with _client(members, directory) as client:
        layout: TableLayout = client.table_info(name)
    view = {g.group_id: g for g in _schedule(members, directory).groups}
    r = layout.record
    rows: list[dict[str, Any]] = []
    for p, part in enumerate(layout.partitions):
        group = view.get(group_id_of(r.table_id, p))
        rows.append({"partition": p, "leader": group.leader if group else 0,
                     "members": list(part.members), "learners": list(part.learners),
                     "epoch": part.epoch, "group_epoch": group.epoch if group else None,
                     "applied_index": group.applied_index if group else None,
                     "size_bytes": group.size_bytes if group else None})
    if output == "json":
        typer.echo(json.dumps({"name": name, "table_id": r.table_id,
                               "partitions": r.partitions, "replicas": r.replicas,
                               "partition_groups": rows}))
        return
    console.print(f"table {name!r}: id {r.table_id}, {r.partitions} partition(s), "
                  f"{r.replicas} replica(s)")
    table = Table("part", "leader", "members", "learners", "epoch", "applied", "bytes",
                  width=80)
    for row in rows:
        table.add_row(str(row["partition"]), str(row["leader"] or "-"),
                      ",".join(map(str, row["members"])),
                      ",".join(map(str, row["learners"])) or "-",
                      str(row["epoch"]), str(row["applied_index"] or "-"),
                      str(row["size_bytes"] or "-"))
    console.print(table)


@app.command()
def schedule(members: str | None = MembersOption, directory: Path | None = DirOption,
             output: str = OutputOption) -> None:
    """The scheduler on the meta leader: table nodes, pending and recent changes."""
    _check_output(output)
    view = _schedule(members, directory)
    changes = [{"group": row.change.group_id, "kind": row.change.kind.value,
                "node": row.change.node_id, "remove": row.change.remove_node_id or None,
                "epoch": row.change.epoch, "state": row.state, "age_ms": row.age_ms,
                "reason": row.change.reason} for row in view.changes]
    nodes = [{"node": n, "zone": zone, "alive": alive, "last_heartbeat_ms_ago": ago}
             for n, zone, alive, ago in view.nodes]
    if output == "json":
        typer.echo(json.dumps({"meta_leader": view.leader, "nodes": nodes,
                               "changes": changes}))
        return
    console.print(f"scheduler on meta leader node {view.leader}")
    node_table = Table("node", "zone", "alive", "last heartbeat (ms ago)", width=80)
    for node in nodes:
        node_table.add_row(str(node["node"]), str(node["zone"]),
                           "yes" if node["alive"] else "no",
                           str(node["last_heartbeat_ms_ago"]))
    console.print(node_table)
    change_table = Table("group", "change", "node", "epoch", "state", "age ms", "reason",
                         width=80)
    for change in changes:
        what = str(change["node"]) + (f" -{change['remove']}" if change["remove"] else "")
        change_table.add_row(f"{change['group']:x}", str(change["kind"]), what,
                             str(change["epoch"]), str(change["state"]),
                             str(change["age_ms"]), str(change["reason"]))
    console.print(change_table)


@app.command()
def drop(name: str, members: str | None = MembersOption,
         directory: Path | None = DirOption,
         yes: bool = typer.Option(False, "--yes", "-y",
                                  help="Do not ask for confirmation.")) -> None:
    """Drop a table (its replicas stop serving it and its data goes)."""
    if not yes:
        typer.confirm(f"drop table {name!r} and all its records?", abort=True)
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


@app.command("full-scan")
def full_scan(table: str,
              limit: int = typer.Option(0, "--limit", min=0,
                                        help="Print at most this many records (0: all)."),
              snapshot: bool = typer.Option(
                  False, "--snapshot", help="Read each partition at one point in time (a "
                  "server-side scan context), not page by page while writers go on."),
              members: str | None = MembersOption, directory: Path | None = DirOption,
              stale: bool = StaleOption) -> None:
    """Print every record of a table (hash_key<TAB>sort_key<TAB>value), partition by
    partition, each in key order."""
    import asyncio

    from quorumlog.table import TableClient

    async def print_rows() -> None:  # streamed: --limit stops the read, not just the print
        async with TableClient(_members(members, directory)) as client:
            printed = 0
            async for hash_key, sort_key, value in client.full_scan(
                    table, stale_ok=stale, snapshot=snapshot):
                if limit and printed == limit:
                    break
                typer.echo(f"{_show(hash_key)}\t{_show(sort_key)}\t{_show(value)}")
                printed += 1

    asyncio.run(print_rows())


@app.command()
def incr(table: str, hash_key: str, sort_key: str,
         by: int = typer.Option(1, "--by", help="Increment (may be negative)."),
         members: str | None = MembersOption, directory: Path | None = DirOption) -> None:
    """Add to a decimal counter (absent counts as 0); print the new value."""
    with _client(members, directory) as client:
        typer.echo(str(client.incr(table, _b(hash_key), _b(sort_key), by)))
