"""The bookie's background loops besides checkpoints (``_checkpoint.py``).

- GC every ``gc_interval_ms`` (``_gc.py``: deleted ledgers, entry log
  compaction);
- a disk-usage check every ``disk_check_interval_ms``: past the threshold
  the storage turns read-only, and the registration in meta says so;
- the journal watch: a journal that fails (a write or fdatasync error) fails
  the bookie (``BookieService.failed``; the node process exits and is
  restarted, which replays the journal). It waits on the journal's failure
  event, not by polling.

Periodic work is on timers; nothing here polls for a state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from quorumlog.bookie._gc import GcResult
from quorumlog.bookie._journal import Journal
from quorumlog.bookie._registration import Registration
from quorumlog.bookie._storage import LedgerStorage
from quorumlog.errors import QuorumlogError, StorageError
from quorumlog.log import get_logger

_log = get_logger(__name__)


async def gc_loop(gc: Callable[[], Awaitable[GcResult]], *, interval_ms: int,
                  bookie_id: str) -> None:
    """Run ``gc`` every ``interval_ms``; a failure is logged and retried next time."""
    while True:
        await asyncio.sleep(interval_ms / 1000)
        try:
            await gc()
        except QuorumlogError as exc:
            _log.warning("bookie_gc_failed", bookie=bookie_id, error=exc.message)


def check_disk_usage(storage: LedgerStorage, registration: Registration | None) -> None:
    """Measure disk usage now; publish a read-only change in meta."""
    was = storage.read_only
    storage.check_disk_usage()
    if storage.read_only != was and registration is not None:
        registration.read_only_changed()


async def disk_loop(storage: LedgerStorage, registration: Registration | None, *,
                    interval_ms: int) -> None:
    """:func:`check_disk_usage` every ``interval_ms``; a failure is logged."""
    while True:
        await asyncio.sleep(interval_ms / 1000)
        try:
            check_disk_usage(storage, registration)
        except QuorumlogError as exc:
            _log.warning("bookie_disk_check_failed", error=exc.message)


async def watch_journal(journal: Journal, failed: asyncio.Future[None]) -> None:
    """Turn a journal failure into ``failed`` (the node process exits and restarts)."""
    message = await journal.wait_failed()
    if not failed.done():
        failed.set_exception(StorageError(message))
