"""Benchmark of the bookie's ledger storage against the raw disk, in the same run.

Cases:

* add+flush throughput (MB/s of entry data) for 1 KiB and 64 KiB entries:
  ``LedgerStorage.add`` then ``flush`` every write-cache half, against plain
  sequential ``os.write`` + ``fsync`` of the same bytes in the same chunk sizes;
* random reads (entries/s) from the entry logs, read cache off, against
  ``os.pread`` of the same frames at the same offsets on the same files.

Every loop is bounded by a count and by ``TIME_BUDGET_S``. ``--quick`` uses small
sizes and one repeat. Run: ``./scripts/uv run --frozen python -m bench.bookie_storage_bench``.
"""

from __future__ import annotations

import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.harness import Harness, Sample
from quorumlog.bookie import LedgerStorage, LedgerStorageConfig
from quorumlog.bookie._format import Location

KIB = 1024
MIB = 1024 * KIB
KEY = b"bench-master-key"
LEDGERS = 8
TIME_BUDGET_S = 30.0
WRITE_CACHE_BYTES = 32 * MIB  # flush every 16 MiB half


def config(*, read_cache_bytes: int = 64 * MIB) -> LedgerStorageConfig:
    return LedgerStorageConfig(
        write_cache_max_bytes=WRITE_CACHE_BYTES,
        entry_log_max_bytes=256 * MIB,
        read_cache_max_bytes=read_cache_bytes,
    )


class Scratch:
    """A fresh directory per run, removed afterwards (not timed)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.count = 0

    def new(self) -> Path:
        self.count += 1
        path = self.root / f"run-{self.count}"
        path.mkdir()
        return path


def add_flush_workload(
    scratch: Scratch, entry_bytes: int, total_bytes: int
) -> Callable[[], Sample]:
    data = os.urandom(entry_bytes)
    count = total_bytes // entry_bytes

    def run() -> Sample:
        directory = scratch.new()
        storage = LedgerStorage(directory, config())
        half = WRITE_CACHE_BYTES // 2
        done_bytes = 0
        start = time.perf_counter()
        for i in range(count):
            storage.add(i % LEDGERS, i // LEDGERS, data, master_key=KEY)
            done_bytes += entry_bytes
            if done_bytes % half < entry_bytes:
                storage.flush(i.to_bytes(8, "big"))
                if time.perf_counter() - start > TIME_BUDGET_S:
                    break
        storage.flush(count.to_bytes(8, "big"))
        seconds = time.perf_counter() - start
        storage.close(flush=False)
        shutil.rmtree(directory)
        return Sample(units=done_bytes, seconds=seconds)

    return run


def write_fsync_baseline(scratch: Scratch, total_bytes: int) -> Callable[[], Sample]:
    chunk = os.urandom(WRITE_CACHE_BYTES // 2)

    def run() -> Sample:
        directory = scratch.new()
        fd = os.open(directory / "baseline.log", os.O_WRONLY | os.O_CREAT, 0o644)
        done_bytes = 0
        start = time.perf_counter()
        while done_bytes < total_bytes and time.perf_counter() - start < TIME_BUDGET_S:
            view = memoryview(chunk)[: min(len(chunk), total_bytes - done_bytes)]
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
            done_bytes += min(len(chunk), total_bytes - done_bytes)
        seconds = time.perf_counter() - start
        os.close(fd)
        shutil.rmtree(directory)
        return Sample(units=done_bytes, seconds=seconds)

    return run


class ReadFixture:
    """One flushed storage with the read cache off, and the frames' locations."""

    def __init__(self, directory: Path, entry_bytes: int, entries: int) -> None:
        self.storage = LedgerStorage(directory, config(read_cache_bytes=0))
        data = os.urandom(entry_bytes)
        for i in range(entries):
            self.storage.add(i % LEDGERS, i // LEDGERS, data, master_key=KEY)
            if self.storage.needs_flush:
                self.storage.flush()
        self.storage.flush()
        self.keys = [(i % LEDGERS, i // LEDGERS) for i in range(entries)]
        located = {(lid, eid): loc for lid, eid, loc in self.storage._index.all_locations()}
        self.locations: list[Location] = [located[key] for key in self.keys]

    def order(self, reads: int, seed: int) -> list[int]:
        rng = random.Random(seed)
        return [rng.randrange(len(self.keys)) for _ in range(reads)]


def random_read_workload(fixture: ReadFixture, reads: int) -> Callable[[], Sample]:
    def run() -> Sample:
        order = fixture.order(reads, seed=1)
        done = 0
        start = time.perf_counter()
        for index in order:
            ledger_id, entry_id = fixture.keys[index]
            fixture.storage.get_entry(ledger_id, entry_id)
            done += 1
            if done % 1024 == 0 and time.perf_counter() - start > TIME_BUDGET_S:
                break
        return Sample(units=done, seconds=time.perf_counter() - start)

    return run


def pread_baseline(fixture: ReadFixture, reads: int) -> Callable[[], Sample]:
    def run() -> Sample:
        order = fixture.order(reads, seed=1)
        fds = {log_id: os.open(fixture.storage._logs.path(log_id), os.O_RDONLY)
               for log_id in {loc.log_id for loc in fixture.locations}}
        done = 0
        start = time.perf_counter()
        for index in order:
            loc = fixture.locations[index]
            os.pread(fds[loc.log_id], loc.frame_bytes, loc.offset)
            done += 1
            if done % 1024 == 0 and time.perf_counter() - start > TIME_BUDGET_S:
                break
        seconds = time.perf_counter() - start
        for fd in fds.values():
            os.close(fd)
        return Sample(units=done, seconds=seconds)

    return run


def main(argv: Sequence[str] | None = None) -> int:
    h = Harness("bookie_storage", argv)
    write_total = 32 * MIB if h.quick else 256 * MIB
    reads = 20_000 if h.quick else 200_000
    read_entries = 20_000 if h.quick else 100_000
    with tempfile.TemporaryDirectory(prefix="bookie-bench-") as tmp:
        scratch = Scratch(Path(tmp))
        for entry_bytes in (KIB, 64 * KIB):
            h.case(f"add+flush {entry_bytes // KIB} KiB entries",
                   workload=add_flush_workload(scratch, entry_bytes, write_total),
                   baseline=write_fsync_baseline(scratch, write_total),
                   unit="MB/s", scale=1e-6,
                   note="baseline: os.write+fsync of the same bytes, same chunks")
        fixture = ReadFixture(scratch.new(), KIB, read_entries)
        h.case("random read 1 KiB entries",
               workload=random_read_workload(fixture, reads),
               baseline=pread_baseline(fixture, reads),
               unit="entries/s",
               note="read cache off; baseline: os.pread of the same frames")
        fixture.storage.close(flush=False)
    return h.finish()


if __name__ == "__main__":
    sys.exit(main())
