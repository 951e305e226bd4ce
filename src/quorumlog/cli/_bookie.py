"""``quorumlog bookie``: list bookies, inspect one, force GC, scrub, format (re-add),
decommission, and the sanity check (write, read and delete a ledger on one bookie)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from quorumlog.cli._meta import MembersOption, _members
from quorumlog.cli._output import JsonFlag, OutputOption, emit, field, output_format

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
    output: str = OutputOption,
    as_json: bool = JsonFlag,
) -> None:
    """List the bookies registered in meta (address, state, labels; -o wide: instance id)."""
    from quorumlog.meta import BlockingMetaClient
    from quorumlog.proto import BOOKIE_REGISTRY_PREFIX, BookieRegistration

    fmt = output_format(output, as_json)
    with BlockingMetaClient(_members(members, directory)) as meta:
        kvs = meta.list_keys(BOOKIE_REGISTRY_PREFIX)
    registrations = [BookieRegistration.decode(kv.value) for kv in kvs]
    rows = [{"id": r.id, "address": r.address, "read_only": r.read_only, "labels": r.labels,
             "instance_id": r.instance_id} for r in registrations]
    emit(console, fmt, "bookies", rows, BOOKIE_COLUMNS,
         title=f"{len(registrations)} registered bookie(s)")


BOOKIE_COLUMNS = (
    field("address", no_wrap=True),
    field("read_only", lambda v: "read-only" if v else "writable", header="state"),
    field("labels", lambda v: ", ".join(f"{k}={x}" for k, x in sorted(v.items()))),
    field("id", wide_only=True),
    field("instance_id", header="instance", wide_only=True),
)


@app.command()
def info(bookie: str = BookieOption, as_json: bool = JsonOption) -> None:
    """Status of one bookie: instance, registration, read-only, disk, directories, counters."""
    from quorumlog.proto import BookieStatusRequest

    st = _call(bookie, BookieStatusRequest())
    data = {"bookie_id": st.bookie_id, "instance_id": st.instance_id,
            "registered": st.registered, "read_only": st.read_only,
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
    from quorumlog.proto import LedgerInfoRequest

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
    from quorumlog.proto import GcRequest

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
    from quorumlog.proto import ScrubRequest

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


@app.command("format")
def format_bookie(
    bookie_id: str = typer.Argument(..., help="The bookie's id: its address host:port."),
    force: bool = typer.Option(
        False, "--force", help="Required: the bookie's identity and what it stored are given up."),
    config: Path | None = typer.Option(
        None, "--config", help="The bookie's node config (TOML): its journal and ledger "
        "directories are wiped too (run this on the bookie's machine). Without it only the "
        "cookie in meta is deleted."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
) -> None:
    """Re-add a bookie whose disks were wiped or replaced as a NEW bookie instance.

    A bookie whose directories lost their cookie (wiped, replaced, swapped)
    refuses to start as its old self, so that it never answers "no such entry"
    for entries it acknowledged. This command deletes its cookie in meta and,
    with --config, wipes its journal and ledger directories; its next start
    then stamps a new instance id and it serves, empty. Ledgers that had copies
    on it stay under-replicated until they are re-replicated. The bookie must
    be stopped. Meta addresses: --members, --dir, or the config's [meta] members.
    """
    from quorumlog.bookie import plan_format, run_format
    from quorumlog.errors import DeadlineExceededError, UsageError
    from quorumlog.meta import BlockingMetaClient
    from quorumlog.node import META_ONLY_ENV, load_node_config

    if not force:
        raise UsageError(
            f"format gives up the identity of bookie {bookie_id} and everything it stored "
            "(its ledgers become under-replicated); pass --force to do it")
    bookie_config, addresses = None, None
    if config is not None:
        node_config = load_node_config(config)
        advertised = node_config.node.advertise_address
        if "bookie" not in node_config.node.roles or advertised != bookie_id:
            raise UsageError(
                f"{config} is not the config of bookie {bookie_id} (its node advertises "
                f"{advertised} with roles {list(node_config.node.roles)})")
        bookie_config = node_config.bookie_config
        addresses = node_config.meta_addresses
    if members or directory or addresses is None:
        addresses = _members(members, directory)
    with BlockingMetaClient(addresses) as meta:
        try:
            plan = plan_format(meta, bookie_id, bookie_config)
        except DeadlineExceededError as exc:
            raise DeadlineExceededError(
                f"meta at {', '.join(addresses)} did not answer ({exc.message}). If meta runs "
                "on this bookie's node and has no quorum without it (a one-node cluster), "
                f"start that node with the meta role alone: {META_ONLY_ENV} quorumlog node "
                "--config <its node config>; then run format again") from None
        for line in plan.describe():
            console.print(line, highlight=False, soft_wrap=True)
        if not yes:
            typer.confirm(f"Format bookie {bookie_id}?", abort=True)
        removed = run_format(meta, plan)
    cookie = "deleted" if plan.meta_version else "absent"
    console.print(f"bookie {bookie_id} formatted: {len(removed)} path(s) removed, cookie in "
                  f"meta {cookie}; start it to bring it up as a new instance", highlight=False)


DECOMMISSION_POLL_INTERVAL_S = 1.0
DECOMMISSION_TIMEOUT_S = 24 * 3600.0


@app.command()
def decommission(
    bookie_id: str = typer.Argument(..., help="The bookie's id: its address host:port."),
    no_wait: bool = typer.Option(False, "--no-wait", help="Mark it draining and return."),
    cancel: bool = typer.Option(False, "--cancel", help="Stop draining it (copies made stay)."),
    timeout_s: float = typer.Option(DECOMMISSION_TIMEOUT_S, "--timeout-s",
                                    help="Give up waiting after this many seconds."),
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
) -> None:
    """Drain a bookie: copy everything it holds elsewhere, then say it can be stopped.

    The bookie keeps serving reads while auto-recovery (docs/recovery.md) copies
    each fragment it holds to another bookie; no new ledger is placed on it.
    Refused when fewer writable bookies would remain than a ledger's ensemble
    size. Waits (with progress) until no ledger metadata names it.
    """
    import asyncio
    import time

    from quorumlog import rpc
    from quorumlog.errors import DeadlineExceededError
    from quorumlog.meta import MetaClient
    from quorumlog.recovery import (
        DecommissionProgress,
        cancel_decommission,
        decommission_progress,
        recovery_status,
    )
    from quorumlog.recovery import decommission as start_decommission

    addresses = _members(members, directory)

    async def main() -> None:
        async with MetaClient(addresses) as meta:
            if cancel:
                was = await cancel_decommission(meta, bookie_id)
                console.print(f"bookie {bookie_id}: " + ("decommission cancelled; it takes new "
                              "ledgers again" if was else "was not draining"), highlight=False)
                return
            progress = await start_decommission(meta, bookie_id)
            total = progress.fragments
            console.print(f"bookie {bookie_id} is draining: {total} fragment(s) of "
                          f"{len(progress.ledgers)} ledger(s) to copy elsewhere",
                          highlight=False)
            if not (await recovery_status(meta)).enabled:
                console.print("[bold]recovery is disabled[/]: nothing moves until "
                              "`quorumlog recovery enable`")
            if no_wait:
                return
            await _wait_drained(meta, progress, total)

    async def _wait_drained(meta: MetaClient, progress: DecommissionProgress,
                            total: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        deadline = time.monotonic() + timeout_s
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("{task.fields[detail]}"), console=console) as bar:
            task = bar.add_task(f"draining {bookie_id}", total=max(total, 1), detail="")
            while not progress.done:
                if progress.stuck:
                    bar.stop()
                    for line in progress.stuck:
                        console.print(f"  {line}", highlight=False)
                    raise DeadlineExceededError(
                        f"decommission of {bookie_id} is stuck: {len(progress.stuck)} task(s) "
                        "lost or failed (see `quorumlog recovery list-underreplicated`)")
                if time.monotonic() > deadline:
                    raise DeadlineExceededError(
                        f"bookie {bookie_id} still holds {progress.fragments} fragment(s) of "
                        f"{len(progress.ledgers)} ledger(s) after {timeout_s:g} s; it is still "
                        "draining (run decommission again to keep waiting)")
                left = ", ".join(f"{k} {v}" for k, v in sorted(progress.tasks.items()))
                bar.update(task, completed=max(total - progress.fragments, 0),
                           detail=f"{progress.fragments} fragment(s) left; tasks: {left or '-'}")
                await asyncio.sleep(DECOMMISSION_POLL_INTERVAL_S)
                progress = await decommission_progress(meta, bookie_id)
            bar.update(task, completed=max(total, 1), detail="0 fragment(s) left")
        console.print(f"bookie {bookie_id} holds no ledger fragment any more: it can be "
                      "stopped (and retired with `quorumlog bookie format`)", highlight=False)

    rpc.run(main())


SANITY_ENTRY_BYTES = 1024


@app.command()
def sanity(
    bookie_ids: list[str] | None = typer.Argument(
        None, metavar="[BOOKIE ...]", help="Bookie ids (host:port); none: every writable "
        "registered bookie."),
    entries: int = typer.Option(10, "--entries", min=1, max=10_000,
                                help="Entries of 1 KiB to write and read back."),
    members: str | None = MembersOption,
    directory: Path | None = DirOption,
    output: str = OutputOption,
) -> None:
    """Write, read back and delete a ledger on each bookie alone (BookKeeper's
    bookie sanity check): exit code 1 when any bookie fails it."""
    import asyncio
    import os
    import time

    from quorumlog.errors import QuorumlogError
    from quorumlog.ledger import LedgerClient

    fmt = output_format(output)

    async def check(client: LedgerClient, bookie: str) -> dict[str, Any]:
        payloads = [os.urandom(SANITY_ENTRY_BYTES) for _ in range(entries)]
        row: dict[str, Any] = {"bookie": bookie, "ok": False, "entries": entries,
                               "write_ms": None, "read_ms": None, "error": None}
        ledger_id = None
        try:
            started = time.monotonic()
            handle = await client.create_ledger(1, 1, 1, bookies=[bookie],
                                                metadata={"purpose": b"bookie-sanity"})
            ledger_id = handle.id
            for payload in payloads:
                await handle.append(payload)
            await handle.close()
            row["write_ms"] = round((time.monotonic() - started) * 1000, 1)
            started = time.monotonic()
            reader = await client.open_ledger(ledger_id, recovery=False)
            try:
                read = [bytes(e.payload) for e in await reader.read_batch(0, entries - 1)]
            finally:
                await reader.close()
            row["read_ms"] = round((time.monotonic() - started) * 1000, 1)
            if read != payloads:
                raise QuorumlogError(f"ledger {ledger_id} read back different entries")
            row["ok"] = True
        except QuorumlogError as exc:
            row["error"] = exc.message
        finally:
            if ledger_id is not None:
                try:
                    await client.delete_ledger(ledger_id)
                except QuorumlogError as exc:
                    row["error"] = row["error"] or f"delete failed: {exc.message}"
                    row["ok"] = False
        return row

    async def writable_bookies(client: LedgerClient) -> list[str]:
        from quorumlog.proto import (
            BOOKIE_DRAINING_PREFIX,
            BOOKIE_REGISTRY_PREFIX,
            BookieRegistration,
        )

        draining = {kv.key[len(BOOKIE_DRAINING_PREFIX):]
                    for kv in await client.meta.list_keys(BOOKIE_DRAINING_PREFIX)}
        registered = [BookieRegistration.decode(kv.value)
                      for kv in await client.meta.list_keys(BOOKIE_REGISTRY_PREFIX)]
        return sorted(r.id for r in registered if not r.read_only and r.id not in draining)

    async def main() -> list[dict[str, Any]]:
        client = await LedgerClient.connect(_members(members, directory))
        try:
            targets = bookie_ids or await writable_bookies(client)
            if not targets:
                raise QuorumlogError("no writable bookie is registered")
            return list(await asyncio.gather(*(check(client, b) for b in targets)))
        finally:
            await client.close()

    from quorumlog import rpc

    rows = rpc.run(main())
    emit(console, fmt, "bookies", rows, SANITY_COLUMNS, title="bookie sanity")
    if not all(r["ok"] for r in rows):
        raise typer.Exit(1)


SANITY_COLUMNS = (
    field("bookie", no_wrap=True),
    field("ok", lambda v: "ok" if v else "FAILED", header="result"),
    field("write_ms", lambda v: f"{v:,.1f} ms", header="create+write+close"),
    field("read_ms", lambda v: f"{v:,.1f} ms", header="read"),
    field("error"),
)
