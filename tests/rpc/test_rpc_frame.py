"""The frame reader, without sockets: framing, limits and the copy count."""

from __future__ import annotations

import random

import pytest

from quorumlog.errors import ProtocolError
from quorumlog.rpc._frame import (
    HEADER,
    HEADER_BYTES,
    MIN_READ_BYTES,
    Frame,
    FrameError,
    FrameReader,
)

from .support import raw_frame


def feed(reader: FrameReader, data: bytes, *, max_read: int | None = None) -> list[Frame]:
    """Push ``data`` through get_buffer/buffer_updated; collect parsed frames."""
    frames: list[Frame] = []
    position = 0
    while position < len(data):
        buffer = reader.get_buffer()
        assert len(buffer) > 0
        n = min(len(buffer), len(data) - position, max_read or len(data))
        buffer[:n] = data[position : position + n]
        reader.buffer_updated(n)
        position += n
        while (frame := reader.next_frame()) is not None:
            frames.append(frame)
    return frames


def test_frames_parse_across_every_split_point() -> None:
    stream = raw_frame(7, 1, b"abc", b"payload-1") + raw_frame(8, 2, b"", b"") + raw_frame(
        9, 3, b"body", b""
    )
    for max_read in range(1, len(stream) + 1):
        reader = FrameReader(max_frame_bytes=1024, chunk_bytes=MIN_READ_BYTES)
        frames = feed(reader, stream, max_read=max_read)
        assert [(f.type_id, f.request_id) for f in frames] == [(7, 1), (8, 2), (9, 3)]
        assert bytes(frames[0].body) == b"abc" and bytes(frames[0].payload) == b"payload-1"
        assert bytes(frames[1].body) == b"" and bytes(frames[1].payload) == b""
        assert bytes(frames[2].body) == b"body" and len(frames[2].payload) == 0
        assert reader.buffered_bytes == 0


def test_payload_views_stay_valid_while_more_data_arrives() -> None:
    rng = random.Random(7)
    payloads = [rng.randbytes(rng.randrange(0, 20_000)) for _ in range(200)]
    stream = b"".join(raw_frame(60000, i, b"x", p) for i, p in enumerate(payloads))
    reader = FrameReader(max_frame_bytes=1 << 20, chunk_bytes=MIN_READ_BYTES * 4)
    frames = feed(reader, stream, max_read=3000)
    # every view is checked only after the whole stream went through the reader
    assert [bytes(f.payload) for f in frames] == payloads


@pytest.mark.parametrize("max_read", [None, 1500, MIN_READ_BYTES, 100_000])
def test_back_to_back_64k_entries_copy_at_most_one_small_read_each(max_read: int | None) -> None:
    payload = bytes(range(256)) * 256  # 64 KiB, as a bookie add carries
    frames_bytes = raw_frame(60000, 1, b"h", payload) * 16
    reader = FrameReader(max_frame_bytes=1 << 20, chunk_bytes=256 * 1024)
    frames = feed(reader, frames_bytes, max_read=max_read)
    assert len(frames) == 16 and all(f.payload == payload for f in frames)
    # Each entry's frame is completed in a buffer of its own; only the start
    # read together with its header (one read of at most 4 KiB) is moved.
    assert reader.copied_bytes <= 16 * MIN_READ_BYTES


def test_small_frames_are_read_many_at_a_time_with_few_copies() -> None:
    stream = b"".join(raw_frame(60000, i, b"x" * 40) for i in range(20_000))
    reader = FrameReader(max_frame_bytes=1 << 20, chunk_bytes=256 * 1024)
    reads = 0
    position = 0
    while position < len(stream):
        buffer = reader.get_buffer()
        n = min(len(buffer), len(stream) - position)
        buffer[:n] = stream[position : position + n]
        reader.buffer_updated(n)
        position += n
        reads += 1
        while reader.next_frame() is not None:
            pass
    assert reads <= len(stream) // (256 * 1024) + 3
    assert reader.copied_bytes <= reads * 60  # at most one partial frame per chunk


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        (HEADER.pack(16, 0x00, 1, 1, 1, 0), "bad frame magic"),
        (HEADER.pack(16, 0xB7, 9, 1, 1, 0), "unsupported frame version"),
        (HEADER.pack(3, 0xB7, 1, 1, 1, 0), "shorter than the header"),
        (HEADER.pack(1 << 30, 0xB7, 1, 1, 1, 0), "oversize frame"),
        (HEADER.pack(20, 0xB7, 1, 1, 1, 5), "exceeds frame length"),
    ],
)
def test_bad_headers_raise_protocol_errors(header: bytes, reason: str) -> None:
    reader = FrameReader(max_frame_bytes=1 << 20, chunk_bytes=MIN_READ_BYTES)
    with pytest.raises(FrameError, match=reason) as caught:
        feed(reader, header + b"\0" * 8)
    assert isinstance(caught.value, ProtocolError) and not caught.value.retriable


def test_incomplete_frame_is_reported_as_buffered() -> None:
    reader = FrameReader(max_frame_bytes=1024, chunk_bytes=MIN_READ_BYTES)
    whole = raw_frame(1, 1, b"abcdef")
    assert feed(reader, whole[: HEADER_BYTES + 2]) == []
    assert reader.buffered_bytes == HEADER_BYTES + 2


def test_an_announced_length_is_not_allocated_before_its_bytes_arrive() -> None:
    """Issue 13, finding 3: a header announcing 16 MiB made the reader allocate
    16 MiB at once; now the buffer grows with the bytes actually received."""
    chunk = 256 * 1024
    announced = 16 * 1024 * 1024
    payload = random.Random(3).randbytes(announced - HEADER_BYTES - 1)
    frame = raw_frame(7, 1, b"b", payload)
    reader = FrameReader(max_frame_bytes=announced, chunk_bytes=chunk)
    feed(reader, frame[:HEADER_BYTES + 100])
    assert reader.next_frame() is None
    assert reader.held_bytes <= chunk
    received = HEADER_BYTES + 100
    frames: list[Frame] = []
    for start in range(received, len(frame), 100_000):
        frames += feed(reader, frame[start : start + 100_000])
        received = min(start + 100_000, len(frame))
        if not frames:
            assert reader.held_bytes <= max(chunk, 2 * received) + MIN_READ_BYTES
    assert len(frames) == 1
    assert bytes(frames[0].body) == b"b" and bytes(frames[0].payload) == payload
    assert reader.copied_bytes < announced


def test_a_frame_within_a_chunk_still_gets_one_exact_buffer() -> None:
    """The growth above does not touch the zero-copy path of 64 KiB entries."""
    reader = FrameReader(max_frame_bytes=1 << 24, chunk_bytes=256 * 1024)
    payloads = [bytes([i]) * 65536 for i in range(20)]
    stream = b"".join(raw_frame(7, i + 1, b"", p) for i, p in enumerate(payloads))
    frames = feed(reader, stream, max_read=MIN_READ_BYTES * 8)
    assert [bytes(f.payload) for f in frames] == payloads
    assert reader.copied_bytes <= 20 * MIN_READ_BYTES
