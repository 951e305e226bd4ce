"""Configuration of one Raft core: every limit, with its unit and its reason."""

from __future__ import annotations

from typing import Literal

from quorumlog.config import Config, require

KIB = 1024
MIB = 1024 * KIB

ReadOnlyMode = Literal["safe", "lease_based"]


class RaftConfig(Config, frozen=True):
    """Settings of one Raft core; times are in ticks (the driver sets the tick).

    ``read_only_mode``: ``safe`` confirms leadership with a heartbeat round
    per ReadIndex batch; ``lease_based`` trusts the leader lease (needs
    ``check_quorum``) and is only as safe as the clocks are (see docs/raft.md).
    """

    node_id: int
    # A follower that hears nothing for [election, 2*election) ticks campaigns;
    # a leader that hears no quorum for election ticks steps down (check-quorum).
    election_timeout_ticks: int = 10
    # The leader sends heartbeats every this many ticks; must be well below the
    # election timeout or followers start elections under a live leader.
    heartbeat_interval_ticks: int = 1
    # Pre-vote: a node that cannot win does not bump the term (no disruption
    # by a node rejoining after a partition).
    pre_vote: bool = True
    # The leader steps down when it has not heard from a quorum for an election
    # timeout; followers with a live leader ignore vote requests (lease).
    check_quorum: bool = True
    # Byte cap (entry payload + per-entry overhead) of one APP message; at least
    # one entry is always sent, so one entry larger than this still goes.
    max_entries_per_message_bytes: int = 1 * MIB
    # APP messages in flight to one follower while replicating (pipelining);
    # bounds memory on the leader and the network queue to a slow follower.
    max_inflight_messages: int = 256
    # Bytes in flight to one follower; same purpose as the count cap.
    max_inflight_bytes: int = 64 * MIB
    # Payload bytes appended by the leader but not yet committed; proposals
    # beyond it are dropped (ProposalDroppedError) so a stuck quorum cannot
    # make the leader grow without bound.
    max_uncommitted_entries_bytes: int = 64 * MIB
    # Largest single proposal payload; larger proposals are a usage error.
    max_entry_data_bytes: int = 8 * MIB
    # Byte cap of Ready.committed_entries (at least one entry is handed out).
    max_committed_entries_per_ready_bytes: int = 16 * MIB
    # ReadIndex requests waiting for a heartbeat quorum (or for the leader's
    # first commit in its term); more are dropped with ProposalDroppedError.
    max_pending_read_index_requests: int = 4096
    # A follower sent a snapshot is paused until the driver calls
    # report_snapshot(); if no report comes within this many ticks (it was
    # lost with a crashed transfer), the leader probes the follower again.
    max_snapshot_wait_ticks: int = 100
    read_only_mode: ReadOnlyMode = "safe"
    # When an acknowledgement advances the commit index, tell every follower
    # at once with an AppendEntries (etcd's bcastAppend). Off: followers learn
    # it from the next AppendEntries or heartbeat (at most a heartbeat
    # interval later), as the Raft paper describes it; commit and safety do
    # not depend on when followers learn it. Saves a message per follower and
    # a pass on each follower per commit; the metadata service turns it off
    # (a sequential client's next put carries the commit, and its clients
    # read from the leader), and so do tables by default (TableConfig:
    # their follower reads are stale reads, a tick more at most).
    broadcast_commit: bool = True
    # Quiescence (CockroachDB): a leader whose every member has acknowledged
    # its last entry, with everything committed and applied and nothing
    # pending, sends one last heartbeat marked "quiesce" and stops ticking; a
    # follower that has the leader's whole log then stops its election timer.
    # Any proposal, read or message (other than those heartbeats and their
    # answers) wakes the group, and so does the driver when the leader's (or a
    # member's) process stops or starts answering: ``peer_liveness_changed``.
    # Off by default: only a driver that reports process liveness may turn it on
    # (a quiesced follower never campaigns by itself).
    quiesce_idle: bool = False

    def validate(self) -> None:
        require(self.node_id >= 1, f"node_id must be >= 1, got {self.node_id}")
        require(
            self.heartbeat_interval_ticks >= 1,
            f"heartbeat_interval_ticks must be >= 1, got {self.heartbeat_interval_ticks}",
        )
        require(
            self.election_timeout_ticks > self.heartbeat_interval_ticks,
            "election_timeout_ticks must be greater than heartbeat_interval_ticks "
            f"(got {self.election_timeout_ticks} <= {self.heartbeat_interval_ticks})",
        )
        for name in (
            "max_entries_per_message_bytes",
            "max_inflight_messages",
            "max_inflight_bytes",
            "max_uncommitted_entries_bytes",
            "max_entry_data_bytes",
            "max_committed_entries_per_ready_bytes",
            "max_pending_read_index_requests",
            "max_snapshot_wait_ticks",
        ):
            value = getattr(self, name)
            require(value >= 1, f"{name} must be >= 1, got {value}")
        require(
            self.max_snapshot_wait_ticks > self.election_timeout_ticks,
            "max_snapshot_wait_ticks must exceed election_timeout_ticks (a snapshot "
            "transfer takes at least a round trip)",
        )
        require(
            self.max_entry_data_bytes <= self.max_uncommitted_entries_bytes,
            "max_entry_data_bytes must not exceed max_uncommitted_entries_bytes "
            "(a proposal that large could never be accepted)",
        )
        require(
            self.read_only_mode != "lease_based" or self.check_quorum,
            "read_only_mode='lease_based' requires check_quorum=True: without it a "
            "deposed leader keeps serving reads from its stale lease",
        )
        require(
            self.read_only_mode != "lease_based"
            or self.election_timeout_ticks >= self.heartbeat_interval_ticks + 3,
            "read_only_mode='lease_based' needs election_timeout_ticks >= "
            "heartbeat_interval_ticks + 3: the lease lasts election_timeout_ticks - 2 "
            "ticks from the heartbeat a quorum answered, and must outlast the next one",
        )
