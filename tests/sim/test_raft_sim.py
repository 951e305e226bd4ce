"""The Raft simulator as a whole: determinism, replay, transcripts, the CLI."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from quorumlog.errors import UsageError
from quorumlog.sim import MIXES, SeedSpec, SimConfig, Verdict, run_many, run_seed

pytestmark = pytest.mark.sim


@pytest.mark.parametrize("mix", ["everything", "churn"])
def test_same_seed_replays_bit_for_bit(mix: str) -> None:
    first = run_seed(11, MIXES[mix], SimConfig(), keep_trace=True)
    second = run_seed(11, MIXES[mix], SimConfig(), keep_trace=True)
    assert first.trace_hash == second.trace_hash
    assert first.trace == second.trace
    assert first.fingerprint == second.fingerprint
    # Tracing only watches: a run without a transcript is the same run.
    quiet = run_seed(11, MIXES[mix], SimConfig())
    assert quiet.fingerprint == first.fingerprint
    assert quiet.trace == ()
    # And another seed is another run.
    other = run_seed(12, MIXES[mix], SimConfig(), keep_trace=True)
    assert other.trace_hash != first.trace_hash


def test_transcript_reads_like_a_transcript() -> None:
    result = run_seed(3, MIXES["everything"], SimConfig(), keep_trace=True)
    text = "\n".join(result.trace)
    assert re.search(r"^t=\d+ \d+->\d+ APP term=\d+ log=\d+/\d+ commit=\d+ entries=\[", text, re.M)
    assert re.search(r"^t=\d+ \d+->\d+ VOTE term=\d+ log=\d+/\d+$", text, re.M)
    assert re.search(r"^t=\d+ CRASH node \d+ ", text, re.M)
    assert re.search(r"^t=\d+ RESTART node \d+ term=\d+", text, re.M)
    assert re.search(r"^t=\d+ client 100\d starts seq=\d+ (put|get|cas) k\d", text, re.M)
    assert re.search(r"^t=\d+ HEAL", text, re.M)
    times = [int(line.split(" ", 1)[0][2:]) for line in result.trace]
    assert times == sorted(times)


def test_runs_exercise_the_interesting_paths() -> None:
    """Guard against a sim that silently stops injecting faults."""
    totals: dict[str, int] = {}
    for seed in range(8):
        for mix in ("crashes", "churn", "partitions"):
            result = run_seed(seed, MIXES[mix], SimConfig())
            assert result.passed, (seed, mix, result.violation, result.detail)
            for key, value in result.stats.items():
                totals[key] = totals.get(key, 0) + value
    assert totals["crashes"] > 10
    assert totals["partitions"] > 10
    assert totals["conf_changes"] > 10
    assert totals["transfers"] > 3
    assert totals["snapshots_installed"] > 3
    assert totals["leaders"] > 30


def test_many_seeds_in_two_processes_match_one_process() -> None:
    specs = [SeedSpec(seed, "all", 3) for seed in range(14)]
    one = run_many(specs, jobs=1)
    two = run_many(specs, jobs=2)
    assert one.seeds == two.seeds == 14
    assert one.per_mix == two.per_mix
    assert one.passed, [(r.seed, r.violation) for r in one.failures]
    with pytest.raises(UsageError):
        run_many(specs, jobs=0)


def test_result_reports_linearizability_verdict() -> None:
    result = run_seed(5, MIXES["calm"], SimConfig())
    assert result.passed
    assert result.verdict is Verdict.OK
    assert result.operations > 20
    assert result.unknown_operations == 0


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "quorumlog", "sim", "raft", *args],
        capture_output=True, text=True, timeout=300,
    )


def test_cli_replays_one_seed_with_a_transcript() -> None:
    first = _cli("--seed", "4", "--mix", "figure8", "--trace")
    assert first.returncode == 0, first.stderr
    assert re.search(r"^t=\d+ \d+->\d+ APP ", first.stdout, re.M)
    assert "seed 4 mix=figure8 nodes=3: passed" in first.stdout
    second = _cli("--seed", "4", "--mix", "figure8", "--trace")
    digest = re.search(r"trace sha256 ([0-9a-f]{64})", first.stdout)
    assert digest is not None and digest.group(0) in second.stdout


def test_cli_runs_many_seeds_and_summarizes() -> None:
    seeds = len(MIXES)  # one seed of each mix
    out = _cli("--seeds", str(seeds), "--start", "20", "--jobs", "1")
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{seeds} seeds: all passed" in out.stdout
    for mix in MIXES:
        assert mix[:5] in out.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--seeds", "3", "--mix", "nope"], "unknown fault mix"),
        (["--mix", "calm"], "exactly one of"),
        (["--seeds", "3", "--trace"], "--trace needs --seed"),
    ],
)
def test_cli_rejects_bad_arguments(args: list[str], needle: str) -> None:
    out = _cli(*args)
    assert out.returncode == 1
    assert needle in out.stderr
