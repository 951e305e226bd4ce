"""Consecutive entries read back as one buffer plus payload bounds.

A batch read answers with the entries' envelopes back to back in one buffer;
the reader checks their digests in one pass (``proto.crc32c_batch_bounds``)
and keeps only where each payload starts and ends. No per-entry Python object
exists until a caller asks for one (``payload``, ``entries``): the Spark
reader builds Arrow arrays straight from ``buffer``, ``starts`` and ``ends``.
"""

from __future__ import annotations

import array
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from quorumlog.errors import invariant


class LedgerEntry(msgspec.Struct, frozen=True):
    """One entry read back: its ids and payload."""

    ledger_id: int
    entry_id: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class EntryBatch:
    """Entries ``first_entry_id .. first_entry_id + len - 1`` of one ledger,
    digests checked: payload ``i`` is ``buffer[starts[i]:ends[i]]``."""

    ledger_id: int
    first_entry_id: int
    buffer: bytes | memoryview
    starts: array.array[int]  # "q": byte offset of each payload in buffer
    ends: array.array[int]

    def __post_init__(self) -> None:
        invariant(len(self.starts) == len(self.ends), "an entry batch needs one end per start")

    def __len__(self) -> int:
        return len(self.starts)

    @property
    def last_entry_id(self) -> int:
        """The last entry's id (``first_entry_id - 1`` for an empty batch)."""
        return self.first_entry_id + len(self.starts) - 1

    @property
    def payload_bytes(self) -> int:
        return sum(self.ends) - sum(self.starts)

    def payload(self, index: int) -> bytes:
        """The payload of entry ``first_entry_id + index``."""
        return bytes(self.buffer[self.starts[index]:self.ends[index]])

    def payloads(self) -> list[bytes]:
        buffer = self.buffer
        return [bytes(buffer[s:e]) for s, e in zip(self.starts, self.ends, strict=True)]

    def entries(self) -> list[LedgerEntry]:
        """The entries as objects (what ``ReadHandle.read`` hands out)."""
        ledger_id, first = self.ledger_id, self.first_entry_id
        return [LedgerEntry(ledger_id, first + k, payload)
                for k, payload in enumerate(self.payloads())]

    def head(self, count: int) -> EntryBatch:
        """The first ``count`` entries (the same buffer, no copy)."""
        if count >= len(self):
            return self
        return EntryBatch(self.ledger_id, self.first_entry_id, self.buffer,
                          self.starts[:count], self.ends[:count])

    @classmethod
    def of_entries(cls, ledger_id: int, entries: Sequence[LedgerEntry]) -> EntryBatch:
        """One batch of consecutive entries read one by one (E > Qw)."""
        first = entries[0].entry_id if entries else 0
        invariant(all(e.entry_id == first + k for k, e in enumerate(entries)),
                  "an entry batch holds consecutive entries")
        sizes = [len(e.payload) for e in entries]
        ends = array.array("q", itertools.accumulate(sizes))
        starts = array.array("q", [0])
        starts.extend(ends[:-1])
        return cls(ledger_id, first, b"".join(e.payload for e in entries),
                   starts[:len(ends)], ends)
