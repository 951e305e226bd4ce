"""Snapshot scans on real node processes on 127.0.0.1: a partition read page by
page from one point in time while a writer overwrites and adds keys between the
pages (``scan_records(..., snapshot=True)``, what the Spark table reader does by
default); without ``snapshot`` the same read sees the writer's values on later
pages. After the last page no context (checkpoint) is left on any node."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorumlog import node as cluster
from quorumlog.table import ScanItem, TableClient, partition_of

TABLE = "snapscan"
KEYS = 30
PAGE_RECORDS = 10


@pytest.fixture(scope="module")
def cluster_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    directory = tmp_path_factory.mktemp("table-snapshot-scans")
    with cluster.running(directory, 3):
        yield directory


async def _write_all(tables: TableClient, value: bytes, keys: int) -> None:
    await asyncio.gather(*(tables.set(TABLE, b"h%02d" % k, b"s", value)
                           for k in range(keys)))


async def _read_while_writing(tables: TableClient, *, snapshot: bool,
                              value: bytes) -> list[ScanItem]:
    """Read the partition; after the first page, overwrite every key with ``value``
    and add more."""
    pages = tables.scan_records(TABLE, 0, page_records=PAGE_RECORDS, snapshot=snapshot)
    read = [await anext(pages) for _ in range(PAGE_RECORDS)]
    await _write_all(tables, value, KEYS + 5)
    read += [item async for item in pages]
    return read


async def _scenario(cluster_dir: Path) -> None:
    async with TableClient(cluster.meta_addresses(cluster_dir)) as tables:
        await tables.create_table(TABLE, partitions=1, replicas=3)
        await _write_all(tables, b"v1", KEYS)
        read = await _read_while_writing(tables, snapshot=True, value=b"v2")
        assert [(r.hash_key, r.value) for r in read] == [
            (b"h%02d" % k, b"v1") for k in range(KEYS)]
        # The live read pages through a moving partition: later pages show v3.
        mixed = await _read_while_writing(tables, snapshot=False, value=b"v3")
        assert {r.value for r in mixed} == {b"v2", b"v3"} and len(mixed) == KEYS + 5


def test_a_snapshot_scan_reads_one_point_in_time(cluster_dir: Path) -> None:
    asyncio.run(_scenario(cluster_dir))
    scans = list(cluster_dir.glob("node-*/data/table/scans/*"))
    assert scans == [], scans  # the last page closed the context


async def _full_scan_while_writing(cluster_dir: Path) -> None:
    """full_scan(snapshot=True) over two partitions: each partition's pages from
    one point in time while every key is overwritten after the first page."""
    async with TableClient(cluster.meta_addresses(cluster_dir)) as tables:
        await tables.create_table(FULL_TABLE, partitions=2, replicas=3)
        await asyncio.gather(*(tables.set(FULL_TABLE, b"h%02d" % k, b"s", b"old")
                               for k in range(KEYS)))
        rows = tables.full_scan(FULL_TABLE, page_records=4, snapshot=True)
        read = [await anext(rows)]
        await asyncio.gather(*(tables.set(FULL_TABLE, b"h%02d" % k, b"s", b"new")
                               for k in range(KEYS)))
        read += [row async for row in rows]
        # The first partition was read before the writes: all old. The second was
        # opened after them: all new. Never a mix inside one partition.
        assert sorted(h for h, _, _ in read) == [b"h%02d" % k for k in range(KEYS)]
        first = {value for h, _, value in read if partition_of(h, 2) == 0}
        second = {value for h, _, value in read if partition_of(h, 2) == 1}
        assert first == {b"old"} and second == {b"new"}, (first, second)


FULL_TABLE = "snapfull"


def test_full_scan_with_snapshot_reads_each_partition_at_one_point(cluster_dir: Path) -> None:
    asyncio.run(_full_scan_while_writing(cluster_dir))
    assert list(cluster_dir.glob("node-*/data/table/scans/*")) == []


def _cli(cluster_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "quorumlog", "table", *args,
                           "--dir", str(cluster_dir)],
                          capture_output=True, text=True, timeout=60, check=False)


def test_cli_full_scan_prints_records_honours_limit_and_names_an_unknown_table(
        cluster_dir: Path) -> None:
    async def fill() -> None:
        async with TableClient(cluster.meta_addresses(cluster_dir)) as tables:
            await tables.create_table("snapcli", partitions=2, replicas=3)
            await asyncio.gather(*(tables.set("snapcli", b"h%d" % k, b"s", b"v%d" % k)
                                   for k in range(5)))

    asyncio.run(fill())
    done = _cli(cluster_dir, "full-scan", "snapcli", "--snapshot")
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == [f"h{k}\ts\tv{k}" for k in range(5)]
    limited = _cli(cluster_dir, "full-scan", "snapcli", "--limit", "2")
    assert limited.returncode == 0 and len(limited.stdout.splitlines()) == 2, limited
    unknown = _cli(cluster_dir, "full-scan", "no-such-table")
    assert unknown.returncode == 1 and "no-such-table" in unknown.stderr, unknown
    assert "Traceback" not in unknown.stderr
