"""Retention, TTL, routing and publish-time search: the pure decisions.

Nothing here does I/O; the trimmer, producer and readers feed these
functions what they read from meta and bookies.
"""

from __future__ import annotations

import bisect
import itertools

import crc32c

from quorumlog.errors import UsageError
from quorumlog.stream._config import RetentionPolicy
from quorumlog.stream._cursor import CursorState
from quorumlog.stream._layout import LedgerInfo, PartitionLedgers
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


def ledgers_to_trim(ledgers: PartitionLedgers, cursors: list[CursorState],
                    policy: RetentionPolicy, now_ms: int) -> int:
    """How many ledgers at the head of the list may be deleted now.

    After Pulsar's ManagedLedgerImpl.internalTrimLedgers: walk the ledgers
    oldest first; stop at the last ledger (never deleted: it anchors "latest"),
    at an open ledger, and at the first ledger some cursor still needs; a
    consumed ledger goes if retention no longer needs it: it closed more than
    ``time_ms`` ago, or the stream still holds more than ``size_bytes`` without
    it. With both limits -1 nothing is deleted.
    """
    total = ledgers.size_bytes()
    trimmed_bytes = 0
    count = 0
    for info in ledgers.ledgers[:-1]:
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


def ttl_mark_delete(ledgers: PartitionLedgers, cursor: CursorState, ttl_ms: int,
                    now_ms: int) -> SeqPosition | None:
    """A new mark-delete for ``cursor`` after expiring whole ledgers older than the TTL.

    Returns None if nothing changes. Only closed ledgers whose last message is
    older than ``now - ttl`` expire here (ledger granularity); the partial
    ledger is expired by the trimmer with a publish-time search.
    """
    if ttl_ms <= 0:
        return None
    cutoff = now_ms - ttl_ms
    target: SeqPosition | None = None
    for info in ledgers.ledgers:
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


def first_ledger_at(ledgers: PartitionLedgers, publish_ms: int) -> int:
    """Index of the first ledger that may hold a message published at or after
    ``publish_ms``; ``len(ledgers)`` if none can.

    Within a ledger publish times do not decrease (its one writer makes them
    so); across ledgers they may (a Spark write links ledgers written before
    the writer's current one), so the search runs over the running maximum of
    each ledger's last publish time, which does not decrease. An open ledger's
    last time is unknown: it may hold anything.
    """
    running: list[int] = []
    best = -(2**63)
    for info in ledgers.ledgers:
        last = 2**63 - 1 if info.is_open else (info.last_publish_ms if info.entries else best)
        best = max(best, last)
        running.append(best)
    return bisect.bisect_left(running, publish_ms)


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
