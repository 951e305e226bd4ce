"""The bookie journal: group commit, adaptive waiting, deferred sync, repair, release."""

from __future__ import annotations

import asyncio
import errno
import os
import time
from pathlib import Path

import pytest

from quorumlog import rpc
from quorumlog.bookie import Journal
from quorumlog.bookie._journal import (
    DeleteRecord,
    FenceRecord,
    KeyRecord,
    LacRecord,
    decode_position,
    decode_record,
    encode_control,
    encode_position,
    unpack_entry,
)
from quorumlog.bookie._maintenance import watch_journal
from quorumlog.errors import CorruptionError, StorageError
from quorumlog.wal import Wal

KIB = 1024


def open_journal(directory: Path, *, max_wait_us: int = 0, max_batch_bytes: int = 1 << 20,
                 segment_size_bytes: int = 64 * KIB) -> Journal:
    return Journal.open(directory, max_wait_us=max_wait_us, max_batch_bytes=max_batch_bytes,
                        queue_max_bytes=8 << 20, segment_size_bytes=segment_size_bytes)


def record(i: int, size: int = 100) -> bytes:
    return i.to_bytes(8, "big") + bytes([i % 251]) * (size - 8)


def test_group_commit_shares_fsyncs_and_keeps_order(tmp_path: Path) -> None:
    journal = open_journal(tmp_path / "j")
    batches: list[tuple[int, int]] = []
    journal._on_batch = lambda n, b: batches.append((n, b))

    async def main() -> None:
        journal.start(asyncio.get_running_loop())
        futures = [journal.append(record(i)) for i in range(2000)]
        futures.append(journal.append(record(2000, 20_000)))  # large: a WAL entry alone
        futures += [journal.append(record(i)) for i in range(2001, 2100)]
        await asyncio.gather(*futures)
        assert journal.synced_index == journal.last_index
        assert journal.appended_records == journal.records_written == 2100
        assert not journal.unsynced

    rpc.run(main())
    journal.close()
    assert journal.fsyncs < 2100 / 10, f"{journal.fsyncs} fsyncs for 2100 records"
    assert sum(n for n, _ in batches) == 2100
    entries = Wal.open_read_only(tmp_path / "j").read_all().entries
    assert [e.index for e in entries] == list(range(1, len(entries) + 1))
    assert len(entries) == journal.last_index < 2100  # small records share WAL entries
    records = [r for e in entries for r in unpack_entry(e.data)]
    assert records[2000] == record(2000, 20_000)
    assert records == [record(i, 20_000 if i == 2000 else 100) for i in range(2100)]


def test_a_record_on_an_idle_journal_is_written_at_once(tmp_path: Path) -> None:
    # A huge max wait: a lone record must still go out immediately (adaptive).
    journal = open_journal(tmp_path / "j", max_wait_us=5_000_000)

    async def main() -> float:
        journal.start(asyncio.get_running_loop())
        await journal.append(record(0))  # warm up
        start = time.monotonic()
        await journal.append(record(1))
        return time.monotonic() - start

    elapsed = rpc.run(main())
    journal.close()
    assert elapsed < 1.0, f"an idle journal held a record for {elapsed:.3f} s"


def test_batches_stay_under_max_batch_bytes(tmp_path: Path) -> None:
    journal = open_journal(tmp_path / "j", max_batch_bytes=4 * KIB, max_wait_us=2_000)
    sizes: list[int] = []
    journal._on_batch = lambda n, b: sizes.append(b)

    async def main() -> None:
        journal.start(asyncio.get_running_loop())
        await asyncio.gather(*(journal.append(record(i, 1000)) for i in range(200)))

    rpc.run(main())
    journal.close()
    assert max(sizes) <= 4 * KIB + 1000
    assert sum(sizes) == 200 * 1000


def test_busy_journal_waits_at_most_max_wait_for_companions(tmp_path: Path) -> None:
    """Under load the writer collects records for up to max_wait_us, never longer."""
    journal = open_journal(tmp_path / "j", max_wait_us=20_000, max_batch_bytes=1 << 20)

    async def main() -> list[float]:
        journal.start(asyncio.get_running_loop())
        latencies: list[float] = []

        async def one(i: int) -> None:
            start = time.monotonic()
            await journal.append(record(i))
            latencies.append(time.monotonic() - start)

        tasks = []
        for i in range(300):  # a steady trickle keeps records queued
            tasks.append(asyncio.ensure_future(one(i)))
            if i % 10 == 0:
                await asyncio.sleep(0.001)
        await asyncio.gather(*tasks)
        return latencies

    latencies = rpc.run(main())
    journal.close()
    # Each record waits for at most one write in progress, plus max_wait, plus its own.
    assert max(latencies) < 2.0
    assert journal.batches < 300


def test_no_sync_records_answer_without_fsync_and_force_syncs(tmp_path: Path) -> None:
    journal = open_journal(tmp_path / "j")

    async def main() -> None:
        journal.start(asyncio.get_running_loop())
        await asyncio.gather(*(journal.append(record(i), sync=False) for i in range(50)))
        assert journal.fsyncs == 0 and journal.unsynced
        assert journal.synced_index == 0 < journal.last_index
        await journal.force()
        assert journal.fsyncs == 1 and journal.synced_index == journal.last_index
        assert not journal.unsynced
        await journal.force()  # nothing new: no fsync
        assert journal.fsyncs == 1
        before = journal.last_index
        journal.append_quiet(record(51))
        position = await journal.sync_position()
        assert position == journal.synced_index == journal.last_index > before

    rpc.run(main())
    journal.close()


def test_torn_tail_is_repaired_and_other_damage_refuses_to_open(tmp_path: Path) -> None:
    directory = tmp_path / "j"
    journal = open_journal(directory)

    async def write(j: Journal, first: int, count: int) -> None:
        j.start(asyncio.get_running_loop())
        await asyncio.gather(*(j.append(record(i, 300)) for i in range(first, first + count)))

    rpc.run(write(journal, 0, 20))
    journal.close()
    segment = sorted(directory.glob("*.wal"))[-1]
    end = _data_end(segment)
    with segment.open("r+b") as fh:  # a torn write: a frame header, then zeros
        fh.seek(end)
        fh.write((600).to_bytes(8, "little") + b"\x12\x34\x56\x78\x02")
    journal = open_journal(directory)
    assert sum(len(unpack_entry(e.data)) for e in journal.take_replay()) == 20
    rpc.run(write(journal, 20, 5))
    journal.close()
    with segment.open("r+b") as fh:  # damage inside a synced record, not at the tail
        fh.seek(200)
        byte = fh.read(1)
        fh.seek(200)
        fh.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(CorruptionError, match="refuses to start"):
        open_journal(directory)


def _data_end(segment: Path) -> int:
    data = segment.read_bytes()
    end = len(data.rstrip(b"\x00"))
    return (end + 7) // 8 * 8


def test_release_to_removes_old_segments(tmp_path: Path) -> None:
    journal = open_journal(tmp_path / "j", segment_size_bytes=64 * KIB)

    async def main() -> None:
        journal.start(asyncio.get_running_loop())
        for first in range(0, 200, 10):  # one WAL entry per 10 records, ~20 KB
            await asyncio.gather(*(journal.append(record(i, 2000))
                                   for i in range(first, first + 10)))

    rpc.run(main())
    before = len(list((tmp_path / "j").glob("*.wal")))
    assert before >= 4
    last = journal.last_index
    removed = journal.release_to(last - 1)
    journal.close()
    assert 1 <= removed < before
    assert len(list((tmp_path / "j").glob("*.wal"))) == before - removed
    entries = Wal.open_read_only(tmp_path / "j").read_all().entries
    assert entries[0].index <= last - 1 and entries[-1].index == last


def test_control_records_and_positions_round_trip() -> None:
    for rec in (KeyRecord(1, b"k"), FenceRecord(2, b"k2"), LacRecord(3, 7), DeleteRecord(4)):
        assert decode_record(encode_control(rec)) == rec
    assert decode_record(b"\x00\x01") is None  # an envelope: ledger ids are < 2**63
    assert unpack_entry(b"\x00\x01") == [b"\x00\x01"]
    with pytest.raises(CorruptionError):
        unpack_entry(b"\x92\xc4")  # a truncated batch
    assert decode_position(encode_position(12345)) == 12345
    assert decode_position(None) == 0
    with pytest.raises(CorruptionError):
        decode_position(b"abc")
    with pytest.raises(CorruptionError):
        decode_record(b"\xff\x99garbage")


def test_a_wal_that_is_not_a_journal_is_refused(tmp_path: Path) -> None:
    Wal.create(tmp_path / "other", b"raft metadata").close()
    with pytest.raises(CorruptionError, match="not a bookie journal"):
        open_journal(tmp_path / "other")
    assert os.path.isdir(tmp_path / "other")


def test_damaged_journal_advice_names_what_exists_today(tmp_path: Path) -> None:
    """Finding 8 of issue 13: "wipe this bookie and let its ledgers be
    re-replicated" promised auto-recovery, which is not built; the advice names
    `quorumlog bookie format` and says the ledgers stay under-replicated."""
    directory = tmp_path / "journal"
    journal = open_journal(directory)

    async def write() -> None:
        journal.start(asyncio.get_running_loop())
        await asyncio.gather(*(journal.append(record(i, 300)) for i in range(20)))

    rpc.run(write())
    journal.close()
    segment = sorted(directory.glob("*.wal"))[-1]
    with segment.open("r+b") as fh:  # damage inside a synced record, not at the tail
        fh.seek(200)
        byte = fh.read(1)
        fh.seek(200)
        fh.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(CorruptionError) as caught:
        open_journal(directory)
    message = caught.value.message
    assert "quorumlog bookie format --force" in message and "--config" in message, message
    assert "Re-adding a wiped bookie" in message, message
    assert "under-replicated" in message and "not built" in message, message
    assert "let its ledgers be re-replicated" not in message, message
    assert "`quorumlog wal repair` cannot fix it" in message, message


def test_lost_journal_advice_names_what_exists_today(tmp_path: Path) -> None:
    """The storage was checkpointed but the journal is new (its files are gone):
    the refusal names `quorumlog bookie format` and does not promise that the
    ledgers will be re-replicated (auto-recovery is not built)."""
    from quorumlog.bookie import LedgerStorage
    from quorumlog.bookie._journal import encode_position
    from quorumlog.bookie._replay import replay

    with LedgerStorage(tmp_path / "ledgers") as storage:
        storage.flush(encode_position(40))
        journal = open_journal(tmp_path / "journal")  # created: the old one is gone
        try:
            with pytest.raises(CorruptionError) as caught:
                replay(journal, storage)
        finally:
            journal.close()
    message = caught.value.message
    assert "checkpointed at journal record 40" in message, message
    assert "quorumlog bookie format --force" in message, message
    assert "under-replicated" in message and "not built" in message, message
    assert "let its ledgers be re-replicated" not in message, message


def test_a_failed_fdatasync_fails_the_bookie_without_polling(tmp_path: Path) -> None:
    """The journal thread's failure wakes the bookie's watch at once (an event, no
    sleep loop): ``BookieService.failed`` fails with the journal's advice."""
    journal = open_journal(tmp_path / "j")

    def broken_sync() -> None:
        raise OSError(errno.EIO, "Input/output error")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        journal.start(loop)
        failed: asyncio.Future[None] = loop.create_future()
        watch = loop.create_task(watch_journal(journal, failed))
        await journal.append(record(1))  # a healthy journal: the watch waits
        assert not failed.done() and not watch.done()
        journal._wal.sync = broken_sync  # type: ignore[method-assign]
        with pytest.raises(StorageError, match="refuses adds until it is restarted"):
            await journal.append(record(2))
        async with asyncio.timeout(5):
            with pytest.raises(StorageError, match="failed to write"):
                await failed
            await watch

    rpc.run(main())
    journal.close()
