"""The ``netns_cluster`` fixture: three "hosts" in network namespaces (harness.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import NetnsCluster, availability


@pytest.fixture
def netns_cluster(tmp_path: Path) -> Iterator[NetnsCluster]:
    reason = availability()
    if reason is not None:
        pytest.skip(reason)
    cluster = NetnsCluster(tmp_path / "cluster", nodes=3)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()  # also when start() or the test failed
