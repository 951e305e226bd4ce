"""A bookie process receiving pipelined adds is killed with SIGKILL at random moments.

Each round starts the bookie (tests/bookie/bookie_server_child.py) on the same
directories, writes new ledgers with pipelined adds (some no-sync, some in
AddEntriesRequest batches: the bulk add path), fences a
ledger of the previous round, and is killed after a random delay. After each
restart every acknowledged entry of every round reads back byte-identical with
a valid digest; entries sent but not acknowledged may be missing but are never
corrupt; fenced ledgers stay fenced (normal adds refused, recovery adds taken).
Small journal segments and write cache make flushes, checkpoints and journal
segment releases happen while adds run, so kills land in all of them.
"""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from server_helpers import KEY, add, add_batch, check_entry, connect, envelope, read

from quorumlog import rpc
from quorumlog.errors import QuorumlogError
from quorumlog.proto import (
    ENTRY_OK,
    FenceRequest,
    LedgerFencedError,
    LedgerInfoRequest,
    NoSuchEntryError,
    NoSuchLedgerError,
)

CHILD = Path(__file__).with_name("bookie_server_child.py")
CHILD_START_TIMEOUT_S = 30.0
LEDGERS_PER_ROUND = 4
ENTRIES_PER_LEDGER_MAX = 3000
IN_FLIGHT = 64
KILL_DELAY_S = (0.05, 0.8)
ROUND_TIMEOUT_S = 30.0
READ_PIPELINE = 256
BATCH_ENTRIES_MAX = 32


@dataclass
class History:
    acked: dict[int, set[int]] = field(default_factory=dict)
    sent: dict[int, int] = field(default_factory=dict)  # highest entry id sent
    fenced: set[int] = field(default_factory=set)


class Child:
    def __init__(self, directory: Path, *extra: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), str(directory), *map(str, extra)],
            stdout=subprocess.PIPE, text=True)
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
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=CHILD_START_TIMEOUT_S)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


async def _writer(conn: rpc.Connection, ledger_id: int, history: History,
                  rng: random.Random) -> None:
    """Pipelined adds of one ledger until the connection dies or the ledger is full.

    By ledger id mod 4: single adds synced, single adds no-sync, batches
    (``AddEntriesRequest`` of 1 to BATCH_ENTRIES_MAX entries, the bookie's bulk
    path) synced, batches no-sync. An entry of a batch counts as acknowledged
    only when the answer came and its own code is ENTRY_OK."""
    no_sync = ledger_id % 2 == 1
    batched = ledger_id % 4 >= 2
    slots = asyncio.Semaphore(IN_FLIGHT // LEDGERS_PER_ROUND)
    acked = history.acked.setdefault(ledger_id, set())
    pending: set[asyncio.Task[None]] = set()

    async def one(entry_ids: list[int]) -> None:
        try:
            if batched:
                answer = await add_batch(
                    conn, ledger_id, [(e, envelope(ledger_id, e)) for e in entry_ids],
                    no_sync=no_sync)
                assert answer.entry_ids == entry_ids, answer
                acked.update(e for e, code in zip(entry_ids, answer.codes, strict=True)
                             if code == ENTRY_OK)
            else:
                await add(conn, ledger_id, entry_ids[0], no_sync=no_sync)
                acked.add(entry_ids[0])
        except QuorumlogError:
            return
        finally:
            slots.release()

    entry_id = 0
    while entry_id < ENTRIES_PER_LEDGER_MAX:
        await slots.acquire()
        if conn.closed:
            slots.release()
            break
        count = rng.randint(1, BATCH_ENTRIES_MAX) if batched else 1
        entry_ids = list(range(entry_id, min(ENTRIES_PER_LEDGER_MAX, entry_id + count)))
        entry_id = entry_ids[-1] + 1
        history.sent[ledger_id] = entry_ids[-1]
        task = asyncio.create_task(one(entry_ids))
        pending.add(task)
        task.add_done_callback(pending.discard)
        if rng.random() < 0.01:
            await asyncio.sleep(0)
    await asyncio.gather(*pending)


async def _round(directory: Path, round_: int, history: History, rng: random.Random) -> None:
    """Check what earlier rounds left, then write and kill."""
    child = Child(directory)
    conn = await connect(child.address)
    try:
        await _check(conn, history)
        # Fence one ledger of the previous round (answered only once durable).
        if round_ > 0:
            victim = (round_ - 1) * LEDGERS_PER_ROUND + rng.randrange(LEDGERS_PER_ROUND)
            await conn.call(FenceRequest(ledger_id=victim, master_key=KEY), timeout_s=10)
            history.fenced.add(victim)
        ledgers = [round_ * LEDGERS_PER_ROUND + k for k in range(LEDGERS_PER_ROUND)]
        writers = [asyncio.create_task(_writer(conn, lid, history, rng)) for lid in ledgers]
        # Not waiting for a state: the random delay picks the moment of the kill.
        await asyncio.sleep(rng.uniform(*KILL_DELAY_S))
        await asyncio.get_running_loop().run_in_executor(None, child.kill)
        async with asyncio.timeout(ROUND_TIMEOUT_S):
            await asyncio.gather(*writers)
    finally:
        await conn.close()
        if child.proc.poll() is None:
            child.kill()


async def _check(conn: rpc.Connection, history: History) -> None:
    """Acknowledged entries intact, unacknowledged ones absent or intact, fences kept."""
    for ledger_id, acked in history.acked.items():
        entry_ids = list(range(history.sent.get(ledger_id, -1) + 1))
        for start in range(0, len(entry_ids), READ_PIPELINE):
            chunk = entry_ids[start:start + READ_PIPELINE]
            results = await asyncio.gather(*(read(conn, ledger_id, e) for e in chunk),
                                           return_exceptions=True)
            for entry_id, result in zip(chunk, results, strict=True):
                if isinstance(result, BaseException):
                    # unacknowledged: may be missing, never corrupt
                    assert entry_id not in acked, f"acknowledged {ledger_id}:{entry_id}: {result}"
                    assert isinstance(result, NoSuchEntryError | NoSuchLedgerError), result
                else:
                    check_entry(result, ledger_id, entry_id)
    for ledger_id in history.fenced:
        info = await conn.call(LedgerInfoRequest(ledger_id=ledger_id), timeout_s=10)
        assert info.fenced, f"ledger {ledger_id} lost its fence in a crash"
        next_id = history.sent[ledger_id] + 1
        with pytest.raises(LedgerFencedError):
            await add(conn, ledger_id, next_id)
        await add(conn, ledger_id, next_id, recovery=True)
        history.sent[ledger_id] = next_id
        history.acked[ledger_id].add(next_id)


def _run(tmp_path: Path, rounds: int, seed: int) -> None:
    rng = random.Random(seed)
    history = History()
    directory = tmp_path / "bookie"

    async def main() -> None:
        for round_ in range(rounds):
            await _round(directory, round_, history, rng)
        child = Child(directory)
        conn = await connect(child.address)
        try:
            await _check(conn, history)
        finally:
            await conn.close()
            child.kill()

    rpc.run(main())
    total = sum(len(a) for a in history.acked.values())
    assert total > rounds * 50, f"too few acknowledged adds to mean anything: {total}"


def test_sigkill_during_pipelined_adds_loses_no_acknowledged_entry(tmp_path: Path) -> None:
    _run(tmp_path, rounds=4, seed=20261122)


@pytest.mark.slow
def test_sigkill_many_rounds(tmp_path: Path) -> None:
    _run(tmp_path, rounds=20, seed=7)


def test_replay_of_a_journal_larger_than_the_write_cache(tmp_path: Path) -> None:
    """Killed with 3+ MB only in the journal, restarted with a 1 MiB write cache."""
    directory = tmp_path / "bookie"
    entries = 2500  # ~3.7 MB of envelopes: under a quarter of the 16 MiB cache

    async def main() -> None:
        child = Child(directory, 16 * 1024 * 1024, 600_000)
        conn = await connect(child.address)
        try:
            for start in range(0, entries, READ_PIPELINE):
                await asyncio.gather(*(add(conn, 1, e)
                                       for e in range(start, min(entries, start + READ_PIPELINE))))
        finally:
            await conn.close()
            child.kill()
        child = Child(directory, 1024 * 1024, 600_000)  # replay flushes as it goes
        conn = await connect(child.address)
        try:
            await _check(conn, History(acked={1: set(range(entries))}, sent={1: entries - 1}))
        finally:
            await conn.close()
            child.kill()

    rpc.run(main())
