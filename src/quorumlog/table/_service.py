"""The table role of a node: partition replicas on a multi-raft host.

A :class:`TableService` registers its node under ``/table-nodes/<id>`` (an
ephemeral key kept alive by a meta session), watches ``/tables/`` and hosts,
on one :class:`~quorumlog.raft.RaftHost` of its own (WAL under
``<data_dir>/table/raft``), a Raft group for every partition replica
assigned to this node. Each group's state machine is a
:class:`PartitionMachine` over one :class:`TableStore` (RocksDB under
``<data_dir>/table/replicas/<group id>``).

Writes are ``TableEntry`` proposals stamped by the leader's ``TimetagClock``
(those of one pass combined into one log entry, ``combine_entries``);
reads wait on ``read_barrier`` (ReadIndex) and read the leader's store. A
follower answers ``NotLeaderError`` with the leader's address, except to a
read with ``stale_ok``, which any replica answers from its own store.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quorumlog import rpc
from quorumlog.config import Config, require
from quorumlog.errors import QuorumlogError
from quorumlog.log import get_logger
from quorumlog.meta import MetaClient, write_marker
from quorumlog.raft import HostConfig, ProposalDroppedError, RaftHost, Role
from quorumlog.table._commands import (
    NON_IDEMPOTENT_COMMANDS,
    NON_IDEMPOTENT_REFUSED,
    DeleteCommand,
    MultiDeleteCommand,
    Refused,
    TableEntry,
    WriteCommand,
    combine_entries,
    encode_entry,
)
from quorumlog.table._disk import DiskGuard
from quorumlog.table._dup_gc import LedReplica, TombstoneCollector
from quorumlog.table._dup_layout import TableFlags, parse_table_extras
from quorumlog.table._dup_shipper import DupManager, DupSettings, HostedPartition
from quorumlog.table._errors import BadTableRequestError, DiskInsufficientError
from quorumlog.table._heartbeat import (
    ChangeExecutor,
    ChangeOutcome,
    HeartbeatSender,
    disk_free_bytes,
    group_report,
)
from quorumlog.table._layout import (
    TABLE_NODES_PREFIX,
    TABLES_PREFIX,
    LostReplicas,
    PartitionRecord,
    TableLayout,
    TableNodeRecord,
    decode_node,
    encode,
    group_id_of,
    keeps_replica,
    parse_layouts,
    table_node_key,
)
from quorumlog.table._machine import PartitionMachine, observe_duplicates
from quorumlog.table._messages import (
    WRITE_BATCH_WRITES_MAX,
    PartitionNotHostedError,
    TableCountRequest,
    TableCountResponse,
    TableGetRequest,
    TableGetResponse,
    TableMultiGetRequest,
    TableMultiGetResponse,
    TableScanRequest,
    TableScanResponse,
    TableTtlRequest,
    TableTtlResponse,
    TableWriteBatchRequest,
    TableWriteBatchResponse,
    TableWriteRequest,
    TableWriteResponse,
)
from quorumlog.table._metrics import (
    TABLE_METRICS,
    metered,
    metered_deferred,
    register_node,
    unregister_node,
)
from quorumlog.table._scan_contexts import (
    SCAN_CONTEXT_IDLE_MS_DEFAULT,
    SCAN_CONTEXTS_MAX_DEFAULT,
    ScanContexts,
)
from quorumlog.table._scheduler import NodeReport, SchedulerConfig
from quorumlog.table._store import TableStore
from quorumlog.table._timetag import TimetagClock
from quorumlog.wal import WalConfig

_log = get_logger(__name__)

MIB = 1024 * 1024
WAL_SEGMENT_MIN_BYTES = 64 * 1024  # [table] / [meta] WAL segment sizes
WATCH_WAIT_MS = 10_000  # one long-poll of the /table watch
RETRY_DELAY_S = 1.0  # after a failed registration or watch round
TABLE_MARKER_NAME = "table-member.json"  # <data_dir>/: this node hosted table replicas
LOST_LOG_INTERVAL_S = 10.0


DELETE_COMMANDS = (DeleteCommand, MultiDeleteCommand)  # taken while the disk is full


class TableConfig(Config, frozen=True):
    """``[table]`` of a node config."""

    zone: str = "default"  # placement spreads a partition's replicas over zones
    cluster_id: int = 1  # timetags' cluster id (duplication tells clusters apart)
    tick_interval_ms: int = 100
    election_timeout_ticks: int = 10
    # RaftConfig.broadcast_commit of the partition groups. On: the leader
    # tells followers of a commit at once. Off saves 10-15 % of the CPU per
    # set at 64-256 clients (docs/table.md, "Benchmark"), but followers then
    # learn a commit only with the next AppendEntries or heartbeat, a wider
    # window for followers that hold a membership change without its commit
    # (docs/table.md, "Removed replicas stay until the new configuration is
    # applied").
    broadcast_commit: bool = True
    # A Raft snapshot (a RocksDB checkpoint) after this many applied entries.
    snapshot_entries: int = 10_000
    # Every partition replica has a WAL of its own, and WAL segments are
    # preallocated: a node hosting 1,000 replicas keeps 1,000 segments on disk
    # at rest (4 GiB at 4 MiB; 64 GiB at etcd's 64 MiB). Writes are made
    # durable by the node's one shared journal, so a small group segment costs
    # a file cut every few MiB of one partition's writes, not an fsync per write.
    wal_segment_size_bytes: int = 4 * MIB
    journal_segment_size_bytes: int = 64 * MIB
    # The node's registration disappears this long after the node dies.
    registration_ttl_ms: int = 10_000
    # Heartbeats to the meta leader's scheduler (docs/table.md, "Scheduler");
    # the scheduler fields below are read on the meta leader.
    heartbeat_interval_ms: int = 1_000
    node_dead_after_ms: int = 10_000  # no heartbeat this long: the node is dead
    replace_dead_after_ms: int = 60_000  # a dead node's replicas are replaced after this
    changes_per_node_max: int = 2  # configuration changes in flight touching one node
    catchup_entries_max: int = 100  # a learner this close to the leader may be promoted
    change_timeout_ms: int = 60_000  # a change not seen done by then may be decided again
    # Duplication (docs/duplication.md): a shipper reads at most this many log
    # entries / bytes per block; hash keys of a block in flight to the remote at once.
    dup_block_entries_max: int = 256
    dup_block_bytes_max: int = 4 * 1024 * 1024
    dup_hash_keys_in_flight_max: int = 64
    # How often every node re-reads confirmed decrees (the log floor) and
    # starts or stops the shippers of the partitions it leads.
    dup_refresh_interval_ms: int = 500
    dup_progress_interval_ms: int = 200  # confirmed_decree written to meta at most this often
    dup_idle_poll_ms: int = 20  # a caught-up shipper looks for new entries this often
    dup_remote_deadline_s: float = 10.0  # one shipped hash_key, all retries of the remote client
    # Tombstones and expired records go this long after their write (the GC
    # delay: longer than any duplicate write toward this cluster may lag,
    # pauses included), and never before duplication shipped them.
    tombstone_gc_delay_ms: int = 24 * 3600 * 1000
    tombstone_gc_interval_ms: int = 60_000  # each leader proposes a collection this often
    # Snapshot scans (table/_scan_contexts.py): open at once per node, and how long
    # an unused one lives (each pins a RocksDB checkpoint of its replica).
    scan_contexts_max: int = SCAN_CONTEXTS_MAX_DEFAULT
    scan_context_idle_ms: int = SCAN_CONTEXT_IDLE_MS_DEFAULT
    # A leader refuses writes (not deletes) while its data disk is used past
    # the threshold, until below the low-water mark (table/_disk.py; the
    # bookie's defaults); the disk is looked at at most this often.
    disk_usage_threshold_fraction: float = 0.95
    disk_usage_lwm_fraction: float = 0.90
    disk_check_interval_ms: int = 100

    def validate(self) -> None:
        require(bool(self.zone), "[table] zone must not be empty")
        require(1 <= self.cluster_id <= 127, "[table] cluster_id must be in 1..127")
        require(self.tick_interval_ms >= 1, "[table] tick_interval_ms must be >= 1")
        require(self.election_timeout_ticks >= 2, "[table] election_timeout_ticks must be >= 2")
        require(self.snapshot_entries >= 1, "[table] snapshot_entries must be >= 1")
        require(self.wal_segment_size_bytes >= WAL_SEGMENT_MIN_BYTES,
                f"[table] wal_segment_size_bytes must be >= {WAL_SEGMENT_MIN_BYTES}")
        require(self.journal_segment_size_bytes >= WAL_SEGMENT_MIN_BYTES,
                f"[table] journal_segment_size_bytes must be >= {WAL_SEGMENT_MIN_BYTES}")
        require(self.registration_ttl_ms >= 1000, "[table] registration_ttl_ms must be >= 1000")
        require(self.heartbeat_interval_ms >= 10, "[table] heartbeat_interval_ms must be >= 10")
        require(self.node_dead_after_ms >= 2 * self.heartbeat_interval_ms,
                "[table] node_dead_after_ms must be >= 2 * heartbeat_interval_ms")
        require(self.dup_block_entries_max >= 1, "[table] dup_block_entries_max must be >= 1")
        require(self.dup_block_bytes_max >= 1, "[table] dup_block_bytes_max must be >= 1")
        require(self.dup_hash_keys_in_flight_max >= 1,
                "[table] dup_hash_keys_in_flight_max must be >= 1")
        require(self.dup_refresh_interval_ms >= 10, "[table] dup_refresh_interval_ms must be >= 10")
        require(self.dup_progress_interval_ms >= 0, "[table] dup_progress_interval_ms must be >= 0")
        require(self.dup_idle_poll_ms >= 1, "[table] dup_idle_poll_ms must be >= 1")
        require(self.dup_remote_deadline_s > 0, "[table] dup_remote_deadline_s must be > 0")
        require(self.tombstone_gc_delay_ms >= 0, "[table] tombstone_gc_delay_ms must be >= 0")
        require(self.tombstone_gc_interval_ms >= 10,
                "[table] tombstone_gc_interval_ms must be >= 10")
        require(self.scan_contexts_max >= 1, "[table] scan_contexts_max must be >= 1")
        require(self.scan_context_idle_ms >= 1, "[table] scan_context_idle_ms must be >= 1")
        require(0.0 < self.disk_usage_lwm_fraction < self.disk_usage_threshold_fraction <= 1.0,
                "[table] need 0 < disk_usage_lwm_fraction < disk_usage_threshold_fraction <= 1")
        require(self.disk_check_interval_ms >= 1, "[table] disk_check_interval_ms must be >= 1")
        self.scheduler_config().validate()

    def dup_settings(self) -> DupSettings:
        return DupSettings(
            block_entries_max=self.dup_block_entries_max,
            block_bytes_max=self.dup_block_bytes_max,
            hash_keys_in_flight_max=self.dup_hash_keys_in_flight_max,
            refresh_interval_ms=self.dup_refresh_interval_ms,
            progress_interval_ms=self.dup_progress_interval_ms,
            idle_poll_ms=self.dup_idle_poll_ms,
            remote_deadline_s=self.dup_remote_deadline_s,
            cluster_id=self.cluster_id)

    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(
            node_dead_after_ms=self.node_dead_after_ms,
            replace_dead_after_ms=self.replace_dead_after_ms,
            catchup_entries_max=self.catchup_entries_max,
            changes_per_node_max=self.changes_per_node_max,
            change_timeout_ms=self.change_timeout_ms)


@dataclass(slots=True)
class _Replica:
    table: str
    table_id: int
    partition: int
    group_id: int
    machine: PartitionMachine
    dropped: bool = False


class TableService:
    """The table role; see the module docstring."""

    def __init__(self, node_id: int, address: str, meta_addresses: list[str],
                 data_dir: Path, config: TableConfig | None = None, *,
                 clusters: dict[str, list[str]] | None = None) -> None:
        self.node_id = node_id
        self.address = address
        self.config = config or TableConfig()
        self.config.validate()
        self.data_dir = data_dir / "table"
        # A node that hosted table replicas on this data directory before and whose
        # table Raft data is gone (wiped, lost with a disk) must not host the replicas
        # it was a voter of as their old selves: an empty log voting under its old id
        # can elect a replica that lacks writes it had acknowledged (the meta member
        # guard's case, quorumlog.meta). It reports them lost in its heartbeats; the
        # scheduler replaces them (elsewhere, or removes the voter and adds it back
        # here as a learner, which opens as a new replica and catches up).
        self._marker = data_dir / TABLE_MARKER_NAME
        raft_data = (self.data_dir / "raft").exists()
        # Nothing on disk at all is a first start or the whole data directory lost
        # (marker too). A node registers only after its first reconcile, and
        # nothing is placed on a node never registered: records that already
        # count it as a voter then mean its data is gone (LostReplicas).
        self._lost = LostReplicas(node_id, data_lost=self._marker.exists() and not raft_data,
                                  nothing_on_disk=not self._marker.exists() and not raft_data)
        self._reconciled = asyncio.Event()
        self._lost_logged = 0.0
        self._known_addresses: dict[int, str] = {node_id: address}
        self.disk = DiskGuard(
            data_dir, threshold_fraction=self.config.disk_usage_threshold_fraction,
            lwm_fraction=self.config.disk_usage_lwm_fraction,
            interval_s=self.config.disk_check_interval_ms / 1000)
        self.host = RaftHost(
            node_id, {node_id: address}, self.data_dir / "raft",
            config=HostConfig(
                tick_interval_ms=self.config.tick_interval_ms,
                election_timeout_ticks=self.config.election_timeout_ticks,
                snapshot_entries=self.config.snapshot_entries,
                wal=WalConfig(segment_size_bytes=self.config.wal_segment_size_bytes),
                journal_wal=WalConfig(
                    segment_size_bytes=self.config.journal_segment_size_bytes)))
        self.host.resolver = self._known_addresses.get
        self._meta = MetaClient(meta_addresses)
        self._pool = rpc.Pool()
        self._heartbeats = HeartbeatSender(meta_addresses, self._pool)
        self.executor = ChangeExecutor(self.host)
        self._replicas: dict[int, _Replica] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.registered = False
        self.failed = self.host.failed
        self._flags: dict[str, TableFlags] = {}
        self.dups = DupManager(node_id, self.host, self._meta, clusters=dict(clusters or {}),
                               settings=self.config.dup_settings(), hosted=self._hosted)
        # No replica compacts its log past what its table's duplications confirmed.
        self.host.compaction_floor = self.dups.compaction_floor
        self.gc = TombstoneCollector(self.host, self._led_replicas, self.dups.compaction_floor,
                                     delay_ms=self.config.tombstone_gc_delay_ms,
                                     interval_ms=self.config.tombstone_gc_interval_ms)
        self.scan_contexts = ScanContexts(
            self.data_dir / "scans", clock_ms=_monotonic_ms,
            contexts_max=self.config.scan_contexts_max,
            idle_ms=self.config.scan_context_idle_ms)

    # ----- lifecycle ----------------------------------------------------------

    def handlers(self) -> dict[type[rpc.Request[Any]], Any]:
        """The table requests; the Raft host's own handlers are in ``host.handlers()``."""
        return {
            TableWriteRequest: metered_deferred("write", self._on_write),
            TableWriteBatchRequest: metered_deferred("write_batch", self._on_write_batch),
            TableGetRequest: metered("get", self._on_get),
            TableMultiGetRequest: metered("multi_get", self._on_multi_get),
            TableScanRequest: metered("scan", self._on_scan),
            TableCountRequest: metered("count", self._on_count),
            TableTtlRequest: metered("ttl", self._on_ttl),
        }

    def hosts_group(self, group_id: int) -> bool:
        return group_id in self._replicas

    def disk_full(self) -> bool:
        """Whether writes are refused for the data disk, looked at again if the
        last look is old (the metrics scrape: a node that stopped leading would
        otherwise show its last verdict forever)."""
        return self.disk.check()

    def group_counts(self) -> tuple[int, int]:
        """(replicas hosted, replicas led), for the metrics scrape thread."""
        replicas = list(self._replicas.values())
        hosted = [r for r in replicas if not r.dropped]
        led = 0
        for replica in hosted:
            with contextlib.suppress(QuorumlogError):
                led += self.host.group(replica.group_id).node.role is Role.LEADER
        return len(hosted), led

    async def start(self) -> None:
        register_node(self)
        await self.host.start()
        write_marker(self._marker, self.node_id)
        if self._lost.data_lost:
            _log.error("table_data_lost", node=self.node_id, marker=str(self._marker),
                       raft_dir=str(self.data_dir / "raft"),
                       error=("this node hosted table replicas on this data directory "
                              "before, and its table Raft data is gone: the replicas it "
                              "was a voter of are reported lost and replaced by the "
                              "scheduler, not opened as their old selves"))
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._register_loop(), name="table-registration"),
                       loop.create_task(self._watch_loop(), name="table-watch"),
                       loop.create_task(self._heartbeat_loop(), name="table-heartbeat"),
                       loop.create_task(self.scan_contexts.sweep_forever(),
                                        name="table-scan-sweep")]
        self.dups.start()
        self.gc.start()

    async def close(self) -> None:
        unregister_node(self)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.gc.close()
        await self.dups.close()
        await self.executor.close()
        await self.host.close()
        await self._pool.close()
        self.scan_contexts.close_all()
        for replica in self._replicas.values():
            replica.machine.store.close()
        await self._meta.close()

    # ----- registration and assignments -----------------------------------------

    async def _register_loop(self) -> None:
        await self._reconciled.wait()  # see _nothing_on_disk
        ttl_ms = self.config.registration_ttl_ms
        record = encode(TableNodeRecord(self.node_id, self.address, self.config.zone))
        while True:
            try:
                session = await self._meta.create_session(ttl_ms)
                await self._meta.put(table_node_key(self.node_id), record, session_id=session)
                self.registered = True
                _log.info("table_node_registered", node=self.node_id, session=session)
                while await self._meta.keepalive(session):
                    await asyncio.sleep(ttl_ms / 3000)
            except QuorumlogError as exc:
                _log.warning("table_registration_failed", node=self.node_id, error=exc.message)
            self.registered = False
            await asyncio.sleep(RETRY_DELAY_S)

    async def _watch_loop(self) -> None:
        """List ``/table``, reconcile, then wait for the next change under it."""
        while True:
            try:
                result, revision = await self._meta.range("/table", prefix=True)
                for gid in self._reconcile([(kv.key, kv.value) for kv in result.kvs]):
                    await self._remove_replica(gid)
                await self._meta.watch_once("/table", prefix=True, start_revision=revision + 1,
                                            wait_ms=WATCH_WAIT_MS)
            except QuorumlogError as exc:
                _log.warning("table_watch_failed", node=self.node_id, error=exc.message)
                await asyncio.sleep(RETRY_DELAY_S)

    def _reconcile(self, kvs: list[tuple[str, bytes]]) -> list[int]:
        """Open the replicas assigned to this node; return the groups to remove."""
        for key, value in kvs:
            if key.startswith(TABLE_NODES_PREFIX):
                node = decode_node(value)
                self._known_addresses[node.node_id] = node.address
        layouts = parse_layouts([kv for kv in kvs if kv[0].startswith(TABLES_PREFIX)])
        dups, self._flags = parse_table_extras(kvs)
        self.dups.set_dups(dups)
        wanted: set[int] = set()
        records: dict[int, PartitionRecord] = {}
        for layout in layouts.values():
            for partition, record in enumerate(layout.partitions):
                records[group_id_of(layout.record.table_id, partition)] = record
        lost = self._replicas_lost(records)
        self._reconciled.set()
        for layout in layouts.values():
            for partition, record in enumerate(layout.partitions):
                gid = group_id_of(layout.record.table_id, partition)
                if self.node_id in record.replicas:
                    wanted.add(gid)
                    if gid not in self._replicas and gid not in lost:
                        self._open_replica(layout, partition)
        gone = []
        for gid, replica in self._replicas.items():
            lagging = records.get(gid)
            if gid not in wanted and lagging is not None:
                core = self.host.group(gid).node
                if keeps_replica(self.node_id, lagging, group_epoch=core.epoch,
                                 group_members=core.conf_state.members()):
                    continue  # the record lags the group (keeps_replica)
            if gid not in wanted and not replica.dropped:
                # The replica stops serving at once; its group and files go next.
                replica.dropped = True
                gone.append(gid)
                _log.info("table_replica_dropped", table=replica.table, group=gid)
        return gone

    async def _remove_replica(self, gid: int) -> None:
        """A dropped table's replica: its Raft group, RocksDB and files go."""
        replica = self._replicas.get(gid)
        if replica is None:
            return
        await self.host.remove_group(gid)
        self.scan_contexts.drop_group(gid)
        replica.machine.store.close()
        directory = replica.machine.store.path
        await asyncio.get_running_loop().run_in_executor(
            None, functools.partial(shutil.rmtree, directory, ignore_errors=True))
        del self._replicas[gid]
        _log.info("table_replica_removed", table=replica.table, group=gid)

    def _replicas_lost(self, records: dict[int, PartitionRecord]) -> set[int]:
        """The groups this node must not host (``LostReplicas``)."""
        first_look = self._lost.nothing_on_disk
        lost = self._lost.update(records, self._replicas.keys())
        if first_look and self._lost.data_lost:
            _log.error("table_data_lost", node=self.node_id, data_dir=str(self.data_dir),
                       voter_of=[f"{g:016x}" for g in sorted(lost)],
                       error=("this node's data directory is empty, yet partition records "
                              "count it as a voter: its data was lost with the disk; the "
                              "scheduler replaces those replicas"))
        if lost:
            now = time.monotonic()
            if now - self._lost_logged >= LOST_LOG_INTERVAL_S:
                self._lost_logged = now
                _log.warning("table_replicas_lost", node=self.node_id,
                             groups=[f"{g:016x}" for g in sorted(lost)],
                             reason="its table Raft data is gone; the scheduler replaces them")
        return set(lost)

    def _open_replica(self, layout: TableLayout, partition: int) -> None:
        gid = group_id_of(layout.record.table_id, partition)
        store = TableStore(self.data_dir / "replicas" / f"{gid:016x}",
                           cluster_id=self.config.cluster_id)
        machine = PartitionMachine(store, TimetagClock(), self.data_dir / "staging")
        self._replicas[gid] = _Replica(layout.name, layout.record.table_id, partition, gid,
                                       machine)
        record = layout.partitions[partition]
        # A record never changed since create (epoch 0) lists the founding voters, who
        # bootstrap the group; a replica assigned later joins: no voters of its own,
        # it learns the configuration and the data (a snapshot) from the leader. A
        # replica already on disk reopens what it has either way.
        joining = record.epoch > 0 or self.node_id not in record.members
        self.host.add_group(gid, None if joining else set(record.members), machine,
                            combine=combine_entries,
                            broadcast_commit=self.config.broadcast_commit)
        _log.info("table_replica_opened", table=layout.name, partition=partition, group=gid,
                  joining=joining)

    def _led_replicas(self) -> list[LedReplica]:
        return [LedReplica(r.table, gid, r.machine)
                for gid, r in self._replicas.items() if not r.dropped]

    def _hosted(self) -> list[HostedPartition]:
        return [HostedPartition(r.table, r.partition, gid, r.machine.store)
                for gid, r in self._replicas.items() if not r.dropped]

    # ----- heartbeats and scheduled changes ------------------------------------------

    async def _heartbeat_loop(self) -> None:
        """Report to the meta leader's scheduler; carry out the changes it answers."""
        while True:
            await asyncio.sleep(self.config.heartbeat_interval_ms / 1000)
            try:
                changes = await self._heartbeats.send(self.node_report())
            except QuorumlogError as exc:
                _log.warning("table_heartbeat_failed", node=self.node_id, error=exc.message)
                continue
            for change in changes:
                outcome = self.executor.submit(change)
                TABLE_METRICS.changes[outcome.value] += 1
                if outcome is ChangeOutcome.NOT_HOSTED:
                    _log.info("table_change_for_unknown_group", group=change.group_id)

    def node_report(self) -> NodeReport:
        groups = tuple(
            group_report(self.host, gid, replica.machine.store.path)
            for gid, replica in sorted(self._replicas.items()) if not replica.dropped)
        return NodeReport(node_id=self.node_id, address=self.address, zone=self.config.zone,
                          disk_free_bytes=disk_free_bytes(self.data_dir), groups=groups,
                          lost_groups=tuple(sorted(self._lost.groups or ())))

    # ----- requests ---------------------------------------------------------------

    def _replica(self, table_id: int, partition: int) -> _Replica:
        gid = group_id_of(table_id, partition) if table_id > 0 else 0
        replica = self._replicas.get(gid)
        if replica is None or replica.dropped:
            raise PartitionNotHostedError(
                f"node {self.node_id} hosts no replica of table id {table_id} partition "
                f"{partition}; refresh the table layout and retry")
        return replica

    async def _read(self, table_id: int, partition: int, stale_ok: bool) -> TableStore:
        """The store to read, after a ReadIndex round on the leader; with
        ``stale_ok`` any replica's store as it is (follower read)."""
        replica = self._replica(table_id, partition)
        if not stale_ok:
            await self.host.read_barrier(replica.group_id)
        return replica.machine.store

    def _on_write(self, request: TableWriteRequest,
                  ctx: rpc.RequestContext,
                  ) -> TableWriteResponse | rpc.DeferredAnswer[Any, TableWriteResponse]:
        """A plain function answering from the proposal's future (rpc runs no
        task or coroutine per write: the hot path of every set)."""
        replica = self._replica(request.table_id, request.partition)
        self.host.require_leader(self.host.group(replica.group_id))
        outcome = self._propose_write(replica, request.commands, request.client_id,
                                      request.seq, request.first_outstanding_seq)
        if isinstance(outcome, list):
            return TableWriteResponse(results=outcome)
        return rpc.answer_from(outcome, _write_response)

    def _on_write_batch(self, request: TableWriteBatchRequest, ctx: rpc.RequestContext,
                        ) -> TableWriteBatchResponse | rpc.DeferredAnswer[
                            Any, TableWriteBatchResponse]:
        """A client's concurrent writes to one group in one request: each is
        proposed as :meth:`_on_write` proposes one, and answered or failed on
        its own; the answer goes when the last is done."""
        replica = self._replica(request.table_id, request.partition)
        self.host.require_leader(self.host.group(replica.group_id))
        if not 1 <= len(request.writes) <= WRITE_BATCH_WRITES_MAX:
            raise BadTableRequestError(f"a write batch holds 1..{WRITE_BATCH_WRITES_MAX} "
                                       f"writes, got {len(request.writes)}")
        outcomes: list[list[Any] | asyncio.Future[Any] | QuorumlogError] = []
        for item in request.writes:
            try:
                outcomes.append(self._propose_write(replica, item.commands, item.client_id,
                                                    item.seq, item.first_outstanding_seq))
            except QuorumlogError as exc:
                outcomes.append(exc)
        pending = [o for o in outcomes if isinstance(o, asyncio.Future)]
        if not pending:
            return _batch_response(outcomes)

        def answer(_: object) -> TableWriteBatchResponse:
            return _batch_response(outcomes)

        # Answered when the last write is done, and not one loop turn later
        # through a future of its own (5 % more sets/s at 64 clients): the
        # writes were proposed in order and are applied in log order, so the
        # earlier ones are done by then (failures too: leadership changes fail
        # every waiting proposal at once, deadlines expire in proposal order).
        # One that is not counts as dropped; its client retries it with its id.
        return rpc.answer_from(pending[-1], answer, convert_error=answer)

    def _propose_write(self, replica: _Replica, commands: list[WriteCommand], client_id: int,
                       seq: int, first_outstanding_seq: int) -> list[Any] | asyncio.Future[Any]:
        """Propose one write at this leader: its results at once (refused), or the
        future of its proposal's results."""
        if self.disk.check() and not all(isinstance(c, DELETE_COMMANDS) for c in commands):
            raise DiskInsufficientError(self.disk.message())
        refusal = self._refuse_non_idempotent(replica.table, commands)
        if refusal is not None:
            return [refusal] * len(commands)
        entry_commands = tuple(commands)
        observe_duplicates(replica.machine.clock, entry_commands)
        entry = TableEntry(timestamp_us=replica.machine.clock.next(time.time_ns() // 1000),
                           commands=entry_commands, client_id=client_id, seq=seq,
                           first_outstanding_seq=first_outstanding_seq)
        # Requests reaching this leader before the next ready pass share a log entry.
        return self.host.propose_nowait(replica.group_id, encode_entry(entry), combine=True)

    def _refuse_non_idempotent(self, table: str,
                               commands: list[WriteCommand]) -> Refused | None:
        if not any(isinstance(c, NON_IDEMPOTENT_COMMANDS) for c in commands):
            return None
        if not self.dups.active_dups(table):
            return None
        if self._flags.get(table, TableFlags()).allow_non_idempotent_writes:
            return None
        return Refused(
            f"table {table!r} is duplicated to another cluster: increment and "
            "check_and_mutate are refused, since concurrent ones on both clusters do not add "
            "up under last-writer-wins; use set/delete, or allow them with `quorumlog dup "
            f"allow-non-idempotent {table} --allow` if one cluster alone writes these keys",
            code=NON_IDEMPOTENT_REFUSED)

    async def _on_get(self, request: TableGetRequest,
                      ctx: rpc.RequestContext) -> TableGetResponse:
        store = await self._read(request.table_id, request.partition, request.stale_ok)
        return TableGetResponse(value=store.get(request.hash_key, request.sort_key, _now_s()))

    async def _on_multi_get(self, request: TableMultiGetRequest,
                            ctx: rpc.RequestContext) -> TableMultiGetResponse:
        store = await self._read(request.table_id, request.partition, request.stale_ok)
        return TableMultiGetResponse(
            values=store.multi_get(request.hash_key, request.sort_keys, _now_s()))

    async def _on_scan(self, request: TableScanRequest,
                       ctx: rpc.RequestContext) -> TableScanResponse:
        context_id = request.context_id
        if context_id:  # the next page of a snapshot scan: this node holds its view
            group_id = self._replica(request.table_id, request.partition).group_id
            store = self.scan_contexts.get(context_id, group_id)
        else:
            store = await self._read(request.table_id, request.partition, request.stale_ok)
            if request.open_context:
                group_id = self._replica(request.table_id, request.partition).group_id
                context_id = self.scan_contexts.open(group_id, store)
                store = self.scan_contexts.get(context_id, group_id)
        if request.full:
            page = store.full_scan(_now_s(), limit=request.limit, after=request.after,
                                   partitions=request.of_partitions,
                                   partition=request.of_partition)
        else:
            page = store.scan(request.hash_key, _now_s(), start=request.start, stop=request.stop,
                              start_inclusive=request.start_inclusive,
                              stop_inclusive=request.stop_inclusive, limit=request.limit,
                              reverse=request.reverse, after=request.after)
        if context_id and page.next_after is None:
            self.scan_contexts.close(context_id)  # the last page
            context_id = 0
        return TableScanResponse(
            items=[(item.hash_key, item.sort_key, item.value) for item in page.items],
            next_after=page.next_after,
            details=[(item.expire_ts_s, item.timetag) for item in page.items]
            if request.details else [], context_id=context_id)

    async def _on_count(self, request: TableCountRequest,
                        ctx: rpc.RequestContext) -> TableCountResponse:
        store = await self._read(request.table_id, request.partition, request.stale_ok)
        return TableCountResponse(count=store.sort_key_count(request.hash_key, _now_s()))

    async def _on_ttl(self, request: TableTtlRequest,
                      ctx: rpc.RequestContext) -> TableTtlResponse:
        store = await self._read(request.table_id, request.partition, request.stale_ok)
        ttl = store.ttl_s(request.hash_key, request.sort_key, _now_s())
        return TableTtlResponse(exists=ttl is not None, ttl_s=-1 if ttl is None else ttl)

    def status(self) -> list[dict[str, Any]]:
        return self.host.status()


def _now_s() -> int:
    return int(time.time())


def _monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


def _write_response(results: list[Any]) -> TableWriteResponse:
    return TableWriteResponse(results=list(results))


def _batch_response(outcomes: list[list[Any] | asyncio.Future[Any] | QuorumlogError]
                    ) -> TableWriteBatchResponse:
    """Each write's results or error; a write whose future is not done yet is
    answered as dropped (retriable: the client sends it again with its id)."""
    results: list[list[Any]] = []
    errors: list[rpc.ErrorResponse | None] = []
    for outcome in outcomes:
        settled: list[Any] | QuorumlogError
        if not isinstance(outcome, asyncio.Future):
            settled = outcome
        elif not outcome.done():
            settled = ProposalDroppedError(
                "the write was not applied when the batch was answered; retry it")
        elif outcome.cancelled():
            settled = ProposalDroppedError("the write's proposal was cancelled; retry")
        elif (error := outcome.exception()) is not None:
            settled = error if isinstance(error, QuorumlogError) else QuorumlogError(
                f"the write failed: {error!r}")
        else:
            settled = list(outcome.result())
        if isinstance(settled, QuorumlogError):
            results.append([])
            errors.append(rpc.error_to_wire(settled))
        else:
            results.append(settled)
            errors.append(None)
    return TableWriteBatchResponse(results=results, errors=errors)
