"""``quorumlog meta``: operator access to the metadata service."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from quorumlog.cli._output import (
    Column,
    OutputOption,
    emit,
    field,
    human_bytes,
    output_format,
)

app = typer.Typer(help="Read and write the metadata service.", no_args_is_help=True)
console = Console()

MembersOption = typer.Option(
    None, "--members", "--meta", envvar="QUORUMLOG_MEMBERS",
    help="Comma-separated meta addresses (default: $QUORUMLOG_MEMBERS, else the local "
    "cluster). --meta is the same flag.")
DirOption = typer.Option(None, "--dir", help="Local cluster directory.")


def _members(members: str | None, directory: Path | None) -> list[str]:
    if members:
        return [m.strip() for m in members.split(",") if m.strip()]
    from quorumlog.node import DEFAULT_DIR, meta_addresses

    return meta_addresses(directory or DEFAULT_DIR)


ENCODINGS = ("text", "hex", "base64")
EncodingOption = typer.Option(
    "text", "--encoding", "-e",
    help="How values are printed: text (UTF-8; a value that is not valid UTF-8 is printed "
    "as base64 under value_base64), hex or base64.")


def _value_fields(value: bytes, encoding: str) -> dict[str, str]:
    """A value as JSON fields, never lossy (etcdctl prints binary as-is; JSON cannot)."""
    if encoding not in ENCODINGS:
        raise typer.BadParameter(f"--encoding {encoding!r}: expected one of {', '.join(ENCODINGS)}")
    if encoding == "text":
        try:
            return {"value": value.decode()}
        except UnicodeDecodeError:
            encoding = "base64"
    if encoding == "hex":
        return {"value_hex": value.hex()}
    return {"value_base64": base64.b64encode(value).decode()}


@app.command()
def get(
    key: str,
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
    serializable: bool = typer.Option(False, help="Read from any member (may be stale)."),
    encoding: str = EncodingOption,
) -> None:
    """Print one key's value and versions as JSON."""
    from quorumlog.meta import BlockingMetaClient

    with BlockingMetaClient(_members(members, directory)) as meta:
        kv = meta.get(key, serializable=serializable)
    if kv is None:
        console.print(f"{key}: not found")
        raise typer.Exit(1)
    typer.echo(json.dumps({"key": kv.key, **_value_fields(kv.value, encoding),
                           "version": kv.version, "create_revision": kv.create_revision,
                           "mod_revision": kv.mod_revision, "session_id": kv.session_id}))


@app.command("del")
def delete(
    key: str,
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
    prefix: bool = typer.Option(False, help="Delete every key under KEY."),
    yes: bool = typer.Option(False, "--yes", help="Do not ask before a --prefix delete."),
) -> None:
    """Delete a key (or, with --prefix, every key under it); prints how many went.

    Keys of quorumlog's own records (/ledgers/, /streams/, /bookies/ ...) are
    better removed by their owners' commands (ledger delete, stream delete):
    those keep the data and the metadata consistent.
    """
    from quorumlog.meta import BlockingMetaClient

    if prefix and not yes:
        typer.confirm(f"delete every key under {key!r}?", abort=True)
    with BlockingMetaClient(_members(members, directory)) as meta:
        count = meta.delete(key, prefix=prefix)
    typer.echo(count)
    if count == 0:
        raise typer.Exit(1)


@app.command()
def put(
    key: str,
    value: str,
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
    expect_version: int = typer.Option(-1, help="Compare-and-swap: only if version matches."),
) -> None:
    """Write a key (optionally compare-and-swap on its version)."""
    from quorumlog.meta import BlockingMetaClient

    with BlockingMetaClient(_members(members, directory)) as meta:
        if expect_version >= 0:
            if not meta.cas(key, expect_version, value.encode()):
                console.print(f"[red]version of {key} is not {expect_version}; nothing written")
                raise typer.Exit(1)
            console.print("ok")
        else:
            console.print(f"ok, revision {meta.put(key, value.encode())}")


def _kv_row(kv: Any, encoding: str) -> dict[str, Any]:
    return {"key": kv.key, **_value_fields(kv.value, encoding), "version": kv.version,
            "create_revision": kv.create_revision, "mod_revision": kv.mod_revision,
            "session_id": kv.session_id, "size_bytes": len(kv.value)}


def _value_column(encoding: str) -> Column:
    def show(row: dict[str, Any]) -> str:
        (name, text), = ((k, v) for k, v in row.items() if k.startswith("value"))
        shown = text if len(text) <= VALUE_CELL_CHARS_MAX else text[:VALUE_CELL_CHARS_MAX] + "..."
        return shown if name == "value" else f"{name.removeprefix('value_')}:{shown}"

    return Column("value", show)


# Characters of a value a table shows, "..." marking the cut (-o json has it all).
VALUE_CELL_CHARS_MAX = 40


@app.command("list")
def list_(
    prefix: str,
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
    limit: int = typer.Option(1000, help="At most this many keys."),
    encoding: str = EncodingOption,
    output: str = OutputOption,
) -> None:
    """List keys under a prefix: value, version, size (-o wide|json|yaml for revisions
    and sessions; json and yaml carry whole values)."""
    from quorumlog import rpc
    from quorumlog.meta import BlockingMetaClient

    fmt = output_format(output)
    with BlockingMetaClient(_members(members, directory)) as meta:
        try:
            kvs = meta.list_keys(prefix, limit=limit)
        except rpc.ResponseTooLargeError:  # large values: in pages that fit
            kvs = meta.list_pages(prefix, limit=limit)
    rows = [_kv_row(kv, encoding) for kv in kvs]
    columns = (
        field("key", no_wrap=True), _value_column(encoding), field("version"),
        field("size_bytes", human_bytes, header="size"),
        field("create_revision", header="created rev", wide_only=True),
        field("mod_revision", header="modified rev", wide_only=True),
        field("session_id", lambda v: str(v or "-"), header="session", wide_only=True),
    )
    emit(console, fmt, "kvs", rows, columns, title=f"keys under {prefix!r}")


@app.command()
def watch(
    key: str,
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
    prefix: bool = typer.Option(False, help="Watch every key under KEY."),
    from_revision: int = typer.Option(0, help="Start at this revision (default: now)."),
    count: int = typer.Option(0, help="Stop after this many events (0: until Ctrl-C)."),
    encoding: str = EncodingOption,
) -> None:
    """Print changes to a key or prefix, in revision order, as JSON lines."""
    from quorumlog.meta import MetaClient

    async def main() -> None:
        async with MetaClient(_members(members, directory)) as meta:
            start = from_revision
            if start <= 0:
                _, revision = await meta.range(key, prefix=prefix, limit=1)
                start = revision + 1
            seen = 0
            async for event in meta.watch(key, prefix=prefix, start_revision=start):
                typer.echo(json.dumps({"type": event.type.value, "key": event.kv.key,
                                       **_value_fields(event.kv.value, encoding),
                                       "revision": event.kv.mod_revision}), nl=True)
                seen += 1
                if count and seen >= count:
                    return

    import asyncio

    asyncio.run(main())


member_app = typer.Typer(help="Change the members of the meta Raft group.", no_args_is_help=True)
app.add_typer(member_app, name="member")


def _change(action: str, node_id: int, address: str, members: str | None,
            directory: Path | None) -> None:
    from quorumlog.meta import BlockingMetaClient

    with BlockingMetaClient(_members(members, directory)) as meta:
        voters, learners = meta.change_member(action, node_id, address)
    console.print(f"voters {voters}, learners {learners}")


@member_app.command("list")
def member_list(
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
    output: str = OutputOption,
    as_json: bool = typer.Option(False, "--json", help="Print the JSON list it printed "
                                 "before -o (-o json: under a \"members\" key)."),
) -> None:
    """List the meta members (voters and learners) with their state, as each one reports it.

    Like ``etcdctl member list -w table`` and ``endpoint status`` together: the
    configuration comes from the first member that answers; every member is
    then asked for its own role, term and indexes (unreachable ones say so).
    """
    from quorumlog import rpc
    from quorumlog.errors import QuorumlogError
    from quorumlog.meta import MetaClient

    fmt = output_format(output)
    addresses = _members(members, directory)

    async def main() -> list[dict[str, object]]:
        async with MetaClient(addresses) as meta:
            config = None
            for address in addresses:
                try:
                    config = await meta.status(address)
                    break
                except QuorumlogError:
                    continue
            if config is None:
                raise typer.BadParameter(f"no meta member answered at {', '.join(addresses)}")
            known = dict(config.addresses)
            rows = []
            for node_id in sorted({*config.voters, *config.learners}):
                row: dict[str, object] = {
                    "id": node_id, "address": known.get(node_id, "?"),
                    "kind": "voter" if node_id in config.voters else "learner"}
                try:
                    status = await meta.status(str(row["address"]))
                    row.update(role=status.role, term=status.term,
                               leader=status.leader == node_id,
                               commit_index=status.commit_index,
                               applied_index=status.applied_index, revision=status.revision)
                except QuorumlogError as exc:
                    row.update(role="unreachable", error=exc.message)
                rows.append(row)
            return rows

    rows = rpc.run(main())
    if as_json:
        typer.echo(json.dumps(rows))
        return
    emit(console, fmt, "members", rows, MEMBER_COLUMNS, title="meta members")


def _role_cell(row: dict[str, Any]) -> str:
    return str(row["role"]) + (" *" if row.get("leader") else "")


MEMBER_COLUMNS = (
    field("id", no_wrap=True),
    field("address", no_wrap=True),
    field("kind"),
    Column("role", _role_cell),
    field("term"),
    field("applied_index", header="applied"),
    field("commit_index", header="commit", wide_only=True),
    field("revision", wide_only=True),
    field("error", wide_only=True),
)


@member_app.command("add")
def member_add(
    node_id: int, address: str, members: str | None = MembersOption,
    directory: Path | None = DirOption,
    learner: bool = typer.Option(False, help="Add as a learner (receives the log, no vote)."),
) -> None:
    """Add node NODE_ID at ADDRESS as a voter (or a learner)."""
    _change("add_learner" if learner else "add", node_id, address, members, directory)


@member_app.command("promote")
def member_promote(
    node_id: int, members: str | None = MembersOption, directory: Path | None = DirOption
) -> None:
    """Promote learner NODE_ID to a voter."""
    _change("promote", node_id, "", members, directory)


@member_app.command("remove")
def member_remove(
    node_id: int, members: str | None = MembersOption, directory: Path | None = DirOption
) -> None:
    """Remove NODE_ID from the meta group."""
    _change("remove", node_id, "", members, directory)


snapshot_app = typer.Typer(
    help="Back up the meta state to a file and restore a new meta group from it "
    "(etcdctl snapshot save / etcdutl snapshot status, restore).", no_args_is_help=True)
app.add_typer(snapshot_app, name="snapshot")


def _info_row(path: Path, info: Any) -> dict[str, Any]:
    import datetime

    taken = datetime.datetime.fromtimestamp(info.taken_at_ms / 1000, tz=datetime.UTC)
    return {"file": str(path), "taken_at": taken.isoformat(timespec="seconds"),
            "member": info.member, "applied_index": info.applied_index,
            "revision": info.revision, "keys": info.keys, "state_bytes": info.state_bytes,
            "size": human_bytes(info.state_bytes)}


SNAPSHOT_COLUMNS = (
    field("file"),
    field("taken_at", header="taken at (UTC)"),
    field("member"),
    field("applied_index", header="applied"),
    field("revision"),
    field("keys"),
    field("size"),
)


@snapshot_app.command("save")
def snapshot_save(
    file: Path = typer.Argument(..., help="The backup file to write (replaced atomically)."),
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
    output: str = OutputOption,
) -> None:
    """Save the leader's state to FILE, with every write acknowledged before the call.

    Like ``etcdctl snapshot save``. Keep backups off the meta hosts: they are
    what restores the metadata (every ledger, stream, table and bookie record)
    after a majority of meta hosts is lost (``meta snapshot restore``).
    """
    from quorumlog import rpc
    from quorumlog.cli._output import progress
    from quorumlog.meta import MetaClient, save_snapshot

    fmt = output_format(output)
    addresses = _members(members, directory)

    async def main() -> Any:
        async with MetaClient(addresses) as meta:
            with progress("meta snapshot", None) as bar:
                return await save_snapshot(meta, file, progress=bar.update)

    info = rpc.run(main())
    emit(console, fmt, "snapshot", [_info_row(file, info)], SNAPSHOT_COLUMNS,
         title="meta snapshot saved")


@snapshot_app.command("status")
def snapshot_status(
    file: Path = typer.Argument(..., help="A file written by `meta snapshot save`."),
    output: str = OutputOption,
) -> None:
    """Check a backup file (magic, SHA-256, that its state decodes) and show what it holds.

    Like ``etcdutl snapshot status``. Exit 1 with the reason when the file is
    damaged or not a meta snapshot.
    """
    from quorumlog.meta import read_snapshot_file

    fmt = output_format(output)
    info, _ = read_snapshot_file(file)
    emit(console, fmt, "snapshot", [_info_row(file, info)], SNAPSHOT_COLUMNS,
         title="meta snapshot")


@snapshot_app.command("restore")
def snapshot_restore(
    file: Path = typer.Argument(..., help="A file written by `meta snapshot save`."),
    config: Path = typer.Option(..., "--config", help="This node's TOML config: its id, "
                                "data_dir and [meta] members (the new group's voters)."),
    bump_ids: int = typer.Option(
        1_000_000, "--bump-ids", min=0, help="Move every id counter (ledgers, tables, "
        "sessions) this far ahead: ids handed out after the backup are never reused."),
    bump_revision: int = typer.Option(
        1_000_000, "--bump-revision", min=0, help="Move the revision this far ahead and "
        "compact the watch history up to it (etcdutl's --bump-revision --mark-compacted)."),
    output: str = OutputOption,
) -> None:
    """Create this node's member of a NEW meta group from FILE (the node stopped).

    Like ``etcdutl snapshot restore``: after losing a majority of meta hosts,
    stop every meta node, move each one's ``<data_dir>/raft`` aside, run this
    on every meta node with the same FILE and options, then start them. The
    group's voters are the config's ``[meta] members``. Writes made after the
    backup are lost from the metadata; ledgers closed after it are recovered
    from the bookies by the ledger protocol when next opened. Refused when the
    node already has meta data.
    """
    from quorumlog.meta import restore_snapshot
    from quorumlog.node import load_node_config
    from quorumlog.wal import WalConfig

    fmt = output_format(output)
    cfg = load_node_config(config)
    if cfg.meta is None or "meta" not in cfg.node.roles:
        raise typer.BadParameter(f"{config}: node {cfg.node.id} has no meta role; restore "
                                 "only on the meta members")
    restored = restore_snapshot(file, cfg.data_path / "raft", node_id=cfg.node.id,
                                members=cfg.meta.member_map(), bump_ids=bump_ids,
                                bump_revision=bump_revision,
                                wal_config=WalConfig(
                                    segment_size_bytes=cfg.meta.wal_segment_size_bytes))
    row = {"node": restored.node_id, "directory": restored.directory,
           "voters": ",".join(map(str, restored.voters)), "index": restored.index,
           "revision": restored.revision, "keys": restored.keys}
    emit(console, fmt, "restored", [row],
         (field("node"), field("directory"), field("voters"), field("index"),
          field("revision"), field("keys")), title="meta member restored")


TXN_HELP = """Read a transaction from standard input, etcdctl's way, and run it atomically.

Three sections separated by an empty line: compares, then the requests run
when every compare holds (success), then those run otherwise (failure).

\b
  compare:  value("KEY") = "V"   version("KEY") > "3"   mod("KEY") < "10"
            create("KEY") = "0"  (operators = != < >; version 0 = absent)
  request:  put KEY VALUE    del KEY [--prefix]    get KEY [--prefix]

\b
Example:
  printf 'version("/lock") = "0"\\n\\nput /lock me\\n\\nget /lock\\n' \\
    | quorumlog meta txn

Prints SUCCESS or FAILURE and each request's result (JSON with --json);
exits 0 on SUCCESS, 1 on FAILURE.
"""

_TXN_TARGETS = {"value": "value", "version": "version", "mod": "mod_revision",
                "create": "create_revision"}
_TXN_OPS = {"=": "==", "==": "==", "!=": "!=", "<": "<", ">": ">"}


def parse_txn(text: str) -> tuple[list[Any], list[Any], list[Any]]:
    """Compares, success and failure requests of an etcdctl-style transaction;
    UsageError naming the line for anything it cannot read."""
    import re
    import shlex

    from quorumlog.errors import UsageError
    from quorumlog.meta import Compare, CompareOp, CompareTarget, DeleteOp, PutOp, RangeOp

    sections: list[list[tuple[int, str]]] = [[]]
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            sections[-1].append((number, line.strip()))
        else:  # an empty line ends a section (a leading one: no compares)
            sections.append([])
    while len(sections) > 1 and not sections[-1]:
        sections.pop()
    if len(sections) > 3:
        raise UsageError(f"a transaction has at most 3 sections (compares, success, "
                         f"failure); line {sections[3][0][0]} starts a 4th")
    sections += [[] for _ in range(3 - len(sections))]
    pattern = re.compile(r'^(\w+)\("((?:[^"\\]|\\.)*)"\)\s*(==|!=|=|<|>)\s*"((?:[^"\\]|\\.)*)"$')
    compares = []
    for number, line in sections[0]:
        match = pattern.match(line)
        if match is None or match.group(1) not in _TXN_TARGETS:
            raise UsageError(f"line {number}: {line!r} is not a compare; write e.g. "
                             'value("/k") = "v", version("/k") > "3", mod("/k") < "9" or '
                             'create("/k") = "0"')
        target, key, op, operand = match.groups()
        kind = CompareTarget(_TXN_TARGETS[target])
        if kind is CompareTarget.VALUE:
            compares.append(Compare(key=key, target=kind, op=CompareOp(_TXN_OPS[op]),
                                    value=operand.encode()))
            continue
        if not operand.isdigit():
            raise UsageError(f"line {number}: {target}(...) compares with a number, got "
                             f"{operand!r}")
        number_op = CompareOp(_TXN_OPS[op])
        if kind is CompareTarget.VERSION:
            compares.append(Compare(key=key, target=kind, op=number_op, version=int(operand)))
        else:
            compares.append(Compare(key=key, target=kind, op=number_op, revision=int(operand)))
    requests: list[list[Any]] = [[], []]
    for which, section in enumerate(sections[1:]):
        for number, line in section:
            try:
                words = shlex.split(line)
            except ValueError as exc:
                raise UsageError(f"line {number}: {exc}") from None
            verb, args = words[0].lower(), words[1:]
            prefix = "--prefix" in args
            args = [a for a in args if a != "--prefix"]
            if verb == "put" and len(args) == 2 and not prefix:
                requests[which].append(PutOp(key=args[0], value=args[1].encode()))
            elif verb in ("del", "delete") and len(args) == 1:
                requests[which].append(DeleteOp(key=args[0], prefix=prefix))
            elif verb == "get" and len(args) == 1:
                requests[which].append(RangeOp(key=args[0], prefix=prefix))
            else:
                raise UsageError(f"line {number}: {line!r} is not a request; write put KEY "
                                 "VALUE, del KEY [--prefix] or get KEY [--prefix]")
    return compares, requests[0], requests[1]


@app.command(help=TXN_HELP)
def txn(
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    encoding: str = EncodingOption,
) -> None:
    import sys

    from quorumlog.meta import BlockingMetaClient, DeleteResult, PutResult, RangeResult

    compares, success, failure = parse_txn(sys.stdin.read())
    with BlockingMetaClient(_members(members, directory)) as meta:
        result = meta.txn(compares, success, failure)
    outputs: list[dict[str, Any]] = []
    for item in result.results:
        if isinstance(item, RangeResult):
            outputs.append({"get": [{"key": kv.key, **_value_fields(kv.value, encoding),
                                     "version": kv.version} for kv in item.kvs]})
        elif isinstance(item, PutResult):
            outputs.append({"put": "ok"})
        elif isinstance(item, DeleteResult):
            outputs.append({"deleted": item.deleted})
    if as_json:
        typer.echo(json.dumps({"succeeded": result.succeeded, "revision": result.revision,
                               "results": outputs}))
    else:
        typer.echo("SUCCESS" if result.succeeded else "FAILURE")
        for out in outputs:
            if "get" in out:
                for kv in out["get"]:
                    (text,) = (v for k, v in kv.items() if k.startswith("value"))
                    typer.echo(f"{kv['key']}\n{text}")
            elif "put" in out:
                typer.echo("OK")
            else:
                typer.echo(out["deleted"])
    if not result.succeeded:
        raise typer.Exit(1)


endpoint_app = typer.Typer(help="Check each meta member you name (etcdctl endpoint ...).",
                           no_args_is_help=True)
app.add_typer(endpoint_app, name="endpoint")

HEALTH_KEY = "/health"  # read (never written) by `endpoint health`, as etcdctl reads "health"
HEALTH_TIMEOUT_S = 5.0


@endpoint_app.command("health")
def endpoint_health(
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
    output: str = OutputOption,
    timeout_s: float = typer.Option(HEALTH_TIMEOUT_S, "--timeout", min=0.1,
                                    help="Seconds each endpoint may take."),
) -> None:
    """Ask each member for a linearizable read (etcdctl endpoint health).

    A member is healthy when the read succeeds within --timeout: the member
    answers and a quorum confirms a leader (a follower passes the read on to
    the leader). Exits 1 when any member is unhealthy.
    """
    import time

    from quorumlog import rpc
    from quorumlog.errors import QuorumlogError
    from quorumlog.meta import MetaClient

    fmt = output_format(output)
    addresses = _members(members, directory)

    async def one(address: str) -> dict[str, object]:
        started = time.perf_counter()
        row: dict[str, object] = {"endpoint": address}
        try:
            async with MetaClient([address], deadline_s=timeout_s) as meta:
                await meta.get(HEALTH_KEY)
            row.update(healthy=True, took_ms=round((time.perf_counter() - started) * 1000, 2))
        except QuorumlogError as exc:
            row.update(healthy=False, took_ms=round((time.perf_counter() - started) * 1000, 2),
                       error=exc.message)
        return row

    async def main() -> list[dict[str, object]]:
        import asyncio

        return list(await asyncio.gather(*(one(a) for a in addresses)))

    rows = rpc.run(main())
    emit(console, fmt, "endpoints", rows, HEALTH_COLUMNS, title="meta endpoint health")
    if not all(row["healthy"] for row in rows):
        raise typer.Exit(1)


HEALTH_COLUMNS = (
    field("endpoint", no_wrap=True),
    field("healthy", lambda ok: "healthy" if ok else "UNHEALTHY"),
    field("took_ms", lambda ms: f"{ms:.1f} ms", header="took"),
    field("error"),
)


@endpoint_app.command("status")
def endpoint_status(
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
    output: str = OutputOption,
) -> None:
    """Each member's own view: id, role, leader, term, indexes, revision
    (etcdctl endpoint status). Exits 1 when any member does not answer."""
    from quorumlog import rpc
    from quorumlog.errors import QuorumlogError
    from quorumlog.meta import MetaClient

    fmt = output_format(output)
    addresses = _members(members, directory)

    async def main() -> list[dict[str, object]]:
        rows: list[dict[str, object]] = []
        async with MetaClient(addresses) as meta:
            for address in addresses:
                row: dict[str, object] = {"endpoint": address}
                try:
                    s = await meta.status(address)
                    row.update(id=s.node_id, role=s.role, is_leader=s.leader == s.node_id,
                               leader=s.leader, term=s.term, commit_index=s.commit_index,
                               applied_index=s.applied_index, revision=s.revision,
                               learner=s.node_id in s.learners)
                except QuorumlogError as exc:
                    row.update(role="unreachable", error=exc.message)
                rows.append(row)
        return rows

    rows = rpc.run(main())
    emit(console, fmt, "endpoints", rows, STATUS_COLUMNS, title="meta endpoint status")
    if any(row["role"] == "unreachable" for row in rows):
        raise typer.Exit(1)


STATUS_COLUMNS = (
    field("endpoint", no_wrap=True),
    field("id"),
    Column("role", lambda row: str(row["role"]) + (" *" if row.get("is_leader") else "")),
    field("leader"),
    field("term"),
    field("applied_index", header="applied"),
    field("commit_index", header="commit", wide_only=True),
    field("revision", wide_only=True),
    field("error", wide_only=True),
)
