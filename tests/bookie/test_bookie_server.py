"""The bookie server over real rpc on 127.0.0.1, in-process (no meta).

Covers every request of the wire protocol, fencing across a restart, long-poll
LAC, deferred sync, bad input (the bookie keeps serving), read-only mode,
GC compaction without meta, metrics and the in-process helper.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from bookie_helpers import DiskProbe
from prometheus_client import generate_latest
from server_helpers import (
    KEY,
    add,
    check_entry,
    connect,
    envelope,
    payload,
    read,
    small_bookie_config,
)

from quorumlog import rpc
from quorumlog.bookie import LocalBookie, run_bookie
from quorumlog.errors import UsageError
from quorumlog.ledger import DigestType
from quorumlog.proto import (
    FLAG_FENCE,
    BadEnvelopeError,
    BookieStatusRequest,
    DigestMismatchError,
    EntryTooLargeError,
    FenceRequest,
    ForceLedgerRequest,
    GcRequest,
    LedgerFencedError,
    LedgerInfoRequest,
    NoSuchEntryError,
    NoSuchLedgerError,
    ReadBatchRequest,
    ReadEntryRequest,
    ReadLacRequest,
    ReadOnlyError,
    ScrubRequest,
    UnauthorizedError,
    WriteLacRequest,
    encode_entry,
)

TEST_DEADLINE_S = 30.0

Body = Callable[[LocalBookie, rpc.Connection], Awaitable[None]]


def serve(tmp_path: Path, body: Body, *, probe: DiskProbe | None = None,
          **changes: Any) -> None:
    """Run ``body`` against a fresh in-process bookie with one client connection."""
    config = small_bookie_config(tmp_path / "bookie", **changes)

    async def main() -> None:
        async with asyncio.timeout(TEST_DEADLINE_S), run_bookie(
                config, disk_usage_probe=probe) as bookie:
            conn = await connect(bookie.address)
            try:
                await body(bookie, conn)
            finally:
                await conn.close()

    rpc.run(main())


def test_add_then_read_entry_batch_and_lac(tmp_path: Path) -> None:
    async def body(bookie: LocalBookie, conn: rpc.Connection) -> None:
        await asyncio.gather(*(add(conn, 7, e) for e in range(50)))
        for e in (0, 17, 49):
            check_entry(await read(conn, 7, e), 7, e)
        response, data = await conn.call_with_payload(
            ReadBatchRequest(ledger_id=7, first_entry_id=10, max_entries=20, max_bytes=1 << 20))
        assert len(response.sizes) == 20 and response.first_entry_id == 10
        offset = 0
        for i, size in enumerate(response.sizes):
            check_entry(data[offset:offset + size], 7, 10 + i)
            offset += size
        assert offset == len(data)
        lac = await conn.call(ReadLacRequest(ledger_id=7))
        assert (lac.lac, lac.last_entry_id, lac.fenced) == (48, 49, False)
        info = await conn.call(LedgerInfoRequest(ledger_id=7))
        assert info.exists and info.last_entry_id == 49
        missing = await conn.call(LedgerInfoRequest(ledger_id=8))
        assert not missing.exists

    serve(tmp_path, body)


def test_entries_survive_a_restart_and_flushes(tmp_path: Path) -> None:
    config = small_bookie_config(tmp_path / "bookie")

    async def main() -> None:
        async with run_bookie(config) as bookie:
            conn = await connect(bookie.address)
            await asyncio.gather(*(add(conn, lid, e) for lid in (1, 2) for e in range(400)))
            await bookie.service.flush()  # entry logs + checkpoint + journal release
            await asyncio.gather(*(add(conn, 3, e) for e in range(100)))  # journal only
            await conn.close()
        async with run_bookie(config) as bookie:
            conn = await connect(bookie.address)
            for lid, count in ((1, 400), (2, 400), (3, 100)):
                datas = await asyncio.gather(*(read(conn, lid, e) for e in range(count)))
                for e, data in enumerate(datas):
                    check_entry(data, lid, e)
            await conn.close()

    rpc.run(main())


def test_fencing_refuses_normal_adds_takes_recovery_adds_and_survives_restart(
        tmp_path: Path) -> None:
    config = small_bookie_config(tmp_path / "bookie")

    async def main() -> None:
        async with run_bookie(config) as bookie:
            conn = await connect(bookie.address)
            await asyncio.gather(*(add(conn, 5, e) for e in range(10)))
            fenced = await conn.call(FenceRequest(ledger_id=5, master_key=KEY))
            assert fenced.fenced and fenced.lac == 8 and fenced.last_entry_id == 9
            with pytest.raises(LedgerFencedError, match="fenced"):
                await add(conn, 5, 10)
            await add(conn, 5, 10, recovery=True)
            # A recovery read fences a ledger the bookie never saw (creating it).
            with pytest.raises(NoSuchEntryError):
                await conn.call(ReadEntryRequest(ledger_id=6, entry_id=0, flags=FLAG_FENCE,
                                                 master_key=KEY))
            assert (await conn.call(LedgerInfoRequest(ledger_id=6))).fenced
            # Fencing needs the ledger's master key.
            with pytest.raises(UnauthorizedError):
                await conn.call(FenceRequest(ledger_id=5, master_key=b"wrong"))
            await conn.close()
        async with run_bookie(config) as bookie:  # fencing is in the journal/index
            conn = await connect(bookie.address)
            for lid in (5, 6):
                assert (await conn.call(LedgerInfoRequest(ledger_id=lid))).fenced
            with pytest.raises(LedgerFencedError):
                await add(conn, 5, 11)
            await add(conn, 5, 11, recovery=True)
            check_entry(await read(conn, 5, 10), 5, 10)
            await conn.close()

    rpc.run(main())


WOKEN_POLL_S_MAX = 5.0
"""A parked long poll (timeout 10 s) must be answered by the LAC change well before."""


def test_long_poll_lac_parks_until_an_add_passes_it(tmp_path: Path) -> None:
    async def body(bookie: LocalBookie, conn: rpc.Connection) -> None:
        await add(conn, 9, 0)  # LAC -1
        loop = asyncio.get_running_loop()
        poll = asyncio.ensure_future(conn.call_with_payload(
            ReadLacRequest(ledger_id=9, previous_lac=-1, timeout_ms=10_000, with_entry=True)))
        # Parked: nothing answers it until the LAC passes -1.
        deadline = loop.time() + 5
        while bookie.service.counters.long_polls_parked == 0:
            assert loop.time() < deadline, "the long poll was not parked"
            await asyncio.sleep(0.005)
        assert not poll.done()
        await add(conn, 9, 1)  # piggybacks LAC 0
        async with asyncio.timeout(WOKEN_POLL_S_MAX):  # woken, not timed out (10 s)
            response, data = await poll
        assert response.lac == 0 and response.last_entry_id == 1
        check_entry(data, 9, 0)  # with_entry: entry previous_lac + 1
        # A poll that times out answers with the unchanged LAC.
        start = loop.time()
        response, data = await conn.call_with_payload(
            ReadLacRequest(ledger_id=9, previous_lac=0, timeout_ms=200))
        assert response.lac == 0 and len(data) == 0 and loop.time() - start >= 0.15
        # An explicit LAC wakes a parked poll too.
        explicit = asyncio.ensure_future(conn.call(
            ReadLacRequest(ledger_id=9, previous_lac=0, timeout_ms=10_000)))
        while bookie.service.counters.long_polls_parked == 0:
            await asyncio.sleep(0.005)
        await conn.call(WriteLacRequest(ledger_id=9, master_key=KEY, lac=1))
        async with asyncio.timeout(WOKEN_POLL_S_MAX):
            assert (await explicit).lac == 1
        # A poll on a ledger the bookie does not have ends with NoSuchLedgerError.
        with pytest.raises(NoSuchLedgerError):
            await conn.call(ReadLacRequest(ledger_id=99, previous_lac=-1, timeout_ms=50))

    serve(tmp_path, body)


def test_no_sync_adds_then_force_ledger(tmp_path: Path) -> None:
    async def body(bookie: LocalBookie, conn: rpc.Connection) -> None:
        journal = bookie.service.journal
        fsyncs = journal.fsyncs
        await asyncio.gather(*(add(conn, 4, e, no_sync=True) for e in range(20)))
        assert journal.synced_index < journal.last_index  # answered before any fdatasync
        forced = await conn.call(ForceLedgerRequest(ledger_id=4, master_key=KEY))
        assert forced.last_entry_id == 19
        assert journal.synced_index == journal.last_index and journal.fsyncs > fsyncs
        with pytest.raises(UnauthorizedError):
            await conn.call(ForceLedgerRequest(ledger_id=4, master_key=b"other"))
        with pytest.raises(NoSuchLedgerError):
            await conn.call(ForceLedgerRequest(ledger_id=44, master_key=KEY))

    # No flush timer interfering with the fsync count.
    serve(tmp_path, body, flush_interval_ms=600_000)


def test_bad_input_gets_clear_errors_and_the_bookie_keeps_serving(tmp_path: Path) -> None:
    async def body(bookie: LocalBookie, conn: rpc.Connection) -> None:
        await add(conn, 1, 0)
        with pytest.raises(UnauthorizedError, match="master key"):
            await add(conn, 1, 1, key=b"not-the-key")
        with pytest.raises(NoSuchLedgerError):
            await read(conn, 12345, 0)
        with pytest.raises(NoSuchEntryError):
            await read(conn, 1, 5)
        too_big = encode_entry(1, 1, 0, b"x" * (65 * 1024), digest=DigestType.CRC32C)
        with pytest.raises(EntryTooLargeError):
            await add(conn, 1, 1, data=too_big)
        with pytest.raises(BadEnvelopeError):
            await add(conn, 1, 1, data=b"definitely not an envelope")
        with pytest.raises(BadEnvelopeError, match="request adds 1:1"):
            await add(conn, 1, 1, data=envelope(1, 2))  # ids disagree with the request
        corrupt = bytearray(envelope(1, 1))
        corrupt[-1] ^= 0xFF
        with pytest.raises(DigestMismatchError):
            await add(conn, 1, 1, data=bytes(corrupt))
        with pytest.raises(UsageError):
            await conn.call(ReadBatchRequest(ledger_id=1, first_entry_id=0, max_entries=0,
                                             max_bytes=10))
        # Malformed frames on another connection close that connection only.
        host, port = bookie.address.rsplit(":", 1)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, _send_garbage, host, int(port))
        await add(conn, 1, 1)
        check_entry(await read(conn, 1, 1), 1, 1)
        status = await conn.call(BookieStatusRequest())
        assert status.stats["adds_failed"] >= 5 and status.stats["adds_ok"] == 2

    serve(tmp_path, body)


def _send_garbage(host: str, port: int) -> None:
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(b"\xff" * 64 + b"GET / HTTP/1.1\r\n\r\n")
        sock.settimeout(5)
        received = b""
        try:
            while chunk := sock.recv(1024):
                received += chunk
        except ConnectionResetError:
            pass
        assert b"HTTP" not in received


def test_read_only_refuses_adds_serves_reads_and_recovers(tmp_path: Path) -> None:
    probe = DiskProbe(0.10)

    async def body(bookie: LocalBookie, conn: rpc.Connection) -> None:
        await add(conn, 2, 0)
        probe.usage = 0.97
        bookie.service.check_disk_usage()
        with pytest.raises(ReadOnlyError) as refused:
            await add(conn, 2, 1)
        assert refused.value.retriable
        check_entry(await read(conn, 2, 0), 2, 0)
        assert (await conn.call(BookieStatusRequest())).read_only
        probe.usage = 0.50
        bookie.service.check_disk_usage()
        await add(conn, 2, 1)

    serve(tmp_path, body, probe=probe)


def test_gc_without_meta_compacts_and_scrub_is_clean(tmp_path: Path) -> None:
    async def body(bookie: LocalBookie, conn: rpc.Connection) -> None:
        await asyncio.gather(*(add(conn, 3, e) for e in range(300)))
        result = await conn.call(GcRequest())
        assert result.deleted_ledgers == 0  # without meta nothing is known deleted
        scrub = await conn.call(ScrubRequest())
        assert scrub.ok and scrub.entries_checked >= 300 and scrub.problems == []
        datas = await asyncio.gather(*(read(conn, 3, e) for e in range(300)))
        for e, data in enumerate(datas):
            check_entry(data, 3, e)

    serve(tmp_path, body)


def test_metrics_count_adds_reads_and_journal_fsyncs(tmp_path: Path) -> None:
    async def body(bookie: LocalBookie, conn: rpc.Connection) -> None:
        await asyncio.gather(*(add(conn, 1, e) for e in range(10)))
        await read(conn, 1, 3)
        text = generate_latest(rpc.metrics_registry).decode()
        assert 'quorumlog_bookie_adds_total{result="ok"}' in text
        assert 'quorumlog_bookie_reads_total{kind="entry"}' in text
        assert "quorumlog_bookie_journal_fsync_seconds_count" in text
        assert "quorumlog_bookie_gc_reclaimed_bytes_total" in text
        assert "quorumlog_bookie_write_cache_bytes" in text

    serve(tmp_path, body)


def test_payload_helper_is_deterministic() -> None:
    assert payload(3, 4) == payload(3, 4) and payload(3, 4) != payload(3, 5)
