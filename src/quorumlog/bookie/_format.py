"""On-disk formats of the ledger storage: entry log frames and index records.

Pure functions, no I/O. All integers are big-endian, so packed index keys sort
in (ledger, entry) order inside RocksDB.

Entry log file::

    header  magic "QLBKELOG" | version u32 | log_id u64 | crc32c u32   (24 bytes)
    frame*  length u32 | ledger u64 | entry u64 | crc32c u32 | data       (24 + length)

A frame's CRC covers its first 20 header bytes (length, ledger, entry) and the
data, so a flipped id is caught as surely as a flipped payload byte.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c

from quorumlog.bookie._config import FRAME_OVERHEAD_BYTES, LOG_HEADER_BYTES
from quorumlog.errors import invariant

LOG_MAGIC = b"QLBKELOG"
LOG_FORMAT_VERSION = 1
LOG_SUFFIX = ".log"
# Ledger and entry ids are u64 on disk but kept below 2**63 so that the key
# range of ledger L is [key(L, 0), key(L + 1, 0)) without overflow.
ID_LIMIT = 1 << 63
NO_ENTRY = -1

_FRAME = struct.Struct(">IQQI")
_LOG_HEADER = struct.Struct(">8sIQI")
_ENTRY_KEY = struct.Struct(">QQ")
_LEDGER_KEY = struct.Struct(">Q")
_LOCATION = struct.Struct(">QQI")
_LOG_USAGE = struct.Struct(">QQ")
_FRAME_CRC_COVERED_BYTES = 20
# The hot loops of a flush (entry log frames, index keys and values) use these
# directly: the CRC-covered head of a frame (length, ledger id, entry id), an
# index key, an index location value.
FRAME_HEAD = struct.Struct(">IQQ")
ENTRY_KEY = _ENTRY_KEY
LOCATION = _LOCATION
invariant(FRAME_HEAD.size == _FRAME_CRC_COVERED_BYTES, "frame head size drifted")
invariant(_FRAME.size == FRAME_OVERHEAD_BYTES, "frame header size drifted from the config")
# quorumlog_native.frames_following (the batch reads' walk) hard-codes this layout.
invariant((FRAME_HEAD.size, _FRAME.size) == (20, 24),
          "the frame layout drifted from quorumlog_native.frames_following'")
invariant(_LOG_HEADER.size == LOG_HEADER_BYTES, "log header size drifted from the config")


class FrameIncomplete(Exception):  # noqa: N818 - internal signal, never escapes the package
    """The buffer ends inside a frame."""


class FrameInvalid(Exception):  # noqa: N818 - internal signal, turned into a CorruptionError
    """The bytes at this position are not a valid frame; ``args[0]`` says why."""


@dataclass(frozen=True, slots=True)
class Frame:
    ledger_id: int
    entry_id: int
    data: bytes
    frame_bytes: int


@dataclass(frozen=True, slots=True)
class Location:
    """Where an entry's frame lives: entry log id, byte offset, frame size."""

    log_id: int
    offset: int
    frame_bytes: int


@dataclass(frozen=True, slots=True)
class LogUsage:
    """Per entry log: bytes written and committed (``end_offset``) and live bytes."""

    end_offset: int
    live_bytes: int

    @property
    def total_bytes(self) -> int:
        return max(0, self.end_offset - LOG_HEADER_BYTES)


def log_file_name(log_id: int) -> str:
    return f"{log_id:x}{LOG_SUFFIX}"


def parse_log_file_name(name: str) -> int | None:
    """The log id of an entry log file name, or None for any other name."""
    if not name.endswith(LOG_SUFFIX):
        return None
    stem = name[: -len(LOG_SUFFIX)]
    if not stem or any(c not in "0123456789abcdef" for c in stem):
        return None
    return int(stem, 16)


def encode_log_header(log_id: int) -> bytes:
    head = _LOG_HEADER.pack(LOG_MAGIC, LOG_FORMAT_VERSION, log_id, 0)[:-4]
    return head + crc32c.crc32c(head).to_bytes(4, "big")


def check_log_header(buf: bytes, log_id: int) -> str | None:
    """None if ``buf`` is a valid header of log ``log_id``, else what is wrong."""
    if len(buf) < LOG_HEADER_BYTES:
        return f"file header truncated to {len(buf)} bytes"
    magic, version, stored_id, crc = _LOG_HEADER.unpack_from(buf, 0)
    if crc != crc32c.crc32c(buf[: LOG_HEADER_BYTES - 4]):
        return "file header crc32c mismatch"
    if magic != LOG_MAGIC:
        return f"bad magic {magic!r}"
    if version != LOG_FORMAT_VERSION:
        return f"unsupported entry log version {version}"
    if stored_id != log_id:
        return f"header names log {stored_id:x}, file name says {log_id:x}"
    return None


def frame_crc(head: bytes, data: bytes) -> int:
    return int(crc32c.crc32c(data, crc32c.crc32c(head)))


def encode_frame_header(ledger_id: int, entry_id: int, data: bytes) -> bytes:
    head = _FRAME.pack(len(data), ledger_id, entry_id, 0)[:_FRAME_CRC_COVERED_BYTES]
    return head + frame_crc(head, data).to_bytes(4, "big")


def decode_frame(buf: bytes, pos: int, entry_max_bytes: int) -> Frame:
    """Decode and CRC-check the frame at ``buf[pos:]``.

    Raises FrameIncomplete when the buffer ends inside the frame, FrameInvalid
    when the bytes are not a valid frame.
    """
    if len(buf) - pos < FRAME_OVERHEAD_BYTES:
        raise FrameIncomplete
    length, ledger_id, entry_id, stored_crc = _FRAME.unpack_from(buf, pos)
    if length > entry_max_bytes:
        raise FrameInvalid(f"frame length {length} is over entry_max_bytes {entry_max_bytes}")
    start = pos + FRAME_OVERHEAD_BYTES
    end = start + length
    if end > len(buf):
        raise FrameIncomplete
    data = buf[start:end]
    computed = frame_crc(buf[pos : pos + _FRAME_CRC_COVERED_BYTES], data)
    if computed != stored_crc:
        raise FrameInvalid(
            f"crc32c mismatch: stored {stored_crc:#010x}, computed {computed:#010x}"
        )
    return Frame(ledger_id, entry_id, data, FRAME_OVERHEAD_BYTES + length)


def entry_key(ledger_id: int, entry_id: int) -> bytes:
    return _ENTRY_KEY.pack(ledger_id, entry_id)


def decode_entry_key(key: bytes) -> tuple[int, int]:
    ledger_id, entry_id = _ENTRY_KEY.unpack(key)
    return int(ledger_id), int(entry_id)


def ledger_key(ledger_id: int) -> bytes:
    return _LEDGER_KEY.pack(ledger_id)


def decode_ledger_key(key: bytes) -> int:
    return int(_LEDGER_KEY.unpack(key)[0])


def log_key(log_id: int) -> bytes:
    return _LEDGER_KEY.pack(log_id)


def encode_location(location: Location) -> bytes:
    return _LOCATION.pack(location.log_id, location.offset, location.frame_bytes)


def decode_location(value: bytes) -> Location:
    log_id, offset, frame_bytes = _LOCATION.unpack(value)
    return Location(int(log_id), int(offset), int(frame_bytes))


def encode_log_usage(usage: LogUsage) -> bytes:
    return _LOG_USAGE.pack(usage.end_offset, usage.live_bytes)


def decode_log_usage(value: bytes) -> LogUsage:
    end_offset, live_bytes = _LOG_USAGE.unpack(value)
    return LogUsage(int(end_offset), int(live_bytes))
