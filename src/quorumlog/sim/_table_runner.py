"""The table simulator: the production scheduler and partition Raft groups,
with crashes, partitions and a scheduler failover, on a virtual clock.

A run is a pure function of ``(seed, config)``. The world:

- N table nodes (5-7), each hosting replicas of G partition groups (3 replicas
  each). A replica is a :class:`SimRaftHost` (the production ``RaftNode`` and
  ``ReadyPass`` on a simulated disk, ``_host``), one per (node, group); every
  group has its own Raft invariants. Raft messages travel between *nodes*
  through one faulty :class:`SimNetwork`, so a partition or crash of a node
  hits every group it hosts, as in a multi-raft process.
- The scheduler is the production :class:`~quorumlog.table.Scheduler` (meta as
  Curve's MDS) at its own network endpoint. Every node sends it a heartbeat
  every ``table_heartbeat_interval_ms`` (a ``NodeReport`` made of
  ``table.report_of`` per replica, as ``TableService.node_report`` does); it
  folds the report in, plans, and answers with the changes for the groups the
  node leads, as ``SchedulerService`` does. A failover replaces it with a
  fresh, empty ``Scheduler`` (what a new meta leader has).
- Each node carries the changes out like ``ChangeExecutor``: the production
  rule ``table.change_outcome`` (leader only, epoch must match, one change per
  group at a time), ``table.conf_change_of`` for the Raft change; a
  membership change runs until it is applied on the leader, leadership is
  lost, or the executor timeout passes.
- Partition records (members, learners, epoch) are kept as the scheduler
  service keeps them (``table.updated_record``, every heartbeat
  interval); nodes reconcile with them as ``TableService`` does: a node named
  in a record opens the replica (founding members bootstrap a record of epoch
  0, later ones join empty), a node no longer named drops it and its files.
- One writer per group writes unique keys (a meta ``Txn`` put on the group's
  ``MetaStateMachine``) to the believed leader, retrying elsewhere on
  rejection or timeout; an acknowledged write must be on every voter at the end.

Timeline: faults during ``[0, active_ms)`` - temporary crashes (disks lose
unsynced tails), one node crashed for good, partitions (some cut the
scheduler off), message loss and delays, scheduler failovers, log
compactions. At ``active_ms`` partitions and message loss end, temporary
crashes restart, writers stop. Within ``liveness_bound_ms`` every group must
be back to 3 voters on live nodes with no learners, its record in step, and
every acknowledged write applied on every voter.
"""

from __future__ import annotations

import functools
import hashlib
import random
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import msgspec

from quorumlog.errors import InvariantViolation, invariant
from quorumlog.meta import MetaStateMachine, PutOp, RangeOp, Request, Txn
from quorumlog.raft import (
    CompactedError,
    ConfChangeError,
    ConfChangePendingError,
    ConfState,
    Message,
    ProposalDroppedError,
    RaftConfig,
    RaftNode,
    Role,
    format_message,
)
from quorumlog.sim._client import ClientOp, ClientRequest, ClientResponse
from quorumlog.sim._clock import TimerQueue, VirtualClock
from quorumlog.sim._host import Outbox, SimRaftHost
from quorumlog.sim._invariants import RaftInvariants, SimInvariantViolation, fail
from quorumlog.sim._network import SimNetwork
from quorumlog.sim._table_config import TABLE_NETWORK, TableSimConfig, table_config_for_mix
from quorumlog.sim._table_dup import (
    SOURCE_CLUSTER_ID,
    DupWorld,
    RunFiles,
    SimTableReplica,
    live_records,
    stamp_proposal,
    write_payload,
)
from quorumlog.sim._trace import Tracer
from quorumlog.table import (
    ChangeKind,
    ChangeOutcome,
    ClusterLoad,
    FailMode,
    LostReplicas,
    NodeCandidate,
    NodeReport,
    PartitionRecord,
    ScheduledChange,
    Scheduler,
    SchedulerConfig,
    TableConfig,
    change_outcome,
    collection_entry,
    conf_change_of,
    encode_entry,
    keeps_replica,
    place_replicas,
    report_of,
    updated_record,
)

SCHEDULER_ENDPOINT = 0
"""The scheduler's network endpoint (table nodes are 1..N)."""

WRITER_ENDPOINT = 10_000
# Client ids of the dup mix's second client per group (``_companion_write``);
# a group's writer has the group id as its client id.
COMPANION_CLIENT_ID_BASE = 1 << 32
"""The writers' endpoint; responses carry their group id."""

GROUP_BYTES_PAGE_RECORDS = 1_000  # a leader's size is summed over pages this long
GROUP_BYTES_PAGE_BYTES = 1 << 20

SAFE_VOTERS_MIN = 3
"""A node stays dead for good only if every group it votes in has this many voters."""

_ENCODER = msgspec.msgpack.Encoder()


# -- what travels on the network ----------------------------------------------


DRAIN_RNG_SALT = 0x6472_6169_6E  # "drain"


@dataclass(frozen=True, slots=True)
class _RaftPacket:
    group_id: int
    message: Message


@dataclass(frozen=True, slots=True)
class _Write:
    group_id: int
    request: ClientRequest


@dataclass(frozen=True, slots=True)
class _WriteAnswer:
    group_id: int
    response: ClientResponse


@dataclass(frozen=True, slots=True)
class _Heartbeat:
    report: NodeReport


@dataclass(frozen=True, slots=True)
class _HeartbeatAnswer:
    changes: tuple[ScheduledChange, ...]
    # dup mix: every partition's confirmed_decree as meta holds it (the node's
    # periodic read of /dup-progress/).
    progress: tuple[tuple[int, int], ...] = ()


_Packet = _RaftPacket | _Write | _WriteAnswer | _Heartbeat | _HeartbeatAnswer


# -- the world ----------------------------------------------------------------


@dataclass(slots=True)
class _Running:
    """A membership change the node's executor carries out (``ChangeExecutor._run``)."""

    change: ScheduledChange
    term: int
    index: int
    deadline_ms: int


@dataclass(slots=True)
class _TableNode:
    node_id: int
    up: bool = True
    dead_for_good: bool = False
    replicas: dict[int, SimRaftHost] = field(default_factory=dict)  # group id -> replica
    running: dict[int, _Running] = field(default_factory=dict)  # group id -> change
    # After its disk was wiped: what it decides about its old replicas, as
    # TableService does (table.LostReplicas).
    lost: LostReplicas | None = None


@dataclass(slots=True)
class _Writer:
    """One group's writer: one write at a time, retried until acknowledged."""

    group_id: int
    seq: int = 0
    target: int = 0
    request: ClientRequest | None = None
    attempt_deadline_ms: int = 0
    acked: list[tuple[str, str]] = field(default_factory=list)
    # dup mix: the write in flight and the last acknowledged value of each key
    # (None: deleted).
    op: tuple[tuple[bytes, bytes], bytes | None] | None = None
    last_acked: dict[tuple[bytes, bytes], bytes | None] = field(default_factory=dict)


@dataclass(slots=True)
class _Stats:
    events: int = 0
    crashes: int = 0
    restarts: int = 0
    wipes: int = 0
    partitions: int = 0
    failovers: int = 0
    drains: int = 0
    heartbeats: int = 0
    changes_issued: int = 0
    changes_started: int = 0
    changes_applied: int = 0
    changes_failed: int = 0
    stale_ignored: int = 0
    records_written: int = 0
    replicas_opened: int = 0
    replicas_dropped: int = 0
    writes_acked: int = 0
    compactions: int = 0
    floor_checks: int = 0
    groups_started_odd: int = 0  # groups whose first voter count was not the table's
    group_bytes_reported_max: int = 0  # the largest size a leader reported


@dataclass(frozen=True, slots=True)
class TableSimResult:
    """What one seed did: passed, or which check failed and how."""

    seed: int
    nodes: int
    groups: int
    violation: str | None
    detail: str
    end_ms: int
    fingerprint: str
    trace_hash: str
    stats: dict[str, int]
    trace: tuple[str, ...] = ()
    mix: str = "scheduler"

    @property
    def passed(self) -> bool:
        return self.violation is None


class TableSimulation:
    """One run; ``run()`` returns a :class:`TableSimResult` and never raises for a bug."""

    def __init__(self, seed: int, config: TableSimConfig | None = None, *,
                 keep_trace: bool = False) -> None:
        config = config or TableSimConfig()
        config.validate()
        self.seed = seed
        self.config = config
        root = random.Random(seed)
        self._nemesis = random.Random(root.getrandbits(64))
        self._disk_rng = random.Random(root.getrandbits(64))
        network_rng = random.Random(root.getrandbits(64))
        self._raft_seed = root.getrandbits(64)
        self._writer_rng = random.Random(root.getrandbits(64))
        # Drains draw from a stream of their own (derived from the seed, not from
        # ``root``): the other faults of a seed stay what they were before drains.
        self._drain_rng = random.Random(seed ^ DRAIN_RNG_SALT)
        self._pre_vote = root.random() < 0.7
        self._check_quorum = root.random() < 0.7
        self.node_count = config.nodes or 5 + root.randrange(3)
        zone_count = config.zones or (self.node_count if root.random() < 0.5
                                      else 2 + root.randrange(2))
        self.zone_of = {n: f"zone-{(n - 1) % zone_count}"
                        for n in range(1, self.node_count + 1)}
        placement_rng = random.Random(root.getrandbits(64))
        self.clock = VirtualClock()
        self.timers = TimerQueue()
        self.network: SimNetwork[_Packet] = SimNetwork(network_rng, TABLE_NETWORK)
        self.tracer = Tracer(keep_lines=keep_trace)
        self.stats = _Stats()
        self.scheduler_config = SchedulerConfig(
            node_dead_after_ms=config.node_dead_after_ms,
            replace_dead_after_ms=config.replace_dead_after_ms,
            catchup_entries_max=config.catchup_entries_max,
            changes_per_node_max=config.changes_per_node_max,
            change_timeout_ms=config.change_timeout_ms,
        )
        self.scheduler = Scheduler(self.scheduler_config, started_ms=0)
        self.nodes = {n: _TableNode(n) for n in range(1, self.node_count + 1)}
        self.invariants: dict[int, RaftInvariants] = {}
        self.records: dict[int, PartitionRecord] = {}
        self.writers: dict[int, _Writer] = {}
        # Placed as ``create_table`` places a table's partitions (zones, scatter width,
        # load); some groups start with another voter count than the table's.
        candidates = [NodeCandidate(n, self.zone_of[n]) for n in sorted(self.nodes)]
        load = ClusterLoad.of(())
        for gid in range(1, config.groups + 1):
            size = config.replicas
            if root.random() < config.odd_size_group_probability:
                size = min(root.choice((1, 2, config.replicas + 1)), self.node_count)
            members = tuple(sorted(place_replicas(candidates, size, load, rng=placement_rng)))
            load.add(members)
            self.stats.groups_started_odd += int(size != config.replicas)
            self.records[gid] = PartitionRecord(members=members)
            self.invariants[gid] = RaftInvariants()
            self.writers[gid] = _Writer(gid, target=members[0])
        self._files: RunFiles | None = None
        self.dup: DupWorld | None = None
        if config.dup:
            fail_mode = (FailMode.SKIP if root.random() < config.dup_skip_mode_probability
                         else FailMode.SLOW)
            self._dup_rng = random.Random(root.getrandbits(64))
            self._combine_rng = random.Random(root.getrandbits(64))
            self._companion_seqs: dict[int, int] = {}
            self._files = RunFiles()
            self.dup = DupWorld(self._files, config.groups, fail_mode)
        self._healed = False
        self._heal_ms = -1
        self._partition_active = False
        self.draining: set[int] = set()  # the node an operator drains (at most one)
        self._done = False
        for node in self.nodes.values():
            self._reconcile(node)

    # == the loop =============================================================

    def run(self) -> TableSimResult:
        try:
            self._schedule()
            self._loop()
        except SimInvariantViolation as exc:
            return self._result(exc.name, exc.detail)
        except InvariantViolation as exc:
            return self._result("internal-invariant", f"{exc.message} (at {_where(exc)})")
        except Exception as exc:  # the code under test crashed: a failing seed
            return self._result("exception", f"{type(exc).__name__}: {exc} (at {_where(exc)})")
        finally:
            if self._files is not None:
                self._files.close()
        return self._result(None, "")

    def _schedule(self) -> None:
        config, rng = self.config, self._nemesis
        for node in self.nodes.values():
            self.timers.schedule(rng.randrange(config.tick_interval_ms),
                                 functools.partial(self._tick_node, node))
            self.timers.schedule(rng.randrange(config.table_heartbeat_interval_ms),
                                 functools.partial(self._heartbeat_timer, node))
        for gid in sorted(self.writers):
            self.timers.schedule(rng.randrange(config.write_interval_ms) + 1,
                                 functools.partial(self._writer_timer, gid))
        self.timers.schedule(config.tick_interval_ms, self._nemesis_tick)
        self.timers.schedule(config.table_heartbeat_interval_ms, self._sync_records)
        for _ in range(config.permanent_crashes):
            at = rng.randint(config.active_ms // 10, config.active_ms // 2)
            wipe = not config.dup and rng.random() < config.wipe_probability
            self.timers.schedule(at, self._crash_and_wipe if wipe else self._crash_for_good)
        self.timers.schedule(config.active_ms, self._heal)
        if self.dup is not None:
            self.timers.schedule(config.dup_ship_interval_ms, self._ship_timer)
            self.timers.schedule(config.tombstone_gc_interval_ms, self._gc_timer)

    def _loop(self) -> None:
        end_ms = self.config.active_ms + self.config.liveness_bound_ms
        clock, timers, network, stats = self.clock, self.timers, self.network, self.stats
        while not self._done:
            due_timer, due_message = timers.next_due_ms(), network.next_delivery_ms()
            candidates = [t for t in (due_timer, due_message) if t is not None]
            if not candidates:
                break
            next_ms = min(candidates)
            if next_ms >= end_ms:
                break
            clock.advance_to(next_ms)
            while (callback := timers.pop_due(next_ms)) is not None:
                stats.events += 1
                callback()
            for envelope in network.pop_due(next_ms):
                stats.events += 1
                self._deliver(envelope.source, envelope.target, envelope.payload)
            if stats.events >= self.config.run_events_max:
                fail("run-bounded", f"more than {self.config.run_events_max} events")
        if not self._done:
            fail("liveness-replicas",
                 f"{self.config.liveness_bound_ms} ms after the heal: {self._unsettled()}")

    # == replicas =============================================================

    def _open_replica(self, node: _TableNode, gid: int, record: PartitionRecord) -> None:
        """``TableService._open_replica``: founding members of an epoch-0 record
        bootstrap the group, every later replica joins empty."""
        joining = record.epoch > 0 or node.node_id not in record.members
        bootstrap = None if joining else ConfState(voters=frozenset(record.members))
        invariants = self.invariants[gid]
        # A replica dropped earlier and assigned again starts from nothing (its files
        # were deleted): a new life for the checks that follow one node's history.
        invariants.nodes.pop(node.node_id, None)
        raft_config = RaftConfig(
            node_id=node.node_id,
            election_timeout_ticks=self.config.election_timeout_ticks,
            heartbeat_interval_ticks=self.config.heartbeat_interval_ticks,
            pre_vote=self._pre_vote, check_quorum=self._check_quorum,
            broadcast_commit=TableConfig().broadcast_commit)  # as TableService adds groups
        outbox = Outbox(
            send_raft=functools.partial(self._send_raft, gid),
            send_client=functools.partial(self._send_write_answer, node.node_id, gid),
            send_beat=_no_beat,  # table groups here run without quiescence
            on_sent=_nothing_on_sent,
            dies_before_send=_never_dies,
            trace=functools.partial(self._trace_group, gid) if self.tracer.enabled else None)
        host = SimRaftHost(
            node_id=node.node_id, raft_config=raft_config, bootstrap=bootstrap,
            invariants=invariants, outbox=outbox,
            rng=random.Random(self._raft_seed ^ (gid << 16) ^ node.node_id
                              ^ (self.stats.replicas_opened << 32)))
        dup, files = self.dup, self._files
        if dup is not None and files is not None:
            host.machine_factory = functools.partial(SimTableReplica, files, SOURCE_CLUSTER_ID)
            host.prepare_proposal = functools.partial(self._stamp, gid)
            host.compaction_floor = functools.partial(dup.floor, node.node_id, gid)
            host.snapshot_log_tail_bytes_max = self.config.snapshot_log_tail_bytes_max
        node.replicas[gid] = host
        self.stats.replicas_opened += 1
        host.start()
        self._trace(f"OPEN replica g{gid} on node {node.node_id}"
                    + (" (joining)" if joining else " (founding)"))

    def _drop_replica(self, node: _TableNode, gid: int) -> None:
        host = node.replicas.pop(gid)
        node.running.pop(gid, None)
        if host.up:
            host.crash(self._disk_rng, TABLE_NETWORK)
        host.decommissioned = True
        self.stats.replicas_dropped += 1
        self._trace(f"DROP replica g{gid} on node {node.node_id}")

    def _reconcile(self, node: _TableNode) -> None:
        """``TableService._reconcile``: open what the records name, drop the rest."""
        if not node.up:
            return
        lost = {} if node.lost is None else node.lost.update(self.records, node.replicas.keys())
        for gid, record in sorted(self.records.items()):
            if node.node_id in record.replicas and gid not in node.replicas and gid not in lost:
                self._open_replica(node, gid, record)
        for gid in sorted(node.replicas):
            record, host = self.records[gid], node.replicas[gid]
            if node.node_id in record.replicas:
                continue
            if host.up and keeps_replica(node.node_id, record, group_epoch=host.raft.epoch,
                                         group_members=host.raft.conf_state.members()):
                continue  # the record lags the group
            self._drop_replica(node, gid)

    def _tick_node(self, node: _TableNode) -> None:
        if node.dead_for_good:
            return
        self.timers.schedule(self.clock.now_ms + self.config.tick_interval_ms,
                             functools.partial(self._tick_node, node))
        if not node.up:
            return
        for gid in sorted(node.replicas):
            host = node.replicas.get(gid)
            if host is not None and host.up:
                host.tick()
        self._check_running(node)

    def _deliver(self, source: int, target: int, payload: _Packet) -> None:
        if target == WRITER_ENDPOINT:
            if isinstance(payload, _WriteAnswer):
                self._on_write_answer(payload)
            return
        if target == SCHEDULER_ENDPOINT:
            if isinstance(payload, _Heartbeat):
                self._on_heartbeat(source, payload.report)
            return
        node = self.nodes[target]
        if not node.up:
            return
        if isinstance(payload, _HeartbeatAnswer):
            if self.dup is not None:
                self.dup.learn(node.node_id, payload.progress)
            for change in payload.changes:
                self._submit(node, change)
            return
        gid = payload.group_id if isinstance(payload, _RaftPacket | _Write) else 0
        host = node.replicas.get(gid)
        if host is None or not host.up:
            return  # not hosted (yet, or any more): production answers "not hosted"
        if isinstance(payload, _RaftPacket):
            host.deliver(payload.message)
        elif isinstance(payload, _Write):
            host.on_client_request(payload.request)
        self._check_running(node)

    def _send_raft(self, gid: int, message: Message) -> None:
        if self.tracer.enabled:
            self._trace(f"g{gid} {format_message(message)}")
        self.network.send(self.clock.now_ms, message.from_, message.to,
                          _RaftPacket(gid, message))

    # == heartbeats and the scheduler =========================================

    def _heartbeat_timer(self, node: _TableNode) -> None:
        if node.dead_for_good:
            return
        self.timers.schedule(self.clock.now_ms + self.config.table_heartbeat_interval_ms,
                             functools.partial(self._heartbeat_timer, node))
        if not node.up:
            return
        groups = tuple(report_of(gid, host.raft, host.applied_index, self._group_bytes(host))
                       for gid, host in sorted(node.replicas.items()) if host.up)
        self.stats.group_bytes_reported_max = max(
            [self.stats.group_bytes_reported_max, *(g.size_bytes for g in groups)])
        report = NodeReport(node_id=node.node_id, address=f"sim:{node.node_id}",
                            zone=self.zone_of[node.node_id], disk_free_bytes=0, groups=groups,
                            lost_groups=tuple(sorted(
                                node.lost.groups or () if node.lost is not None else ())))
        self.stats.heartbeats += 1
        self.network.send(self.clock.now_ms, node.node_id, SCHEDULER_ENDPOINT,
                          _Heartbeat(report))

    def _group_bytes(self, host: SimRaftHost) -> int:
        """What a leader reports as its group's size (``group_report``: the leader
        only): the bytes of the keys and values its state machine holds. Production
        measures the replica's RocksDB directory, whose size depends on flushes and
        compactions; the logical bytes keep a run deterministic."""
        if host.raft.role is not Role.LEADER:
            return 0
        machine = host.machine
        if isinstance(machine, MetaStateMachine):
            kvs = machine.range(RangeOp(key="g", prefix=True)).kvs
            return sum(len(kv.key) + len(kv.value) for kv in kvs)
        if isinstance(machine, SimTableReplica):
            total, after = 0, None
            while True:
                page, after = machine.store.stored_page(after, GROUP_BYTES_PAGE_RECORDS,
                                                        GROUP_BYTES_PAGE_BYTES)
                total += sum(len(h) + len(s) + len(r.value) for h, s, r in page)
                if after is None:
                    return total
        return 0

    def _on_heartbeat(self, source: int, report: NodeReport) -> None:
        """``SchedulerService._on_heartbeat``, with checks on what the scheduler decides."""
        scheduler, now = self.scheduler, self.clock.now_ms
        scheduler.heartbeat(report, now)
        pending_before = set(scheduler.pending)
        issued = scheduler.plan(now)
        for change in issued:
            self.stats.changes_issued += 1
            self._trace(f"SCHEDULE g{change.group_id} {change.kind.value} node={change.node_id}"
                        f" remove={change.remove_node_id} epoch={change.epoch}: {change.reason}")
            self._check_decision(change)
            if change.group_id in pending_before:
                fail("scheduler-one-change-per-group",
                     f"group {change.group_id}: {change.kind.value} issued while another "
                     "change of the group is pending")
        busy: dict[int, int] = {}
        for pending in scheduler.pending.values():
            for n in pending.change.touches():
                busy[n] = busy.get(n, 0) + 1
        over = {n: c for n, c in busy.items() if c > self.scheduler_config.changes_per_node_max}
        if over:
            fail("scheduler-rate-limit", f"changes in flight per node over the limit: {over}")
        changes = tuple(scheduler.changes_for(report.node_id))
        progress = () if self.dup is None else self.dup.progress()
        self.network.send(now, SCHEDULER_ENDPOINT, source, _HeartbeatAnswer(changes, progress))

    def _sync_records(self) -> None:
        """``SchedulerService.sync_records``: settled configurations go into the records."""
        self.timers.schedule(self.clock.now_ms + self.config.table_heartbeat_interval_ms,
                             self._sync_records)
        changed = False
        self.scheduler.set_draining(frozenset(self.draining))
        for gid, record in sorted(self.records.items()):
            self.scheduler.set_replicas_target(gid, self.config.replicas)
            view = self.scheduler.groups.get(gid)
            new = None if view is None else updated_record(view, record)
            if new is None:
                continue
            self.records[gid] = new
            self.stats.records_written += 1
            changed = True
            self._trace(f"RECORD g{gid} members={list(new.members)} "
                        f"learners={list(new.learners)} epoch={new.epoch}")
        if changed:  # the nodes' watches fire
            for node in self.nodes.values():
                self._reconcile(node)

    # == the executor =========================================================

    def _submit(self, node: _TableNode, change: ScheduledChange) -> None:
        """``ChangeExecutor.submit`` on a simulated node."""
        gid = change.group_id
        if gid in node.running:
            return  # ChangeOutcome.BUSY
        host = node.replicas.get(gid)
        raft = host.raft if host is not None and host.up else None
        outcome = change_outcome(raft, change)
        if outcome is ChangeOutcome.STALE_EPOCH:
            self.stats.stale_ignored += 1
            self._trace(f"node {node.node_id} ignores stale g{gid} {change.kind.value} "
                        f"epoch={change.epoch}")
        if outcome is not ChangeOutcome.STARTED or host is None or raft is None:
            return
        self._check_change(node, raft, change)
        self.stats.changes_started += 1
        self._trace(f"node {node.node_id} starts g{gid} {change.kind.value} "
                    f"node={change.node_id} remove={change.remove_node_id}")
        if change.kind is ChangeKind.TRANSFER_LEADER:
            raft.transfer_leader(change.node_id)
            host.flush()
            return
        try:
            term, index = raft.propose_conf_change(conf_change_of(change))
        except (ProposalDroppedError, ConfChangePendingError, ConfChangeError) as exc:
            self.stats.changes_failed += 1
            self._trace(f"node {node.node_id} g{gid} change failed: {exc.message}")
            return
        node.running[gid] = _Running(change, term, index,
                                     self.clock.now_ms + self.config.executor_change_timeout_ms)
        host.flush()

    def _check_change(self, node: _TableNode, raft: RaftNode, change: ScheduledChange) -> None:
        """What a started change must respect, checked against the simulator's truth."""
        if raft.epoch != change.epoch:
            fail("stale-epoch-applied",
                 f"node {node.node_id} starts g{change.group_id} {change.kind.value} of epoch "
                 f"{change.epoch} at epoch {raft.epoch}")

    def _check_decision(self, change: ScheduledChange) -> None:
        """A change that removes a voter, judged by what the scheduler knew: it never
        removes a live voter while a dead one stays, nor below a live quorum."""
        scheduler, now = self.scheduler, self.clock.now_ms
        removed = change.remove_node_id if change.kind is ChangeKind.PROMOTE else (
            change.node_id if change.kind is ChangeKind.REMOVE else 0)
        view = scheduler.groups.get(change.group_id)
        if not removed or view is None or removed not in view.voters:
            return
        gid = change.group_id
        if scheduler.is_gone(gid, removed, now):  # dead, or its node lost the group's data
            return
        voters = set(view.voters) - {removed}
        if change.kind is ChangeKind.PROMOTE:
            voters.add(change.node_id)
        dead = sorted(v for v in view.voters if v != removed and scheduler.is_gone(gid, v, now))
        if dead:
            fail("scheduler-removes-live-voter",
                 f"g{change.group_id}: {change.kind.value} removes live voter {removed} and "
                 f"keeps voters {dead}, dead (or lost) in the scheduler's own view")
        alive = {v for v in voters if not scheduler.is_gone(gid, v, now)}
        if len(alive) < len(voters) // 2 + 1:
            fail("scheduler-quorum",
                 f"g{change.group_id}: {change.kind.value} removes live voter {removed}, "
                 f"leaving voters {sorted(voters)} with {sorted(alive)} alive: below a quorum")

    def _check_running(self, node: _TableNode) -> None:
        """A membership change ends when applied on the leader, when leadership is
        lost (production: the proposal's outcome is unknown) or at its timeout."""
        now = self.clock.now_ms
        for gid, running in sorted(node.running.items()):
            host = node.replicas.get(gid)
            if host is None or not host.up:
                del node.running[gid]
                continue
            raft = host.raft
            if raft.role is not Role.LEADER or raft.term != running.term:
                del node.running[gid]
            elif host.applied_index >= running.index:
                self.stats.changes_applied += 1
                del node.running[gid]
            elif now >= running.deadline_ms:
                self.stats.changes_failed += 1
                del node.running[gid]

    # == writers ==============================================================

    def _writer_timer(self, gid: int) -> None:
        writer, now = self.writers[gid], self.clock.now_ms
        if self._healed:
            return
        self.timers.schedule(now + self.config.write_interval_ms,
                             functools.partial(self._writer_timer, gid))
        if writer.request is None:
            writer.seq += 1
            key, value = f"g{gid}.w{writer.seq}", f"{gid}.{writer.seq}"
            if self.dup is not None:
                payload = self._dup_write(writer)
            else:
                payload = _ENCODER.encode(Request(
                    command=Txn(success=(PutOp(key=key, value=value.encode()),))))
            writer.request = ClientRequest(WRITER_ENDPOINT, writer.seq, ClientOp.PUT, key,
                                           payload, value=value)
        elif now < writer.attempt_deadline_ms:
            return
        else:
            writer.target = self._next_replica(gid, writer.target)
        self._send_write(writer)

    def _send_write(self, writer: _Writer) -> None:
        if writer.request is None:
            return
        writer.attempt_deadline_ms = self.clock.now_ms + self.config.write_attempt_timeout_ms
        self.network.send(self.clock.now_ms, WRITER_ENDPOINT, writer.target,
                          _Write(writer.group_id, writer.request))

    def _next_replica(self, gid: int, current: int) -> int:
        members = list(self.records[gid].members)
        if current in members:
            return members[(members.index(current) + 1) % len(members)]
        return members[self._writer_rng.randrange(len(members))]

    def _send_write_answer(self, node_id: int, gid: int, _client: int,
                           response: ClientResponse) -> None:
        self.network.send(self.clock.now_ms, node_id, WRITER_ENDPOINT,
                          _WriteAnswer(gid, response))

    def _on_write_answer(self, answer: _WriteAnswer) -> None:
        writer = self.writers[answer.group_id]
        request, response = writer.request, answer.response
        if request is None or response.seq != writer.seq:
            return  # a late or duplicated answer
        if response.ok:
            writer.acked.append((request.key, str(request.value)))
            if writer.op is not None:
                writer.last_acked[writer.op[0]] = writer.op[1]
                writer.op = None
            self.stats.writes_acked += 1
            writer.request = None
        elif not self._healed:
            writer.target = response.leader_hint or self._next_replica(
                answer.group_id, writer.target)
            self._send_write(writer)

    # == the nemesis ==========================================================

    def _nemesis_tick(self) -> None:
        if self._healed:
            return
        config, rng = self.config, self._nemesis
        self.timers.schedule(self.clock.now_ms + config.tick_interval_ms, self._nemesis_tick)
        for host in self._running_hosts():
            if rng.random() < TABLE_NETWORK.background_flush_probability_per_tick:
                host.sync()
        if rng.random() < config.crash_probability_per_tick:
            self._random_crash()
        if rng.random() < config.partition_probability_per_tick and not self._partition_active:
            self._start_partition()
        if rng.random() < config.failover_probability_per_tick:
            self._failover()
        if self._drain_rng.random() < config.drain_probability_per_tick:
            self._drain_event()
        if rng.random() < config.compaction_probability_per_tick:
            hosts = self._running_hosts()
            if hosts:
                host = hosts[rng.randrange(len(hosts))]
                keep = rng.randint(0, config.compaction_keep_entries_max)
                if host.compact(min_entries=config.snapshot_min_entries, keep_entries=keep):
                    self.stats.compactions += 1
                    self._check_floor(host)
        if self.dup is not None:
            self._remote_nemesis()

    def _drain_event(self) -> None:
        """``table drain`` of a random node (any: a dead one's replicas move too), or
        ``table undrain`` of the drained one."""
        rng = self._drain_rng
        if self.draining and rng.random() < self.config.undrain_probability:
            self._trace(f"UNDRAIN node {sorted(self.draining)[0]}")
            self.draining.clear()
            return
        if self.draining:
            return
        node = sorted(self.nodes)[rng.randrange(len(self.nodes))]
        self.draining.add(node)
        self.stats.drains += 1
        self._trace(f"DRAIN node {node}")

    def _running_hosts(self) -> list[SimRaftHost]:
        return [host for _, node in sorted(self.nodes.items()) if node.up
                for _, host in sorted(node.replicas.items()) if host.up]

    def _crash(self, node: _TableNode, reason: str) -> None:
        node.up = False
        node.running.clear()
        for _, host in sorted(node.replicas.items()):
            if host.up:
                host.crash(self._disk_rng, TABLE_NETWORK)
        self.network.set_down(node.node_id, True)
        if self.dup is not None:
            self.dup.forget(node.node_id)
        self.stats.crashes += 1
        self._trace(f"CRASH node {node.node_id} ({reason})")

    def _random_crash(self) -> None:
        down = sum(1 for n in self.nodes.values() if not n.up and not n.dead_for_good)
        if down >= self.config.temporary_crashed_nodes_max:
            return
        up = [n for _, n in sorted(self.nodes.items()) if n.up]
        if not up:
            return
        node = up[self._nemesis.randrange(len(up))]
        self._crash(node, "temporary")
        downtime = self._nemesis.randint(self.config.downtime_ms_min,
                                         self.config.downtime_ms_max)
        self.timers.schedule(self.clock.now_ms + downtime,
                             functools.partial(self._restart, node))

    def _crash_for_good(self) -> None:
        # Never a voter of a group below 3 voters (one that started short and has not
        # grown yet): its quorum would be lost for good, which no scheduler repairs.
        fragile = self._short_group_voters()
        candidates = [n for _, n in sorted(self.nodes.items())
                      if not n.dead_for_good and n.node_id not in fragile]
        if not candidates:
            self._trace(f"no node may stay dead: voters of short groups {sorted(fragile)}")
            return
        node = candidates[self._nemesis.randrange(len(candidates))]
        if node.up:
            self._crash(node, "for good")
        node.dead_for_good = True
        self._trace(f"node {node.node_id} stays dead")

    def _crash_and_wipe(self) -> None:
        """The run's permanent fault as a wiped disk: a node (never a member of a
        short group, as for ``_crash_for_good``) crashes, its table Raft data is
        gone, and it restarts under its old id after a downtime."""
        fragile = self._short_group_voters()
        candidates = [n for _, n in sorted(self.nodes.items())
                      if n.up and not n.dead_for_good and n.node_id not in fragile]
        if not candidates:
            self._trace(f"no node may be wiped: voters of short groups {sorted(fragile)}")
            return
        node = candidates[self._nemesis.randrange(len(candidates))]
        self._crash(node, "its disk is wiped")
        for gid in sorted(node.replicas):
            node.replicas[gid].decommissioned = True
            self.stats.replicas_dropped += 1
        node.replicas.clear()
        # Even seeds keep the node's marker (only its table data went); odd ones lose
        # the whole data directory, and the node must tell from the records.
        marker_kept = self.seed % 2 == 0
        node.lost = LostReplicas(node.node_id, data_lost=marker_kept,
                                 nothing_on_disk=not marker_kept)
        self.stats.wipes += 1
        downtime = self._nemesis.randint(self.config.downtime_ms_min,
                                         self.config.downtime_ms_max)
        self.timers.schedule(self.clock.now_ms + downtime,
                             functools.partial(self._restart, node))

    def _short_group_voters(self) -> set[int]:
        """Nodes that are members, in a record or in any replica's configuration,
        of a group with fewer than 3 voters there: its voters, and its learners,
        which the scheduler may promote before it sees their node die (seed 39)."""
        out: set[int] = set()
        for gid, record in sorted(self.records.items()):
            configs = [(set(record.members), set(record.replicas))]
            for _, node in sorted(self.nodes.items()):
                if gid in node.replicas and node.replicas[gid].up:  # a crashed one has no core
                    conf = node.replicas[gid].raft.conf_state
                    configs.append((set(conf.voters), set(conf.members())))
                    if conf.voters_outgoing:
                        configs.append((set(conf.voters_outgoing), set(conf.members())))
            for voters, members in configs:
                if len(voters) < SAFE_VOTERS_MIN:
                    out |= members
        return out

    def _restart(self, node: _TableNode) -> None:
        if node.up or node.dead_for_good:
            return
        node.up = True
        self.network.set_down(node.node_id, False)
        for _, host in sorted(node.replicas.items()):
            host.start()
        self.stats.restarts += 1
        self._trace(f"RESTART node {node.node_id}")
        for _, host in sorted(node.replicas.items()):
            self._check_floor(host)
        self._reconcile(node)

    def _start_partition(self) -> None:
        rng = self._nemesis
        endpoints = sorted(self.nodes)
        rng.shuffle(endpoints)
        side = sorted(endpoints[: rng.randint(1, len(endpoints) - 1)])
        rest = sorted(n for n in self.nodes if n not in side)
        if rng.random() < self.config.partition_scheduler_probability:
            (side if rng.random() < 0.5 else rest).append(SCHEDULER_ENDPOINT)
        else:  # the scheduler (meta) reaches everyone: heartbeats and writes still flow
            pass
        self.network.partition([side, rest])
        self._partition_active = True
        self.stats.partitions += 1
        self._trace(f"PARTITION {side} | {rest}")
        duration = rng.randint(self.config.partition_duration_ms_min,
                               self.config.partition_duration_ms_max)
        self.timers.schedule(self.clock.now_ms + duration, self._heal_partition)

    def _heal_partition(self) -> None:
        if self._partition_active:
            self.network.heal()
            self._partition_active = False
            self._trace("PARTITION healed")

    def _failover(self) -> None:
        """A new meta leader: a fresh scheduler, empty view, waiting one dead interval."""
        self.scheduler = Scheduler(self.scheduler_config, started_ms=self.clock.now_ms)
        self.stats.failovers += 1
        self._trace("FAILOVER: a new scheduler starts with an empty view")

    # == duplication (the dup mix, ``_table_dup``) ===========================

    def _stamp(self, gid: int, machine: object, payload: bytes) -> bytes:
        """The leader stamps the writer's write; some share the log entry with
        another client's write that reached the leader in the same pass."""
        payloads = [payload]
        if self._combine_rng.random() < self.config.dup_combine_probability:
            payloads.insert(self._combine_rng.randrange(2), self._companion_write(gid))
            if self.dup is not None:  # always: only the dup mix stamps proposals
                self.dup.stats.combined_proposals += 1
        return stamp_proposal(machine, payloads, self.clock.now_ms * 1000)

    def _companion_write(self, gid: int) -> bytes:
        """A write of a second client of the group, never retried (its answer is
        not awaited): a set or delete of a key next to the writer's (same hash
        keys, sort keys of its own: the writer's keys keep their last
        acknowledged value; duplication checks these by convergence)."""
        config, rng = self.config, self._combine_rng
        seq = self._companion_seqs.get(gid, 0) + 1
        self._companion_seqs[gid] = seq
        key = (f"h{rng.randrange(config.dup_hash_keys)}".encode(),
               f"c{rng.randrange(config.dup_sort_keys)}".encode())
        value = (None if rng.random() < config.dup_delete_probability
                 else f"{gid}.c{seq}".encode())
        return write_payload(COMPANION_CLIENT_ID_BASE + gid, seq, key[0], key[1], value,
                             first_outstanding_seq=1)

    def _dup_write(self, writer: _Writer) -> bytes:
        """A set or delete of one of the group's few keys (overwrites and
        deletes: last-writer-wins and tombstones decide what the remote holds)."""
        config, rng = self.config, self._writer_rng
        key = (f"h{rng.randrange(config.dup_hash_keys)}".encode(),
               f"s{rng.randrange(config.dup_sort_keys)}".encode())
        value = (None if rng.random() < config.dup_delete_probability
                 else f"{writer.group_id}.{writer.seq}".encode())
        writer.op = (key, value)
        return write_payload(writer.group_id, writer.seq, key[0], key[1], value)

    def _leader_of(self, gid: int) -> SimRaftHost | None:
        leaders = [node.replicas[gid] for _, node in sorted(self.nodes.items())
                   if node.up and gid in node.replicas and node.replicas[gid].up
                   and node.replicas[gid].raft.role is Role.LEADER]
        return max(leaders, key=lambda h: h.raft.term) if leaders else None

    def _ship_timer(self) -> None:
        """Every partition leader's shipper steps (``Shipper._step``), if it
        reaches meta (it reads and confirms ``confirmed_decree`` there)."""
        dup, config = self.dup, self.config
        self.timers.schedule(self.clock.now_ms + config.dup_ship_interval_ms, self._ship_timer)
        if dup is None:
            return
        for gid in sorted(self.records):
            host = self._leader_of(gid)
            if host is None or self.network.is_blocked(host.node_id, SCHEDULER_ENDPOINT):
                continue
            confirmed, applied = dup.confirmed[gid], host.applied_index
            if applied <= confirmed:
                continue
            hi = min(applied, confirmed + config.dup_block_entries_max) + 1
            try:
                entries = host.retained_entries(gid, confirmed + 1, hi, config.dup_block_bytes_max)
            except CompactedError as exc:
                fail("dup-log-lost",
                     f"group {gid}: leader {host.node_id} (applied {applied}) lacks the log "
                     f"after confirmed_decree {confirmed}: {exc.message}")
            replica = host.machine
            invariant(isinstance(replica, SimTableReplica), "dup runs table replicas")
            if isinstance(replica, SimTableReplica) and dup.ship(
                    gid, entries, replica.store, self.clock.now_ms):
                self._trace_group(gid, f"DUP node {host.node_id} shipped "
                                       f"{entries[0].index}..{entries[-1].index}")
        for host in self._running_hosts():  # followers too: any may lead next
            self._check_floor(host)

    def _gc_timer(self) -> None:
        """``TombstoneCollector.collect_once``: each leader proposes a collection
        (the production ``collection_entry``, with the floor its node knows)."""
        dup, config = self.dup, self.config
        self.timers.schedule(self.clock.now_ms + config.tombstone_gc_interval_ms,
                             self._gc_timer)
        if dup is None:
            return
        for gid in sorted(self.records):
            host = self._leader_of(gid)
            replica = None if host is None else host.machine
            if host is None or not isinstance(replica, SimTableReplica):
                continue
            entry = collection_entry(host, gid, replica.machine, dup.floor(host.node_id, gid),
                                     wall_us=self.clock.now_ms * 1000,
                                     delay_ms=config.tombstone_gc_delay_ms)
            try:
                host.raft.propose(encode_entry(entry))
            except ProposalDroppedError:
                continue
            dup.stats.gc_proposed += 1
            host.flush()

    def _check_floor(self, host: SimRaftHost) -> None:
        """After a compaction: the replica still holds the log after the
        partition's confirmed_decree (Raft log or snapshot tail)."""
        dup = self.dup
        gid = next((g for g, h in self._node_of(host).replicas.items() if h is host), 0)
        if dup is None or not gid:
            return
        confirmed = dup.confirmed[gid]
        self.stats.floor_checks += 1
        if not host.up or confirmed >= host.raft.last_index:
            return  # nothing after confirmed_decree here yet: Raft brings it
        try:
            host.retained_entries(gid, confirmed + 1, confirmed + 2, 1)
        except CompactedError as exc:
            fail("dup-log-not-retained",
                 f"group {gid}: node {host.node_id} lacks the log after confirmed_decree "
                 f"{confirmed} (knows {dup.known.get(host.node_id)}): {exc.message}")

    def _node_of(self, host: SimRaftHost) -> _TableNode:
        return self.nodes[host.node_id]

    def _remote_nemesis(self) -> None:
        dup, config = self.dup, self.config
        if dup is None or dup.remote_down:
            return
        if self._dup_rng.random() < config.remote_outage_probability_per_tick:
            dup.remote_down = True
            dup.stats.remote_outages += 1
            duration = self._dup_rng.randint(config.remote_outage_ms_min,
                                             config.remote_outage_ms_max)
            self._trace(f"REMOTE down for {duration} ms ({dup.fail_mode.value} mode)")
            self.timers.schedule(self.clock.now_ms + duration, self._remote_up)

    def _remote_up(self) -> None:
        if self.dup is not None and self.dup.remote_down:
            self.dup.remote_down = False
            self._trace("REMOTE up")

    def _dup_unsettled(self, gid: int, leader: SimRaftHost, voters: list[int],
                       by_node: dict[int, SimRaftHost]) -> str:
        """Every acknowledged write on every voter, the shipper caught up, and
        the remote equal to the source (value and timetag of every live key)."""
        dup, writer = self.dup, self.writers[gid]
        invariant(dup is not None, "dup checks run in the dup mix")
        if dup is None:
            return ""
        in_flight = writer.op if writer.request is not None else None
        for voter in voters:
            replica = by_node[voter].machine
            if not isinstance(replica, SimTableReplica):
                continue
            live = live_records(replica.store)
            for key, value in sorted(writer.last_acked.items()):
                has = live.get(key)
                if (None if has is None else has[0]) == value:
                    continue
                if in_flight is not None and in_flight[0] == key and (
                        None if has is None else has[0]) == in_flight[1]:
                    continue  # the last write, unacknowledged, applied after all
                fail("acknowledged-write-lost",
                     f"group {gid}: key {key} was last acknowledged as {value!r} but voter "
                     f"{voter} has {has!r}")
        if dup.confirmed[gid] < leader.applied_index:
            return (f"duplication confirmed {dup.confirmed[gid]} of {leader.applied_index}")
        replica = leader.machine
        if isinstance(replica, SimTableReplica):
            differences = dup.differences(gid, replica.store)
            if differences:
                fail("dup-diverged",
                     f"group {gid}: the remote differs from the source after everything "
                     f"shipped ({dup.fail_mode.value} mode, {len(dup.skipped_keys[gid])} "
                     f"keys skipped): " + "; ".join(differences[:5]))
        return ""

    # == heal and liveness ====================================================

    def _heal(self) -> None:
        self._healed = True
        self._heal_ms = self.clock.now_ms
        self.network.heal()
        self.network.heal_faults()
        self._partition_active = False
        if self.dup is not None:
            self.dup.remote_down = False
        self._trace("HEAL: partitions and message loss end, crashed nodes restart")
        for _, node in sorted(self.nodes.items()):
            self._restart(node)
        if self._nemesis.random() < self.config.failover_at_heal_probability:
            self._failover()
        self._liveness_tick()

    def _liveness_tick(self) -> None:
        self.timers.schedule(self.clock.now_ms + self.config.tick_interval_ms,
                             self._liveness_tick)
        if not self._unsettled():
            self._done = True

    def _live_nodes(self) -> set[int]:
        return {n for n, node in self.nodes.items() if node.up}

    def _unsettled(self) -> str:
        """Why the cluster has not settled yet ('' once it has); fails if a settled
        group lacks an acknowledged write."""
        live = self._live_nodes()
        for gid in sorted(self.records):
            reason = self._group_unsettled(gid, live)
            if reason:
                return f"group {gid}: {reason}"
        return ""

    def _group_unsettled(self, gid: int, live: set[int]) -> str:
        hosts = [node.replicas[gid] for _, node in sorted(self.nodes.items())
                 if node.up and gid in node.replicas and node.replicas[gid].up]
        leaders = [h for h in hosts if h.raft.role is Role.LEADER]
        if not leaders:
            return "no leader"
        leader = max(leaders, key=lambda h: h.raft.term)
        raft = leader.raft
        conf = raft.conf_state
        voters = sorted(conf.voters)
        if conf.is_joint or conf.learners or len(voters) != self.config.replicas:
            return f"configuration {conf} is not {self.config.replicas} settled voters"
        placeable = live - self.draining
        if not set(voters) <= placeable:
            return (f"voters {voters} not all on live nodes not drained "
                    f"{sorted(placeable)}")
        zones = {self.zone_of[v] for v in voters}
        zones_possible = min(len(voters), len({self.zone_of[n] for n in placeable}))
        if len(zones) < zones_possible:
            return (f"voters {voters} span zones {sorted(zones)}, {zones_possible} "
                    "possible over the live nodes")
        record = self.records[gid]
        if tuple(voters) != tuple(sorted(record.members)) or record.learners:
            return f"record {record} behind the configuration {voters}"
        if raft.commit_index != raft.last_index:
            return f"leader {leader.node_id} committed {raft.commit_index} of {raft.last_index}"
        by_node = {h.node_id: h for h in hosts}
        for voter in voters:
            host = by_node.get(voter)
            if host is None or host.applied_index != raft.commit_index:
                return f"voter {voter} has not applied {raft.commit_index}"
        if self.dup is not None:
            return self._dup_unsettled(gid, by_node[leader.node_id], voters, by_node)
        for voter in voters:
            machine = by_node[voter].machine
            invariant(isinstance(machine, MetaStateMachine), "meta writes on a meta machine")
            if not isinstance(machine, MetaStateMachine):
                continue
            for key, value in self.writers[gid].acked:
                kv = machine.get(key)
                if kv is None or kv.value != value.encode():
                    has = "nothing" if kv is None else repr(kv.value)
                    fail("acknowledged-write-lost",
                         f"group {gid}: write {key}={value} was acknowledged but voter "
                         f"{voter} (applied {raft.commit_index}) has {has} there")
        return ""

    # == results ==============================================================

    def _result(self, violation: str | None, detail: str) -> TableSimResult:
        stats = {name: getattr(self.stats, name) for name in _Stats.__slots__}
        stats["nodes"] = self.node_count
        stats["zones"] = len(set(self.zone_of.values()))
        stats["messages_sent"] = self.network.stats.sent
        if self.dup is not None:
            stats.update({f"dup_{name}": getattr(self.dup.stats, name)
                          for name in self.dup.stats.__slots__})
            stats["dup_skip_mode"] = int(self.dup.fail_mode is FailMode.SKIP)
        fingerprint = hashlib.sha256(repr((
            violation, detail, self.clock.now_ms, sorted(stats.items()),
            sorted((gid, tuple(w.acked)) for gid, w in self.writers.items()),
            sorted((gid, r.members, r.learners, r.epoch) for gid, r in self.records.items()),
        )).encode()).hexdigest()
        if violation is not None:
            self._trace(f"VIOLATION {violation}: {detail}")
        return TableSimResult(
            seed=self.seed, nodes=self.node_count, groups=self.config.groups,
            violation=violation, detail=detail, end_ms=self.clock.now_ms,
            fingerprint=fingerprint, trace_hash=self.tracer.digest(), stats=stats,
            trace=tuple(self.tracer.lines), mix="dup" if self.config.dup else "scheduler")

    def _trace(self, text: str) -> None:
        self.tracer.event(self.clock.now_ms, text)

    def _trace_group(self, gid: int, text: str) -> None:
        self.tracer.event(self.clock.now_ms, f"g{gid} {text}")


def _no_beat(peer: int) -> None:
    """Process beats are for quiescent runs (``RaftConfig.quiesce_idle``)."""


def _nothing_on_sent(_node: int, _message: Message) -> None:
    """No targeted crashes in table runs (the Raft simulator covers those)."""


def _never_dies(_node: int, _message: Message) -> bool:
    return False


def _where(exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.endswith("quorumlog/errors.py")]
    if not frames:
        return "?"
    path = frames[-1].filename
    short = path[path.rfind("quorumlog/"):] if "quorumlog/" in path else path
    return f"{short}:{frames[-1].lineno} in {frames[-1].name}"


def run_table_seed(seed: int, config: TableSimConfig | None = None, *,
                   keep_trace: bool = False) -> TableSimResult:
    """Run one seed of the table simulator (never raises for a bug it finds)."""
    return TableSimulation(seed, config, keep_trace=keep_trace).run()


def _run_one(mix: str, seed: int) -> TableSimResult:
    return run_table_seed(seed, table_config_for_mix(mix))


def run_table_many(
    seeds: Iterable[int], *, jobs: int = 1,
    on_result: Callable[[TableSimResult], None] | None = None, mix: str = "scheduler",
) -> list[TableSimResult]:
    """Run many seeds of one mix (in ``jobs`` processes), results in seed order."""
    seeds = list(seeds)
    table_config_for_mix(mix)  # an unknown mix fails here, not in a worker
    run_one = functools.partial(_run_one, mix)
    results: list[TableSimResult] = []
    if jobs <= 1:
        for seed in seeds:
            result = run_one(seed)
            results.append(result)
            if on_result is not None:
                on_result(result)
        return results
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(jobs) as pool:
        for result in pool.imap(run_one, seeds, chunksize=1):
            results.append(result)
            if on_result is not None:
                on_result(result)
    return results
