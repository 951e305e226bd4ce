"""Tombstone collection on a table node (docs/duplication.md, "Tombstone GC").

Every ``tombstone_gc_interval_ms`` the node proposes, in each partition it
leads, one :class:`CollectGarbage` Raft entry. A replicated entry rather than
a job on each replica (Pegasus runs compaction with a filter on every replica
alone): a duplicate write applied after a collection must meet the same
record, or its absence, on every replica, or last-writer-wins would keep an
old value on one replica and drop it on another. Every replica applies the
entry at the same decree with the same horizon, so they stay identical.

The horizon is ``now - tombstone_gc_delay_ms`` (the article's GC delay: a
tombstone outlives any duplicate write with an older timetag that may still
arrive), and, while the table has an active duplication, below the timestamp
of every entry the duplication has not confirmed: the leader reads the
entries between the smallest ``confirmed_decree`` (the log floor, kept by
``compaction_floor``) and the store's GC mark, and the store bounds the rest,
the entries applied after the mark, by itself (``TableStore._collect``). A
local write's tombstone carries its entry's timestamp, so no tombstone the
duplication has not shipped goes. Where the leader cannot read those entries,
the entry collects nothing and only moves the mark.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from quorumlog.errors import QuorumlogError
from quorumlog.log import get_logger
from quorumlog.raft import CompactedError, Entry, EntryType, RaftHost, Role
from quorumlog.table._commands import (
    CollectGarbage,
    TableEntry,
    encode_entry,
    entries_of,
    has_local_writes,
)
from quorumlog.table._machine import PartitionMachine

_log = get_logger(__name__)

US_PER_MS = 1000
GC_LOG_SCAN_ENTRIES_MAX = 50_000
"""Unconfirmed log entries one round reads for their timestamps; a duplication
further behind than this gets no collection in that partition until it catches
up (the entry then collects nothing)."""
GC_LOG_SCAN_BYTES_MAX = 4 * 1024 * 1024  # one read of those entries
NOTHING = -1  # a horizon below every timetag


class RetainedLog(Protocol):
    """Where a collection reads unconfirmed entries: ``RaftHost`` (or the
    table simulator's replica, which runs the same ``raft.retained_from``)."""

    def retained_entries(self, group_id: int, lo: int, hi: int,
                         max_bytes: int) -> list[Entry]: ...


@dataclass(frozen=True, slots=True)
class LedReplica:
    table: str
    group_id: int
    machine: PartitionMachine


def unconfirmed_horizon_us(host: RetainedLog, group_id: int, floor: int, mark: int) -> int:
    """Below the timestamp of every entry in (floor, mark] with local writes
    (what duplication ships); NOTHING if one of them cannot be read
    (compacted, or too many)."""
    horizon = (1 << 63) - 1
    lo = floor + 1
    while lo <= mark:
        if lo - floor > GC_LOG_SCAN_ENTRIES_MAX:
            return NOTHING
        try:
            entries = host.retained_entries(group_id, lo, mark + 1, GC_LOG_SCAN_BYTES_MAX)
        except CompactedError:
            return NOTHING
        for entry in entries:
            if entry.type is EntryType.NORMAL and entry.data:
                for table_entry in entries_of(entry.data):
                    if has_local_writes(table_entry):
                        horizon = min(horizon, table_entry.timestamp_us - 1)
        lo = entries[-1].index + 1
    return horizon


def collection_entry(host: RetainedLog, group_id: int, machine: PartitionMachine,
                     floor: int | None, *, wall_us: int, delay_ms: int) -> TableEntry:
    """The entry the leader proposes; ``floor`` is the smallest confirmed_decree
    of the table's active duplications (None: none)."""
    mark = machine.store.gc_mark
    horizon = wall_us - delay_ms * US_PER_MS - 1
    if floor is not None and floor < mark:
        horizon = min(horizon, unconfirmed_horizon_us(host, group_id, floor, mark))
    return TableEntry(timestamp_us=machine.clock.next(wall_us), commands=(),
                      gc=CollectGarbage(mark_decree=mark, horizon_us=max(horizon, NOTHING),
                                        unshipped_bound=floor is not None))


class TombstoneCollector:
    """Proposes a collection entry in every partition this node leads."""

    def __init__(self, host: RaftHost, led: Callable[[], list[LedReplica]],
                 floor: Callable[[int], int | None], *, delay_ms: int,
                 interval_ms: int) -> None:
        self._host = host
        self._led = led
        self._floor = floor
        self._delay_ms = delay_ms
        self._interval_ms = interval_ms
        self._task: asyncio.Task[None] | None = None
        self.rounds = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="tombstone-gc")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval_ms / 1000)
            await self.collect_once()

    async def collect_once(self) -> None:
        for replica in self._led():
            try:
                if self._host.group(replica.group_id).role is not Role.LEADER:
                    continue
                before = replica.machine.store.collected_records
                # Entries after the mark (queued, in flight, a later leader's)
                # are bounded by the store when the entry applies.
                entry = collection_entry(self._host, replica.group_id, replica.machine,
                                         self._floor(replica.group_id),
                                         wall_us=time.time_ns() // 1000,
                                         delay_ms=self._delay_ms)
                await self._host.propose(replica.group_id, encode_entry(entry))
                removed = replica.machine.store.collected_records - before
                if removed:
                    _log.info("table_tombstones_collected", table=replica.table,
                              group=replica.group_id, records=removed)
            except QuorumlogError as exc:
                _log.warning("table_tombstone_gc_failed", table=replica.table,
                             group=replica.group_id, error=exc.message)
        self.rounds += 1
