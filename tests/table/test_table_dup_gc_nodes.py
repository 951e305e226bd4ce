"""Tombstone collection on a real node process (docs/duplication.md,
"Tombstone GC"): a tombstone goes after tombstone_gc_delay_ms and not before
(a late duplicate write older than it loses to it meanwhile, and wins once it
is gone), and with a paused duplication a tombstone the duplication has not
shipped stays while an older one goes.

A tombstone is seen from outside by a probe: a duplicate write (cluster 2)
with a timetag just older than it. While the tombstone exists, last writer
wins drops the probe; once it is collected, the probe's value appears.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from unittest import mock

import pytest

from quorumlog import node as cluster
from quorumlog.table import BlockingTableClient, DuplicateCommand, DupState, make_timetag

DELAY_MS = 1_000
ENV = {"QUORUMLOG_TABLE__TOMBSTONE_GC_DELAY_MS": str(DELAY_MS),
       "QUORUMLOG_TABLE__TOMBSTONE_GC_INTERVAL_MS": "100",
       "QUORUMLOG_TABLE__DUP_REFRESH_INTERVAL_MS": "100",
       # a remote nobody listens on: the duplication never confirms anything new
       "QUORUMLOG_CLUSTERS__NOWHERE": '["127.0.0.1:9"]'}
GONE_DEADLINE_S = 30.0
POLL_INTERVAL_S = 0.1
REMOTE_CLUSTER_ID = 2
TABLE = "gc"


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BlockingTableClient]:
    directory = tmp_path_factory.mktemp("table-gc")
    with mock.patch.dict(os.environ, ENV), cluster.running(directory, 1) as meta, \
            BlockingTableClient(meta) as client:
        client.create_table(TABLE, partitions=1, replicas=1)
        yield client


def now_us() -> int:
    return time.time_ns() // 1000


def probe(client: BlockingTableClient, sort_key: bytes, timestamp_us: int) -> bool:
    """A late duplicate write older than the tombstone; True if it was applied
    (the tombstone is gone)."""
    client.duplicate(TABLE, DuplicateCommand(b"h", (
        (sort_key, b"late", 0, make_timetag(timestamp_us, REMOTE_CLUSTER_ID)),)))
    return client.get(TABLE, b"h", sort_key) == b"late"


def wait_collected(client: BlockingTableClient, sort_key: bytes, timestamp_us: int) -> None:
    deadline = time.monotonic() + GONE_DEADLINE_S
    while not probe(client, sort_key, timestamp_us):
        assert time.monotonic() < deadline, f"tombstone of {sort_key!r} never collected"
        time.sleep(POLL_INTERVAL_S)


def test_a_tombstone_goes_after_the_delay_and_wins_until_then(
        tables: BlockingTableClient) -> None:
    tables.set(TABLE, b"h", b"a", b"v")
    before_us = now_us()
    tables.delete(TABLE, b"h", b"a")
    deleted = time.monotonic()
    assert not probe(tables, b"a", before_us - 1000)  # the tombstone wins (LWW)
    wait_collected(tables, b"a", before_us - 1000)
    assert time.monotonic() - deleted >= DELAY_MS / 1000 - 0.05  # not before the delay


def test_a_paused_duplication_keeps_the_tombstones_it_has_not_shipped(
        tables: BlockingTableClient) -> None:
    tables.set(TABLE, b"h", b"b", b"v")
    record = tables.add_dup(TABLE, "nowhere")
    tables.update_dup(TABLE, record.dup_id, state=DupState.PAUSE)
    before_us = now_us()
    tables.delete(TABLE, b"h", b"b")  # after the duplication's start: not shipped
    # A tombstone that came from the other cluster is never shipped again; it
    # is older than the local one, so only the delay holds it.
    tables.duplicate(TABLE, DuplicateCommand(b"h", (
        (b"e", b"", 0, make_timetag(before_us - 1000, REMOTE_CLUSTER_ID, deleted=True)),)))
    wait_collected(tables, b"e", before_us - 2000)  # collections ran past the delay
    assert not probe(tables, b"b", before_us - 1000)
    assert tables.get(TABLE, b"h", b"b") is None
    tables.update_dup(TABLE, record.dup_id, state=DupState.REMOVED)
    wait_collected(tables, b"b", before_us - 1000)  # removal releases it
