"""Unit tests of the pure parts: frames, keys, caches, ledger table, config."""

from __future__ import annotations

import pytest
from bookie_helpers import small_config

from quorumlog.bookie import LedgerStorageConfig
from quorumlog.bookie._caches import ReadCache, SequentialReads, WriteCache
from quorumlog.bookie._format import (
    FrameIncomplete,
    FrameInvalid,
    check_log_header,
    decode_frame,
    encode_frame_header,
    encode_log_header,
    entry_key,
    log_file_name,
    parse_log_file_name,
)
from quorumlog.bookie._ledgers import LedgerRecord, LedgerTable, decode_record, encode_record
from quorumlog.errors import ConfigError, InvariantViolation
from quorumlog.proto import LedgerFencedError, NoSuchLedgerError, UnauthorizedError


def frame(ledger_id: int, entry_id: int, data: bytes) -> bytes:
    return encode_frame_header(ledger_id, entry_id, data) + data


def test_frame_round_trip_and_every_flipped_byte_is_caught() -> None:
    raw = frame(7, 42, b"hello world")
    decoded = decode_frame(raw, 0, 1024)
    assert (decoded.ledger_id, decoded.entry_id, decoded.data) == (7, 42, b"hello world")
    assert decoded.frame_bytes == len(raw)
    for position in range(len(raw)):
        damaged = bytearray(raw)
        damaged[position] ^= 0x01
        with pytest.raises((FrameInvalid, FrameIncomplete)):
            decode_frame(bytes(damaged), 0, 1024)


def test_frame_incomplete_and_oversize_length() -> None:
    raw = frame(1, 2, b"x" * 50)
    with pytest.raises(FrameIncomplete):
        decode_frame(raw[:-1], 0, 1024)
    with pytest.raises(FrameIncomplete):
        decode_frame(raw[:10], 0, 1024)
    with pytest.raises(FrameInvalid, match="over entry_max_bytes"):
        decode_frame(raw, 0, 49)


def test_log_header_checks_magic_crc_and_id() -> None:
    header = encode_log_header(0x1F)
    assert check_log_header(header, 0x1F) is None
    assert "names log" in (check_log_header(header, 0x20) or "")
    damaged = b"X" + header[1:]
    assert "crc32c" in (check_log_header(damaged, 0x1F) or "")


def test_keys_sort_by_ledger_then_entry() -> None:
    pairs = [(2, 0), (1, 300), (1, 2), (10, 1), (1, 1 << 40)]
    assert sorted(pairs) == sorted(pairs, key=lambda p: entry_key(*p))
    assert parse_log_file_name(log_file_name(0xABC)) == 0xABC
    assert parse_log_file_name("index") is None
    assert parse_log_file_name("zz.log") is None


def test_write_cache_halves_swap_and_bound() -> None:
    cache = WriteCache(half_bytes=100)
    cache.put(1, 0, b"a" * 60)
    assert not cache.has_room(41)
    frozen = cache.swap()
    assert frozen == {(1, 0): b"a" * 60}
    assert cache.has_room(100)
    cache.put(1, 1, b"b" * 100)
    assert cache.get(1, 0) == b"a" * 60  # frozen half still readable
    assert cache.get(1, 1) == b"b" * 100
    with pytest.raises(InvariantViolation):
        cache.swap()  # the frozen half was not released
    cache.release_frozen()
    assert cache.get(1, 0) is None
    with pytest.raises(InvariantViolation):
        cache.put(1, 1, b"dup")


def test_read_cache_ring_drops_oldest_segment() -> None:
    cache = ReadCache(max_bytes=300, segment_count=3)  # 100-byte segments
    for entry_id in range(8):  # two per segment: the 7th wraps and drops the first
        cache.put(1, entry_id, bytes(50))
    assert cache.get(1, 0) is None and cache.get(1, 1) is None
    assert all(cache.get(1, e) is not None for e in range(2, 8))
    cache.put(1, 99, bytes(101))  # larger than a segment: not cached
    assert cache.get(1, 99) is None
    cache.drop_ledger(1)
    assert cache.size_bytes == 0


def test_read_cache_run_stops_at_a_miss_the_last_entry_or_the_byte_bound() -> None:
    cache = ReadCache(max_bytes=4096, segment_count=2)
    for entry in (0, 1, 2, 4):
        cache.put(7, entry, bytes([entry]) * 100)
    assert cache.get_run(7, 0, 10, 10_000) == [bytes([e]) * 100 for e in (0, 1, 2)]  # miss at 3
    assert cache.get_run(7, 1, 1, 10_000) == [b"\x01" * 100]  # last entry
    assert cache.get_run(7, 0, 10, 250) == [b"\x00" * 100, b"\x01" * 100]  # byte bound
    assert cache.get_run(8, 0, 10, 10_000) == []
    for entry in range(5, 31):  # 2,048-byte segments: entries 21.. go to the second one
        cache.put(7, entry, b"x" * 100)
    assert cache.get(7, 30) is not None and cache.get(7, 4) is not None
    assert cache.get_run(7, 4, 30, 100_000) == [bytes([4]) * 100] + [b"x" * 100] * 26
    assert ReadCache(max_bytes=0, segment_count=1).get_run(7, 0, 1, 100) == []


def test_sequential_reads_tracker_is_bounded() -> None:
    tracker = SequentialReads(tracked_ledgers_max=2)
    tracker.note(1, 5)
    assert tracker.is_next(1, 6) and not tracker.is_next(1, 7)
    tracker.note(2, 0)
    tracker.note(3, 0)
    assert not tracker.is_next(1, 6)  # ledger 1 was evicted


def test_ledger_table_rules_leave_state_unchanged_on_refusal() -> None:
    table = LedgerTable({})
    table.check_add(5, b"key", recovery=False)
    table.note_add(5, 3, piggyback_lac=2)
    with pytest.raises(UnauthorizedError):
        table.check_add(5, b"other", recovery=False)
    assert table.get(5) == LedgerRecord(master_key=b"key", last_entry_id=3, piggyback_lac=2)
    assert table.fence(5) == 2
    with pytest.raises(LedgerFencedError):
        table.check_add(5, b"key", recovery=False)
    table.check_add(5, b"key", recovery=True)
    table.mark_deleted(5)
    with pytest.raises(NoSuchLedgerError):
        table.get_live(5)
    records, deletes = table.take_snapshot()
    assert deletes == {5} and records[5].deleted
    table.forget_deleted(deletes)
    assert table.get(5) is None


def test_ledger_record_encoding_round_trips() -> None:
    record = LedgerRecord(master_key=b"k", fenced=True, explicit_lac=4, last_entry_id=9)
    assert decode_record(encode_record(record)) == record


@pytest.mark.parametrize(
    "changes",
    [
        {"write_cache_max_bytes": 0},
        {"entry_max_bytes": 300 * 1024},  # over half of the 512 KiB write cache
        {"entry_log_max_bytes": 16 * 1024},  # cannot hold one 32 KiB entry
        {"disk_usage_lwm_fraction": 0.99},  # above the threshold
        {"compaction_read_bytes": 1024},
        {"add_max_wait_ms": -1},
    ],
)
def test_config_rejects_bad_bounds(changes: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        small_config(**changes)


def test_default_config_is_valid() -> None:
    LedgerStorageConfig().validate()
