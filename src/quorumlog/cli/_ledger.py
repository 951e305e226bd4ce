"""``quorumlog ledger``: ledgers for operators and scripts.

``create`` prints the new ledger's id; ``append ID`` appends one entry per
line of standard input (the ledger stays open: a later ``append`` continues
it, ``recover`` closes it); ``read ID`` prints one entry per line up to the
LAC; ``recover ID`` opens with recovery (fences, recovers, closes) and prints
the last entry id; ``info``, ``list`` and ``delete`` manage metadata. The meta
service comes from ``--members`` (or its alias ``--meta``), $QUORUMLOG_MEMBERS or
the local cluster directory, as for every command.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from quorumlog.cli._meta import MembersOption
from quorumlog.cli._output import (
    Column,
    OutputOption,
    emit,
    field,
    human_age_ms,
    human_bytes,
    output_format,
    progress,
)

if TYPE_CHECKING:
    from quorumlog.ledger import BlockingLedgerClient, LedgerMetadata

app = typer.Typer(help="Create, write, read, recover and delete ledgers.",
                  no_args_is_help=True)
console = Console()

DirOption = typer.Option(None, "--dir", help="Local cluster directory (default: "
                         ".quorumlog/cluster or $QUORUMLOG_CLUSTER_DIR).")
PasswordOption = typer.Option(
    "", "--password", envvar="QUORUMLOG_LEDGER_PASSWORD",
    help="The ledger password (or $QUORUMLOG_LEDGER_PASSWORD).")
JsonOption = typer.Option(False, "--json", help="Print JSON instead of a table.")

APPEND_IN_FLIGHT_MAX = 1000
"""Entries ``append`` keeps in flight while reading standard input."""


def _client(meta: str | None, directory: Path | None) -> BlockingLedgerClient:
    from quorumlog.ledger import BlockingLedgerClient

    if meta:
        addresses = [m.strip() for m in meta.split(",") if m.strip()]
    else:
        from quorumlog.node import DEFAULT_DIR, meta_addresses

        addresses = meta_addresses(directory or DEFAULT_DIR)
    return BlockingLedgerClient(addresses)


def _custom(pairs: list[str]) -> dict[str, bytes]:
    from quorumlog.errors import UsageError

    custom = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--metadata takes KEY=VALUE, got {pair!r}")
        custom[key] = value.encode()
    return custom


@app.command()
def create(
    ensemble: int = typer.Option(3, "--ensemble", "-e", help="Ensemble size E."),
    write_quorum: int = typer.Option(2, "--write-quorum", "-w", help="Write quorum Qw."),
    ack_quorum: int = typer.Option(2, "--ack-quorum", "-a", help="Ack quorum Qa."),
    password: str = PasswordOption,
    digest: str = typer.Option("crc32c", help="crc32c or hmac-sha256."),
    placement: str = typer.Option("random", help="random, rack_aware or zone_aware."),
    metadata: list[str] = typer.Option([], "--metadata", "-m",
                                       help="Custom metadata KEY=VALUE (repeatable)."),
    meta: str | None = MembersOption,
    directory: Path | None = DirOption,
) -> None:
    """Create a ledger (E >= Qw >= Qa) and print its id."""
    with _client(meta, directory) as client:
        handle = client.create_ledger(ensemble, write_quorum, ack_quorum, digest=digest,
                                      password=password.encode(), placement=placement,
                                      metadata=_custom(metadata))
        handle.detach()
    typer.echo(handle.id)


@app.command()
def append(
    ledger_id: int = typer.Argument(..., help="The ledger to append to."),
    password: str = PasswordOption,
    meta: str | None = MembersOption,
    directory: Path | None = DirOption,
    as_json: bool = JsonOption,
) -> None:
    """Append one entry per line of standard input (without the newline).

    The ledger stays open for more appends. Only one writer at a time: do not
    run two appends to one ledger at once.
    """
    import concurrent.futures

    with _client(meta, directory) as client:
        handle = client.open_for_append(ledger_id, password=password.encode())
        in_flight: list[concurrent.futures.Future[int]] = []
        first = last = None
        count = 0
        for line in sys.stdin.buffer:
            in_flight.append(handle.append_async(line.rstrip(b"\n")))
            if len(in_flight) >= APPEND_IN_FLIGHT_MAX:
                last = in_flight.pop(0).result()
            count += 1
        for future in in_flight:
            last = future.result()
        if count:
            first = (last or 0) - count + 1
        handle.detach()
    if as_json:
        typer.echo(json.dumps({"ledger": ledger_id, "count": count, "first": first,
                               "last": last}))
    else:
        typer.echo(f"appended {count} entries to ledger {ledger_id}"
                   + (f" (entries {first}..{last})" if count else ""))


@app.command()
def read(
    ledger_id: int = typer.Argument(..., help="The ledger to read."),
    password: str = PasswordOption,
    first: int = typer.Option(0, "--from", help="First entry id."),
    last: int = typer.Option(-1, "--to", help="Last entry id (default: the LAC)."),
    ids: bool = typer.Option(False, "--ids", help="Prefix each line with the entry id and a tab."),
    meta: str | None = MembersOption,
    directory: Path | None = DirOption,
) -> None:
    """Print one entry per line, up to the LAC (an open ledger stays open)."""
    out = sys.stdout.buffer
    if first < 0:
        raise typer.BadParameter(f"--from {first}: entry ids start at 0")
    if last >= 0 and last < first:
        raise typer.BadParameter(f"--to {last} is before --from {first}")
    with _client(meta, directory) as client:
        handle = client.open_ledger(ledger_id, password=password.encode(), recovery=False)
        lac = int(handle.last_add_confirmed)
        end = lac if last < 0 else last
        if end > lac:
            raise typer.BadParameter(
                f"--to {last} is past the last confirmed entry of ledger {ledger_id} "
                f"({lac}; -1: none yet): entries after it are not readable yet")
        if first > end:
            if last < 0 and first == lac + 1:
                return  # nothing new after the LAC: an empty answer, not an error
            raise typer.BadParameter(
                f"--from {first} is past the last confirmed entry of ledger {ledger_id} ({lac})")
        with progress(f"reading ledger {ledger_id}", end - first + 1,
                      streams_stdout=True) as bar:
            for entry in handle.read(first, end):
                if ids:
                    out.write(f"{entry.entry_id}\t".encode())
                out.write(entry.payload + b"\n")
                bar.advance()
    out.flush()


@app.command()
def recover(
    ledger_id: int = typer.Argument(..., help="The ledger to recover."),
    password: str = PasswordOption,
    meta: str | None = MembersOption,
    directory: Path | None = DirOption,
) -> None:
    """Recover and close a ledger; print its last entry id (-1: empty)."""
    with _client(meta, directory) as client:
        handle = client.open_ledger(ledger_id, password=password.encode(), recovery=True)
    typer.echo(handle.last_add_confirmed)


def _info_row(metadata: LedgerMetadata) -> dict[str, Any]:
    return {
        "id": metadata.ledger_id,
        "state": metadata.state.value,
        "ensemble": metadata.ensemble_size,
        "write_quorum": metadata.write_quorum,
        "ack_quorum": metadata.ack_quorum,
        "digest": metadata.digest.value,
        "last_entry_id": metadata.last_entry_id,
        "length_bytes": metadata.length_bytes,
        "created_ms": metadata.created_ms,
        "fragments": [{"first_entry_id": f.first_entry_id, "bookies": list(f.bookies)}
                      for f in metadata.ensembles],
        "custom": {k: v.decode(errors="replace") for k, v in metadata.custom.items()},
    }


@app.command()
def info(
    ledger_id: int = typer.Argument(..., help="The ledger to describe."),
    meta: str | None = MembersOption,
    directory: Path | None = DirOption,
    as_json: bool = JsonOption,
) -> None:
    """Show a ledger's metadata (state, quorums, fragments, custom metadata).

    For an open ledger it also asks the bookies of its last fragment for the
    LAC (last_add_confirmed): metadata knows the last entry only once the
    ledger is closed.
    """
    from quorumlog.errors import QuorumlogError

    with _client(meta, directory) as client:
        row = _info_row(client.ledger_metadata(ledger_id))
        if row["state"] != "CLOSED":
            try:
                row["last_add_confirmed"] = client.last_add_confirmed(ledger_id)
            except QuorumlogError as exc:
                row["last_add_confirmed_error"] = exc.message
    if as_json:
        typer.echo(json.dumps(row))
        return
    table = Table(title=f"ledger {ledger_id}", show_header=False)
    table.add_column("field", no_wrap=True)
    table.add_column("value", overflow="fold")
    for key, value in row.items():
        table.add_row(key, _human(key, value, row))
    console.print(table)


def _human(key: str, value: Any, row: dict[str, Any]) -> str:
    """A metadata field as a person reads it (``--json`` keeps the raw value)."""
    closed = row["state"] == "CLOSED"
    if key == "fragments":
        return "\n".join(f"from entry {f['first_entry_id']}: {', '.join(f['bookies'])}"
                         for f in value)
    if key == "last_entry_id":
        if not closed:
            return "- (open: see last_add_confirmed)"
        return "none (empty)" if value < 0 else str(value)
    if key == "length_bytes":
        if not closed:
            return "- (known when closed)"
        return "unknown (closed by recovery)" if value < 0 else human_bytes(value)
    if key == "created_ms":
        return f"{human_age_ms(value)} ({value})" if value else "-"
    if key == "custom":
        return ", ".join(f"{k}={v}" for k, v in value.items()) or "-"
    return str(value)


def _last_entry_cell(row: dict[str, Any]) -> str:
    if row["state"] != "CLOSED":
        return "open"
    return "empty" if row["last_entry_id"] < 0 else str(row["last_entry_id"])


def _size_cell(row: dict[str, Any]) -> str:
    if row["state"] != "CLOSED":
        return "-"
    return "unknown" if row["length_bytes"] < 0 else human_bytes(row["length_bytes"])


LIST_COLUMNS = (
    field("id", no_wrap=True),
    field("state"),
    Column("E/Qw/Qa", lambda r: f"{r['ensemble']}/{r['write_quorum']}/{r['ack_quorum']}"),
    Column("last entry", _last_entry_cell),
    Column("size", _size_cell),
    field("created_ms", human_age_ms, header="created"),
    field("digest", wide_only=True),
    Column("fragments", lambda r: str(len(r["fragments"])), wide_only=True),
    field("custom", lambda v: ", ".join(f"{k}={x}" for k, x in v.items()) or "-",
          wide_only=True),
)


@app.command("list")
def list_(
    limit: int = typer.Option(1000, help="At most this many ledgers."),
    meta: str | None = MembersOption,
    directory: Path | None = DirOption,
    output: str = OutputOption,
    as_json: bool = JsonOption,
) -> None:
    """List ledgers: state, quorums, last entry, size, age (-o wide|json|yaml for more)."""
    from quorumlog.proto import NoSuchLedgerError

    fmt = output_format(output, as_json)
    with _client(meta, directory) as client:
        rows = []
        for ledger_id in client.list_ledgers(limit=limit):
            try:
                rows.append(_info_row(client.ledger_metadata(ledger_id)))
            except NoSuchLedgerError:
                continue  # deleted between the list and the get
    if fmt == "json":
        typer.echo(json.dumps(rows))  # a bare list, as before -o existed
        return
    emit(console, fmt, "ledgers", rows, LIST_COLUMNS, title=f"{len(rows)} ledger(s)")


@app.command()
def delete(
    ledger_id: int = typer.Argument(..., help="The ledger to delete."),
    force: bool = typer.Option(False, "--force", help="Delete it even if it belongs to a "
                               "stream (the stream loses that data)."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    meta: str | None = MembersOption,
    directory: Path | None = DirOption,
) -> None:
    """Delete a ledger's metadata; bookies garbage-collect its entries.

    A ledger that belongs to a stream is refused (naming the stream) unless
    ``--force``: use ``quorumlog stream trim`` or ``stream delete`` instead.
    """
    if not yes:
        typer.confirm(f"delete ledger {ledger_id} and its entries?", abort=True)
    with _client(meta, directory) as client:
        client.delete_ledger(ledger_id, force=force)
    typer.echo(f"deleted ledger {ledger_id}")
