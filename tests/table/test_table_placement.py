"""Placement of partition replicas: distinct nodes, zones spread, balanced
load, bounded scatter width (the copyset rule), deterministic per seed."""

from __future__ import annotations

import itertools
import random

import pytest

from quorumlog.table._placement import (
    ClusterLoad,
    NodeCandidate,
    NotEnoughTableNodesError,
    place_replicas,
)


def place_table(nodes: list[NodeCandidate], partitions: int, *, seed: int = 1,
                scatter_width_max: int = 4) -> list[tuple[int, ...]]:
    load = ClusterLoad.of([])
    rng = random.Random(seed)
    groups = []
    for _ in range(partitions):
        members = place_replicas(nodes, 3, load, rng=rng, scatter_width_max=scatter_width_max)
        load.add(members)
        groups.append(members)
    return groups


def test_distinct_nodes_spread_over_zones_and_balanced() -> None:
    nodes = [NodeCandidate(i, zone=f"z{i % 3}") for i in range(1, 10)]
    groups = place_table(nodes, 30)
    zone = {n.node_id: n.zone for n in nodes}
    for members in groups:
        assert len(set(members)) == 3
        assert len({zone[m] for m in members}) == 3
    counts = ClusterLoad.of(groups).replicas
    assert max(counts.values()) - min(counts.values()) <= 1


def test_scatter_width_stays_bounded_unlike_random_placement() -> None:
    nodes = [NodeCandidate(i) for i in range(1, 13)]
    groups = place_table(nodes, 48, scatter_width_max=4)
    load = ClusterLoad.of(groups)
    assert max(load.scatter_width(n.node_id) for n in nodes) <= 4
    copysets = {frozenset(g) for g in groups}
    rng = random.Random(1)
    random_sets = {frozenset(rng.sample(range(1, 13), 3)) for _ in range(48)}
    assert len(copysets) < len(random_sets) / 2
    # Fewer copysets: most simultaneous 3-node failures lose no group's quorum.
    def losing(groups: set[frozenset[int]]) -> int:
        """3-node failures that take the quorum of some group."""
        return sum(1 for trio in itertools.combinations(range(1, 13), 3)
                   if any(len(set(trio) & g) >= 2 for g in groups))

    assert losing(copysets) < losing(random_sets)


def test_replacement_keeps_members_and_avoids_dead_nodes() -> None:
    nodes = [NodeCandidate(i, alive=i != 2) for i in range(1, 6)]
    load = ClusterLoad.of([(1, 2, 3)])
    members = place_replicas(nodes, 3, load, rng=random.Random(7), keep=(1, 3))
    assert members[:2] == (1, 3) and members[2] in (4, 5)


def test_not_enough_nodes_is_a_clear_error_and_same_seed_same_answer() -> None:
    nodes = [NodeCandidate(1), NodeCandidate(2), NodeCandidate(3, alive=False)]
    with pytest.raises(NotEnoughTableNodesError, match="needs 3 replicas"):
        place_replicas(nodes, 3, ClusterLoad.of([]), rng=random.Random(1))
    more = [NodeCandidate(i, zone=f"z{i % 2}") for i in range(1, 8)]
    assert place_table(more, 10, seed=5) == place_table(more, 10, seed=5)
