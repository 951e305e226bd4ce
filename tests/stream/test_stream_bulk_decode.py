"""A reader's bulk decode of entry batches (one C pass a batch) against the
per-entry decoder it replaced: the same messages, positions, batch sizes,
keys, properties and filters, and the same error for a broken entry."""

from __future__ import annotations

import random

import pytest

from quorumlog.ledger import EntryBatch, LedgerEntry
from quorumlog.stream import MessageFormatError, OutgoingMessage, encode_entry
from quorumlog.stream._layout import LedgerInfo
from quorumlog.stream._position import SeqPosition
from quorumlog.stream._reader import decode_batch_messages, decode_messages

INFO = LedgerInfo(seq=4, ledger_id=31)


def _entries(seed: int, count: int, first: int) -> list[LedgerEntry]:
    rng = random.Random(seed)
    entries = []
    for k in range(count):
        messages = [OutgoingMessage(
            rng.randbytes(rng.randrange(60)),
            key=None if rng.random() < 0.3 else rng.randbytes(rng.randrange(5)),
            properties={"n": str(k), "m": "x"} if rng.random() < 0.2 else None,
            publish_time_ms=1000 + 10 * k + j)
            for j in range(rng.choice([1, 1, 2, 7]))]
        entries.append(LedgerEntry(INFO.ledger_id, first + k, encode_entry(messages)))
    return entries


@pytest.mark.parametrize("seed", range(40))
def test_bulk_decode_equals_the_entry_decoder(seed: int) -> None:
    rng = random.Random(seed)
    first = rng.randrange(3)
    entries = _entries(seed, rng.randrange(1, 30), first)
    cut = rng.randrange(len(entries) + 1)
    batches = [EntryBatch.of_entries(INFO.ledger_id, part)
               for part in (entries[:cut], entries[cut:]) if part]
    start = None
    if rng.random() < 0.5:
        entry = first + rng.randrange(len(entries))
        start = SeqPosition(INFO.seq, entry, rng.randrange(3), INFO.ledger_id)
    skip = rng.choice([0, 0, 1000 + 10 * rng.randrange(len(entries))])
    expected = decode_messages("s", 2, INFO, entries, start=start, skip_before_ms=skip)
    got = decode_batch_messages("s", 2, INFO, batches, start=start, skip_before_ms=skip)
    assert got == expected
    assert all(isinstance(m.value, bytes) and (m.key is None or isinstance(m.key, bytes))
               for m in got)


def test_a_broken_entry_gets_the_entry_decoders_error() -> None:
    entries = _entries(7, 5, 0)
    broken = bytearray(entries[3].payload)
    broken += b"trailing"
    entries[3] = LedgerEntry(INFO.ledger_id, 3, bytes(broken))
    batch = EntryBatch.of_entries(INFO.ledger_id, entries)
    with pytest.raises(MessageFormatError) as expected:
        decode_messages("s", 2, INFO, entries, start=None, skip_before_ms=0)
    with pytest.raises(MessageFormatError) as got:
        decode_batch_messages("s", 2, INFO, [batch], start=None, skip_before_ms=0)
    assert str(got.value) == str(expected.value)
