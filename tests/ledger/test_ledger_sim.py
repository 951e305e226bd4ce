"""Seeded simulator runs of the ledger protocol (``quorumlog.sim``).

The default budget runs 480 seeds (every fault mix, shape and ending) in
chunks that ``pytest -n 2`` spreads over both workers; ``-m slow`` runs
6,000 more and checks that planted protocol bugs are caught (on the
"recovery" mix, which aims its faults at recovery). A failure names
the seed, the invariant and the command that replays it with a transcript.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from quorumlog.ledger import ReadAnswer, Schedule, _quorum, _read, _recovery
from quorumlog.sim import LEDGER_MIXES, run_ledger_seed

pytestmark = pytest.mark.sim

DEFAULT_SEEDS = 480
SLOW_SEEDS = 6_000
CHUNK = 120


def _run(start: int, count: int) -> None:
    failures = []
    for seed in range(start, start + count):
        result = run_ledger_seed(seed)
        if not result.passed:
            failures.append(
                f"seed {seed} mix={result.mix} shape={result.shape} ending={result.ending}: "
                f"{result.violation}: {result.detail.splitlines()[0]}\n"
                f"    replay: quorumlog sim ledger --seed {seed} --trace")
    assert not failures, f"{len(failures)} of {count} seeds failed:\n" + "\n".join(failures)


@pytest.mark.parametrize("start", range(0, DEFAULT_SEEDS, CHUNK))
def test_ledger_seeds(start: int) -> None:
    _run(start, CHUNK)


@pytest.mark.slow
@pytest.mark.parametrize("start", range(DEFAULT_SEEDS, DEFAULT_SEEDS + SLOW_SEEDS, 500))
def test_ledger_seeds_slow(start: int) -> None:
    _run(start, 500)


def test_a_seed_replays_bit_for_bit() -> None:
    for seed in (3, 11, 247):
        first = run_ledger_seed(seed, keep_trace=True)
        second = run_ledger_seed(seed, keep_trace=True)
        assert first.trace_hash == second.trace_hash
        assert first.trace == second.trace and len(first.trace) > 10
        quiet = run_ledger_seed(seed)  # tracing only records
        assert quiet.stats == first.stats


def test_runs_cover_every_mix_shape_and_ending() -> None:
    results = [run_ledger_seed(seed) for seed in range(42)]
    assert {r.mix for r in results} == set(LEDGER_MIXES)
    assert {r.ending for r in results} == {"close", "crash", "zombie"}
    assert len({r.shape for r in results}) >= 10
    assert sum(r.stats["entries_acked"] for r in results) > 3_000


# ----- planted bugs must be caught --------------------------------------------------------


@contextmanager
def _planted(target: object, name: str, replacement: object) -> Iterator[None]:
    original = getattr(target, name)
    setattr(target, name, replacement)
    try:
        yield
    finally:
        setattr(target, name, original)


def _caught(seeds: range, mix: str = "recovery") -> set[str]:
    return {r.violation for seed in seeds if not (r := run_ledger_seed(seed, mix)).passed}


def test_a_reader_ignoring_the_lac_is_caught() -> None:
    async def past_lac(self: _read.ReadHandle, after: int, timeout_ms: int = 1000) -> object:
        try:
            return await self._reader.read_entry(self._metadata, after + 1)
        except Exception:
            return None

    with _planted(_read.ReadHandle, "wait_for_entry", past_lac):
        assert "read-past-lac" in _caught(range(40), "all")


@pytest.mark.slow
def test_unknown_counted_as_no_such_entry_is_caught() -> None:
    original = _recovery.answer_of

    def careless(error: BaseException | None) -> ReadAnswer:
        answer = original(error)
        return ReadAnswer.NO_SUCH_ENTRY if answer is ReadAnswer.UNKNOWN else answer

    with _planted(_recovery, "answer_of", careless):
        assert _caught(range(800)) & {"acked-lost", "fenced-writer-committed"}


@pytest.mark.slow
def test_fence_quorum_of_one_is_caught() -> None:
    with _planted(Schedule, "fence_quorum", property(lambda self: 1)):
        assert _caught(range(400)) & {"acked-lost", "fenced-writer-committed"}


@pytest.mark.slow
def test_confirming_at_one_ack_is_caught() -> None:
    with _planted(_quorum.AckSet, "complete", property(lambda self: len(self._acked) >= 1)):
        assert _caught(range(400)) & {"acked-lost", "fenced-writer-committed"}


@pytest.mark.slow
def test_recovery_without_fencing_is_caught() -> None:
    async def no_fence(*args: object) -> int:
        return -1

    with _planted(_recovery, "_fence", no_fence):
        assert _caught(range(400)) & {"acked-lost", "fenced-writer-committed"}
