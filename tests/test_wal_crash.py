"""Real processes: a writer killed with SIGKILL at random moments never loses a
record it reported as synced; a second process cannot open a WAL for append."""

from __future__ import annotations

import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from quorumlog.wal import Wal, WalConfig, inspect, verify
from quorumlog.wal._format import SECTOR_BYTES

ROUNDS = 8
ROUND_DEADLINE_S = 20.0
CONFIG = WalConfig(segment_size_bytes=64 * 1024)  # small: kills land in cuts too

CHILD = r"""
import sys
from quorumlog.log import configure
configure("ERROR")
from quorumlog.wal import Wal, WalConfig, WalEntry
import random

def payload(index):
    return (b"%d:" % index) * (1 + index % 97)

directory, seed = sys.argv[1], int(sys.argv[2])
config = WalConfig(segment_size_bytes=64 * 1024)
if Wal.exists(directory):
    wal = Wal.open(directory, config=config)
    entries = wal.read_all().entries
    last = entries[-1].index if entries else 0
else:
    wal = Wal.create(directory, b"crash-test", config=config)
    last = 0
print(f"ready {last}", flush=True)
rng = random.Random(seed)
while True:
    count = rng.randint(1, 24)
    batch = [WalEntry(index=i, data=payload(i)) for i in range(last + 1, last + count + 1)]
    wal.save(b"state %d" % (last + count), batch)
    last += count
    print(f"synced {last}", flush=True)
"""

LOCKER = r"""
import sys
from quorumlog.errors import LockedError
from quorumlog.wal import Wal
try:
    wal = Wal.open(sys.argv[1])
except LockedError as exc:
    print(exc.message, flush=True)
    sys.exit(3)
wal.read_all()
wal.close()
print("opened", flush=True)
"""


def _payload(index: int) -> bytes:
    return (b"%d:" % index) * (1 + index % 97)


class _Child:
    """A writer process whose stdout lines arrive on a queue (read by a thread)."""

    def __init__(self, script: Path, directory: Path, seed: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(script), str(directory), str(seed)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def next_line(self, deadline: float) -> str:
        remaining = deadline - time.monotonic()
        assert remaining > 0, "child did not report in time"
        line = self.lines.get(timeout=remaining)
        if line is None:
            stderr = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"child exited early: {stderr}")
        return line

    def kill_and_collect(self, deadline: float) -> list[str]:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        self.reader.join(timeout=max(0.1, deadline - time.monotonic()))
        rest = []
        while (line := self.lines.get_nowait()) is not None:
            rest.append(line)
        if self.proc.stderr:
            self.proc.stderr.close()
        return rest


def _synced(line: str) -> int | None:
    return int(line.split()[1]) if line.startswith("synced ") else None


def test_sigkill_never_loses_a_synced_record(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    directory = tmp_path / "wal"
    rng = random.Random(20240601)
    synced = 0
    for round_number in range(ROUNDS):
        deadline = time.monotonic() + ROUND_DEADLINE_S
        child = _Child(script, directory, seed=round_number)
        ready = child.next_line(deadline)
        assert ready.startswith("ready ")
        assert int(ready.split()[1]) >= synced
        target_syncs = rng.randint(1, 60)
        for _ in range(target_syncs):
            reported = _synced(child.next_line(deadline))
            assert reported is not None and reported > synced
            synced = reported
        for line in child.kill_and_collect(deadline):  # synced before the kill landed
            synced = _synced(line) or synced
        if rng.random() < 0.5:
            _lose_unsynced_sectors(directory, synced, rng)
        _check_and_repair(directory, synced)
    assert synced > ROUNDS


def _lose_unsynced_sectors(directory: Path, synced: int, rng: random.Random) -> None:
    """Power loss on top of the kill: whole sectors after the synced data never landed."""
    report = inspect(directory, records_limit=10**6, config=CONFIG)
    last = report.segments[-1]
    records = [r for r in report.records if r.segment == last.name]
    protected_end = 0
    for i, record in enumerate(records):
        synced_save = record.type == "entry" and record.index == synced
        if synced_save and i + 1 < len(records):  # the save's state record follows
            protected_end = records[i + 1].offset + records[i + 1].frame_bytes
    if protected_end == 0:  # nothing synced in this segment but its header
        first_entry = next((r for r in records if r.type == "entry"), None)
        protected_end = first_entry.offset if first_entry else last.data_bytes
    first_sector = -(-protected_end // SECTOR_BYTES)
    last_sector = last.data_bytes // SECTOR_BYTES
    if first_sector > last_sector:
        return
    start = rng.randint(first_sector, last_sector) * SECTOR_BYTES
    path = directory / last.name
    with path.open("r+b") as f:
        f.seek(start)
        f.write(bytes(max(0, last.size_bytes - start)))


def _check_and_repair(directory: Path, synced: int) -> None:
    with Wal.open(directory, config=CONFIG) as wal:  # repairs a torn tail if there is one
        contents = wal.read_all()
    entries = contents.entries
    assert len(entries) >= synced
    assert [e.index for e in entries[:synced]] == list(range(1, synced + 1))
    for entry in entries:
        assert entry.data == _payload(entry.index)
    # the state record follows its entries in one write: it names a saved index
    assert contents.state is not None and contents.state.startswith(b"state ")
    assert synced <= int(contents.state.split()[1]) <= entries[-1].index
    assert verify(directory, config=CONFIG).last_index == entries[-1].index


def test_second_process_cannot_open_for_append(tmp_path: Path) -> None:
    script = tmp_path / "locker.py"
    script.write_text(LOCKER)
    directory = tmp_path / "wal"
    wal = Wal.create(directory, b"m")
    try:
        blocked = subprocess.run([sys.executable, str(script), str(directory)],
                                 capture_output=True, text=True, timeout=60)
        assert blocked.returncode == 3, blocked.stderr
        assert str(directory) in blocked.stdout
        assert "locked by another process" in blocked.stdout
        assert f"pid {os.getpid()}" in blocked.stdout
    finally:
        wal.close()
    after = subprocess.run([sys.executable, str(script), str(directory)],
                           capture_output=True, text=True, timeout=60)
    assert after.returncode == 0, after.stderr
    assert after.stdout.strip() == "opened"
