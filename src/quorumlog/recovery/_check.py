"""The auditor's periodic replica check: silent loss on a live bookie.

A bookie that is registered and answering can still have lost entries (a
disk swapped under it, an index damaged, a bug). Every ``check_interval_ms``
the auditor reads, for every CLOSED ledger, the entries each registered
bookie of each fragment should hold (all of them, or ``check_sample_percent``
of them, and always the position's last entry) with at most
``check_reads_in_flight_max`` reads in flight. A bookie that answers "no such
entry" or "no such ledger" for one of them gets an under-replication task for
that ledger, as a lost bookie would; the worker finds the slot incomplete
(it re-reads every entry) and copies it to a replacement. A rack- or
zone-aware ledger whose fragment has a write set over fewer failure domains
than ``placement_min_racks`` while the registered bookies would allow more
(a bookie relabelled, or chosen when too few racks were registered) gets a
task that moves one replica (``ReplicationTask.misplaced``: moved though it
holds its data) to a bookie the policy picks. Timeouts and other
errors prove nothing and file nothing. OPEN ledgers are left to their writer.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from quorumlog import proto as wire
from quorumlog.clock import SYSTEM_CLOCK, Clock
from quorumlog.errors import QuorumlogError
from quorumlog.ledger import BookieCandidate, LedgerClient, LedgerMetadata
from quorumlog.log import get_logger
from quorumlog.recovery import _layout as layout
from quorumlog.recovery._auditor import file_task, ids_under, iter_ledgers
from quorumlog.recovery._config import RecoveryConfig
from quorumlog.recovery._metrics import REPLICAS_MISPLACED_FOUND, REPLICAS_MISSING_FOUND
from quorumlog.recovery._plan import (
    entries_of_slot,
    misplaced_bookies,
    placement_label,
    slots_to_replace,
)
from quorumlog.recovery._store import RecoveryMeta

_log = get_logger(__name__)

PERCENT = 100


@dataclass(slots=True)
class CheckRound:
    """What one replica check read and found."""

    ledgers_checked: int = 0
    entries_read: int = 0
    missing: dict[int, set[str]] = field(default_factory=dict)  # ledger -> bookies lacking entries
    misplaced: dict[int, set[str]] = field(default_factory=dict)  # ledger -> bookies to move
    tasks_filed: list[int] = field(default_factory=list)
    skipped_disabled: bool = False


def sample_entries(entries: Sequence[int], percent: int, rng: random.Random) -> list[int]:
    """``percent`` of ``entries`` (at least one, always the last), in order."""
    if percent >= PERCENT or len(entries) <= 1:
        return list(entries)
    count = max(1, len(entries) * percent // PERCENT)
    chosen = set(rng.sample(list(entries[:-1]), max(count - 1, 0))) | {entries[-1]}
    return sorted(chosen)


class ReplicaChecker:
    def __init__(self, client: LedgerClient, meta: RecoveryMeta, config: RecoveryConfig, *,
                 clock: Clock = SYSTEM_CLOCK, rng: random.Random | None = None) -> None:
        self._client = client
        self._meta = meta
        self._config = config
        self._clock = clock
        self._rng = rng or random.Random()

    async def check_once(self) -> CheckRound:
        """One pass over every closed ledger (the caller holds the auditor lease)."""
        out = CheckRound()
        if await self._meta.get(layout.DISABLED_KEY) is not None:
            out.skipped_disabled = True
            return out
        registered = set(await ids_under(self._meta, wire.BOOKIE_REGISTRY_PREFIX))
        limit = asyncio.Semaphore(self._config.check_reads_in_flight_max)
        candidates: dict[str | None, list[BookieCandidate]] = {}
        for metadata, _ in await iter_ledgers(self._meta, self._config.audit_ledgers_per_page):
            if not metadata.is_closed:
                continue
            out.ledgers_checked += 1
            lacking = await self._check_ledger(metadata, registered, limit, out)
            if lacking:
                out.missing[metadata.ledger_id] = lacking
            label = placement_label(metadata)
            if label is not None and label not in candidates:
                candidates[label] = await self._client.context.candidates(label)
            moved = misplaced_bookies(metadata, candidates.get(label, []), min_racks=(
                self._client.context.config.placement_min_racks))
            if moved:
                out.misplaced[metadata.ledger_id] = moved
        await self._file(out)
        return out

    async def _file(self, out: CheckRound) -> None:
        tasks = {int(k): layout.ReplicationTask.decode(v)
                 for k, v in (await ids_under(self._meta, layout.TASK_PREFIX)).items()}
        now_ms = self._clock.wall_ms()
        for ledger_id in sorted(set(out.missing) | set(out.misplaced)):
            lacking = out.missing.get(ledger_id, set())
            moved = out.misplaced.get(ledger_id, set())
            if lacking:
                REPLICAS_MISSING_FOUND.inc(len(lacking))
                _log.warning("recovery_check_found_missing", ledger=ledger_id,
                             bookies=sorted(lacking))
            if moved:
                REPLICAS_MISPLACED_FOUND.inc(len(moved))
                _log.warning("recovery_check_found_misplaced", ledger=ledger_id,
                             bookies=sorted(moved))
            if await file_task(self._meta, ledger_id, tuple(sorted(lacking | moved)), tasks,
                               now_ms, misplaced=tuple(sorted(moved))):
                out.tasks_filed.append(ledger_id)

    async def _check_ledger(self, metadata: LedgerMetadata, registered: set[str],
                            limit: asyncio.Semaphore, out: CheckRound) -> set[str]:
        named = {b for fragment in metadata.ensembles for b in fragment.bookies}
        lacking: set[str] = set()
        reads: list[tuple[str, int]] = []
        for slot in slots_to_replace(metadata, named & registered):
            entries = sample_entries(entries_of_slot(metadata, slot),
                                     self._config.check_sample_percent, self._rng)
            reads.extend((slot.bookie, entry_id) for entry_id in entries)
        out.entries_read += len(reads)

        async def read(bookie: str, entry_id: int) -> str | None:
            async with limit:
                try:
                    await self._client.context.bookies.read_entry(
                        bookie, metadata.ledger_id, entry_id,
                        timeout_s=self._config.request_timeout_ms / 1000)
                except (wire.NoSuchEntryError, wire.NoSuchLedgerError):
                    return bookie
                except QuorumlogError:
                    return None  # unreachable or slow: proves nothing
                return None

        for found in await asyncio.gather(*(read(b, e) for b, e in reads)):
            if found is not None:
                lacking.add(found)
        return lacking
