"""Fixtures of the JVM reader's tests: one local cluster (3 node processes)
and one SparkSession with the reader's jar, per module. The modules skip when
pyspark, Java or the jar (``jvm/build.sh``) is missing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from quorumlog import node as cluster

from ..sessions import running_cluster, spark_session


@pytest.fixture(scope="module")
def cluster_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from running_cluster(tmp_path_factory, "spark-jvm")


@pytest.fixture(scope="module")
def meta(cluster_dir: Path) -> list[str]:
    return cluster.meta_addresses(cluster_dir)


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    yield from spark_session("local[2]", "quorumlog-jvm-tests")
