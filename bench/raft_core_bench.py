"""Raft core throughput: committed entries/s of 3 in-memory cores, pure protocol cost.

Three RaftNodes on MemoryStorage are wired by a zero-latency in-process
transport (messages are stepped directly, no encoding). The leader proposes
100-byte entries in batches of 1, 64 and 1024 per Ready; each round runs every
node's Ready (persist to MemoryStorage, send, apply, advance) until the network
is quiet, so every batch is committed and applied on all three nodes before
the next one. The rate counts entries committed (and applied) by the group.

Baseline, measured in the same run: building the same Entry objects and
appending them to one MemoryStorage (what a single node's log costs without
any protocol). The ratio is quorumlog/baseline; the absolute target is
>= 300k entries/s at batch 1024.

    ./scripts/uv run --frozen python bench/raft_core_bench.py [--quick]
"""

from __future__ import annotations

import functools
import random
import sys
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script

from bench.harness import Harness, Sample, timed
from quorumlog.raft import (
    ConfState,
    Entry,
    EntryType,
    MemoryStorage,
    Message,
    RaftConfig,
    RaftNode,
    Role,
)

ENTRY_BYTES = 100
BATCHES = (1, 64, 1024)
TARGET_ENTRIES_PER_S_AT_1024 = 300_000


class Cluster:
    """Three cores and their storages, wired without latency."""

    def __init__(self) -> None:
        ids = (1, 2, 3)
        conf = ConfState(voters=frozenset(ids))
        self.storages = {i: MemoryStorage(conf) for i in ids}
        self.nodes = {
            i: RaftNode(RaftConfig(node_id=i), self.storages[i], random.Random(i)) for i in ids
        }
        self.queue: deque[Message] = deque()
        self.applied = 0
        self.nodes[1].campaign()
        self.pump()
        assert self.nodes[1].role == Role.LEADER

    def pump(self) -> None:
        nodes, storages, queue = self.nodes, self.storages, self.queue
        while True:
            for node_id, node in nodes.items():
                if not node.has_ready():
                    continue
                rd = node.ready()
                storage = storages[node_id]
                if rd.entries:
                    storage.append(rd.entries)
                if rd.hard_state is not None:
                    storage.set_hard_state(rd.hard_state)
                queue.extend(rd.messages)
                if node_id == 1:
                    self.applied += len(rd.committed_entries)
                node.advance(rd)
            if not queue:
                return
            while queue:
                m = queue.popleft()
                nodes[m.to].step(m)


def run_cluster(total: int, batch: int) -> Sample:
    cluster = Cluster()
    payloads = [bytes([i % 251]) * ENTRY_BYTES for i in range(batch)]
    leader = cluster.nodes[1]
    rounds = total // batch

    def work() -> float:
        start = cluster.applied
        for _ in range(rounds):
            leader.propose_batch(payloads)
            cluster.pump()
        return float(cluster.applied - start)

    return timed(work)


def run_baseline(total: int, batch: int) -> Sample:
    storage = MemoryStorage(ConfState(voters=frozenset({1})))
    payloads = [bytes([i % 251]) * ENTRY_BYTES for i in range(batch)]
    rounds = total // batch
    normal = EntryType.NORMAL

    def work() -> float:
        index = storage.last_index() + 1
        for _ in range(rounds):
            storage.append([Entry(2, index + i, normal, p) for i, p in enumerate(payloads)])
            index += batch
        return float(rounds * batch)

    return timed(work)


def main(argv: list[str]) -> int:
    harness = Harness("raft_core", argv)
    for batch in BATCHES:
        total = (2_000 if batch == 1 else 20_000) if harness.quick else (
            20_000 if batch == 1 else 200_000
        )
        note = (
            f"target >= {TARGET_ENTRIES_PER_S_AT_1024:,} entries/s" if batch == 1024 else ""
        )
        harness.case(
            f"3 cores, 100 B entries, batch {batch}",
            workload=functools.partial(run_cluster, total, batch),
            baseline=functools.partial(run_baseline, total, batch),
            unit="entries/s",
            note=note,
        )
    return harness.finish()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
