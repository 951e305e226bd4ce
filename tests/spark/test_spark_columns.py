"""The Spark reader's columnar decode of entry buffers against the row decoder.

No Spark session: ``record_batch_of_entries`` builds Arrow batches from one
buffer plus payload bounds by vector operations; every case must give exactly
the rows that ``decode_entry_columns`` + ``record_batch`` (the per-entry path)
give, and refuse (None) what the row decoder refuses.
"""

from __future__ import annotations

import array
import random

import pyarrow as pa
import pytest

from quorumlog.ledger import EntryBatch, LedgerEntry
from quorumlog.spark._arrow import EntryColumns, record_batch, record_batch_of_entries
from quorumlog.spark._source import entry_columns
from quorumlog.stream import (
    ENTRY_HEADER_BYTES,
    ColumnSink,
    MessageFormatError,
    OutgoingMessage,
    decode_entry_columns,
    encode_entry,
)


def _rows_by_rows(payloads: list[bytes], first_entry: int, first_batch: int = 0,
                  last_batch: int = -1, **publish: int) -> pa.RecordBatch:
    sink = ColumnSink()
    for k, payload in enumerate(payloads):
        decode_entry_columns(payload, sink, first_entry + k,
                             first_batch if k == 0 else 0,
                             last_batch if k == len(payloads) - 1 else -1)
    return record_batch("s", 1, 9, sink, publish_min_ms=publish.get("low"),
                        publish_max_ms=publish.get("high"))


def _columnar(payloads: list[bytes], first_entry: int, first_batch: int = 0,
              last_batch: int = -1, *, pad: bytes = b"", **publish: int) -> pa.RecordBatch | None:
    """Entries laid out with ``pad`` between payloads (as envelope headers are)."""
    buffer, starts, ends = bytearray(), array.array("q"), array.array("q")
    for payload in payloads:
        buffer += pad
        starts.append(len(buffer))
        buffer += payload
        ends.append(len(buffer))
    columns = EntryColumns(bytes(buffer), pa.array(starts, pa.int64()),
                           pa.array(ends, pa.int64()), first_entry)
    return record_batch_of_entries("s", 1, 9, columns, first_batch=first_batch,
                                   last_entry_last_batch=last_batch,
                                   publish_min_ms=publish.get("low"),
                                   publish_max_ms=publish.get("high"))


def _message(rng: random.Random, i: int, *, props: bool) -> OutgoingMessage:
    key = None if i % 3 == 0 else b"k%d" % i * rng.randrange(0, 4)
    value = b"" if i % 4 == 0 else bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
    properties = {"p": str(i)} if props and i % 5 == 0 else None
    return OutgoingMessage(value, key=key, properties=properties, publish_time_ms=1000 + i)


@pytest.mark.parametrize("props", [False, True])
@pytest.mark.parametrize("batch_max", [1, 7])
def test_columnar_rows_equal_the_row_decoder(props: bool, batch_max: int) -> None:
    rng = random.Random(17)
    payloads, i = [], 0
    for _ in range(40):
        size = rng.randrange(1, batch_max + 1)
        payloads.append(encode_entry([_message(rng, i + k, props=props) for k in range(size)]))
        i += size
    for pad in (b"", b"\xff" * 33):
        for first_batch, last_batch in ((0, -1), (1, 0), (2, 3)):
            expected = _rows_by_rows(payloads, 100, first_batch, last_batch)
            got = _columnar(payloads, 100, first_batch, last_batch, pad=pad)
            assert got is not None
            assert got.to_pylist() == expected.to_pylist()
            assert got.schema == expected.schema
    window = {"low": 1010, "high": 1030}
    assert (_columnar(payloads, 0, **window).to_pylist()  # type: ignore[union-attr]
            == _rows_by_rows(payloads, 0, **window).to_pylist())


def test_boundary_cases() -> None:
    one = [encode_entry([OutgoingMessage(b"v", key=b"k", publish_time_ms=5)])]
    assert _columnar(one, 3).to_pylist() == _rows_by_rows(one, 3).to_pylist()  # type: ignore[union-attr]
    empty_values = [encode_entry([OutgoingMessage(b"")]) for _ in range(5)]
    got = _columnar(empty_values, 0)
    assert got is not None and got.column("value").to_pylist() == [b""] * 5
    assert got.column("key").null_count == 5
    assert _columnar([], 0).num_rows == 0  # type: ignore[union-attr]


def test_broken_entries_are_refused_and_the_row_decoder_names_them() -> None:
    good = encode_entry([OutgoingMessage(b"value", key=b"key")])
    batched = encode_entry([OutgoingMessage(b"a"), OutgoingMessage(b"bc")])
    broken = {
        "not a stream entry": b"XX" + good[2:],
        "short": good[:5],
        "value runs past the end": good[:-1],
        "trailing bytes": good + b"!",
        "second message cut": batched[:-1],
        "zero messages": good[:4] + b"\x00\x00\x00\x00" + good[8:],
        # The walk over batched entries (no bounds check per message): a header
        # past the end of the buffer, and a value length that sends the next
        # offset past int32.
        "one message more than it holds": batched[:4] + b"\x03\x00\x00\x00" + batched[8:],
        "value length past int32": (batched[:ENTRY_HEADER_BYTES + 16] + b"\xff\xff\xff\x7f"
                                    + batched[ENTRY_HEADER_BYTES + 20:]),
    }
    for name, payload in broken.items():
        assert _columnar([good, payload], 0) is None, name
        with pytest.raises(MessageFormatError):
            _rows_by_rows([good, payload], 0)


def test_entry_batches_join_into_one_chunk() -> None:
    """The reader joins a chunk's EntryBatch values (one per bookie answer)."""
    payloads = [encode_entry([OutgoingMessage(b"v%d" % i)]) for i in range(10)]
    batches = [EntryBatch.of_entries(4, [LedgerEntry(4, 20 + i, payloads[i]) for i in part])
               for part in (range(0, 3), range(3, 4), range(4, 10))]
    columns = entry_columns(batches)
    got = record_batch_of_entries("s", 1, 9, columns)
    assert got is not None
    assert got.to_pylist() == _rows_by_rows(payloads, 20).to_pylist()


def test_task_chunk_trims_batches_and_names_a_broken_entry() -> None:
    """_decode_chunk: the task's first/end batch trim the chunk's first and
    last entries only when they are the task's; a broken entry raises
    MessageFormatError from the row decoder (no silent row loss)."""
    from quorumlog.spark._plan import ReadTask
    from quorumlog.spark._source import _decode_chunk

    payloads = [encode_entry([OutgoingMessage(b"%d.%d" % (e, b)) for b in range(4)])
                for e in range(6)]
    batch = EntryBatch.of_entries(9, [LedgerEntry(9, 10 + k, p) for k, p in enumerate(payloads)])
    task = ReadTask("s", 1, 0, 9, first_entry=10, last_entry=15, first_batch=2, end_batch=1)
    rows = _decode_chunk(task, [batch])
    assert rows.column("value").to_pylist()[:3] == [b"0.2", b"0.3", b"1.0"]
    assert rows.column("value").to_pylist()[-2:] == [b"4.3", b"5.0"]
    assert rows.num_rows == 2 + 4 * 4 + 1
    later = ReadTask("s", 1, 0, 9, first_entry=8, last_entry=20, first_batch=2, end_batch=1)
    assert _decode_chunk(later, [batch]).num_rows == 24  # neither end is the task's
    broken = EntryBatch.of_entries(9, [LedgerEntry(9, 10, payloads[0]),
                                       LedgerEntry(9, 11, payloads[1][:-1])])
    with pytest.raises(MessageFormatError):
        _decode_chunk(task, [broken])
