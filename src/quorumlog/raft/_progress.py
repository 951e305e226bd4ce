"""What a leader knows about each follower: match/next, flow state, inflights.

After etcd's tracker package. A follower's progress is in one of three
states:

* PROBE: the leader does not know where the follower's log matches; it sends
  one APP at a time (then pauses until an answer or a heartbeat response) and
  backs ``next`` off on rejections;
* REPLICATE: the logs match up to ``match``; the leader streams APPs
  optimistically (``next`` moves on send), bounded by :class:`Inflights`;
* SNAPSHOT: the follower needs a snapshot; nothing else is sent until it
  reports success or failure.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from enum import IntEnum

from quorumlog.errors import invariant
from quorumlog.raft._quorum import JointConfig, VoteResult
from quorumlog.raft._types import ConfState


class ProgressState(IntEnum):
    PROBE = 0
    REPLICATE = 1
    SNAPSHOT = 2


class Inflights:
    """APP messages sent but not acknowledged, each as (last index, bytes).

    Bounded by a message count and a byte total; ``full()`` pauses sending.
    """

    __slots__ = ("_bytes", "_queue", "max_bytes", "max_messages")

    def __init__(self, max_messages: int, max_bytes: int) -> None:
        invariant(max_messages >= 1 and max_bytes >= 1, "inflights bounds must be >= 1")
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._queue: deque[tuple[int, int]] = deque()
        self._bytes = 0

    def add(self, last_index: int, size_bytes: int) -> None:
        invariant(not self.full(), "inflights: add while full")
        invariant(
            not self._queue or self._queue[-1][0] < last_index,
            f"inflights: index {last_index} not after {self._queue[-1] if self._queue else 0}",
        )
        self._queue.append((last_index, size_bytes))
        self._bytes += size_bytes

    def free_le(self, index: int) -> None:
        """Forget every message whose last index is <= ``index`` (acknowledged)."""
        queue = self._queue
        while queue and queue[0][0] <= index:
            self._bytes -= queue.popleft()[1]

    def free_first_one(self) -> None:
        """Forget the oldest message: it may have been lost (see heartbeats)."""
        if self._queue:
            self._bytes -= self._queue.popleft()[1]

    def full(self) -> bool:
        return len(self._queue) >= self.max_messages or self._bytes >= self.max_bytes

    def count(self) -> int:
        return len(self._queue)

    def size_bytes(self) -> int:
        return self._bytes

    def reset(self) -> None:
        self._queue.clear()
        self._bytes = 0


class Progress:
    """Replication progress of one peer, kept by the leader."""

    __slots__ = (
        "inflights",
        "is_learner",
        "match",
        "msg_app_flow_paused",
        "next",
        "pending_snapshot",
        "recent_active",
        "snapshot_wait_ticks",
        "state",
    )

    def __init__(self, next_index: int, inflights: Inflights, *, is_learner: bool) -> None:
        self.match = 0
        self.next = next_index
        self.state = ProgressState.PROBE
        self.pending_snapshot = 0
        self.snapshot_wait_ticks = 0
        self.recent_active = False
        self.msg_app_flow_paused = False
        self.inflights = inflights
        self.is_learner = is_learner

    def _reset_state(self, state: ProgressState) -> None:
        self.msg_app_flow_paused = False
        self.pending_snapshot = 0
        self.snapshot_wait_ticks = 0
        self.state = state
        self.inflights.reset()

    def become_probe(self) -> None:
        if self.state == ProgressState.SNAPSHOT:
            pending = self.pending_snapshot
            self._reset_state(ProgressState.PROBE)
            self.next = max(self.match + 1, pending + 1)
        else:
            self._reset_state(ProgressState.PROBE)
            self.next = self.match + 1

    def become_replicate(self) -> None:
        self._reset_state(ProgressState.REPLICATE)
        self.next = self.match + 1

    def become_snapshot(self, snapshot_index: int) -> None:
        self._reset_state(ProgressState.SNAPSHOT)
        self.pending_snapshot = snapshot_index

    def maybe_update(self, index: int) -> bool:
        """An ack up to ``index``: True if ``match`` moved."""
        updated = False
        if self.match < index:
            self.match = index
            updated = True
            self.msg_app_flow_paused = False
        self.next = max(self.next, index + 1)
        return updated

    def sent_entries(self, count: int, size_bytes: int) -> None:
        """Account an APP carrying ``count`` entries starting at ``next``."""
        if self.state == ProgressState.REPLICATE:
            if count > 0:
                last = self.next + count - 1
                self.next = last + 1
                self.inflights.add(last, size_bytes)
        elif self.state == ProgressState.PROBE:
            self.msg_app_flow_paused = True
        else:
            invariant(False, f"sending entries in state {self.state.name}")

    def maybe_decr_to(self, rejected: int, match_hint: int) -> bool:
        """A rejection of the APP at ``rejected``; False if it is stale."""
        if self.state == ProgressState.REPLICATE:
            if rejected <= self.match:
                return False
            self.next = self.match + 1
            return True
        if self.next - 1 != rejected:
            return False
        self.next = max(min(rejected, match_hint + 1), self.match + 1)
        self.msg_app_flow_paused = False
        return True

    def is_paused(self) -> bool:
        if self.state == ProgressState.PROBE:
            return self.msg_app_flow_paused
        if self.state == ProgressState.REPLICATE:
            return self.inflights.full()
        return True

    def describe(self) -> dict[str, object]:
        return {
            "state": self.state.name,
            "match": self.match,
            "next": self.next,
            "learner": self.is_learner,
            "recent_active": self.recent_active,
            "inflight_messages": self.inflights.count(),
            "pending_snapshot": self.pending_snapshot,
        }


class TrackerConfig:
    """A membership configuration as the core uses it (mirror of ConfState)."""

    __slots__ = ("auto_leave", "learners", "learners_next", "voters")

    def __init__(
        self,
        voters: JointConfig,
        learners: frozenset[int] = frozenset(),
        learners_next: frozenset[int] = frozenset(),
        *,
        auto_leave: bool = False,
    ) -> None:
        self.voters = voters
        self.learners = learners
        self.learners_next = learners_next
        self.auto_leave = auto_leave

    @classmethod
    def from_conf_state(cls, cs: ConfState) -> TrackerConfig:
        return cls(
            JointConfig(cs.voters, cs.voters_outgoing),
            cs.learners,
            cs.learners_next,
            auto_leave=cs.auto_leave,
        )

    def to_conf_state(self) -> ConfState:
        return ConfState(
            voters=self.voters.incoming,
            voters_outgoing=self.voters.outgoing,
            learners=self.learners,
            learners_next=self.learners_next,
            auto_leave=self.auto_leave,
        )

    def ids(self) -> frozenset[int]:
        return self.voters.ids() | self.learners | self.learners_next


class ProgressTracker:
    """The configuration, one Progress per member, and the votes of an election."""

    __slots__ = ("config", "progress", "votes")

    def __init__(self, config: TrackerConfig, progress: dict[int, Progress]) -> None:
        self.config = config
        self.progress = progress
        self.votes: dict[int, bool] = {}

    def voter_ids(self) -> frozenset[int]:
        return self.config.voters.ids()

    def is_singleton(self) -> bool:
        voters = self.config.voters
        return len(voters.incoming) == 1 and not voters.outgoing

    def committed(self) -> int:
        progress = self.progress
        return self.config.voters.committed_index(lambda node_id: progress[node_id].match)

    def reset_votes(self) -> None:
        self.votes = {}

    def record_vote(self, node_id: int, granted: bool) -> None:
        self.votes.setdefault(node_id, granted)

    def tally_votes(self) -> tuple[int, int, VoteResult]:
        granted = rejected = 0
        for node_id in self.voter_ids():
            vote = self.votes.get(node_id)
            if vote is None:
                continue
            if vote:
                granted += 1
            else:
                rejected += 1
        return granted, rejected, self.config.voters.vote_result(self.votes)

    def quorum_active(self) -> bool:
        active = {
            node_id: pr.recent_active
            for node_id, pr in self.progress.items()
            if not pr.is_learner
        }
        return self.config.voters.vote_result(active) == VoteResult.WON

    def __iter__(self) -> Iterator[tuple[int, Progress]]:
        return iter(sorted(self.progress.items()))
