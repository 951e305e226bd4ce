"""Arrow record batches from stream entries, and messages from Arrow rows.

Reading yields Arrow batches rather than Python tuples: Spark's Python data
source moves Arrow batches without converting each row (the issue measured
about 3x the rate of tuples).
"""

from __future__ import annotations

import array
import functools
import itertools
import struct
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from quorumlog.errors import UsageError, invariant
from quorumlog.stream import (
    BATCH_MESSAGES_MAX,
    ENTRY_HEADER_BYTES,
    ENTRY_PREFIX_WORD,
    MESSAGE_HEADER_BYTES,
    ColumnSink,
    Message,
    OutgoingMessage,
    decode_properties,
)

SCHEMA_DDL = (
    "stream string, partition int, ledger_id long, entry_id long, batch_index int, "
    "publish_time timestamp, key binary, value binary, properties map<string,string>"
)
PROPERTIES_TYPE = pa.map_(pa.string(), pa.string())
ARROW_SCHEMA = pa.schema([
    ("stream", pa.string()),
    ("partition", pa.int32()),
    ("ledger_id", pa.int64()),
    ("entry_id", pa.int64()),
    ("batch_index", pa.int32()),
    ("publish_time", pa.timestamp("us", tz="UTC")),
    ("key", pa.binary()),
    ("value", pa.binary()),
    ("properties", PROPERTIES_TYPE),
])
WRITE_COLUMNS = {"value", "key", "properties", "partition"}


def record_batch(stream: str, partition: int, ledger_id: int, sink: ColumnSink, *,
                 publish_min_ms: int | None = None,
                 publish_max_ms: int | None = None) -> pa.RecordBatch:
    """The rows of ``sink`` (entry_index = entry id) as one Arrow batch."""
    n = len(sink)
    publish_ms = pa.array(sink.publish_time_ms, pa.int64())
    batch = pa.RecordBatch.from_arrays([
        pa.repeat(pa.scalar(stream, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        pa.repeat(pa.scalar(ledger_id, pa.int64()), n),
        pa.array(sink.entry_index, pa.int64()),
        pa.array(sink.batch_index, pa.int32()),
        _timestamps(publish_ms),
        binary_column(sink.key),
        binary_column(sink.value),
        properties_column(sink.properties),
    ], schema=ARROW_SCHEMA)
    if publish_min_ms is None and publish_max_ms is None:
        return batch
    mask = pa.array([True] * n)
    if publish_min_ms is not None:
        mask = pc.and_(mask, pc.greater_equal(publish_ms, pa.scalar(publish_min_ms, pa.int64())))
    if publish_max_ms is not None:
        mask = pc.and_(mask, pc.less_equal(publish_ms, pa.scalar(publish_max_ms, pa.int64())))
    return batch.filter(mask)


def record_batch_of_messages(messages: Sequence[Message], *,
                             publish_min_ms: int | None = None,
                             publish_max_ms: int | None = None) -> pa.RecordBatch:
    """Rows of decoded messages (a compacted view's: each keeps the ledger and
    entry it was written to), filtered by publish time when bounds are given."""
    kept = [m for m in messages
            if (publish_min_ms is None or m.publish_time_ms >= publish_min_ms)
            and (publish_max_ms is None or m.publish_time_ms <= publish_max_ms)]
    return pa.RecordBatch.from_arrays([
        pa.array([m.stream for m in kept], pa.string()),
        pa.array([m.partition for m in kept], pa.int32()),
        pa.array([m.position.ledger_id for m in kept], pa.int64()),
        pa.array([m.position.entry_id for m in kept], pa.int64()),
        pa.array([m.position.batch_index for m in kept], pa.int32()),
        _timestamps(pa.array([m.publish_time_ms for m in kept], pa.int64())),
        pa.array([m.key for m in kept], pa.binary()),
        binary_column([m.value for m in kept]),
        properties_column([list(m.properties.items()) for m in kept]),
    ], schema=ARROW_SCHEMA)


def binary_column(items: list[bytes | None] | list[bytes]) -> pa.Array:
    """A binary array built from one joined buffer and offsets (much faster than
    ``pa.array`` on a list of bytes); lists with nulls take the slow path."""
    if not items:
        return pa.array([], pa.binary())
    try:
        data = b"".join(items)  # type: ignore[arg-type]
    except TypeError:  # a None (no key)
        return pa.array(items, pa.binary())
    if len(data) >= 2**31:
        return pa.array(items, pa.large_binary()).cast(pa.binary())
    offsets = array.array("i", itertools.accumulate(map(len, items), initial=0))  # type: ignore[arg-type]
    return pa.Array.from_buffers(pa.binary(), len(items),
                                 [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def properties_column(items: list[list[tuple[str, str]]]) -> pa.Array:
    if any(items):
        return pa.array(items, PROPERTIES_TYPE)
    offsets = pa.array(array.array("i", bytes(4 * (len(items) + 1))), pa.int32())
    empty = pa.array([], pa.string())
    return pa.MapArray.from_arrays(offsets, empty, empty)


def check_write_schema(field_types: Mapping[str, str]) -> None:
    """Reject a DataFrame the stream cannot take, naming what is wrong."""
    unknown = sorted(set(field_types) - WRITE_COLUMNS)
    if unknown:
        raise UsageError(
            f"cannot write columns {unknown} to a quorumlog stream: the columns are value "
            "(binary or string, required), key (binary or string), properties "
            "(map<string,string>) and partition (int)")
    if "value" not in field_types:
        raise UsageError("writing to a quorumlog stream needs a 'value' column "
                         "(binary or string)")
    allowed = {
        "value": {"binary", "string"},
        "key": {"binary", "string"},
        "properties": {"map<string,string>"},
        "partition": {"int", "bigint", "smallint", "tinyint"},
    }
    for name, kind in field_types.items():
        if kind not in allowed[name]:
            raise UsageError(f"column {name} has type {kind}; a quorumlog stream takes "
                             f"{' or '.join(sorted(allowed[name]))}")


def _as_bytes(value: Any) -> bytes | None:
    if value is None:
        return None
    return value.encode() if isinstance(value, str) else bytes(value)


def messages_of(batch: pa.RecordBatch, publish_ms: int
                ) -> Iterator[tuple[int | None, OutgoingMessage]]:
    """(partition or None, message) per row of an Arrow batch being written."""
    names = batch.schema.names
    n = batch.num_rows
    values = batch.column(names.index("value")).to_pylist()
    keys = (batch.column(names.index("key")).to_pylist() if "key" in names
            else itertools.repeat(None, n))
    props = (batch.column(names.index("properties")).to_pylist() if "properties" in names
             else itertools.repeat(None, n))
    parts = (batch.column(names.index("partition")).to_pylist() if "partition" in names
             else itertools.repeat(None, n))
    for value, key, properties, partition in zip(values, keys, props, parts, strict=False):
        if value is None:
            raise UsageError("a row to write has a null value; every message needs a value")
        yield partition, OutgoingMessage(
            _as_bytes(value) or b"", key=_as_bytes(key),
            properties=dict(properties) if properties else None, publish_time_ms=publish_ms,
        )


# ----- columnar decode of entry buffers ------------------------------------------------------

_MESSAGE_PUBLISH, _MESSAGE_KEY, _MESSAGE_PROPS, _MESSAGE_VALUE = 0, 2, 3, 4  # u32 word index
ARROW_BUFFER_BYTES_MAX = 2**31 - 1  # int32 Arrow offsets address the joined chunk
COLUMNAR_ROWS_PER_PASS_MIN = 256
"""Batched entries are located by vector passes (one per batch index) when
each pass covers at least this many messages on average; below that, the
fixed cost of a pass (~20 Arrow calls) loses to a Python walk over the
message headers (measured: 1,000 messages per entry, 64 entries a chunk)."""
_MESSAGE_LENGTHS = struct.Struct("<8xiII")  # key, properties, value lengths of a message


_I32 = pa.int32()
_ZERO = pa.array([0], _I32)


def _i32(value: int) -> pa.Scalar:
    """A typed scalar: an untyped Python int makes compute kernels widen to int64."""
    return pa.scalar(value, _I32)


def _timestamps(publish_ms: pa.Array) -> pa.Array:
    """Publish times (ms, int64) as the UTC microsecond timestamps of the schema.
    Every compute argument is an Arrow value: a bare Python int makes pyarrow
    look for numpy on each call (an import attempt that costs ~1 ms here)."""
    return pc.multiply(publish_ms, pa.scalar(1000, pa.int64())).cast(
        pa.timestamp("us", tz="UTC"))


def _int32(values: array.array[int]) -> pa.Array:
    """An int32 Arrow array over an ``array("i")`` (no copy)."""
    return pa.Array.from_buffers(pa.int32(), len(values), [None, pa.py_buffer(values)])


def _arange(n: int) -> pa.Array:
    """0 .. n-1 as int32, built in Arrow (``pa.array(range(n))`` walks Python ints)."""
    return pc.subtract(pc.cumulative_sum(pa.repeat(_i32(1), n)), _i32(1))


@functools.lru_cache(maxsize=32)
def _stride_index(n: int, stride: int, word: int) -> pa.Array:
    """word, word + stride, word + 2 * stride, ... (n of them)."""
    return pc.add(pc.multiply(_arange(n), _i32(stride)), _i32(word))


class _Words:
    """n fixed-width headers of ``stride`` u32 words each, back to back."""

    def __init__(self, words: pa.Array, n: int, stride: int) -> None:
        self._words, self._n, self._stride = words, n, stride

    def word(self, index: int) -> pa.Array:
        """Word ``index`` of every header (u32)."""
        return pc.take(self._words, _stride_index(self._n, self._stride, index))

    def int64(self, index: int) -> pa.Array:
        """The little-endian i64 in words ``index`` and ``index + 1`` of every header."""
        low = self.word(index).cast(pa.int64())
        high = self.word(index + 1).view(pa.int32()).cast(pa.int64())
        return pc.add(pc.multiply(high, pa.scalar(1 << 32, pa.int64())), low)


@functools.lru_cache(maxsize=8)
def _interleave_index(n: int) -> tuple[pa.Array, pa.Array]:
    """(take indices that interleave two n-long arrays a, b as a0 b0 a1 b1 ...,
    the odd positions 1, 3, ... of a 2n-long array)."""
    count = _arange(2 * n)
    interleave = pc.add(pc.shift_right(count, _i32(1)),
                        pc.multiply(pc.bit_wise_and(count, _i32(1)), _i32(n)))
    odd = pc.add(pc.multiply(_arange(n), _i32(2)), _i32(1))
    return interleave, odd


class EntryColumns:
    """Stream entries held in one buffer (payload ``i`` at ``starts[i]:ends[i]``,
    entry ids ``first_entry_id + i``) decoded into Arrow columns by vector
    operations: fixed-width header fields are gathered out of the buffer with
    one take over a binary array of alternating gaps and fields, and read as
    integer arrays; keys and values are binary arrays taken the same way.
    Python touches messages only through the loop over batch indexes of
    batched entries (one pass of vector work per batch index, not per
    message) and for messages with properties."""

    def __init__(self, buffer: bytes | memoryview, starts: pa.Array, ends: pa.Array,
                 first_entry_id: int) -> None:
        invariant(len(buffer) <= ARROW_BUFFER_BYTES_MAX,
                  "an entry chunk is addressed with int32 Arrow offsets")
        self._raw = buffer
        self._buffer = pa.py_buffer(buffer)
        self.starts = starts.cast(pa.int32())
        self.ends = ends.cast(pa.int32())
        self.first_entry_id = first_entry_id

    def _slices(self, starts: pa.Array, lengths: pa.Array, valid: pa.Array | None) -> pa.Array:
        """A binary array of ``buffer[start:start + length]`` per row (``starts``
        ascending, the slices disjoint), null where ``valid`` is false: a
        binary array over the whole buffer whose elements alternate between
        the gaps and the slices, then a take of the slices (one copy each)."""
        n = len(starts)
        if not n:
            return pa.array([], pa.binary())
        interleave, odd = _interleave_index(n)
        bounds = pc.take(pa.concat_arrays([starts, pc.add(starts, lengths)]), interleave)
        spans = pa.Array.from_buffers(pa.binary(), 2 * n, [
            None, pa.concat_arrays([_ZERO, bounds]).buffers()[1], self._buffer])
        if valid is not None and not pc.all(valid).as_py():
            odd = pc.if_else(valid, odd, pa.scalar(None, _I32))
        return pc.take(spans, odd)

    def _headers(self, positions: pa.Array, words: int) -> _Words:
        """The ``words`` little-endian u32 words at each position (positions
        ascending, the headers disjoint): one block copied out of the buffer."""
        n = len(positions)
        block = self._slices(positions, pa.repeat(_i32(4 * words), n), None)
        data = block.buffers()[2] if n else pa.py_buffer(b"")
        return _Words(pa.Array.from_buffers(pa.uint32(), n * words, [None, data]), n, words)

    def decode(self) -> dict[str, pa.Array] | None:
        """Columns entry_pos, batch_index, publish_time_ms, key, value and
        props (start, length) per message in (entry, batch index) order; None
        when any entry breaks the format (the caller then decodes entry by
        entry for the precise error)."""
        i32 = pa.int32()
        sizes = pc.subtract(self.ends, self.starts)
        if pc.any(pc.less(sizes, _i32(ENTRY_HEADER_BYTES))).as_py():
            return None
        entry_header = self._headers(self.starts, ENTRY_HEADER_BYTES // 4)
        prefix = pa.scalar(ENTRY_PREFIX_WORD, pa.uint32())
        if not pc.all(pc.equal(entry_header.word(0), prefix)).as_py():
            return None
        counts = entry_header.word(1)
        low, high = pc.min_max(counts).values()
        if low.as_py() < 1 or high.as_py() > BATCH_MESSAGES_MAX:
            return None
        counts = counts.cast(i32)
        rows = pc.sum(counts).as_py()
        located = (self._locate_by_passes(counts)
                   if high.as_py() * COLUMNAR_ROWS_PER_PASS_MIN <= rows
                   else self._locate_by_walk(counts))
        if located is None:
            return None
        position, entry_pos, batch_index = located
        entry_end = pc.take(self.ends, entry_pos)
        header = self._headers(position, MESSAGE_HEADER_BYTES // 4)
        key_length = header.word(_MESSAGE_KEY).view(i32)
        props_length = header.word(_MESSAGE_PROPS).cast(i32)
        value_length = header.word(_MESSAGE_VALUE).cast(i32)
        if pc.min_max(key_length)["min"].as_py() < -1:
            return None
        key_start = pc.add(position, _i32(MESSAGE_HEADER_BYTES))
        key_bytes = pc.max_element_wise(key_length, _i32(0))
        props_start = pc.add(key_start, key_bytes)
        value_start = pc.add(props_start, props_length)
        if pc.any(pc.greater(pc.add(value_start, value_length), entry_end)).as_py():
            return None
        return {"entry_pos": entry_pos, "batch_index": batch_index,
                "publish_time_ms": header.int64(_MESSAGE_PUBLISH), "key_start": key_start,
                "key_length": key_bytes, "has_key": pc.greater_equal(key_length, _i32(0)),
                "props_start": props_start, "props_length": props_length,
                "value_start": value_start, "value_length": value_length}

    def _locate_by_passes(self, counts: pa.Array
                          ) -> tuple[pa.Array, pa.Array, pa.Array] | None:
        """(message header position, entry index, batch index) of every message,
        in order: pass ``k`` reads the header of message ``k`` of every entry
        that has one, as vector operations over the entries."""
        n = len(counts)
        active, cursor, ends, left = _arange(n), pc.add(self.starts, _i32(ENTRY_HEADER_BYTES)), \
            self.ends, counts
        found: list[tuple[pa.Array, pa.Array, pa.Array]] = []
        index = 0
        while len(active):
            if pc.any(pc.greater(pc.add(cursor, _i32(MESSAGE_HEADER_BYTES)), ends)).as_py():
                return None
            header = self._headers(cursor, MESSAGE_HEADER_BYTES // 4)
            key_length = header.word(_MESSAGE_KEY).view(pa.int32())
            if pc.min_max(key_length)["min"].as_py() < -1:
                return None
            props_length = header.word(_MESSAGE_PROPS)
            value_length = header.word(_MESSAGE_VALUE)
            end = pc.add(pc.add(pc.add(cursor, _i32(MESSAGE_HEADER_BYTES)),
                                pc.max_element_wise(key_length, _i32(0))),
                         pc.add(props_length.cast(pa.int64()), value_length.cast(pa.int64())))
            found.append((cursor, active, pa.repeat(_i32(index), len(active))))
            left = pc.subtract(left, _i32(1))
            more = pc.greater(left, _i32(0))
            if not pc.all(pc.or_(more, pc.equal(end, ends))).as_py():
                return None  # a message runs past its entry, or bytes trail the last one
            if pc.any(pc.greater(end, ends)).as_py():
                return None
            end = end.cast(pa.int32())
            index += 1
            if pc.all(more).as_py():
                cursor = end
            else:
                active, cursor, ends, left = (pc.filter(a, more)
                                              for a in (active, end, ends, left))
        position, entry_pos, batch_index = (pa.concat_arrays([f[k] for f in found])
                                            for k in range(3))
        if len(found) > 1:  # passes ran batch index-major; positions ascend in row order
            order = pc.sort_indices(position)
            position, entry_pos, batch_index = (pc.take(a, order)
                                                for a in (position, entry_pos, batch_index))
        return position, entry_pos, batch_index

    def _locate_by_walk(self, counts: pa.Array
                        ) -> tuple[pa.Array, pa.Array, pa.Array] | None:
        """As :meth:`_locate_by_passes` for entries holding many messages each:
        one Python step per message that records only where its header is."""
        lengths = _MESSAGE_LENGTHS.unpack_from
        buffer = self._raw
        positions: array.array[int] = array.array("i")
        entry_pos: array.array[int] = array.array("i")
        batch_index: array.array[int] = array.array("i")
        append, header = positions.append, MESSAGE_HEADER_BYTES
        # No bounds check per message: offsets only grow (by at least a
        # header), so a message that runs past its entry leaves the entry's
        # last offset past its end, which the check after the entry catches;
        # a header past the whole buffer makes unpack_from raise, and an
        # offset grown past int32 by garbage lengths makes append raise.
        try:
            for entry, (start, end, count) in enumerate(zip(
                    self.starts.to_pylist(), self.ends.to_pylist(), counts.to_pylist(),
                    strict=True)):
                offset = start + ENTRY_HEADER_BYTES
                for _ in range(count):
                    append(offset)
                    key_length, props_length, value_length = lengths(buffer, offset)
                    offset += header + props_length + value_length + (
                        key_length if key_length > 0 else 0)
                if offset != end:
                    return None
                entry_pos.extend([entry] * count)
                batch_index.extend(range(count))
        except (struct.error, OverflowError):
            return None
        return _int32(positions), _int32(entry_pos), _int32(batch_index)

    def properties(self, starts: pa.Array, lengths: pa.Array) -> pa.Array:
        """The properties column: empty maps unless some message has properties
        (then decoded one message at a time, as the row decoder does)."""
        n = len(starts)
        if not pc.any(pc.greater(lengths, _i32(0))).as_py():
            empty = pa.array([], pa.string())
            return pa.MapArray.from_arrays(pa.repeat(_i32(0), n + 1), empty, empty)
        view = memoryview(self._raw)
        items: list[list[tuple[str, str]]] = []
        for start, length in zip(starts.to_pylist(), lengths.to_pylist(), strict=True):
            items.append(list(decode_properties(view[start:start + length]).items())
                         if length else [])
        return properties_column(items)


def record_batch_of_entries(stream: str, partition: int, ledger_id: int, columns: EntryColumns,
                            *, first_batch: int = 0, last_entry_last_batch: int = -1,
                            publish_min_ms: int | None = None,
                            publish_max_ms: int | None = None) -> pa.RecordBatch | None:
    """The rows of the entries in ``columns`` as one Arrow batch, built by vector
    operations. ``first_batch`` drops the first entry's messages before that
    batch index, ``last_entry_last_batch`` (>= 0) the last entry's messages
    after it. None when an entry breaks the format (see ``EntryColumns.decode``)."""
    if not len(columns.starts):
        return pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)
    decoded = columns.decode()
    if decoded is None:
        return None
    rows = len(decoded["entry_pos"])
    publish_ms = decoded["publish_time_ms"]
    batch = pa.RecordBatch.from_arrays([
        pa.repeat(pa.scalar(stream, pa.string()), rows),
        pa.repeat(pa.scalar(partition, pa.int32()), rows),
        pa.repeat(pa.scalar(ledger_id, pa.int64()), rows),
        pc.add(decoded["entry_pos"].cast(pa.int64()),
               pa.scalar(columns.first_entry_id, pa.int64())),
        decoded["batch_index"],
        _timestamps(publish_ms),
        columns._slices(decoded["key_start"], decoded["key_length"], decoded["has_key"]),
        columns._slices(decoded["value_start"], decoded["value_length"], None),
        columns.properties(decoded["props_start"], decoded["props_length"]),
    ], schema=ARROW_SCHEMA)
    mask: pa.Array | None = None

    def narrow(condition: pa.Array) -> None:
        nonlocal mask
        mask = condition if mask is None else pc.and_(mask, condition)

    last_pos = len(columns.starts) - 1
    if first_batch > 0:
        narrow(pc.or_(pc.not_equal(decoded["entry_pos"], _i32(0)),
                      pc.greater_equal(decoded["batch_index"], _i32(first_batch))))
    if last_entry_last_batch >= 0:
        narrow(pc.or_(pc.not_equal(decoded["entry_pos"], _i32(last_pos)),
                      pc.less_equal(decoded["batch_index"], _i32(last_entry_last_batch))))
    if publish_min_ms is not None:
        narrow(pc.greater_equal(publish_ms, pa.scalar(publish_min_ms, pa.int64())))
    if publish_max_ms is not None:
        narrow(pc.less_equal(publish_ms, pa.scalar(publish_max_ms, pa.int64())))
    return batch if mask is None else batch.filter(mask)
