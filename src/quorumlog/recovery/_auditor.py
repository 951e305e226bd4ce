"""The auditor: one per cluster, elected through an ephemeral meta key.

Each round (``audit_interval_ms``) the holder of ``/recovery/auditor``:

1. reads the registered bookies (``/bookies/available/``) and every bookie
   that ever started (``/bookies/cookies/``); a known bookie that is not
   registered gets ``/recovery/missing/<id>`` with the time it was first seen
   gone (persistent, so a new auditor keeps counting from there); a bookie
   registered again loses that key;
2. a bookie missing for ``lost_bookie_recovery_delay_ms``, or draining, is
   lost: every ledger whose fragments name one gets one task
   ``/underreplicated/<ledger>`` (a task already there gains the new bookies).

A bookie back before the delay never gets a task. A task for a bookie that
came back later is re-checked by the worker against the bookie's data.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from quorumlog import proto as wire
from quorumlog.clock import SYSTEM_CLOCK, Clock
from quorumlog.errors import QuorumlogError
from quorumlog.ledger import LedgerMetadata
from quorumlog.log import get_logger
from quorumlog.recovery import _layout as layout
from quorumlog.recovery._config import RecoveryConfig
from quorumlog.recovery._metrics import LEDGERS_LOST, TASKS_PENDING
from quorumlog.recovery._plan import bookies_to_replace, lost_bookies
from quorumlog.recovery._session import RecoverySession
from quorumlog.recovery._store import RecoveryMeta

_log = get_logger(__name__)


@dataclass(slots=True)
class AuditRound:
    """What one audit round saw and did."""

    lost: set[str] = field(default_factory=set)
    missing: dict[str, int] = field(default_factory=dict)
    tasks_filed: list[int] = field(default_factory=list)
    tasks_pending: int = 0
    skipped_disabled: bool = False


async def ids_under(meta: RecoveryMeta, prefix: str) -> dict[str, bytes]:
    return {kv.key[len(prefix):]: kv.value for kv in await meta.list_keys(prefix)}


async def iter_ledgers(meta: RecoveryMeta, page: int) -> list[tuple[LedgerMetadata, int]]:
    """Every ledger's metadata and version, read ``page`` keys per meta call."""
    out: list[tuple[LedgerMetadata, int]] = []
    start, end = wire.LEDGER_KEY_PREFIX, wire.LEDGER_KEY_PREFIX[:-1] + chr(ord("/") + 1)
    while True:
        result, _ = await meta.range(start, end=end, limit=page)
        for kv in result.kvs:
            try:
                out.append((LedgerMetadata.decode(kv.value), kv.version))
            except QuorumlogError:
                _log.warning("recovery_ledger_metadata_malformed", key=kv.key)
        if len(result.kvs) < page:
            return out
        start = result.kvs[-1].key + "\x00"


class Auditor:
    def __init__(self, auditor_id: str, meta: RecoveryMeta, session: RecoverySession,
                 config: RecoveryConfig, clock: Clock = SYSTEM_CLOCK) -> None:
        self.auditor_id = auditor_id
        self._meta = meta
        self._session = session
        self._config = config
        self._clock = clock

    async def elected(self) -> bool:
        """Hold (or take) the auditor lease; False while another node holds it."""
        return await self._session.hold(layout.AUDITOR_KEY, self.auditor_id.encode())

    async def audit_once(self) -> AuditRound:
        """One round (the caller holds the lease)."""
        out = AuditRound()
        if await self._meta.get(layout.DISABLED_KEY) is not None:
            out.skipped_disabled = True
            return out
        now_ms = self._clock.wall_ms()
        # Registrations counted before the registry is read: a bookie absent from
        # the registry with a count that moved has registered and gone since.
        registrations = await registration_counts(self._meta)
        available = set(await ids_under(self._meta, wire.BOOKIE_REGISTRY_PREFIX))
        # Any outage seen absent in that read began before this: stamped with it,
        # no outage is counted from before it began.
        seen_ms = self._clock.wall_ms()
        known = set(await ids_under(self._meta, wire.BOOKIE_COOKIE_PREFIX))
        draining = set(await ids_under(self._meta, layout.DRAINING_PREFIX))
        recorded = await ids_under(self._meta, layout.MISSING_PREFIX)
        for bookie in sorted(set(recorded) & available):
            await self._meta.delete(layout.missing_key(bookie))  # back in time (or later)
            _log.info("recovery_bookie_back", bookie=bookie)
        for bookie in sorted(known - available):
            out.missing[bookie] = await self._missing_since(
                bookie, recorded.get(bookie), registrations.get(bookie, 0), seen_ms)
        out.lost = lost_bookies(out.missing, now_ms, self._config.lost_bookie_recovery_delay_ms,
                                draining)
        tasks = {int(k): layout.ReplicationTask.decode(v)
                 for k, v in (await ids_under(self._meta, layout.TASK_PREFIX)).items()}
        if out.lost:
            for metadata, _ in await iter_ledgers(self._meta, self._config.audit_ledgers_per_page):
                names = bookies_to_replace(metadata, out.lost)
                if names and await self._file(metadata.ledger_id, names, tasks, now_ms):
                    out.tasks_filed.append(metadata.ledger_id)
        for ledger_id, task in sorted(tasks.items()):
            if await reopen_if_back(self._meta, task, available, registrations):
                tasks[ledger_id] = msgspec.structs.replace(task, state=layout.TaskState.PENDING)
        out.tasks_pending = sum(1 for t in tasks.values() if t.state is layout.TaskState.PENDING)
        out.tasks_pending += sum(1 for i in out.tasks_filed if i not in tasks)
        TASKS_PENDING.set(out.tasks_pending)
        LEDGERS_LOST.set(sum(1 for t in tasks.values() if t.state is layout.TaskState.LOST))
        return out

    async def _missing_since(self, bookie: str, recorded: bytes | None, registrations: int,
                             seen_ms: int) -> int:
        """Since when ``bookie`` counts as gone: from its record, unless it registered
        again since (a return between two rounds); a new record then."""
        if recorded is not None:
            record = layout.MissingBookie.decode(recorded)
            if record.registrations < 0 or record.registrations == registrations:
                return record.since_ms
            kv = await self._meta.get(layout.missing_key(bookie))
            fresh = layout.MissingBookie(bookie=bookie, since_ms=seen_ms,
                                         registrations=registrations)
            if kv is not None:
                await self._meta.cas(layout.missing_key(bookie), kv.version, fresh.encode())
            _log.info("recovery_bookie_back_and_gone", bookie=bookie)
            return seen_ms
        record = layout.MissingBookie(bookie=bookie, since_ms=seen_ms, registrations=registrations)
        await self._meta.cas(layout.missing_key(bookie), 0, record.encode())
        _log.info("recovery_bookie_missing", bookie=bookie)
        return seen_ms

    async def _file(self, ledger_id: int, names: tuple[str, ...],
                    tasks: dict[int, layout.ReplicationTask], now_ms: int) -> bool:
        return await file_task(self._meta, ledger_id, names, tasks, now_ms)


async def registration_counts(meta: RecoveryMeta) -> dict[str, int]:
    """Each bookie's registrations so far (the version of its registrations key)."""
    return {kv.key[len(wire.BOOKIE_REGISTRATIONS_PREFIX):]: int(kv.version)
            for kv in await meta.list_keys(wire.BOOKIE_REGISTRATIONS_PREFIX)}


async def reopen_if_back(meta: RecoveryMeta, task: layout.ReplicationTask, available: set[str],
                         registrations: dict[str, int]) -> bool:
    """Set a LOST task PENDING again when a bookie that could hold the lost entry
    has registered again since (it may hold it); True if reopened."""
    back = sorted(b for b, seen in task.unreachable.items()
                  if b in available and registrations.get(b, 0) != seen)
    if task.state is not layout.TaskState.LOST or not back:
        return False
    kv = await meta.get(layout.task_key(task.ledger_id))
    if kv is None:
        return False
    current = layout.ReplicationTask.decode(kv.value)
    if current.state is not layout.TaskState.LOST:
        return False
    reopened = msgspec.structs.replace(current, state=layout.TaskState.PENDING, attempts=0,
                                       retry_after_ms=0, unreachable={},
                                       error=f"reopened: {', '.join(back)} registered again")
    if await meta.cas(layout.task_key(task.ledger_id), kv.version, reopened.encode()):
        _log.info("recovery_task_reopened", ledger=task.ledger_id, bookies=back)
        return True
    return False


async def file_task(meta: RecoveryMeta, ledger_id: int, names: tuple[str, ...],
                    tasks: dict[int, layout.ReplicationTask], now_ms: int, *,
                    misplaced: tuple[str, ...] = ()) -> bool:
    """File (or widen) the task of ``ledger_id`` for the bookies ``names`` (of
    which ``misplaced`` are to move though they hold their data); True if a task
    was created or gained bookies. ``tasks``: the tasks read this round."""
    existing = tasks.get(ledger_id)
    key = layout.task_key(ledger_id)
    if existing is None:
        task = layout.ReplicationTask(ledger_id=ledger_id, bookies=names, created_ms=now_ms,
                                      misplaced=misplaced)
        filed = await meta.cas(key, 0, task.encode())
        if filed:
            _log.info("recovery_task_filed", ledger=ledger_id, bookies=list(names),
                      misplaced=list(misplaced))
        return filed
    if set(names) <= set(existing.bookies) or existing.state is not layout.TaskState.PENDING:
        return False
    kv = await meta.get(key)
    if kv is None:
        return False
    current = layout.ReplicationTask.decode(kv.value)
    merged = tuple(sorted(set(current.bookies) | set(names)))
    moved = tuple(sorted(set(current.misplaced) | set(misplaced)))
    return bool(await meta.cas(key, kv.version, msgspec.structs.replace(
        current, bookies=merged, misplaced=moved).encode()))
