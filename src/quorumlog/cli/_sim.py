"""``quorumlog sim``: the deterministic simulator.

``quorumlog sim raft --seeds N`` runs N seeds and prints a summary;
``quorumlog sim raft --seed S --trace`` replays one seed and prints its
transcript. ``quorumlog sim ledger``, ``table`` and ``recovery`` do the same for
the ledger protocol, the table scheduler and auto-recovery.
A failure prints the seed, the violated invariant and the command that
replays it; the exit code is 1 when any seed failed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from quorumlog.sim import BatchSummary, SimResult

app = typer.Typer(
    help="Deterministic simulation: seeded, replayable runs with faults.",
    no_args_is_help=True,
)

_console = Console(soft_wrap=True)  # transcript lines stay one line each (grep-able)
_err = Console(stderr=True)

DETAIL_LINES_SHOWN = 12
"""Lines of a failure's explanation printed in a summary."""


@app.command("raft")
def raft(
    seeds: int = typer.Option(0, "--seeds", min=0, help="Run this many seeds."),
    start: int = typer.Option(0, "--start", min=0, help="First seed of --seeds."),
    seed: int | None = typer.Option(None, "--seed", min=0, help="Run (replay) one seed."),
    nodes: int = typer.Option(3, "--nodes", min=1, max=9, help="Raft nodes at the start."),
    mix: str = typer.Option(
        "all", "--mix",
        help="Fault mix: calm, lossy, partitions, crashes, figure8, churn, idle, everything; "
        "'all' rotates through them by seed.",
    ),
    jobs: int = typer.Option(2, "--jobs", min=1, max=64, help="Worker processes for --seeds."),
    trace: bool = typer.Option(False, "--trace", help="With --seed: print the transcript."),
) -> None:
    """Run the Raft key-value cluster simulator: safety invariants after every
    step, linearizability of the client history, liveness after faults heal."""
    from quorumlog.errors import UsageError
    from quorumlog.sim import mix_for_seed

    mix_for_seed(mix, 0)  # reject an unknown mix before doing anything
    if (seed is None) == (seeds == 0):
        raise UsageError("give exactly one of --seed S (replay one) or --seeds N (run many)")
    if seed is not None:
        ok = _run_one(seed, mix, nodes, trace=trace)
    else:
        if trace:
            raise UsageError("--trace needs --seed S: transcripts are kept for one seed only")
        ok = _run_many(start, seeds, mix, nodes, jobs)
    if not ok:
        raise typer.Exit(1)


def _run_one(seed: int, mix_name: str, nodes: int, *, trace: bool) -> bool:
    from quorumlog.sim import SimConfig, mix_for_seed, run_seed

    mix = mix_for_seed(mix_name, seed)
    result = run_seed(seed, mix, SimConfig(nodes=nodes), keep_trace=trace)
    for line in result.trace:
        _console.print(line, markup=False, highlight=False)
    stats = " ".join(f"{k}={v}" for k, v in result.stats.items())
    _console.print(
        f"seed {seed} mix={result.mix} nodes={nodes}: "
        + ("[green]passed[/]" if result.passed else f"[red]FAILED[/] {result.violation}"),
    )
    _console.print(
        f"  operations={result.operations} unknown={result.unknown_operations} "
        f"linearizability={result.verdict or '-'} {stats}",
        markup=False, highlight=False,
    )
    if trace:
        _console.print(f"  trace sha256 {result.trace_hash}", markup=False)
    if not result.passed:
        _print_failure(result, nodes)
    return result.passed


def _run_many(start: int, count: int, mix: str, nodes: int, jobs: int) -> bool:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from quorumlog.sim import SeedSpec, run_many

    specs = [SeedSpec(seed, mix, nodes) for seed in range(start, start + count)]
    columns = (
        "{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        "{task.fields[failed]} failed",
    )
    with Progress(*columns, console=_err, transient=True) as progress:
        task = progress.add_task(f"raft sim, {nodes} nodes", total=count, failed=0)
        failed = 0

        def advance(result: SimResult) -> None:
            nonlocal failed
            failed += not result.passed
            progress.update(task, advance=1, failed=failed)

        summary = run_many(specs, jobs=jobs, on_result=advance)
    _print_summary(summary, start, count, nodes)
    for result in summary.failures:
        _print_failure(result, nodes)
    return summary.passed


def _print_summary(summary: BatchSummary, start: int, count: int, nodes: int) -> None:
    table = Table(title=f"quorumlog sim raft: seeds {start}..{start + count - 1}, {nodes} nodes")
    for column in ("mix", "seeds", "passed", "failed", "lin. decided", "lin. undecided",
                   "ops", "unknown ops"):
        table.add_column(column, justify="left" if column == "mix" else "right")
    for name, s in sorted(summary.per_mix.items()):
        failed = s.seeds - s.passed
        table.add_row(
            name, str(s.seeds), str(s.passed), f"[red]{failed}[/]" if failed else "0",
            str(s.decided), str(s.undecided), str(s.operations), str(s.unknown_operations),
        )
    _console.print(table)
    failed = len(summary.failures)
    verdict = "[green]all passed[/]" if summary.passed else f"[red]{failed} failed[/]"
    _console.print(f"{summary.seeds} seeds: {verdict}")


def _print_failure(result: SimResult, nodes: int) -> None:
    lines = result.detail.splitlines() or [""]
    _console.print(
        f"[red]seed {result.seed}[/] mix={result.mix} violated [bold]{result.violation}[/]: ",
        end="",
    )
    _console.print(lines[0], markup=False, highlight=False)
    for line in lines[1:DETAIL_LINES_SHOWN]:
        _console.print(f"  {line}", markup=False, highlight=False)
    _console.print(
        f"  replay: quorumlog sim raft --seed {result.seed} --mix {result.mix} "
        f"--nodes {nodes} --trace",
        markup=False, highlight=False,
    )


@app.command("ledger")
def ledger(
    seeds: int = typer.Option(0, "--seeds", min=0, help="Run this many seeds."),
    start: int = typer.Option(0, "--start", min=0, help="First seed of --seeds."),
    seed: int | None = typer.Option(None, "--seed", min=0, help="Run (replay) one seed."),
    mix: str = typer.Option(
        "all", "--mix",
        help="Fault mix: calm, crashes, partitions, slow, lossy, everything; "
        "'all' rotates through them by seed.",
    ),
    jobs: int = typer.Option(2, "--jobs", min=1, max=64, help="Worker processes for --seeds."),
    trace: bool = typer.Option(False, "--trace", help="With --seed: print the transcript."),
) -> None:
    """Run the ledger protocol simulator: writer, tailing reader, recovering
    clients and bookies with crashes, partitions, slow bookies and lost messages."""
    from quorumlog.errors import UsageError
    from quorumlog.sim import ledger_mix_for_seed

    ledger_mix_for_seed(mix, 0)  # reject an unknown mix before doing anything
    if (seed is None) == (seeds == 0):
        raise UsageError("give exactly one of --seed S (replay one) or --seeds N (run many)")
    if seed is not None:
        ok = _ledger_one(seed, mix, trace=trace)
    else:
        if trace:
            raise UsageError("--trace needs --seed S: transcripts are kept for one seed only")
        ok = _ledger_many(start, seeds, mix, jobs)
    if not ok:
        raise typer.Exit(1)


def _ledger_one(seed: int, mix: str, *, trace: bool) -> bool:
    from quorumlog.sim import run_ledger_seed

    result = run_ledger_seed(seed, mix, keep_trace=trace)
    for line in result.trace:
        _console.print(line, markup=False, highlight=False)
    e, w, a = result.shape
    _console.print(
        f"seed {seed} mix={result.mix} shape=({e},{w},{a}) ending={result.ending}: "
        + ("[green]passed[/]" if result.passed else f"[red]FAILED[/] {result.violation}"))
    stats = " ".join(f"{k}={v}" for k, v in result.stats.items())
    _console.print(f"  {stats}", markup=False, highlight=False)
    if trace:
        _console.print(f"  trace sha256 {result.trace_hash}", markup=False)
    if not result.passed:
        _console.print(f"  {result.detail}", markup=False, highlight=False)
        _console.print(f"  replay: quorumlog sim ledger --seed {seed} --mix {mix} --trace",
                       markup=False, highlight=False)
    return result.passed


def _ledger_many(start: int, count: int, mix: str, jobs: int) -> bool:
    from collections import Counter

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from quorumlog.sim import LedgerSimResult, run_ledger_many

    columns = (
        "{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        "{task.fields[failed]} failed",
    )
    failed = 0
    with Progress(*columns, console=_err, transient=True) as progress:
        task = progress.add_task("ledger sim", total=count, failed=0)

        def advance(result: LedgerSimResult) -> None:
            nonlocal failed
            failed += not result.passed
            progress.update(task, advance=1, failed=failed)

        results = run_ledger_many(range(start, start + count), mix, jobs=jobs,
                                  on_result=advance)
    table = Table(title=f"quorumlog sim ledger: seeds {start}..{start + count - 1}")
    for column in ("mix", "seeds", "passed", "failed", "entries acked"):
        table.add_column(column, justify="left" if column == "mix" else "right")
    seeds_by_mix: Counter[str] = Counter()
    passed_by_mix: Counter[str] = Counter()
    acked_by_mix: Counter[str] = Counter()
    for result in results:
        seeds_by_mix[result.mix] += 1
        passed_by_mix[result.mix] += result.passed
        acked_by_mix[result.mix] += result.stats.get("entries_acked", 0)
    for name in sorted(seeds_by_mix):
        bad = seeds_by_mix[name] - passed_by_mix[name]
        table.add_row(name, str(seeds_by_mix[name]), str(passed_by_mix[name]),
                      f"[red]{bad}[/]" if bad else "0", str(acked_by_mix[name]))
    _console.print(table)
    failures = [r for r in results if not r.passed]
    verdict = "[green]all passed[/]" if not failures else f"[red]{len(failures)} failed[/]"
    _console.print(f"{len(results)} seeds: {verdict}")
    for result in failures:
        _console.print(f"[red]seed {result.seed}[/] mix={result.mix} violated "
                       f"[bold]{result.violation}[/]: ", end="")
        _console.print(result.detail.splitlines()[0] if result.detail else "", markup=False,
                       highlight=False)
        _console.print(f"  replay: quorumlog sim ledger --seed {result.seed} --mix {mix} "
                       "--trace", markup=False, highlight=False)
    return not failures


@app.command("table")
def table(
    seeds: int = typer.Option(0, "--seeds", min=0, help="Run this many seeds."),
    start: int = typer.Option(0, "--start", min=0, help="First seed of --seeds."),
    seed: int | None = typer.Option(None, "--seed", min=0, help="Run (replay) one seed."),
    mix: str = typer.Option("all", "--mix",
                            help="scheduler, dup, or all (every seed in each mix)."),
    jobs: int = typer.Option(2, "--jobs", min=1, max=64, help="Worker processes for --seeds."),
    trace: bool = typer.Option(False, "--trace", help="With --seed: print the transcript."),
) -> None:
    """Run the table simulator: the production scheduler and partition Raft
    groups with crashes (one node for good), partitions and scheduler
    failovers; every group must be back on 3 live voters with every
    acknowledged write. The dup mix runs table replicas duplicating to a
    remote cluster: every write must reach it (docs/sim.md)."""
    from quorumlog.errors import UsageError
    from quorumlog.sim import TABLE_MIXES

    if (seed is None) == (seeds == 0):
        raise UsageError("give exactly one of --seed S (replay one) or --seeds N (run many)")
    if mix != "all" and mix not in TABLE_MIXES:
        raise UsageError(f"unknown --mix {mix!r}; give one of {', '.join(TABLE_MIXES)} or all")
    mixes = TABLE_MIXES if mix == "all" else (mix,)
    if seed is not None:
        if not all(_replay_table(seed, one, trace) for one in mixes):
            raise typer.Exit(1)
        return
    if trace:
        raise UsageError("--trace needs --seed S: transcripts are kept for one seed only")
    if not all(_run_table_seeds(start, seeds, one, jobs) for one in mixes):
        raise typer.Exit(1)


def _replay_table(seed: int, mix: str, trace: bool) -> bool:
    from quorumlog.sim import run_table_seed, table_config_for_mix

    result = run_table_seed(seed, table_config_for_mix(mix), keep_trace=trace)
    for line in result.trace:
        _console.print(line, markup=False, highlight=False)
    _console.print(f"seed {seed} mix={mix} nodes={result.nodes} groups={result.groups}: "
                   + ("[green]passed[/]" if result.passed
                      else f"[red]FAILED[/] {result.violation}"))
    stats = " ".join(f"{k}={v}" for k, v in result.stats.items())
    _console.print(f"  {stats}", markup=False, highlight=False)
    if trace:
        _console.print(f"  trace sha256 {result.trace_hash}", markup=False)
    if not result.passed:
        _console.print(f"  {result.detail}", markup=False, highlight=False)
        _console.print(f"  replay: quorumlog sim table --seed {seed} --mix {mix} --trace",
                       markup=False, highlight=False)
    return result.passed


def _run_table_seeds(start: int, seeds: int, mix: str, jobs: int) -> bool:
    from quorumlog.sim import run_table_many

    results = run_table_many(range(start, start + seeds), jobs=jobs, mix=mix)
    failures = [r for r in results if not r.passed]
    keys: tuple[str, ...] = ("crashes", "failovers", "drains", "changes_applied",
                             "stale_ignored", "writes_acked")
    if mix == "dup":
        keys += ("dup_shipped_mutations", "dup_skipped_mutations", "dup_remote_outages",
                 "dup_gc_proposed", "compactions")
    totals = {key: sum(r.stats.get(key, 0) for r in results) for key in keys}
    _console.print(f"quorumlog sim table --mix {mix}: seeds {start}..{start + seeds - 1}: "
                   + " ".join(f"{k}={v}" for k, v in totals.items()), markup=False)
    verdict = "[green]all passed[/]" if not failures else f"[red]{len(failures)} failed[/]"
    _console.print(f"{len(results)} seeds: {verdict}")
    for result in failures:
        _console.print(f"[red]seed {result.seed}[/] violated [bold]{result.violation}[/]: ",
                       end="")
        _console.print(result.detail.splitlines()[0] if result.detail else "",
                       markup=False, highlight=False)
        _console.print(f"  replay: quorumlog sim table --seed {result.seed} --mix {mix} "
                       "--trace", markup=False, highlight=False)
    return not failures


@app.command("recovery")
def recovery(
    seeds: int = typer.Option(0, "--seeds", min=0, help="Run this many seeds."),
    start: int = typer.Option(0, "--start", min=0, help="First seed of --seeds."),
    seed: int | None = typer.Option(None, "--seed", min=0, help="Run (replay) one seed."),
    jobs: int = typer.Option(2, "--jobs", min=1, max=64, help="Worker processes for --seeds."),
    trace: bool = typer.Option(False, "--trace", help="With --seed: print the transcript."),
) -> None:
    """Run the auto-recovery simulator: the production auditor and replication
    workers on three nodes with node crashes mid-copy, expiring sessions,
    bookie outages and disks lost for good; every closed ledger must end with
    its full write quorum on live bookies (or be reported lost)."""
    from quorumlog.errors import UsageError
    from quorumlog.log import configure
    from quorumlog.sim import run_recovery_many, run_recovery_seed

    # The auditor's and workers' own log lines (a lost ledger is an error there)
    # are the run's expected events: the transcript shows the run instead.
    configure("CRITICAL")
    if (seed is None) == (seeds == 0):
        raise UsageError("give exactly one of --seed S (replay one) or --seeds N (run many)")
    if seed is not None:
        result = run_recovery_seed(seed, keep_trace=trace)
        for line in result.trace:
            _console.print(line, markup=False, highlight=False)
        _console.print(f"seed {seed}: " + ("[green]passed[/]" if result.passed
                                           else f"[red]FAILED[/] {result.violation}"))
        stats = " ".join(f"{k}={v}" for k, v in result.stats.items())
        _console.print(f"  {stats}", markup=False, highlight=False)
        if trace:
            _console.print(f"  trace sha256 {result.trace_hash}", markup=False)
        if not result.passed:
            _console.print(f"  {result.detail}", markup=False, highlight=False)
            _console.print(f"  replay: quorumlog sim recovery --seed {seed} --trace",
                           markup=False, highlight=False)
            raise typer.Exit(1)
        return
    if trace:
        raise UsageError("--trace needs --seed S: transcripts are kept for one seed only")
    results = run_recovery_many(range(start, start + seeds), jobs=jobs)
    failures = [r for r in results if not r.passed]
    totals = {key: sum(r.stats.get(key, 0) for r in results)
              for key in ("node_crashes", "keepalive_stalls", "bookie_outages", "disks_lost",
                          "tasks_filed", "swaps")}
    _console.print(f"quorumlog sim recovery: seeds {start}..{start + seeds - 1}: "
                   + " ".join(f"{k}={v}" for k, v in totals.items()), markup=False)
    verdict = "[green]all passed[/]" if not failures else f"[red]{len(failures)} failed[/]"
    _console.print(f"{len(results)} seeds: {verdict}")
    for result in failures:
        _console.print(f"[red]seed {result.seed}[/] violated [bold]{result.violation}[/]: ",
                       end="")
        _console.print(result.detail.splitlines()[0] if result.detail else "",
                       markup=False, highlight=False)
        _console.print(f"  replay: quorumlog sim recovery --seed {result.seed} --trace",
                       markup=False, highlight=False)
    if failures:
        raise typer.Exit(1)
