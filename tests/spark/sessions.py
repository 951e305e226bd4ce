"""What the Spark test modules share: a module's 3-node local cluster and its
local SparkSession (fixture bodies: ``yield from``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from quorumlog import node as cluster


def running_cluster(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[Path]:
    """A 3-node cluster in a fresh directory while the fixture lives; its directory."""
    directory = tmp_path_factory.mktemp(name) / "cluster"
    with cluster.running(directory, 3):
        yield directory


def spark_session(master: str, app: str) -> Iterator[Any]:
    """``quorumlog.spark.local_session(master, app)`` while the fixture lives."""
    from quorumlog.spark import local_session

    session = local_session(master, app)
    try:
        yield session
    finally:
        session.stop()
