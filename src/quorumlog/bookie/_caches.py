"""The two memory caches of the ledger storage, without locking of their own.

:class:`WriteCache` is double-buffered: adds go to the *active* half; a flush
swaps the halves and writes the *frozen* half while adds continue. The storage
holds its state lock (a ``threading.Condition``) around every call, because the
flush thread and the event-loop thread meet here.

:class:`ReadCache` is a ring of segments filled from entry log reads; when the
current segment is full the ring moves on and the oldest segment is dropped
whole, so eviction costs nothing per entry (as BookKeeper's ReadCache).
:class:`SequentialReads` remembers each ledger's last read entry to decide when
read-ahead pays off.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from quorumlog.errors import invariant

EntryKey = tuple[int, int]


class WriteCache:
    def __init__(self, half_bytes: int) -> None:
        invariant(half_bytes > 0, "write cache half must be positive")
        self._half_bytes = half_bytes
        self._active: dict[EntryKey, bytes] = {}
        self._active_bytes = 0
        self._frozen: dict[EntryKey, bytes] = {}
        self._frozen_bytes = 0

    @property
    def half_bytes(self) -> int:
        return self._half_bytes

    @property
    def active_bytes(self) -> int:
        return self._active_bytes

    @property
    def frozen_bytes(self) -> int:
        return self._frozen_bytes

    @property
    def active_entries(self) -> int:
        return len(self._active)

    @property
    def frozen_empty(self) -> bool:
        return not self._frozen

    def has_room(self, data_bytes: int) -> bool:
        return self._active_bytes + data_bytes <= self._half_bytes

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        key = (ledger_id, entry_id)
        data = self._active.get(key)
        return data if data is not None else self._frozen.get(key)

    def put(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        key = (ledger_id, entry_id)
        invariant(key not in self._active and key not in self._frozen,
                  f"entry {ledger_id}:{entry_id} added to the write cache twice")
        invariant(self.has_room(len(data)), "write cache put without room")
        self._active[key] = data
        self._active_bytes += len(data)

    def put_many(self, ledger_id: int, entries: Sequence[tuple[int, bytes, int]],
                 data_bytes: int) -> None:
        """Put a batch of one ledger's new entries, ``(entry id, data, _)`` each,
        ``data_bytes`` in all, with one dict update (a batch of adds' hot path)."""
        batch = {(ledger_id, entry_id): data for entry_id, data, _ in entries}
        # isdisjoint iterates its argument: the batch, not the halves.
        invariant(len(batch) == len(entries) and self._active.keys().isdisjoint(batch)
                  and self._frozen.keys().isdisjoint(batch),
                  "a batch of adds put into the write cache twice")
        invariant(self.has_room(data_bytes), "write cache put without room")
        self._active.update(batch)
        self._active_bytes += data_bytes

    def swap(self) -> dict[EntryKey, bytes]:
        """Freeze the active half and return it; the caller only reads it."""
        invariant(not self._frozen, "write cache swapped while a frozen half is unflushed")
        self._frozen, self._active = self._active, {}
        self._frozen_bytes, self._active_bytes = self._active_bytes, 0
        return self._frozen

    def frozen(self) -> dict[EntryKey, bytes]:
        return self._frozen

    def release_frozen(self) -> None:
        """The frozen half is in the entry logs and the index: drop it."""
        self._frozen = {}
        self._frozen_bytes = 0

    def drop_ledger(self, ledger_id: int) -> None:
        """Remove a deleted ledger's entries from the active half.

        The frozen half is left alone (the flusher may be reading it); the
        flush filters deleted ledgers out instead.
        """
        doomed = [key for key in self._active if key[0] == ledger_id]
        for key in doomed:
            self._active_bytes -= len(self._active.pop(key))


class ReadCache:
    def __init__(self, max_bytes: int, segment_count: int) -> None:
        invariant(segment_count > 0, "read cache needs at least one segment")
        self._segment_bytes = max_bytes // segment_count
        self._segments: list[dict[EntryKey, bytes]] = [{} for _ in range(segment_count)]
        self._used_bytes = [0] * segment_count
        self._current = 0

    @property
    def size_bytes(self) -> int:
        return sum(self._used_bytes)

    @property
    def entries(self) -> int:
        return sum(len(s) for s in self._segments)

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        if not self._segment_bytes:
            return None  # the cache is off
        key = (ledger_id, entry_id)
        count = len(self._segments)
        for step in range(count):
            data = self._segments[(self._current - step) % count].get(key)
            if data is not None:
                return data
        return None

    def get_run(self, ledger_id: int, first_entry_id: int, last_entry_id: int,
                max_bytes: int) -> list[bytes]:
        """Consecutive cached entries from ``first_entry_id`` (stops at the first
        miss, ``last_entry_id`` or ``max_bytes``): a batch read's hot loop. A
        negative ``max_bytes`` is ``-limit`` for a run whose first entry is
        taken whatever its size."""
        run: list[bytes] = []
        if not self._segment_bytes:
            return run
        count = len(self._segments)
        order = [self._segments[(self._current - step) % count] for step in range(count)]
        total = 0
        for entry_id in range(first_entry_id, last_entry_id + 1):
            key = (ledger_id, entry_id)
            for segment in order:
                data = segment.get(key)
                if data is not None:
                    break
            if data is None:
                break
            if max_bytes >= 0 and total + len(data) > max_bytes:
                break
            if max_bytes < 0 and run and total + len(data) > -max_bytes:
                break
            run.append(data)
            total += len(data)
        return run

    def put(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        """Cache an entry; entries larger than a segment are not cached."""
        if len(data) > self._segment_bytes:
            return
        if self._used_bytes[self._current] + len(data) > self._segment_bytes:
            self._current = (self._current + 1) % len(self._segments)
            self._segments[self._current] = {}
            self._used_bytes[self._current] = 0
        segment = self._segments[self._current]
        old = segment.get((ledger_id, entry_id))
        if old is not None:
            self._used_bytes[self._current] -= len(old)
        segment[(ledger_id, entry_id)] = data
        self._used_bytes[self._current] += len(data)

    def drop_ledger(self, ledger_id: int) -> None:
        for index, segment in enumerate(self._segments):
            doomed = [key for key in segment if key[0] == ledger_id]
            for key in doomed:
                self._used_bytes[index] -= len(segment.pop(key))


class SequentialReads:
    """Last entry read per ledger, for the most recently read ledgers only."""

    def __init__(self, tracked_ledgers_max: int) -> None:
        self._max = tracked_ledgers_max
        self._last: OrderedDict[int, int] = OrderedDict()

    def is_next(self, ledger_id: int, entry_id: int) -> bool:
        return self._last.get(ledger_id) == entry_id - 1

    def note(self, ledger_id: int, entry_id: int) -> None:
        self._last[ledger_id] = entry_id
        self._last.move_to_end(ledger_id)
        while len(self._last) > self._max:
            self._last.popitem(last=False)

    def forget(self, ledger_id: int) -> None:
        self._last.pop(ledger_id, None)
