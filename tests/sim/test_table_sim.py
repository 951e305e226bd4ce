"""The table simulator: the production scheduler, executor rule and partition Raft
groups with crashes, a node dead for good, partitions and scheduler failovers.

The default run takes a small budget of seeds (about 0.4 s each); ``-m slow``
runs a large range. The seeds in FOUND_BUG_SEEDS failed before the
scheduler, table-service and Raft fixes they found (docs/sim.md, "Table simulator")."""

from __future__ import annotations

import pytest

from quorumlog.sim import TableSimConfig, run_table_seed

DEFAULT_SEEDS = range(0, 16)
FOUND_BUG_SEEDS = (12, 17, 31, 48, 64, 1227, 88892615441718, 88892615442410, 5_000_546)
LARGE_RANGE_START = 5_000_000
LARGE_RANGE_SEEDS = 600


def _explain(seed: int) -> str:
    result = run_table_seed(seed)
    return (f"seed {seed}: {result.violation}: {result.detail}\n"
            f"replay: quorumlog sim table --seed {seed} --trace")


@pytest.mark.sim
@pytest.mark.parametrize("seed", list(DEFAULT_SEEDS) + [s for s in FOUND_BUG_SEEDS
                                                        if s not in DEFAULT_SEEDS])
def test_table_seed_passes(seed: int) -> None:
    result = run_table_seed(seed)
    assert result.passed, _explain(seed)
    assert result.stats["writes_acked"] > 0


@pytest.mark.sim
def test_same_seed_same_run_with_or_without_trace() -> None:
    first = run_table_seed(7)
    again = run_table_seed(7, keep_trace=True)
    assert first.fingerprint == again.fingerprint
    assert again.trace and not first.trace
    assert run_table_seed(7, keep_trace=True).trace_hash == again.trace_hash


@pytest.mark.sim
def test_without_faults_only_the_dead_node_is_replaced() -> None:
    calm = TableSimConfig(nodes=5, crash_probability_per_tick=0.0,
                          partition_probability_per_tick=0.0,
                          failover_probability_per_tick=0.0, failover_at_heal_probability=0.0)
    result = run_table_seed(3, calm)
    assert result.passed, result.detail
    assert result.stats["crashes"] == 1 and result.stats["records_written"] > 0


@pytest.mark.slow
@pytest.mark.sim
@pytest.mark.parametrize("chunk", range(6))
def test_table_seeds_large_range(chunk: int) -> None:
    per_chunk = LARGE_RANGE_SEEDS // 6
    first = LARGE_RANGE_START + chunk * per_chunk
    failures = [s for s in range(first, first + per_chunk) if not run_table_seed(s).passed]
    assert not failures, "\n".join(_explain(s) for s in failures[:5])
