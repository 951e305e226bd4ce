"""Adds without the journal (``FLAG_RECOVERY | FLAG_NO_JOURNAL``) and the flush
request that makes them durable, against a real bookie process killed with
SIGKILL (tests/bookie/bookie_server_child.py; its periodic flush is set an
hour apart so only the flush request moves the write cache to disk).
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from server_helpers import KEY, MIB, add, check_entry, connect, envelope, read

from quorumlog import rpc
from quorumlog.errors import UsageError
from quorumlog.proto import (
    FLAG_NO_JOURNAL,
    FLAG_RECOVERY,
    FLUSH_ENTRIES_MAX,
    AddEntriesRequest,
    AddEntryRequest,
    FlushLedgerRequest,
    LedgerInfoRequest,
    NoSuchEntryError,
    UnauthorizedError,
)

CHILD = Path(__file__).with_name("bookie_server_child.py")
CHILD_START_TIMEOUT_S = 30.0
WRITE_CACHE_BYTES = 8 * MIB
FLUSH_INTERVAL_MS = 3_600_000  # no periodic flush during a test
ENTRIES = 40


class Bookie:
    """A bookie child process on ``directory``; ``kill`` is a SIGKILL."""

    def __init__(self, directory: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), str(directory), str(WRITE_CACHE_BYTES),
             str(FLUSH_INTERVAL_MS)], stdout=subprocess.PIPE, text=True)
        watchdog = threading.Timer(CHILD_START_TIMEOUT_S, self.proc.kill)
        watchdog.start()
        try:
            assert self.proc.stdout is not None
            line = self.proc.stdout.readline().split()
        finally:
            watchdog.cancel()
        assert line and line[0] == "ready", f"bookie child did not start: {line}"
        self.address = line[1]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=CHILD_START_TIMEOUT_S)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


@pytest.fixture
def bookie_dir(tmp_path: Path) -> Path:
    return tmp_path / "bookie"


def _run(directory: Path, scenario: Callable[[rpc.Connection], Awaitable[None]]) -> None:
    """Start a bookie, run ``scenario(conn)`` against it, SIGKILL it."""
    bookie = Bookie(directory)
    try:
        async def main() -> None:
            conn = await connect(bookie.address)
            try:
                await scenario(conn)
            finally:
                await conn.close()

        rpc.run(main())
    finally:
        bookie.kill()


async def _add_unjournaled(conn: rpc.Connection, ledger_id: int, entry_ids: range) -> None:
    """One batch and one single add, both without the journal."""
    *batch, last = entry_ids
    envelopes = [envelope(ledger_id, e) for e in batch]
    reply = await conn.call(AddEntriesRequest(
        ledger_id=ledger_id, entry_ids=batch, sizes=[len(e) for e in envelopes],
        master_key=KEY, flags=FLAG_RECOVERY | FLAG_NO_JOURNAL),
        payload=b"".join(envelopes), timeout_s=10)
    assert reply.codes == [0] * len(batch)
    await conn.call(AddEntryRequest(ledger_id=ledger_id, entry_id=last, master_key=KEY,
                                    flags=FLAG_RECOVERY | FLAG_NO_JOURNAL),
                    payload=envelope(ledger_id, last), timeout_s=10)


async def _flush(conn: rpc.Connection, ledger_id: int, entry_ids: list[int]) -> int:
    reply = await conn.call(FlushLedgerRequest(ledger_id=ledger_id, master_key=KEY,
                                               entry_ids=entry_ids), timeout_s=30)
    return int(reply.entries_durable)


def test_no_journal_without_recovery_is_refused_and_changes_nothing(bookie_dir: Path) -> None:
    async def scenario(conn: rpc.Connection) -> None:
        with pytest.raises(UsageError, match="only valid with FLAG_RECOVERY"):
            await conn.call(AddEntryRequest(ledger_id=1, entry_id=0, master_key=KEY,
                                            flags=FLAG_NO_JOURNAL),
                            payload=envelope(1, 0), timeout_s=10)
        with pytest.raises(UsageError, match="only valid with FLAG_RECOVERY"):
            data = envelope(1, 0)
            await conn.call(AddEntriesRequest(ledger_id=1, entry_ids=[0], sizes=[len(data)],
                                              master_key=KEY, flags=FLAG_NO_JOURNAL),
                            payload=data, timeout_s=10)
        info = await conn.call(LedgerInfoRequest(ledger_id=1), timeout_s=10)
        assert not info.exists

    _run(bookie_dir, scenario)


def test_flushed_no_journal_adds_survive_sigkill(bookie_dir: Path) -> None:
    ids = list(range(ENTRIES))

    async def before(conn: rpc.Connection) -> None:
        await _add_unjournaled(conn, 1, range(ENTRIES))
        for e in ids:  # readable at once, from the write cache
            check_entry(await read(conn, 1, e), 1, e)
        assert await _flush(conn, 1, ids) == ENTRIES
        with pytest.raises(UsageError, match="at most"):
            await _flush(conn, 1, list(range(FLUSH_ENTRIES_MAX + 1)))
        with pytest.raises(UnauthorizedError):
            await conn.call(FlushLedgerRequest(ledger_id=1, master_key=b"other",
                                               entry_ids=ids), timeout_s=10)

    async def after(conn: rpc.Connection) -> None:
        for e in ids:
            check_entry(await read(conn, 1, e), 1, e)
        assert await _flush(conn, 1, ids) == ENTRIES

    _run(bookie_dir, before)  # ends with SIGKILL
    _run(bookie_dir, after)


def test_flush_after_restart_never_vouches_for_lost_adds(bookie_dir: Path) -> None:
    """Adds without the journal, then SIGKILL before any flush: the flush request
    of the restarted bookie answers only if it holds every entry. The ledger
    itself survives (a journaled add made its key durable), so only the check
    of the entries can tell."""
    ids = list(range(1, ENTRIES))

    async def before(conn: rpc.Connection) -> None:
        await add(conn, 2, 0)
        await _add_unjournaled(conn, 2, range(1, ENTRIES))

    async def after(conn: rpc.Connection) -> None:
        try:
            assert await _flush(conn, 2, ids) == len(ids)
        except NoSuchEntryError:
            return  # lost in the kill, and said so
        for e in ids:
            check_entry(await read(conn, 2, e), 2, e)

    _run(bookie_dir, before)
    _run(bookie_dir, after)


def test_unjournaled_new_ledger_then_journaled_add_replays(bookie_dir: Path) -> None:
    """A ledger new to the bookie through an add without the journal, then a
    journaled add of it: the journal still holds the ledger's key, so after a
    SIGKILL the replay finds the journaled entry's key and the bookie starts."""

    async def before(conn: rpc.Connection) -> None:
        await _add_unjournaled(conn, 3, range(2))
        await add(conn, 3, 2)  # journaled, acknowledged after the fsync

    async def after(conn: rpc.Connection) -> None:
        check_entry(await read(conn, 3, 2), 3, 2)

    _run(bookie_dir, before)
    _run(bookie_dir, after)


def test_flush_request_waits_for_a_running_flush(bookie_dir: Path) -> None:
    """Concurrent flush requests share flushes but each answers only with its
    entries in the index."""

    async def scenario(conn: rpc.Connection) -> None:
        async def one(ledger_id: int) -> int:
            await _add_unjournaled(conn, ledger_id, range(ENTRIES))
            return await _flush(conn, ledger_id, list(range(ENTRIES)))

        assert await asyncio.gather(*(one(10 + i) for i in range(6))) == [ENTRIES] * 6

    _run(bookie_dir, scenario)
