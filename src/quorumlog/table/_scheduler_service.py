"""The scheduler in the meta leader's process (Curve's MDS): heartbeats in,
changes out, partition records kept up to date.

A node with the meta role serves :class:`TableHeartbeatRequest`; only the
meta leader answers (others raise ``NotLeaderError`` with the leader's
address). The view lives in memory (:class:`Scheduler`); a member that
becomes leader starts a fresh one. Every ``heartbeat_interval_ms`` the leader
lists ``/tables/`` and, for each partition whose leader reports a settled
configuration other than the record's, rewrites
``/tables/<name>/partitions/<p>`` (members, learners, epoch) with a CAS on
the key's version, so clients and table nodes see the new layout. The same
pass tells the scheduler each group's replica count (the table record's
``replicas``), which its replica-count policy restores, and the nodes being
drained (``/table-drain/<node>``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from quorumlog import rpc
from quorumlog.errors import NotLeaderError, QuorumlogError, TransientError
from quorumlog.log import get_logger
from quorumlog.meta import MetaClient, MetaService
from quorumlog.table._heartbeat import (
    GroupState,
    ScheduleRow,
    TableHeartbeatRequest,
    TableHeartbeatResponse,
    TableScheduleRequest,
    TableScheduleResponse,
)
from quorumlog.table._layout import (
    TABLES_PREFIX,
    PartitionRecord,
    draining_nodes,
    encode,
    group_id_of,
    parse_layouts,
    partition_key,
)
from quorumlog.table._scheduler import GroupView, Scheduler, SchedulerConfig

_log = get_logger(__name__)


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


class SchedulerService:
    """See the module docstring."""

    def __init__(self, meta: MetaService, meta_addresses: list[str], config: SchedulerConfig,
                 *, heartbeat_interval_ms: int, clock_ms: Callable[[], int] = monotonic_ms
                 ) -> None:
        config.validate()
        self._meta = meta
        self._client = MetaClient(meta_addresses)
        self.config = config
        self._interval_s = heartbeat_interval_ms / 1000
        self._clock_ms = clock_ms
        self.scheduler: Scheduler | None = None
        self._term = 0
        self._task: asyncio.Task[None] | None = None
        self.records_written = 0

    def handlers(self) -> dict[type[rpc.Request[Any]], Any]:
        return {TableHeartbeatRequest: self._on_heartbeat,
                TableScheduleRequest: self._on_schedule}

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._record_loop(),
                                                            name="table-scheduler")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._client.close()

    # ----- leadership ------------------------------------------------------------

    def _leader_scheduler(self) -> Scheduler:
        """This member's scheduler if it leads meta (a new term: a new, empty view)."""
        rows = self._meta.host.status()
        if not rows:
            raise TransientError("meta is starting on this node; retry")
        row = rows[0]
        if row["role"] != "leader":
            leader = row["leader"]
            self.scheduler = None
            raise NotLeaderError(
                "this meta member is not the leader; table heartbeats go to the leader",
                leader_hint=self._meta.host.address_of(leader) if leader else None)
        if self.scheduler is None or self._term != row["term"]:
            self.scheduler = Scheduler(self.config, started_ms=self._clock_ms())
            self._term = row["term"]
            _log.info("table_scheduler_started", term=self._term)
        return self.scheduler

    async def _on_heartbeat(self, request: TableHeartbeatRequest,
                            ctx: rpc.RequestContext) -> TableHeartbeatResponse:
        scheduler = self._leader_scheduler()
        now = self._clock_ms()
        scheduler.heartbeat(request.report, now)
        for change in scheduler.plan(now):
            _log.info("table_change_scheduled", group=change.group_id, kind=change.kind.value,
                      node=change.node_id, remove=change.remove_node_id or None,
                      epoch=change.epoch, reason=change.reason)
        return TableHeartbeatResponse(changes=scheduler.changes_for(request.report.node_id))

    async def _on_schedule(self, request: TableScheduleRequest,
                           ctx: rpc.RequestContext) -> TableScheduleResponse:
        scheduler = self._leader_scheduler()
        now = self._clock_ms()
        rows = [ScheduleRow(change=p.change, issued_ms=p.issued_ms, state="pending",
                            age_ms=now - p.issued_ms) for p in scheduler.pending.values()]
        rows += [ScheduleRow(change=f.change, issued_ms=f.issued_ms, state=f.outcome,
                             age_ms=now - f.finished_ms) for f in reversed(scheduler.recent)]
        nodes = [(n.node_id, n.zone, not scheduler.is_dead(n.node_id, now),
                  now - n.last_seen_ms) for _, n in sorted(scheduler.nodes.items())]
        groups = [GroupState(group_id=g.group_id, leader=g.leader, epoch=g.epoch,
                             voters=g.voters, learners=g.learners,
                             applied_index=g.applied.get(g.leader, 0), size_bytes=g.size_bytes,
                             change_in_progress=g.change_in_progress)
                  for _, g in sorted(scheduler.groups.items())]
        draining = [(node, scheduler.drain_remaining(node))
                    for node in sorted(scheduler.draining)]
        return TableScheduleResponse(leader=self._meta.host.node_id, nodes=nodes, changes=rows,
                                     groups=groups, draining=draining)

    # ----- partition records -------------------------------------------------------

    async def _record_loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            scheduler = self.scheduler
            if scheduler is None:
                continue
            try:
                await self.sync_records(scheduler)
            except QuorumlogError as exc:
                _log.warning("table_records_sync_failed", error=exc.message)

    async def sync_records(self, scheduler: Scheduler) -> None:
        """Write the settled configurations leaders report into the partition records."""
        scheduler.set_draining(await draining_nodes(self._client))
        kvs = await self._client.list_keys(TABLES_PREFIX)
        layouts = parse_layouts([(kv.key, kv.value) for kv in kvs])
        versions = {kv.key: kv.version for kv in kvs}
        known: set[int] = set()
        for layout in layouts.values():
            for partition, record in enumerate(layout.partitions):
                gid = group_id_of(layout.record.table_id, partition)
                known.add(gid)
                scheduler.set_replicas_target(gid, layout.record.replicas)
                view = scheduler.groups.get(gid)
                new = None if view is None else updated_record(view, record)
                if new is None:
                    continue
                key = partition_key(layout.name, partition)
                if await self._client.cas(key, versions[key], encode(new)):
                    self.records_written += 1
                    _log.info("table_partition_recorded", table=layout.name,
                              partition=partition, members=list(new.members),
                              learners=list(new.learners), epoch=new.epoch)
        for gid in [g for g in scheduler.groups if g not in known]:
            scheduler.forget_group(gid)


def updated_record(view: GroupView, record: PartitionRecord) -> PartitionRecord | None:
    """The record of the settled configuration the group's leader reports, or
    None when the record already says it (or nothing is settled).

    A member the configuration removed stays in the record's members until
    every voter of the configuration reports the leader's epoch, i.e. has
    applied it. The record is what makes the removed member's node drop its
    replica, and a voter that holds the leave-joint entry but not its commit
    still counts votes in the joint configuration, which needs a majority of
    the old members too: with the removed replica gone and the leader dead,
    the group would have no electable majority left (found by the table
    simulator; docs/table.md, "Removed replicas"). A removed replica kept a
    while longer only answers votes and redirects.
    """
    if not view.leader or view.change_in_progress or not view.voters:
        return None
    members = set(view.voters)
    removed = set(record.members) - members - set(view.learners)
    if removed and any(view.epochs.get(voter, 0) < view.epoch for voter in view.voters):
        members |= removed
    new = PartitionRecord(members=tuple(sorted(members)), epoch=view.epoch,
                          learners=view.learners)
    if (tuple(sorted(record.members)) == new.members
            and tuple(sorted(record.learners)) == new.learners):
        return None
    return new
