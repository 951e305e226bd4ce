"""WAL benchmark: append throughput and replay speed against raw-file baselines.

Append: ``Wal.save(None, batch)`` (one write + one fdatasync per batch) for
100 B, 1 KiB and 64 KiB records at 1, 16 and 256 records per batch, next to
the baseline measured in the same run: ``os.write(b"".join(payloads))`` +
``os.fdatasync`` of the same payload bytes, same batching, into a
preallocated file. Throughput counts payload bytes (the WAL's framing is its
overhead). Target: >= 0.90 of the baseline at batch >= 16. For batch >= 16 a
second baseline ("vs same bytes") writes exactly the bytes the WAL writes
(its frames, encoded before the clock starts): that ratio is the WAL's own
work alone, without the 24 bytes of framing per record and the page
straddling they cause.

Replay: ``Wal.open_read_only(dir).read_all()`` over a WAL of 100 B records
(target >= 500,000 records/s) and of 64 KiB records (target >= 0.50 of a
plain sequential read of the same segment files with ``f.read()``).

CPU only: the same saves with ``sync=False``, timed in process CPU time, next
to joining + writing the payload: the WAL's own per-record cost, which is what
remains of the gap at batch 256 once fdatasync is taken out (no target).

Group commit: 64 concurrent ``save_async`` callers of 1 KiB records against
sequential one-record ``os.write`` + ``fdatasync`` (no target; shows how many
callers share each fdatasync).

Every case is bounded in bytes, operations and seconds; ``--quick`` shrinks
them. ``--dir PATH`` puts the files on another file system (default: a temp
directory); ``--only append|replay|cpu|async`` runs one group. On a shared
machine use more repeats (``--repeats 11``): the harness alternates workload
and baseline runs and reports medians.

    ./scripts/uv run --frozen python bench/wal_bench.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import Harness, Sample
from quorumlog.wal import Wal, WalConfig, WalEntry
from quorumlog.wal._encoder import Encoder
from quorumlog.wal._files import SegmentName

KIB = 1024
MIB = 1024 * KIB
RECORD_SIZES_BYTES = (100, KIB, 64 * KIB)
BATCH_SIZES = (1, 16, 256)
APPEND_TARGET_RATIO = 0.90
REPLAY_SMALL_TARGET_RECORDS_PER_S = 500_000
REPLAY_LARGE_TARGET_RATIO = 0.50
ASYNC_CALLERS = 64
# Distinct pre-encoded batches the "same bytes" baseline cycles through.
FRAMED_BATCHES = 4
# Framing bytes an entry can add (length, header, index, pad): sizes the files.
FRAME_OVERHEAD_MAX_BYTES = 31


@dataclass(frozen=True, slots=True)
class Bounds:
    """Per-run limits of one measurement."""

    append_bytes_max: int
    append_batches_max: int
    append_seconds_max: float
    replay_small_records: int
    replay_large_records: int
    async_records: int


FULL = Bounds(256 * MIB, 4000, 0.5, 1_000_000, 2048, 8192)
QUICK = Bounds(32 * MIB, 600, 0.5, 200_000, 512, 2048)


class Scratch:
    """Fresh directories under one root, removed after each run."""

    def __init__(self, root: Path | None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="wal-bench-", dir=root))

    def new(self, name: str) -> Path:
        path = self.root / name
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return path

    def cleanup(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _batches_for(size: int, batch: int, bounds: Bounds) -> int:
    return max(1, min(bounds.append_batches_max, bounds.append_bytes_max // (size * batch)))


def wal_append(scratch: Scratch, size: int, batch: int, bounds: Bounds) -> Sample:
    payload = os.urandom(size)
    count = _batches_for(size, batch, bounds)
    batches = [
        [WalEntry(index=b * batch + i + 1, data=payload) for i in range(batch)]
        for b in range(count)
    ]
    wal = Wal.create(scratch.new("wal"), b"bench")
    written = 0
    start = time.perf_counter()
    for entries in batches:
        wal.save(None, entries)
        written += 1
        if time.perf_counter() - start > bounds.append_seconds_max:
            break
    elapsed = time.perf_counter() - start
    wal.close()
    return Sample(units=written * batch * size, seconds=elapsed)


def raw_append(
    scratch: Scratch, size: int, batch: int, bounds: Bounds, *, framed: bool = False
) -> Sample:
    """os.write + os.fdatasync per batch into a preallocated file.

    ``framed=False``: ``b"".join`` of the payloads (the data the caller has).
    ``framed=True``: the very bytes the WAL writes for that batch (frames
    encoded before the clock starts), so the ratio isolates the WAL's own
    work from the size and page alignment of its format.
    """
    count = _batches_for(size, batch, bounds)
    buffers = _framed_batches(size, batch) if framed else None
    payloads = [os.urandom(size)] * batch
    path = scratch.new("raw") / "data"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.posix_fallocate(fd, 0, count * batch * (size + FRAME_OVERHEAD_MAX_BYTES))
        os.fsync(fd)
        written = 0
        start = time.perf_counter()
        for number in range(count):
            if buffers is None:
                os.write(fd, b"".join(payloads))
            else:
                os.write(fd, buffers[number % len(buffers)])
            os.fdatasync(fd)
            written += 1
            if time.perf_counter() - start > bounds.append_seconds_max:
                break
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
    return Sample(units=written * batch * size, seconds=elapsed)


def _framed_batches(size: int, batch: int) -> list[bytes]:
    """A few batches encoded exactly as the WAL encodes them (reused in turn)."""
    config = WalConfig()
    encoder = Encoder(
        metadata=b"bench", segment=SegmentName(seq=0, index=0), offset=0, crc=0,
        last_index=0, floor=0, state=None, segment_size_bytes=1 << 62,
        record_size_max_bytes=config.record_size_max_bytes,
    )
    payload = os.urandom(size)
    return [
        b"".join(encoder.save(None, [
            WalEntry(index=b * batch + i + 1, data=payload) for i in range(batch)
        ]).buffers)
        for b in range(FRAMED_BATCHES)
    ]


def build_wal(path: Path, size: int, records: int) -> None:
    payload = os.urandom(size)
    batch = max(1, min(4096, 4 * MIB // size))
    with Wal.create(path, b"bench") as wal:
        for first in range(1, records + 1, batch):
            last = min(records, first + batch - 1)
            wal.save(None, [WalEntry(index=i, data=payload) for i in range(first, last + 1)],
                     sync=False)


def wal_replay(path: Path, unit_bytes: int) -> Sample:
    start = time.perf_counter()
    contents = Wal.open_read_only(path).read_all()
    elapsed = time.perf_counter() - start
    units = len(contents.entries) * (unit_bytes or 1)
    return Sample(units=units, seconds=elapsed)


def raw_read(path: Path, records: int, unit_bytes: int) -> Sample:
    start = time.perf_counter()
    for file in sorted(path.glob("*.wal")):
        with open(file, "rb") as f:
            f.read()
    elapsed = time.perf_counter() - start
    return Sample(units=records * (unit_bytes or 1), seconds=elapsed)


async def _async_callers(wal: Wal, records: int, payload: bytes) -> None:
    indexes = iter(range(1, records + 1))

    async def caller() -> None:
        # save_async accepts (checks, encodes, queues) before it first suspends
        # while the queue has room, so taking the index and calling it without
        # an await in between keeps the accept order equal to the index order.
        while (index := next(indexes, None)) is not None:
            await wal.save_async(None, [WalEntry(index=index, data=payload)])

    await asyncio.gather(*(caller() for _ in range(ASYNC_CALLERS)))


def wal_async(scratch: Scratch, bounds: Bounds) -> Sample:
    payload = os.urandom(KIB)
    wal = Wal.create(scratch.new("async"), b"bench")
    start = time.perf_counter()
    asyncio.run(_async_callers(wal, bounds.async_records, payload))
    elapsed = time.perf_counter() - start
    wal.close()
    return Sample(units=bounds.async_records, seconds=elapsed)


def raw_single(scratch: Scratch, bounds: Bounds) -> Sample:
    payload = os.urandom(KIB)
    path = scratch.new("raw1") / "data"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.posix_fallocate(fd, 0, bounds.async_records * KIB)
        os.fsync(fd)
        done = 0
        start = time.perf_counter()
        while done < bounds.async_records:
            os.write(fd, payload)
            os.fdatasync(fd)
            done += 1
            if time.perf_counter() - start > bounds.append_seconds_max:
                break
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
    return Sample(units=done, seconds=elapsed)


def cpu_append(scratch: Scratch, size: int, batch: int, bounds: Bounds, *, wal: bool) -> Sample:
    """Process CPU time of writing batches WITHOUT fdatasync: the WAL's own cost
    (framing, CRC chain, bookkeeping) against joining and writing the payload."""
    payload = os.urandom(size)
    count = _batches_for(size, batch, bounds)
    path = scratch.new("cpu")
    if wal:
        batches = [
            [WalEntry(index=b * batch + i + 1, data=payload) for i in range(batch)]
            for b in range(count)
        ]
        log = Wal.create(path, b"bench")
        start = time.process_time()
        for entries in batches:
            log.save(None, entries, sync=False)
        elapsed = time.process_time() - start
        log.close()
    else:
        payloads = [payload] * batch
        fd = os.open(path / "data", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.posix_fallocate(fd, 0, count * batch * size)
        start = time.process_time()
        for _ in range(count):
            os.write(fd, b"".join(payloads))
        elapsed = time.process_time() - start
        os.close(fd)
    return Sample(units=count * batch * size, seconds=elapsed)


def _cpu_cases(h: Harness, scratch: Scratch, bounds: Bounds) -> None:
    for size in RECORD_SIZES_BYTES:
        label = f"{size // KIB} KiB" if size >= KIB else f"{size} B"
        h.case(
            f"cpu only (no fdatasync) {label} x256",
            workload=partial(cpu_append, scratch, size, 256, bounds, wal=True),
            baseline=partial(cpu_append, scratch, size, 256, bounds, wal=False),
            unit="MB/s",
            scale=1e-6,
            note="process CPU time; explains the fdatasync cases",
        )


def _append_cases(h: Harness, scratch: Scratch, bounds: Bounds) -> None:
    for size in RECORD_SIZES_BYTES:
        for batch in BATCH_SIZES:
            label = f"{size // KIB} KiB" if size >= KIB else f"{size} B"
            target = APPEND_TARGET_RATIO if batch >= 16 else None
            h.case(
                f"append {label} x{batch}",
                workload=partial(wal_append, scratch, size, batch, bounds),
                baseline=partial(raw_append, scratch, size, batch, bounds),
                unit="MB/s",
                scale=1e-6,
                target_ratio=target,
            )
            if batch >= 16:
                h.case(
                    f"append {label} x{batch} vs same bytes",
                    workload=partial(wal_append, scratch, size, batch, bounds),
                    baseline=partial(raw_append, scratch, size, batch, bounds, framed=True),
                    unit="MB/s",
                    scale=1e-6,
                    target_ratio=target,
                    note="baseline writes the WAL's own encoded frames",
                )


def _replay_cases(h: Harness, scratch: Scratch, bounds: Bounds) -> None:
    small = scratch.new("replay-small")
    build_wal(small, 100, bounds.replay_small_records)
    result = h.case(
        "replay 100 B records",
        workload=lambda: wal_replay(small, 0),
        baseline=lambda: raw_read(small, bounds.replay_small_records, 0),
        unit="records/s",
        note=f"target >= {REPLAY_SMALL_TARGET_RECORDS_PER_S:,} records/s (absolute)",
    )
    result.passed = result.workload_median >= REPLAY_SMALL_TARGET_RECORDS_PER_S
    shutil.rmtree(small)
    large = scratch.new("replay-large")
    build_wal(large, 64 * KIB, bounds.replay_large_records)
    h.case(
        "replay 64 KiB records",
        workload=lambda: wal_replay(large, 64 * KIB),
        baseline=lambda: raw_read(large, bounds.replay_large_records, 64 * KIB),
        unit="MB/s",
        scale=1e-6,
        target_ratio=REPLAY_LARGE_TARGET_RATIO,
    )
    shutil.rmtree(large)


def main(argv: list[str] | None = None) -> int:
    h = Harness("wal", argv)
    extra = argparse.ArgumentParser(prog="wal_bench")
    extra.add_argument("--dir", type=Path, default=None, help="where to put the files")
    extra.add_argument("--only", choices=("append", "replay", "async", "cpu"), default=None)
    args = extra.parse_args(h.extra)
    bounds = QUICK if h.quick else FULL
    scratch = Scratch(args.dir)
    try:
        if args.only in (None, "append"):
            _append_cases(h, scratch, bounds)
        if args.only in (None, "replay"):
            _replay_cases(h, scratch, bounds)
        if args.only in (None, "cpu"):
            _cpu_cases(h, scratch, bounds)
        if args.only in (None, "async"):
            h.case(
                f"group commit: {ASYNC_CALLERS} save_async callers, 1 KiB",
                workload=lambda: wal_async(scratch, bounds),
                baseline=lambda: raw_single(scratch, bounds),
                unit="records/s",
                note="baseline: one os.write + fdatasync per record",
            )
    finally:
        scratch.cleanup()
    return h.finish()


if __name__ == "__main__":
    sys.exit(main())
