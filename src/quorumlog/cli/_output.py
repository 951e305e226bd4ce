"""One output switch for every listing command: ``-o table|wide|json|yaml``.

As kubectl and etcdctl do it: the default ``table`` shows the columns an
operator reads first and fits 80 columns (cells wrap instead of ending in
"…"); ``wide`` adds every other column; ``json`` and ``yaml`` print the raw
rows (numbers as numbers, times in ms, sizes in bytes) for scripts. Tables
show human units (``1.2 MiB``, ``3 s ago``) made by the helpers below.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from quorumlog.errors import UsageError

FORMATS = ("table", "wide", "json", "yaml")
WIDE_WIDTH_MAX = 400  # characters: -o wide lines may exceed the terminal, not this

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
    if chosen not in FORMATS:
        raise UsageError(f"-o {output!r}: expected one of {', '.join(FORMATS)}")
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
