"""Many seeds: run them (in one process or several) and summarize the results.

Each seed is independent and deterministic, so the results do not depend on
how many processes run them or in which order they finish; results are
reported sorted by seed.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from quorumlog.errors import UsageError
from quorumlog.sim._config import SimConfig, mix_for_seed
from quorumlog.sim._linearizability import Verdict
from quorumlog.sim._runner import SimResult, run_seed

JOBS_MAX = 64
"""Worker processes one batch may start."""

SEEDS_PER_TASK = 25
"""Seeds a worker runs per task: amortizes process hand-off, keeps progress smooth."""


@dataclass(frozen=True, slots=True)
class SeedSpec:
    seed: int
    mix: str  # a mix name or "all" (rotate by seed)
    nodes: int


@dataclass(slots=True)
class MixSummary:
    seeds: int = 0
    passed: int = 0
    decided: int = 0  # linearizability decided (OK or ILLEGAL)
    undecided: int = 0  # linearizability hit its bound
    operations: int = 0
    unknown_operations: int = 0


@dataclass(slots=True)
class BatchSummary:
    """Counts per mix plus every failure (sorted by seed)."""

    per_mix: dict[str, MixSummary] = field(default_factory=dict)
    failures: list[SimResult] = field(default_factory=list)

    def add(self, result: SimResult) -> None:
        summary = self.per_mix.setdefault(result.mix, MixSummary())
        summary.seeds += 1
        summary.passed += result.passed
        summary.decided += result.verdict in (Verdict.OK, Verdict.ILLEGAL)
        summary.undecided += result.verdict is Verdict.UNKNOWN
        summary.operations += result.operations
        summary.unknown_operations += result.unknown_operations
        if not result.passed:
            self.failures.append(result)
            self.failures.sort(key=lambda r: (r.seed, r.mix))

    @property
    def seeds(self) -> int:
        return sum(s.seeds for s in self.per_mix.values())

    @property
    def passed(self) -> bool:
        return not self.failures


def run_spec(spec: SeedSpec, config: SimConfig | None = None) -> SimResult:
    base = config or SimConfig()
    if base.nodes != spec.nodes:
        base = base.replace(nodes=spec.nodes)
    return run_seed(spec.seed, mix_for_seed(spec.mix, spec.seed), base)


def _run_chunk(specs: list[SeedSpec]) -> list[SimResult]:
    # Transcripts are not kept in bulk runs, so results are small to ship back.
    return [run_spec(spec) for spec in specs]


def _chunks(specs: list[SeedSpec], size: int) -> Iterator[list[SeedSpec]]:
    for start in range(0, len(specs), size):
        yield specs[start:start + size]


def run_many(
    specs: Iterable[SeedSpec],
    *,
    jobs: int = 1,
    on_result: Callable[[SimResult], None] | None = None,
) -> BatchSummary:
    """Run every spec; ``jobs > 1`` uses that many worker processes."""
    if not 1 <= jobs <= JOBS_MAX:
        raise UsageError(f"jobs must be in [1, {JOBS_MAX}], got {jobs}")
    summary = BatchSummary()
    spec_list = list(specs)
    if jobs == 1:
        results: Iterable[SimResult] = (run_spec(spec) for spec in spec_list)
        for result in results:
            summary.add(result)
            if on_result is not None:
                on_result(result)
        return summary
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        for chunk_results in pool.map(_run_chunk, _chunks(spec_list, SEEDS_PER_TASK)):
            for result in chunk_results:
                summary.add(result)
                if on_result is not None:
                    on_result(result)
    return summary
