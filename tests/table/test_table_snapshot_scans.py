"""Snapshot scans on real node processes on 127.0.0.1: a partition read page by
page from one point in time while a writer overwrites and adds keys between the
pages (``scan_records(..., snapshot=True)``, what the Spark table reader does by
default); without ``snapshot`` the same read sees the writer's values on later
pages. After the last page no context (checkpoint) is left on any node."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorumlog import node as cluster
from quorumlog.table import ScanItem, TableClient

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
