"""Settings of the table simulator (``_table_runner``): cluster shape, the
scheduler's bounds in virtual milliseconds, faults and the liveness bound.

The scheduler's production defaults are seconds to minutes (docs/table.md);
here they are scaled down so that a run (a few virtual seconds) sees nodes
declared dead, replaced, restarted and balanced. The ratios keep the
production order: heartbeat < dead < replace < change timeout.
"""

from __future__ import annotations

from quorumlog.config import Config, require
from quorumlog.errors import UsageError
from quorumlog.sim._config import FaultMix


class TableSimConfig(Config, frozen=True):
    """Shape and timing of one table simulator run."""

    nodes: int = 0  # 0: 5, 6 or 7 table nodes, drawn from the seed
    groups: int = 6  # partition groups (one partition = one Raft group)
    replicas: int = 3  # the table's replica count the scheduler restores
    # Zones the nodes are spread over (node n in zone (n - 1) % zones); 0: drawn
    # from the seed, half the runs one zone per node, the rest 2 or 3 zones with
    # several nodes each, so that placement has zones to respect.
    zones: int = 0
    # A group starts with 1, 2 or 4 voters instead of `replicas` (a table created
    # with fewer live nodes than its count, a voter removed for good, one added by
    # hand): the scheduler must bring it to `replicas`.
    odd_size_group_probability: float = 0.3

    tick_interval_ms: int = 10  # one Raft tick
    election_timeout_ticks: int = 10
    heartbeat_interval_ticks: int = 3

    # The scheduler (production `SchedulerConfig` fields, scaled to a short run).
    table_heartbeat_interval_ms: int = 100  # node -> scheduler; also the record sync pace
    node_dead_after_ms: int = 400
    replace_dead_after_ms: int = 800
    catchup_entries_max: int = 20
    changes_per_node_max: int = 2
    change_timeout_ms: int = 2_000
    # The executor gives up a membership change not applied by then
    # (production: `CHANGE_TIMEOUT_S`, 30 s).
    executor_change_timeout_ms: int = 1_500

    active_ms: int = 4_000  # faults during [0, active_ms); then partitions heal, nodes restart
    # Nodes crashed for good during the active period (their replicas must be replaced);
    # at most one, so that no group can lose two replicas for good (a lost quorum is
    # not something a scheduler can repair).
    permanent_crashes: int = 1
    # The permanent fault is then a wiped disk instead: the node restarts under its
    # old id with its table Raft data gone (not in the dup mix).
    wipe_probability: float = 0.3
    crash_probability_per_tick: float = 0.004
    temporary_crashed_nodes_max: int = 2
    downtime_ms_min: int = 50
    downtime_ms_max: int = 1_500  # longer than replace_dead_after_ms: some come back replaced
    partition_probability_per_tick: float = 0.003
    partition_scheduler_probability: float = 0.3  # the scheduler's endpoint is on one side
    partition_duration_ms_min: int = 100
    partition_duration_ms_max: int = 800
    failover_probability_per_tick: float = 0.001  # a new meta leader: a fresh, empty Scheduler
    failover_at_heal_probability: float = 0.3
    # An operator drains a node (``table drain``; at most one at a time, so that
    # enough nodes stay placeable), or ends the drain; the settled cluster must
    # have no replica on a drained node.
    drain_probability_per_tick: float = 0.002
    undrain_probability: float = 0.3  # a drain event ends the current drain instead
    compaction_probability_per_tick: float = 0.02  # a replica snapshots and compacts its log
    snapshot_min_entries: int = 5
    compaction_keep_entries_max: int = 4

    write_interval_ms: int = 15  # a group's writer waits this long between writes
    write_attempt_timeout_ms: int = 80  # then it retries at the next replica

    # The dup mix (docs/sim.md, "Duplication"): partitions run table replicas
    # (RocksDB) and duplicate to a remote cluster.
    dup: bool = False
    dup_ship_interval_ms: int = 40  # a leader's shipper steps this often
    dup_block_entries_max: int = 8  # production `dup_block_entries_max` (scaled down)
    dup_block_bytes_max: int = 64 * 1024
    dup_skip_mode_probability: float = 0.3  # the run's fail mode is skip (else slow)
    remote_outage_probability_per_tick: float = 0.005
    remote_outage_ms_min: int = 50
    remote_outage_ms_max: int = 800
    tombstone_gc_interval_ms: int = 150  # a leader proposes a CollectGarbage entry
    tombstone_gc_delay_ms: int = 100  # production `tombstone_gc_delay_ms`, scaled down
    snapshot_log_tail_bytes_max: int = 1 << 20
    dup_hash_keys: int = 3  # writers write hash_keys x sort_keys keys per group:
    dup_sort_keys: int = 4  # overwrites and deletes, so last-writer-wins decides
    dup_delete_probability: float = 0.3
    # A writer's write shares its log entry with another client's write to the
    # group (RaftHost combines the writes of one ready pass, combine_entries).
    dup_combine_probability: float = 0.4

    # After the heal: within this bound every group has `replicas` voters on live
    # nodes, no learners, its record in step, and every acknowledged write on every voter.
    liveness_bound_ms: int = 10_000
    run_events_max: int = 4_000_000

    def validate(self) -> None:
        require(self.nodes == 0 or 4 <= self.nodes <= 9, "nodes must be 0 (5-7) or 4..9")
        require(1 <= self.groups <= 64, "groups must be in 1..64")
        require(self.replicas == 3, "the table simulator runs 3-replica groups")
        require(0 <= self.zones <= 9, "zones must be 0 (drawn from the seed) or 1..9")
        require(0 <= self.permanent_crashes <= 1, "permanent_crashes must be 0 or 1")
        require(self.replace_dead_after_ms >= self.node_dead_after_ms,
                "replace_dead_after_ms must be >= node_dead_after_ms")
        require(0 < self.downtime_ms_min <= self.downtime_ms_max,
                "downtime bounds must satisfy 0 < min <= max")
        require(0 < self.partition_duration_ms_min <= self.partition_duration_ms_max,
                "partition duration bounds must satisfy 0 < min <= max")
        for name in ("crash_probability_per_tick", "partition_probability_per_tick",
                     "partition_scheduler_probability", "failover_probability_per_tick",
                     "failover_at_heal_probability", "compaction_probability_per_tick",
                     "dup_skip_mode_probability", "remote_outage_probability_per_tick",
                     "dup_delete_probability", "odd_size_group_probability",
                     "dup_combine_probability", "wipe_probability"):
            value = getattr(self, name)
            require(0.0 <= value <= 1.0, f"{name} must be a probability in [0, 1]")
        require(0 < self.remote_outage_ms_min <= self.remote_outage_ms_max,
                "remote outage bounds must satisfy 0 < min <= max")
        require(self.dup_block_entries_max >= 1 and self.dup_block_bytes_max >= 1,
                "dup block bounds must be >= 1")
        require(self.dup_hash_keys >= 1 and self.dup_sort_keys >= 1,
                "dup_hash_keys and dup_sort_keys must be >= 1")
        require(self.active_ms > 0 and self.liveness_bound_ms > 0, "run times must be > 0")


TABLE_NETWORK = FaultMix(
    name="table",
    message_delay_ms_min=1,
    message_delay_ms_max=8,
    message_delay_tail_probability=0.02,
    message_delay_tail_ms_max=80,
    message_drop_probability=0.02,
    message_duplicate_probability=0.01,
)
"""The network and disks of a table run (the nemesis is the table runner's own)."""


TABLE_MIXES = ("scheduler", "dup")
"""The table simulator's mixes: ``scheduler`` (the default config) and ``dup``
(partitions as table replicas duplicating to a remote cluster, with more
compactions so that the log floor, snapshot tails and GC meet shipping lag)."""


def table_config_for_mix(mix: str) -> TableSimConfig:
    """The config a mix runs with (a UsageError names the mixes)."""
    if mix == "scheduler":
        return TableSimConfig()
    if mix == "dup":
        return TableSimConfig(dup=True, compaction_probability_per_tick=0.06)
    raise UsageError(f"unknown table simulator mix {mix!r}; the mixes are "
                     f"{', '.join(TABLE_MIXES)}")
