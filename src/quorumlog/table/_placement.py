"""Where a table's Raft groups go: zones first, scatter width bounded.

A table's Raft group is one partition (Pegasus's replica group) or, for a
table created with copysets, several partitions in one RocksDB and one log
(table/_layout.py); either way the group is the unit that moves, snapshots
and ships. What we borrow from Curve and the Copysets paper
(Cidon et al., USENIX ATC 2013) that gave copysets their name is the
placement rule: the node sets that hold a group (a *copyset*) are chosen so
that each node shares groups with a bounded number of other nodes, its
*scatter width*. Random placement makes every node share a group with every
other, so any R simultaneous node failures lose some group's quorum; with a
bounded scatter width few node sets hold data, and most R-node failures lose
nothing.

:func:`place_replicas` is greedy and pure (deterministic for a seed), called
by the scheduler in meta for every new partition and for every replacement:

1. candidates are the live nodes not already holding the group;
2. a node's zone must differ from the zones already chosen while there are
   enough zones (as bookies' racks);
3. among those, prefer a node already in the scatter set of the nodes chosen
   (no new pair), then one whose scatter set is below ``scatter_width_max``,
   then the fewest replicas, then the seeded shuffle order.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from quorumlog.errors import TransientError, UsageError

SCATTER_WIDTH_DEFAULT = 8  # other nodes one node shares groups with, at most (soft)


class NotEnoughTableNodesError(TransientError):
    """Fewer live table nodes than a partition needs replicas."""


@dataclass(frozen=True, slots=True)
class NodeCandidate:
    node_id: int
    zone: str = "default"
    alive: bool = True


@dataclass(slots=True)
class ClusterLoad:
    """Replica counts and scatter sets, from the groups that exist."""

    replicas: dict[int, int]
    scatter: dict[int, set[int]]

    @classmethod
    def of(cls, groups: Iterable[Sequence[int]]) -> ClusterLoad:
        replicas: dict[int, int] = defaultdict(int)
        scatter: dict[int, set[int]] = defaultdict(set)
        for members in groups:
            for node in members:
                replicas[node] += 1
                scatter[node].update(m for m in members if m != node)
        return cls(dict(replicas), dict(scatter))

    def add(self, members: Sequence[int]) -> None:
        for node in members:
            self.replicas[node] = self.replicas.get(node, 0) + 1
            self.scatter.setdefault(node, set()).update(m for m in members if m != node)

    def scatter_width(self, node: int) -> int:
        return len(self.scatter.get(node, ()))


def place_replicas(candidates: Sequence[NodeCandidate], count: int, load: ClusterLoad, *,
                   rng: random.Random, keep: Sequence[int] = (),
                   scatter_width_max: int = SCATTER_WIDTH_DEFAULT) -> tuple[int, ...]:
    """``count`` node ids for a group: ``keep`` (members that stay) plus new ones."""
    if count < 1:
        raise UsageError(f"a group needs at least 1 replica, asked for {count}")
    by_id: Mapping[int, NodeCandidate] = {c.node_id: c for c in candidates}
    chosen = list(keep)
    pool = [c for c in candidates if c.alive and c.node_id not in chosen]
    if len(chosen) + len(pool) < count:
        raise NotEnoughTableNodesError(
            f"a partition needs {count} replicas on distinct live table nodes; "
            f"{len(chosen) + len(pool)} available. Start more table nodes or create the "
            "table with fewer replicas")
    pool.sort(key=lambda c: c.node_id)
    rng.shuffle(pool)
    order = {c.node_id: i for i, c in enumerate(pool)}
    zones_total = len({c.zone for c in candidates if c.alive})
    while len(chosen) < count:
        zones_used = {by_id[n].zone for n in chosen if n in by_id}
        spread = len(zones_used) < zones_total
        best: NodeCandidate | None = None
        best_key: tuple[int, ...] | None = None
        for c in pool:
            if c.node_id in chosen:
                continue
            new_pairs = sum(1 for n in chosen if n not in load.scatter.get(c.node_id, ()))
            over = int(load.scatter_width(c.node_id) + new_pairs > scatter_width_max)
            key = (int(spread and c.zone in zones_used), over, new_pairs,
                   load.replicas.get(c.node_id, 0), order[c.node_id])
            if best_key is None or key < best_key:
                best, best_key = c, key
        assert best is not None  # the pool holds enough nodes (checked above)
        chosen.append(best.node_id)
    return tuple(chosen)
