"""Cursor state of a subscription on one partition, and the ack bookkeeping.

Persisted (``CursorState``), after Pulsar's ManagedCursor:

- ``mark_delete``: every message at or before it is acknowledged (None:
  nothing yet; the subscription starts at ``start``);
- ``ranges``: individually acknowledged messages after the mark-delete, as
  inclusive ranges ``[first, last]`` such that every message of the stream
  between them is acknowledged; at most ``cursor_ranges_max`` are kept (the
  rest are delivered again after a restart: at-least-once).

:class:`AckTracker` is the consumer's in-memory side: messages are delivered in
stream order; acknowledging the oldest unacknowledged one moves the
mark-delete forward over every acknowledged message after it. Messages a
restarted consumer skips because a persisted range covers them are recorded
as delivered-and-acknowledged, so the mark-delete can move over them too.
All positions are :class:`SeqPosition` (ordered, see ``_position``).
"""

from __future__ import annotations

from collections import deque

import msgspec

from quorumlog.errors import UsageError, invariant
from quorumlog.stream._errors import MessageFormatError
from quorumlog.stream._position import SeqPosition

Key = tuple[int, int, int]


class CursorState(msgspec.Struct, frozen=True, kw_only=True):
    """Value of ``/streams/<s>/cursors/<sub>/<p>``."""

    mark_delete: SeqPosition | None = None
    ranges: tuple[tuple[SeqPosition, SeqPosition], ...] = ()
    # Where an empty cursor starts: the seq/entry of the first message to read
    # (set when the subscription is created at "latest").
    start: SeqPosition | None = None
    updated_ms: int = 0

    def encode(self) -> bytes:
        return _ENCODER.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> CursorState:
        try:
            return _DECODER.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise MessageFormatError(f"cursor state in meta is malformed: {exc}") from None

    def is_acked(self, key: Key) -> bool:
        if self.mark_delete is not None and key <= self.mark_delete.key:
            return True
        return any(first.key <= key <= last.key for first, last in self.ranges)


class AckTracker:
    """Delivered messages of one partition, in order, and which are acknowledged.

    Bounded: ``pending_max`` delivered messages past the mark-delete; the
    consumer stops delivering at the bound until acknowledgements move it.
    """

    def __init__(self, state: CursorState, *, ranges_max: int, pending_max: int) -> None:
        if ranges_max < 1 or pending_max < 1:
            raise UsageError("ranges_max and pending_max must be >= 1")
        self.mark_delete = state.mark_delete
        self.start = state.start
        self._restored = list(state.ranges)
        self._ranges_max = ranges_max
        self._pending_max = pending_max
        self._order: deque[SeqPosition] = deque()
        self._acked: dict[Key, bool] = {}
        self.dirty = False

    # ----- reader side -----------------------------------------------------------

    def should_skip(self, key: Key) -> bool:
        """True if a persisted state already acknowledges this message."""
        if self.mark_delete is not None and key <= self.mark_delete.key:
            return True
        return any(first.key <= key <= last.key for first, last in self._restored)

    @property
    def full(self) -> bool:
        return len(self._order) >= self._pending_max

    def delivered(self, position: SeqPosition, *, acked: bool = False) -> None:
        key = position.key
        invariant(not self._order or self._order[-1].key < key,
                  "messages must be delivered in stream order")
        invariant(self.mark_delete is None or self.mark_delete.key < key,
                  "a delivered message must come after the mark-delete")
        self._order.append(position)
        self._acked[key] = acked
        if acked:
            self._advance()

    # ----- consumer side -----------------------------------------------------------

    def ack(self, position: SeqPosition) -> bool:
        """Acknowledge one delivered message; False if it was not pending."""
        key = position.key
        if key not in self._acked:
            return False
        if not self._acked[key]:
            self._acked[key] = True
            self.dirty = True
            self._advance()
        return True

    def ack_cumulative(self, position: SeqPosition) -> None:
        """Acknowledge every delivered message up to and including ``position``."""
        for item in self._order:
            if item.key > position.key:
                break
            self._acked[item.key] = True
        self.dirty = True
        self._advance()

    def _advance(self) -> None:
        while self._order and self._acked[self._order[0].key]:
            head = self._order.popleft()
            del self._acked[head.key]
            self.mark_delete = head
            self.dirty = True
        if self.mark_delete is not None:
            md = self.mark_delete.key
            self._restored = [r for r in self._restored if r[1].key > md]

    def is_unacked(self, key: Key) -> bool:
        """True for a message delivered and not acknowledged yet."""
        return self._acked.get(key) is False

    @property
    def pending(self) -> int:
        return len(self._order)

    def unacked(self) -> list[SeqPosition]:
        return [p for p in self._order if not self._acked[p.key]]

    def state(self, now_ms: int) -> CursorState:
        """The state to persist: mark-delete and at most ``ranges_max`` ranges."""
        ranges: list[tuple[SeqPosition, SeqPosition]] = []
        run_first: SeqPosition | None = None
        run_last: SeqPosition | None = None
        for item in self._order:
            if self._acked[item.key]:
                run_first = run_first or item
                run_last = item
            elif run_first is not None and run_last is not None:
                ranges.append((run_first, run_last))
                run_first = run_last = None
        last_delivered = self._order[-1].key if self._order else None
        tail_restored = [r for r in self._restored
                         if last_delivered is None or r[1].key > last_delivered]
        if run_first is not None and run_last is not None:
            ranges.append((run_first, run_last))
        ranges.extend(tail_restored)
        return CursorState(mark_delete=self.mark_delete, ranges=tuple(ranges[: self._ranges_max]),
                           start=self.start, updated_ms=now_ms)


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(CursorState)
