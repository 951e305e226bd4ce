"""Byte layout of WAL segments: frames, records and the CRC chain (pure, no I/O).

A segment is a sequence of 8-byte aligned frames::

    offset  size  field
    0       8     length field, u64 little-endian: low 56 bits = record bytes
                  (header + data); top byte = 0x80 | pad when pad > 0, else 0
    8       4     crc, u32: CRC32C of bytes 12 .. 8+record bytes, seeded with
                  the crc of the previous record (the chain)
    12      1     record type (1 metadata, 2 entry, 3 state, 4 crc, 5 snapshot)
    13      3     reserved, zero
    16      n     data (entry: u64 index + payload; snapshot: u64 term, u64 index;
                  crc: u32 seed = the crc the chain continues from)
    16+n    pad   zeros up to the next multiple of 8

The CRC covers the type and reserved bytes as well as the data, so a flipped
type is caught. A zero length field at a frame boundary is the end of the data
(the preallocated tail). The first frame of every segment is a crc record whose
data holds the seed its own crc (and so the rest of the chain) starts from.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from enum import IntEnum
from struct import Struct
from typing import NamedTuple

from crc32c import crc32c

from quorumlog.errors import UsageError
from quorumlog.wal._types import SnapshotMarker, WalEntry


class RecordType(IntEnum):
    METADATA = 1
    ENTRY = 2
    STATE = 3
    CRC = 4
    SNAPSHOT = 5


RECORD_TYPE_NAMES = {t.value: t.name.lower() for t in RecordType}

FRAME_LENGTH_BYTES = 8
RECORD_HEADER_BYTES = 8
ENTRY_INDEX_BYTES = 8
FRAME_ALIGNMENT_BYTES = 8
# Torn writes are recognised by a whole zero sector (the smallest unit a disk
# writes atomically) inside a frame, sectors aligned to the file offset.
SECTOR_BYTES = 512

_ENTRY_FIXED_BYTES = RECORD_HEADER_BYTES + ENTRY_INDEX_BYTES
_LENGTH_MASK = (1 << 56) - 1
_PAD_FLAG = 0x80
_CRC_OFFSET = FRAME_LENGTH_BYTES
_COVERED_OFFSET = FRAME_LENGTH_BYTES + 4
_DATA_OFFSET = FRAME_LENGTH_BYTES + RECORD_HEADER_BYTES
_TAIL_CHUNK_BYTES = 1 << 20

_LENGTH_CRC = Struct("<QI")
_HEAD = Struct("<QII")  # length field, crc, type + reserved
_TYPE = Struct("<I")  # type byte + 3 reserved zero bytes, read as one u32
_TYPE_INDEX = Struct("<IQ")
_U64 = Struct("<Q")
_U32 = Struct("<I")
_SNAPSHOT = Struct("<QQ")

PADDING = tuple(bytes(n) for n in range(FRAME_ALIGNMENT_BYTES))
_VALID_TOPS = tuple(
    _PAD_FLAG | pad if pad else 0 for pad in range(FRAME_ALIGNMENT_BYTES)
)
_PAD_FLAGS = tuple(
    (_PAD_FLAG | pad) << 56 if pad else 0 for pad in range(FRAME_ALIGNMENT_BYTES)
)
_ZERO_CHUNK = bytes(_TAIL_CHUNK_BYTES)
# Smallest record (header + data) of each type; a type not listed is unknown.
_RECORD_BYTES_MIN = {
    RecordType.METADATA.value: RECORD_HEADER_BYTES,
    RecordType.ENTRY.value: RECORD_HEADER_BYTES + ENTRY_INDEX_BYTES,
    RecordType.STATE.value: RECORD_HEADER_BYTES,
    RecordType.CRC.value: RECORD_HEADER_BYTES + _U32.size,
    RecordType.SNAPSHOT.value: RECORD_HEADER_BYTES + _SNAPSHOT.size,
}
_NEVER = 1 << 64
_ENTRY = RecordType.ENTRY.value


def length_field(record_bytes: int) -> tuple[int, int]:
    """The length field and pad for a record of ``record_bytes`` (etcd's encodeFrameSize)."""
    pad = -record_bytes & (FRAME_ALIGNMENT_BYTES - 1)
    if pad:
        return record_bytes | (_PAD_FLAG | pad) << 56, pad
    return record_bytes, 0


def encode_record(pieces: list[bytes], rtype: RecordType, data: bytes, crc: int) -> int:
    """Append one frame to ``pieces``; return the chained crc."""
    tail = _TYPE.pack(rtype)
    crc = crc32c(data, crc32c(tail, crc))
    field, pad = length_field(RECORD_HEADER_BYTES + len(data))
    pieces += (_LENGTH_CRC.pack(field, crc), tail, data, PADDING[pad])
    return crc


def encode_entries(
    pieces: list[bytes], entries: Sequence[WalEntry], crc: int, record_size_max_bytes: int
) -> int:
    """Append entry frames to ``pieces``; return the chained crc.

    The hot path of every save: per entry one header pack, one index pack,
    two C-level CRC calls and one list extend; the payload is referenced, not
    copied (small records are joined once for a single pwrite, large ones go
    to pwritev as they are). It checks that indexes are contiguous and data is
    ``bytes`` (immutable, so it cannot change between the CRC and the write).
    """
    pack_tail = _TYPE_INDEX.pack
    pack_head = _LENGTH_CRC.pack
    extend = pieces.extend
    padding = PADDING
    pad_flags = _PAD_FLAGS
    entry_type = _ENTRY
    fixed = _ENTRY_FIXED_BYTES
    limit = record_size_max_bytes - RECORD_HEADER_BYTES - ENTRY_INDEX_BYTES
    expected = entries[0].index if entries else 0
    for entry in entries:
        data = entry.data
        size = len(data)
        if data.__class__ is not bytes or size > limit or entry.index != expected:
            _reject_entry(entry, expected, limit)
        tail = pack_tail(entry_type, expected)
        crc = crc32c(data, crc32c(tail, crc))
        pad = -size & 7  # the fixed header and index bytes keep the alignment
        extend((pack_head((fixed + size) | pad_flags[pad], crc), tail, data, padding[pad]))
        expected += 1
    return crc


def _reject_entry(entry: WalEntry, expected: int, limit: int) -> None:
    if entry.data.__class__ is not bytes:
        raise UsageError(
            f"WalEntry(index={entry.index}).data must be bytes, not {type(entry.data).__name__}"
        )
    if len(entry.data) > limit:
        raise UsageError(
            f"WalEntry(index={entry.index}) has {len(entry.data)} bytes of data; the limit is "
            f"{limit} (wal.record_size_max_bytes minus the record header)"
        )
    raise UsageError(
        f"entry indexes in one save must be contiguous: expected {expected}, got {entry.index}"
    )


def entry_index(image: bytes, data_start: int) -> int:
    return int(_U64.unpack_from(image, data_start)[0])


def seed_data(seed: int) -> bytes:
    return _U32.pack(seed)


def snapshot_data(marker: SnapshotMarker) -> bytes:
    return _SNAPSHOT.pack(marker.term, marker.index)


def decode_snapshot(image: bytes, data_start: int, data_end: int) -> SnapshotMarker | None:
    """The marker in a snapshot record, or None if its data has the wrong size."""
    if data_end - data_start != _SNAPSHOT.size:
        return None
    term, index = _SNAPSHOT.unpack_from(image, data_start)
    return SnapshotMarker(term=term, index=index)


def decode_seed(image: bytes, data_start: int, data_end: int) -> int | None:
    if data_end - data_start != _U32.size:
        return None
    return int(_U32.unpack_from(image, data_start)[0])


class FrameProblem(NamedTuple):
    """Why decoding stopped: ``torn`` (an unfinished write) or ``corrupt``."""

    kind: str
    offset: int
    reason: str


TORN = "torn"
CORRUPT = "corrupt"


def has_zero_sector(image: bytes, start: int, end: int) -> bool:
    """True if some sector-aligned chunk of image[start:end] is all zeros (etcd isTornEntry)."""
    offset = start
    while offset < end:
        chunk_end = min(end, (offset // SECTOR_BYTES + 1) * SECTOR_BYTES)
        if image[offset:chunk_end] == _ZERO_CHUNK[: chunk_end - offset]:
            return True
        offset = chunk_end
    return False


def is_zero(image: bytes, start: int) -> bool:
    """True if image[start:] holds only zero bytes (compared a chunk at a time)."""
    size = len(image)
    for offset in range(start, size, _TAIL_CHUNK_BYTES):
        end = min(size, offset + _TAIL_CHUNK_BYTES)
        if image[offset:end] != _ZERO_CHUNK[: end - offset]:
            return False
    return True


class SegmentDecoder:
    """Walks the frames of one segment image, checking every byte of each frame.

    Iterate :meth:`records` for ``(type, frame_offset, data_start, data_end)``
    of each good record, in order. When it stops, ``end_offset`` is the offset
    after the last good frame, ``crc`` the chain value there, ``seed`` the
    value the segment's crc record started from (None if unreadable), and
    ``problem`` says why it stopped early (None at a clean end of data: a zero
    length field or fewer than 8 bytes left; whether the bytes after that are
    zero is :meth:`tail_is_zero`).
    """

    __slots__ = ("crc", "end_offset", "image", "problem", "record_size_max_bytes", "seed")

    def __init__(self, image: bytes, record_size_max_bytes: int) -> None:
        self.image = image
        self.record_size_max_bytes = record_size_max_bytes
        self.seed = self._peek_seed()
        self.crc = 0 if self.seed is None else self.seed
        self.end_offset = 0
        self.problem: FrameProblem | None = None

    def _peek_seed(self) -> int | None:
        image = self.image
        if len(image) < _DATA_OFFSET + _U32.size:
            return None
        field = _U64.unpack_from(image, 0)[0]
        rtype = _TYPE.unpack_from(image, _COVERED_OFFSET)[0]
        if rtype != RecordType.CRC or field & _LENGTH_MASK != RECORD_HEADER_BYTES + _U32.size:
            return None
        return int(_U32.unpack_from(image, _DATA_OFFSET)[0])

    def tail_is_zero(self) -> bool:
        return is_zero(self.image, self.end_offset)

    def records(self) -> Iterator[tuple[int, int, int, int]]:
        """The replay hot loop: one unpack, one CRC call and a few compares per record."""
        image = self.image
        view = memoryview(image)
        size = len(image)
        unpack_head = _HEAD.unpack_from
        smallest = _RECORD_BYTES_MIN
        valid_tops = _VALID_TOPS
        padding = PADDING
        limit = self.record_size_max_bytes
        crc = self.crc
        offset = 0
        while offset + _DATA_OFFSET <= size:
            field, stored, rtype = unpack_head(image, offset)
            if field == 0:
                break
            record_bytes = field & _LENGTH_MASK
            pad = -record_bytes & 7
            data_end = offset + 8 + record_bytes
            if field >> 56 != valid_tops[pad] or not 8 <= record_bytes <= limit:
                self._stop_on_length(offset, crc, field)
                return
            frame_end = data_end + pad
            if frame_end > size:
                self._stop(offset, crc, TORN, "record runs past the end of the file")
                return
            actual = crc32c(view[offset + 12 : data_end], crc)
            if actual != stored:
                self._stop_on_crc(offset, frame_end, crc, stored, actual)
                return
            if record_bytes < smallest.get(rtype, _NEVER) or (
                pad and image[data_end:frame_end] != padding[pad]
            ):
                self._stop(offset, crc, CORRUPT, "unknown type, short record or non-zero padding")
                return
            crc = actual
            yield rtype, offset, offset + 16, data_end
            offset = frame_end
        self.crc = crc
        self._finish(offset)

    def _finish(self, offset: int) -> None:
        """End of data at ``offset``, unless 8..15 bytes of a frame are left there."""
        size = len(self.image)
        self.end_offset = offset
        if offset + FRAME_LENGTH_BYTES <= size < offset + _DATA_OFFSET:
            field = _U64.unpack_from(self.image, offset)[0]
            if field != 0:
                self._stop(offset, self.crc, TORN, "record runs past the end of the file")

    def _stop_on_length(self, offset: int, crc: int, field: int) -> None:
        """A garbage length field followed only by zeros is a damaged tail, not lost data."""
        reason = f"invalid length field 0x{field:016x}"
        if is_zero(self.image, offset + FRAME_LENGTH_BYTES):
            self._stop(offset, crc, TORN, f"{reason} in the zero tail")
        else:
            self._stop(offset, crc, CORRUPT, reason)

    def _stop_on_crc(self, offset: int, frame_end: int, crc: int, stored: int, actual: int) -> None:
        reason = f"CRC mismatch (stored 0x{stored:08x}, computed 0x{actual:08x})"
        if has_zero_sector(self.image, offset + FRAME_LENGTH_BYTES, frame_end):
            self._stop(offset, crc, TORN, f"torn write: {reason} and a zero sector")
        else:
            self._stop(offset, crc, CORRUPT, reason)

    def _stop(self, offset: int, crc: int, kind: str, reason: str) -> None:
        self.end_offset = offset
        self.crc = crc
        self.problem = FrameProblem(kind, offset, reason)
