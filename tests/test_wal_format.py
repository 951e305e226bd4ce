"""The WAL byte format: frames, alignment, the CRC chain, torn-write detection."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from crc32c import crc32c

from quorumlog.errors import ConfigError, UsageError
from quorumlog.wal import SnapshotMarker, WalConfig, WalEntry
from quorumlog.wal._encoder import Encoded, Encoder, segment_header
from quorumlog.wal._files import SegmentName
from quorumlog.wal._format import (
    CORRUPT,
    SECTOR_BYTES,
    TORN,
    RecordType,
    SegmentDecoder,
    decode_seed,
    decode_snapshot,
    encode_entries,
    encode_record,
    entry_index,
    has_zero_sector,
    length_field,
)

LIMIT = 1 << 20


def _encoder(metadata: bytes = b"meta", segment_size: int = 1 << 20) -> tuple[Encoder, bytes]:
    header, crc = segment_header(0, metadata, None, SnapshotMarker(term=0, index=0))
    encoder = Encoder(
        metadata=metadata, segment=SegmentName(seq=0, index=0), offset=len(header), crc=crc,
        last_index=0, floor=0, state=None, segment_size_bytes=segment_size,
        record_size_max_bytes=LIMIT,
    )
    return encoder, header


def _flat(encoded: Encoded) -> bytes:
    return b"".join(encoded.buffers)


def _decode(image: bytes) -> tuple[list[tuple[int, int, int, int]], SegmentDecoder]:
    decoder = SegmentDecoder(image, LIMIT)
    return list(decoder.records()), decoder


def test_length_field_matches_etcd_encode_frame_size() -> None:
    assert length_field(16) == (16, 0)
    field, pad = length_field(13)
    assert pad == 3
    assert field == 13 | (0x80 | 3) << 56
    for size in range(8, 64):
        field, pad = length_field(size)
        assert (size + pad) % 8 == 0
        assert field & ((1 << 56) - 1) == size


def test_every_record_type_round_trips_in_the_byte_layout() -> None:
    encoder, header = _encoder()
    body = _flat(encoder.save(b"hard-state", [WalEntry(index=1, data=b"abc"),
                                               WalEntry(index=2, data=b"")]))
    body += _flat(encoder.snapshot(SnapshotMarker(term=3, index=2)))
    image = header + body
    records, decoder = _decode(image)
    types = [RecordType(r[0]) for r in records]
    assert types == [RecordType.CRC, RecordType.METADATA, RecordType.SNAPSHOT, RecordType.ENTRY,
                     RecordType.ENTRY, RecordType.STATE, RecordType.SNAPSHOT]
    assert decoder.problem is None
    assert decoder.end_offset == len(image)
    assert decoder.crc == encoder.crc
    assert all(r[1] % 8 == 0 for r in records)  # 8-byte aligned frames
    _, _, start, end = records[0]
    assert decode_seed(image, start, end) == 0
    assert image[records[1][2]:records[1][3]] == b"meta"
    assert entry_index(image, records[3][2]) == 1
    assert image[records[3][2] + 8:records[3][3]] == b"abc"
    assert image[records[5][2]:records[5][3]] == b"hard-state"
    assert decode_snapshot(image, records[6][2], records[6][3]) == SnapshotMarker(term=3, index=2)


def test_frame_header_is_length_crc_type_reserved() -> None:
    encoder, header = _encoder()
    frame = _flat(encoder.save(None, [WalEntry(index=1, data=b"xyz")]))
    field, crc, rtype, reserved, index = struct.unpack_from("<QIB3sQ", frame)
    assert field == (8 + 8 + 3) | (0x80 | 5) << 56
    assert (rtype, reserved, index) == (RecordType.ENTRY, b"\0\0\0", 1)
    previous = SegmentDecoder(header, LIMIT)
    list(previous.records())
    assert crc == crc32c(frame[12:8 + 19], previous.crc)  # covers type..data, chained
    assert frame[8 + 19:] == b"\0" * 5


def test_zero_length_field_is_the_end_of_data() -> None:
    encoder, header = _encoder()
    image = header + _flat(encoder.save(None, [WalEntry(index=1, data=b"x")]))
    records, decoder = _decode(image + bytes(4096))
    assert len(records) == 4
    assert decoder.problem is None
    assert decoder.end_offset == len(image)
    assert decoder.tail_is_zero()
    _, dirty = _decode(image + bytes(4000) + b"\x01" + bytes(95))
    assert not dirty.tail_is_zero()


def test_truncated_frame_is_torn_and_bad_crc_is_corrupt() -> None:
    encoder, header = _encoder()
    image = header + _flat(encoder.save(None, [WalEntry(index=1, data=b"y" * 100)]))
    _, cut = _decode(image[:-9])
    assert cut.problem is not None and cut.problem.kind == TORN
    assert cut.end_offset == len(header)
    flipped = bytearray(image)
    flipped[-20] ^= 0x04
    _, bad = _decode(bytes(flipped))
    assert bad.problem is not None and bad.problem.kind == CORRUPT
    assert bad.problem.offset == len(header)
    assert "CRC mismatch" in bad.problem.reason


def test_zero_sector_inside_a_frame_is_torn() -> None:
    encoder, header = _encoder()
    image = bytearray(header + _flat(encoder.save(None, [WalEntry(index=1, data=b"z" * 2000)])))
    image[SECTOR_BYTES:2 * SECTOR_BYTES] = bytes(SECTOR_BYTES)
    _, decoder = _decode(bytes(image))
    assert decoder.problem is not None and decoder.problem.kind == TORN
    assert has_zero_sector(bytes(image), 0, len(image))
    assert not has_zero_sector(b"\x01" * 2048, 0, 2048)
    # chunks follow absolute sector boundaries: 100 zero bytes straddling one are not a sector
    straddle = b"\x01" * 460 + bytes(100) + b"\x01" * 464
    assert not has_zero_sector(straddle, 0, len(straddle))


def test_invalid_length_fields_are_corrupt() -> None:
    encoder, header = _encoder()
    image = bytearray(header + _flat(encoder.save(None, [WalEntry(index=1, data=b"abc")])))
    for bad_field in (5, 13 | 0x03 << 56, 16 | 0x81 << 56, LIMIT + 8):
        corrupt = bytearray(image)
        struct.pack_into("<Q", corrupt, len(header), bad_field)
        _, decoder = _decode(bytes(corrupt))
        assert decoder.problem is not None and decoder.problem.kind == CORRUPT, bad_field
        assert "invalid length field" in decoder.problem.reason


def test_garbage_length_in_the_zero_tail_is_a_torn_tail() -> None:
    encoder, header = _encoder()
    image = bytearray(header + _flat(encoder.save(None, [WalEntry(index=1, data=b"abc")])))
    end = len(image)
    image += bytes(1024)
    image[end] = 0x03  # flipped bits where the next length field would go
    records, decoder = _decode(bytes(image))
    assert len(records) == 4
    assert decoder.problem is not None and decoder.problem.kind == TORN
    assert decoder.problem.offset == end
    image[end + 900] = 0x01  # data follows: a damaged length field inside the data
    _, inside = _decode(bytes(image))
    assert inside.problem is not None and inside.problem.kind == CORRUPT


def test_records_too_short_for_their_type_or_of_unknown_type_are_corrupt() -> None:
    for rtype, data in ((RecordType.ENTRY, b"abcd"), (RecordType.SNAPSHOT, b"x" * 8)):
        encoder, header = _encoder()
        pieces: list[bytes] = []
        encode_record(pieces, rtype, data, encoder.crc)  # a valid CRC over a bad record
        _, decoder = _decode(header + b"".join(pieces))
        assert decoder.problem is not None and decoder.problem.kind == CORRUPT
        assert "short record" in decoder.problem.reason
    encoder, header = _encoder()
    pieces = []
    unknown_type: Any = 9
    encode_record(pieces, unknown_type, b"", encoder.crc)
    _, unknown = _decode(header + b"".join(pieces))
    assert unknown.problem is not None and "unknown type" in unknown.problem.reason


def test_encode_entries_rejects_bad_input_without_output() -> None:
    pieces: list[bytes] = []
    with pytest.raises(UsageError, match="contiguous"):
        encode_entries(pieces, [WalEntry(index=1, data=b""), WalEntry(index=3, data=b"")], 0, 64)
    with pytest.raises(UsageError, match="must be bytes"):
        mutable: Any = bytearray(b"x")
        encode_entries(pieces, [WalEntry(index=1, data=mutable)], 0, 64)
    with pytest.raises(UsageError, match="limit"):
        encode_entries(pieces, [WalEntry(index=1, data=b"x" * 64)], 0, 64)


def test_encoder_cuts_when_the_segment_is_full() -> None:
    encoder, header = _encoder(segment_size=512)
    encoded = encoder.save(b"s", [WalEntry(index=i, data=b"q" * 100) for i in range(1, 5)])
    cut = encoded.cut
    assert cut is not None
    assert cut.name == SegmentName(seq=1, index=5)
    assert cut.previous_end == len(header) + encoded.size_bytes
    records, decoder = _decode(cut.header)
    assert [RecordType(r[0]) for r in records] == [RecordType.CRC, RecordType.METADATA,
                                                   RecordType.STATE]
    whole = SegmentDecoder(header + _flat(encoded), LIMIT)
    list(whole.records())
    assert decoder.seed == whole.crc  # the next segment continues the chain
    assert encoder.offset == len(cut.header)


@pytest.mark.parametrize(
    "changes",
    [
        {"segment_size_bytes": 100},
        {"record_size_max_bytes": 0},
        {"batch_size_max_bytes": 0},
        {"pending_size_max_bytes": 1, "batch_size_max_bytes": 2},
    ],
)
def test_config_rejects_bad_limits(changes: dict[str, int]) -> None:
    with pytest.raises(ConfigError):
        WalConfig().replace(**changes)
