"""A table whose nodes' disks fill up (real processes, each node's data on a
small tmpfs): the partition leader refuses writes past
``disk_usage_threshold_fraction`` with DiskInsufficientError before any node
runs out of space; reads and deletes go on; nothing acknowledged is lost; once
the disks have room again, writes are taken again.

Before, every replica's disk filled together (they hold the same data) and each
node failed at its first ENOSPC ("IO error: No space left on device" from
RocksDB, then ``node_failed``): the whole table stopped.

Needs to mount tmpfs (root); skipped elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest

from quorumlog import node as cluster
from quorumlog.table import VALUE_BYTES_MAX, BlockingTableClient, DiskInsufficientError

NODES = 3
DISK_BYTES = 256 * 1024 * 1024
GROWN_DISK_BYTES = 1024 * 1024 * 1024
THRESHOLD = 0.6  # refused past 154 MiB: far from the 256 MiB where a node would fail
LWM = 0.5
WRITES_MAX = 400  # bounds the fill loop (it is refused after about 40)
DEADLINE_S = 120.0


def _mount(directory: Path, size: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                           str(directory)], capture_output=True, text=True, check=False)


def _grow(directory: Path, size: int) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(directory)], check=True)


@pytest.fixture(scope="module")
def small_disks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[Path]]]:
    directory = tmp_path_factory.mktemp("disk-full") / "cluster"
    disks = [directory / f"node-{n}" / "data" for n in range(1, NODES + 1)]
    mounted: list[Path] = []
    try:
        for disk in disks:
            disk.mkdir(parents=True)
            out = _mount(disk, DISK_BYTES)
            if out.returncode != 0:
                pytest.skip(f"cannot mount tmpfs here: {out.stderr.strip()}")
            mounted.append(disk)
        env = {"QUORUMLOG_TABLE__DISK_USAGE_THRESHOLD_FRACTION": str(THRESHOLD),
               "QUORUMLOG_TABLE__DISK_USAGE_LWM_FRACTION": str(LWM)}
        with mock.patch.dict(os.environ, env), cluster.running(directory, NODES):
            yield directory, disks
    finally:
        for disk in mounted:
            subprocess.run(["umount", "-l", str(disk)], check=False)


def test_writes_are_refused_before_the_disks_fill_and_taken_again_after(
        small_disks: tuple[Path, list[Path]]) -> None:
    directory, disks = small_disks
    value = b"v" * VALUE_BYTES_MAX
    with BlockingTableClient(cluster.meta_addresses(directory)) as tables:
        tables.create_table("full", partitions=1, replicas=NODES)
        acked: list[bytes] = []
        refused: DiskInsufficientError | None = None
        deadline = time.monotonic() + DEADLINE_S
        for i in range(WRITES_MAX):
            assert time.monotonic() < deadline, f"{len(acked)} writes, never refused"
            try:
                tables.set("full", b"k%d" % i, b"s", value)
            except DiskInsufficientError as exc:
                refused = exc
                break
            acked.append(b"k%d" % i)
        assert refused is not None, f"{len(acked)} writes of 1 MiB, none refused"
        assert "disk_usage_threshold_fraction" in str(refused), refused
        assert len(acked) > 10, len(acked)
        # Nothing failed, nothing acknowledged is lost, reads and deletes go on.
        for node in cluster.load(directory):
            assert b'"node_failed"' not in Path(node.log).read_bytes(), node
        with pytest.raises(DiskInsufficientError):
            tables.multi_set("full", b"other", {b"a": b"1"})
        assert "1.0" in _disk_full_gauges(directory).values(), _disk_full_gauges(directory)
        assert all(tables.get("full", key, b"s") == value for key in acked)
        tables.delete("full", acked[0], b"s")
        assert tables.get("full", acked[0], b"s") is None

        for disk in disks:  # more room: below the low-water mark on every node
            _grow(disk, GROWN_DISK_BYTES)
        while True:
            with contextlib.suppress(DiskInsufficientError):
                tables.set("full", b"after", b"s", b"taken again")
                break
            assert time.monotonic() < deadline, "writes still refused after the disks grew"
            time.sleep(0.2)
        assert tables.get("full", b"after", b"s") == b"taken again"
        assert set(_disk_full_gauges(directory).values()) == {"0.0"}


def _disk_full_gauges(directory: Path) -> dict[str, str]:
    """quorumlog_table_disk_full of every node, as its metrics endpoint shows it."""
    gauges = {}
    for node in cluster.load(directory):
        with urllib.request.urlopen(f"http://{node.metrics}/metrics", timeout=10) as page:
            for line in page.read().decode().splitlines():
                if line.startswith("quorumlog_table_disk_full{"):
                    gauges[line.split('node="')[1].split('"')[0]] = line.split()[-1]
    return gauges
