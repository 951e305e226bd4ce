"""What the ``quorumlog recovery`` and ``quorumlog bookie decommission`` commands
read and write in meta."""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from quorumlog import proto as wire
from quorumlog.errors import UsageError
from quorumlog.meta import MetaClient
from quorumlog.recovery import _layout as layout
from quorumlog.recovery._auditor import iter_ledgers

DECOMMISSION_LEDGERS_PER_PAGE = 1_000
"""Ledger metadata keys read per meta range call while checking a decommission."""


@dataclass(slots=True)
class RecoveryStatus:
    enabled: bool
    auditor: str  # "" when no auditor holds the lease
    missing: dict[str, int] = field(default_factory=dict)  # bookie -> since (wall ms)
    draining: list[str] = field(default_factory=list)
    tasks: dict[str, int] = field(default_factory=dict)  # state -> count


async def underreplicated(meta: MetaClient) -> list[layout.ReplicationTask]:
    """Every under-replication task, by ledger id."""
    tasks = [layout.ReplicationTask.decode(kv.value)
             for kv in await meta.list_keys(layout.TASK_PREFIX)]
    return sorted(tasks, key=lambda t: t.ledger_id)


async def recovery_status(meta: MetaClient) -> RecoveryStatus:
    auditor = await meta.get(layout.AUDITOR_KEY)
    status = RecoveryStatus(
        enabled=await meta.get(layout.DISABLED_KEY) is None,
        auditor=auditor.value.decode() if auditor is not None else "")
    for kv in await meta.list_keys(layout.MISSING_PREFIX):
        record = layout.MissingBookie.decode(kv.value)
        status.missing[record.bookie] = record.since_ms
    status.draining = sorted(kv.key[len(layout.DRAINING_PREFIX):]
                             for kv in await meta.list_keys(layout.DRAINING_PREFIX))
    for task in await underreplicated(meta):
        status.tasks[task.state.value] = status.tasks.get(task.state.value, 0) + 1
    return status


async def set_recovery_enabled(meta: MetaClient, enabled: bool) -> None:
    """Resume (True) or pause (False) the auditor and every worker, cluster-wide."""
    if enabled:
        await meta.delete(layout.DISABLED_KEY)
    else:
        await meta.put(layout.DISABLED_KEY, b"disabled by quorumlog recovery disable")


class DecommissionRefusedError(UsageError):
    """Decommissioning the bookie would leave too few bookies for its ledgers."""


@dataclass(slots=True)
class DecommissionProgress:
    """Where a decommission stands: what still names the bookie in ledger metadata."""

    bookie: str
    draining: bool
    ledgers: list[int] = field(default_factory=list)  # ledgers some fragment of which names it
    fragments: int = 0                                # (fragment, position) slots naming it
    tasks: dict[str, int] = field(default_factory=dict)  # its tasks by state
    stuck: list[str] = field(default_factory=list)    # lost / failed tasks: "ledger: error"
    widest_ensemble: int = 0                          # largest E among those ledgers

    @property
    def done(self) -> bool:
        return not self.ledgers


async def _writable_bookies(meta: MetaClient) -> set[str]:
    draining = {kv.key[len(layout.DRAINING_PREFIX):]
                for kv in await meta.list_keys(layout.DRAINING_PREFIX)}
    out: set[str] = set()
    for kv in await meta.list_keys(wire.BOOKIE_REGISTRY_PREFIX):
        try:
            registration = wire.BookieRegistration.decode(kv.value)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
        if not registration.read_only and registration.id not in draining:
            out.add(registration.id)
    return out


async def decommission_progress(meta: MetaClient, bookie: str,
                                page: int = DECOMMISSION_LEDGERS_PER_PAGE) -> DecommissionProgress:
    """What still names ``bookie``: ledgers, fragment slots, and its tasks."""
    progress = DecommissionProgress(
        bookie=bookie, draining=await meta.get(layout.draining_key(bookie)) is not None)
    for metadata, _ in await iter_ledgers(meta, page):
        slots = sum(1 for fragment in metadata.ensembles for b in fragment.bookies if b == bookie)
        if slots:
            progress.ledgers.append(metadata.ledger_id)
            progress.fragments += slots
            progress.widest_ensemble = max(progress.widest_ensemble, metadata.ensemble_size)
    for task in await underreplicated(meta):
        if bookie not in task.bookies:
            continue
        progress.tasks[task.state.value] = progress.tasks.get(task.state.value, 0) + 1
        if task.state is not layout.TaskState.PENDING:
            progress.stuck.append(f"ledger {task.ledger_id} {task.state.value}: {task.error}")
    return progress


async def decommission(meta: MetaClient, bookie: str,
                       page: int = DECOMMISSION_LEDGERS_PER_PAGE) -> DecommissionProgress:
    """Mark ``bookie`` draining: the auditor files a task for every ledger it holds
    and the workers copy its fragments elsewhere (reading from it meanwhile).
    Refuses when the other writable bookies are fewer than the ensemble size of
    a ledger it holds, since that ledger could not be given a full ensemble."""
    if await meta.get(wire.BOOKIE_COOKIE_PREFIX + bookie) is None:
        raise UsageError(f"no bookie {bookie!r} ever started in this cluster "
                         "(see `quorumlog bookie list`)")
    remaining = await _writable_bookies(meta) - {bookie}
    progress = await decommission_progress(meta, bookie, page)
    widest = progress.widest_ensemble
    if widest > len(remaining):
        raise DecommissionRefusedError(
            f"cannot decommission {bookie}: it holds ledgers of ensemble size {widest}, and "
            f"only {len(remaining)} other writable bookie(s) would remain "
            f"({', '.join(sorted(remaining)) or 'none'}); add bookies first")
    await meta.cas(layout.draining_key(bookie), 0, b"decommission")  # already there: fine
    progress.draining = True
    return progress


async def cancel_decommission(meta: MetaClient, bookie: str) -> bool:
    """Stop draining ``bookie`` (True if it was draining). Fragments already copied
    stay where they are; a task still filed for it finds the bookie holding its
    data and copies nothing."""
    was = await meta.get(layout.draining_key(bookie)) is not None
    await meta.delete(layout.draining_key(bookie))
    return was
