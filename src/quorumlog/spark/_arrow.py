"""Arrow record batches from stream entries, and messages from Arrow rows.

Reading yields Arrow batches rather than Python tuples: Spark's Python data
source moves Arrow batches without converting each row (the issue measured
about 3x the rate of tuples).
"""

from __future__ import annotations

import array
import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import quorumlog_native

from quorumlog.errors import UsageError, invariant
from quorumlog.stream import (
    BATCH_MESSAGES_MAX,
    ENTRY_PREFIX_WORD,
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

ARROW_BUFFER_BYTES_MAX = 2**31 - 1  # int32 Arrow offsets address the joined chunk
_I32 = pa.int32()


def _i32(value: int) -> pa.Scalar:
    """A typed scalar: an untyped Python int makes compute kernels widen to int64."""
    return pa.scalar(value, _I32)


def _timestamps(publish_ms: pa.Array) -> pa.Array:
    """Publish times (ms, int64) as the UTC microsecond timestamps of the schema.
    Every compute argument is an Arrow value: a bare Python int makes pyarrow
    look for numpy on each call (an import attempt that costs ~1 ms here)."""
    return pc.multiply(publish_ms, pa.scalar(1000, pa.int64())).cast(
        pa.timestamp("us", tz="UTC"))


def _int64_buffer(values: pa.Array) -> pa.Buffer:
    """The bytes of an int64 array's values (its slice of the data buffer)."""
    data = values.buffers()[1]
    return data.slice(8 * values.offset, 8 * len(values))


class EntryColumns:
    """Stream entries held in one buffer (payload ``i`` at ``starts[i]:ends[i]``,
    entry ids ``first_entry_id + i``) decoded into Arrow columns in one C pass
    (``quorumlog_native.stream_columns``: every length checked against its
    entry, keys and values copied into the columns' data buffers). Python
    touches messages only for messages with properties."""

    def __init__(self, buffer: bytes | memoryview, starts: pa.Array, ends: pa.Array,
                 first_entry_id: int) -> None:
        invariant(len(buffer) <= ARROW_BUFFER_BYTES_MAX,
                  "an entry chunk is addressed with int32 Arrow offsets")
        self._raw = buffer
        self.starts = starts.cast(pa.int64())
        self.ends = ends.cast(pa.int64())
        self.first_entry_id = first_entry_id

    def decode(self) -> dict[str, pa.Array] | None:
        """Columns entry_pos, batch_index, publish_time_ms, key, value and
        properties per message in (entry, batch index) order; None when any
        entry breaks the format (the caller then decodes entry by entry for
        the precise error)."""
        out = quorumlog_native.stream_columns(
            self._raw, _int64_buffer(self.starts), _int64_buffer(self.ends), ENTRY_PREFIX_WORD,
            BATCH_MESSAGES_MAX)
        if out is None:
            return None
        (rows, entry_pos, batch_index, publish, key_valid, key_offsets, key_data, value_offsets,
         value_data, props_start, props_length, props_any) = out
        buffer = pa.py_buffer
        props_lengths = pa.Array.from_buffers(_I32, rows, [None, buffer(props_length)])
        return {
            "entry_pos": pa.Array.from_buffers(_I32, rows, [None, buffer(entry_pos)]),
            "batch_index": pa.Array.from_buffers(_I32, rows, [None, buffer(batch_index)]),
            "publish_time_ms": pa.Array.from_buffers(pa.int64(), rows, [None, buffer(publish)]),
            "key": pa.Array.from_buffers(pa.binary(), rows, [
                buffer(key_valid), buffer(key_offsets), buffer(key_data)]),
            "value": pa.Array.from_buffers(pa.binary(), rows, [
                None, buffer(value_offsets), buffer(value_data)]),
            "properties": self.properties(
                pa.Array.from_buffers(_I32, rows, [None, buffer(props_start)]), props_lengths,
                any_set=props_any),
        }

    def properties(self, starts: pa.Array, lengths: pa.Array, *, any_set: bool) -> pa.Array:
        """The properties column: empty maps unless some message has properties
        (then decoded one message at a time, as the row decoder does)."""
        n = len(starts)
        if not any_set:
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
        decoded["key"],
        decoded["value"],
        decoded["properties"],
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
