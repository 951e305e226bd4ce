"""A small in-test network of Raft cores with a transcript.

Each node has a MemoryStorage that plays its disk. ``deliver()`` runs every
node's Ready through the production ready pass (``quorumlog.raft.ReadyPass``
with ``MemoryReadyStorage``, the order ``RaftHost`` and the simulator use) and
passes messages between nodes until the network is quiet, writing one line
per message (``1->2 VOTE term=2 log=1/5``) to the transcript. Links can be
cut (``cut``, ``isolate``) and healed; messages on a cut link are dropped and
written with an ``x`` in front.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from quorumlog.raft import (
    ConfChange,
    ConfState,
    Entry,
    EntryType,
    MemoryReadyStorage,
    MemoryStorage,
    Message,
    MessageType,
    RaftConfig,
    RaftNode,
    Ready,
    ReadyPass,
    Role,
    format_message,
)

MAX_DELIVERY_ROUNDS = 10_000


@dataclass(frozen=True, slots=True)
class _Member:
    """One node as the ready pass sees it (one group per node)."""

    node_id: int
    node: RaftNode
    storage: MemoryReadyStorage
    group_id: int = 0


@dataclass(frozen=True, slots=True)
class _QueueTransport:
    queue: deque[Message]

    def send(self, messages: Sequence[tuple[int, Message]]) -> None:
        self.queue.extend(message for _, message in messages)


class Network:
    def __init__(
        self,
        ids: Iterable[int],
        *,
        seed: int = 0,
        voters: Iterable[int] | None = None,
        learners: Iterable[int] = (),
        **config: Any,
    ) -> None:
        ids = sorted(ids)
        self.seed = seed
        self.config = config
        self.nodes: dict[int, RaftNode] = {}
        self.storages: dict[int, MemoryStorage] = {}
        self.applied: dict[int, list[bytes]] = {}
        self.epochs: dict[int, list[tuple[int, int]]] = {}
        self.transcript: list[str] = []
        self.cut_links: set[tuple[int, int]] = set()
        self.down: set[int] = set()
        self.report_snapshots = True
        self.queue: deque[Message] = deque()
        self.ready_pass: ReadyPass[_Member] = ReadyPass(_QueueTransport(self.queue), self._apply)
        cs = ConfState(
            voters=frozenset(ids if voters is None else voters), learners=frozenset(learners)
        )
        for node_id in ids:
            self.storages[node_id] = MemoryStorage(cs)
            self.start(node_id)

    # -- membership of the test network ---------------------------------------------

    def make_config(self, node_id: int) -> RaftConfig:
        return RaftConfig(node_id=node_id, **self.config)

    def start(self, node_id: int, *, applied: int = 0) -> RaftNode:
        """(Re)start ``node_id`` on its storage; a new id gets empty storage."""
        storage = self.storages.setdefault(node_id, MemoryStorage())
        rng = random.Random(self.seed * 1000 + node_id * 7 + len(self.transcript))
        node = RaftNode(self.make_config(node_id), storage, rng, applied=applied)
        self.nodes[node_id] = node
        self.applied.setdefault(node_id, [])
        self.epochs.setdefault(node_id, [])
        self.down.discard(node_id)
        return node

    def crash(self, node_id: int) -> None:
        """Stop ``node_id``: what it did not persist is gone; messages to it drop."""
        self.down.add(node_id)
        self.note(f"crash {node_id}")

    def restart(self, node_id: int, *, applied: int = 0) -> RaftNode:
        self.note(f"restart {node_id}")
        self.applied[node_id] = []
        return self.start(node_id, applied=applied)

    # -- links ------------------------------------------------------------------------

    def cut(self, a: int, b: int) -> None:
        self.cut_links.add((a, b))
        self.cut_links.add((b, a))

    def isolate(self, node_id: int) -> None:
        self.note(f"isolate {node_id}")
        for other in self.all_ids():
            if other != node_id:
                self.cut(node_id, other)

    def heal(self) -> None:
        self.note("heal")
        self.cut_links.clear()

    def all_ids(self) -> list[int]:
        return sorted(set(self.nodes) | set(self.storages))

    # -- running --------------------------------------------------------------------

    def note(self, text: str) -> None:
        self.transcript.append(f"# {text}")

    def handle_ready(self, node_id: int) -> None:
        node = self.nodes[node_id]
        if node_id in self.down or not node.has_ready():
            return
        storage = MemoryReadyStorage(self.storages[node_id])
        self.ready_pass.run([_Member(node_id, node, storage)])

    def _apply(self, member: _Member, rd: Ready) -> None:
        node_id = member.node_id
        if rd.snapshot is not None:
            self.applied[node_id] = [rd.snapshot.data]
        for entry in rd.committed_entries:
            if entry.type == EntryType.NORMAL and entry.data:
                self.applied[node_id].append(entry.data)
        if rd.committed_entries or rd.snapshot is not None:
            last = rd.committed_entries[-1].index if rd.committed_entries else 0
            index = max(last, rd.snapshot.meta.index if rd.snapshot else 0)
            self.epochs[node_id].append((index, rd.epoch))
        for rs in rd.read_states:
            self.transcript.append(
                f"{node_id}: read_state index={rs.index} ctx={rs.context.decode()}"
            )

    def deliver_one(self, m: Message) -> None:
        line = format_message(m)
        if (m.from_, m.to) in self.cut_links or m.to in self.down or m.to not in self.nodes:
            self.transcript.append(f"x {line}")
            return
        self.transcript.append(line)
        self.nodes[m.to].step(m)
        if m.type == MessageType.SNAP and self.report_snapshots:
            self.nodes[m.from_].report_snapshot(m.to, True)

    def deliver(self) -> None:
        """Run Readies and deliver messages until nothing moves."""
        for _ in range(MAX_DELIVERY_ROUNDS):
            for node_id in sorted(self.nodes):
                self.handle_ready(node_id)
            if not self.queue:
                return
            while self.queue:
                self.deliver_one(self.queue.popleft())
        raise AssertionError("network did not settle")

    def tick(self, node_id: int, ticks: int = 1) -> None:
        for _ in range(ticks):
            self.nodes[node_id].tick()

    def tick_all(self, ticks: int = 1, *, deliver: bool = True) -> None:
        for _ in range(ticks):
            for node_id in sorted(self.nodes):
                if node_id not in self.down:
                    self.nodes[node_id].tick()
            if deliver:
                self.deliver()

    def tick_until_leader(self, *ids: int, max_ticks: int = 200) -> int:
        """Tick ``ids`` (default: all up nodes) until one of them leads."""
        ids = ids or tuple(sorted(self.nodes))
        for _ in range(max_ticks):
            for node_id in ids:
                if node_id not in self.down:
                    self.nodes[node_id].tick()
            self.deliver()
            leaders = [i for i in self.leaders() if i in ids]
            if leaders:
                return leaders[0]
        raise AssertionError("no leader elected")

    def elect(self, node_id: int) -> None:
        self.note(f"{node_id} campaigns")
        self.nodes[node_id].campaign()
        self.deliver()
        assert self.nodes[node_id].role == Role.LEADER, self.state(node_id)

    def propose(self, node_id: int, *payloads: bytes) -> None:
        self.note(f"propose {[p.decode() for p in payloads]} at {node_id}")
        self.nodes[node_id].propose_batch(list(payloads))
        self.deliver()

    def change(self, node_id: int, change: ConfChange) -> None:
        parts = [f"{c.type.name} {c.node_id}" for c in change.changes] or ["leave joint"]
        self.note(f"conf change {', '.join(parts)} ({change.transition}) at {node_id}")
        self.nodes[node_id].propose_conf_change(change)
        self.deliver()

    # -- inspection -------------------------------------------------------------------

    def leaders(self) -> list[int]:
        return [
            i for i, n in sorted(self.nodes.items())
            if n.role == Role.LEADER and i not in self.down
        ]

    def log_of(self, node_id: int) -> list[Entry]:
        storage = self.storages[node_id]
        first, last = storage.first_index(), storage.last_index()
        return storage.entries(first, last + 1, 1 << 62) if last >= first else []

    def state(self, node_id: int) -> str:
        n = self.nodes[node_id]
        cs = n.conf_state
        conf = f"voters={sorted(cs.voters)}"
        if cs.voters_outgoing:
            conf += f"&&{sorted(cs.voters_outgoing)}"
        if cs.learners:
            conf += f" learners={sorted(cs.learners)}"
        return (
            f"{node_id}: {n.role.name} term={n.term} lead={n.leader_id} commit={n.commit_index} "
            f"applied={n.applied_index} last={n.last_index} epoch={n.epoch} {conf}"
        )

    def show(self, *ids: int) -> None:
        for node_id in ids or tuple(sorted(self.nodes)):
            self.transcript.append(self.state(node_id))

    def text(self) -> str:
        return "\n".join(self.transcript) + "\n"
