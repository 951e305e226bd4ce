"""Simulation settings: a :class:`FaultMix` (what goes wrong, how often) and a
:class:`SimConfig` (cluster size, run length, clients, Raft timing).

All probabilities are per opportunity (per message, per nemesis tick, per
crash); all times are virtual milliseconds or Raft ticks, as the names say.
The named mixes in :data:`MIXES` are what the default tests and
``quorumlog sim raft --mix NAME`` run.
"""

from __future__ import annotations

from quorumlog.config import Config, require
from quorumlog.errors import ConfigError


def _probability(name: str, value: float) -> None:
    require(0.0 <= value <= 1.0, f"{name} must be a probability in [0, 1], got {value}")


class FaultMix(Config, frozen=True):
    """What the network, disks and the nemesis do to a run."""

    name: str = "calm"

    # Network: every message gets a delay in [min, max]; a "tail" fraction gets
    # a long delay (reordering, stale messages arriving after restarts).
    message_delay_ms_min: int = 1
    message_delay_ms_max: int = 6
    message_delay_tail_probability: float = 0.0
    message_delay_tail_ms_max: int = 60
    message_drop_probability: float = 0.0
    message_duplicate_probability: float = 0.0

    # Partitions (between Raft nodes; clients reach every node that is up).
    partition_probability_per_tick: float = 0.0
    partition_one_way_probability: float = 0.3  # else symmetric
    partition_isolate_leader_probability: float = 0.4  # else a random split
    partition_duration_ms_min: int = 50
    partition_duration_ms_max: int = 400

    # Crashes: random ones, plus targeted ones right after the riskiest moments.
    crash_probability_per_tick: float = 0.0
    crash_leader_probability: float = 0.5  # a random crash hits the leader
    crash_after_vote_probability: float = 0.0  # a node that just granted a vote
    crash_after_append_ack_probability: float = 0.0  # a follower that just acked
    crash_leader_after_append_probability: float = 0.0  # leader before replicating
    crashed_nodes_max: int = 2
    downtime_ms_min: int = 5
    downtime_ms_max: int = 300

    # Disks: on crash, how much of the unsynced tail reached the platter.
    unsynced_tail_survives_probability: float = 0.3  # else all of it is lost
    torn_write_probability: float = 0.5  # the last surviving write is a prefix
    background_flush_probability_per_tick: float = 0.02  # the OS syncs a disk

    # Cluster operations started by the nemesis on the current leader.
    membership_change_probability_per_tick: float = 0.0
    leader_transfer_probability_per_tick: float = 0.0
    compaction_probability_per_tick: float = 0.02

    # Raft flow control: small messages make "commit by counting replicas of
    # an old-term entry" observable (Raft paper, Figure 8).
    small_messages_probability: float = 0.0

    # Client pace: the longest pause between two operations of one client
    # (0: SimConfig.client_think_ms_max). Long pauses leave the group idle, so
    # quiescent runs (SimConfig.quiesce_probability) quiesce between bursts.
    client_think_ms_max: int = 0

    def validate(self) -> None:
        for name in (
            "message_delay_tail_probability", "message_drop_probability",
            "message_duplicate_probability", "partition_probability_per_tick",
            "partition_one_way_probability", "partition_isolate_leader_probability",
            "crash_probability_per_tick", "crash_leader_probability",
            "crash_after_vote_probability", "crash_after_append_ack_probability",
            "crash_leader_after_append_probability", "unsynced_tail_survives_probability",
            "torn_write_probability", "background_flush_probability_per_tick",
            "membership_change_probability_per_tick", "leader_transfer_probability_per_tick",
            "compaction_probability_per_tick", "small_messages_probability",
        ):
            _probability(name, getattr(self, name))
        require(self.client_think_ms_max >= 0, "client_think_ms_max must be >= 0")
        require(
            0 <= self.message_delay_ms_min <= self.message_delay_ms_max,
            "message delay bounds must satisfy 0 <= min <= max",
        )
        require(
            self.message_delay_tail_ms_max >= self.message_delay_ms_max,
            "message_delay_tail_ms_max must be at least message_delay_ms_max",
        )
        require(
            0 < self.partition_duration_ms_min <= self.partition_duration_ms_max,
            "partition duration bounds must satisfy 0 < min <= max",
        )
        require(
            0 < self.downtime_ms_min <= self.downtime_ms_max,
            "downtime bounds must satisfy 0 < min <= max",
        )
        require(self.crashed_nodes_max >= 0, "crashed_nodes_max must be >= 0")


class SimConfig(Config, frozen=True):
    """Shape of one run: cluster, clients, timing, bounds of the checks."""

    nodes: int = 3
    nodes_extra_max: int = 2  # membership changes may grow the cluster by this many
    voters_min: int = 3  # membership changes never shrink the voters below this

    tick_interval_ms: int = 10  # one Raft tick
    election_timeout_ticks: int = 10
    heartbeat_interval_ticks: int = 3
    active_ms: int = 2_000  # faults are injected during this period; then all heals
    run_events_max: int = 2_000_000  # safety bound on the event loop

    clients: int = 3
    keys: int = 3
    client_think_ms_max: int = 50
    client_attempt_timeout_ms: int = 60  # per try, then retry elsewhere
    client_operation_deadline_ms: int = 300  # then the outcome is unknown
    client_cas_probability: float = 0.25
    client_get_probability: float = 0.4
    client_delete_probability: float = 0.1  # the rest of the operations are puts
    read_index_probability: float = 0.5  # gets via ReadIndex, else via the log
    # An operation goes to a random node instead of the believed leader (a
    # follower redirects writes and forwards ReadIndex reads to its leader,
    # which may be a deposed one).
    client_random_target_probability: float = 0.2

    # Per run, drawn from the seed: Raft options on or off (both must be safe).
    pre_vote_probability: float = 0.7
    check_quorum_probability: float = 0.7
    # Quiescence of idle groups (RaftConfig.quiesce_idle) with process-level
    # liveness beats between hosts, as RaftHost runs it. Drawn from a generator
    # of its own, so runs without it are the runs of before.
    quiesce_probability: float = 0.5

    snapshot_min_entries: int = 8  # compaction needs this many applied entries
    compaction_keep_entries_max: int = 4  # entries left before the snapshot point
    node_removal_grace_ms: int = 200  # a removed node keeps running this long

    # After healing (liveness). Elections are only probably fast: without
    # pre-vote, stale candidates keep bumping the term and resetting the timer
    # of the one node that could win, each round with some constant chance, so
    # the election bound is generous (about 30 election rounds); a run ends as
    # soon as it has settled, so only a slow run pays for it.
    liveness_election_bound_ms: int = 5_000
    # Clients keep going this long once a leader is seen (longer than an
    # operation deadline, so one stuck since before the heal gives up and retries).
    liveness_client_window_ms: int = 400
    # Then within this bound: every client answered, the leader's log committed
    # and applied by every running member.
    liveness_commit_bound_ms: int = 1_000

    linearizability_step_limit: int = 2_000_000

    def validate(self) -> None:
        require(1 <= self.nodes <= 9, f"nodes must be in [1, 9], got {self.nodes}")
        require(self.nodes_extra_max >= 0, "nodes_extra_max must be >= 0")
        require(self.voters_min >= 1, "voters_min must be >= 1")
        require(self.tick_interval_ms > 0, "tick_interval_ms must be positive")
        require(
            self.election_timeout_ticks > self.heartbeat_interval_ticks > 0,
            "election_timeout_ticks must exceed heartbeat_interval_ticks > 0",
        )
        require(self.active_ms >= 0, "active_ms must be >= 0")
        require(
            min(self.liveness_election_bound_ms, self.liveness_client_window_ms,
                self.liveness_commit_bound_ms) > 0,
            "liveness bounds must be positive",
        )
        require(
            self.liveness_client_window_ms > self.client_operation_deadline_ms
            and self.liveness_commit_bound_ms > self.client_operation_deadline_ms,
            "liveness client window and commit bound must exceed the client operation deadline",
        )
        require(self.clients >= 1 and self.keys >= 1, "need at least one client and key")
        require(
            0 < self.client_attempt_timeout_ms <= self.client_operation_deadline_ms,
            "client attempt timeout must be positive and within the operation deadline",
        )
        for name in ("client_cas_probability", "client_get_probability",
                     "client_delete_probability",
                     "read_index_probability", "pre_vote_probability",
                     "client_random_target_probability",
                     "check_quorum_probability", "quiesce_probability"):
            _probability(name, getattr(self, name))
        require(
            self.client_cas_probability + self.client_get_probability
            + self.client_delete_probability <= 1.0,
            "client_cas_probability + client_get_probability + client_delete_probability "
            "must be <= 1",
        )
        require(self.linearizability_step_limit > 0, "linearizability_step_limit > 0")


_CRASHES = FaultMix(
    name="crashes",
    crash_probability_per_tick=0.02,
    crash_after_vote_probability=0.25,
    crash_after_append_ack_probability=0.02,
    crash_leader_after_append_probability=0.05,
    downtime_ms_min=5,
    downtime_ms_max=250,
    message_delay_tail_probability=0.05,
    message_duplicate_probability=0.02,
    background_flush_probability_per_tick=0.01,
)

MIXES: dict[str, FaultMix] = {
    "calm": FaultMix(name="calm"),
    "lossy": FaultMix(
        name="lossy",
        message_delay_ms_max=12,
        message_delay_tail_probability=0.05,
        message_drop_probability=0.1,
        message_duplicate_probability=0.05,
    ),
    "partitions": FaultMix(
        name="partitions",
        message_delay_tail_probability=0.02,
        partition_probability_per_tick=0.03,
        partition_isolate_leader_probability=0.6,
        partition_duration_ms_max=600,
        small_messages_probability=0.3,
    ),
    "crashes": _CRASHES,
    "figure8": _CRASHES.replace(
        name="figure8",
        crash_leader_after_append_probability=0.25,
        crash_leader_probability=0.8,
        downtime_ms_max=120,
        partition_probability_per_tick=0.02,
        partition_isolate_leader_probability=0.8,
        small_messages_probability=1.0,
    ),
    "churn": FaultMix(
        name="churn",
        membership_change_probability_per_tick=0.03,
        leader_transfer_probability_per_tick=0.02,
        compaction_probability_per_tick=0.05,
        message_delay_tail_probability=0.02,
    ),
    # Idle groups: clients pause long enough for the group to quiesce between
    # bursts, and quiesced groups meet crashes (the leader's too) and partitions.
    "idle": _CRASHES.replace(
        name="idle",
        client_think_ms_max=150,
        crash_probability_per_tick=0.01,
        crash_leader_probability=0.7,
        partition_probability_per_tick=0.02,
        partition_isolate_leader_probability=0.6,
    ),
    "everything": _CRASHES.replace(
        name="everything",
        message_drop_probability=0.05,
        partition_probability_per_tick=0.02,
        membership_change_probability_per_tick=0.02,
        leader_transfer_probability_per_tick=0.01,
        compaction_probability_per_tick=0.05,
        small_messages_probability=0.3,
    ),
}
"""The named fault mixes; ``quorumlog sim raft --mix all`` rotates through them by seed."""

MIX_ROTATION: tuple[str, ...] = tuple(MIXES)


def mix_for_seed(name: str, seed: int) -> FaultMix:
    """The mix named ``name``, or for ``"all"`` the one the seed rotates to."""
    if name == "all":
        return MIXES[MIX_ROTATION[seed % len(MIX_ROTATION)]]
    if name not in MIXES:
        raise ConfigError(
            f"unknown fault mix {name!r}; choose one of: all, {', '.join(MIXES)}"
        )
    return MIXES[name]
