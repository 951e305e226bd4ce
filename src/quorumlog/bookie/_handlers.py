"""The bookie's rpc handlers: one per request type, after BookKeeper's
``proto/`` processors.

Each handler is thin: it checks what only the server knows (registration,
read-only, sizes, back-pressure), applies the request's rule (``_rules.py``,
shared with the simulated bookie) to the storage, appends the rule's journal
records without awaiting in between (journal order is storage order), wakes
long polls, awaits durability where the rule says so and answers. Write path
of an add::

    registered? -> size -> room in the journal / write cache (back-pressure)
    -> add_entry: envelope (structure, CRC32C, ids) -> LedgerStorage.add
       (master key, fencing, write cache) -> journal records
    -> journal append -> await the group commit (FLAG_NO_SYNC: the write) -> answer

A batch of adds (``AddEntriesRequest``) takes the same path once for the
whole request: split and check the batch, wait once for room for all of it,
``add_entries`` applies each add in order (one entry's error leaves the
others alone), every accepted entry's records are appended without awaiting
in between, one await covers their durability, and one answer carries a
result per entry.

An add with ``FLAG_RECOVERY | FLAG_NO_JOURNAL`` (auto-recovery's copies)
takes the same path but journals no entry data (only a new ledger's key
record, not awaited) and is answered once in the write cache;
``FlushLedgerRequest`` (:meth:`RequestHandlers.flush_ledger`) then makes it
durable through the bookie's own checkpoint flush. Why that is safe:
``_rules.py``.
"""

from __future__ import annotations

import asyncio
import hmac
from typing import TYPE_CHECKING, Any

from quorumlog import rpc
from quorumlog.bookie._rules import (
    JournalWrite,
    absent_error,
    add_entries,
    add_entry,
    add_flags,
    batch_bounds,
    fence_ledger,
    lac_entry,
    lac_or_none,
    lac_passed,
    long_poll_ms,
    split_batch,
    write_lac,
)
from quorumlog.errors import QuorumlogError, UsageError
from quorumlog.proto import (
    ENTRY_OK,
    FLAG_FENCE,
    FLAG_NO_SYNC,
    FLUSH_ENTRIES_MAX,
    AddEntriesRequest,
    AddEntriesResponse,
    AddEntryRequest,
    AddEntryResponse,
    BookieStatusRequest,
    BookieStatusResponse,
    DeleteLedgerRequest,
    DeleteLedgerResponse,
    EntryTooLargeError,
    FenceRequest,
    FenceResponse,
    FlushLedgerRequest,
    FlushLedgerResponse,
    ForceLedgerRequest,
    ForceLedgerResponse,
    GcRequest,
    GcResponse,
    LedgerInfoRequest,
    LedgerInfoResponse,
    NoSuchEntryError,
    NoSuchLedgerError,
    ReadBatchRequest,
    ReadBatchResponse,
    ReadEntryRequest,
    ReadEntryResponse,
    ReadLacRequest,
    ReadLacResponse,
    ReadOnlyError,
    ScrubRequest,
    ScrubResponse,
    UnauthorizedError,
    WriteLacRequest,
    WriteLacResponse,
    entry_result,
)

if TYPE_CHECKING:
    from quorumlog.bookie._server import BookieService

FLUSH_MISSING_SHOWN_MAX = 8
"""Most missing entry ids a failed ``FlushLedgerRequest`` names in its message."""


class RequestHandlers:
    """The request handlers of one :class:`BookieService` (see the module docstring)."""

    def __init__(self, service: BookieService) -> None:
        self._service = service
        # Ledgers whose master key is known to be in the journal or the storage
        # (saves a storage lookup per add); GC deletions remove ids.
        self.keyed: set[int] = set()

    def table(self) -> dict[type[rpc.Request[Any]], Any]:
        return {
            AddEntryRequest: self.add,
            AddEntriesRequest: self.add_batch,
            ReadEntryRequest: self.read,
            ReadBatchRequest: self.read_batch,
            ReadLacRequest: self.read_lac,
            FenceRequest: self.fence,
            WriteLacRequest: self.write_lac,
            ForceLedgerRequest: self.force,
            FlushLedgerRequest: self.flush_ledger,
            BookieStatusRequest: self.status,
            LedgerInfoRequest: self.ledger_info,
            GcRequest: self.gc,
            ScrubRequest: self.scrub,
            DeleteLedgerRequest: self.delete_ledger,
        }

    # ------------------------------------------------------------------ helpers

    def _journal_write(self, write: JournalWrite, *, sync: bool = True) -> asyncio.Future[None]:
        """Append a change's records (no await in between: journal order is storage
        order); the future answers the request (done at once when it need not wait)."""
        journal = self._service.journal
        if write.answer_when_durable:
            return journal.append_many(write.records, sync=sync)
        for record in write.records:
            journal.append_quiet(record)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    def _check_registered(self) -> None:
        service = self._service
        if not service.registered:
            raise ReadOnlyError(
                f"bookie {service.bookie_id} is not registered in meta (its session was lost "
                "or meta is unreachable); adds are refused until it registers again; "
                "write to another bookie")

    def _absent(self, error: NoSuchEntryError | NoSuchLedgerError, ledger_id: int,
                entry_id: int) -> QuorumlogError:
        """A re-added bookie never says "no such entry" for what it may have lost."""
        service = self._service
        answer = absent_error(error, service.bookie_id, ledger_id, entry_id,
                              service.limbo_floor)
        if answer is not error:
            service.counters.reads["limbo"] += 1
        return answer

    def wake_lac(self, ledger_id: int) -> None:
        """The ledger's LAC may have moved: answer the long polls it passed."""
        waiters = self._service.lac_waiters
        if waiters:
            waiters.wake(ledger_id, lac_or_none(self._service.storage, ledger_id))

    # ------------------------------------------------------------------ adds

    async def add(self, request: AddEntryRequest, ctx: rpc.RequestContext) -> AddEntryResponse:
        service = self._service
        counters, backpressure = service.counters, service.backpressure
        try:
            storage, journal = service.storage, service.journal
            self._check_registered()
            flags = add_flags(request.flags)
            payload = ctx.payload
            entry_max_bytes = service.config.storage.entry_max_bytes
            if len(payload) > entry_max_bytes:
                raise EntryTooLargeError(
                    f"entry {request.ledger_id}:{request.entry_id} has {len(payload)} bytes, "
                    f"over entry_max_bytes {entry_max_bytes}")
            if journal.full:
                await journal.wait_for_room()
            if backpressure.must_wait(len(payload)):
                await backpressure.wait_for_flush(len(payload))
            data = bytes(payload)  # the one copy: out of the receive buffer
            ledger_id, entry_id = request.ledger_id, request.entry_id
            write = add_entry(storage, ledger_id, entry_id, data, request.master_key,
                              recovery=flags.recovery, keyed=ledger_id in self.keyed,
                              journal_data=flags.journal_data)
            done = self._journal_write(write, sync=not (request.flags & FLAG_NO_SYNC))
            self.keyed.add(ledger_id)
            self.wake_lac(ledger_id)
            backpressure.added(len(data))
            await done
        except QuorumlogError:
            counters.adds_failed += 1
            raise
        counters.adds_ok += 1
        counters.added_bytes += len(data)
        return AddEntryResponse(ledger_id=ledger_id, entry_id=entry_id)

    async def add_batch(
        self, request: AddEntriesRequest, ctx: rpc.RequestContext
    ) -> AddEntriesResponse:
        service = self._service
        counters, backpressure = service.counters, service.backpressure
        try:
            self._check_registered()
            flags = add_flags(request.flags)
            payload = ctx.payload
            if service.journal.full:
                await service.journal.wait_for_room()
            if backpressure.must_wait(len(payload)):
                await backpressure.wait_for_flush(len(payload))
            entries = split_batch(payload, request.entry_ids, request.sizes)
            ledger_id = request.ledger_id
            batch = add_entries(
                service.storage, ledger_id, entries, request.master_key,
                recovery=flags.recovery,
                entry_max_bytes=service.config.storage.entry_max_bytes,
                keyed=ledger_id in self.keyed, journal_data=flags.journal_data)
            done = self._journal_write(batch.write, sync=not (request.flags & FLAG_NO_SYNC))
            failures = len(entries) - batch.errors.count(None)
            if failures:
                accepted_bytes = sum(len(data) for (_, data), error in zip(
                    entries, batch.errors, strict=True) if error is None)
            else:
                accepted_bytes = len(payload)
            if failures < len(entries):
                self.keyed.add(ledger_id)
                self.wake_lac(ledger_id)
                backpressure.added(accepted_bytes)
            await done
        except QuorumlogError:
            counters.adds_failed += len(request.entry_ids)
            raise
        counters.adds_ok += len(entries) - failures
        counters.adds_failed += failures
        counters.added_bytes += accepted_bytes
        if not failures:  # every entry accepted: no per-entry work
            return AddEntriesResponse(
                ledger_id=ledger_id, entry_ids=request.entry_ids,
                codes=[ENTRY_OK] * len(entries), messages=[""] * len(entries))
        results = [entry_result(error) for error in batch.errors]
        return AddEntriesResponse(
            ledger_id=ledger_id, entry_ids=request.entry_ids,
            codes=[code for code, _ in results], messages=[text for _, text in results])

    # ------------------------------------------------------------------ reads

    async def read(
        self, request: ReadEntryRequest, ctx: rpc.RequestContext
    ) -> tuple[ReadEntryResponse, bytes]:
        storage, counters = self._service.storage, self._service.counters
        ledger_id, entry_id = request.ledger_id, request.entry_id
        if request.flags & FLAG_FENCE:
            await self._fence(ledger_id, request.master_key)
            counters.reads["fence"] += 1
        try:
            data = storage.get_entry(ledger_id, entry_id)
        except (NoSuchEntryError, NoSuchLedgerError) as exc:
            raise self._absent(exc, ledger_id, entry_id) from None
        lac = storage.last_add_confirmed(ledger_id)
        counters.reads["entry"] += 1
        counters.read_bytes += len(data)
        return ReadEntryResponse(ledger_id=ledger_id, entry_id=entry_id, lac=lac), data

    async def read_batch(
        self, request: ReadBatchRequest, ctx: rpc.RequestContext
    ) -> tuple[ReadBatchResponse, bytes]:
        storage, counters = self._service.storage, self._service.counters
        max_entries, max_bytes = batch_bounds(self._service.config, request.max_entries,
                                              request.max_bytes)
        try:
            entries = storage.read_batch(request.ledger_id, request.first_entry_id,
                                         max_entries, max_bytes)
        except (NoSuchEntryError, NoSuchLedgerError) as exc:
            raise self._absent(exc, request.ledger_id, request.first_entry_id) from None
        lac = storage.last_add_confirmed(request.ledger_id)
        payload = b"".join(entries)
        counters.reads["batch"] += 1
        counters.read_bytes += len(payload)
        return ReadBatchResponse(
            ledger_id=request.ledger_id, first_entry_id=request.first_entry_id,
            sizes=[len(e) for e in entries], lac=lac), payload

    # ------------------------------------------------------------------ LAC, long poll

    async def read_lac(
        self, request: ReadLacRequest, ctx: rpc.RequestContext
    ) -> tuple[ReadLacResponse, bytes]:
        service = self._service
        storage = service.storage
        ledger_id, previous = request.ledger_id, request.previous_lac
        timeout_ms = long_poll_ms(service.config, request.timeout_ms)
        lac = lac_or_none(storage, ledger_id)
        if timeout_ms > 0 and not lac_passed(lac, previous):
            lac = await self._park(ledger_id, previous, timeout_ms / 1000)
        if lac is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist on this bookie")
        info = storage.ledger_info(ledger_id)
        payload = lac_entry(storage, ledger_id, previous) if request.with_entry else b""
        service.counters.reads["lac"] += 1
        return ReadLacResponse(ledger_id=ledger_id, lac=info.last_add_confirmed,
                               last_entry_id=info.last_entry_id, fenced=info.fenced), payload

    async def _park(self, ledger_id: int, previous: int, timeout_s: float) -> int | None:
        """Wait until the ledger's LAC passes ``previous`` or the timeout ends."""
        service = self._service
        waiters, counters = service.lac_waiters, service.counters
        if waiters.full:
            return lac_or_none(service.storage, ledger_id)  # at the bound: answer now
        waiter = waiters.park(ledger_id, previous)
        counters.long_polls_parked = waiters.parked
        try:
            async with asyncio.timeout(timeout_s):
                await waiter
        except TimeoutError:
            pass
        finally:
            waiters.unpark(ledger_id, waiter)
            counters.long_polls_parked = waiters.parked
        return lac_or_none(service.storage, ledger_id)

    async def write_lac(
        self, request: WriteLacRequest, ctx: rpc.RequestContext
    ) -> WriteLacResponse:
        ledger_id = request.ledger_id
        write = write_lac(self._service.storage, ledger_id, request.master_key, request.lac)
        done = self._journal_write(write)
        self.keyed.add(ledger_id)
        if request.lac >= 0:
            self.wake_lac(ledger_id)
        await done
        return WriteLacResponse(ledger_id=ledger_id)

    # ------------------------------------------------------------------ fencing, force

    async def _fence(self, ledger_id: int, master_key: bytes) -> None:
        """Fence (creating the ledger with this key if unknown), durably."""
        done = self._journal_write(fence_ledger(self._service.storage, ledger_id, master_key))
        self.keyed.add(ledger_id)  # the fence record carries the key
        await done

    async def fence(self, request: FenceRequest, ctx: rpc.RequestContext) -> FenceResponse:
        await self._fence(request.ledger_id, request.master_key)
        info = self._service.storage.ledger_info(request.ledger_id)
        self._service.counters.reads["fence"] += 1
        return FenceResponse(ledger_id=request.ledger_id, lac=info.last_add_confirmed,
                             last_entry_id=info.last_entry_id, fenced=info.fenced)

    async def force(
        self, request: ForceLedgerRequest, ctx: rpc.RequestContext
    ) -> ForceLedgerResponse:
        storage = self._service.storage
        info = storage.ledger_info(request.ledger_id)
        if not hmac.compare_digest(info.master_key, request.master_key):
            raise UnauthorizedError(
                f"master key does not match the one ledger {request.ledger_id} was created "
                "with; check the ledger password")
        last = storage.last_entry_id(request.ledger_id)
        await self._service.journal.force()
        return ForceLedgerResponse(ledger_id=request.ledger_id, last_entry_id=last)

    async def flush_ledger(
        self, request: FlushLedgerRequest, ctx: rpc.RequestContext
    ) -> FlushLedgerResponse:
        """Flush the write cache through the bookie's checkpoint path (one flush at
        a time with the periodic flusher, a journal checkpoint like any other),
        then check the index holds each entry asked for: an add the bookie
        answered and then lost in a restart is not in it."""
        service = self._service
        ledger_id, entry_ids = request.ledger_id, request.entry_ids
        if len(entry_ids) > FLUSH_ENTRIES_MAX:
            raise UsageError(
                f"a flush of ledger {ledger_id} checks at most {FLUSH_ENTRIES_MAX} entries, "
                f"not {len(entry_ids)}; send several requests")
        info = service.storage.ledger_info(ledger_id)
        if not hmac.compare_digest(info.master_key, request.master_key):
            raise UnauthorizedError(
                f"master key does not match the one ledger {ledger_id} was created "
                "with; check the ledger password")
        await service.flush()
        loop = asyncio.get_running_loop()
        missing = await loop.run_in_executor(
            service.executor, service.storage.missing_from_index, ledger_id, entry_ids)
        if missing:
            shown = ", ".join(str(entry_id) for entry_id in missing[:FLUSH_MISSING_SHOWN_MAX])
            raise NoSuchEntryError(
                f"bookie {service.bookie_id} does not hold {len(missing)} of the "
                f"{len(entry_ids)} entries of ledger {ledger_id} asked for after its flush "
                f"({shown}{', ...' if len(missing) > FLUSH_MISSING_SHOWN_MAX else ''}): adds "
                "without the journal were lost (the bookie restarted since); add them again")
        return FlushLedgerResponse(ledger_id=ledger_id, entries_durable=len(entry_ids))

    # ------------------------------------------------------------------ admin

    async def status(
        self, request: BookieStatusRequest, ctx: rpc.RequestContext
    ) -> BookieStatusResponse:
        service = self._service
        storage, config = service.storage, service.config
        return BookieStatusResponse(
            bookie_id=service.bookie_id, read_only=storage.read_only,
            registered=service.registered, labels=dict(config.labels),
            ledgers=len(storage.ledger_ids()), disk_usage=storage.disk_usage(),
            journal_dir=config.journal_dir, ledger_dir=config.ledger_dir,
            stats=service.stats(), instance_id=service.instance_id)

    async def ledger_info(
        self, request: LedgerInfoRequest, ctx: rpc.RequestContext
    ) -> LedgerInfoResponse:
        try:
            info = self._service.storage.ledger_info(request.ledger_id)
        except NoSuchLedgerError:
            return LedgerInfoResponse(ledger_id=request.ledger_id, exists=False, fenced=False,
                                      lac=-1, last_entry_id=-1)
        return LedgerInfoResponse(ledger_id=request.ledger_id, exists=True, fenced=info.fenced,
                                  lac=info.last_add_confirmed, last_entry_id=info.last_entry_id)

    async def gc(self, request: GcRequest, ctx: rpc.RequestContext) -> GcResponse:
        result = await self._service.gc()
        return GcResponse(deleted_ledgers=result.deleted_ledgers,
                          compacted_logs=result.compacted_logs,
                          reclaimed_bytes=result.reclaimed_bytes)

    async def delete_ledger(
        self, request: DeleteLedgerRequest, ctx: rpc.RequestContext
    ) -> DeleteLedgerResponse:
        """Drop the local copy, as GC drops a deleted ledger (journalled, so a
        replay does not bring it back)."""
        try:
            info = self._service.storage.ledger_info(request.ledger_id)
        except NoSuchLedgerError:
            return DeleteLedgerResponse(ledger_id=request.ledger_id, deleted=False)
        if not hmac.compare_digest(info.master_key, request.master_key):
            raise UnauthorizedError(
                f"master key does not match the one ledger {request.ledger_id} was created "
                "with; check the ledger password")
        self._service.delete_ledger(request.ledger_id)
        return DeleteLedgerResponse(ledger_id=request.ledger_id, deleted=True)

    async def scrub(self, request: ScrubRequest, ctx: rpc.RequestContext) -> ScrubResponse:
        service = self._service
        storage = service.storage
        loop = asyncio.get_running_loop()
        await service.flush()  # check what the write cache holds as well
        report = await loop.run_in_executor(service.executor, storage.verify)
        return ScrubResponse(ok=report.ok, entries_checked=report.entries_checked,
                             problems=list(report.errors))

