"""The bookie server role: ``BookieService`` composes the bookie's parts.

One module per responsibility, after BookKeeper's ``bookie/`` and ``proto/``:

- ``_handlers.py``: one thin handler per request type;
- ``_rules.py``: what each request changes and journals (I/O-free, shared
  with the simulated bookie);
- ``_backpressure.py``: adds wait for a flush instead of blocking;
- ``_long_poll.py``: parked long-poll LAC reads, woken by LAC changes;
- ``_checkpoint.py``: the flush task (journal durable to P, storage flushed
  with checkpoint P, journal released to P);
- ``_maintenance.py``: GC and disk-usage timers, the journal-failure watch;
- ``_replay.py``: a restart re-applies the journal after the checkpoint.

This module opens and closes them (identity check, journal, storage, replay,
registration in meta, tasks), answers status and runs a bookie in-process
(``run_bookie``). Maintenance (flush, compaction, scrub, opening and closing)
runs on a small thread pool; the event loop only does in-memory work and
page-cache reads.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from quorumlog import rpc
from quorumlog.bookie._backpressure import AddBackpressure
from quorumlog.bookie._bookie_config import BookieConfig
from quorumlog.bookie._checkpoint import Checkpointer
from quorumlog.bookie._cookie import Cookie, establish_identity
from quorumlog.bookie._gc import GarbageCollector, GcResult
from quorumlog.bookie._handlers import RequestHandlers
from quorumlog.bookie._journal import (
    DeleteRecord,
    Journal,
    encode_control,
)
from quorumlog.bookie._limbo import LimboRecord, limbo_key
from quorumlog.bookie._long_poll import LacWaiters
from quorumlog.bookie._maintenance import check_disk_usage, disk_loop, gc_loop, watch_journal
from quorumlog.bookie._metrics import (
    JOURNAL_BATCH_RECORDS,
    JOURNAL_FSYNC_SECONDS,
    BookieCounters,
    register_source,
    unregister_source,
)
from quorumlog.bookie._registration import Registration
from quorumlog.bookie._replay import replay
from quorumlog.bookie._storage import (
    INDEX_DIRECTORY,
    DiskUsageProbe,
    LedgerStorage,
)
from quorumlog.errors import (
    ConfigError,
    DeadlineExceededError,
    QuorumlogError,
    TransientError,
    UsageError,
)
from quorumlog.log import get_logger
from quorumlog.meta import MetaClient

_log = get_logger(__name__)

MAINTENANCE_THREADS = 2  # a flush and a compaction/scrub may run at once


class BookieService:
    """The bookie role of one node process (see the module docstring).

    ``handlers()`` for the rpc server (requests before ``start`` get a
    retriable error), ``await start(bookie_id)`` (the id is the rpc address
    the server listens on; refuses with InvalidCookieError when the
    directories are not this bookie's, see ``_cookie.py``), ``await close()``.
    ``meta_addresses=None`` runs without meta: no registration (adds
    accepted), no ledger deletion by GC, and the cookie copies are only
    compared with each other.
    """

    def __init__(
        self,
        config: BookieConfig,
        *,
        meta_addresses: list[str] | None,
        disk_usage_probe: DiskUsageProbe | None = None,
    ) -> None:
        config.validate()
        if not config.journal_dir or not config.ledger_dir:
            raise ConfigError("a bookie needs journal_dir and ledger_dir ([bookie] section)")
        journal_dir = Path(config.journal_dir).resolve()
        ledger_dir = Path(config.ledger_dir).resolve()
        if journal_dir in (ledger_dir, ledger_dir / INDEX_DIRECTORY):
            raise ConfigError(
                f"journal_dir {journal_dir} is ledger_dir {ledger_dir} or its index directory: "
                "they must be different directories (each holds its own copy of the bookie's "
                "cookie, and the journal's files must not mix with the ledger storage's)")
        self.config = config
        self._meta_addresses = list(meta_addresses) if meta_addresses else None
        self._probe = disk_usage_probe
        self.bookie_id = ""
        self.counters = BookieCounters()
        self._storage: LedgerStorage | None = None
        self._journal: Journal | None = None
        self._registration: Registration | None = None
        self._meta: MetaClient | None = None
        self._gc: GarbageCollector | None = None
        self._executor = ThreadPoolExecutor(max_workers=MAINTENANCE_THREADS,
                                            thread_name_prefix="bookie-maintenance")
        self._tasks: list[asyncio.Task[None]] = []
        self.lac_waiters = LacWaiters(config.long_poll_parked_max)
        self.backpressure = AddBackpressure(config.storage.write_cache_half_bytes)
        self._checkpointer: Checkpointer | None = None
        self._handlers = RequestHandlers(self)
        self._cookie: Cookie | None = None
        self.limbo_floor = 0  # ledger ids below it: never "no such entry" (see _limbo.py)
        self._started = False
        self._running = asyncio.Event()  # set once started
        self._closing = False
        self._failed: asyncio.Future[None] | None = None

    # ------------------------------------------------------------------ wiring

    def handlers(self) -> dict[type[rpc.Request[Any]], Any]:
        return self._handlers.table()

    @property
    def executor(self) -> ThreadPoolExecutor:
        """The maintenance threads (flush, compaction, scrub, open and close)."""
        return self._executor

    @property
    def storage(self) -> LedgerStorage:
        if self._storage is None:
            raise TransientError("the bookie is starting; retry shortly")
        return self._storage

    @property
    def journal(self) -> Journal:
        if self._journal is None:
            raise TransientError("the bookie is starting; retry shortly")
        return self._journal

    @property
    def failed(self) -> asyncio.Future[None]:
        """Done with an exception when the journal fails (restart the bookie)."""
        if self._failed is None:
            self._failed = asyncio.get_running_loop().create_future()
        return self._failed

    @property
    def registered(self) -> bool:
        return self._registration is None or self._registration.registered

    @property
    def session_id(self) -> int:
        return self._registration.session_id if self._registration is not None else 0

    @property
    def writable(self) -> bool:
        return self._started and self.registered and not self.storage.read_only

    # ------------------------------------------------------------------ start

    async def start(self, bookie_id: str) -> None:
        """Check the identity (cookie), open journal and storage, replay, start
        maintenance and registration. InvalidCookieError: not this bookie's data."""
        if self._started or self._closing:
            raise UsageError("a BookieService starts once")
        loop = asyncio.get_running_loop()
        self.bookie_id = bookie_id
        cookie = await self._establish_identity(bookie_id)
        self._cookie = cookie
        journal = await loop.run_in_executor(self._executor, self._open_journal)
        try:
            storage = await loop.run_in_executor(self._executor, self._open_storage)
        except BaseException:
            await loop.run_in_executor(self._executor, journal.close)
            raise
        try:
            checkpoint = await loop.run_in_executor(self._executor, replay, journal, storage)
        except BaseException:
            await loop.run_in_executor(self._executor, _close_quietly, journal, storage)
            raise
        self._journal, self._storage = journal, storage
        self._checkpointer = Checkpointer(
            storage, journal, checkpoint=checkpoint, backpressure=self.backpressure,
            counters=self.counters, executor=self._executor, bookie_id=bookie_id)
        journal.start(loop)
        if self._meta_addresses:
            self._meta = MetaClient(self._meta_addresses)
            self._registration = Registration(
                self._meta_addresses, bookie_id=bookie_id, instance_id=cookie.instance_id,
                labels=self.config.labels, ttl_ms=self.config.session_ttl_ms,
                retry_ms=self.config.registration_retry_ms, read_only=lambda: storage.read_only)
        self._gc = GarbageCollector(
            storage, self._meta, live_ratio_threshold=self.config.gc_live_ratio_threshold,
            executor=self._executor, delete_ledger=self.delete_ledger, flush=self.flush)
        self._started = True
        register_source(self)
        config = self.config
        for coro in (
            self._checkpointer.run(config.flush_interval_ms),
            gc_loop(self.gc, interval_ms=config.gc_interval_ms, bookie_id=bookie_id),
            disk_loop(storage, self._registration, interval_ms=config.disk_check_interval_ms),
            watch_journal(journal, self.failed),
        ):
            self._tasks.append(loop.create_task(coro))
        self._running.set()
        if self._registration is not None:
            self._registration.start()
        _log.info("bookie_started", bookie=bookie_id, instance=cookie.instance_id,
                  journal_dir=self.config.journal_dir, ledger_dir=self.config.ledger_dir,
                  ledgers=len(storage.ledger_ids()), checkpoint=checkpoint)

    async def _establish_identity(self, bookie_id: str) -> Cookie:
        """The cookie check, before anything is opened or served (see _cookie.py)."""
        if not self._meta_addresses:
            return await establish_identity(self.config, bookie_id, None, self._executor)
        timeout_s = self.config.identity_check_timeout_ms / 1000
        meta = MetaClient(self._meta_addresses, deadline_s=timeout_s)
        try:
            cookie = await establish_identity(self.config, bookie_id, meta, self._executor)
            limbo = await meta.get(limbo_key(bookie_id))
            if limbo is not None:
                record = LimboRecord.decode(limbo.value)
                self.limbo_floor = record.ledger_id_floor
                _log.warning("bookie_in_limbo", bookie=bookie_id,
                             ledger_id_floor=record.ledger_id_floor,
                             reason="re-added after losing its data: entries of older "
                             "ledgers it does not hold are answered 'unknown', never "
                             "'no such entry'")
            return cookie
        except DeadlineExceededError as exc:
            raise DeadlineExceededError(
                f"bookie {bookie_id} could not check its identity (cookie) in meta at "
                f"{', '.join(self._meta_addresses)} within {timeout_s:.0f} s ({exc.message}); "
                "it serves nothing until it can, since wiped directories must not answer as "
                "the old bookie. Check that meta is up and reachable, then start it again"
            ) from None
        finally:
            await meta.close()

    @property
    def instance_id(self) -> str:
        """The instance id of the bookie's cookie ("" before start)."""
        return self._cookie.instance_id if self._cookie is not None else ""

    def _open_journal(self) -> Journal:
        cfg = self.config
        return Journal.open(
            cfg.journal_dir, max_wait_us=cfg.journal_max_wait_us,
            max_batch_bytes=cfg.journal_max_batch_bytes,
            queue_max_bytes=cfg.journal_queue_max_bytes,
            segment_size_bytes=cfg.journal_segment_size_bytes,
            on_fsync=JOURNAL_FSYNC_SECONDS.observe,
            on_batch=lambda records, _bytes: JOURNAL_BATCH_RECORDS.observe(records),
        )

    def _open_storage(self) -> LedgerStorage:
        return LedgerStorage(self.config.ledger_dir, self.config.storage,
                             disk_usage_probe=self._probe)

    async def wait_registered(self, timeout_s: float) -> None:
        """Wait until registered in meta (at once without meta); DeadlineExceededError."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._running.wait()
                if self._registration is not None:
                    await self._registration.wait_registered()
        except TimeoutError:
            raise DeadlineExceededError(
                f"bookie {self.bookie_id} did not register in meta within {timeout_s} s"
            ) from None

    # ------------------------------------------------------------------ close

    async def unregister(self) -> None:
        """Leave meta now: revoke the session, so the registration vanishes at once.

        The first step of a graceful stop, taken while meta (maybe in this
        very process) is still served; from here on adds are refused, so
        writers move to other bookies. ``close`` does it too, if not done.
        """
        if self._registration is not None:
            await self._registration.close()

    async def close(self) -> None:
        """Stop tasks and registration, flush (checkpoint), close journal and storage."""
        if self._closing:
            return
        self._closing = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.lac_waiters.release_all()
        self.backpressure.close()
        if self._registration is not None:
            await self._registration.close()
        loop = asyncio.get_running_loop()
        if self._started:
            with contextlib.suppress(QuorumlogError):
                await self.flush()
            journal, storage = self.journal, self.storage
            await loop.run_in_executor(self._executor, _close_quietly, journal, storage)
            unregister_source(self)
        if self._meta is not None:
            await self._meta.close()
        self._executor.shutdown(wait=True)
        _log.info("bookie_stopped", bookie=self.bookie_id)

    # ------------------------------------------------------------------ status

    @property
    def checkpoint(self) -> int:
        """The journal position the ledger storage holds everything up to."""
        return self._checkpointer.checkpoint if self._checkpointer is not None else 0

    def stats(self) -> dict[str, int]:
        """Storage, journal and server counters, flat (BookieStatusResponse.stats)."""
        out = {f"storage_{k}": int(v) for k, v in asdict(self.storage.stats).items()}
        journal = self.journal
        out.update(
            journal_fsyncs=journal.fsyncs, journal_batches=journal.batches,
            journal_records=journal.records_written, journal_bytes=journal.bytes_written,
            journal_queued_bytes=journal.queued_bytes, journal_last_index=journal.last_index,
            checkpoint_index=self.checkpoint, write_cache_bytes=self.storage.write_cache_bytes,
            adds_ok=self.counters.adds_ok, adds_failed=self.counters.adds_failed,
            long_polls_parked=self.counters.long_polls_parked,
            flushes=self.counters.flushes, gc_runs=self.counters.gc_runs,
            gc_deleted_ledgers=self.counters.gc_deleted_ledgers,
            gc_compacted_logs=self.counters.gc_compacted_logs,
            gc_reclaimed_bytes=self.counters.gc_reclaimed_bytes,
            session_id=self.session_id,
        )
        return out

    def gauges(self) -> dict[str, float]:
        """Read by the metrics collector at scrape time."""
        storage, journal = self._storage, self._journal
        if storage is None or journal is None:
            return {}
        stats = storage.stats
        return {
            "long_polls_parked": self.counters.long_polls_parked,
            "journal_queued_bytes": journal.queued_bytes,
            "checkpoint_index": self.checkpoint,
            "gc_running": 1.0 if self._gc is not None and self._gc.running else 0.0,
            "read_only": 1.0 if storage.read_only else 0.0,
            "registered": 1.0 if self.registered else 0.0,
            "write_cache_bytes": storage.write_cache_bytes,
            "ledgers": len(storage.ledger_ids()),
            "disk_usage_ratio": storage.disk_usage(),  # one statvfs per scrape
            "hits_write": stats.write_cache_hits,
            "hits_read": stats.read_cache_hits,
            "hits_log": stats.entry_log_reads,
        }

    # ------------------------------------------------------------------ maintenance

    async def flush(self) -> None:
        """Checkpoint: journal durable to P, storage flushed with P, journal released to P."""
        if self._checkpointer is None:
            raise TransientError("the bookie is starting; retry shortly")
        await self._checkpointer.flush()

    async def gc(self) -> GcResult:
        gc = self._gc
        if gc is None:
            raise TransientError("the bookie is starting; retry shortly")
        result = await gc.run()
        self.counters.gc_runs += 1
        self.counters.gc_deleted_ledgers += result.deleted_ledgers
        self.counters.gc_compacted_logs += result.compacted_logs
        self.counters.gc_reclaimed_bytes += result.reclaimed_bytes
        return result

    def delete_ledger(self, ledger_id: int) -> None:
        """Delete locally and journal it (so a replay does not bring it back): GC,
        and an extra copy auto-recovery removes."""
        self._handlers.keyed.discard(ledger_id)
        if self.storage.delete_ledger(ledger_id):
            self.journal.append_quiet(encode_control(DeleteRecord(ledger_id)))
            self._handlers.wake_lac(ledger_id)

    def check_disk_usage(self) -> None:
        """Measure disk usage now and publish a read-only change (tests, admin)."""
        check_disk_usage(self.storage, self._registration)


def _close_quietly(journal: Journal, storage: LedgerStorage) -> None:
    try:
        journal.close()
    finally:
        storage.close(flush=True)


# ---------------------------------------------------------------------- in-process


def local_config(directory: str | Path, **changes: Any) -> BookieConfig:
    """A BookieConfig with journal and ledgers under ``directory`` (tests, tools)."""
    base = Path(directory)
    return BookieConfig(journal_dir=str(base / "journal"),
                        ledger_dir=str(base / "ledgers")).replace(**changes)


@dataclass(frozen=True, slots=True)
class LocalBookie:
    """A bookie running in this process (``run_bookie``)."""

    address: str
    service: BookieService
    server: rpc.Server


@asynccontextmanager
async def run_bookie(
    config: BookieConfig,
    meta_addresses: list[str] | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    rpc_config: rpc.RpcConfig | None = None,
    disk_usage_probe: DiskUsageProbe | None = None,
    wait_registered_s: float = 30.0,
) -> AsyncIterator[LocalBookie]:
    """Run a bookie (rpc server + BookieService) on this event loop.

    With ``meta_addresses`` it registers in meta and the context is entered
    once registered. On exit the server stops, then the bookie flushes and
    closes (a later ``run_bookie`` on the same directories replays nothing).
    """
    service = BookieService(config, meta_addresses=meta_addresses,
                            disk_usage_probe=disk_usage_probe)
    server = rpc.Server(service.handlers(), config=rpc_config)
    await server.start(host, port)
    address = f"{host}:{server.port}"
    try:
        await service.start(address)
        await service.wait_registered(wait_registered_s)
        yield LocalBookie(address, service, server)
    finally:
        await server.close()
        await service.close()

