"""Batch reads from the entry logs (issue 17): one index lookup and one pread
per run of frames lying back to back, every frame still checked."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from bookie_helpers import Opener, fill, payload

from quorumlog.bookie import EntryLogCorruptionError, LedgerStorage
from quorumlog.bookie._format import Location
from quorumlog.proto import NoSuchEntryError, NoSuchLedgerError


def location_of(storage: LedgerStorage, ledger_id: int, entry_id: int) -> Location:
    (location,) = [loc for lid, eid, loc in storage._index.all_locations()
                   if (lid, eid) == (ledger_id, entry_id)]
    return location


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0xFF]))


def corrupt_entry(open_storage: Opener, storage: LedgerStorage, ledger_id: int,
                  entry_id: int, byte: int) -> tuple[LedgerStorage, Location, Path]:
    """Flip byte ``byte`` of the entry's frame on disk (negative: from its end)
    and reopen the storage (no cache holds it)."""
    location = location_of(storage, ledger_id, entry_id)
    storage.close()
    path = storage._logs.path(location.log_id)
    at = location.offset + (byte if byte >= 0 else location.frame_bytes + byte)
    flip_byte(path, at)
    return open_storage(), location, path


def test_a_flushed_run_is_one_index_lookup_and_one_read(open_storage: Opener) -> None:
    storage = open_storage()
    fill(storage, 1, 300)
    storage.flush()
    lookups: list[tuple[int, int]] = []
    get_location = storage._index.get_location

    def counted(ledger_id: int, entry_id: int) -> Location | None:
        lookups.append((ledger_id, entry_id))
        return get_location(ledger_id, entry_id)

    storage._index.get_location = counted  # type: ignore[method-assign]
    assert storage.read_batch(1, 10, 256, 1 << 20) == [payload(1, e) for e in range(10, 266)]
    assert lookups == [(1, 10)]
    assert (storage.stats.entry_log_reads, storage.stats.batch_log_entries) == (1, 256)
    assert storage.stats.read_cache_hits == 0  # nothing went through the read cache


def test_runs_continue_across_flushes_ledgers_and_the_write_cache(open_storage: Opener) -> None:
    storage = open_storage()
    for first in (0, 10, 20):  # two ledgers interleaved: three stretches per ledger
        fill(storage, 1, 10, first=first)
        fill(storage, 2, 10, first=first)
        storage.flush()
    fill(storage, 1, 5, first=30)  # still in the write cache
    assert storage.read_batch(1, 3, 100, 1 << 20) == [payload(1, e) for e in range(3, 35)]
    assert storage.read_batch(2, 0, 100, 1 << 20) == [payload(2, e) for e in range(30)]
    with pytest.raises(NoSuchEntryError):
        storage.read_batch(2, 30, 5, 1 << 20)
    with pytest.raises(NoSuchLedgerError):
        storage.read_batch(3, 0, 5, 1 << 20)


def test_bounds_hold_on_the_log_path(open_storage: Opener) -> None:
    storage = open_storage()
    fill(storage, 1, 50)
    fill(storage, 1, 5, size=1000, first=50)
    storage.flush()
    assert storage.read_batch(1, 0, 7, 1 << 20) == [payload(1, e) for e in range(7)]
    assert len(storage.read_batch(1, 0, 100, 350)) == 3  # by bytes
    assert storage.read_batch(1, 50, 10, 10) == [payload(1, 50, 1000)]  # the first always
    assert len(storage.read_batch(1, 48, 10, 2200)) == 4  # 100 + 100 + 1000 + 1000 bytes
    assert len(storage.read_batch(1, 48, 10, 2199)) == 3
    assert len(storage.read_batch(1, 40, 100, 1 << 20)) == 15  # stops at the last entry


def test_a_corrupt_frame_ends_the_run_and_is_reported_when_read(open_storage: Opener) -> None:
    storage = open_storage()
    fill(storage, 1, 20)
    storage.flush()
    storage, location, path = corrupt_entry(open_storage, storage, 1, 12, -1)  # a data byte
    # The run stops before the damaged entry and never returns its bytes ...
    assert storage.read_batch(1, 5, 100, 1 << 20) == [payload(1, e) for e in range(5, 12)]
    # ... and a batch read starting at it raises, naming the file and offset.
    with pytest.raises(EntryLogCorruptionError) as caught:
        storage.read_batch(1, 12, 100, 1 << 20)
    assert caught.value.path == path and caught.value.offset == location.offset
    assert storage.read_batch(1, 13, 100, 1 << 20) == [payload(1, e) for e in range(13, 20)]


def test_a_frame_with_a_damaged_id_is_not_taken(open_storage: Opener) -> None:
    storage = open_storage()
    fill(storage, 1, 20)
    storage.flush()
    # Byte 19 is the low byte of the frame's entry id (length u32, ledger u64, entry u64).
    storage, _, _ = corrupt_entry(open_storage, storage, 1, 8, 19)
    assert storage.read_batch(1, 0, 100, 1 << 20) == [payload(1, e) for e in range(8)]
    with pytest.raises(EntryLogCorruptionError):
        storage.read_batch(1, 8, 1, 1 << 20)


def test_a_deleted_ledger_is_not_read_from_its_logs(open_storage: Opener) -> None:
    storage = open_storage()
    fill(storage, 1, 10)
    storage.flush()
    assert storage.delete_ledger(1)
    with pytest.raises(NoSuchLedgerError):
        storage.read_batch(1, 0, 10, 1 << 20)
