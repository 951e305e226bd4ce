"""Snapshot scan contexts (``table/_scan_contexts.py``) over real RocksDB stores:
a context's view stays as it was when opened while the replica moves on; idle
contexts expire; the count is bounded; a restart deletes what was left."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from quorumlog.table import SetCommand, TableEntry, TableStore
from quorumlog.table._errors import (
    BadTableRequestError,
    ScanContextExpiredError,
    ScanContextsFullError,
)
from quorumlog.table._scan_contexts import ScanContexts

NOW_S = 1_700_000_000
IDLE_MS = 1_000


class Clock:
    def __init__(self) -> None:
        self.now_ms = 0

    def __call__(self) -> int:
        return self.now_ms


def _write(store: TableStore, decree: int, value: bytes, keys: int) -> None:
    commands = tuple(SetCommand(hash_key=b"h%02d" % k, sort_key=b"s", value=value)
                     for k in range(keys))
    store.apply(decree, TableEntry(NOW_S * 1_000_000 + decree, commands))


def _values(view: TableStore) -> list[tuple[bytes, bytes]]:
    page = view.full_scan(NOW_S, limit=1000)
    return [(item.hash_key, item.value) for item in page.items]


def test_a_context_reads_the_store_as_it_was_when_opened(tmp_path: Path) -> None:
    store = TableStore(tmp_path / "replica", cluster_id=1)
    contexts = ScanContexts(tmp_path / "scans", clock_ms=Clock())
    _write(store, 1, b"old", 5)
    context = contexts.open(7, store)
    _write(store, 2, b"new", 8)  # overwrites and adds after the context opened
    assert _values(contexts.get(context, 7)) == [(b"h%02d" % k, b"old") for k in range(5)]
    assert _values(store) == [(b"h%02d" % k, b"new") for k in range(8)]
    with pytest.raises(BadTableRequestError, match="another partition"):
        contexts.get(context, 8)
    contexts.close(context)
    assert len(contexts) == 0 and not any((tmp_path / "scans").iterdir())
    with pytest.raises(ScanContextExpiredError, match="read the partition again"):
        contexts.get(context, 7)
    store.close()


def test_idle_contexts_expire_and_their_files_go(tmp_path: Path) -> None:
    store = TableStore(tmp_path / "replica", cluster_id=1)
    _write(store, 1, b"v", 3)
    clock = Clock()
    contexts = ScanContexts(tmp_path / "scans", clock_ms=clock, idle_ms=IDLE_MS)
    used, idle = contexts.open(7, store), contexts.open(7, store)
    clock.now_ms = IDLE_MS - 1
    contexts.get(used, 7)  # used: its idle time starts again
    clock.now_ms = IDLE_MS
    assert _values(contexts.get(used, 7))
    with pytest.raises(ScanContextExpiredError):
        contexts.get(idle, 7)
    assert len(contexts) == 1 and len(list((tmp_path / "scans").iterdir())) == 1
    contexts.drop_group(7)  # the replica goes away
    assert len(contexts) == 0
    store.close()


def test_the_sweep_closes_an_abandoned_context_without_another_scan(tmp_path: Path) -> None:
    """A scan abandoned after its first page, on a node that serves no more
    scans: the node's sweep task closes it and deletes its checkpoint."""
    store = TableStore(tmp_path / "replica", cluster_id=1)
    _write(store, 1, b"v", 3)
    clock = Clock()
    contexts = ScanContexts(tmp_path / "scans", clock_ms=clock, idle_ms=400)
    assert contexts.sweep_interval_s() == pytest.approx(0.1)
    kept, abandoned = contexts.open(7, store), contexts.open(7, store)

    async def scenario() -> None:
        sweeper = asyncio.create_task(contexts.sweep_forever())
        try:
            clock.now_ms = 300
            contexts.get(kept, 7)
            clock.now_ms = 400  # the abandoned one is idle for 400 ms now, kept for 100
            async with asyncio.timeout(5):
                while len(contexts) != 1:
                    await asyncio.sleep(0.02)
        finally:
            sweeper.cancel()

    asyncio.run(scenario())
    assert _values(contexts.get(kept, 7))
    with pytest.raises(ScanContextExpiredError):
        contexts.get(abandoned, 7)
    assert [p.name for p in (tmp_path / "scans").iterdir()] == [f"{kept:016x}"]
    contexts.close_all()
    store.close()


def test_the_count_is_bounded_and_a_restart_deletes_leftovers(tmp_path: Path) -> None:
    store = TableStore(tmp_path / "replica", cluster_id=1)
    _write(store, 1, b"v", 3)
    contexts = ScanContexts(tmp_path / "scans", clock_ms=Clock(), contexts_max=2)
    contexts.open(7, store)
    contexts.open(7, store)
    with pytest.raises(ScanContextsFullError, match="retry") as refused:
        contexts.open(7, store)
    assert refused.value.retriable
    # A restart: the files of the contexts the old process held are deleted.
    again = ScanContexts(tmp_path / "scans", clock_ms=Clock(), contexts_max=2)
    assert len(again) == 0 and not (tmp_path / "scans").exists()
    contexts.close_all()
    store.close()
