"""The order the default run hands modules to its two workers.

``pytest -n 2 --dist loadscope --no-loadscope-reorder`` keeps a module on one
worker (a module-scoped cluster starts once) and hands modules out in
collection order. Left to itself, xdist orders them by their number of tests,
so a module of nine slow Spark tests started near the end and one worker ran
it alone for minutes while the other was idle. Here the modules measured
slowest go first (longest first), every other module keeps its place after
them: both workers then finish within about a minute of each other.
"""

from __future__ import annotations

import pytest

SLOWEST_FIRST = (
    # seconds of one worker in a full run on the CI's 2 cores (--durations=0), largest first
    "tests/sim/test_raft_seeds.py",  # 310
    "tests/spark/test_spark_source.py",  # 178
    "tests/netns/test_netns_cluster.py",  # 91
    "tests/ledger/test_ledger_sim.py",  # 68
    "tests/sim/test_table_sim.py",  # 58
    "tests/netns/test_netns_logs.py",  # 55
    "tests/stream/test_stream_trimmer.py",  # 54
    "tests/table/test_table_rescheduling.py",  # 50
    "tests/stream/test_stream_compaction.py",  # 49
    "tests/table/test_table_dup_clusters.py",  # 57 (2026-11-29)
    "tests/table/test_table_cluster.py",  # 54 (2026-11-29)
    "tests/cluster/test_meta_cluster.py",  # 48
    "tests/recovery/test_recovery_cluster.py",  # 46 (2026-11-29)
    "tests/meta/test_reads_cluster.py",  # 45
    "tests/netns/test_netns_jepsen.py",  # 44
    "tests/stream/test_stream_cluster.py",  # 43
    "tests/stream/test_stream_offload.py",  # 42
    "tests/cluster/test_stale_member.py",  # 45 (2026-11-29)
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(SLOWEST_FIRST)}
    last = len(SLOWEST_FIRST)
    # sort is stable: tests keep their order inside a module, other modules theirs
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], last))
