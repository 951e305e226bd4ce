"""The bookie server role: rpc handlers over the journal and the ledger storage.

Write path of an add (all on the event loop, no await between the storage
change and its journal record, so journal order is storage order)::

    check registration / read-only -> parse the envelope (structure, CRC32C,
    ids) -> LedgerStorage.add (master key, fencing, write cache) -> journal
    append -> await the group commit (fdatasync; no-sync adds: the write) ->
    answer

Ledger changes that must survive a restart are journaled too: the master key
of a ledger seen for the first time, fencing (answered only once durable),
explicit LACs and GC deletions. A flush task checkpoints: it makes the
journal durable up to position P, flushes the storage with checkpoint P, then
releases journal segments before P. A restart replays the journal after the
storage's checkpoint.

Maintenance (flush, compaction, scrub, opening and closing) runs on a small
thread pool; the event loop only does in-memory work and page-cache reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from quorumlog import rpc
from quorumlog.bookie._bookie_config import BookieConfig
from quorumlog.bookie._cookie import Cookie, establish_identity
from quorumlog.bookie._errors import (
    EntryTooLargeError,
    NoSuchEntryError,
    NoSuchLedgerError,
    ReadOnlyError,
    UnauthorizedError,
)
from quorumlog.bookie._gc import GarbageCollector, GcResult
from quorumlog.bookie._journal import (
    DeleteRecord,
    Journal,
    encode_control,
    encode_position,
)
from quorumlog.bookie._limbo import LimboRecord, limbo_key
from quorumlog.bookie._metrics import (
    JOURNAL_BATCH_RECORDS,
    JOURNAL_FSYNC_SECONDS,
    BookieCounters,
    register_source,
    unregister_source,
)
from quorumlog.bookie._protocol import (
    FLAG_FENCE,
    FLAG_NO_SYNC,
    FLAG_RECOVERY,
    AddEntryRequest,
    AddEntryResponse,
    BookieStatusRequest,
    BookieStatusResponse,
    FenceRequest,
    FenceResponse,
    ForceLedgerRequest,
    ForceLedgerResponse,
    GcRequest,
    GcResponse,
    LedgerInfoRequest,
    LedgerInfoResponse,
    ReadBatchRequest,
    ReadBatchResponse,
    ReadEntryRequest,
    ReadEntryResponse,
    ReadLacRequest,
    ReadLacResponse,
    ScrubRequest,
    ScrubResponse,
    WriteLacRequest,
    WriteLacResponse,
)
from quorumlog.bookie._registration import Registration
from quorumlog.bookie._replay import replay
from quorumlog.bookie._rules import (
    JournalWrite,
    absent_error,
    add_entry,
    batch_bounds,
    fence_ledger,
    lac_entry,
    lac_or_none,
    lac_passed,
    long_poll_ms,
    write_lac,
)
from quorumlog.bookie._storage import (
    FLUSH_SUGGESTED_FRACTION,
    INDEX_DIRECTORY,
    DiskUsageProbe,
    LedgerStorage,
)
from quorumlog.errors import (
    ConfigError,
    DeadlineExceededError,
    QuorumlogError,
    StorageError,
    TransientError,
    UsageError,
)
from quorumlog.log import get_logger
from quorumlog.meta._client import MetaClient

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
        self._lac_waiters: dict[int, dict[asyncio.Future[None], int]] = {}
        # Ledgers whose master key is known to be in the journal or the storage
        # (saves a storage lookup per add); GC deletions remove ids.
        self._keyed: set[int] = set()
        self._flush_wakeup = asyncio.Event()
        self._flush_lock = asyncio.Lock()
        self._flush_done: asyncio.Future[None] | None = None
        half = config.storage.write_cache_half_bytes
        self._flush_soon_bytes = int(half * FLUSH_SUGGESTED_FRACTION)
        self._add_pause_bytes = half
        self._bytes_since_flush = 0
        self._checkpoint = 0
        self._cookie: Cookie | None = None
        self._limbo_floor = 0  # ledger ids below it: never "no such entry" (see _limbo.py)
        self._started = False
        self._closing = False
        self._failed: asyncio.Future[None] | None = None

    # ------------------------------------------------------------------ wiring

    def handlers(self) -> dict[type[rpc.Request[Any]], Any]:
        return {
            AddEntryRequest: self._on_add,
            ReadEntryRequest: self._on_read,
            ReadBatchRequest: self._on_read_batch,
            ReadLacRequest: self._on_read_lac,
            FenceRequest: self._on_fence,
            WriteLacRequest: self._on_write_lac,
            ForceLedgerRequest: self._on_force,
            BookieStatusRequest: self._on_status,
            LedgerInfoRequest: self._on_ledger_info,
            GcRequest: self._on_gc,
            ScrubRequest: self._on_scrub,
        }

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
        self._journal, self._storage, self._checkpoint = journal, storage, checkpoint
        journal.start(loop)
        if self._meta_addresses:
            self._meta = MetaClient(self._meta_addresses)
            self._registration = Registration(
                self._meta_addresses, bookie_id=bookie_id, instance_id=cookie.instance_id,
                labels=self.config.labels, ttl_ms=self.config.session_ttl_ms,
                retry_ms=self.config.registration_retry_ms, read_only=lambda: storage.read_only)
        self._gc = GarbageCollector(
            storage, self._meta, live_ratio_threshold=self.config.gc_live_ratio_threshold,
            executor=self._executor, delete_ledger=self._delete_ledger, flush=self.flush)
        self._started = True
        register_source(self)
        for coro in (self._flush_loop(), self._gc_loop(), self._disk_loop(),
                     self._watch_journal()):
            self._tasks.append(loop.create_task(coro))
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
                self._limbo_floor = record.ledger_id_floor
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
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not (self._started and self.registered):
            if loop.time() > deadline:
                raise DeadlineExceededError(
                    f"bookie {self.bookie_id} did not register in meta within {timeout_s} s")
            await asyncio.sleep(0.02)

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
        self._wake_all_lac_waiters()
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

    # ------------------------------------------------------------------ adds

    def _check_registered(self) -> None:
        if self._registration is not None and not self._registration.registered:
            raise ReadOnlyError(
                f"bookie {self.bookie_id} is not registered in meta (its session was lost or "
                "meta is unreachable); adds are refused until it registers again; "
                "write to another bookie")

    async def _on_add(self, request: AddEntryRequest, ctx: rpc.RequestContext) -> AddEntryResponse:
        try:
            storage, journal = self.storage, self.journal
            self._check_registered()
            payload = ctx.payload
            if len(payload) > self.config.storage.entry_max_bytes:
                raise EntryTooLargeError(
                    f"entry {request.ledger_id}:{request.entry_id} has {len(payload)} bytes, "
                    f"over entry_max_bytes {self.config.storage.entry_max_bytes}")
            if journal.full:
                await journal.wait_for_room()
            if self._bytes_since_flush + len(payload) > self._add_pause_bytes:
                await self._wait_for_flush(len(payload))
            data = bytes(payload)  # the one copy: out of the receive buffer
            ledger_id, entry_id = request.ledger_id, request.entry_id
            write = add_entry(storage, ledger_id, entry_id, data, request.master_key,
                              recovery=bool(request.flags & FLAG_RECOVERY),
                              keyed=ledger_id in self._keyed)
            done = self._journal_write(write, sync=not (request.flags & FLAG_NO_SYNC))
            self._keyed.add(ledger_id)
            if self._lac_waiters:
                self._wake_lac(ledger_id)
            self._bytes_since_flush += len(data)
            if self._bytes_since_flush >= self._flush_soon_bytes:
                self._flush_wakeup.set()
            await done
        except QuorumlogError:
            self.counters.adds_failed += 1
            raise
        self.counters.adds_ok += 1
        self.counters.added_bytes += len(data)
        return AddEntryResponse(ledger_id=ledger_id, entry_id=entry_id)

    def _journal_write(self, write: JournalWrite, *, sync: bool = True) -> asyncio.Future[None]:
        """Append a change's records (no await in between: journal order is storage
        order); the future answers the request (done at once when it need not wait)."""
        journal = self.journal
        *quiet, last = write.records or (b"",)
        for record in quiet:
            journal.append_quiet(record)
        if write.answer_when_durable:
            return journal.append(last, sync=sync)
        if write.records:
            journal.append_quiet(last)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    async def _wait_for_flush(self, size: int) -> None:
        """The write cache half may be full: wait for a flush instead of blocking in add.

        ``_bytes_since_flush`` counts bytes added since the last flush began,
        which is at least what the active half holds.
        """
        self._flush_wakeup.set()
        while self._bytes_since_flush + size > self._add_pause_bytes and not self._closing:
            if self._flush_done is None:
                self._flush_done = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._flush_done)

    # ------------------------------------------------------------------ reads

    async def _on_read(
        self, request: ReadEntryRequest, ctx: rpc.RequestContext
    ) -> tuple[ReadEntryResponse, bytes]:
        storage = self.storage
        ledger_id, entry_id = request.ledger_id, request.entry_id
        if request.flags & FLAG_FENCE:
            await self._fence(ledger_id, request.master_key)
            self.counters.reads["fence"] += 1
        try:
            data = storage.get_entry(ledger_id, entry_id)
        except (NoSuchEntryError, NoSuchLedgerError) as exc:
            raise self._absent(exc, ledger_id, entry_id) from None
        lac = storage.last_add_confirmed(ledger_id)
        self.counters.reads["entry"] += 1
        self.counters.read_bytes += len(data)
        return ReadEntryResponse(ledger_id=ledger_id, entry_id=entry_id, lac=lac), data

    def _absent(self, error: NoSuchEntryError | NoSuchLedgerError, ledger_id: int,
                entry_id: int) -> QuorumlogError:
        """A re-added bookie never says "no such entry" for what it may have lost."""
        answer = absent_error(error, self.bookie_id, ledger_id, entry_id, self._limbo_floor)
        if answer is not error:
            self.counters.reads["limbo"] += 1
        return answer

    async def _on_read_batch(
        self, request: ReadBatchRequest, ctx: rpc.RequestContext
    ) -> tuple[ReadBatchResponse, bytes]:
        storage = self.storage
        max_entries, max_bytes = batch_bounds(self.config, request.max_entries,
                                              request.max_bytes)
        try:
            entries = storage.read_batch(request.ledger_id, request.first_entry_id,
                                         max_entries, max_bytes)
        except (NoSuchEntryError, NoSuchLedgerError) as exc:
            raise self._absent(exc, request.ledger_id, request.first_entry_id) from None
        lac = storage.last_add_confirmed(request.ledger_id)
        payload = b"".join(entries)
        self.counters.reads["batch"] += 1
        self.counters.read_bytes += len(payload)
        return ReadBatchResponse(
            ledger_id=request.ledger_id, first_entry_id=request.first_entry_id,
            sizes=[len(e) for e in entries], lac=lac), payload

    # ------------------------------------------------------------------ LAC, long poll

    async def _on_read_lac(
        self, request: ReadLacRequest, ctx: rpc.RequestContext
    ) -> tuple[ReadLacResponse, bytes]:
        storage = self.storage
        ledger_id, previous = request.ledger_id, request.previous_lac
        timeout_ms = long_poll_ms(self.config, request.timeout_ms)
        lac = lac_or_none(storage, ledger_id)
        if timeout_ms > 0 and not lac_passed(lac, previous):
            lac = await self._park(ledger_id, previous, timeout_ms / 1000)
        if lac is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist on this bookie")
        info = storage.ledger_info(ledger_id)
        payload = lac_entry(storage, ledger_id, previous) if request.with_entry else b""
        self.counters.reads["lac"] += 1
        return ReadLacResponse(ledger_id=ledger_id, lac=info.last_add_confirmed,
                               last_entry_id=info.last_entry_id, fenced=info.fenced), payload

    async def _park(self, ledger_id: int, previous: int, timeout_s: float) -> int | None:
        """Wait until the ledger's LAC passes ``previous`` or the timeout ends."""
        if self.counters.long_polls_parked >= self.config.long_poll_parked_max:
            return lac_or_none(self.storage, ledger_id)  # at the bound: answer now (no wait)
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._lac_waiters.setdefault(ledger_id, {})[waiter] = previous
        self.counters.long_polls_parked += 1
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await waiter
        finally:
            self.counters.long_polls_parked -= 1
            waiters = self._lac_waiters.get(ledger_id)
            if waiters is not None:
                waiters.pop(waiter, None)
                if not waiters:
                    del self._lac_waiters[ledger_id]
        return lac_or_none(self.storage, ledger_id)

    def _wake_lac(self, ledger_id: int) -> None:
        waiters = self._lac_waiters.get(ledger_id)
        if not waiters:
            return
        lac = lac_or_none(self.storage, ledger_id)
        if lac is None:
            return
        for waiter, previous in list(waiters.items()):
            if lac > previous:
                del waiters[waiter]
                if not waiter.done():
                    waiter.set_result(None)
        if not waiters:
            del self._lac_waiters[ledger_id]

    def _wake_all_lac_waiters(self) -> None:
        waiters, self._lac_waiters = self._lac_waiters, {}
        for parked in waiters.values():
            for waiter in parked:
                if not waiter.done():
                    waiter.set_result(None)

    async def _on_write_lac(
        self, request: WriteLacRequest, ctx: rpc.RequestContext
    ) -> WriteLacResponse:
        ledger_id = request.ledger_id
        write = write_lac(self.storage, ledger_id, request.master_key, request.lac)
        done = self._journal_write(write)
        self._keyed.add(ledger_id)
        if request.lac >= 0:
            self._wake_lac(ledger_id)
        await done
        return WriteLacResponse(ledger_id=ledger_id)

    # ------------------------------------------------------------------ fencing, force

    async def _fence(self, ledger_id: int, master_key: bytes) -> None:
        """Fence (creating the ledger with this key if unknown), durably."""
        done = self._journal_write(fence_ledger(self.storage, ledger_id, master_key))
        self._keyed.add(ledger_id)  # the fence record carries the key
        await done

    async def _on_fence(self, request: FenceRequest, ctx: rpc.RequestContext) -> FenceResponse:
        await self._fence(request.ledger_id, request.master_key)
        info = self.storage.ledger_info(request.ledger_id)
        self.counters.reads["fence"] += 1
        return FenceResponse(ledger_id=request.ledger_id, lac=info.last_add_confirmed,
                             last_entry_id=info.last_entry_id, fenced=info.fenced)

    def _authorize(self, ledger_id: int, master_key: bytes) -> None:
        info = self.storage.ledger_info(ledger_id)
        if not hmac.compare_digest(info.master_key, master_key):
            raise UnauthorizedError(
                f"master key does not match the one ledger {ledger_id} was created with; "
                "check the ledger password")

    async def _on_force(
        self, request: ForceLedgerRequest, ctx: rpc.RequestContext
    ) -> ForceLedgerResponse:
        self._authorize(request.ledger_id, request.master_key)
        last = self.storage.last_entry_id(request.ledger_id)
        await self.journal.force()
        return ForceLedgerResponse(ledger_id=request.ledger_id, last_entry_id=last)

    # ------------------------------------------------------------------ admin

    async def _on_status(
        self, request: BookieStatusRequest, ctx: rpc.RequestContext
    ) -> BookieStatusResponse:
        storage = self.storage
        return BookieStatusResponse(
            bookie_id=self.bookie_id, read_only=storage.read_only, registered=self.registered,
            labels=dict(self.config.labels), ledgers=len(storage.ledger_ids()),
            disk_usage=storage.disk_usage(), journal_dir=self.config.journal_dir,
            ledger_dir=self.config.ledger_dir, stats=self.stats(), instance_id=self.instance_id)

    def stats(self) -> dict[str, int]:
        """Storage, journal and server counters, flat (BookieStatusResponse.stats)."""
        out = {f"storage_{k}": int(v) for k, v in asdict(self.storage.stats).items()}
        journal = self.journal
        out.update(
            journal_fsyncs=journal.fsyncs, journal_batches=journal.batches,
            journal_records=journal.records_written, journal_bytes=journal.bytes_written,
            journal_queued_bytes=journal.queued_bytes, journal_last_index=journal.last_index,
            checkpoint_index=self._checkpoint, write_cache_bytes=self.storage.write_cache_bytes,
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
            "checkpoint_index": self._checkpoint,
            "gc_running": 1.0 if self._gc is not None and self._gc.running else 0.0,
            "read_only": 1.0 if storage.read_only else 0.0,
            "registered": 1.0 if self.registered else 0.0,
            "write_cache_bytes": storage.write_cache_bytes,
            "ledgers": len(storage.ledger_ids()),
            "hits_write": stats.write_cache_hits,
            "hits_read": stats.read_cache_hits,
            "hits_log": stats.entry_log_reads,
        }

    async def _on_ledger_info(
        self, request: LedgerInfoRequest, ctx: rpc.RequestContext
    ) -> LedgerInfoResponse:
        try:
            info = self.storage.ledger_info(request.ledger_id)
        except NoSuchLedgerError:
            return LedgerInfoResponse(ledger_id=request.ledger_id, exists=False, fenced=False,
                                      lac=-1, last_entry_id=-1)
        return LedgerInfoResponse(ledger_id=request.ledger_id, exists=True, fenced=info.fenced,
                                  lac=info.last_add_confirmed, last_entry_id=info.last_entry_id)

    async def _on_gc(self, request: GcRequest, ctx: rpc.RequestContext) -> GcResponse:
        result = await self.gc()
        return GcResponse(deleted_ledgers=result.deleted_ledgers,
                          compacted_logs=result.compacted_logs,
                          reclaimed_bytes=result.reclaimed_bytes)

    async def _on_scrub(self, request: ScrubRequest, ctx: rpc.RequestContext) -> ScrubResponse:
        storage = self.storage
        loop = asyncio.get_running_loop()
        await self.flush()  # check what the write cache holds as well
        report = await loop.run_in_executor(self._executor, storage.verify)
        return ScrubResponse(ok=report.ok, entries_checked=report.entries_checked,
                             problems=list(report.errors))

    # ------------------------------------------------------------------ maintenance

    async def flush(self) -> None:
        """Checkpoint: journal durable to P, storage flushed with P, journal released to P."""
        storage, journal = self.storage, self.journal
        loop = asyncio.get_running_loop()
        async with self._flush_lock:
            position = await journal.sync_position()
            if position == self._checkpoint and storage.write_cache_bytes == 0:
                self._flush_finished()
                return
            self._bytes_since_flush = 0
            started = loop.time()
            try:
                result = await loop.run_in_executor(self._executor, storage.flush,
                                                    encode_position(position))
            finally:
                self._flush_finished()
            self._checkpoint = position
            self.counters.flushes += 1
            released = await loop.run_in_executor(self._executor, journal.release_to, position)
            _log.debug("bookie_flushed", entries=result.entries, data_bytes=result.data_bytes,
                       checkpoint=position, released_segments=released,
                       ms=round((loop.time() - started) * 1000, 1))

    def _flush_finished(self) -> None:
        done, self._flush_done = self._flush_done, None
        if done is not None and not done.done():
            done.set_result(None)

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

    def _delete_ledger(self, ledger_id: int) -> None:
        """GC: delete locally and journal it (so a replay does not bring it back)."""
        self._keyed.discard(ledger_id)
        if self.storage.delete_ledger(ledger_id):
            self.journal.append_quiet(encode_control(DeleteRecord(ledger_id)))
            self._wake_lac(ledger_id)

    async def _flush_loop(self) -> None:
        interval = self.config.flush_interval_ms / 1000
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._flush_wakeup.wait()
            self._flush_wakeup.clear()
            try:
                await self.flush()
            except QuorumlogError as exc:
                _log.error("bookie_flush_failed", bookie=self.bookie_id, error=exc.message)

    async def _gc_loop(self) -> None:
        interval = self.config.gc_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                await self.gc()
            except QuorumlogError as exc:
                _log.warning("bookie_gc_failed", bookie=self.bookie_id, error=exc.message)

    async def _disk_loop(self) -> None:
        interval = self.config.disk_check_interval_ms / 1000
        storage = self.storage
        while True:
            await asyncio.sleep(interval)
            was = storage.read_only
            try:
                storage.check_disk_usage()
            except QuorumlogError as exc:
                _log.warning("bookie_disk_check_failed", error=exc.message)
                continue
            if storage.read_only != was and self._registration is not None:
                self._registration.read_only_changed()

    def check_disk_usage(self) -> None:
        """Measure disk usage now and publish a read-only change (tests, admin)."""
        storage = self.storage
        was = storage.read_only
        storage.check_disk_usage()
        if storage.read_only != was and self._registration is not None:
            self._registration.read_only_changed()

    async def _watch_journal(self) -> None:
        """Turn a journal failure into ``failed`` (the node process exits and restarts)."""
        journal = self.journal
        while journal.failure is None:
            await asyncio.sleep(0.1)
        if not self.failed.done():
            self.failed.set_exception(StorageError(journal.failure))


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

