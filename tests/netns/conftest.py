"""The ``netns_cluster`` fixture: three "hosts" in network namespaces (harness.py);
``netns_cluster4``: four (a 2|2 split leaves no side a meta majority);
``netns_table_cluster``: three that are table nodes too;
``netns_table_cluster4``: four table hosts whose scheduler replaces a silent
node's replicas within seconds; ``netns_dup_clusters``: two one-node
clusters (cluster ids 1 and 2) that know each other for duplication;
``netns_dup_clusters3``: two three-node clusters (nodes 1-3 and 4-6)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import NetnsCluster, availability


def _cluster(directory: Path, nodes: int, roles: tuple[str, ...] = ("meta", "bookie"),
             clusters: list[list[int]] | None = None,
             extra_toml: str = "") -> Iterator[NetnsCluster]:
    reason = availability()
    if reason is not None:
        pytest.skip(reason)
    cluster = NetnsCluster(directory, nodes=nodes, roles=roles, clusters=clusters,
                           extra_toml=extra_toml)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()  # also when start() or the test failed


@pytest.fixture
def netns_cluster(tmp_path: Path) -> Iterator[NetnsCluster]:
    yield from _cluster(tmp_path / "cluster", 3)


@pytest.fixture
def netns_cluster4(tmp_path: Path) -> Iterator[NetnsCluster]:
    yield from _cluster(tmp_path / "cluster", 4)


@pytest.fixture
def netns_table_cluster(tmp_path: Path) -> Iterator[NetnsCluster]:
    """Three hosts, each also a table node."""
    yield from _cluster(tmp_path / "cluster", 3, ("meta", "bookie", "table"))


@pytest.fixture
def netns_dup_clusters(tmp_path: Path) -> Iterator[NetnsCluster]:
    """Hosts 1 and 2, each a cluster of its own (meta, bookie, table)."""
    yield from _cluster(tmp_path / "cluster", 2, ("meta", "bookie", "table"), [[1], [2]])


@pytest.fixture
def netns_dup_clusters3(tmp_path: Path) -> Iterator[NetnsCluster]:
    """Hosts 1-3 form cluster 1, hosts 4-6 cluster 2 (meta, bookie, table each)."""
    yield from _cluster(tmp_path / "cluster", 6, ("meta", "bookie", "table"),
                        [[1, 2, 3], [4, 5, 6]])


FAST_SCHEDULER_TOML = """
[table]
heartbeat_interval_ms = 200
registration_ttl_ms = 1500
node_dead_after_ms = 2000
replace_dead_after_ms = 4000
"""


@pytest.fixture
def netns_table_cluster4(tmp_path: Path) -> Iterator[NetnsCluster]:
    """Four table hosts; a node silent 4 s has its replicas replaced."""
    yield from _cluster(tmp_path / "cluster", 4, ("meta", "bookie", "table"),
                        extra_toml=FAST_SCHEDULER_TOML)
