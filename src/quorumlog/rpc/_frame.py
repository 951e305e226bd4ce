"""The wire frame, sans-IO: encoding, and a reader that parses frames out of
receive chunks without copying payloads.

Layout (little-endian), ``HEADER_BYTES`` = 20::

    u32 frame_length   bytes after this field (16 + body + payload)
    u8  magic          0xB7
    u8  version        1
    u16 type_id        message type (see _messages.py)
    u64 request_id     correlates a response with its request
    u32 body_length    msgpack-encoded message; the rest is the raw payload

The payload is an opaque trailing segment: it is handed to the transport as its
own buffer when sending, and to the receiver as a memoryview of the receive
chunk it landed in, so entry bytes are never copied into or out of msgpack.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from quorumlog.errors import ProtocolError, invariant

HEADER = struct.Struct("<IBBHQI")
HEADER_BYTES = HEADER.size
LENGTH_FIELD_BYTES = 4
MAGIC = 0xB7
VERSION = 1
# frame_length is a u32 and counts the bytes after itself.
MAX_FRAME_BYTES_WIRE = 0xFFFFFFFF + LENGTH_FIELD_BYTES
MAX_REQUEST_ID = 0xFFFFFFFFFFFFFFFF
ONEWAY_REQUEST_ID = 0  # a request that wants no response (client ids start at 1)
# A receive chunk with less room than this is replaced by a fresh one.
MIN_READ_BYTES = 4096
# The smallest max_frame_bytes an endpoint may configure or announce in its
# hello: below it not even an error response fits (a hello announcing 0 was
# accepted once, and then every answer to that client failed).
MIN_FRAME_LIMIT_BYTES = 4096

EMPTY = memoryview(b"")


class FrameError(ProtocolError):
    """The byte stream is not a valid sequence of frames; the connection dies."""


class Frame(NamedTuple):
    type_id: int
    request_id: int
    body: memoryview
    payload: memoryview


def pack_header(buffer: bytearray, type_id: int, request_id: int, payload_bytes: int) -> int:
    """Fill the header at the front of ``buffer`` (which already holds the body
    after ``HEADER_BYTES``); return the frame size including the payload."""
    body_bytes = len(buffer) - HEADER_BYTES
    frame_bytes = len(buffer) + payload_bytes
    invariant(body_bytes >= 0, "frame buffer shorter than its header")
    HEADER.pack_into(
        buffer,
        0,
        frame_bytes - LENGTH_FIELD_BYTES,
        MAGIC,
        VERSION,
        type_id,
        request_id,
        body_bytes,
    )
    return frame_bytes


class FrameReader:
    """Parses frames from data written into buffers it hands out.

    Data is received straight into *chunks* (``get_buffer`` /
    ``buffer_updated``, the shape of :class:`asyncio.BufferedProtocol`). A chunk
    is never written twice, so a frame's body and payload are returned as
    memoryviews into it and stay valid for as long as the caller holds them.

    Small frames are read many at a time into a shared chunk of
    ``chunk_bytes``. A *large* frame (at least a quarter of a chunk: a 64 KiB
    entry with the default 256 KiB chunk) is completed in a buffer of its exact
    size, with reads that stop at its end; after a large frame the next read is
    capped at ``MIN_READ_BYTES``, so when large frames follow each other only
    that much of each (the part read together with its header) is copied. The
    only copy is that move of a frame's received start into its new buffer
    (``copied_bytes`` counts it).

    The announced length is never allocated up front: a frame larger than one
    chunk starts in a buffer of ``chunk_bytes`` that doubles as its bytes
    arrive (each step copies what arrived, under the frame's size in total),
    so a buffer is never more than ``max(chunk_bytes, 2 * received)``.
    """

    def __init__(self, *, max_frame_bytes: int, chunk_bytes: int) -> None:
        invariant(chunk_bytes >= MIN_READ_BYTES, "chunk_bytes below MIN_READ_BYTES")
        invariant(max_frame_bytes > HEADER_BYTES, "max_frame_bytes below the header size")
        self._max_frame_bytes = max_frame_bytes
        self._chunk_bytes = chunk_bytes
        self._large_frame_bytes = max(chunk_bytes // 4, 4 * MIN_READ_BYTES)
        self._chunk = bytearray(MIN_READ_BYTES)  # idle connections stay small
        self._view = memoryview(self._chunk)
        self._read_pos = 0  # first byte not yet parsed
        self._write_pos = 0  # first byte not yet received
        self._next_frame_bytes = 0  # size of the frame at _read_pos, once known
        self._type_id = 0  # and the rest of its header
        self._request_id = 0
        self._body_bytes = 0
        self._after_large = False  # the last frame was large: expect another
        self.copied_bytes = 0  # bytes moved between chunks (for the copy count)

    def set_max_frame_bytes(self, max_frame_bytes: int) -> None:
        """Change the frame size limit (checked on each header from now on)."""
        invariant(max_frame_bytes > HEADER_BYTES, "max_frame_bytes below the header size")
        self._max_frame_bytes = max_frame_bytes

    def release(self) -> None:
        """Drop the receive buffer (the connection is gone)."""
        self._chunk = bytearray()
        self._view = memoryview(self._chunk)
        self._read_pos = self._write_pos = self._next_frame_bytes = 0

    @property
    def incomplete_frame_bytes(self) -> int:
        """Announced size of the frame being received (0 when between frames)."""
        return self._next_frame_bytes

    @property
    def held_bytes(self) -> int:
        """Size of the buffer being received into (what this reader costs now,
        besides earlier buffers still referenced by frames handed out)."""
        return len(self._chunk)

    @property
    def buffered_bytes(self) -> int:
        """Bytes received but not yet returned as part of a frame."""
        return self._write_pos - self._read_pos

    def get_buffer(self) -> memoryview:
        """Where the next received bytes go (never empty)."""
        frame_bytes = self._next_frame_bytes
        pending = self._write_pos - self._read_pos
        if frame_bytes >= self._large_frame_bytes and pending < frame_bytes:
            if len(self._chunk) - self._read_pos >= frame_bytes:
                return self._view[self._write_pos : self._read_pos + frame_bytes]
            if self._read_pos == 0 and len(self._chunk) - self._write_pos >= MIN_READ_BYTES:
                return self._view[self._write_pos :]  # a growing buffer: fill it first
            # Never trust the announced length: the buffer is at most twice what
            # has arrived (or one chunk), so a peer that announces a huge frame
            # and stalls costs what it sent, not what it claimed. Growing copies
            # the received part: under the frame's size in total, and nothing for
            # frames that fit in one chunk (a 64 KiB entry).
            grown = max(self._chunk_bytes, 2 * pending)
            # room for one capped read after it: the next frame's header
            self._new_chunk(min(frame_bytes + MIN_READ_BYTES, grown))
            end = min(len(self._chunk), frame_bytes)
            return self._view[self._write_pos : end]
        read_max = MIN_READ_BYTES if self._after_large else self._chunk_bytes
        needed = max(frame_bytes, HEADER_BYTES)
        room = len(self._chunk) - self._write_pos
        fits = len(self._chunk) - self._read_pos >= needed
        if not fits or room == 0 or (room < MIN_READ_BYTES and pending == 0):
            self._new_chunk(max(read_max, needed))
        return self._view[self._write_pos : self._write_pos + read_max]

    def buffer_updated(self, nbytes: int) -> None:
        invariant(0 < nbytes <= len(self._chunk) - self._write_pos, "buffer_updated overflow")
        self._write_pos += nbytes

    def next_frame(self) -> Frame | None:
        """The next complete frame, or None until more data arrives.

        Raises :class:`FrameError` on a malformed or oversize header; the reader
        is useless afterwards (the stream has lost its framing).
        """
        available = self._write_pos - self._read_pos
        if self._next_frame_bytes == 0:
            if available < HEADER_BYTES:
                return None
            self._parse_header()
        frame_bytes = self._next_frame_bytes
        if available < frame_bytes:
            return None
        start = self._read_pos
        body_start = start + HEADER_BYTES
        body_end = body_start + self._body_bytes
        end = start + frame_bytes
        self._read_pos = end
        self._next_frame_bytes = 0
        self._after_large = frame_bytes >= self._large_frame_bytes
        payload = self._view[body_end:end] if body_end < end else EMPTY
        return Frame(self._type_id, self._request_id, self._view[body_start:body_end], payload)

    def _parse_header(self) -> None:
        length: int
        body_bytes: int
        length, magic, version, type_id, request_id, body_bytes = HEADER.unpack_from(
            self._chunk, self._read_pos
        )
        if magic != MAGIC:
            raise FrameError(f"bad frame magic 0x{magic:02x} (not a quorumlog rpc peer?)")
        if version != VERSION:
            raise FrameError(f"unsupported frame version {version} (this side speaks {VERSION})")
        frame_bytes = length + LENGTH_FIELD_BYTES
        if frame_bytes < HEADER_BYTES:
            raise FrameError(f"frame length {frame_bytes} is shorter than the header")
        if frame_bytes > self._max_frame_bytes:
            raise FrameError(
                f"oversize frame: {frame_bytes} bytes > max_frame_bytes {self._max_frame_bytes}"
            )
        if body_bytes > frame_bytes - HEADER_BYTES:
            raise FrameError(f"body length {body_bytes} exceeds frame length {frame_bytes}")
        self._next_frame_bytes = frame_bytes
        self._type_id = type_id
        self._request_id = request_id
        self._body_bytes = body_bytes

    def _new_chunk(self, size: int) -> None:
        """Continue in a fresh chunk of at least ``size`` bytes, moving the
        received start of the current frame into it."""
        pending = self._write_pos - self._read_pos
        chunk = bytearray(max(size, pending + MIN_READ_BYTES))
        if pending:
            chunk[:pending] = self._view[self._read_pos : self._write_pos]
            self.copied_bytes += pending
        self._chunk = chunk
        self._view = memoryview(chunk)
        self._read_pos = 0
        self._write_pos = pending
