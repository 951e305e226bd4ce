"""The Raft core: one member of one group, sans-IO (after etcd's raft.go).

Inputs: ``tick()``, ``step(message)``, ``propose*()``, ``read_index()``,
``transfer_leader()``, ``report_*()``. Output: :class:`Ready`, confirmed with
``advance()``. The core never touches a disk, a socket or a clock; randomness
comes from the ``random.Random`` it is given.

Roles swap two functions: ``self._step`` (role-specific message handling) and
``self._tick`` (election timer for followers and candidates, heartbeat timer
for the leader). Transitions are checked: a follower cannot become leader
without an election, a leader cannot become a candidate.

Membership changes take effect when they are *applied* (``advance`` after
their entry was handed out in ``Ready.committed_entries``), as in etcd; one
change may be in flight at a time. The group **epoch** (Curve) counts, over
the applied log, every CONF_CHANGE entry and every first entry of a term (a
new leader's empty entry); it is a pure function of the applied log prefix, so
all members agree on it at the same applied index, and snapshots carry it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from enum import IntEnum
from typing import Any

from quorumlog.errors import InvariantViolation, ProtocolError, UsageError, invariant
from quorumlog.raft._confchange import apply_conf_change
from quorumlog.raft._config import RaftConfig
from quorumlog.raft._errors import (
    CompactedError,
    ConfChangePendingError,
    ProposalDroppedError,
    SnapshotTemporarilyUnavailableError,
)
from quorumlog.raft._log import RaftLog
from quorumlog.raft._progress import (
    Inflights,
    Progress,
    ProgressState,
    ProgressTracker,
    TrackerConfig,
)
from quorumlog.raft._quorum import VoteResult
from quorumlog.raft._readonly import ReadOnly
from quorumlog.raft._size import entries_size_bytes, payload_size_bytes
from quorumlog.raft._storage import RaftStorage
from quorumlog.raft._types import (
    LOCAL_MESSAGE_TYPES,
    NO_NODE,
    ConfChange,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Message,
    MessageType,
    ReadState,
    Ready,
    Role,
    Snapshot,
    SoftState,
)

CAMPAIGN_TRANSFER_CONTEXT = b"quorumlog/campaign-transfer"
"""Context of VOTE messages of a leader transfer: voters skip their lease."""

QUIESCE_CONTEXT = b"quorumlog/quiesce"
"""Context of a leader's last HEARTBEAT before it quiesces (``quiesce_idle``)."""

_NORMAL = EntryType.NORMAL
_CONF_CHANGE = EntryType.CONF_CHANGE

_TERMLESS_TYPES = frozenset({MessageType.PROP, MessageType.READ_INDEX})
# Answers a leader only gets to messages it sent: the sender must be known.
# (Requests such as READ_INDEX or TRANSFER_LEADER from unknown nodes are only
# dropped: a removed member may still forward them in good faith.)
_LEADER_BOUND_TYPES = frozenset({MessageType.APP_RESP, MessageType.HEARTBEAT_RESP})
_VOTE_RESPONSE_TYPES = frozenset({MessageType.VOTE_RESP, MessageType.PRE_VOTE_RESP})


class _Campaign(IntEnum):
    PRE_ELECTION = 0
    ELECTION = 1
    TRANSFER = 2


def fold_epoch(epoch: int, term: int, entries: Sequence[Entry]) -> tuple[int, int]:
    """Epoch and last term after applying ``entries`` on top of (epoch, term).

    +1 for the first entry of a new term (the new leader's empty entry: a
    leader appends it before anything else, so the first entry of a term in
    any log is it) and +1 for every CONF_CHANGE entry.
    """
    if not entries:
        return epoch, term
    if entries[0].term == term and entries[-1].term == term:
        # Terms never decrease along the log: no new term in this batch.
        return epoch + [e.type for e in entries].count(_CONF_CHANGE), term
    for entry in entries:
        if entry.term != term:
            epoch += 1
            term = entry.term
        if entry.type == _CONF_CHANGE:
            epoch += 1
    return epoch, term


class RaftNode:
    """One Raft member. Not thread-safe: one driver owns it."""

    __slots__ = (
        "_applied_term",
        "_config",
        "_election_elapsed",
        "_epoch",
        "_heartbeat_elapsed",
        "_id",
        "_is_learner",
        "_known_ids",
        "_lead",
        "_lead_transferee",
        "_leader_ticks",
        "_lease_acks",
        "_log",
        "_msgs",
        "_pending_conf_index",
        "_pending_read_index",
        "_pending_ready",
        "_prev_hard_state",
        "_prev_soft_state",
        "_quiesced",
        "_randomized_election_timeout",
        "_read_only",
        "_read_states",
        "_rng",
        "_role",
        "_step",
        "_term",
        "_tick",
        "_tracker",
        "_uncommitted_bytes",
        "_vote",
    )

    def __init__(
        self,
        config: RaftConfig,
        storage: RaftStorage,
        rng: random.Random,
        *,
        applied: int = 0,
    ) -> None:
        config.validate()
        self._config = config
        self._id = config.node_id
        self._rng = rng
        self._log = RaftLog(storage)
        self._term = 0
        self._vote = NO_NODE
        self._lead = NO_NODE
        self._role = Role.FOLLOWER
        self._msgs: list[Message] = []
        self._read_states: list[ReadState] = []
        self._tracker = ProgressTracker(TrackerConfig.from_conf_state(ConfState(frozenset())), {})
        self._is_learner = False
        # Every id of every configuration applied since start: bounded by the
        # group's membership history.
        self._known_ids: set[int] = set()
        self._lead_transferee = NO_NODE
        self._pending_conf_index = 0
        self._uncommitted_bytes = 0
        self._read_only = ReadOnly(config.max_pending_read_index_requests)
        self._pending_read_index: list[tuple[int, bytes]] = []
        # Leader lease (read_only_mode="lease_based"): ticks since this node
        # became leader, and per follower the latest such tick stamped on a
        # heartbeat it answered (1-based; the follower heard us no earlier).
        self._leader_ticks = 0
        self._lease_acks: dict[int, int] = {}
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._randomized_election_timeout = config.election_timeout_ticks
        self._pending_ready: Ready | None = None
        self._quiesced = False
        self._step: Callable[[Message], None] = self._step_follower
        self._tick: Callable[[], None] = self._tick_election
        hard_state, conf_state = storage.initial_state()
        snapshot = storage.snapshot()
        self._switch_to_config(conf_state)
        self._load_hard_state(hard_state, snapshot.meta.index)
        self._epoch, self._applied_term = self._recover_applied(snapshot, applied)
        self._become_follower(self._term, NO_NODE)
        self._prev_hard_state = self._hard_state()
        self._prev_soft_state = self._soft_state()

    # == restart ====================================================================

    def _load_hard_state(self, hard_state: HardState, snapshot_index: int) -> None:
        log = self._log
        if hard_state.commit > log.last_index():
            raise UsageError(
                f"node {self._id}: stored commit index {hard_state.commit} is past the last "
                f"stored entry {log.last_index()}; the log was truncated or lost"
            )
        # A stored snapshot is committed even if the hard state was saved before it.
        log.commit_to(max(hard_state.commit, snapshot_index))
        self._term = hard_state.term
        self._vote = hard_state.vote

    def _recover_applied(self, snapshot: Snapshot, applied: int) -> tuple[int, int]:
        """Set the applied index; replay conf changes and the epoch up to it."""
        log = self._log
        if applied > log.committed:
            raise UsageError(
                f"node {self._id}: applied index {applied} is past the commit index "
                f"{log.committed}; the application cannot have applied uncommitted entries"
            )
        start = snapshot.meta.index
        epoch, term = snapshot.meta.epoch, snapshot.meta.term
        applied = max(applied, start)
        lo = start + 1
        while lo <= applied:
            entries = log.slice(lo, applied + 1, self._config.max_committed_entries_per_ready_bytes)
            epoch, term = fold_epoch(epoch, term, entries)
            for entry in entries:
                if entry.type == _CONF_CHANGE:
                    self._apply_conf_change_entry(entry)
            lo = entries[-1].index + 1
        log.applied = applied
        return epoch, term

    # == public properties ==========================================================

    @property
    def id(self) -> int:
        return self._id

    @property
    def role(self) -> Role:
        return self._role

    @property
    def term(self) -> int:
        return self._term

    @property
    def vote(self) -> int:
        return self._vote

    @property
    def leader_id(self) -> int:
        return self._lead

    @property
    def epoch(self) -> int:
        """The group epoch at ``applied_index``."""
        return self._epoch

    @property
    def quiesced(self) -> bool:
        """Whether the group is quiesced: ``tick()`` does nothing until it wakes."""
        return self._quiesced

    @property
    def commit_index(self) -> int:
        return self._log.committed

    @property
    def applied_index(self) -> int:
        return self._log.applied

    @property
    def last_index(self) -> int:
        return self._log.last_index()

    @property
    def conf_state(self) -> ConfState:
        """The configuration in effect (the last applied or restored one)."""
        return self._tracker.config.to_conf_state()

    @property
    def lead_transferee(self) -> int:
        return self._lead_transferee

    def recently_active(self, node_id: int) -> bool:
        """On the leader: whether ``node_id`` has answered since the last check
        of the quorum (within about an election timeout, with ``check_quorum``;
        without it, ever). False on a follower or for a node not in the group.
        A leader transfer to a node that is not is bound to time out, and the
        group takes no proposals meanwhile."""
        if self._role != Role.LEADER:
            return False
        if node_id == self._id:
            return True
        pr = self._tracker.progress.get(node_id)
        return pr is not None and pr.recent_active

    def status(self) -> dict[str, Any]:
        """A plain snapshot of the state for metrics, the CLI and tests."""
        cs = self.conf_state
        status: dict[str, Any] = {
            "id": self._id,
            "role": self._role.name,
            "term": self._term,
            "vote": self._vote,
            "leader_id": self._lead,
            "commit": self._log.committed,
            "applied": self._log.applied,
            "first_index": self._log.first_index(),
            "last_index": self._log.last_index(),
            "epoch": self._epoch,
            "voters": sorted(cs.voters),
            "voters_outgoing": sorted(cs.voters_outgoing),
            "learners": sorted(cs.learners),
            "learners_next": sorted(cs.learners_next),
            "auto_leave": cs.auto_leave,
            "lead_transferee": self._lead_transferee,
            "pending_conf_index": self._pending_conf_index,
            "uncommitted_bytes": self._uncommitted_bytes,
            "pending_read_index": self._read_only.pending_count() + len(self._pending_read_index),
            "election_elapsed_ticks": self._election_elapsed,
        }
        if self._role == Role.LEADER:
            status["progress"] = {
                node_id: pr.describe() for node_id, pr in self._tracker.progress.items()
            }
        return status

    # == inputs =====================================================================

    def tick(self) -> None:
        """Advance the logical clock by one tick (nothing while quiesced)."""
        if not self._quiesced:
            self._tick()

    def wake(self) -> None:
        """Leave quiescence (if quiesced): timers run again from zero, a leader
        heartbeats at once and earns its lease again (its tick counter stood
        still while quiesced, so old lease acknowledgements prove nothing)."""
        if not self._quiesced:
            return
        self._quiesced = False
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        if self._role == Role.LEADER:
            self._lease_acks = {}
            self._bcast_heartbeat(b"")

    def peer_liveness_changed(self, peers: Iterable[int]) -> None:
        """The driver saw the processes of ``peers`` stop or start answering.

        A quiesced follower wakes when its leader is among them (it must be
        able to elect a new one); a quiesced leader wakes when one of its
        members is (a member back from a crash or a partition hears from it,
        and a leader cut off learns of a newer term).
        """
        if not self._quiesced:
            return
        changed = set(peers)
        if self._role == Role.LEADER:
            if not changed.isdisjoint(self._tracker.progress):
                self.wake()
        elif self._lead in changed or self._lead == NO_NODE:
            self.wake()

    def step(self, message: Message) -> None:
        """Feed one message from a peer.

        Raises ProtocolError (state unchanged) for a message that is invalid in
        itself or comes from a node this leader/candidate does not know; the
        driver drops it and carries on. Stale-term messages are ignored.
        """
        self._validate(message)
        if self._quiesced and not self._keeps_quiesced(message):
            self.wake()
        term = message.term
        if term > self._term:
            if not self._accept_higher_term(message):
                return
        elif term < self._term and message.type not in _TERMLESS_TYPES:
            self._on_stale_term(message)
            return
        if message.type in (MessageType.VOTE, MessageType.PRE_VOTE):
            self._handle_vote_request(message)
        else:
            self._step(message)

    def propose(self, data: bytes) -> tuple[int, int]:
        """Append ``data`` as a new entry (leader only); return its (term, index)."""
        return self.propose_batch([data])

    def propose_batch(self, batch: Sequence[bytes]) -> tuple[int, int]:
        """Append every payload of ``batch`` as consecutive entries (leader only).

        Returns ``(term, first_index)``: payload ``i`` is the entry at
        ``first_index + i`` of that term. An application matches a proposal to
        its result by this position, as etcd's do: the proposal was applied if
        and only if the entry applied at that index has that term (any other
        term there means it was dropped by a later leader).
        """
        self._check_can_propose()
        first = self._log.last_index() + 1
        if not batch:
            return self._term, first
        max_bytes = self._config.max_entry_data_bytes
        if set(map(type, batch)) != {bytes}:
            raise UsageError(
                f"proposals must be bytes, got {sorted({type(d).__name__ for d in batch})}"
            )
        if max(map(len, batch)) > max_bytes:
            raise UsageError(
                f"a proposal of {max(map(len, batch))} bytes exceeds "
                f"max_entry_data_bytes={max_bytes}"
            )
        term = self._term
        entries = [Entry(term, first + i, _NORMAL, data) for i, data in enumerate(batch)]
        self.wake()  # after every check: a refused proposal leaves the node as it was
        if not self._append_entries(entries):
            raise ProposalDroppedError(
                f"node {self._id}: {self._uncommitted_bytes} bytes are uncommitted, the cap is "
                f"max_uncommitted_entries_bytes={self._config.max_uncommitted_entries_bytes}; "
                "retry after entries commit",
                leader_hint=self._id,
            )
        self._bcast_append()
        return term, first

    def propose_conf_change(self, change: ConfChange) -> tuple[int, int]:
        """Propose a membership change (leader only, one at a time); return the
        (term, index) of its entry (see ``propose_batch``)."""
        self._check_can_propose()
        if self._pending_conf_index > self._log.applied:
            raise ConfChangePendingError(
                f"node {self._id}: a membership change at index {self._pending_conf_index} is "
                f"not applied yet (applied {self._log.applied}); wait for it, then retry"
            )
        apply_conf_change(self.conf_state, change)  # validate: raises ConfChangeError
        self.wake()
        if not self._append_conf_change(change):
            raise ProposalDroppedError(
                f"node {self._id}: uncommitted bytes cap reached", leader_hint=self._id
            )
        return self._term, self._pending_conf_index

    def read_index(self, context: bytes) -> None:
        """Ask for a linearizable read point; the answer is a ReadState in a Ready.

        ``context`` identifies the request (unique among pending ones).
        """
        if not isinstance(context, bytes) or not context:
            raise UsageError("read_index needs a non-empty bytes context to match the answer")
        if self._role != Role.LEADER:
            if self._lead == NO_NODE:
                raise ProposalDroppedError(f"node {self._id}: no leader known for read_index")
            self._send(Message(type=MessageType.READ_INDEX, to=self._lead, from_=self._id,
                               context=context))
            return
        if self._read_pending(context):
            raise UsageError(f"read_index context {context!r} is already pending")
        if self._read_queue_full():
            raise ProposalDroppedError(
                f"node {self._id}: {self._config.max_pending_read_index_requests} reads pending "
                "(max_pending_read_index_requests); retry later",
                leader_hint=self._id,
            )
        self.wake()  # before the lease check: see wake()
        self._leader_read_index(self._id, context)

    def transfer_leader(self, target: int) -> None:
        """Hand leadership to voter ``target`` (via the leader if not it)."""
        if target < 1:
            raise UsageError(f"transfer target must be a node id >= 1, got {target}")
        if self._role == Role.LEADER:
            pr = self._tracker.progress.get(target)
            if pr is None or pr.is_learner:
                raise UsageError(f"node {target} is not a voter of the current configuration")
            self.wake()
            self._handle_transfer_leader(target)
            return
        if self._lead == NO_NODE:
            raise ProposalDroppedError(f"node {self._id}: no leader known to transfer from")
        if target != self._lead:
            # As etcd: the request names the transferee in from_.
            self._send(Message(type=MessageType.TRANSFER_LEADER, to=self._lead, from_=target,
                               term=self._term))

    def campaign(self) -> None:
        """Start an election now (pre-vote first if enabled); for tests and tools."""
        if not self._promotable():
            raise UsageError(f"node {self._id} is not a voter and cannot campaign")
        self.wake()
        self._hup(_Campaign.PRE_ELECTION if self._config.pre_vote else _Campaign.ELECTION)

    def report_unreachable(self, node_id: int) -> None:
        """The driver could not send to ``node_id``: stop pipelining to it."""
        pr = self._reported_progress(node_id)
        if pr is not None and pr.state == ProgressState.REPLICATE:
            pr.become_probe()

    def report_snapshot(self, node_id: int, ok: bool) -> None:
        """The driver finished sending a snapshot to ``node_id`` (or failed)."""
        pr = self._reported_progress(node_id)
        if pr is None or pr.state != ProgressState.SNAPSHOT:
            return
        if not ok:
            pr.pending_snapshot = 0
        pr.become_probe()
        # Success: wait for the follower's APP_RESP; failure: for a heartbeat.
        pr.msg_app_flow_paused = True

    def _reported_progress(self, node_id: int) -> Progress | None:
        if node_id < 1:
            raise UsageError(f"node id must be >= 1, got {node_id}")
        if self._role != Role.LEADER:
            return None
        self.wake()
        return self._tracker.progress.get(node_id)

    # == Ready ======================================================================

    def _hard_state(self) -> HardState:
        return HardState(term=self._term, vote=self._vote, commit=self._log.committed)

    def _soft_state(self) -> SoftState:
        return SoftState(leader_id=self._lead, role=self._role)

    def has_ready(self) -> bool:
        """Whether ``ready()`` has something (False while a Ready is not advanced)."""
        if self._pending_ready is not None:
            return False
        log = self._log
        hard = self._prev_hard_state
        soft = self._prev_soft_state
        return bool(
            self._msgs
            or log.unstable.entries
            or log.unstable.snapshot is not None
            or self._read_states
            or self._term != hard.term
            or self._vote != hard.vote
            or log.committed != hard.commit
            or self._lead != soft.leader_id
            or self._role != soft.role
            or log.has_next_committed_entries()
        )

    def ready(self) -> Ready:
        """Take the pending work; call ``advance(ready)`` when it is done."""
        if self._pending_ready is not None:
            raise UsageError("ready() called again before advance() of the previous Ready")
        log = self._log
        hard_state = self._hard_state()
        prev = self._prev_hard_state
        soft_state = self._soft_state()
        entries = log.unstable_entries()
        snapshot = log.unstable.snapshot
        committed = log.next_committed_entries(self._config.max_committed_entries_per_ready_bytes)
        if snapshot is not None:
            epoch, _ = fold_epoch(snapshot.meta.epoch, snapshot.meta.term, committed)
        else:
            epoch, _ = fold_epoch(self._epoch, self._applied_term, committed)
        rd = Ready(
            soft_state=None if soft_state == self._prev_soft_state else soft_state,
            hard_state=None if hard_state == prev else hard_state,
            entries=entries,
            must_sync=bool(entries) or hard_state.term != prev.term or hard_state.vote != prev.vote,
            snapshot=snapshot,
            messages=self._msgs,
            committed_entries=committed,
            read_states=self._read_states,
            epoch=epoch,
        )
        self._msgs = []
        self._read_states = []
        self._pending_ready = rd
        return rd

    def advance(self, ready: Ready) -> None:
        """Confirm that ``ready`` was persisted, sent and applied."""
        if ready is not self._pending_ready:
            raise UsageError("advance() must get the Ready returned by the last ready()")
        self._pending_ready = None
        if ready.soft_state is not None:
            self._prev_soft_state = ready.soft_state
        if ready.hard_state is not None:
            self._prev_hard_state = ready.hard_state
        log = self._log
        if ready.snapshot is not None:
            meta = ready.snapshot.meta
            log.stable_snapshot_to(meta.index)
            if meta.index > log.applied:
                log.applied_to(meta.index)
                self._epoch, self._applied_term = meta.epoch, meta.term
        if ready.entries:
            last = ready.entries[-1]
            log.stable_to(last.index, last.term)
        if ready.committed_entries:
            self._apply_committed(ready.committed_entries, ready.epoch)

    def _apply_committed(self, entries: list[Entry], epoch: int) -> None:
        last = entries[-1]
        if last.index <= self._log.applied:
            return  # a snapshot restored between ready() and advance() passed them
        if _CONF_CHANGE in [e.type for e in entries]:
            for entry in entries:
                if entry.type == _CONF_CHANGE:
                    self._apply_conf_change_entry(entry)
        self._log.applied_to(last.index)
        self._epoch, self._applied_term = epoch, last.term
        if self._uncommitted_bytes:
            self._uncommitted_bytes = max(0, self._uncommitted_bytes - payload_size_bytes(entries))
        self._maybe_auto_leave()

    # == membership =================================================================

    def _apply_conf_change_entry(self, entry: Entry) -> None:
        change = ConfChange.decode(entry.data)
        try:
            new_state = apply_conf_change(self.conf_state, change)
        except UsageError as exc:
            # Validated against this very configuration when proposed.
            raise InvariantViolation(
                f"committed conf change at {entry.index} does not apply: {exc.message}"
            ) from exc
        self._switch_to_config(new_state)

    def _switch_to_config(self, cs: ConfState) -> None:
        old = self._tracker
        config = TrackerConfig.from_conf_state(cs)
        next_index = max(self._log.last_index(), 1)
        progress: dict[int, Progress] = {}
        for node_id in sorted(config.ids()):
            is_learner = node_id in config.learners
            pr = old.progress.get(node_id)
            if pr is None:
                pr = self._new_progress(next_index, is_learner=is_learner)
                pr.recent_active = True
            pr.is_learner = is_learner
            progress[node_id] = pr
        tracker = ProgressTracker(config, progress)
        tracker.votes = old.votes
        self._known_ids.update(progress)
        self._tracker = tracker
        self._is_learner = self._id in config.learners
        if self._role != Role.LEADER or cs.is_empty:
            return
        if self._id not in progress or self._is_learner:
            self._step_down_after_removal()
            return
        if self._lead_transferee and self._lead_transferee not in config.voters.ids():
            self._abort_leader_transfer()
        if self._maybe_commit():
            self._bcast_append()
        else:
            for node_id in progress:
                if node_id != self._id:
                    self._maybe_send_append(node_id, send_if_empty=False)

    def _step_down_after_removal(self) -> None:
        """The leader applied a configuration without itself: hand over, step down."""
        last = self._log.last_index()
        candidates = [
            node_id
            for node_id in sorted(self._tracker.config.voters.incoming)
            if self._tracker.progress[node_id].match == last
        ]
        if candidates:
            self._send_timeout_now(candidates[0])
        self._become_follower(self._term, NO_NODE)

    def _maybe_auto_leave(self) -> None:
        config = self._tracker.config
        if (
            self._role == Role.LEADER
            and config.auto_leave
            and config.voters.is_joint
            and self._pending_conf_index <= self._log.applied
            and self._lead_transferee == NO_NODE
        ):
            self._append_conf_change(ConfChange())

    def _append_conf_change(self, change: ConfChange) -> bool:
        index = self._log.last_index() + 1
        if not self._append_entries([Entry(self._term, index, _CONF_CHANGE, change.encode())]):
            return False
        self._pending_conf_index = index
        self._bcast_append()
        return True

    def _has_unapplied_conf_changes(self) -> bool:
        log = self._log
        lo, hi = log.applied + 1, log.committed + 1
        while lo < hi:
            entries = log.slice(lo, hi, self._config.max_committed_entries_per_ready_bytes)
            if any(entry.type == _CONF_CHANGE for entry in entries):
                return True
            lo = entries[-1].index + 1
        return False

    def _promotable(self) -> bool:
        pr = self._tracker.progress.get(self._id)
        return pr is not None and not pr.is_learner and self._log.unstable.snapshot is None

    # == role transitions ===========================================================

    def _new_progress(self, next_index: int, *, is_learner: bool) -> Progress:
        cfg = self._config
        inflights = Inflights(cfg.max_inflight_messages, cfg.max_inflight_bytes)
        return Progress(next_index, inflights, is_learner=is_learner)

    def _reset(self, term: int) -> None:
        self._quiesced = False
        if term != self._term:
            self._term = term
            self._vote = NO_NODE
        self._lead = NO_NODE
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        timeout = self._config.election_timeout_ticks
        self._randomized_election_timeout = timeout + self._rng.randrange(timeout)
        self._lead_transferee = NO_NODE
        self._tracker.reset_votes()
        last = self._log.last_index()
        for node_id, old in self._tracker.progress.items():
            pr = self._new_progress(last + 1, is_learner=old.is_learner)
            if node_id == self._id:
                pr.match = last
            self._tracker.progress[node_id] = pr
        self._pending_conf_index = 0
        self._uncommitted_bytes = 0
        self._read_only = ReadOnly(self._config.max_pending_read_index_requests)
        self._pending_read_index = []

    def _become_follower(self, term: int, lead: int) -> None:
        self._step = self._step_follower
        self._reset(term)
        self._tick = self._tick_election
        self._lead = lead
        self._role = Role.FOLLOWER

    def _become_pre_candidate(self) -> None:
        invariant(self._role != Role.LEADER, "invalid transition [leader -> pre-candidate]")
        # Pre-vote changes neither term nor vote: nothing here is persisted.
        self._step = self._step_candidate
        self._tracker.reset_votes()
        self._tick = self._tick_election
        self._lead = NO_NODE
        self._role = Role.PRE_CANDIDATE

    def _become_candidate(self) -> None:
        invariant(self._role != Role.LEADER, "invalid transition [leader -> candidate]")
        self._step = self._step_candidate
        self._reset(self._term + 1)
        self._tick = self._tick_election
        self._vote = self._id
        self._role = Role.CANDIDATE

    def _become_leader(self) -> None:
        invariant(self._role != Role.FOLLOWER, "invalid transition [follower -> leader]")
        self._step = self._step_leader
        self._reset(self._term)
        self._tick = self._tick_heartbeat
        self._lead = self._id
        self._role = Role.LEADER
        self._leader_ticks = 0
        self._lease_acks = {}
        pr = self._tracker.progress[self._id]
        pr.become_replicate()
        pr.recent_active = True
        # Conservatively treat every entry up to here as a possible conf change.
        last = self._log.last_index()
        self._pending_conf_index = last
        appended = self._append_entries([Entry(self._term, last + 1, _NORMAL, b"")])
        invariant(appended, "a new leader must be able to append its empty entry")

    # == elections ==================================================================

    def _hup(self, kind: _Campaign) -> None:
        if self._role == Role.LEADER or not self._promotable():
            return
        if self._has_unapplied_conf_changes():
            return  # the configuration may be about to change: wait until applied
        self._campaign(kind)

    def _campaign(self, kind: _Campaign) -> None:
        if kind == _Campaign.PRE_ELECTION:
            self._become_pre_candidate()
            vote_type = MessageType.PRE_VOTE
            term = self._term + 1
        else:
            self._become_candidate()
            vote_type = MessageType.VOTE
            term = self._term
        if self._poll(self._id, granted=True) == VoteResult.WON:
            # A single-voter group wins at once.
            if kind == _Campaign.PRE_ELECTION:
                self._campaign(_Campaign.ELECTION)
            else:
                self._become_leader()
            return
        log = self._log
        last_index, last_term = log.last_index(), log.last_term()
        context = CAMPAIGN_TRANSFER_CONTEXT if kind == _Campaign.TRANSFER else b""
        for node_id in sorted(self._tracker.voter_ids()):
            if node_id == self._id:
                continue
            self._send(Message(type=vote_type, to=node_id, from_=self._id, term=term,
                               index=last_index, log_term=last_term, context=context))

    def _poll(self, node_id: int, *, granted: bool) -> VoteResult:
        self._tracker.record_vote(node_id, granted)
        return self._tracker.tally_votes()[2]

    def _handle_vote_request(self, m: Message) -> None:
        response_type = (
            MessageType.VOTE_RESP if m.type == MessageType.VOTE else MessageType.PRE_VOTE_RESP
        )
        can_vote = (
            self._vote == m.from_
            or (self._vote == NO_NODE and self._lead == NO_NODE)
            or (m.type == MessageType.PRE_VOTE and m.term > self._term)
        )
        if can_vote and self._log.is_up_to_date(m.index, m.log_term):
            # The response carries the candidate's term: a pre-vote grant must
            # not look stale to a pre-candidate still at the old term.
            self._send(Message(type=response_type, to=m.from_, from_=self._id, term=m.term))
            if m.type == MessageType.VOTE:
                self._election_elapsed = 0
                self._vote = m.from_
        else:
            self._send(Message(type=response_type, to=m.from_, from_=self._id, term=self._term,
                               reject=True))

    # == step: common checks ========================================================

    def _validate(self, m: Message) -> None:
        """Reject messages that are garbage whatever our state; no side effects."""
        node = self._id
        if m.to != node:
            raise ProtocolError(f"node {node}: got a message addressed to {m.to}")
        if m.from_ < 1 or m.from_ == node:
            raise ProtocolError(f"node {node}: message from invalid node id {m.from_}")
        if m.type in LOCAL_MESSAGE_TYPES:
            raise ProtocolError(f"node {node}: local-only message type {m.type.name} from peer")
        if min(m.term, m.log_term, m.index, m.commit, m.reject_hint) < 0:
            raise ProtocolError(f"node {node}: negative field in {m.type.name}")
        if m.term == 0 and m.type not in _TERMLESS_TYPES:
            raise ProtocolError(f"node {node}: {m.type.name} without a term")
        if (m.snapshot is not None) != (m.type == MessageType.SNAP):
            raise ProtocolError(f"node {node}: snapshot field misused in {m.type.name}")
        if m.type == MessageType.APP:
            self._validate_append(m)
        elif m.type == MessageType.PROP:
            if not m.entries or any(e.type != _NORMAL for e in m.entries):
                raise ProtocolError(f"node {node}: PROP must carry normal entries")
        elif m.entries:
            raise ProtocolError(f"node {node}: {m.type.name} must not carry entries")
        elif m.type == MessageType.SNAP:
            meta = m.snapshot.meta if m.snapshot is not None else None
            if meta is None or meta.index < 1 or meta.term > m.term:
                raise ProtocolError(f"node {node}: SNAP with an impossible snapshot position")
        elif (
            m.type == MessageType.HEARTBEAT
            and m.commit > self._log.last_index()
            and m.term >= self._term
        ):
            raise ProtocolError(
                    f"node {node}: heartbeat commit {m.commit} past our last index "
                    f"{self._log.last_index()}; the leader thinks we have entries we lack: "
                    "this member's log lost entries it had acknowledged (its data was "
                    "restored from an older copy, or synced writes were lost), and it cannot "
                    "rejoin as it is. Remove it from the group, wipe its Raft data and add it "
                    "again (docs/meta.md, \"A member whose data is lost, damaged or older\")"
                )
        self._validate_sender(m)

    def _validate_sender(self, m: Message) -> None:
        """Responses to a leader or candidate must come from a node we know.

        A node that was a member once (removed since) may still have answers
        in flight: those are dropped quietly later. An id that was never in
        any configuration this node applied is an error.
        """
        role = self._role
        if role == Role.FOLLOWER or m.from_ in self._known_ids:
            return
        if m.term < self._term and m.type not in _TERMLESS_TYPES:
            return  # stale: ignored later, whoever sent it
        if (role == Role.LEADER and m.type in _LEADER_BOUND_TYPES) or (
            role != Role.LEADER and m.type in _VOTE_RESPONSE_TYPES
        ):
            raise ProtocolError(
                f"node {self._id}: {m.type.name} from node {m.from_}, which was never in "
                "the configuration; check the sender's node id"
            )

    def _validate_append(self, m: Message) -> None:
        entries = m.entries
        if not entries:
            return
        first = m.index + 1
        indexes = [e.index for e in entries]
        if indexes != list(range(first, first + len(entries))):
            raise ProtocolError(
                f"node {self._id}: APP entries are not the contiguous run after {m.index}"
            )
        terms = [e.term for e in entries]
        if terms[0] < m.log_term or terms[-1] > m.term or terms != sorted(terms):
            raise ProtocolError(
                f"node {self._id}: APP entry terms must not decrease and must lie within "
                f"[{m.log_term}, {m.term}]"
            )

    def _accept_higher_term(self, m: Message) -> bool:
        """A message from a newer term; False if it is to be ignored."""
        t = m.type
        if t in (MessageType.VOTE, MessageType.PRE_VOTE):
            forced = m.context == CAMPAIGN_TRANSFER_CONTEXT
            in_lease = (
                self._config.check_quorum
                and self._lead != NO_NODE
                and self._election_elapsed < self._config.election_timeout_ticks
            )
            if in_lease and not forced:
                return False  # we hear from a live leader: do not help depose it
        if t == MessageType.PRE_VOTE:
            return True  # a pre-vote never changes our term
        if t == MessageType.PRE_VOTE_RESP and not m.reject:
            return True  # the term we will campaign in once the pre-vote is won
        if t in (MessageType.APP, MessageType.HEARTBEAT, MessageType.SNAP):
            self._become_follower(m.term, m.from_)
        else:
            self._become_follower(m.term, NO_NODE)
        return True

    def _on_stale_term(self, m: Message) -> None:
        if m.type in (MessageType.HEARTBEAT, MessageType.APP):
            # A deposed leader (or one cut off and back) learns the new term from
            # this answer and steps down. etcd answers only with check-quorum or
            # pre-vote and otherwise relies on vote requests reaching the old
            # leader; after membership changes the nodes with the newer term may
            # not count it as a voter, so we always answer, as the Raft paper does.
            self._send(Message(type=MessageType.APP_RESP, to=m.from_, from_=self._id,
                               term=self._term))
        elif m.type in (MessageType.PRE_VOTE, MessageType.VOTE):
            # A rejection with our term, as the Raft paper answers (etcd ignores a stale
            # VOTE). Without it a candidate whose only possible voter is a member that
            # missed configuration changes (it campaigns elsewhere, so it never reaches
            # the candidate) could lag that voter's term forever (table simulator).
            response = (MessageType.PRE_VOTE_RESP if m.type == MessageType.PRE_VOTE
                        else MessageType.VOTE_RESP)
            self._send(Message(type=response, to=m.from_, from_=self._id,
                               term=self._term, reject=True))

    def _send(self, m: Message) -> None:
        self._msgs.append(m)

    # == follower =====================================================================

    def _tick_election(self) -> None:
        self._election_elapsed += 1
        if self._election_elapsed >= self._randomized_election_timeout and self._promotable():
            self._election_elapsed = 0
            self._hup(_Campaign.PRE_ELECTION if self._config.pre_vote else _Campaign.ELECTION)

    def _step_follower(self, m: Message) -> None:
        t = m.type
        if t == MessageType.APP:
            self._election_elapsed = 0
            self._lead = m.from_
            self._handle_append(m)
        elif t == MessageType.HEARTBEAT:
            self._election_elapsed = 0
            self._lead = m.from_
            self._handle_heartbeat(m)
        elif t == MessageType.SNAP:
            self._election_elapsed = 0
            self._lead = m.from_
            self._handle_snapshot(m)
        elif t == MessageType.TRANSFER_LEADER:
            if self._lead not in (NO_NODE, m.from_):
                self._send(Message(type=t, to=self._lead, from_=m.from_, term=self._term))
        elif t == MessageType.TIMEOUT_NOW:
            self._hup(_Campaign.TRANSFER)
        elif t == MessageType.READ_INDEX_RESP:
            self._read_states.append(ReadState(index=m.index, context=m.context))
        # PROP (proposals are not forwarded), READ_INDEX (we are not the leader)
        # and late responses are dropped.

    def _handle_append(self, m: Message) -> None:
        log = self._log
        if m.index < log.committed:
            self._send(Message(type=MessageType.APP_RESP, to=m.from_, from_=self._id,
                               term=self._term, index=log.committed))
            return
        last_new = log.maybe_append(m.index, m.log_term, m.commit, m.entries)
        if last_new is not None:
            self._send(Message(type=MessageType.APP_RESP, to=m.from_, from_=self._id,
                               term=self._term, index=last_new))
            return
        hint_index = min(m.index, log.last_index())
        hint_index, hint_term = log.find_conflict_by_term(hint_index, m.log_term)
        self._send(Message(type=MessageType.APP_RESP, to=m.from_, from_=self._id, term=self._term,
                           index=m.index, reject=True, reject_hint=hint_index,
                           log_term=hint_term))

    def _handle_heartbeat(self, m: Message) -> None:
        log = self._log
        log.commit_to(m.commit)
        context = m.context
        if context == QUIESCE_CONTEXT:
            context = b""  # not a read: nothing for the leader to match
            # Quiesce only with the leader's whole log: a follower with entries
            # past the leader's commit keeps its timer (the leader would never
            # send it more), and is woken by nothing but its own election.
            if self._config.quiesce_idle and m.commit == log.last_index() == log.committed:
                self._quiesced = True
        self._send(Message(type=MessageType.HEARTBEAT_RESP, to=m.from_, from_=self._id,
                           term=self._term, index=m.index, context=context))

    def _handle_snapshot(self, m: Message) -> None:
        snapshot = m.snapshot
        if snapshot is None:  # unreachable: _validate requires it
            raise InvariantViolation("SNAP without a snapshot passed validation")
        index = self._log.last_index() if self._restore(snapshot) else self._log.committed
        self._send(Message(type=MessageType.APP_RESP, to=m.from_, from_=self._id,
                           term=self._term, index=index))

    def _restore(self, snapshot: Snapshot) -> bool:
        log = self._log
        meta = snapshot.meta
        if meta.index <= log.committed:
            return False
        if log.match_term(meta.index, meta.term):
            # We have the entry: the snapshot only tells us it is committed.
            log.commit_to(meta.index)
            return False
        log.restore(snapshot)
        self._switch_to_config(meta.conf_state)
        return True

    # == candidate ====================================================================

    def _step_candidate(self, m: Message) -> None:
        t = m.type
        if t == MessageType.APP:
            self._become_follower(m.term, m.from_)
            self._handle_append(m)
        elif t == MessageType.HEARTBEAT:
            self._become_follower(m.term, m.from_)
            self._handle_heartbeat(m)
        elif t == MessageType.SNAP:
            self._become_follower(m.term, m.from_)
            self._handle_snapshot(m)
        elif t in _VOTE_RESPONSE_TYPES:
            self._handle_vote_response(m)
        # Anything else (PROP, TIMEOUT_NOW, late responses) is dropped.

    def _handle_vote_response(self, m: Message) -> None:
        expected = (
            MessageType.PRE_VOTE_RESP
            if self._role == Role.PRE_CANDIDATE
            else MessageType.VOTE_RESP
        )
        if m.type != expected:
            return
        result = self._poll(m.from_, granted=not m.reject)
        if result == VoteResult.WON:
            if self._role == Role.PRE_CANDIDATE:
                self._campaign(_Campaign.ELECTION)
            else:
                self._become_leader()
                self._bcast_append()
        elif result == VoteResult.LOST:
            # A pre-candidate that lost keeps its term (nothing was bumped).
            self._become_follower(self._term, NO_NODE)

    # == leader =======================================================================

    def _tick_heartbeat(self) -> None:
        self._leader_ticks += 1
        self._heartbeat_elapsed += 1
        self._election_elapsed += 1
        self._tick_snapshot_waits()
        if self._election_elapsed >= self._config.election_timeout_ticks:
            self._election_elapsed = 0
            if self._config.check_quorum:
                self._check_quorum()
            if self._role == Role.LEADER and self._lead_transferee != NO_NODE:
                self._abort_leader_transfer()  # the transfer did not finish in time
                # The automatic leave of a joint configuration is refused while a
                # transfer runs; nothing else would propose it again if no entry
                # applies later (table simulator, seed 5000546).
                self._maybe_auto_leave()
        if self._role != Role.LEADER:
            return
        if self._heartbeat_elapsed >= self._config.heartbeat_interval_ticks:
            self._heartbeat_elapsed = 0
            if self._config.quiesce_idle and self._can_quiesce():
                self._bcast_heartbeat(QUIESCE_CONTEXT)
                self._quiesced = True
                return
            self._bcast_heartbeat(self._read_only.last_pending_context())

    def _can_quiesce(self) -> bool:
        """Whether this leader has nothing left to do until something new comes:
        every member has its whole log, all of it committed and applied, no
        read, transfer, snapshot or joint configuration is pending."""
        log = self._log
        last = log.last_index()
        if (
            log.committed != last
            or log.applied != last
            or log.unstable.entries
            or log.unstable.snapshot is not None
            or self._pending_ready is not None
            or self._lead_transferee != NO_NODE
            or self._read_only.pending_count()
            or self._pending_read_index
            or self._tracker.config.voters.outgoing
            or self._log.term_or_zero(last) != self._term
        ):
            return False
        return all(
            pr.match == last and pr.state == ProgressState.REPLICATE
            for pr in self._tracker.progress.values()
        )

    def _keeps_quiesced(self, m: Message) -> bool:
        """Messages a quiesced group takes without waking: answers to the
        heartbeats it quiesced with, and its leader's quiesce heartbeats."""
        if m.term != self._term:
            return False
        if self._role == Role.LEADER:
            return m.type == MessageType.HEARTBEAT_RESP and not m.reject
        return (
            m.type == MessageType.HEARTBEAT
            and m.from_ == self._lead
            and m.context == QUIESCE_CONTEXT
        )

    def _tick_snapshot_waits(self) -> None:
        limit = self._config.max_snapshot_wait_ticks
        for pr in self._tracker.progress.values():
            if pr.state != ProgressState.SNAPSHOT:
                continue
            pr.snapshot_wait_ticks += 1
            if pr.snapshot_wait_ticks >= limit:
                # No report_snapshot() came: treat the transfer as failed.
                pr.pending_snapshot = 0
                pr.become_probe()

    def _check_quorum(self) -> None:
        if not self._tracker.quorum_active():
            self._become_follower(self._term, NO_NODE)
            return
        for node_id, pr in self._tracker.progress.items():
            if node_id != self._id:
                pr.recent_active = False

    def _step_leader(self, m: Message) -> None:
        t = m.type
        if t == MessageType.PROP:
            self._handle_forwarded_proposal(m)
            return
        if t == MessageType.READ_INDEX:
            if (
                m.from_ in self._tracker.progress
                and m.context
                and not self._read_pending(m.context)
                and not self._read_queue_full()
            ):
                self._leader_read_index(m.from_, m.context)
            return
        pr = self._tracker.progress.get(m.from_)
        if pr is None:
            return  # a removed member's late answer or request
        if t == MessageType.APP_RESP:
            self._handle_append_response(m, pr)
        elif t == MessageType.HEARTBEAT_RESP:
            self._handle_heartbeat_response(m, pr)
        elif t == MessageType.TRANSFER_LEADER and not pr.is_learner:
            self._handle_transfer_leader(m.from_)

    def _handle_forwarded_proposal(self, m: Message) -> None:
        if self._lead_transferee != NO_NODE:
            return
        if any(len(e.data) > self._config.max_entry_data_bytes for e in m.entries):
            return
        first = self._log.last_index() + 1
        entries = [Entry(self._term, first + i, _NORMAL, e.data) for i, e in enumerate(m.entries)]
        if self._append_entries(entries):
            self._bcast_append()

    def _check_can_propose(self) -> None:
        if self._role != Role.LEADER:
            raise ProposalDroppedError(
                f"node {self._id} is not the leader (role {self._role.name}); "
                + (f"send to node {self._lead}" if self._lead else "no leader is known yet"),
                leader_hint=self._lead,
            )
        if self._lead_transferee != NO_NODE:
            raise ProposalDroppedError(
                f"node {self._id} is transferring leadership to {self._lead_transferee}; "
                "retry there",
                leader_hint=self._lead_transferee,
            )

    def _append_entries(self, entries: list[Entry]) -> bool:
        size = payload_size_bytes(entries)
        limit = self._config.max_uncommitted_entries_bytes
        if self._uncommitted_bytes > 0 and size > 0 and self._uncommitted_bytes + size > limit:
            return False
        self._uncommitted_bytes += size
        last = self._log.append(entries)
        self._tracker.progress[self._id].maybe_update(last)
        self._maybe_commit()
        return True

    def _maybe_commit(self) -> bool:
        return self._log.maybe_commit(self._tracker.committed(), self._term)

    def _bcast_append(self) -> None:
        """Send every follower what it lacks: pipelined up to the inflight caps."""
        node = self._id
        send = self._maybe_send_append
        for node_id in self._tracker.progress:
            if node_id != node and send(node_id, send_if_empty=True):
                while send(node_id, send_if_empty=False):
                    pass

    def _maybe_send_append(self, to: int, *, send_if_empty: bool) -> bool:
        pr = self._tracker.progress[to]
        if pr.is_paused():
            return False
        log = self._log
        if not send_if_empty and pr.next > log.last_index():
            return False  # nothing new to send (the common case after each ack)
        prev_index = pr.next - 1
        try:
            prev_term = log.term(prev_index)
            entries = log.entries_from(pr.next, self._config.max_entries_per_message_bytes)
        except CompactedError:
            return self._maybe_send_snapshot(to, pr)
        if not entries and not send_if_empty:
            return False
        self._send(Message(type=MessageType.APP, to=to, from_=self._id, term=self._term,
                           index=prev_index, log_term=prev_term, entries=tuple(entries),
                           commit=log.committed))
        if entries:
            size = entries_size_bytes(entries) if pr.state == ProgressState.REPLICATE else 0
            pr.sent_entries(len(entries), size)
        return True

    def _maybe_send_snapshot(self, to: int, pr: Progress) -> bool:
        if not pr.recent_active:
            return False  # do not ship a snapshot to a node that may be down
        try:
            snapshot = self._log.snapshot()
        except SnapshotTemporarilyUnavailableError:
            return False  # the application is making one; retry on the next heartbeat
        invariant(snapshot.meta.index > 0, "need a non-empty snapshot to catch up a follower")
        pr.become_snapshot(snapshot.meta.index)
        self._send(Message(type=MessageType.SNAP, to=to, from_=self._id, term=self._term,
                           snapshot=snapshot))
        return True

    def _bcast_heartbeat(self, context: bytes) -> None:
        committed = self._log.committed
        for node_id, pr in self._tracker.progress.items():
            if node_id == self._id:
                continue
            # Never announce a commit index the follower may not have entries for.
            self._send(Message(type=MessageType.HEARTBEAT, to=node_id, from_=self._id,
                               term=self._term, commit=min(pr.match, committed),
                               index=self._leader_ticks + 1, context=context))

    def _send_timeout_now(self, to: int) -> None:
        self._send(Message(type=MessageType.TIMEOUT_NOW, to=to, from_=self._id, term=self._term))

    def _handle_append_response(self, m: Message, pr: Progress) -> None:
        pr.recent_active = True
        if m.reject:
            next_probe = m.reject_hint
            if m.log_term > 0:
                next_probe, _ = self._log.find_conflict_by_term(m.reject_hint, m.log_term)
            if pr.maybe_decr_to(m.index, next_probe):
                if pr.state == ProgressState.REPLICATE:
                    pr.become_probe()
                self._maybe_send_append(m.from_, send_if_empty=True)
            return
        old_paused = pr.is_paused()
        if not pr.maybe_update(m.index) and not (
            pr.match == m.index and pr.state == ProgressState.PROBE
        ):
            return
        if pr.state == ProgressState.PROBE:
            pr.become_replicate()
        elif pr.state == ProgressState.SNAPSHOT:
            if pr.match + 1 >= self._log.first_index():
                pr.become_probe()
                pr.become_replicate()
        else:
            pr.inflights.free_le(m.index)
        if self._maybe_commit():
            self._release_pending_read_index()
            if self._config.broadcast_commit:
                self._bcast_append()
            else:  # new entries only; the commit index rides on them or a heartbeat
                for node_id in self._tracker.progress:
                    if node_id != self._id:
                        while self._maybe_send_append(node_id, send_if_empty=False):
                            pass
        elif old_paused:
            self._maybe_send_append(m.from_, send_if_empty=True)
        while self._maybe_send_append(m.from_, send_if_empty=False):
            pass
        if m.from_ == self._lead_transferee and pr.match == self._log.last_index():
            self._send_timeout_now(m.from_)

    def _handle_heartbeat_response(self, m: Message, pr: Progress) -> None:
        pr.recent_active = True
        pr.msg_app_flow_paused = False
        if pr.state == ProgressState.REPLICATE and pr.inflights.full():
            # The follower is alive but nothing came back: appends may have been
            # lost. Let one more go; its answer (or rejection) resumes the flow.
            pr.inflights.free_first_one()
        if pr.match < self._log.last_index():
            self._maybe_send_append(m.from_, send_if_empty=True)
        if 0 < m.index <= self._leader_ticks + 1:
            self._lease_acks[m.from_] = max(self._lease_acks.get(m.from_, 0), m.index)
        if not m.context:
            return
        acks = self._read_only.recv_ack(m.from_, m.context)
        if acks is None or self._tracker.config.voters.vote_result(acks) != VoteResult.WON:
            return
        for status in self._read_only.advance(m.context):
            self._respond_read_index(status.requester, status.index, status.context)

    # -- leader transfer ------------------------------------------------------------

    def _handle_transfer_leader(self, transferee: int) -> None:
        if self._lead_transferee != NO_NODE:
            if self._lead_transferee == transferee:
                return  # already in progress
            self._abort_leader_transfer()
        if transferee == self._id:
            return  # already the leader
        # The transfer must finish within an election timeout (see _tick_heartbeat).
        self._election_elapsed = 0
        self._lead_transferee = transferee
        pr = self._tracker.progress[transferee]
        if pr.match == self._log.last_index():
            self._send_timeout_now(transferee)
        else:
            self._maybe_send_append(transferee, send_if_empty=True)

    def _abort_leader_transfer(self) -> None:
        self._lead_transferee = NO_NODE

    # -- read index -------------------------------------------------------------------

    def _read_pending(self, context: bytes) -> bool:
        return self._read_only.contains(context) or any(
            ctx == context for _, ctx in self._pending_read_index
        )

    def _read_queue_full(self) -> bool:
        pending = self._read_only.pending_count() + len(self._pending_read_index)
        return pending >= self._config.max_pending_read_index_requests

    def _leader_read_index(self, requester: int, context: bytes) -> None:
        if self._tracker.is_singleton():
            self._respond_read_index(requester, self._log.committed, context)
        elif self._log.term_or_zero(self._log.committed) != self._term:
            # Until an entry of our term commits we do not know the true commit
            # index (Raft paper, section 8): hold the request.
            self._pending_read_index.append((requester, context))
        else:
            self._send_read_index(requester, context)

    def _lease_holds(self) -> bool:
        """Whether no other leader can exist now (read_only_mode="lease_based").

        A follower that answered our heartbeat stamped ``s`` heard from us no
        earlier than leader tick ``s``; with check-quorum it then refuses
        votes for ``election_timeout_ticks`` of its own ticks, so no new leader
        can be elected before ``s + election_timeout_ticks - 1`` (its first
        tick may come at once). Our counter may lag real time by one tick:
        the lease holds while ``now - s < election_timeout_ticks - 2`` for the
        stamp a quorum has answered. Equal tick rates are assumed: the driver
        must keep clock drift well inside the two ticks of margin. Counting
        from check-quorum instead (etcd's way) left a window where a deposed
        leader still served reads: it steps down only at its next check,
        up to two election timeouts after it lost its quorum.
        """
        if self._lead_transferee != NO_NODE:
            return False  # the transferee may be elected at once (forced vote)
        now = self._leader_ticks + 1
        acks = self._lease_acks
        stamp = self._tracker.config.voters.committed_index(
            lambda node_id: now if node_id == self._id else acks.get(node_id, 0))
        return stamp > 0 and now - stamp < self._config.election_timeout_ticks - 2

    def _send_read_index(self, requester: int, context: bytes) -> None:
        committed = self._log.committed
        if self._config.read_only_mode == "lease_based" and self._lease_holds():
            self._respond_read_index(requester, committed, context)
            return
        self._read_only.add_request(committed, requester, context)
        self._read_only.recv_ack(self._id, context)
        self._bcast_heartbeat(context)

    def _release_pending_read_index(self) -> None:
        if not self._pending_read_index:
            return
        if self._log.term_or_zero(self._log.committed) != self._term:
            return
        pending, self._pending_read_index = self._pending_read_index, []
        for requester, context in pending:
            self._send_read_index(requester, context)

    def _respond_read_index(self, requester: int, index: int, context: bytes) -> None:
        if requester == self._id:
            self._read_states.append(ReadState(index=index, context=context))
        else:
            self._send(Message(type=MessageType.READ_INDEX_RESP, to=requester, from_=self._id,
                               term=self._term, index=index, context=context))
