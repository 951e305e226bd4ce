"""The harness every quorumlog benchmark uses.

A benchmark compares a *workload* (quorumlog) with a *baseline* measured in the
same process run (the raw disk, a peer such as etcd). Each case runs both
``repeats`` times, alternating so drift hits both equally, takes the median of
each metric, and reports the ratio workload/baseline. Results print as a rich
table and can be written as JSON and Markdown (``--json``, ``--markdown``).

A measure function returns a :class:`Sample`: the amount of work done
(``units``: bytes, records, requests) and the seconds it took. Throughput is
units/second; ``higher_is_better`` says how to read the ratio.

Usage in a benchmark module::

    h = Harness("wal", argv)
    h.case("append 100B x16", workload=lambda: ..., baseline=lambda: ...,
           unit="MB/s", target_ratio=0.9)
    h.finish()
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table


@dataclass(frozen=True, slots=True)
class Sample:
    units: float
    seconds: float

    @property
    def rate(self) -> float:
        return self.units / self.seconds if self.seconds > 0 else float("inf")


@dataclass(slots=True)
class CaseResult:
    name: str
    unit: str
    workload_median: float
    baseline_median: float | None
    ratio: float | None
    target_ratio: float | None
    passed: bool | None
    workload_runs: list[float] = field(default_factory=list)
    baseline_runs: list[float] = field(default_factory=list)
    note: str = ""


def timed(fn: Callable[[], float]) -> Sample:
    """Run ``fn`` (which returns its unit count) and time it with perf_counter."""
    start = time.perf_counter()
    units = fn()
    return Sample(units=units, seconds=time.perf_counter() - start)


class Harness:
    def __init__(self, name: str, argv: Sequence[str] | None = None) -> None:
        parser = argparse.ArgumentParser(prog=name, description=f"quorumlog benchmark: {name}")
        parser.add_argument("--repeats", type=int, default=5, help="runs per case (median)")
        parser.add_argument("--json", type=Path, help="write results as JSON here")
        parser.add_argument("--markdown", type=Path, help="write results as Markdown here")
        parser.add_argument("--quick", action="store_true", help="small sizes, 1 repeat")
        self.args, self.extra = parser.parse_known_args(argv)
        self.name = name
        self.repeats = 1 if self.args.quick else max(1, self.args.repeats)
        self.quick: bool = self.args.quick
        self.results: list[CaseResult] = []
        self.console = Console()

    def case(
        self,
        name: str,
        *,
        workload: Callable[[], Sample],
        baseline: Callable[[], Sample] | None,
        unit: str,
        target_ratio: float | None = None,
        higher_is_better: bool = True,
        scale: float = 1.0,
        note: str = "",
    ) -> CaseResult:
        """Measure one case; ``scale`` converts units/s to the display unit."""
        w_runs: list[float] = []
        b_runs: list[float] = []
        for _ in range(self.repeats):
            if baseline is not None:
                b_runs.append(baseline().rate * scale)
            w_runs.append(workload().rate * scale)
        w_med = statistics.median(w_runs)
        b_med = statistics.median(b_runs) if b_runs else None
        ratio = None
        if b_med:
            ratio = w_med / b_med if higher_is_better else b_med / w_med
        passed = None if (ratio is None or target_ratio is None) else ratio >= target_ratio
        result = CaseResult(name, unit, w_med, b_med, ratio, target_ratio, passed,
                            w_runs, b_runs, note)
        self.results.append(result)
        self.console.print(
            f"  {name}: {w_med:,.1f} {unit}"
            + (f" vs baseline {b_med:,.1f} -> ratio {ratio:.2f}" if b_med and ratio else "")
        )
        return result

    def table(self) -> Table:
        t = Table(title=f"benchmark {self.name} (median of {self.repeats})")
        for col in ("case", "quorumlog", "baseline", "unit", "ratio", "target", "ok"):
            t.add_column(col, justify="left" if col == "case" else "right")
        for r in self.results:
            t.add_row(
                r.name,
                f"{r.workload_median:,.1f}",
                "-" if r.baseline_median is None else f"{r.baseline_median:,.1f}",
                r.unit,
                "-" if r.ratio is None else f"{r.ratio:.2f}",
                "-" if r.target_ratio is None else f">= {r.target_ratio:.2f}",
                {None: "-", True: "yes", False: "NO"}[r.passed],
            )
        return t

    def markdown(self) -> str:
        lines = [
            f"### benchmark `{self.name}` (median of {self.repeats})",
            "",
            "| case | quorumlog | baseline | unit | ratio | target | ok |",
            "|---|---:|---:|---|---:|---:|---|",
        ]
        for r in self.results:
            lines.append(
                f"| {r.name} | {r.workload_median:,.1f} | "
                + ("-" if r.baseline_median is None else f"{r.baseline_median:,.1f}")
                + f" | {r.unit} | "
                + ("-" if r.ratio is None else f"{r.ratio:.2f}")
                + " | "
                + ("-" if r.target_ratio is None else f">= {r.target_ratio:.2f}")
                + f" | {dict([(None, '-'), (True, 'yes'), (False, 'NO')])[r.passed]} |"
            )
        return "\n".join(lines) + "\n"

    def finish(self) -> int:
        """Print the table, write files; return 0 (targets are reported, not enforced)."""
        self.console.print(self.table())
        payload = {
            "benchmark": self.name,
            "repeats": self.repeats,
            "machine": {"python": platform.python_version(), "platform": platform.platform()},
            "results": [asdict(r) for r in self.results],
        }
        if self.args.json:
            self.args.json.write_text(json.dumps(payload, indent=2))
        if self.args.markdown:
            self.args.markdown.write_text(self.markdown())
        return 0


DISK_BLOCK_BYTES = 4 * 1024 * 1024


def disk_write_rate(directory: Path, size_bytes: int) -> float:
    """The raw disk's baseline: a sequential write of ``size_bytes`` in
    ``directory`` in 4 MiB blocks, then fsync; bytes per second."""
    path = directory / "disk-probe.bin"
    block = os.urandom(DISK_BLOCK_BYTES)
    written = 0
    started = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        while written < size_bytes:
            written += os.write(fd, block)
        os.fsync(fd)
    finally:
        os.close(fd)
    elapsed = time.perf_counter() - started
    path.unlink()
    return written / elapsed
