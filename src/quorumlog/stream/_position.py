"""Positions in a stream partition, and their JSON form.

A :class:`Position` names one message: ``(ledger_id, entry_id, batch_index)``.
``batch_index`` is the message's index inside its entry (0 for an entry that
holds one message).

Order: a partition is an ordered list of ledgers; each ledger in the list has a
sequence number ``seq`` (its place in the list, never reused), so the order of
two positions is the order of ``(seq, entry_id, batch_index)``. Ledger ids are
*not* ordered along the list: a Spark batch write links ledgers created by its
tasks, which may have smaller ids than the writer's current ledger. The
partition's ledger list (``LedgerList.find``) turns a position into
that sort key; a :class:`SeqPosition` carries the key with the position, so
cursors and offsets compare without meta.

JSON: ``{"ledger": 12, "entry": 3, "batch": 0}``; a positions map for
readers and Spark options is ``{"0": <position or "earliest"/"latest">, ...}``
keyed by partition number.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from quorumlog.stream._errors import BadPositionError

EARLIEST = "earliest"
LATEST = "latest"


class Position(msgspec.Struct, frozen=True, array_like=True):
    """One message: ledger id, entry id in the ledger, index in the entry's batch."""

    ledger_id: int
    entry_id: int
    batch_index: int = 0

    def __post_init__(self) -> None:
        if self.ledger_id < 0 or self.entry_id < 0 or self.batch_index < 0:
            raise BadPositionError(f"position fields must be >= 0, got {self}")

    def to_json(self) -> dict[str, int]:
        return {"ledger": self.ledger_id, "entry": self.entry_id, "batch": self.batch_index}

    @classmethod
    def from_json(cls, value: Any) -> Position:
        if not isinstance(value, dict):
            raise BadPositionError(
                f"a position is a JSON object like {{\"ledger\": 5, \"entry\": 0}}, got {value!r}"
            )
        unknown = set(value) - {"ledger", "entry", "batch", "seq"}
        if unknown:
            raise BadPositionError(f"unknown position field(s) {sorted(unknown)} in {value!r}")
        try:
            ledger, entry = value["ledger"], value["entry"]
        except KeyError as exc:
            raise BadPositionError(f"position {value!r} lacks {exc.args[0]!r}") from None
        batch = value.get("batch", 0)
        for name, field in (("ledger", ledger), ("entry", entry), ("batch", batch)):
            if not isinstance(field, int) or isinstance(field, bool):
                raise BadPositionError(f"position field {name!r} must be an integer in {value!r}")
        return cls(ledger, entry, batch)

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}:{self.batch_index}"


class SeqPosition(msgspec.Struct, frozen=True, array_like=True, order=True):
    """A position with its ledger's sequence number; orders by (seq, entry, batch)."""

    seq: int
    entry_id: int
    batch_index: int
    ledger_id: int

    @property
    def position(self) -> Position:
        return Position(self.ledger_id, self.entry_id, self.batch_index)

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.seq, self.entry_id, self.batch_index)


PositionSpec = Position | str  # a Position, EARLIEST or LATEST


def parse_position_spec(value: Any) -> PositionSpec:
    if value in (EARLIEST, LATEST):
        return str(value)
    if isinstance(value, str):
        raise BadPositionError(f"expected 'earliest', 'latest' or a position object, got {value!r}")
    return Position.from_json(value)


def parse_positions(text: str, partitions: int) -> dict[int, PositionSpec]:
    """Parse ``"earliest"``, ``"latest"`` or a JSON map partition -> position spec.

    Partitions missing from a JSON map are not constrained by it (the caller
    applies its default).
    """
    text = text.strip()
    if text in (EARLIEST, LATEST):
        return dict.fromkeys(range(partitions), text)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadPositionError(
            f"positions must be 'earliest', 'latest' or JSON like "
            f"{{\"0\": {{\"ledger\": 5, \"entry\": 0}}}}: {exc.msg} at character {exc.pos} "
            f"of {text!r}"
        ) from None
    if not isinstance(data, dict):
        raise BadPositionError(f"positions JSON must be an object keyed by partition, got {text!r}")
    out: dict[int, PositionSpec] = {}
    for key, value in data.items():
        try:
            partition = int(key)
        except ValueError:
            raise BadPositionError(
                f"positions JSON key {key!r} is not a partition number") from None
        if not 0 <= partition < partitions:
            raise BadPositionError(
                f"positions JSON names partition {partition}; the stream has {partitions}"
            )
        out[partition] = parse_position_spec(value)
    return out
