"""The stream entry format: one or a batch of messages in one ledger entry.

Layout (little-endian)::

    entry   := magic "QS" | version u8 (1) | flags u8 (0) | count u32 | message * count
    message := publish_time_ms i64 | key_length i32 (-1: no key) | properties_length u32
               | value_length u32 | key | properties | value
    properties := msgpack map str -> str (absent when properties_length is 0)

A message's position is (ledger_id, entry_id, batch_index) where batch_index
is its index in the entry. The fixed 20-byte message header keeps decoding to
one ``struct.unpack_from`` per message (the Spark reader decodes millions).
The ledger's digest already protects the bytes; decoding checks every length
against the entry size and raises :class:`MessageFormatError` on a mismatch.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping

import msgspec

from quorumlog.errors import UsageError, invariant
from quorumlog.stream._errors import MessageFormatError

MAGIC = b"QS"
FORMAT_VERSION = 1
_ENTRY_HEADER = struct.Struct("<2sBBI")
_MESSAGE_HEADER = struct.Struct("<qiII")
_SINGLE = struct.Struct("<2sBBIqiII")  # entry header + first message header
_NO_PROPERTIES: list[tuple[str, str]] = []  # shared: never mutated
ENTRY_HEADER_BYTES = _ENTRY_HEADER.size  # 8
MESSAGE_HEADER_BYTES = _MESSAGE_HEADER.size  # 20
ENTRY_PREFIX_WORD = int.from_bytes(MAGIC + bytes((FORMAT_VERSION, 0)), "little")
"""The first 4 bytes of every entry (magic, version, flags) as a little-endian
u32: what a columnar decoder compares in one vector operation."""
invariant((ENTRY_HEADER_BYTES, MESSAGE_HEADER_BYTES) == (8, 20),
          "the stream entry layout drifted from quorumlog_native.stream_columns'")
BATCH_MESSAGES_MAX = 100_000  # a decoder refuses entries claiming more (bounds the work)
KEY_MAX_BYTES = 64 * 1024  # keys route and index; large data belongs in the value
PROPERTIES_MAX_BYTES = 64 * 1024

_PROPS_ENCODER = msgspec.msgpack.Encoder()
_PROPS_DECODER = msgspec.msgpack.Decoder(dict[str, str])


class OutgoingMessage(msgspec.Struct, frozen=True, gc=False):
    """A message to write: value, optional key and properties, publish time.

    A msgspec Struct left out of the garbage collector (``gc=False``): the
    producer makes one per message, and at tens of thousands a second the
    tracked objects that live until their entry is durable were what made
    the collector run (and its full collections long). It holds bytes, ints
    and a str -> str mapping, so it can never be part of a reference cycle.
    """

    value: bytes
    key: bytes | None = None
    properties: Mapping[str, str] | None = None
    publish_time_ms: int = 0

    def encoded_size(self) -> int:
        props = len(self.properties) * 16 if self.properties else 0  # estimate for batching
        return MESSAGE_HEADER_BYTES + len(self.value) + len(self.key or b"") + props


class DecodedMessage(msgspec.Struct, frozen=True, gc=False):
    """A message as read back from an entry (a msgspec Struct outside the
    collector, as ``OutgoingMessage``: one per message read)."""

    batch_index: int
    publish_time_ms: int
    key: bytes | None
    properties: dict[str, str]
    value: bytes


def encode_properties(properties: Mapping[str, str] | None) -> bytes:
    if not properties:
        return b""
    for name, value in properties.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise UsageError("message properties must map str to str")
    data = _PROPS_ENCODER.encode(dict(properties))
    if len(data) > PROPERTIES_MAX_BYTES:
        raise UsageError(f"message properties take {len(data)} bytes; at most "
                         f"{PROPERTIES_MAX_BYTES} allowed")
    return data


def decode_properties(data: bytes | memoryview) -> dict[str, str]:
    """A message's properties from their msgpack bytes; MessageFormatError if malformed."""
    try:
        return _PROPS_DECODER.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise MessageFormatError(f"message properties are malformed: {exc}") from None


def checked_message_bytes(message: OutgoingMessage) -> int:
    """The exact bytes ``message`` takes in an entry (header, key, properties, value).

    Checks the key and properties limits, so a bad message is refused when it is
    sent rather than failing the whole batch it would have joined.
    """
    key = message.key
    if key is not None and len(key) > KEY_MAX_BYTES:
        raise UsageError(f"a message key has {len(key)} bytes; at most {KEY_MAX_BYTES}")
    props = encode_properties(message.properties)
    return MESSAGE_HEADER_BYTES + len(key or b"") + len(props) + len(message.value)


def encode_entry(messages: list[OutgoingMessage]) -> bytes:
    """One entry holding ``messages`` (in order; batch_index = list index)."""
    if not messages:
        raise UsageError("an entry holds at least one message")
    if len(messages) > BATCH_MESSAGES_MAX:
        raise UsageError(f"an entry holds at most {BATCH_MESSAGES_MAX} messages")
    parts: list[bytes] = [_ENTRY_HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(messages))]
    pack = _MESSAGE_HEADER.pack
    for message in messages:
        key = message.key
        if key is not None and len(key) > KEY_MAX_BYTES:
            raise UsageError(f"a message key has {len(key)} bytes; at most {KEY_MAX_BYTES}")
        props = encode_properties(message.properties)
        value = bytes(message.value)
        parts.append(pack(message.publish_time_ms, -1 if key is None else len(key), len(props),
                          len(value)))
        if key:
            parts.append(key)
        if props:
            parts.append(props)
        parts.append(value)
    return b"".join(parts)


def entry_message_count(payload: bytes) -> int:
    """How many messages an entry holds (checks the entry header only)."""
    _magic_version(payload)
    count: int = _ENTRY_HEADER.unpack_from(payload)[3]
    return count


def first_publish_time_ms(payload: bytes) -> int:
    """The publish time of the entry's first message (for publish-time search)."""
    _magic_version(payload)
    if len(payload) < ENTRY_HEADER_BYTES + MESSAGE_HEADER_BYTES:
        raise MessageFormatError("entry too short for its first message header")
    publish: int = _MESSAGE_HEADER.unpack_from(payload, ENTRY_HEADER_BYTES)[0]
    return publish


def _magic_version(payload: bytes) -> None:
    if len(payload) < ENTRY_HEADER_BYTES:
        raise MessageFormatError(f"entry of {len(payload)} bytes is shorter than its header")
    magic, version, _flags, count = _ENTRY_HEADER.unpack_from(payload)
    if magic != MAGIC:
        raise MessageFormatError(
            f"entry does not start with the stream magic {MAGIC!r} (got {magic!r}): the ledger "
            "is not a stream ledger"
        )
    if version != FORMAT_VERSION:
        raise MessageFormatError(f"entry format version {version} is unknown (this code reads "
                                 f"{FORMAT_VERSION})")
    if not 1 <= count <= BATCH_MESSAGES_MAX:
        raise MessageFormatError(f"entry claims {count} messages")


def decode_entry(payload: bytes) -> list[DecodedMessage]:
    """Every message of an entry, in batch order. Raises MessageFormatError."""
    out: list[DecodedMessage] = []
    decode_entry_columns(payload, _RowSink(out))
    return out


class ColumnSink:
    """Receives decoded messages column-wise (what the Spark reader builds Arrow from)."""

    __slots__ = ("batch_index", "entry_index", "key", "properties", "publish_time_ms", "value")

    def __init__(self) -> None:
        self.entry_index: list[int] = []  # index of the entry in the caller's list
        self.batch_index: list[int] = []
        self.publish_time_ms: list[int] = []
        self.key: list[bytes | None] = []
        self.properties: list[list[tuple[str, str]]] = []
        self.value: list[bytes] = []

    def __len__(self) -> int:
        return len(self.value)


class _RowSink(ColumnSink):
    __slots__ = ("rows",)

    def __init__(self, rows: list[DecodedMessage]) -> None:
        super().__init__()
        self.rows = rows


def decode_entry_columns(payload: bytes, sink: ColumnSink, entry_index: int = 0,
                         first_batch_index: int = 0, last_batch_index: int = -1) -> int:
    """Append the messages of one entry to ``sink``; return how many were appended.

    Only messages with ``first_batch_index <= batch_index <= last_batch_index``
    are appended (``last_batch_index`` -1: to the end of the batch).
    """
    size = len(payload)
    rows = sink.rows if isinstance(sink, _RowSink) else None
    if rows is None and size >= _SINGLE.size and first_batch_index == 0:
        # Fast path (most entries): one message, no properties.
        magic, version, _flags, count, publish, key_length, props_length, value_length = (
            _SINGLE.unpack_from(payload))
        if (count == 1 and props_length == 0 and magic == MAGIC and version == FORMAT_VERSION
                and key_length >= -1
                and _SINGLE.size + max(key_length, 0) + value_length == size):
            start = _SINGLE.size + max(key_length, 0)
            sink.entry_index.append(entry_index)
            sink.batch_index.append(0)
            sink.publish_time_ms.append(publish)
            sink.key.append(payload[_SINGLE.size:start] if key_length >= 0 else None)
            sink.properties.append(_NO_PROPERTIES)
            sink.value.append(payload[start:])
            return 1
    _magic_version(payload)
    count = _ENTRY_HEADER.unpack_from(payload)[3]
    view = memoryview(payload)
    offset = ENTRY_HEADER_BYTES
    unpack = _MESSAGE_HEADER.unpack_from
    last = count - 1 if last_batch_index < 0 else min(last_batch_index, count - 1)
    appended = 0
    for index in range(count):
        if offset + MESSAGE_HEADER_BYTES > size:
            raise MessageFormatError(f"message {index} header runs past the entry end")
        publish, key_length, props_length, value_length = unpack(payload, offset)
        offset += MESSAGE_HEADER_BYTES
        end = offset + max(key_length, 0) + props_length + value_length
        if key_length < -1 or end > size:
            raise MessageFormatError(f"message {index} lengths run past the entry end")
        if index < first_batch_index or index > last:
            offset = end
            continue
        key = None
        if key_length >= 0:
            key = bytes(view[offset:offset + key_length])
            offset += key_length
        props: dict[str, str] = {}
        if props_length:
            try:
                props = _PROPS_DECODER.decode(view[offset:offset + props_length])
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                raise MessageFormatError(f"message {index} properties are malformed: {exc}") \
                    from None
            offset += props_length
        value = bytes(view[offset:offset + value_length])
        offset = end
        appended += 1
        if rows is not None:
            rows.append(DecodedMessage(index, publish, key, props, value))
            continue
        sink.entry_index.append(entry_index)
        sink.batch_index.append(index)
        sink.publish_time_ms.append(publish)
        sink.key.append(key)
        sink.properties.append(list(props.items()))
        sink.value.append(value)
    if offset != size:
        raise MessageFormatError(f"entry has {size - offset} trailing bytes after its messages")
    return appended
