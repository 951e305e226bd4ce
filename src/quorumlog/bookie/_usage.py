"""Per entry log usage (committed end, live bytes), kept in step with the index.

Every index batch that points entries into a log, moves them out of it, or
removes a ledger with entries in it, carries the matching usage records, so
after any crash ``live_bytes`` is exact for the committed index. Callers hold
the storage's commit lock around :meth:`UsageTable.commit`; the flush and
compaction threads are the only writers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from quorumlog.bookie._format import Location, LogUsage
from quorumlog.bookie._index import Index, IndexBatch
from quorumlog.errors import invariant


@dataclass(slots=True)
class UsageChanges:
    """What one index batch does to the logs' usage."""

    ends: dict[int, int] = field(default_factory=dict)
    live: Counter[int] = field(default_factory=Counter)
    removed: set[int] = field(default_factory=set)

    def written(self, location: Location) -> None:
        """Bytes at ``location`` are durable in the log (live or not)."""
        end = location.offset + location.frame_bytes
        self.ends[location.log_id] = max(self.ends.get(location.log_id, 0), end)

    def made_live(self, location: Location) -> None:
        self.written(location)
        self.live[location.log_id] += location.frame_bytes

    def made_live_run(self, log_id: int, end_offset: int, frame_bytes: int) -> None:
        """Frames of ``frame_bytes`` in all, ending at ``end_offset``, were
        appended to the log and are live (a flush's frames, per log)."""
        self.ends[log_id] = max(self.ends.get(log_id, 0), end_offset)
        self.live[log_id] += frame_bytes

    def made_dead(self, location: Location) -> None:
        self.live[location.log_id] -= location.frame_bytes


class UsageTable:
    def __init__(self, usage: dict[int, LogUsage]) -> None:
        self._usage = dict(usage)

    def get(self, log_id: int) -> LogUsage | None:
        return self._usage.get(log_id)

    def snapshot(self) -> dict[int, LogUsage]:
        return dict(self._usage)

    def _updated(self, changes: UsageChanges) -> dict[int, LogUsage]:
        updated: dict[int, LogUsage] = {}
        for log_id in set(changes.ends) | set(changes.live):
            if log_id in changes.removed:
                continue
            old = self._usage.get(log_id, LogUsage(0, 0))
            new = LogUsage(
                end_offset=max(old.end_offset, changes.ends.get(log_id, 0)),
                live_bytes=old.live_bytes + changes.live.get(log_id, 0),
            )
            invariant(new.live_bytes >= 0, f"entry log {log_id:x} live bytes went negative")
            invariant(new.live_bytes <= new.total_bytes,
                      f"entry log {log_id:x} has more live bytes than bytes")
            updated[log_id] = new
        return updated

    def commit(self, index: Index, batch: IndexBatch, changes: UsageChanges) -> None:
        """Add the usage records to ``batch``, write it, then update memory."""
        updated = self._updated(changes)
        for log_id, usage in updated.items():
            batch.put_usage(log_id, usage)
        for log_id in changes.removed:
            batch.delete_usage(log_id)
        index.commit(batch)
        self._usage.update(updated)
        for log_id in changes.removed:
            self._usage.pop(log_id, None)

    def candidates(self, live_ratio_threshold: float, sealed: Callable[[int], bool]) -> list[int]:
        """Sealed logs whose live/total ratio is below the threshold, emptiest first."""
        scored: list[tuple[float, int]] = []
        for log_id, usage in self._usage.items():
            if not sealed(log_id):
                continue
            total = usage.total_bytes
            ratio = usage.live_bytes / total if total else 0.0
            if ratio < live_ratio_threshold:
                scored.append((ratio, log_id))
        return [log_id for _, log_id in sorted(scored)]
