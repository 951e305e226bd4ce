"""One output switch for every listing command: ``-o table|wide|json|yaml``.

As kubectl and etcdctl do it: the default ``table`` shows the columns an
operator reads first and fits 80 columns (cells wrap instead of ending in
"…"); ``wide`` adds every other column; ``json`` and ``yaml`` print the raw
rows (numbers as numbers, times in ms, sizes in bytes) for scripts. Tables
show human units (``1.2 MiB``, ``3 s ago``) made by the helpers below.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

FORMATS = ("table", "wide", "json", "yaml")
WIDE_WIDTH_MAX = 400  # characters: -o wide lines may exceed the terminal, not this
# Fewer items than this finish before a bar is worth drawing (ledger read, consume).
PROGRESS_ITEMS_MIN = 200

OutputOption = typer.Option(
    "table", "--output", "-o",
    help="table (the main columns, fits 80 columns), wide (every column), json or yaml "
    "(raw values for scripts).")
JsonFlag = typer.Option(False, "--json", help="Same as -o json.")


@dataclass(frozen=True, slots=True)
class Column:
    """A table column: its header, how to show a row's value, and whether only
    ``-o wide`` shows it."""

    header: str
    show: Callable[[dict[str, Any]], str]
    wide_only: bool = False
    no_wrap: bool = False  # an address or id: never broken across lines


def field(name: str, fmt: Callable[[Any], str] = str, *, header: str | None = None,
          wide_only: bool = False, no_wrap: bool = False, missing: str = "-") -> Column:
    """A column showing ``row[name]`` through ``fmt`` (``missing`` when absent)."""
    def show(row: dict[str, Any]) -> str:
        value = row.get(name)
        return missing if value is None else fmt(value)

    return Column(header or name, show, wide_only, no_wrap)


def output_format(output: str, as_json: bool = False) -> str:
    chosen = "json" if as_json else output.strip().lower()
    if chosen not in FORMATS:  # exit code 2, as for every bad option value
        raise typer.BadParameter(f"-o {output!r}: expected one of {', '.join(FORMATS)}")
    return chosen


def emit(console: Console, fmt: str, key: str, rows: list[dict[str, Any]],
         columns: Sequence[Column], *, title: str | None = None) -> None:
    """Print ``rows`` as ``fmt`` (see the module doc); ``key`` names the list in
    json and yaml (``{"nodes": [...]}``)."""
    if fmt == "json":
        typer.echo(json.dumps({key: rows}, indent=2, default=str))
        return
    if fmt == "yaml":
        import yaml  # type: ignore[import-untyped]

        typer.echo(yaml.safe_dump({key: json.loads(json.dumps(rows, default=str))},
                                  sort_keys=False).rstrip())
        return
    wide = fmt == "wide"
    shown = [c for c in columns if wide or not c.wide_only]
    table = Table(title=title, expand=False)
    for column in shown:
        # The default view wraps cells between words to fit the terminal; the
        # wide one keeps every cell on one line, however long the line gets.
        table.add_column(column.header, no_wrap=wide or column.no_wrap, overflow="fold")
    for row in rows:
        table.add_row(*[column.show(row) for column in shown])
    if wide:
        console = Console(width=WIDE_WIDTH_MAX, force_terminal=console.is_terminal,
                          no_color=console.no_color)
    console.print(table)


def emit_document(fmt: str, document: dict[str, Any]) -> None:
    """Print one object (``info`` commands) as json or yaml, raw values."""
    if fmt == "yaml":
        import yaml

        typer.echo(yaml.safe_dump(json.loads(json.dumps(document, default=str)),
                                  sort_keys=False).rstrip())
        return
    typer.echo(json.dumps(document, default=str))


def human_bytes(value: Any) -> str:
    """``1536`` -> ``1.5 KiB``; negative (unknown) -> ``-``."""
    size = float(value)
    if size < 0:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def human_ratio(value: Any) -> str:
    """``0.1527`` -> ``15.3%``."""
    return f"{float(value) * 100:.1f}%"


def human_age_ms(epoch_ms: Any, *, now_s: float | None = None) -> str:
    """Milliseconds since the epoch -> ``42 s ago`` / ``3 min ago`` / ``2 h ago`` / ``5 d ago``."""
    if not epoch_ms:
        return "-"
    age_s = max(0.0, (time.time() if now_s is None else now_s) - int(epoch_ms) / 1000)
    for limit, unit, div in ((120, "s", 1), (7200, "min", 60), (172800, "h", 3600)):
        if age_s < limit:
            return f"{int(age_s / div)} {unit} ago"
    return f"{int(age_s / 86400)} d ago"


def joined(value: Any) -> str:
    """A list as ``a, b, c`` (a narrow column wraps between the items)."""
    return ", ".join(str(v) for v in value) if isinstance(value, list | tuple) else str(value)


def human_duration_ms(value: Any) -> str:
    """A duration in ms -> ``750 ms`` / ``45 s`` / ``10 min`` / ``4 h`` / ``7 d``;
    negative -> ``no limit`` (retention's -1), ``0`` -> ``off``."""
    ms = int(value)
    if ms < 0:
        return "no limit"
    if ms == 0:
        return "off"
    for limit, unit, div in ((1000, "ms", 1), (120_000, "s", 1000), (7_200_000, "min", 60_000),
                             (172_800_000, "h", 3_600_000)):
        if ms < limit:
            return f"{ms / div:g} {unit}" if ms % div == 0 else f"{ms / div:.1f} {unit}"
    return f"{ms / 86_400_000:g} d" if ms % 86_400_000 == 0 else f"{ms / 86_400_000:.1f} d"


def human_time_ms(epoch_ms: Any, *, now_s: float | None = None) -> str:
    """Milliseconds since the epoch -> ``2024-05-01 12:00:03 (3 min ago)`` in local time;
    0 (never) -> ``-``."""
    if not epoch_ms:
        return "-"
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(int(epoch_ms) / 1000))
    return f"{stamp} ({human_age_ms(epoch_ms, now_s=now_s)})"


def human_rate(value: Any, unit: str) -> str:
    """``1234.5`` msg/s -> ``1,234.5 msg/s``; bytes -> ``1.2 MiB/s``."""
    rate = float(value)
    if unit == "B":
        return f"{human_bytes(rate)}/s"
    return f"{rate:,.1f} {unit}/s"


def position_text(position: Any) -> str:
    """A stream position as ``ledger:entry`` (``:batch`` when inside a batch), from a
    Position/SeqPosition, its JSON dict, or the array a cursor state is stored as
    (``[seq, entry, batch, ledger]``); None -> ``-``."""
    if position is None:
        return "-"
    if isinstance(position, dict):
        ledger, entry, batch = position["ledger"], position["entry"], position.get("batch", 0)
    elif isinstance(position, list | tuple):
        _, entry, batch, ledger = position
    else:
        ledger, entry, batch = position.ledger_id, position.entry_id, position.batch_index
    return f"{ledger}:{entry}" + (f":{batch}" if batch else "")


def position_json(position: Any) -> dict[str, int] | None:
    """The stored array of a cursor position (``[seq, entry, batch, ledger]``) as
    named fields for json/yaml output."""
    if position is None:
        return None
    seq, entry, batch, ledger = position
    return {"ledger": ledger, "entry": entry, "batch": batch, "seq": seq}


_progress_quiet = [False]  # `quorumlog --quiet` turns every progress bar off


def set_quiet(quiet: bool) -> None:
    _progress_quiet[0] = quiet


class ProgressBar:
    """What :func:`progress` yields: move the bar (nothing when none is drawn)."""

    def __init__(self, bar: Any = None, task: Any = None) -> None:
        self._bar, self._task = bar, task

    def advance(self, count: int = 1) -> None:
        if self._bar is not None:
            self._bar.advance(self._task, count)

    def update(self, completed: int, total: int) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=completed, total=total)


@contextmanager
def progress(description: str, total: int | None, *, items_min: int = PROGRESS_ITEMS_MIN,
             streams_stdout: bool = False) -> Iterator[ProgressBar]:
    """A transient progress bar on stderr.

    Drawn only when stderr is a terminal (rich's test: ``TTY_COMPATIBLE=1`` or
    ``FORCE_COLOR`` force it), ``--quiet`` is off, and ``total`` is unknown or
    at least ``items_min``. A command that streams its results to stdout
    (``streams_stdout``) draws none when stdout is the terminal too: the lines
    scrolling by are the progress, and a bar would be drawn over them. Stdout
    is never redirected, so what a command prints is the same with or without
    a bar.
    """
    from rich.console import Console

    console = Console(stderr=True)
    show = (not _progress_quiet[0] and console.is_terminal
            and (total is None or total >= items_min)
            and not (streams_stdout and sys.stdout.isatty()))
    if not show:
        yield ProgressBar()
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    with Progress("[progress.description]{task.description}", BarColumn(),
                  MofNCompleteColumn(), TimeRemainingColumn(), console=console,
                  transient=True, redirect_stdout=False, redirect_stderr=False) as bar:
        yield ProgressBar(bar, bar.add_task(description, total=total))
