"""Batched adds (``AddEntriesRequest``) against a real in-process bookie on
127.0.0.1: per-entry results, fencing between and inside batches, the answer
only after the journal's fdatasync, and a malformed batch refused whole."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from server_helpers import KEY, add_batch, check_entry, connect, envelope, read, small_bookie_config

from quorumlog import rpc
from quorumlog.bookie import LocalBookie, run_bookie
from quorumlog.ledger import DigestType
from quorumlog.proto import (
    ADD_BATCH_ENTRIES_MAX,
    ENTRY_OK,
    AddEntriesRequest,
    BadEnvelopeError,
    BookieStatusRequest,
    DigestMismatchError,
    EntryTooLargeError,
    FenceRequest,
    LedgerFencedError,
    LedgerInfoRequest,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedError,
    encode_entry,
    entry_error,
)

TEST_DEADLINE_S = 30.0
SYNC_ENTERED_WAIT_S = 10.0

Body = Callable[[LocalBookie, rpc.Connection], Awaitable[None]]


def serve(tmp_path: Path, body: Body, **changes: Any) -> None:
    config = small_bookie_config(tmp_path / "bookie", **changes)

    async def main() -> None:
        async with asyncio.timeout(TEST_DEADLINE_S), run_bookie(config) as bookie:
            conn = await connect(bookie.address)
            try:
                await body(bookie, conn)
            finally:
                await conn.close()

    rpc.run(main())


def errors_of(codes: list[int], messages: list[str]) -> list[type[Exception] | None]:
    out: list[type[Exception] | None] = []
    for code, message in zip(codes, messages, strict=True):
        error = entry_error(code, message)
        out.append(None if error is None else type(error))
    return out


def test_a_batch_answers_per_entry_and_one_bad_entry_leaves_the_others(
        tmp_path: Path) -> None:
    async def body(bookie: LocalBookie, conn: rpc.Connection) -> None:
        corrupt = bytearray(envelope(1, 3))
        corrupt[-1] ^= 0xFF
        too_big = encode_entry(1, 4, 3, b"x" * (65 * 1024), digest=DigestType.CRC32C)
        batch = [(0, envelope(1, 0)), (1, envelope(1, 1)), (2, envelope(1, 9)),
                 (3, bytes(corrupt)), (4, too_big), (5, envelope(1, 5))]
        answer = await add_batch(conn, 1, batch)
        assert answer.entry_ids == [0, 1, 2, 3, 4, 5]
        assert errors_of(answer.codes, answer.messages) == [
            None, None, BadEnvelopeError, DigestMismatchError, EntryTooLargeError, None]
        assert "request adds 1:2" in answer.messages[2]
        for entry_id in (0, 1, 5):
            check_entry(await read(conn, 1, entry_id), 1, entry_id)
        for entry_id in (2, 3, 4):
            with pytest.raises(NoSuchEntryError):
                await read(conn, 1, entry_id)
        # The wrong key is refused per entry; the right one still goes in.
        wrong = await add_batch(conn, 1, [(6, envelope(1, 6))], key=b"not-the-key")
        assert errors_of(wrong.codes, wrong.messages) == [UnauthorizedError]
        right = await add_batch(conn, 1, [(6, envelope(1, 6)), (7, envelope(1, 7))])
        assert right.codes == [ENTRY_OK, ENTRY_OK]
        stats = (await conn.call(BookieStatusRequest())).stats
        assert stats["adds_ok"] == 5 and stats["adds_failed"] == 4

    serve(tmp_path, body)


def test_fencing_between_batches_and_recovery_batches(tmp_path: Path) -> None:
    async def body(bookie: LocalBookie, conn: rpc.Connection) -> None:
        first = [(e, envelope(2, e)) for e in range(5)]
        second = [(e, envelope(2, e)) for e in range(5, 10)]
        # Pipelined on one connection: batch, fence, batch. The fence is applied
        # between them as between two single adds.
        results = await asyncio.gather(
            add_batch(conn, 2, first), conn.call(FenceRequest(ledger_id=2, master_key=KEY)),
            add_batch(conn, 2, second))
        before, fenced, after = results
        assert before.codes == [ENTRY_OK] * 5
        assert fenced.fenced and fenced.last_entry_id == 4
        assert errors_of(after.codes, after.messages) == [LedgerFencedError] * 5
        assert "fenced" in after.messages[0]
        # Recovery batches are accepted by a fenced ledger.
        recovered = await add_batch(conn, 2, second, recovery=True)
        assert recovered.codes == [ENTRY_OK] * 5
        info = await conn.call(LedgerInfoRequest(ledger_id=2))
        assert info.fenced and info.last_entry_id == 9

    serve(tmp_path, body)


def test_a_batch_is_answered_only_after_the_journal_fdatasync(tmp_path: Path) -> None:
    async def body(bookie: LocalBookie, conn: rpc.Connection) -> None:
        journal = bookie.service.journal
        await add_batch(conn, 3, [(0, envelope(3, 0))])  # the ledger exists, journal quiet
        wal = journal._wal
        real_sync = wal.sync
        entered, release = threading.Event(), threading.Event()

        def held_sync() -> None:
            entered.set()
            release.wait(TEST_DEADLINE_S)
            real_sync()

        wal.sync = held_sync  # type: ignore[method-assign]
        loop = asyncio.get_running_loop()
        try:
            batch = asyncio.ensure_future(
                add_batch(conn, 3, [(e, envelope(3, e)) for e in range(1, 50)]))
            assert await loop.run_in_executor(None, entered.wait, SYNC_ENTERED_WAIT_S)
            # The bookie still answers other requests on the same connection...
            info = await conn.call(LedgerInfoRequest(ledger_id=3))
            assert info.last_entry_id == 49  # ...the batch is applied and journaled...
            assert not batch.done()  # ...but not answered before the fdatasync
            assert journal.synced_index < journal.last_index
        finally:
            release.set()
        answer = await batch
        assert answer.codes == [ENTRY_OK] * 49
        assert journal.synced_index == journal.last_index
        wal.sync = real_sync  # type: ignore[method-assign]

    serve(tmp_path, body, flush_interval_ms=600_000)


def test_a_malformed_batch_is_refused_whole_and_the_bookie_keeps_serving(
        tmp_path: Path) -> None:
    async def body(bookie: LocalBookie, conn: rpc.Connection) -> None:
        data = envelope(4, 0) + envelope(4, 1)
        cases = [
            ([0, 1], [len(data)], "sizes"),  # one size for two ids
            ([0, 1], [10, len(data) - 9], "sizes"),  # sizes do not add up
            ([1, 0], [len(envelope(4, 0)), len(envelope(4, 1))], "ascending"),
            ([], [], "1 to"),
        ]
        for entry_ids, sizes, match in cases:
            with pytest.raises(BadEnvelopeError, match=match):
                await conn.call(AddEntriesRequest(ledger_id=4, entry_ids=entry_ids,
                                                  sizes=sizes, master_key=KEY),
                                payload=data, timeout_s=10)
        many = list(range(ADD_BATCH_ENTRIES_MAX + 1))
        with pytest.raises(BadEnvelopeError, match=str(ADD_BATCH_ENTRIES_MAX)):
            await conn.call(AddEntriesRequest(ledger_id=4, entry_ids=many,
                                              sizes=[0] * len(many), master_key=KEY),
                            payload=b"", timeout_s=10)
        with pytest.raises(NoSuchLedgerError):  # nothing of ledger 4 went in
            await read(conn, 4, 0)
        answer = await add_batch(conn, 4, [(0, envelope(4, 0)), (1, envelope(4, 1))])
        assert answer.codes == [ENTRY_OK, ENTRY_OK]

    serve(tmp_path, body)
