"""Entry log compaction: copy live entries out of mostly-dead logs, then drop them.

For one sealed log: read it in chunks up to its committed end; an entry is live
when the index still points at its frame; copy live entries, a batch of at
most ``compaction_batch_bytes`` at a time, to the current entry log (which
fsyncs); then, under the commit lock, point the index at the copies *only for
entries whose location is still the old one* (a ledger deleted meanwhile stays
deleted) in one synced batch with the usage records. When every live byte has
moved, the log's usage record is deleted in a batch and the file removed.
A crash at any point leaves either the old location or the new one indexed,
both of them durable; a log file without a usage record is removed at open.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from quorumlog.bookie._config import LOG_HEADER_BYTES, LedgerStorageConfig
from quorumlog.bookie._entrylog import EntryLogs
from quorumlog.bookie._format import FrameIncomplete, FrameInvalid, Location, decode_frame
from quorumlog.bookie._index import Index
from quorumlog.bookie._results import CompactionResult, StorageStats
from quorumlog.bookie._storage_errors import EntryLogCorruptionError
from quorumlog.bookie._usage import UsageChanges, UsageTable
from quorumlog.errors import invariant


@dataclass(frozen=True, slots=True)
class _LiveEntry:
    ledger_id: int
    entry_id: int
    data: bytes
    old: Location


class Compactor:
    def __init__(
        self,
        *,
        config: LedgerStorageConfig,
        index: Index,
        logs: EntryLogs,
        usage: UsageTable,
        commit_lock: threading.Lock,
        stats: StorageStats,
    ) -> None:
        self._config = config
        self._index = index
        self._logs = logs
        self._usage = usage
        self._commit_lock = commit_lock
        self._stats = stats
        # Test seam: called after live entries are copied and before the index
        # is updated, to interleave concurrent index changes deterministically.
        self.before_index_update: Callable[[], None] | None = None

    def run(self, live_ratio_threshold: float) -> CompactionResult:
        with self._commit_lock:
            candidates = self._usage.candidates(live_ratio_threshold, self._logs.is_sealed)
        result = CompactionResult()
        for log_id in candidates:
            self._compact_log(log_id, result)
        return result

    def _compact_log(self, log_id: int, result: CompactionResult) -> None:
        usage = self._usage.get(log_id)
        if usage is None:
            return
        copied_before = result.copied_bytes
        pending: list[_LiveEntry] = []
        pending_bytes = 0
        for entry in self._live_entries(log_id, usage.end_offset):
            pending.append(entry)
            pending_bytes += entry.old.frame_bytes
            if pending_bytes >= self._config.compaction_batch_bytes:
                self._move(pending, result)
                pending, pending_bytes = [], 0
        self._move(pending, result)
        size = self._logs.file_size(log_id)
        self._retire(log_id)
        reclaimed = max(0, size - (result.copied_bytes - copied_before))
        result.compacted_logs.append(log_id)
        result.reclaimed_bytes += reclaimed
        self._stats.compacted_logs += 1
        self._stats.reclaimed_bytes += reclaimed

    def _live_entries(self, log_id: int, end_offset: int) -> Iterator[_LiveEntry]:
        """Entries of the log the index points at, read chunk by chunk."""
        pos = LOG_HEADER_BYTES
        while pos < end_offset:
            size = min(self._config.compaction_read_bytes, end_offset - pos)
            buf = self._logs.pread(log_id, pos, size)
            frames = self._frames_in(log_id, pos, buf)
            if not frames:
                raise EntryLogCorruptionError(
                    self._logs.path(log_id), pos,
                    f"no whole frame before the committed end {end_offset}")
            keys = [(f[0], f[1]) for f in frames]
            current = self._index.get_locations(keys)
            for (ledger_id, entry_id, data, old), now in zip(frames, current, strict=True):
                if now == old:
                    yield _LiveEntry(ledger_id, entry_id, data, old)
            last = frames[-1][3]
            pos = last.offset + last.frame_bytes

    def _frames_in(
        self, log_id: int, base: int, buf: bytes
    ) -> list[tuple[int, int, bytes, Location]]:
        frames: list[tuple[int, int, bytes, Location]] = []
        pos = 0
        while pos < len(buf):
            try:
                frame = decode_frame(buf, pos, self._config.entry_max_bytes)
            except FrameIncomplete:
                break  # the rest is in the next chunk (or past the end: caller's check)
            except FrameInvalid as exc:
                path = self._logs.path(log_id)
                raise EntryLogCorruptionError(path, base + pos, str(exc)) from None
            loc = Location(log_id, base + pos, frame.frame_bytes)
            frames.append((frame.ledger_id, frame.entry_id, frame.data, loc))
            pos += frame.frame_bytes
        return frames

    def _move(self, entries: list[_LiveEntry], result: CompactionResult) -> None:
        if not entries:
            return
        copies = self._logs.append([(e.ledger_id, e.entry_id, e.data) for e in entries])
        try:
            if self.before_index_update is not None:
                self.before_index_update()
            with self._commit_lock:
                self._repoint(entries, copies, result)
        finally:
            self._logs.release(copies)

    def _repoint(
        self, entries: list[_LiveEntry], copies: list[Location], result: CompactionResult
    ) -> None:
        current = self._index.get_locations([(e.ledger_id, e.entry_id) for e in entries])
        batch = self._index.new_batch()
        changes = UsageChanges()
        for entry, copy, now in zip(entries, copies, current, strict=True):
            if now != entry.old:
                changes.written(copy)  # moved or deleted meanwhile: the copy is garbage
                continue
            batch.put_location(entry.ledger_id, entry.entry_id, copy)
            changes.made_live(copy)
            changes.made_dead(entry.old)
            result.copied_entries += 1
            result.copied_bytes += copy.frame_bytes
            self._stats.compaction_copied_entries += 1
            self._stats.compaction_copied_bytes += copy.frame_bytes
        self._usage.commit(self._index, batch, changes)

    def _retire(self, log_id: int) -> None:
        with self._commit_lock:
            usage = self._usage.get(log_id)
            invariant(usage is not None and usage.live_bytes == 0,
                      f"entry log {log_id:x} still has live bytes after compaction: {usage}")
            batch = self._index.new_batch()
            changes = UsageChanges(removed={log_id})
            self._usage.commit(self._index, batch, changes)
        self._logs.remove(log_id)

