"""Table nodes and the scheduler: heartbeat messages, the sender, the change executor.

Every ``[table] heartbeat_interval_ms`` a table node sends a
:class:`TableHeartbeatRequest` (its capacity and a :class:`GroupReport` per
hosted group) to the meta leader, whose ``SchedulerService`` answers with
the configuration changes for the groups this node leads. A meta member that
is not the leader answers ``NotLeaderError`` with the leader's address; the
node follows it, or tries the next member.

:class:`ChangeExecutor` applies a change only while the node leads the group
and the group's epoch is the one the change was decided at (Curve): a stale
change is ignored and logged. One change per group runs at a time.

Type ids 3100..3109 (docs/rpc.md: 3000..3999 are the table's).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from enum import StrEnum
from pathlib import Path
from typing import ClassVar

import msgspec

from quorumlog import rpc
from quorumlog.errors import (
    DeadlineExceededError,
    NotLeaderError,
    QuorumlogError,
    UsageError,
    invariant,
)
from quorumlog.log import get_logger
from quorumlog.raft import (
    ConfChange,
    ConfChangeSingle,
    ConfChangeType,
    RaftHost,
    RaftNode,
    Role,
)
from quorumlog.table._scheduler import ChangeKind, GroupReport, NodeReport, ScheduledChange

_log = get_logger(__name__)

HEARTBEAT_TIMEOUT_S = 2.0  # one heartbeat round trip to one meta member
CHANGE_TIMEOUT_S = 30.0  # one configuration change, proposed until applied on the leader
SCHEDULE_DEADLINE_S = 10.0  # `quorumlog table schedule` / `info`: finding the meta leader
SCHEDULE_RETRY_S = 0.2  # pause between rounds when no member knows the leader


class TableHeartbeatResponse(rpc.Message, frozen=True):
    type_id: ClassVar[int] = 3101
    changes: list[ScheduledChange]


class TableHeartbeatRequest(rpc.Request[TableHeartbeatResponse], frozen=True):
    type_id: ClassVar[int] = 3100
    report: NodeReport


class ScheduleRow(msgspec.Struct, frozen=True):
    """One change in the scheduler's view (``quorumlog table schedule``)."""

    change: ScheduledChange
    issued_ms: int  # on the meta leader's monotonic clock
    state: str  # pending, done, timed_out
    age_ms: int


class GroupState(msgspec.Struct, frozen=True):
    """A group as the scheduler sees it (its leader's last report)."""

    group_id: int
    leader: int
    epoch: int
    voters: tuple[int, ...]
    learners: tuple[int, ...]
    applied_index: int
    size_bytes: int
    change_in_progress: bool


class TableScheduleResponse(rpc.Message, frozen=True):
    type_id: ClassVar[int] = 3103
    leader: int  # the meta leader answering
    nodes: list[tuple[int, str, bool, int]]  # (node id, zone, alive, ms since last heartbeat)
    changes: list[ScheduleRow]
    groups: list[GroupState]
    # (node id, replicas still on it) of each node being drained
    draining: list[tuple[int, int]] = []


class TableScheduleRequest(rpc.Request[TableScheduleResponse], frozen=True):
    type_id: ClassVar[int] = 3102


class ChangeOutcome(StrEnum):
    STARTED = "started"
    STALE_EPOCH = "stale_epoch"
    NOT_LEADER = "not_leader"
    NOT_HOSTED = "not_hosted"
    BUSY = "busy"
    TARGET_SILENT = "target_silent"  # a leader transfer to a node the leader cannot hear


class ChangeExecutor:
    """Runs the scheduler's changes on this node's Raft host, epoch-guarded."""

    def __init__(self, host: RaftHost) -> None:
        self.host = host
        self._running: dict[int, asyncio.Task[None]] = {}
        self.ignored_stale = 0

    def submit(self, change: ScheduledChange) -> ChangeOutcome:
        """Start ``change`` if it still applies; say why not otherwise."""
        outcome = self._check(change)
        if outcome is ChangeOutcome.STARTED:
            task = asyncio.get_running_loop().create_task(self._run(change))
            self._running[change.group_id] = task
            task.add_done_callback(lambda _t: self._running.pop(change.group_id, None))
        elif outcome is ChangeOutcome.STALE_EPOCH:
            self.ignored_stale += 1
            _log.info("table_change_ignored_stale_epoch", group=change.group_id,
                      kind=change.kind.value, change_epoch=change.epoch,
                      group_epoch=self.host.group(change.group_id).node.epoch)
        elif outcome is ChangeOutcome.TARGET_SILENT:
            _log.info("table_change_refused_target_silent", group=change.group_id,
                      kind=change.kind.value, node=change.node_id, reason=change.reason)
        return outcome

    def _check(self, change: ScheduledChange, *, running: bool = False) -> ChangeOutcome:
        """``running``: the change's own task asks (its group is busy with it)."""
        if change.group_id in self._running and not running:
            return ChangeOutcome.BUSY
        try:
            node = self.host.group(change.group_id).node
        except UsageError:
            return ChangeOutcome.NOT_HOSTED
        return change_outcome(node, change)

    async def _run(self, change: ScheduledChange) -> None:
        # Checked again: the task starts a moment after submit, the epoch may have moved.
        if self._check_again(change) is not ChangeOutcome.STARTED:
            return
        _log.info("table_change_started", group=change.group_id, kind=change.kind.value,
                  node=change.node_id, remove=change.remove_node_id or None,
                  epoch=change.epoch, reason=change.reason)
        try:
            if change.kind is ChangeKind.TRANSFER_LEADER:
                self.host.transfer_leader(change.group_id, change.node_id)
                return
            await self.host.change_membership(change.group_id, conf_change_of(change),
                                              timeout_s=CHANGE_TIMEOUT_S)
        except QuorumlogError as exc:
            _log.warning("table_change_failed", group=change.group_id,
                         kind=change.kind.value, error=exc.message)

    def _check_again(self, change: ScheduledChange) -> ChangeOutcome:
        outcome = self._check(change, running=True)
        if outcome is ChangeOutcome.STALE_EPOCH:
            self.ignored_stale += 1
            _log.info("table_change_ignored_stale_epoch", group=change.group_id,
                      kind=change.kind.value, change_epoch=change.epoch)
        return outcome

    async def close(self) -> None:
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def change_outcome(node: RaftNode | None, change: ScheduledChange) -> ChangeOutcome:
    """Whether ``change`` may start on this replica of its group (``node``;
    ``None``: not hosted here): only on the leader, only at the epoch it was
    decided at. The rule :class:`ChangeExecutor` applies, and the simulator too."""
    if node is None:
        return ChangeOutcome.NOT_HOSTED
    if node.role is not Role.LEADER:
        return ChangeOutcome.NOT_LEADER
    if node.epoch != change.epoch:
        return ChangeOutcome.STALE_EPOCH
    if change.kind is ChangeKind.TRANSFER_LEADER and not node.recently_active(change.node_id):
        # The scheduler balances leaders by heartbeats to meta, which a node cut
        # from its peers (or silent for less than node_dead_after_ms) still
        # passes. A transfer to it would stop the group's proposals until it
        # timed out, and the scheduler would ask again: writes stalled for as
        # long as the node stayed cut off (tests/netns/test_netns_jepsen.py).
        return ChangeOutcome.TARGET_SILENT
    return ChangeOutcome.STARTED


def conf_change_of(change: ScheduledChange) -> ConfChange:
    """The Raft configuration change of a scheduled change (not a leader transfer)."""
    single = ConfChangeSingle
    if change.kind is ChangeKind.ADD_LEARNER:
        return ConfChange(changes=(single(type=ConfChangeType.ADD_LEARNER,
                                          node_id=change.node_id),))
    if change.kind is ChangeKind.REMOVE:
        return ConfChange(changes=(single(type=ConfChangeType.REMOVE_NODE,
                                          node_id=change.node_id),))
    if change.kind is ChangeKind.PROMOTE:
        changes = [single(type=ConfChangeType.ADD_NODE, node_id=change.node_id)]
        if change.remove_node_id:
            changes.append(single(type=ConfChangeType.REMOVE_NODE,
                                  node_id=change.remove_node_id))
        # Promote and remove as one joint change (C_old,new then C_new), left automatically.
        return ConfChange(changes=tuple(changes),
                          transition="joint_implicit" if change.remove_node_id else "auto")
    raise UsageError(f"{change.kind.value} is not a membership change")


def group_report(host: RaftHost, group_id: int, replica_dir: Path) -> GroupReport:
    """What this node reports of one hosted group."""
    node = host.group(group_id).node
    size_bytes = directory_bytes(replica_dir) if node.role is Role.LEADER else 0
    return report_of(group_id, node, host.group(group_id).applied_index, size_bytes)


def report_of(group_id: int, node: RaftNode, applied_index: int,
              size_bytes: int) -> GroupReport:
    """A group's report from its Raft core: membership only from the leader.
    (``group_report`` for a ``RaftHost``; the simulator calls it directly.)"""
    leader = node.role is Role.LEADER
    cs = node.conf_state
    return GroupReport(
        group_id=group_id, leader=leader, epoch=node.epoch, applied_index=applied_index,
        voters=tuple(sorted(cs.voters)) if leader else (),
        learners=tuple(sorted(cs.learners)) if leader else (),
        change_in_progress=leader and (bool(cs.voters_outgoing) or bool(cs.learners_next)
                                       or node.lead_transferee != 0),
        size_bytes=size_bytes if leader else 0)


def directory_bytes(directory: Path) -> int:
    """Bytes of the files directly in ``directory`` (a RocksDB directory is flat)."""
    total = 0
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
    except FileNotFoundError:
        return 0
    return total


def disk_free_bytes(directory: Path) -> int:
    try:
        return shutil.disk_usage(directory).free
    except FileNotFoundError:
        return 0


class HeartbeatSender:
    """Sends heartbeats to the meta leader: follows ``NotLeaderError`` hints,
    else tries the members in turn."""

    def __init__(self, meta_addresses: list[str], pool: rpc.Pool) -> None:
        if not meta_addresses:
            raise UsageError("the table role needs [meta] members to send heartbeats to")
        self._addresses = list(meta_addresses)
        self._pool = pool
        self._leader: str | None = None
        self._next = 0

    async def send(self, report: NodeReport) -> list[ScheduledChange]:
        """One heartbeat; raises the last error when no member answered as leader."""
        last: QuorumlogError | None = None
        for _ in range(len(self._addresses) + 1):
            address = self._leader or self._addresses[self._next % len(self._addresses)]
            try:
                response = await self._pool.call(address, TableHeartbeatRequest(report=report),
                                                 timeout_s=HEARTBEAT_TIMEOUT_S)
            except NotLeaderError as exc:
                last = exc
                self._leader = exc.leader_hint
                if exc.leader_hint is None:
                    self._next += 1
                continue
            except QuorumlogError as exc:
                last = exc
                self._leader = None
                self._next += 1
                continue
            self._leader = address
            return list(response.changes)
        invariant(last is not None, "a heartbeat round ends in an answer or an error")
        assert last is not None  # for mypy; invariant() above checked it
        raise last


async def fetch_schedule(meta_addresses: list[str], pool: rpc.Pool, *,
                         deadline_s: float = SCHEDULE_DEADLINE_S) -> TableScheduleResponse:
    """The meta leader's scheduler view; follows ``NotLeaderError`` hints, retries
    until ``deadline_s`` (then DeadlineExceededError)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + deadline_s
    hint: str | None = None
    tried = 0
    last: QuorumlogError | None = None
    while loop.time() < deadline:
        address = hint or meta_addresses[tried % len(meta_addresses)]
        tried += 1
        try:
            return await pool.call(address, TableScheduleRequest(),
                                   timeout_s=HEARTBEAT_TIMEOUT_S)
        except NotLeaderError as exc:
            last, hint = exc, exc.leader_hint
        except QuorumlogError as exc:
            if not exc.retriable:
                raise
            last, hint = exc, None
        if hint is None:
            await asyncio.sleep(SCHEDULE_RETRY_S)
    raise DeadlineExceededError(
        f"no meta leader answered the schedule request within {deadline_s:.0f} s (last "
        f"error: {last.message if last else 'none'}); check `quorumlog status`")
