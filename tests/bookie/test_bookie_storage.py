"""The ledger storage end to end: real RocksDB, real files, small bounds."""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pytest
from bookie_helpers import KEY, DiskProbe, Opener, fill, payload

from quorumlog.bookie import EntryLogCorruptionError, LedgerStorage
from quorumlog.bookie._format import Location
from quorumlog.errors import LockedError, UsageError
from quorumlog.proto import (
    EntryTooLargeError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    ReadOnlyError,
    UnauthorizedError,
    WriteCacheFullError,
)

DEADLINE_S = 10.0


def wait_until(condition: object, what: str) -> None:
    """Poll a condition with a deadline (never a fixed sleep)."""
    deadline = time.monotonic() + DEADLINE_S
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.001)


def locations(storage: LedgerStorage) -> list[tuple[int, int, Location]]:
    return list(storage._index.all_locations())


def test_reads_come_from_each_layer_in_turn(open_storage: Opener) -> None:
    storage = open_storage()
    fill(storage, 1, 5)
    assert storage.get_entry(1, 3) == payload(1, 3)
    assert storage.stats.write_cache_hits == 1
    storage.flush(b"cp")
    assert storage.get_entry(1, 3) == payload(1, 3)
    assert (storage.stats.entry_log_reads, storage.stats.read_cache_hits) == (1, 0)
    assert storage.get_entry(1, 3) == payload(1, 3)
    assert (storage.stats.entry_log_reads, storage.stats.read_cache_hits) == (1, 1)
    with pytest.raises(NoSuchEntryError):
        storage.get_entry(1, 5)
    with pytest.raises(NoSuchLedgerError):
        storage.get_entry(2, 0)


def test_flush_writes_sorted_entries_and_one_index_batch(open_storage: Opener) -> None:
    storage = open_storage()
    keys = [(ledger, entry) for ledger in (3, 1, 2) for entry in range(20)]
    random.Random(7).shuffle(keys)
    for ledger, entry in keys:
        storage.add(ledger, entry, payload(ledger, entry), master_key=KEY)
    assert storage.last_checkpoint() is None
    result = storage.flush(b"journal@42")
    assert (result.entries, result.data_bytes) == (60, 6000)
    indexed = locations(storage)
    assert [(lid, eid) for lid, eid, _ in indexed] == sorted(keys)
    offsets = [loc.offset for _, _, loc in indexed]
    assert offsets == sorted(offsets) and len({loc.log_id for _, _, loc in indexed}) == 1
    assert all(loc.frame_bytes == 124 for _, _, loc in indexed)
    assert storage.last_checkpoint() == b"journal@42"
    ((_, (total, live)),) = storage.entry_log_usage().items()
    assert total == live == 60 * 124
    assert storage.write_cache_bytes == 0


def test_entry_logs_roll_at_their_size_limit(open_storage: Opener) -> None:
    storage = open_storage()
    for first in (0, 20):  # 400 KiB over 128 KiB logs, in two flushes
        fill(storage, 1, 20, size=10 * 1024, first=first)
        storage.flush()
    usage = storage.entry_log_usage()
    assert len(usage) >= 4
    for log_id, (total, _) in usage.items():
        assert storage._logs.file_size(log_id) <= 128 * 1024
        assert total > 0
    assert storage.read_batch(1, 0, 100, 1 << 30) == [payload(1, e, 10 * 1024) for e in range(40)]


def test_restart_recovers_flushed_entries_only(open_storage: Opener) -> None:
    storage = open_storage()
    fill(storage, 1, 10)
    storage.set_fenced(1)
    storage.flush(b"cp-1")
    fill(storage, 2, 5)  # never flushed: lost with the process, replayed from the journal
    storage.close(flush=False)
    storage = open_storage()
    assert storage.last_checkpoint() == b"cp-1"
    assert [storage.get_entry(1, e) for e in range(10)] == [payload(1, e) for e in range(10)]
    assert storage.last_entry_id(1) == 9 and storage.is_fenced(1)
    assert not storage.ledger_exists(2)
    # journal replay after the checkpoint re-adds: idempotent for what is there
    assert storage.add(1, 9, payload(1, 9), master_key=KEY, recovery=True) is False
    assert storage.add(2, 0, payload(2, 0), master_key=KEY) is True
    assert storage.stats.add_duplicates == 1
    assert storage.verify().entries_checked == 10


def test_close_with_flush_keeps_the_write_cache(open_storage: Opener) -> None:
    storage = open_storage()
    fill(storage, 1, 3)
    storage.close()
    with pytest.raises(UsageError, match="closed"):
        storage.get_entry(1, 0)
    storage = open_storage()
    assert storage.get_entry(1, 2) == payload(1, 2)


def test_master_key_mismatch_is_refused_and_changes_nothing(open_storage: Opener) -> None:
    storage = open_storage()
    storage.add(4, 0, b"a", master_key=b"right")
    with pytest.raises(UnauthorizedError, match="master key"):
        storage.add(4, 1, b"b", master_key=b"wrong")
    with pytest.raises(UnauthorizedError):
        storage.set_master_key(4, b"wrong")
    assert storage.last_entry_id(4) == 0
    with pytest.raises(NoSuchEntryError):
        storage.get_entry(4, 1)
    storage.close()
    storage = open_storage()
    with pytest.raises(UnauthorizedError):
        storage.add(4, 1, b"b", master_key=b"wrong")
    assert storage.add(4, 1, b"b", master_key=b"right")


def test_fencing_and_last_add_confirmed(open_storage: Opener) -> None:
    storage = open_storage()
    for entry_id in range(5):
        storage.add(9, entry_id, b"x", master_key=KEY, piggyback_lac=entry_id - 1)
    storage.add(9, 1, b"x", master_key=KEY, piggyback_lac=0)  # duplicate, older LAC
    assert storage.last_add_confirmed(9) == 3
    storage.set_explicit_lac(9, 2)
    assert storage.last_add_confirmed(9) == 3
    assert not storage.is_fenced(9)
    assert storage.set_fenced(9) == 3
    assert storage.set_fenced(9) == 3  # idempotent
    with pytest.raises(LedgerFencedError):
        storage.add(9, 5, b"x", master_key=KEY)
    assert storage.add(9, 5, b"x", master_key=KEY, recovery=True)
    storage.set_explicit_lac(9, 5)
    storage.flush()
    storage.close()
    storage = open_storage()
    info = storage.ledger_info(9)
    assert (info.fenced, info.explicit_lac, info.piggyback_lac) == (True, 5, 3)
    assert (info.last_add_confirmed, info.last_entry_id) == (5, 5)


def test_read_batch_by_count_and_bytes(open_storage: Opener) -> None:
    storage = open_storage()
    fill(storage, 1, 10)
    storage.flush()
    fill(storage, 1, 10, first=10)  # half flushed, half in the write cache
    assert storage.read_batch(1, 5, 10, 1 << 20) == [payload(1, e) for e in range(5, 15)]
    assert len(storage.read_batch(1, 0, 100, 350)) == 3
    assert storage.read_batch(1, 19, 1, 10) == [payload(1, 19)]  # at least one
    assert len(storage.read_batch(1, 15, 100, 1 << 20)) == 5  # stops at the last entry
    with pytest.raises(NoSuchEntryError):
        storage.read_batch(1, 20, 5, 1 << 20)
    with pytest.raises(UsageError):
        storage.read_batch(1, 0, 0, 100)


def test_sequential_reads_trigger_read_ahead(open_storage: Opener) -> None:
    storage = open_storage()
    fill(storage, 1, 30)
    fill(storage, 2, 30)
    storage.flush()
    storage.get_entry(1, 0)
    assert storage.stats.read_ahead_batches == 0
    storage.get_entry(1, 1)  # the next one: read ahead
    stats = storage.stats
    assert (stats.entry_log_reads, stats.read_ahead_batches, stats.read_ahead_entries) == (2, 1, 9)
    for entry_id in range(2, 11):
        assert storage.get_entry(1, entry_id) == payload(1, entry_id)
    stats = storage.stats
    assert (stats.entry_log_reads, stats.read_cache_hits) == (2, 9)
    storage.get_entry(1, 11)  # next miss is sequential again
    assert storage.stats.read_ahead_batches == 2
    for entry_id in (29, 5, 17):  # random reads of ledger 2: no read-ahead
        storage.get_entry(2, entry_id)
    assert storage.stats.read_ahead_batches == 2


def test_read_ahead_stops_at_the_ledger_end(open_storage: Opener) -> None:
    storage = open_storage()
    fill(storage, 1, 4)
    fill(storage, 2, 4)
    storage.flush()
    storage.get_entry(1, 0)
    storage.get_entry(1, 1)
    assert storage.stats.read_ahead_entries == 2  # entries 2 and 3, not ledger 2


def _spread_over_logs(storage: LedgerStorage) -> None:
    """Ledgers 1, 2, 3 interleaved over many flushes, so every log holds all three."""
    for round_ in range(6):
        for ledger_id in (1, 2, 3):
            fill(storage, ledger_id, 8, size=2000, first=round_ * 8)
        storage.flush()


def _check_usage_matches_index(storage: LedgerStorage) -> None:
    live: dict[int, int] = {}
    for _, _, loc in locations(storage):
        live[loc.log_id] = live.get(loc.log_id, 0) + loc.frame_bytes
    usage = storage.entry_log_usage()
    assert {log_id: live.get(log_id, 0) for log_id in usage} == {
        log_id: live_bytes for log_id, (_, live_bytes) in usage.items()}


def test_delete_and_compaction_reclaim_logs_and_keep_live_entries(open_storage: Opener) -> None:
    storage = open_storage()
    _spread_over_logs(storage)
    assert storage.delete_ledger(1) and not storage.delete_ledger(1)
    with pytest.raises(NoSuchLedgerError):
        storage.get_entry(1, 0)
    with pytest.raises(NoSuchLedgerError):
        storage.add(1, 99, b"x", master_key=KEY)
    logs_before = set(storage.entry_log_usage())
    assert storage.flush().deleted_ledgers == 1
    assert 1 not in storage.ledger_ids()
    _check_usage_matches_index(storage)
    result = storage.compact(0.8)
    assert result.compacted_logs and result.reclaimed_bytes > 0
    assert storage.stats.compacted_logs == len(result.compacted_logs)
    assert storage.stats.reclaimed_bytes == result.reclaimed_bytes
    for log_id in result.compacted_logs:
        assert log_id in logs_before and not storage._logs.path(log_id).exists()
    _check_usage_matches_index(storage)
    for ledger_id in (2, 3):
        assert storage.read_batch(ledger_id, 0, 100, 1 << 30) == [
            payload(ledger_id, e, 2000) for e in range(48)]
    assert storage.verify().ok
    storage.close()
    storage = open_storage()
    assert storage.read_batch(2, 0, 100, 1 << 30) == [payload(2, e, 2000) for e in range(48)]
    assert not storage.ledger_exists(1)


def test_compaction_respects_a_delete_that_lands_meanwhile(open_storage: Opener) -> None:
    storage = open_storage()
    _spread_over_logs(storage)
    storage.delete_ledger(1)
    storage.flush()
    deleted_meanwhile: list[bool] = []

    def delete_ledger_2_once() -> None:
        if not deleted_meanwhile:
            deleted_meanwhile.append(storage.delete_ledger(2))
            storage.flush()  # removes ledger 2 from the index while copies are pending

    storage._compactor.before_index_update = delete_ledger_2_once
    result = storage.compact(0.8)
    assert deleted_meanwhile == [True] and result.compacted_logs
    assert all(lid != 2 for lid, _, _ in locations(storage))  # the copies were not indexed
    _check_usage_matches_index(storage)
    assert storage.read_batch(3, 0, 100, 1 << 30) == [payload(3, e, 2000) for e in range(48)]
    assert storage.verify().ok


def test_compaction_skips_the_current_log_and_dense_logs(open_storage: Opener) -> None:
    storage = open_storage()
    fill(storage, 1, 10)
    storage.flush()
    assert storage.compact(1.0).compacted_logs == []  # the only log is the current one
    storage.close()
    storage = open_storage()  # a reopened storage writes to a new log
    fill(storage, 2, 10)
    storage.flush()
    assert storage.compact(0.5).compacted_logs == []  # log 0 is all live
    storage.delete_ledger(1)
    storage.flush()
    assert storage.compact(0.5).compacted_logs == [0]
    assert storage.get_entry(2, 9) == payload(2, 9)


def test_corrupt_byte_is_reported_with_file_and_offset(open_storage: Opener) -> None:
    storage = open_storage()
    fill(storage, 1, 10)
    storage.flush()
    (location,) = [loc for lid, eid, loc in locations(storage) if (lid, eid) == (1, 4)]
    storage.close()
    path = storage._logs.path(location.log_id)
    with open(path, "r+b") as fh:
        fh.seek(location.offset + location.frame_bytes - 1)
        last = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([last[0] ^ 0xFF]))
    storage = open_storage()
    with pytest.raises(EntryLogCorruptionError) as caught:
        storage.get_entry(1, 4)
    assert caught.value.path == path and caught.value.offset == location.offset
    assert str(path) in caught.value.message and f"offset {location.offset}" in caught.value.message
    assert not caught.value.retriable
    assert storage.get_entry(1, 5) == payload(1, 5)
    report = storage.verify()
    assert (report.entries_checked, report.error_count) == (9, 1)
    assert "crc32c mismatch" in report.errors[0]
    assert storage.get_entry(1, 3) == payload(1, 3)
    with pytest.raises(EntryLogCorruptionError):  # a read-ahead starting at it fails too
        storage.get_entry(1, 4)


def test_read_only_over_disk_threshold_and_back(open_storage: Opener, probe: DiskProbe) -> None:
    storage = open_storage()
    fill(storage, 1, 3)
    probe.usage = 0.97
    assert storage.check_disk_usage() == 0.97 and storage.read_only
    with pytest.raises(ReadOnlyError) as caught:
        storage.add(1, 3, b"x", master_key=KEY)
    assert caught.value.retriable
    assert storage.get_entry(1, 2) == payload(1, 2)  # reads are served
    storage.flush()  # and the write cache still reaches disk
    assert storage.get_entry(1, 1) == payload(1, 1)
    modes = []
    for usage in (0.92, 0.85):  # between the low-water mark and the threshold, then below
        probe.usage = usage
        storage.check_disk_usage()
        modes.append(storage.read_only)
    assert modes == [True, False]
    assert storage.add(1, 3, b"x", master_key=KEY)
    assert storage.stats.add_rejected_read_only == 1


def test_disk_usage_is_measured_on_the_ledger_directory(tmp_path: Path) -> None:
    with LedgerStorage(tmp_path / "d") as storage:
        assert 0.0 < storage.disk_usage() < 1.0


def test_write_cache_is_bounded_and_adds_wait_for_a_flush(open_storage: Opener) -> None:
    storage = open_storage(add_max_wait_ms=20, write_cache_max_bytes=128 * 1024)
    half = 64 * 1024
    fill(storage, 1, half // 1024, size=1024)  # the active half is full
    assert storage.needs_flush
    storage._logs._append_lock.acquire()  # hold the flush after its swap
    flusher = threading.Thread(target=storage.flush)
    try:
        flusher.start()
        wait_until(lambda: storage.stats.adds and not storage.needs_flush, "the swap")
        fill(storage, 1, half // 1024, size=1024, first=64)  # the other half fills too
        with pytest.raises(WriteCacheFullError) as caught:
            storage.add(1, 128, b"y" * 1024, master_key=KEY)
        assert caught.value.retriable
        assert storage.get_entry(1, 0) == payload(1, 0, 1024)  # frozen half is readable
    finally:
        storage._logs._append_lock.release()
        flusher.join()
    assert storage.stats.add_rejected_write_cache_full == 1
    outcome: list[object] = []
    waiter = threading.Thread(target=lambda: outcome.append(
        storage.add(1, 128, b"y" * 1024, master_key=KEY)))
    # the same storage, now with a long wait, so the add surely outlives the flush below
    storage._config = storage._config.replace(add_max_wait_ms=10_000)
    waiter.start()
    wait_until(lambda: storage.stats.add_waits >= 2, "the add to wait")
    storage.flush()  # swaps: room for the waiting add
    waiter.join()
    assert outcome == [True] and storage.get_entry(1, 128) == b"y" * 1024


def test_bad_input_is_refused(open_storage: Opener) -> None:
    storage = open_storage()
    with pytest.raises(EntryTooLargeError):
        storage.add(1, 0, bytes(32 * 1024 + 1), master_key=KEY)
    with pytest.raises(UsageError):
        storage.add(-1, 0, b"x", master_key=KEY)
    with pytest.raises(UsageError):
        storage.get_entry(1, 1 << 63)
    with pytest.raises(UsageError):
        storage.add(1, 0, b"x", master_key=bytes(1000))
    with pytest.raises(UsageError):
        storage.flush(bytes(2000))
    with pytest.raises(UsageError):
        storage.compact(1.5)
    assert storage.ledger_ids() == []


def test_a_second_open_of_the_directory_is_locked(open_storage: Opener) -> None:
    open_storage()
    with pytest.raises(LockedError):
        open_storage()


def test_recovery_truncates_uncommitted_tails_and_drops_unknown_logs(
    open_storage: Opener,
) -> None:
    storage = open_storage()
    fill(storage, 1, 10)
    storage.flush()
    storage.close(flush=False)
    directory = storage.directory
    log0 = directory / "0.log"
    committed = log0.stat().st_size
    with open(log0, "ab") as fh:  # a flush appended, then crashed before its index batch
        fh.write(b"torn frame bytes" * 10)
    (directory / "7.log").write_bytes(b"a log never indexed")
    storage = open_storage()
    assert log0.stat().st_size == committed
    assert not (directory / "7.log").exists()
    assert storage.read_batch(1, 0, 100, 1 << 20) == [payload(1, e) for e in range(10)]
    fill(storage, 1, 5, first=10)
    storage.flush()
    assert storage.verify().entries_checked == 15
    assert (directory / "8.log").exists()  # new ids continue past every id seen


def test_ledger_ids_and_info(open_storage: Opener) -> None:
    storage = open_storage()
    storage.set_master_key(5, KEY)
    fill(storage, 3, 2)
    assert storage.ledger_ids() == [3, 5]
    assert storage.last_entry_id(5) == -1
    assert storage.ledger_info(3).last_entry_id == 1
    with pytest.raises(NoSuchLedgerError):
        storage.ledger_info(4)


def test_adds_and_reads_run_while_flushes_and_compactions_do(open_storage: Opener) -> None:
    storage = open_storage(add_max_wait_ms=10_000)
    stop = threading.Event()
    failures: list[BaseException] = []

    def background(work: object) -> threading.Thread:
        def loop() -> None:
            try:
                while not stop.wait(0.001):  # paces the loop; nothing waits for state
                    work()  # type: ignore[operator]
            except BaseException as exc:  # reported to the main thread
                failures.append(exc)
        thread = threading.Thread(target=loop)
        thread.start()
        return thread

    threads = [background(storage.flush), background(lambda: storage.compact(0.7))]
    rng = random.Random(3)
    next_entry: dict[int, int] = {}
    try:
        for step in range(3000):
            ledger_id = rng.randrange(1, 6) + 10 * (step // 1000)  # new ledgers over time
            entry_id = next_entry.get(ledger_id, 0)
            storage.add(ledger_id, entry_id, payload(ledger_id, entry_id, 500), master_key=KEY)
            next_entry[ledger_id] = entry_id + 1
            for probe_entry in (rng.randrange(next_entry[ledger_id]), 0):
                assert storage.get_entry(ledger_id, probe_entry) == payload(
                    ledger_id, probe_entry, 500)
            if step % 1000 == 999:  # drop the odd ledgers of this generation
                for old in [lid for lid in next_entry if lid % 2 and lid > 10 * (step // 1000)]:
                    storage.delete_ledger(old)
                    del next_entry[old]
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert not failures, failures
    storage.flush()
    storage.compact(0.7)
    for ledger_id, count in next_entry.items():
        assert storage.read_batch(ledger_id, 0, count, 1 << 30) == [
            payload(ledger_id, e, 500) for e in range(count)]
    assert storage.verify().ok
    _check_usage_matches_index(storage)
    stats = storage.stats
    assert stats.flushes > 1 and stats.entry_log_reads > 0 and stats.compacted_logs > 0
