"""A real one-node cluster (meta + bookie in one ``quorumlog node`` process)
shared by the adversarial tests of a module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from quorumlog import node as cluster


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cluster.NodeInfo]:
    directory = tmp_path_factory.mktemp("adversarial") / "cluster"
    infos = cluster.up(directory, 1)
    try:
        yield infos[0]
    finally:
        cluster.down(directory)


def node_dir(info: cluster.NodeInfo) -> Path:
    return Path(info.config).parent
