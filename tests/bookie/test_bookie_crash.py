"""kill -9 at random moments: everything reported flushed must survive, CRC-checked."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from bookie_crash_child import config, expected

from quorumlog.bookie import LedgerStorage

CHILD = Path(__file__).with_name("bookie_crash_child.py")
ROUNDS = 6
CHILD_ITERATIONS_MAX = 200
REPORTS_BEFORE_KILL_MAX = 40
CHILD_TIMEOUT_S = 60
KILL_DELAY_MAX_S = 0.02


def note(line: str, flushed: dict[int, int], deleted: set[int]) -> bool:
    """Record one report of the child; False at its end."""
    words = line.split()
    if not words or words[0] == "done":
        return False
    if words[0] == "flushed":
        ledger_id, entry_id = int(words[1]), int(words[2])
        flushed[ledger_id] = max(flushed.get(ledger_id, -1), entry_id)
    elif words[0] == "delete":
        deleted.add(int(words[1]))
    return True


def run_and_kill(directory: Path, seed: int, reports_before_kill: int, kill_delay_s: float,
                 flushed: dict[int, int], deleted: set[int]) -> None:
    child = subprocess.Popen(
        [sys.executable, str(CHILD), str(directory), str(seed), str(CHILD_ITERATIONS_MAX)],
        stdout=subprocess.PIPE, text=True,
    )
    watchdog = threading.Timer(CHILD_TIMEOUT_S, child.kill)  # bounds every read below
    watchdog.start()
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        for _ in range(reports_before_kill):
            if not note(child.stdout.readline(), flushed, deleted):
                break
        # Not a wait for some state: a random delay picks the moment of the kill
        # (adding, writing an entry log, committing the index, compacting).
        time.sleep(kill_delay_s)
        child.send_signal(signal.SIGKILL)
        for line in child.stdout:  # reports written before the kill count too
            note(line, flushed, deleted)
    finally:
        watchdog.cancel()
        child.kill()
        returncode = child.wait(timeout=CHILD_TIMEOUT_S)
        assert child.stdout is not None
        child.stdout.close()
    assert returncode in (0, -signal.SIGKILL), f"child failed by itself: {returncode}"


def check_everything_flushed(directory: Path, flushed: dict[int, int], deleted: set[int]) -> int:
    with LedgerStorage(directory, config()) as storage:
        checked = 0
        for ledger_id, last in flushed.items():
            if ledger_id in deleted:
                continue
            assert storage.last_entry_id(ledger_id) >= last
            for entry_id in range(last + 1):
                assert storage.get_entry(ledger_id, entry_id) == expected(ledger_id, entry_id)
                checked += 1
        report = storage.verify()
        assert report.ok, report.errors
        assert report.entries_checked >= checked
        checkpoint = storage.last_checkpoint()
        assert checkpoint is None or checkpoint.startswith(b"iteration-")
    return checked


def test_kill_minus_nine_loses_nothing_reported_flushed(tmp_path: Path) -> None:
    rng = random.Random(20240611)
    directory = tmp_path / "ledgers"
    flushed: dict[int, int] = {}
    deleted: set[int] = set()
    for round_ in range(ROUNDS):
        run_and_kill(directory, seed=round_,
                     reports_before_kill=rng.randrange(1, REPORTS_BEFORE_KILL_MAX),
                     kill_delay_s=rng.uniform(0, KILL_DELAY_MAX_S),
                     flushed=flushed, deleted=deleted)
        check_everything_flushed(directory, flushed, deleted)
    assert sum(last + 1 for lid, last in flushed.items() if lid not in deleted) > 0
