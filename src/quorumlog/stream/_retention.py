"""Retention, TTL, routing and publish-time search: the pure decisions.

Nothing here does I/O; the trimmer, producer and readers feed these
functions what they read from meta and bookies.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import crc32c

from quorumlog.errors import UsageError, invariant
from quorumlog.stream._config import RetentionPolicy
from quorumlog.stream._cursor import CursorState
from quorumlog.stream._layout import LedgerInfo, PartitionHead
from quorumlog.stream._position import SeqPosition

# ----- retention ------------------------------------------------------------------------


def consumed_by(info: LedgerInfo, cursor: CursorState) -> bool:
    """True if the cursor has acknowledged every message of the (closed) ledger."""
    if info.is_open:
        return False
    if cursor.mark_delete is None:
        start = cursor.start
        # An empty cursor created at "latest" starts after the ledgers before it.
        return info.entries == 0 or (start is not None and start.seq > info.seq)
    if info.entries == 0:
        return cursor.mark_delete.seq >= info.seq
    return cursor.mark_delete.key >= info.end_key


def ledgers_to_trim(head: PartitionHead, ledgers: Sequence[LedgerInfo],
                    cursors: list[CursorState], policy: RetentionPolicy, now_ms: int) -> int:
    """How many ledgers at the front of the list may be deleted now.

    ``ledgers`` are the first ledgers kept, in order (as many as the caller
    loaded: the answer is at most their number). After Pulsar's
    ManagedLedgerImpl.internalTrimLedgers: walk the ledgers oldest first; stop
    at the last ledger (never deleted: it anchors "latest"), at an open
    ledger, and at the first ledger some cursor still needs; a consumed ledger
    goes if retention no longer needs it: it closed more than ``time_ms`` ago,
    or the stream still holds more than ``size_bytes`` without it. With both
    limits -1 nothing is deleted.
    """
    invariant(not ledgers or ledgers[0].seq == head.first_seq,
              "retention walks the list from its first ledger")
    total = head.kept_bytes
    trimmed_bytes = 0
    count = 0
    for info in ledgers:
        if info.seq >= head.next_seq - 1:
            break
        if info.is_open or not all(consumed_by(info, c) for c in cursors):
            break
        ended_ms = info.closed_ms or info.last_publish_ms or info.created_ms
        expired = policy.time_ms >= 0 and now_ms - ended_ms >= policy.time_ms
        over_size = policy.size_bytes >= 0 and total - trimmed_bytes > policy.size_bytes
        if not (expired or over_size):
            break
        trimmed_bytes += info.size_bytes
        count += 1
    return count


def ttl_mark_delete(ledgers: Sequence[LedgerInfo], cursor: CursorState, ttl_ms: int,
                    now_ms: int) -> SeqPosition | None:
    """A new mark-delete for ``cursor`` after expiring whole ledgers older than the TTL.

    Returns None if nothing changes. Only closed ledgers whose last message is
    older than ``now - ttl`` expire here (ledger granularity); the partial
    ledger is expired by the trimmer with a publish-time search. ``ledgers``
    are consecutive ledgers of the list ending at (or past) the first one that
    is not entirely older: the trimmer finds it by :class:`SeqSearch` and
    passes the ledgers just before it.
    """
    if ttl_ms <= 0:
        return None
    cutoff = now_ms - ttl_ms
    target: SeqPosition | None = None
    for info in ledgers:
        if info.is_open or info.last_publish_ms >= cutoff:
            break
        if info.entries and not consumed_by(info, cursor):
            target = SeqPosition(info.seq, info.entries - 1, info.last_entry_messages - 1,
                                 info.ledger_id)
    if target is None:
        return None
    if cursor.mark_delete is not None and cursor.mark_delete.key >= target.key:
        return None
    return target


# ----- routing --------------------------------------------------------------------------


def partition_for_key(key: bytes | None, partitions: int, round_robin: int = 0) -> int:
    """The partition of a message: CRC32C of the key mod P (stable across
    processes and languages); messages without a key go round robin."""
    if partitions < 1:
        raise UsageError("a stream has at least one partition")
    if key is None:
        return round_robin % partitions
    return crc32c.crc32c(key) % partitions


class RoundRobin:
    """Round-robin partition choice for messages without a key."""

    def __init__(self, start: int = 0) -> None:
        self._counter = itertools.count(start)

    def next(self) -> int:
        return next(self._counter)


# ----- publish-time search --------------------------------------------------------------


def publish_reached(publish_ms: int) -> Callable[[LedgerInfo], bool]:
    """Predicate for :class:`SeqSearch`: the list has reached ``publish_ms`` at
    this ledger (its running maximum of last publish times, which never
    decreases along the list; an open ledger's last time is unknown: it may
    hold anything)."""
    return lambda info: info.is_open or info.publish_max_ms >= publish_ms


def holds_publish_at(info: LedgerInfo, publish_ms: int) -> bool:
    """The ledger may hold a message published at or after ``publish_ms``.

    Within a ledger publish times do not decrease (its one writer makes them
    so); across ledgers they may (a Spark write links ledgers written before
    the writer's current one). A reader starting at a publish time starts in
    the first ledger for which this holds (found from the one
    :func:`publish_reached` finds, usually that very ledger), then skips the
    earlier messages of that ledger. An open ledger may hold anything."""
    return info.is_open or (info.entries > 0 and info.last_publish_ms >= publish_ms)


class SeqSearch:
    """Binary search over a partition's archive runs for the first seq whose
    ledger satisfies a predicate that, once true, stays true along the list.

    Sans-IO: ask :meth:`probe` for a seq, read the archive run holding it and
    :meth:`feed` its ledgers; when ``probe`` returns None, :attr:`result` is
    the first seq in ``[low, high)`` where the predicate holds, or ``high``.
    A whole run decides each step, so a search over R runs reads about
    log2(R) runs.
    """

    def __init__(self, low: int, high: int, predicate: Callable[[LedgerInfo], bool]) -> None:
        if high < low:
            raise UsageError("SeqSearch needs low <= high")
        self._low = low  # every seq < low fails the predicate
        self._high = high  # every seq >= high (within the list) holds it
        self._predicate = predicate
        self.probes = 0

    def probe(self) -> int | None:
        if self._low >= self._high:
            return None
        return (self._low + self._high) // 2

    def feed(self, ledgers: Sequence[LedgerInfo]) -> None:
        """The consecutive ledgers of the run that holds the last probe."""
        probe = self.probe()
        inside = [info for info in ledgers if self._low <= info.seq < self._high]
        invariant(probe is not None and any(info.seq == probe for info in inside),
                  f"the ledgers fed do not hold the probed seq {probe}")
        self.probes += 1
        if not self._predicate(inside[-1]):
            self._low = inside[-1].seq + 1
        elif self._predicate(inside[0]):
            self._high = inside[0].seq
        else:
            found = next(info.seq for info in inside if self._predicate(info))
            self._low = self._high = found

    @property
    def result(self) -> int:
        invariant(self._low >= self._high, "the search is not finished")
        return self._high


class EntrySearch:
    """Binary search inside one ledger for the first entry to read for a time.

    Sans-IO: ask :meth:`probe` which entry to read, then :meth:`feed` the
    publish time of that entry's first message; when ``probe`` returns None,
    :attr:`result` is the entry to start reading at. Reading from there and
    skipping messages published before the target gives every message
    published at or after it (the previous entry's batch may end after the
    target, so the result backs up one entry).
    """

    def __init__(self, first_entry: int, last_entry: int, publish_ms: int) -> None:
        if last_entry < first_entry:
            raise UsageError("EntrySearch needs a non-empty entry range")
        self._low = first_entry  # invariant: every entry < low starts before the target
        self._high = last_entry + 1  # every entry >= high starts at/after the target
        self._first = first_entry
        self._target = publish_ms
        self.probes = 0

    def probe(self) -> int | None:
        if self._low >= self._high:
            return None
        return (self._low + self._high) // 2

    def feed(self, entry_id: int, first_publish_ms: int) -> None:
        self.probes += 1
        if first_publish_ms < self._target:
            self._low = entry_id + 1
        else:
            self._high = entry_id

    @property
    def result(self) -> int:
        """First entry that may hold a message at/after the target."""
        return max(self._first, self._low - 1)
