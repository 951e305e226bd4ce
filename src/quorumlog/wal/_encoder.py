"""The accept side of append mode: saves become frames, cuts are decided (pure, no I/O).

Encoding happens in the caller's thread when a save is accepted, in order, so
the CRC chain and the segment boundaries are fixed before anything is queued;
the writer thread then only writes bytes, fdatasyncs and performs the cuts the
encoder decided.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import msgspec

from quorumlog.errors import UsageError
from quorumlog.wal._files import SegmentName
from quorumlog.wal._format import (
    RECORD_HEADER_BYTES,
    RecordType,
    encode_entries,
    encode_record,
    seed_data,
    snapshot_data,
)
from quorumlog.wal._types import SnapshotMarker, WalEntry

U64_LIMIT = 1 << 64


class SegmentCut(NamedTuple):
    """Start segment ``name`` with ``header`` once the current one ends at ``previous_end``."""

    name: SegmentName
    header: bytes
    previous_end: int


class Encoded(msgspec.Struct, frozen=True, gc=False):
    """The frames of one accepted save and the cut to make after them.

    ``buffers`` is one joined bytes object for small records; for large ones
    it is the frame pieces themselves, written with pwritev, so the payload is
    never copied in user space (a join would cost a memcpy per byte).
    """

    buffers: list[bytes]
    size_bytes: int
    cut: SegmentCut | None


NOTHING = Encoded([], 0, None)
# Entries at least this large are written as pieces (pwritev) instead of joined.
VECTORED_ENTRY_MIN_BYTES = 8 * 1024


def segment_header(
    seed: int, metadata: bytes, state: bytes | None, marker: SnapshotMarker | None = None
) -> tuple[bytes, int]:
    """The first frames of a segment (crc, metadata[, state][, marker]) and the chain value."""
    pieces: list[bytes] = []
    crc = encode_record(pieces, RecordType.CRC, seed_data(seed), seed)
    crc = encode_record(pieces, RecordType.METADATA, metadata, crc)
    if state is not None:
        crc = encode_record(pieces, RecordType.STATE, state, crc)
    if marker is not None:
        crc = encode_record(pieces, RecordType.SNAPSHOT, snapshot_data(marker), crc)
    return b"".join(pieces), crc


def check_blob(what: str, value: object, record_size_max_bytes: int) -> bytes:
    """``value`` if it is bytes that fit in one record, else a UsageError."""
    if not isinstance(value, bytes):
        raise UsageError(f"{what} must be bytes, not {type(value).__name__}")
    limit = record_size_max_bytes - RECORD_HEADER_BYTES
    if len(value) > limit:
        raise UsageError(
            f"{what} has {len(value)} bytes; the limit is {limit} (wal.record_size_max_bytes)"
        )
    return value


def check_marker(marker: SnapshotMarker) -> None:
    if not (0 <= marker.term < U64_LIMIT and 0 <= marker.index < U64_LIMIT):
        raise UsageError(f"snapshot marker {marker}: term and index must be in 0..2**64-1")


class Encoder:
    """What has been accepted so far: chain value, segment offset, last index, floor.

    ``floor`` is the highest index that can no longer be rewritten (the
    snapshot the WAL was read at, or the newest snapshot marker saved since);
    an append must start in ``floor+1 .. last_index+1``.
    """

    def __init__(
        self,
        *,
        metadata: bytes,
        segment: SegmentName,
        offset: int,
        crc: int,
        last_index: int,
        floor: int,
        state: bytes | None,
        segment_size_bytes: int,
        record_size_max_bytes: int,
    ) -> None:
        self.metadata = metadata
        self.segment = segment
        self.offset = offset
        self.crc = crc
        self.last_index = last_index
        self.floor = floor
        self.state = state
        self.segment_size_bytes = segment_size_bytes
        self.record_size_max_bytes = record_size_max_bytes

    def save(self, state: bytes | None, entries: Sequence[WalEntry]) -> Encoded:
        """Frames for ``entries`` then ``state``; nothing changes if it raises.

        Runs for every save, so the common checks are inline and the rare
        paths are calls.
        """
        vectored = False
        if entries:
            first = entries[0].index
            if not self.floor < first <= self.last_index + 1:
                self._reject_first_index(first)
            vectored = len(entries[0].data) >= VECTORED_ENTRY_MIN_BYTES
        pieces: list[bytes] = []
        crc = encode_entries(pieces, entries, self.crc, self.record_size_max_bytes)
        if state is not None:
            check_blob("state", state, self.record_size_max_bytes)
            crc = encode_record(pieces, RecordType.STATE, state, crc)
            self.state = state
        if entries:
            self.last_index = entries[-1].index
        if vectored:
            buffers, size = pieces, sum(map(len, pieces))
        else:
            data = b"".join(pieces)
            buffers, size = [data], len(data)
        self.crc = crc
        self.offset += size
        cut = self._cut() if self.offset >= self.segment_size_bytes else None
        return Encoded(buffers, size, cut)

    def snapshot(self, marker: SnapshotMarker) -> Encoded:
        check_marker(marker)
        pieces: list[bytes] = []
        self.crc = encode_record(pieces, RecordType.SNAPSHOT, snapshot_data(marker), self.crc)
        data = b"".join(pieces)
        self.offset += len(data)
        self.floor = max(self.floor, marker.index)
        self.last_index = max(self.last_index, marker.index)
        cut = self._cut() if self.offset >= self.segment_size_bytes else None
        return Encoded([data], len(data), cut)

    def _reject_first_index(self, first: int) -> None:
        if first <= self.floor:
            raise UsageError(
                f"entry index {first} is at or below {self.floor}, the newest snapshot (or the "
                "first index read back); entries up to it cannot be rewritten"
            )
        raise UsageError(
            f"entry index {first} would leave a gap: the last entry is {self.last_index}, "
            f"so the next save must start at an index <= {self.last_index + 1}"
        )

    def _cut(self) -> SegmentCut:
        """Start the next segment: its header continues the chain after this save."""
        name = SegmentName(seq=self.segment.seq + 1, index=self.last_index + 1)
        header, crc = segment_header(self.crc, self.metadata, self.state)
        cut = SegmentCut(name, header, self.offset)
        self.segment = name
        self.offset = len(header)
        self.crc = crc
        return cut
