"""The 5-node half of the default Raft simulator budget (test_raft_seeds.py has
the 3-node half and the budget's count): a module of its own so that
``pytest -n 2 --dist loadscope`` can run the halves on both workers."""

from __future__ import annotations

import pytest

from .test_raft_seeds import chunks_of, run_chunk

pytestmark = pytest.mark.sim

CHUNKS = chunks_of(5)


@pytest.mark.parametrize(
    ("mix", "nodes", "start", "count"),
    CHUNKS,
    ids=[f"{mix}-{nodes}n-{start}" for mix, nodes, start, _ in CHUNKS],
)
def test_raft_seeds_5n(mix: str, nodes: int, start: int, count: int) -> None:
    run_chunk(mix, nodes, start, count)
