"""Snapshot scans: a partition read page by page from one point in time.

A paged scan of a live partition can see a mix: a writer that overwrites keys
between two pages shows old values before and new ones after. Pegasus keeps
server-side scanner contexts for this; so do we. The first page of a snapshot
scan (``TableScanRequest.open_context``) takes a RocksDB checkpoint of the
replica's store (hard links, no copy; after the ReadIndex round of a default
read, so the view holds every write acknowledged before the scan began) and
opens it as a store of its own; every later page (``context_id``) reads that
store, and the last page closes it.

Why a checkpoint and not a RocksDB snapshot: rocksdict 0.3.29's
``Snapshot.iter`` drops the snapshot from its read options (point gets honour
it, iterators read the live database), so a snapshot cannot page.

Bounds: at most ``scan_contexts_max`` contexts per node (another open is
refused, retriable), and a context unused for ``scan_context_idle_ms`` is
closed and its files deleted, checked whenever a scan request arrives and by
a sweep every quarter of that time (:meth:`ScanContexts.sweep_forever`), so a
scan abandoned on a node that serves no more scans does not pin its
checkpoint's files (hard links to SSTs compaction has since dropped) forever. A
context id is random (63 bits), so after a restart (which deletes every
context's files) an old id is unknown, never someone else's context.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from quorumlog.log import get_logger
from quorumlog.table._errors import (
    BadTableRequestError,
    ScanContextExpiredError,
    ScanContextsFullError,
)
from quorumlog.table._store import TableStore

_log = get_logger(__name__)

SCAN_CONTEXTS_MAX_DEFAULT = 64  # open snapshot scans per node (each pins a checkpoint)
SCAN_CONTEXT_IDLE_MS_DEFAULT = 60_000  # a context unused this long is closed


@dataclass(slots=True)
class _Context:
    group_id: int
    view: TableStore
    last_used_ms: int


class ScanContexts:
    """The open snapshot scans of one table node (see the module docstring)."""

    def __init__(self, directory: Path, *, clock_ms: Callable[[], int],
                 contexts_max: int = SCAN_CONTEXTS_MAX_DEFAULT,
                 idle_ms: int = SCAN_CONTEXT_IDLE_MS_DEFAULT) -> None:
        self.directory = directory
        self._clock_ms = clock_ms
        self.contexts_max = contexts_max
        self.idle_ms = idle_ms
        self._open: dict[int, _Context] = {}
        shutil.rmtree(directory, ignore_errors=True)  # an earlier run's contexts

    def __len__(self) -> int:
        return len(self._open)

    def open(self, group_id: int, store: TableStore) -> int:
        """A new context over ``store`` as it is now; its id."""
        self.expire()
        if len(self._open) >= self.contexts_max:
            raise ScanContextsFullError(
                f"this node has {self.contexts_max} snapshot scans open (the table "
                "config's scan_contexts_max); retry when some finish or expire")
        context_id = secrets.randbits(63) or 1
        while context_id in self._open:
            context_id = secrets.randbits(63) or 1
        path = self.directory / f"{context_id:016x}"
        store.checkpoint(path)
        view = TableStore(path, cluster_id=store.cluster_id)
        self._open[context_id] = _Context(group_id, view, self._clock_ms())
        return context_id

    def get(self, context_id: int, group_id: int) -> TableStore:
        """The view of an open context of ``group_id`` (and marks it used)."""
        self.expire()
        context = self._open.get(context_id)
        if context is None:
            raise ScanContextExpiredError(
                f"snapshot scan context {context_id} is gone (unused for "
                f"{self.idle_ms} ms, or its node restarted, or its replica moved); "
                "read the partition again")
        if context.group_id != group_id:
            raise BadTableRequestError(
                f"snapshot scan context {context_id} belongs to another partition")
        context.last_used_ms = self._clock_ms()
        return context.view

    def close(self, context_id: int) -> None:
        context = self._open.pop(context_id, None)
        if context is not None:
            context.view.close()
            shutil.rmtree(context.view.path, ignore_errors=True)

    def drop_group(self, group_id: int) -> None:
        """Every context of a replica that goes away."""
        for context_id in [c for c, ctx in self._open.items() if ctx.group_id == group_id]:
            self.close(context_id)

    def expire(self) -> None:
        now = self._clock_ms()
        idle = [c for c, ctx in self._open.items() if now - ctx.last_used_ms >= self.idle_ms]
        for context_id in idle:
            _log.info("table_scan_context_expired", context=context_id,
                      group=self._open[context_id].group_id)
            self.close(context_id)

    def sweep_interval_s(self) -> float:
        """How often :meth:`sweep_forever` looks: a quarter of the idle time,
        between 0.1 s and 10 s."""
        return min(10.0, max(0.1, self.idle_ms / 4000))

    async def sweep_forever(self) -> None:
        """Expire idle contexts every :meth:`sweep_interval_s` (a node task)."""
        while True:
            await asyncio.sleep(self.sweep_interval_s())
            if self._open:
                self.expire()

    def close_all(self) -> None:
        for context_id in list(self._open):
            self.close(context_id)
