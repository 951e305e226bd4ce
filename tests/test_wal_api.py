"""The Wal API: round trips, segments and the CRC chain, overwrites, release,
snapshot markers, misuse, I/O failures and group commit (single process)."""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from quorumlog.errors import CorruptionError, LockedError, StorageError, UsageError
from quorumlog.wal import (
    SnapshotMarker,
    SnapshotMismatchError,
    SnapshotNotFoundError,
    Wal,
    WalConfig,
    WalEntry,
    inspect,
    valid_snapshot_markers,
    verify,
)
from quorumlog.wal._encoder import segment_header
from quorumlog.wal._format import SegmentDecoder, decode_seed, length_field

TINY = WalConfig(segment_size_bytes=1024)


def _entries(first: int, last: int, tag: bytes = b"e") -> list[WalEntry]:
    return [WalEntry(index=i, data=tag + b"%d" % i * (i % 7)) for i in range(first, last + 1)]


def _segments(path: Path) -> list[Path]:
    return sorted(path.glob("*.wal"))


def _read(path: Path, snapshot: SnapshotMarker | None = None,
          config: WalConfig = TINY) -> tuple[bytes, bytes | None, list[WalEntry]]:
    contents = Wal.open_read_only(path, snapshot=snapshot, config=config).read_all()
    return contents.metadata, contents.state, contents.entries


def test_round_trip_of_every_record_type(tmp_path: Path) -> None:
    with Wal.create(tmp_path, b"node=1,cluster=7") as wal:
        wal.save(b"hs-1", _entries(1, 5))
        wal.save_snapshot(SnapshotMarker(term=2, index=3))
        wal.save(b"hs-2", _entries(6, 8), sync=False)
        wal.sync()
    metadata, state, entries = _read(tmp_path)
    assert metadata == b"node=1,cluster=7"
    assert state == b"hs-2"
    assert entries == _entries(1, 8)
    assert valid_snapshot_markers(tmp_path) == [SnapshotMarker(term=0, index=0),
                                                SnapshotMarker(term=2, index=3)]
    report = inspect(tmp_path, records_limit=100)
    assert {r.type for r in report.records} == {"crc", "metadata", "snapshot", "entry", "state"}
    assert report.error is None
    assert Wal.exists(tmp_path)
    assert not Wal.exists(tmp_path / "nothing")


def test_created_wal_appends_at_once_and_reads_back_after_open(tmp_path: Path) -> None:
    wal = Wal.create(tmp_path, b"m", config=TINY)
    assert wal.read_all().entries == []
    wal.save(None, _entries(1, 3))
    wal.close()
    wal.close()  # idempotent
    wal = Wal.open(tmp_path, config=TINY)
    with pytest.raises(UsageError, match="read_all"):
        wal.save(None, _entries(4, 4))
    assert wal.read_all().entries == _entries(1, 3)
    with pytest.raises(UsageError, match="already called"):
        wal.read_all()
    wal.save(None, _entries(4, 4))
    assert wal.last_index == 4
    wal.close()
    with pytest.raises(UsageError, match="closed"):
        wal.save(None, _entries(5, 5))
    assert _read(tmp_path)[2] == _entries(1, 4)


def test_crc_chain_runs_across_at_least_three_segments(tmp_path: Path) -> None:
    with Wal.create(tmp_path, b"m", config=TINY) as wal:
        for first in range(1, 200, 9):
            wal.save(b"state-%d" % first, _entries(first, first + 8))
    segments = _segments(tmp_path)
    assert len(segments) >= 3
    previous_crc = None
    for path in segments:
        image = path.read_bytes()
        decoder = SegmentDecoder(image, TINY.record_size_max_bytes)
        records = list(decoder.records())
        assert decoder.problem is None
        seed = decode_seed(image, records[0][2], records[0][3])
        assert seed == (0 if previous_crc is None else previous_crc)
        previous_crc = decoder.crc
    assert _read(tmp_path)[2] == _entries(1, 207)
    assert segments[0].name == "0000000000000000-0000000000000000.wal"


def test_broken_crc_chain_between_segments_is_detected(tmp_path: Path) -> None:
    with Wal.create(tmp_path, b"m", config=TINY) as wal:
        for first in range(1, 150, 10):
            wal.save(None, _entries(first, first + 9))
    segments = _segments(tmp_path)
    second = segments[1]
    image = second.read_bytes()
    decoder = SegmentDecoder(image, TINY.record_size_max_bytes)
    records = list(decoder.records())
    seed = decode_seed(image, records[0][2], records[0][3])
    assert seed is not None
    header, _ = segment_header(seed ^ 1, b"m", None)  # self-consistent, but the wrong seed
    second.write_bytes(header + image[len(header):])
    with pytest.raises(CorruptionError, match="CRC chain broken") as info:
        _read(tmp_path)
    assert second.name in info.value.message
    assert "byte offset 0" in info.value.message


def test_metadata_mismatch_between_segments_is_detected(tmp_path: Path) -> None:
    with Wal.create(tmp_path, b"cluster-a", config=TINY) as wal:
        for first in range(1, 120, 10):
            wal.save(None, _entries(first, first + 9))
    last = _segments(tmp_path)[-1]
    image = last.read_bytes()
    decoder = SegmentDecoder(image, TINY.record_size_max_bytes)
    records = list(decoder.records())
    seed = decode_seed(image, records[0][2], records[0][3])
    assert seed is not None
    header, _ = segment_header(seed, b"cluster-b", None)  # valid CRCs, other metadata
    last.write_bytes(header + bytes(1024))
    with pytest.raises(CorruptionError, match="metadata differs") as info:
        _read(tmp_path)
    assert last.name in info.value.message
    with pytest.raises(CorruptionError, match="metadata differs"):
        Wal.open(tmp_path, config=TINY)


def test_later_entries_overwrite_a_suffix(tmp_path: Path) -> None:
    with Wal.create(tmp_path, b"m", config=TINY) as wal:
        for first in range(1, 60, 10):
            wal.save(None, _entries(first, first + 9))
        wal.save(None, _entries(40, 45, tag=b"new"))  # a new leader truncates 40..60
        wal.save(None, _entries(46, 47, tag=b"newer"))
    expected = _entries(1, 39) + _entries(40, 45, tag=b"new") + _entries(46, 47, tag=b"newer")
    assert _read(tmp_path)[2] == expected
    with Wal.open(tmp_path, config=TINY) as wal:
        assert wal.read_all().entries == expected
        assert wal.last_index == 47
        wal.save(None, _entries(48, 48))
    assert verify(tmp_path).last_index == 48


def test_release_to_drops_whole_segments_below_the_index(tmp_path: Path) -> None:
    wal = Wal.create(tmp_path, b"m", config=TINY)
    for first in range(1, 400, 10):
        wal.save(None, _entries(first, first + 9))
    names = [p.name for p in _segments(tmp_path)]
    first_indexes = [int(n[17:33], 16) for n in names]
    assert len(names) >= 5
    keep_from = max(i for i, first in enumerate(first_indexes) if first <= 200)
    wal.save_snapshot(SnapshotMarker(term=1, index=200))
    removed = wal.release_to(200)
    assert [p.name for p in removed] == names[:keep_from]
    assert [p.name for p in _segments(tmp_path)][: len(names) - keep_from] == names[keep_from:]
    assert wal.release_to(200) == []
    wal.save(None, _entries(401, 402))
    wal.close()
    _, _, entries = _read(tmp_path, snapshot=SnapshotMarker(term=1, index=200))
    assert entries == _entries(201, 402)
    _, _, everything = _read(tmp_path)
    assert everything[0].index == first_indexes[keep_from]  # starts at the first kept entry
    with Wal.open(tmp_path, config=TINY) as reopened:
        assert reopened.read_all().entries[-1].index == 402
        reopened.save(None, _entries(403, 403))


def test_release_to_keeps_the_tail(tmp_path: Path) -> None:
    with Wal.create(tmp_path, b"m", config=TINY) as wal:
        wal.save(None, _entries(1, 100))
        wal.release_to(10**9)
        assert len(_segments(tmp_path)) == 1
        wal.save(None, _entries(101, 101))
    assert _read(tmp_path)[2][-1].index == 101


def test_snapshot_markers_select_where_reading_starts(tmp_path: Path) -> None:
    marker = SnapshotMarker(term=3, index=50)
    with Wal.create(tmp_path, b"m", config=TINY) as wal:
        wal.save(b"hs", _entries(1, 80))
        wal.save_snapshot(marker)
        wal.save(None, _entries(81, 90))
    assert _read(tmp_path, snapshot=marker)[2] == _entries(51, 90)
    with pytest.raises(SnapshotMismatchError, match="another term"):
        _read(tmp_path, snapshot=SnapshotMarker(term=4, index=50))
    with pytest.raises(SnapshotNotFoundError, match="holds no snapshot marker"):
        _read(tmp_path, snapshot=SnapshotMarker(term=3, index=60))
    with Wal.open(tmp_path, snapshot=marker, config=TINY) as wal:
        assert wal.read_all().entries == _entries(51, 90)
        with pytest.raises(UsageError, match="at or below 50"):
            wal.save(None, _entries(50, 50))
        wal.save(None, _entries(51, 51, tag=b"rewrite"))
    assert _read(tmp_path, snapshot=marker)[2] == _entries(51, 51, tag=b"rewrite")


def test_snapshot_beyond_the_log_restarts_it(tmp_path: Path) -> None:
    installed = SnapshotMarker(term=5, index=100)
    with Wal.create(tmp_path, b"m", config=TINY) as wal:
        wal.save(None, _entries(1, 10))
        wal.save_snapshot(installed)  # a snapshot received from the leader
        with pytest.raises(UsageError, match="at or below 100"):
            wal.save(None, _entries(11, 11))
        wal.save(None, _entries(101, 103))
    assert _read(tmp_path, snapshot=installed)[2] == _entries(101, 103)
    assert _read(tmp_path)[2] == _entries(101, 103)
    with pytest.raises(SnapshotNotFoundError, match="newer than the requested snapshot"):
        _read(tmp_path, snapshot=SnapshotMarker(term=0, index=0))


def test_misuse_is_refused_and_leaves_the_wal_unchanged(tmp_path: Path) -> None:
    wal = Wal.create(tmp_path, b"m", config=TINY)
    wal.save(b"s1", _entries(1, 5))
    text: Any = "text"
    bad_calls: list[tuple[Callable[[], None], str]] = [
        (lambda: wal.save(None, _entries(7, 8)), "gap"),
        (lambda: wal.save(None, [WalEntry(index=6, data=b""), WalEntry(index=8, data=b"")]),
         "contiguous"),
        (lambda: wal.save(None, [WalEntry(index=6, data=text)]), "must be bytes"),
        (lambda: wal.save(text, []), "must be bytes"),
        (lambda: wal.save(None, [WalEntry(index=6, data=b"x" * (1 << 25))]), "limit"),
        (lambda: wal.save_snapshot(SnapshotMarker(term=-1, index=1)), "0..2"),
    ]
    for call, needle in bad_calls:
        with pytest.raises(UsageError, match=needle):
            call()
    assert wal.last_index == 5
    wal.save(b"s2", _entries(6, 6))
    wal.close()
    assert _read(tmp_path)[1:] == (b"s2", _entries(1, 6))
    with pytest.raises(UsageError, match="already holds a WAL"):
        Wal.create(tmp_path, b"m")
    reader = Wal.open_read_only(tmp_path)
    with pytest.raises(UsageError, match="read-only"):
        reader.save(None, _entries(7, 7))


def test_open_without_a_wal_is_a_storage_error(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="holds no WAL"):
        Wal.open(tmp_path)
    with pytest.raises(StorageError, match="holds no WAL"):
        Wal.open(tmp_path / "missing")
    with pytest.raises(StorageError, match="holds no WAL"):
        Wal.open_read_only(tmp_path)


def test_second_open_for_append_in_the_same_process_is_locked(tmp_path: Path) -> None:
    wal = Wal.create(tmp_path, b"m")
    with pytest.raises(LockedError, match=str(tmp_path)) as info:
        Wal.open(tmp_path)
    assert f"pid {os.getpid()}" in info.value.message
    assert Wal.open_read_only(tmp_path).read_all().metadata == b"m"  # readers take no lock
    wal.close()
    with Wal.open(tmp_path) as again:
        again.read_all()


def test_torn_tail_is_tolerated_read_only_and_repaired_for_append(tmp_path: Path) -> None:
    config = WalConfig(segment_size_bytes=8192)
    with Wal.create(tmp_path, b"m", config=config) as wal:
        wal.save(b"s", _entries(1, 20))
    last = _segments(tmp_path)[-1]
    data_end = inspect(tmp_path, config=config).segments[-1].data_bytes
    with last.open("r+b") as f:  # a 1.5 KiB write of which only the first sector landed
        f.seek(data_end)
        f.write(length_field(1500)[0].to_bytes(8, "little") + b"\x55" * 40)
    assert _read(tmp_path, config=config)[2] == _entries(1, 20)
    with pytest.raises(CorruptionError, match="torn write"):
        verify(tmp_path, config=config)
    with Wal.open(tmp_path, config=config) as wal:
        report = wal.repair_report
        assert report is not None
        assert report.offset == data_end
        assert report.bytes_cut == 48
        assert Path(report.broken_copy).read_bytes()[data_end:data_end + 8] != bytes(8)
        assert wal.read_all().entries == _entries(1, 20)
        wal.save(None, _entries(21, 30))
    assert verify(tmp_path, config=config).last_index == 30
    assert last.stat().st_size >= config.segment_size_bytes  # preallocated again


def test_garbage_after_the_end_of_data_is_cut_on_open(tmp_path: Path) -> None:
    with Wal.create(tmp_path, b"m", config=TINY) as wal:
        wal.save(None, _entries(1, 5))
    last = _segments(tmp_path)[-1]
    data_end = inspect(tmp_path, config=TINY).segments[-1].data_bytes
    with last.open("r+b") as f:  # a write whose first sector never landed
        f.seek(data_end + 16)
        f.write(b"\x77" * 16)
    assert _read(tmp_path)[2] == _entries(1, 5)
    with pytest.raises(CorruptionError, match="non-zero bytes after the data"):
        verify(tmp_path, config=TINY)
    with Wal.open(tmp_path, config=TINY) as wal:
        assert wal.repair_report is not None
        assert wal.repair_report.bytes_cut == 32
        wal.read_all()
        wal.save(None, _entries(6, 6))
    assert verify(tmp_path, config=TINY).last_index == 6


def test_damage_in_the_middle_names_file_and_offset(tmp_path: Path) -> None:
    with Wal.create(tmp_path, b"m", config=TINY) as wal:
        wal.save(None, _entries(1, 100))
    first = _segments(tmp_path)[0]
    record = inspect(tmp_path, records_limit=10).records[5]
    image = bytearray(first.read_bytes())
    image[record.offset + 20] ^= 0x10
    first.write_bytes(bytes(image))
    for opener in (Wal.open_read_only, Wal.open):
        with pytest.raises(CorruptionError) as info:
            opener(tmp_path)
        message = info.value.message
        assert str(first) in message
        assert f"byte offset {record.offset}" in message
        assert "quorumlog wal verify" in message


def test_a_zero_tail_in_a_non_last_segment_is_corruption(tmp_path: Path) -> None:
    with Wal.create(tmp_path, b"m", config=TINY) as wal:
        wal.save(None, _entries(1, 50))
        wal.save(None, _entries(51, 100))
    first = _segments(tmp_path)[0]
    with first.open("ab") as f:
        f.write(bytes(64))
    with pytest.raises(CorruptionError, match="data ends early"):
        _read(tmp_path)


def test_missing_segment_is_corruption(tmp_path: Path) -> None:
    with Wal.create(tmp_path, b"m", config=TINY) as wal:
        for first in range(1, 100, 10):
            wal.save(None, _entries(first, first + 9))
    _segments(tmp_path)[1].unlink()
    with pytest.raises(CorruptionError, match="segment is missing"):
        _read(tmp_path)


def test_leftover_temp_segment_is_removed_on_open(tmp_path: Path) -> None:
    with Wal.create(tmp_path, b"m") as wal:
        wal.save(None, _entries(1, 3))
    temp = tmp_path / "0000000000000001-0000000000000004.wal.tmp"
    temp.write_bytes(b"half a cut")
    with Wal.open(tmp_path) as wal:
        assert wal.read_all().entries == _entries(1, 3)
    assert not temp.exists()


def test_write_failure_fails_the_wal_until_reopened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wal = Wal.create(tmp_path, b"m")
    wal.save(None, _entries(1, 3))

    def full_disk(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full_disk)
    with pytest.raises(StorageError, match="No space left"):
        wal.save(None, _entries(4, 4))
    monkeypatch.undo()
    with pytest.raises(StorageError, match="refuses further writes"):
        wal.save(None, _entries(4, 4))
    with pytest.raises(StorageError, match="refuses further writes"):
        wal.close()
    with Wal.open(tmp_path) as reopened:
        assert reopened.read_all().entries == _entries(1, 3)
        reopened.save(None, _entries(4, 4))


def test_save_async_group_commits_concurrent_callers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wal = Wal.create(tmp_path, b"m", config=TINY)
    real_fdatasync = os.fdatasync
    syncs: list[int] = []

    def counting_fdatasync(fd: int) -> None:
        syncs.append(fd)
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", counting_fdatasync)
    callers = 64

    async def main() -> None:
        indexes = iter(range(1, callers * 4 + 1))

        async def caller() -> None:
            while (index := next(indexes, None)) is not None:
                await wal.save_async(b"s%d" % index, [WalEntry(index=index, data=b"v" * 40)])

        await asyncio.gather(*(caller() for _ in range(callers)))
        wal.save(None, [WalEntry(index=callers * 4 + 1, data=b"sync path")])
        await wal.save_async(None, [WalEntry(index=callers * 4 + 2, data=b"after")])

    asyncio.run(main())
    wal.close()
    assert len(syncs) < callers * 4  # many saves shared one fdatasync
    entries = _read(tmp_path)[2]
    assert [e.index for e in entries] == list(range(1, callers * 4 + 3))


def test_save_async_reports_usage_errors_at_once(tmp_path: Path) -> None:
    wal = Wal.create(tmp_path, b"m")

    async def main() -> None:
        await wal.save_async(None, _entries(1, 2))
        with pytest.raises(UsageError, match="gap"):
            await wal.save_async(None, _entries(5, 5))
        await wal.save_async(None, _entries(3, 3), sync=False)

    asyncio.run(main())
    wal.close()
    assert _read(tmp_path)[2] == _entries(1, 3)


def test_large_entries_are_written_as_pieces_with_pwritev(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_pwritev = os.pwritev
    vectors: list[int] = []

    def counting_pwritev(fd: int, buffers: list[bytes], offset: int) -> int:
        vectors.append(len(buffers))
        return real_pwritev(fd, buffers, offset)

    monkeypatch.setattr(os, "pwritev", counting_pwritev)
    big = [WalEntry(index=i, data=bytes([i % 251]) * 8192) for i in range(1, 301)]
    with Wal.create(tmp_path, b"m") as wal:
        wal.save(b"s", big)  # 300 entries x 4 pieces: more than one IOV_MAX vector
    assert len(vectors) >= 2 and max(vectors) <= 1024
    assert _read(tmp_path)[2] == big


def test_short_writes_are_finished(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_pwrite = os.pwrite

    def half_pwrite(fd: int, data: bytes, offset: int) -> int:
        return real_pwrite(fd, bytes(data[: max(1, len(data) // 2)]), offset)

    def first_buffer_only(fd: int, buffers: list[bytes], offset: int) -> int:
        return real_pwrite(fd, buffers[0], offset)

    wal = Wal.create(tmp_path, b"m", config=TINY)
    monkeypatch.setattr(os, "pwrite", half_pwrite)
    monkeypatch.setattr(os, "pwritev", first_buffer_only)
    wal.save(b"s", _entries(1, 50))
    wal.save(None, [WalEntry(index=51, data=b"L" * 9000), WalEntry(index=52, data=b"M" * 9000)])
    monkeypatch.undo()
    wal.close()
    entries = _read(tmp_path)[2]
    assert entries[:50] == _entries(1, 50)
    assert [e.data[:1] for e in entries[50:]] == [b"L", b"M"]
    assert verify(tmp_path, config=TINY).last_index == 52
