"""``quorumlog wal``: inspect, verify and repair write-ahead log directories."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table

from quorumlog.errors import QuorumlogError

if TYPE_CHECKING:  # imported by each command: `quorumlog --help` does not load the WAL
    from quorumlog.wal import RecordInfo, WalReport

app = typer.Typer(
    name="wal",
    help="Inspect, verify and repair write-ahead log (WAL) directories.",
    no_args_is_help=True,
)



def _out() -> Console:
    """A console made per command, so it sees the terminal (or test) width of the call."""
    return Console(highlight=False)

PROGRESS_STEPS_MIN = 3  # segments + the verify pass: two segments read too fast for a bar
_RECORD_TYPES = ("crc", "metadata", "state", "snapshot", "entry")

_DIRECTORY = typer.Argument(
    ..., help="The WAL directory (holds *.wal segment files).", show_default=False
)


def _fail(message: str) -> typer.Exit:
    Console(stderr=True, highlight=False).print(f"[bold red]error:[/] {message}", soft_wrap=True)
    return typer.Exit(code=1)


@app.command("inspect")
def inspect_command(
    directory: Path = _DIRECTORY,
    records: bool = typer.Option(False, "--records", help="Also list the records."),
    limit: int | None = typer.Option(
        None, "--limit", min=1, show_default=False,
        help="List at most this many records (default: quorumlog.wal.RECORDS_LIMIT_DEFAULT, "
        "1,000)."),
) -> None:
    """Show each segment: records by type, first/last entry index, bytes, status.

    Read-only (no lock is taken). Exits 1 if the WAL does not verify.
    """
    from quorumlog.cli._output import progress
    from quorumlog.wal import RECORDS_LIMIT_DEFAULT, inspect

    if limit is None:
        limit = RECORDS_LIMIT_DEFAULT
    steps = len(list(directory.glob("*.wal"))) + 1  # a segment each, then the verify pass
    with progress(f"reading {directory}", steps, items_min=PROGRESS_STEPS_MIN) as bar:
        report = inspect(directory, records_limit=limit if records else 0,
                         progress=bar.update)
    if not report.segments:
        raise _fail(f"{directory} holds no WAL (no *.wal segment files)")
    _out().print(_segment_table(report))
    if records:
        _out().print(_record_table(report.records, limit))
    if report.error is not None:
        raise _fail(report.error)
    _out().print("[green]verify: ok[/]")


def _segment_table(report: WalReport) -> Table:
    table = Table(title=f"WAL {report.directory}")
    table.add_column("segment", no_wrap=True)
    for name in _RECORD_TYPES:
        table.add_column(name, justify="right")
    for name in ("first index", "last index", "data bytes", "file bytes"):
        table.add_column(name, justify="right")
    table.add_column("status")
    for seg in report.segments:
        status = seg.status if seg.problem is None else f"{seg.status}: {seg.problem}"
        table.add_row(
            seg.name,
            *(str(seg.record_counts.get(name, 0)) for name in _RECORD_TYPES),
            "-" if seg.first_index is None else str(seg.first_index),
            "-" if seg.last_index is None else str(seg.last_index),
            f"{seg.data_bytes:,}",
            f"{seg.size_bytes:,}",
            status if seg.status == "ok" else f"[red]{status}[/]",
        )
    return table


def _record_table(records: list[RecordInfo], limit: int) -> Table:
    title = f"records (first {limit})" if len(records) >= limit else "records"
    table = Table(title=title)
    for name in ("segment", "offset", "type", "frame bytes", "index"):
        table.add_column(name, justify="left" if name in ("segment", "type") else "right",
                         no_wrap=True)
    for rec in records:
        table.add_row(rec.segment, str(rec.offset), rec.type, str(rec.frame_bytes),
                      "-" if rec.index is None else str(rec.index))
    return table


@app.command("verify")
def verify_command(directory: Path = _DIRECTORY) -> None:
    """Check every record (CRC chain, framing, metadata, indexes); a torn tail fails too.

    Exit 0 if clean; exit 1 with the damaged file and byte offset otherwise.
    """
    from quorumlog.wal import verify

    try:
        summary = verify(directory)
    except QuorumlogError as exc:
        raise _fail(exc.message) from None
    span = (
        "no entries" if summary.first_index is None
        else f"entries {summary.first_index}..{summary.last_index}"
    )
    _out().print(
        f"ok: {directory}: {summary.segments} segment(s), {summary.entries} entries ({span}), "
        f"{len(summary.snapshot_markers)} snapshot marker(s), "
        f"state {'present' if summary.has_state else 'absent'}",
        soft_wrap=True,
    )


@app.command("repair")
def repair_command(directory: Path = _DIRECTORY) -> None:
    """Cut a torn tail off the last segment (a copy is kept as <segment>.broken).

    Takes the WAL lock, so it fails while a process has the WAL open. Damage
    elsewhere cannot be repaired: exit 1 with the file and byte offset.
    """
    from quorumlog.wal import repair

    try:
        report = repair(directory)
    except QuorumlogError as exc:
        raise _fail(f"cannot repair: {exc.message}") from None
    if report is None:
        _out().print(f"nothing to repair: {directory} has no torn tail", soft_wrap=True)
        return
    _out().print(
        f"repaired: cut {report.segment} at byte offset {report.offset} "
        f"({report.bytes_cut} bytes of torn data: {report.reason}); "
        f"the damaged segment is kept as {report.broken_copy}",
        soft_wrap=True,
    )
