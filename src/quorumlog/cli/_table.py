"""``quorumlog table``: create, list, inspect and drop tables; set, get, delete,
scan and increment records, and their multi-record, TTL, count and
check-and-set / check-and-mutate forms (Pegasus's shell); the scheduler's view
(``schedule``)."""

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
    replicas: int = typer.Option(3, help="Replicas R of each Raft group."),
    copysets: int | None = typer.Option(
        None, help="Raft groups (copysets) holding the partitions, partition p in copyset "
                   "p % G [default: one per partition]. Fewer groups share Raft's "
                   "per-entry costs (docs/table.md, \"Partitions and copysets\")."),
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
) -> None:
    """Create a table: place every Raft group (partition or copyset) on the table nodes."""
    with _client(members, directory) as client:
        layout = client.create_table(name, partitions=partitions, replicas=replicas,
                                     copysets=copysets)
    groups = ("" if layout.record.groups == partitions
              else f" in {layout.record.groups} copyset(s)")
    console.print(f"created table {name!r} (id {layout.record.table_id}) with "
                  f"{partitions} partition(s){groups} x {replicas} replica(s)")


LIST_COLUMNS = (
    field("name", no_wrap=True),
    field("table_id", header="id"),
    field("partitions"),
    field("copysets", header="groups"),
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
             "partitions": layout.record.partitions, "copysets": layout.record.groups,
             "replicas": layout.record.replicas,
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


def _short_list(items: list[int]) -> str:
    text = ",".join(map(str, items))
    return text if len(text) <= 16 else text[:13] + "..."


@app.command()
def info(name: str, members: str | None = MembersOption,
         directory: Path | None = DirOption, output: str = OutputOption) -> None:
    """Show a table's Raft groups (partitions or copysets): leader, members, learners,
    epoch (from the scheduler)."""
    from quorumlog.table import group_id_of

    _check_output(output)
    with _client(members, directory) as client:
        layout: TableLayout = client.table_info(name)
    view = {g.group_id: g for g in _schedule(members, directory).groups}
    r = layout.record
    rows: list[dict[str, Any]] = []
    for p, part in enumerate(layout.partitions):
        group = view.get(group_id_of(r.table_id, p))
        rows.append({"partition": p, "copyset": p,
                     "partitions": [q for q in range(r.partitions) if r.copyset_of(q) == p],
                     "leader": group.leader if group else 0,
                     "members": list(part.members), "learners": list(part.learners),
                     "epoch": part.epoch, "group_epoch": group.epoch if group else None,
                     "applied_index": group.applied_index if group else None,
                     "size_bytes": group.size_bytes if group else None})
    if output == "json":
        typer.echo(json.dumps({"name": name, "table_id": r.table_id,
                               "partitions": r.partitions, "copysets": r.groups,
                               "replicas": r.replicas, "partition_groups": rows}))
        return
    groups = "" if r.groups == r.partitions else f" in {r.groups} copyset(s)"
    console.print(f"table {name!r}: id {r.table_id}, {r.partitions} partition(s){groups}, "
                  f"{r.replicas} replica(s)")
    table = Table("part" if r.groups == r.partitions else "copyset: parts", "leader",
                  "members", "learners", "epoch", "applied", "bytes",
                  width=80)
    for row in rows:
        label = str(row["partition"]) if r.groups == r.partitions else (
            f"{row['copyset']}: {_short_list(row['partitions'])}")
        table.add_row(label, str(row["leader"] or "-"),
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
    left = dict(view.draining)
    nodes = [{"node": n, "zone": zone, "alive": alive, "last_heartbeat_ms_ago": ago,
              "draining": n in left, "replicas_left": left.get(n)}
             for n, zone, alive, ago in view.nodes]
    nodes += [{"node": n, "zone": None, "alive": False, "last_heartbeat_ms_ago": None,
               "draining": True, "replicas_left": count}
              for n, count in view.draining if n not in {row[0] for row in view.nodes}]
    if output == "json":
        typer.echo(json.dumps({"meta_leader": view.leader, "nodes": nodes,
                               "changes": changes}))
        return
    console.print(f"scheduler on meta leader node {view.leader}")
    node_table = Table("node", "zone", "alive", "last heartbeat (ms ago)", "draining",
                       width=80)
    for node in nodes:
        node_table.add_row(str(node["node"]), str(node["zone"] or "-"),
                           "yes" if node["alive"] else "no",
                           str(node["last_heartbeat_ms_ago"] or "-"),
                           f"yes, {node['replicas_left']} replicas left" if node["draining"]
                           else "no")
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
def drain(node: int = typer.Argument(..., help="Table node id."),
          members: str | None = MembersOption, directory: Path | None = DirOption) -> None:
    """Move every replica off a table node and place nothing new on it (before
    taking it down for good); `table schedule` shows the replicas left."""
    with _client(members, directory) as client:
        client.drain_node(node)
    console.print(f"draining table node {node}: its replicas move to the other nodes "
                  "(`quorumlog table schedule` shows how many are left)")


@app.command()
def undrain(node: int = typer.Argument(..., help="Table node id."),
            members: str | None = MembersOption, directory: Path | None = DirOption) -> None:
    """Stop draining a table node: it takes replicas and leaderships again."""
    with _client(members, directory) as client:
        client.undrain_node(node)
    console.print(f"table node {node} is no longer drained")


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
         limit: int = typer.Option(0, "--limit", min=0,
                                   help="Print at most this many records (0: all)."),
         reverse: bool = typer.Option(False, "--reverse", help="Largest sort key first."),
         members: str | None = MembersOption, directory: Path | None = DirOption,
         stale: bool = StaleOption) -> None:
    """Print the records of one hash_key (sort_key<TAB>value), in sort-key order."""
    import asyncio

    from quorumlog.table import TableClient

    async def print_rows() -> None:  # streamed: --limit stops the read, not just the print
        async with TableClient(_members(members, directory)) as client:
            printed = 0
            async for sort_key, value in client.scan(
                    table, _b(hash_key), start=_b(start),
                    stop=None if stop is None else _b(stop), reverse=reverse, stale_ok=stale):
                if limit and printed == limit:
                    break
                typer.echo(f"{_show(sort_key)}\t{_show(value)}")
                printed += 1

    asyncio.run(print_rows())


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


def _pairs(pairs: list[str]) -> dict[bytes, bytes]:
    if len(pairs) % 2:
        raise typer.BadParameter("give sort keys and values in pairs: SORT_KEY VALUE "
                                 "[SORT_KEY VALUE ...]")
    items: dict[bytes, bytes] = {}
    for sort_key, value in zip(pairs[::2], pairs[1::2], strict=True):
        if _b(sort_key) in items:
            raise typer.BadParameter(f"sort key {sort_key!r} is given twice")
        items[_b(sort_key)] = _b(value)
    return items


@app.command("multi-set")
def multi_set(table: str, hash_key: str,
              pairs: list[str] = typer.Argument(..., metavar="SORT_KEY VALUE ...",
                                                help="Sort keys and their values, in pairs."),
              ttl_s: int = typer.Option(0, "--ttl-s", help="Time to live in seconds "
                                        "(0: none), for every record."),
              members: str | None = MembersOption, directory: Path | None = DirOption) -> None:
    """Set several records of one hash_key atomically (one Raft entry)."""
    items = _pairs(pairs)
    with _client(members, directory) as client:
        client.multi_set(table, _b(hash_key), items, ttl_s=ttl_s)


@app.command("multi-get")
def multi_get(table: str, hash_key: str,
              sort_keys: list[str] | None = typer.Argument(
                  None, metavar="[SORT_KEY ...]",
                  help="Sort keys to read (none: every record of the hash_key)."),
              members: str | None = MembersOption, directory: Path | None = DirOption,
              stale: bool = StaleOption) -> None:
    """Print the records of the given sort keys that exist (sort_key<TAB>value, in
    sort-key order); exit code 1 when none does."""
    with _client(members, directory) as client:
        if sort_keys:
            found = client.multi_get(table, _b(hash_key), [_b(k) for k in sort_keys],
                                     stale_ok=stale)
            rows = sorted(found.items())
        else:
            rows = client.scan(table, _b(hash_key), stale_ok=stale)
    if not rows:
        console.print("(absent)")
        raise typer.Exit(1)
    for sort_key, value in rows:
        typer.echo(f"{_show(sort_key)}\t{_show(value)}")


@app.command("multi-del")
def multi_del(table: str, hash_key: str,
              sort_keys: list[str] = typer.Argument(..., metavar="SORT_KEY ...",
                                                    help="Sort keys to delete."),
              members: str | None = MembersOption, directory: Path | None = DirOption) -> None:
    """Delete several records of one hash_key atomically (absent ones are no error)."""
    with _client(members, directory) as client:
        client.multi_delete(table, _b(hash_key), [_b(k) for k in sort_keys])


@app.command()
def ttl(table: str, hash_key: str, sort_key: str, members: str | None = MembersOption,
        directory: Path | None = DirOption, stale: bool = StaleOption) -> None:
    """Print a record's time to live in seconds, or "none" (exit code 1 when absent)."""
    with _client(members, directory) as client:
        left = client.ttl(table, _b(hash_key), _b(sort_key), stale_ok=stale)
    if left is None:
        console.print("(absent)")
        raise typer.Exit(1)
    typer.echo("none" if left < 0 else str(left))


@app.command()
def count(table: str, hash_key: str, members: str | None = MembersOption,
          directory: Path | None = DirOption, stale: bool = StaleOption) -> None:
    """Print how many records the hash_key has (Pegasus's sort_key_count)."""
    with _client(members, directory) as client:
        typer.echo(str(client.sort_key_count(table, _b(hash_key), stale_ok=stale)))


def _check_type(name: str) -> Any:
    from quorumlog.table import CheckType

    key = name.strip().upper().replace("-", "_")
    if key not in CheckType.__members__:
        choices = ", ".join(t.name.lower().replace("_", "-") for t in CheckType)
        raise typer.BadParameter(f"--check-type {name!r}: expected one of {choices}")
    return CheckType[key]


CheckTypeOption = typer.Option(
    ..., "--check-type", help="What to test on the check record: no-check, value-not-exist, "
    "value-not-exist-or-empty, value-exist, value-not-empty, match-anywhere, match-prefix, "
    "match-postfix, bytes-less, bytes-less-or-equal, bytes-equal, bytes-greater-or-equal, "
    "bytes-greater, int-less, int-less-or-equal, int-equal, int-greater-or-equal, "
    "int-greater (Pegasus's cas_check_type).")
OperandOption = typer.Option("", "--operand", help="The check's operand (a pattern, bytes, "
                             "or a decimal integer for int-* checks).")
ReturnCheckOption = typer.Option(False, "--return-check-value",
                                 help="Also print the check record's value.")


def _print_check(result: Any, return_check_value: bool) -> None:
    shown: dict[str, Any] = {"succeeded": result.succeeded,
                             "check_value_exist": result.check_value_exist}
    if return_check_value:
        shown["check_value"] = None if result.check_value is None else _show(result.check_value)
    typer.echo(json.dumps(shown))
    if not result.succeeded:  # a failed check is a failed compare: exit code 1
        raise typer.Exit(1)


@app.command("check-and-set")
def check_and_set(table: str, hash_key: str, check_sort_key: str,
                  check_type: str = CheckTypeOption, operand: str = OperandOption,
                  set_sort_key: str | None = typer.Option(
                      None, "--set-sort-key", help="Record to set (default: the check record)."),
                  value: str = typer.Option(..., "--value", help="Value to set."),
                  ttl_s: int = typer.Option(0, "--ttl-s", help="Time to live in seconds "
                                            "(0: none)."),
                  return_check_value: bool = ReturnCheckOption,
                  members: str | None = MembersOption,
                  directory: Path | None = DirOption) -> None:
    """Set a record if a check on a record of the same hash_key passes, atomically;
    prints the outcome as JSON (exit code 1 when the check failed)."""
    kind = _check_type(check_type)
    with _client(members, directory) as client:
        result = client.check_and_set(
            table, _b(hash_key), check_sort_key=_b(check_sort_key), check_type=kind,
            operand=_b(operand), set_sort_key=_b(check_sort_key if set_sort_key is None
                                                 else set_sort_key),
            value=_b(value), ttl_s=ttl_s, return_check_value=return_check_value)
    _print_check(result, return_check_value)


def _mutations(text: str) -> list[Any]:
    from quorumlog.table import Mutation

    usage = ('--mutations is a JSON list of ["set", SORT_KEY, VALUE] (optionally with a '
             'TTL in seconds as a 4th item) and ["del", SORT_KEY], applied in order')
    try:
        items = json.loads(text)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(f"{usage}; not JSON: {exc}") from None
    if not isinstance(items, list) or not items:
        raise typer.BadParameter(f"{usage}; got {text!r}")
    out = []
    for item in items:
        strings = isinstance(item, list) and all(isinstance(x, str) for x in item[:3])
        if strings and item[0] == "set" and len(item) in (3, 4) and (
                len(item) == 3 or (isinstance(item[3], int) and item[3] >= 0)):
            out.append(Mutation(_b(item[1]), _b(item[2]), item[3] if len(item) == 4 else 0))
        elif strings and item[0] == "del" and len(item) == 2:
            out.append(Mutation(_b(item[1]), None))
        else:
            raise typer.BadParameter(f"{usage}; got {json.dumps(item)}")
    return out


@app.command("check-and-mutate")
def check_and_mutate(table: str, hash_key: str, check_sort_key: str,
                     check_type: str = CheckTypeOption, operand: str = OperandOption,
                     mutations: str = typer.Option(
                         ..., "--mutations", help='JSON list, applied in order: ["set", '
                         'SORT_KEY, VALUE, TTL_S?] and ["del", SORT_KEY].'),
                     return_check_value: bool = ReturnCheckOption,
                     members: str | None = MembersOption,
                     directory: Path | None = DirOption) -> None:
    """Apply sets and deletes to records of one hash_key if a check passes,
    atomically; prints the outcome as JSON (exit code 1 when the check failed)."""
    kind = _check_type(check_type)
    changes = _mutations(mutations)
    with _client(members, directory) as client:
        result = client.check_and_mutate(
            table, _b(hash_key), check_sort_key=_b(check_sort_key), check_type=kind,
            operand=_b(operand), mutations=changes, return_check_value=return_check_value)
    _print_check(result, return_check_value)
