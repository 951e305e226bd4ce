"""What the ``quorumlog recovery`` commands read and write in meta."""

from __future__ import annotations

from dataclasses import dataclass, field

from quorumlog.meta import MetaClient
from quorumlog.recovery import _layout as layout


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
