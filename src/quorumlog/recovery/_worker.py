"""Replication workers: copy an under-replicated ledger's entries to new bookies.

A worker takes a task (``/underreplicated/<ledger>``) by writing the
ephemeral lock ``/underreplicated-locks/<ledger>`` in its node's recovery
session, so a SIGKILLed worker's lock vanishes with its session and another
worker takes the task over. For the ledger it then:

1. drops the task if the ledger was deleted; leaves an OPEN ledger to its
   writer for ``open_ledger_grace_ms``, then fences and recovers (closes) it
   with the ledger client's recovery;
2. for each fragment position naming a lost bookie: if that bookie is
   registered again and still holds every entry of the position, nothing is
   copied; otherwise a replacement (a writable bookie outside the fragment,
   chosen by the ledger's placement policy, rack/zone-aware like ensemble
   creation; kept in the task so a successor reuses it) gets each entry,
   read from a surviving replica with digest verification, in batches
   of recovery adds, at most ``throttle_bytes_per_s``;
   a worker copies up to ``copy_ledgers_in_flight_max`` ledgers at once.
   The adds skip the replacement's journal (``FLAG_NO_JOURNAL``, with
   ``copy_without_journal``): the replacement answers once an entry is in its
   write cache, and the worker then sends it a ``FlushLedgerRequest``, which
   answers once the replacement's write cache is in its entry logs and index
   (synced) and it holds every copied entry there. A replacement that died or
   restarted between the copy and that answer fails the attempt (it is
   retried, copying again);
3. swaps the replacement into that fragment by compare-and-swap of the ledger
   metadata - after the copy and its flush, so a worker dying mid-copy changed
   nothing in metadata and its successor copies again (recovery adds of the
   same entry are idempotent on the bookie), and the metadata never names a
   bookie for an entry it does not hold durably;
4. deletes the task. An entry no surviving replica holds marks the task LOST
   (reported, never retried); other failures retry with backoff up to
   ``task_attempts_max``, then mark it FAILED.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable, Sequence

import msgspec

from quorumlog import chunks
from quorumlog import proto as wire
from quorumlog.clock import SYSTEM_CLOCK, Clock
from quorumlog.errors import QuorumlogError, invariant
from quorumlog.ledger import (
    LedgerClient,
    LedgerMetadata,
    master_key,
)
from quorumlog.log import get_logger
from quorumlog.recovery import _layout as layout
from quorumlog.recovery._auditor import registration_counts
from quorumlog.recovery._config import RecoveryConfig
from quorumlog.recovery._metrics import BYTES_COPIED, FRAGMENTS_REPLICATED
from quorumlog.recovery._plan import (
    Slot,
    entries_of_slot,
    placement_label,
    replacement_for,
    slots_to_replace,
    sources_for,
)
from quorumlog.recovery._session import RecoverySession
from quorumlog.recovery._store import RecoveryMeta

_log = get_logger(__name__)

METADATA_CAS_ATTEMPTS_MAX = 16
COPY_BATCH_BYTES_MAX = 8 * 1024 * 1024
"""Envelope bytes a copy reads at once (``copy_batch_entries_max`` entries at
most); its writes go in add requests of ``proto.ADD_BATCH_BYTES_MAX``."""


def _byte_batches(items: list[tuple[int, bytes]]) -> list[list[tuple[int, bytes]]]:
    """``(entry_id, envelope)`` pairs in runs of at most ``ADD_BATCH_BYTES_MAX``
    bytes (an entry larger than that alone)."""
    return chunks.by_size(items, lambda item: len(item[1]), wire.ADD_BATCH_BYTES_MAX)
"""Compare-and-swap attempts on one ledger's metadata or task before the attempt fails."""


class EntryLostError(QuorumlogError):
    """No surviving replica holds an entry: the ledger has lost data - unless one
    of ``unreachable`` (bookies of its write set that never said they lack it:
    the lost bookie itself, unregistered ones) comes back holding it."""

    def __init__(self, message: str, *, unreachable: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.unreachable = tuple(sorted(unreachable))


class Throttle:
    """Paces the worker's copies at ``bytes_per_s``: each batch is due its size
    over the rate after the one before, and ``spend`` returns when it is due (the
    caller sends it then). Idle time is not saved up: a worker idle for an hour
    does not then copy an hour's worth at full speed. Concurrent copies share
    it: each ``spend`` books its slot before it waits."""

    def __init__(self, bytes_per_s: int, clock: Clock) -> None:
        self._rate = bytes_per_s
        self._clock = clock
        self._free_at_s = clock.monotonic_s()

    async def spend(self, size_bytes: int) -> None:
        now_s = self._clock.monotonic_s()
        self._free_at_s = max(self._free_at_s, now_s) + size_bytes / self._rate
        wait_s = self._free_at_s - now_s
        if wait_s > 0:
            await asyncio.sleep(wait_s)


class ReplicationWorker:
    def __init__(self, worker_id: str, client: LedgerClient, meta: RecoveryMeta,
                 session: RecoverySession, config: RecoveryConfig, *,
                 clock: Clock = SYSTEM_CLOCK, rng: random.Random | None = None) -> None:
        self.worker_id = worker_id
        self._client = client
        self._meta = meta
        self._session = session
        self._config = config
        self._clock = clock
        self._rng = rng or random.Random()
        self._throttle = Throttle(config.throttle_bytes_per_s, clock)

    async def work_once(self) -> list[int]:
        """Try every pending task once, up to ``copy_ledgers_in_flight_max`` of
        them at a time; the ledgers this worker finished. A task is locked only
        when a copy slot is free, so a task this worker cannot start yet stays
        free for the others. Each attempt handles its own operating errors; one
        failing does not stop the others, and every lock taken is released."""
        if await self._meta.get(layout.DISABLED_KEY) is not None:
            return []
        done: list[int] = []
        now_ms = self._clock.wall_ms()
        slots = asyncio.Semaphore(self._config.copy_ledgers_in_flight_max)
        running: list[asyncio.Task[None]] = []
        try:
            for kv in await self._meta.list_keys(layout.TASK_PREFIX):
                task = layout.ReplicationTask.decode(kv.value)
                if task.state is not layout.TaskState.PENDING or task.retry_after_ms > now_ms:
                    continue
                await slots.acquire()
                try:
                    session_id = await self._session.current()
                    locked = await self._meta.cas(layout.lock_key(task.ledger_id), 0,
                                                  self.worker_id.encode(), session_id=session_id)
                except BaseException:
                    slots.release()
                    raise
                if not locked:
                    slots.release()
                    continue  # another worker has it
                running.append(asyncio.get_running_loop().create_task(
                    self._locked_attempt(task.ledger_id, slots, done)))
        except asyncio.CancelledError:
            for attempt in running:  # the service stops: so do the copies
                attempt.cancel()
            raise
        finally:
            # Every started attempt ends (and releases its lock) before this
            # returns, also when listing or locking the next task failed.
            outcomes = await asyncio.gather(*running, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome  # a programmer error: the others were let finish first
        return done

    async def _locked_attempt(self, ledger_id: int, slots: asyncio.Semaphore,
                              done: list[int]) -> None:
        """One attempt at a task this worker holds the lock of; releases the lock
        and the copy slot whatever happens."""
        try:
            if await self._attempt(ledger_id):
                done.append(ledger_id)
        finally:
            try:
                await self._meta.delete(layout.lock_key(ledger_id))
            finally:
                slots.release()

    async def _attempt(self, ledger_id: int) -> bool:
        # Counted before any read: a bookie registering during the attempt counts
        # as back, and the auditor reopens the task if it is marked lost.
        registrations = await registration_counts(self._meta)
        try:
            return await self.replicate(ledger_id)
        except EntryLostError as exc:
            _log.error("recovery_ledger_lost", ledger=ledger_id, error=exc.message)
            await self._update_task(ledger_id, state=layout.TaskState.LOST, error=exc.message,
                                    unreachable={b: registrations.get(b, 0)
                                                 for b in exc.unreachable})
        except QuorumlogError as exc:
            _log.warning("recovery_attempt_failed", ledger=ledger_id, error=exc.message)
            await self._failed_attempt(ledger_id, exc.message)
        return False

    async def _failed_attempt(self, ledger_id: int, error: str) -> None:
        kv = await self._meta.get(layout.task_key(ledger_id))
        if kv is None:
            return
        task = layout.ReplicationTask.decode(kv.value)
        attempts = task.attempts + 1
        state = (layout.TaskState.FAILED if attempts >= self._config.task_attempts_max
                 else layout.TaskState.PENDING)
        backoff_ms = self._config.retry_backoff_ms * 2 ** min(attempts - 1, 10)
        await self._update_task(ledger_id, state=state, error=error, attempts=attempts,
                                retry_after_ms=self._clock.wall_ms() + backoff_ms)

    async def _update_task(
            self, ledger_id: int, **changes: object) -> layout.ReplicationTask | None:
        key = layout.task_key(ledger_id)
        for _ in range(METADATA_CAS_ATTEMPTS_MAX):
            kv = await self._meta.get(key)
            if kv is None:
                return None
            task = msgspec.structs.replace(layout.ReplicationTask.decode(kv.value), **changes)
            if await self._meta.cas(key, kv.version, task.encode()):
                return task
        raise QuorumlogError(f"task of ledger {ledger_id} kept changing under this worker")

    async def replicate(self, ledger_id: int) -> bool:
        """Bring ``ledger_id`` back to full write quorum; True when the task is done."""
        kv = await self._meta.get(layout.task_key(ledger_id))
        if kv is None:
            return False
        task = layout.ReplicationTask.decode(kv.value)
        ctx = self._client.context
        try:
            metadata, _ = await ctx.load_metadata(ledger_id)
        except wire.NoSuchLedgerError:
            await self._meta.delete(layout.task_key(ledger_id))  # deleted: nothing to keep
            return True
        password = metadata.known_password()
        if password is None:
            raise EntryLostError(
                f"ledger {ledger_id}: its password is not in its metadata (created before "
                "passwords were stored), so no worker can write its entries elsewhere; copy "
                "it with a client that knows the password")
        if not metadata.is_closed:
            if self._clock.wall_ms() - task.created_ms < self._config.open_ledger_grace_ms:
                return False  # its writer may still replace the bookie itself
            _log.info("recovery_fencing_open_ledger", ledger=ledger_id)
            await self._client.open_ledger(ledger_id, password=password, recovery=True)
            metadata, _ = await ctx.load_metadata(ledger_id)
        available = {c.address for c in await ctx.candidates(None)}
        draining = {kv.key[len(layout.DRAINING_PREFIX):]
                    for kv in await self._meta.list_keys(layout.DRAINING_PREFIX)}
        for slot in slots_to_replace(metadata, task.bookies):
            await self._replace_slot(ledger_id, slot, password, available=available,
                                     draining=draining, task=task)
        await self._meta.delete(layout.task_key(ledger_id))
        _log.info("recovery_ledger_replicated", ledger=ledger_id, bookies=list(task.bookies))
        return True

    async def _replace_slot(self, ledger_id: int, slot: Slot, password: bytes, *,
                            available: set[str], draining: set[str],
                            task: layout.ReplicationTask) -> None:
        metadata, _ = await self._client.context.load_metadata(ledger_id)
        fragment = metadata.ensembles[slot.fragment_index]
        if fragment.bookies[slot.position] != slot.bookie:
            return  # replaced already (by an earlier attempt of this task)
        entries = entries_of_slot(metadata, slot)
        if (slot.bookie in available and slot.bookie not in draining
                and slot.bookie not in task.misplaced
                and await self._holds_all(metadata, slot.bookie, entries, password)):
            _log.info("recovery_bookie_still_holds", ledger=ledger_id, bookie=slot.bookie)
            return
        target = await self._replacement(metadata, slot, available, task)
        copied = await self._copy(metadata, slot, entries, target, password,
                                  avoid=set(task.bookies) - available,
                                  own_copy=slot.bookie in task.misplaced)
        if self._config.copy_without_journal:
            await self._flush(metadata.ledger_id, entries, target, password)
        await self._swap(ledger_id, slot, target)
        FRAGMENTS_REPLICATED.inc()
        _log.info("recovery_fragment_replicated", ledger=ledger_id, first=slot.first_entry_id,
                  old=slot.bookie, new=target, entries=len(entries), bytes=copied)

    async def _holds_all(self, metadata: LedgerMetadata, bookie: str,
                         entries: Sequence[int], password: bytes) -> bool:
        """Whether ``bookie`` answers every entry with a matching digest (a corrupt
        replica, found by the audit job, counts as not holding it)."""
        timeout_s = self._config.request_timeout_ms / 1000
        key = _digest_key(metadata, password)
        for entry_id in entries:
            try:
                reply = await self._client.context.bookies.read_entry(
                    bookie, metadata.ledger_id, entry_id, timeout_s=timeout_s)
                wire.decode_entry(reply.envelope, ledger_id=metadata.ledger_id,
                                  entry_id=entry_id, digest=metadata.digest, key=key,
                                  source=bookie)
            except QuorumlogError:
                return False
        return True

    async def _replacement(self, metadata: LedgerMetadata, slot: Slot, available: set[str],
                           task: layout.ReplicationTask) -> str:
        fragment = metadata.ensembles[slot.fragment_index].bookies
        name = layout.replacement_slot(slot.first_entry_id, slot.position)
        chosen = task.replacements.get(name)
        ctx = self._client.context
        candidates = [c for c in await ctx.candidates(placement_label(metadata))
                      if c.address not in task.bookies]
        usable = {c.address for c in candidates if c.writable}
        if chosen is None or chosen not in usable or chosen in fragment:
            chosen = replacement_for(metadata, slot, candidates, self._rng,
                                     min_racks=ctx.config.placement_min_racks)
            kv = await self._meta.get(layout.task_key(metadata.ledger_id))
            if kv is not None:
                current = layout.ReplicationTask.decode(kv.value)
                await self._update_task(metadata.ledger_id, replacements={
                    **current.replacements, name: chosen})
        invariant(chosen not in fragment, "a replacement is never in the fragment already")
        return chosen

    async def _copy(self, metadata: LedgerMetadata, slot: Slot, entries: Sequence[int],
                    target: str, password: bytes, *, avoid: set[str], own_copy: bool) -> int:
        """Copy ``entries`` to ``target``; with ``own_copy`` (a misplaced replica,
        moved while it holds its data) the slot's own bookie is a source too."""
        key = master_key(password)
        digest_key = _digest_key(metadata, password)
        batch_max = min(self._config.copy_batch_entries_max, wire.ADD_BATCH_ENTRIES_MAX)
        timeout_s = self._config.request_timeout_ms / 1000
        flags = wire.FLAG_RECOVERY
        if self._config.copy_without_journal:
            flags |= wire.FLAG_NO_JOURNAL
        copied = 0
        start = 0
        count = 1  # entries read at once: grows once their size is known
        while start < len(entries):
            batch = entries[start:start + count]
            envelopes = await asyncio.gather(*(
                self._read_verified(metadata, slot, entry_id, digest_key, avoid,
                                    own_copy=own_copy)
                for entry_id in batch))
            size = sum(len(e) for e in envelopes)
            # Paced before the write: the worker's copies run concurrently and
            # share the rate, so none may write first and pay later.
            await self._throttle.spend(size)
            # Add requests of at most ADD_BATCH_BYTES_MAX (a larger entry alone):
            # before, a batch of 1 MB entries was one request over the rpc frame
            # limit, refused on every retry, and the ledger stayed under-replicated.
            for part in _byte_batches(list(zip(batch, envelopes, strict=True))):
                results = await self._client.context.bookies.add_entries(
                    target, metadata.ledger_id, key, part, flags=flags, timeout_s=timeout_s)
                for (entry_id, _), error in zip(part, results, strict=True):
                    if error is not None:
                        raise QuorumlogError(
                            f"ledger {metadata.ledger_id}: bookie {target} refused entry "
                            f"{entry_id}: {error}")
            copied += size
            BYTES_COPIED.inc(size)
            start += len(batch)
            largest = max(len(e) for e in envelopes)
            count = max(1, min(batch_max, COPY_BATCH_BYTES_MAX // largest))
        return copied

    async def _flush(self, ledger_id: int, entries: Sequence[int], target: str,
                     password: bytes) -> None:
        """Make the copy durable on ``target`` before the swap names it: its write
        cache flushed, and every copied entry in its index (else the attempt
        fails and is retried: ``target`` restarted and lost the copy)."""
        key = master_key(password)
        timeout_s = self._config.request_timeout_ms / 1000
        for start in range(0, len(entries), wire.FLUSH_ENTRIES_MAX):
            chunk = entries[start:start + wire.FLUSH_ENTRIES_MAX]
            try:
                await self._client.context.bookies.flush_ledger(
                    target, ledger_id, key, chunk, timeout_s=timeout_s)
            except QuorumlogError as exc:
                raise QuorumlogError(
                    f"ledger {ledger_id}: bookie {target} did not make the copy durable "
                    f"({type(exc).__name__}: {exc.message}); copying again later") from exc

    async def _read_verified(self, metadata: LedgerMetadata, slot: Slot, entry_id: int,
                             digest_key: bytes, avoid: set[str], *, own_copy: bool) -> bytes:
        timeout_s = self._config.request_timeout_ms / 1000
        errors: list[str] = []
        sources = [b for b in sources_for(metadata, slot, entry_id, avoid) if b not in avoid]
        if own_copy:
            sources.append(slot.bookie)
        missing: set[str] = set()
        for bookie in sources:
            try:
                reply = await self._client.context.bookies.read_entry(
                    bookie, metadata.ledger_id, entry_id, timeout_s=timeout_s)
                wire.decode_entry(reply.envelope, ledger_id=metadata.ledger_id,
                                  entry_id=entry_id, digest=metadata.digest, key=digest_key,
                                  source=bookie)
                return bytes(reply.envelope)
            except (wire.NoSuchEntryError, wire.NoSuchLedgerError) as exc:
                missing.add(bookie)
                errors.append(f"{bookie}: {exc}")
            except QuorumlogError as exc:
                errors.append(f"{bookie}: {exc}")
        if missing == set(sources):  # every live replica says so (or none is left)
            # The rest of the write set (the slot's own bookie, unregistered ones)
            # never said it lacks the entry: it may come back holding it.
            raise EntryLostError(
                f"ledger {metadata.ledger_id}: entry {entry_id} is on no surviving bookie "
                f"({'; '.join(errors) or 'every replica of its write set is lost'})",
                unreachable=set(metadata.write_set_bookies(entry_id)) - missing)
        raise QuorumlogError(
            f"ledger {metadata.ledger_id}: cannot read entry {entry_id} from a surviving "
            f"replica now ({'; '.join(errors)}); retrying later")

    async def _swap(self, ledger_id: int, slot: Slot, target: str) -> None:
        ctx = self._client.context
        for _ in range(METADATA_CAS_ATTEMPTS_MAX):
            metadata, version = await ctx.load_metadata(ledger_id)
            if metadata.ensembles[slot.fragment_index].bookies[slot.position] != slot.bookie:
                return  # someone swapped it meanwhile
            updated = metadata.with_bookie_replaced(slot.fragment_index, slot.position, target)
            if await self._meta.cas(wire.ledger_key(ledger_id), version, updated.encode()):
                return
        raise QuorumlogError(f"ledger {ledger_id}: metadata kept changing during the swap")


def _digest_key(metadata: LedgerMetadata, password: bytes) -> bytes:
    return wire.mac_key(password) if metadata.digest is wire.DigestType.HMAC_SHA256 else b""
