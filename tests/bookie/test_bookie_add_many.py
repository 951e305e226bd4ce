"""The bulk path of a batch of adds: the one-pass envelope check
(``crc32c_add_lacs``), ``LedgerStorage.add_many`` (one check of the ledger,
one write cache update), the rule ``add_entries`` on the real storage and on
the in-memory reference, and ``Journal.append_many``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from bookie_helpers import KEY, small_config
from test_journal import open_journal, record

from quorumlog import rpc
from quorumlog.bookie import LedgerStorage, MemoryLedgerStore, add_entries
from quorumlog.bookie._journal import unpack_entry
from quorumlog.proto import (
    BadEnvelopeError,
    DigestMismatchError,
    DigestType,
    EntryTooLargeError,
    LedgerFencedError,
    UnauthorizedError,
    WriteCacheFullError,
    crc32c_add_lacs,
    encode_entry,
    mac_key,
    parse_envelope,
)
from quorumlog.wal import Wal

KIB = 1024


def envelope(ledger_id: int, entry_id: int, lac: int = -1, size: int = 100,
             digest: DigestType = DigestType.CRC32C) -> bytes:
    key = mac_key(b"pw") if digest is DigestType.HMAC_SHA256 else b""
    return encode_entry(ledger_id, entry_id, lac, bytes([entry_id % 251]) * size,
                        digest=digest, key=key)


def triples(ledger_id: int, first: int, count: int, size: int = 100) -> list[
        tuple[int, bytes, int]]:
    return [(e, envelope(ledger_id, e, e - 1, size), e - 1) for e in range(first, first + count)]


def flip(data: bytes, position: int) -> bytes:
    return data[:position] + bytes([data[position] ^ 1]) + data[position + 1:]


# ------------------------------------------------------------------ envelope check


def test_the_one_pass_check_agrees_with_parse_envelope() -> None:
    good = [(e, envelope(7, e, e - 1)) for e in range(5)]
    assert crc32c_add_lacs(good, 7) == [parse_envelope(d).lac for _, d in good]
    bad = [
        (0, flip(envelope(7, 0), 40)),                    # payload bit flip: CRC
        (1, flip(envelope(7, 1), 30)),                    # stored CRC flipped
        (2, envelope(7, 3)),                              # holds another entry
        (3, envelope(8, 3)),                              # another ledger
        (4, envelope(7, 4)[:20]),                         # shorter than a header
        (5, envelope(7, 5)[:-1]),                         # length disagrees
        (6, envelope(7, 6, digest=DigestType.HMAC_SHA256)),  # not CRC32C: parsed apart
        (7, envelope(7, 7, lac=5)),                       # fine
    ]
    assert crc32c_add_lacs(bad, 7) == [None] * 7 + [5]


# ------------------------------------------------------------------ storage.add_many


def test_add_many_stores_a_batch_and_keeps_the_largest_lac(tmp_path: Path) -> None:
    with LedgerStorage(tmp_path, small_config()) as storage:
        batch = triples(3, 0, 50)
        assert storage.add_many(3, batch, master_key=KEY) == {}
        assert storage.last_entry_id(3) == 49
        assert storage.last_add_confirmed(3) == 48
        assert [storage.get_entry(3, e) for e in range(50)] == [d for _, d, _ in batch]
        storage.flush()
        assert [storage.get_entry(3, e) for e in range(50)] == [d for _, d, _ in batch]
        assert storage.stats.adds == 50


def test_add_many_keeps_the_first_copy_of_duplicates(tmp_path: Path) -> None:
    with LedgerStorage(tmp_path, small_config()) as storage:
        first = triples(3, 0, 10)
        storage.add_many(3, first, master_key=KEY)
        storage.flush()  # duplicates found in the index as well as the write cache
        storage.add_many(3, triples(3, 10, 5), master_key=KEY)
        again = [(e, envelope(3, e, 40), 40) for e in range(5, 20)]
        assert storage.add_many(3, again, master_key=KEY) == {}
        assert storage.get_entry(3, 7) == first[7][1]
        assert storage.get_entry(3, 12) == triples(3, 12, 1)[0][1]
        assert storage.get_entry(3, 17) == again[12][1]
        assert storage.last_add_confirmed(3) == 40  # a duplicate's LAC still counts


def test_add_many_checks_the_ledger_once_and_stores_nothing_on_refusal(
        tmp_path: Path) -> None:
    with LedgerStorage(tmp_path, small_config()) as storage:
        storage.add_many(3, triples(3, 0, 4), master_key=KEY)
        with pytest.raises(UnauthorizedError):
            storage.add_many(3, triples(3, 4, 4), master_key=b"another-key")
        storage.set_fenced(3)
        with pytest.raises(LedgerFencedError):
            storage.add_many(3, triples(3, 4, 4), master_key=KEY)
        assert storage.last_entry_id(3) == 3
        assert storage.add_many(3, triples(3, 4, 4), master_key=KEY, recovery=True) == {}
        assert storage.last_entry_id(3) == 7


def test_add_many_fails_only_the_entries_the_write_cache_has_no_room_for(
        tmp_path: Path) -> None:
    config = small_config(write_cache_max_bytes=64 * KIB, entry_max_bytes=8 * KIB)
    with LedgerStorage(tmp_path, config) as storage:  # halves of 32 KiB, no waiting
        batch = triples(3, 0, 6, size=7 * KIB)
        failed = storage.add_many(3, batch, master_key=KEY)
        assert sorted(failed) == [4, 5]
        assert all(isinstance(e, WriteCacheFullError) for e in failed.values())
        assert storage.last_entry_id(3) == 3
        assert storage.get_entry(3, 3) == batch[3][1]


# ------------------------------------------------------------------ the rule


@pytest.mark.parametrize("keyed", [False, True])
def test_add_entries_gives_the_same_answers_on_storage_and_in_memory(
        tmp_path: Path, keyed: bool) -> None:
    entries = [(e, envelope(5, e, e - 1)) for e in range(8)]
    entries[2] = (2, flip(entries[2][1], 50))
    entries[4] = (4, envelope(5, 9))
    entries[5] = (5, envelope(5, 5, size=40 * KIB))
    entries[6] = (6, envelope(5, 6, digest=DigestType.HMAC_SHA256))
    memory = MemoryLedgerStore()
    with LedgerStorage(tmp_path, small_config()) as storage:
        if keyed:
            storage.set_master_key(5, KEY)
            memory.set_master_key(5, KEY)
        results = [add_entries(store, 5, entries, KEY, recovery=False,
                               entry_max_bytes=32 * KIB, keyed=keyed)
                   for store in (storage, memory)]
        kinds = [[type(e) if e else None for e in r.errors] for r in results]
        assert kinds[0] == kinds[1] == [None, None, DigestMismatchError, None,
                                        BadEnvelopeError, EntryTooLargeError, None, None]
        assert results[0].write == results[1].write
        records = results[0].write.records
        accepted = [entries[i][1] for i in (0, 1, 3, 6, 7)]
        assert list(records[-5:]) == accepted
        assert len(records) == 5 if keyed else 6  # a new ledger's key record first
        assert [storage.get_entry(5, e) for e in (0, 1, 3, 6, 7)] == accepted

        storage.set_fenced(5)
        fenced = add_entries(storage, 5, [(8, envelope(5, 8))], KEY, recovery=False,
                             entry_max_bytes=32 * KIB, keyed=True)
        assert isinstance(fenced.errors[0], LedgerFencedError)
        assert fenced.write.records == () and not fenced.write.answer_when_durable


# ------------------------------------------------------------------ journal.append_many


def test_append_many_keeps_order_with_single_records_and_splits_large_batches(
        tmp_path: Path) -> None:
    journal = open_journal(tmp_path / "j", max_batch_bytes=16 * KIB)
    expected: list[bytes] = []

    async def main() -> None:
        journal.start(asyncio.get_running_loop())
        futures = []
        number = 0
        for round_ in range(30):
            count = 30 if round_ % 5 else 200  # 200 records of 100 B: over one group
            batch = [record(number + i) for i in range(count)]
            number += len(batch)
            expected.extend(batch)
            futures.append(journal.append_many(batch, sync=round_ % 3 != 0))
            expected.append(record(number))
            futures.append(journal.append(record(number)))
            number += 1
        await asyncio.gather(*futures)
        assert journal.synced_index == journal.last_index
        assert journal.appended_records == len(expected)

    rpc.run(main())
    journal.close()
    entries = Wal.open_read_only(tmp_path / "j").read_all().entries
    assert [r for e in entries for r in unpack_entry(e.data)] == expected


# ------------------------------------------------------------------ flush in bulk


def test_a_flush_writes_frames_sorted_by_ledger_then_entry_across_log_rolls(
        tmp_path: Path) -> None:
    big = (1 << 63) - 1  # the largest ledger id: the sort key's high bits
    ledgers = [big, 2, 1 << 40, 1]
    with LedgerStorage(tmp_path, small_config()) as storage:
        for first in range(0, 300, 30):  # interleaved batches, as a busy bookie sees them
            for ledger_id in ledgers:
                storage.add_many(ledger_id, triples(ledger_id, first, 30), master_key=KEY)
        storage.delete_ledger(2)
        result = storage.flush()
        assert result.entries == 900
        locations = list(storage._index.all_locations())
        assert len(locations) == 900
        order = [(location.log_id, location.offset) for _, _, location in locations]
        assert order == sorted(order)  # index order (ledger, entry) is write order
        assert len({location.log_id for _, _, location in locations}) > 1  # logs rolled
    with LedgerStorage(tmp_path, small_config()) as storage:  # from the entry logs
        for ledger_id in (big, 1 << 40, 1):
            assert storage.get_entry(ledger_id, 299) == triples(ledger_id, 299, 1)[0][1]
        assert not storage.ledger_exists(2)
