"""The simulated world of a ledger run: bookies, meta and the network.

- :class:`SimBookie` runs the bookie's own code: each request goes through
  the rules the bookie server uses (``quorumlog.bookie``: ``add_entry``,
  ``fence_ledger``, ``write_lac``, ``absent_error`` with limbo, the batch
  and long-poll bounds, ``LacWaiters``) on a ``MemoryLedgerStore`` - the
  real ``LedgerTable`` (master key compared with ``compare_digest``,
  fencing, LACs, duplicates) over a dict of entries. Only durability is
  simulated: the journal records those rules return are "fsynced" a little
  later (a group commit), and the disk is the synced journal applied by the
  bookie's replay rule (``apply_journal_record``) to a second store; a crash
  restarts from that disk, plus maybe a prefix of the unsynced tail. Adds,
  fences and explicit LACs are answered once durable, as by the server.
  Adds with ``FLAG_NO_JOURNAL`` journal only what the rules return (a new
  ledger's key) and live in memory alone until a ``FlushLedgerRequest``:
  after a delay, the journal is synced and the disk becomes what memory
  holds, as the server's checkpoint flush writes its whole write cache.
- :class:`SimBookieNetwork` is a :class:`quorumlog.ledger.BookieTransport`
  for one client: requests and responses are delayed, dropped, refused by
  crashed bookies, cut by partitions; a bookie that restarted forgets the
  requests it had (their responses never come). Timeouts are the caller's,
  as with rpc.
- :class:`SimMetaStore`: an atomic compare-and-swap key-value store with
  latency, plus bookie registration (a bookie is registered while it is up).
  It checks the ledger-metadata invariants on every write.

Everything random comes from ``random.Random`` streams handed in.
"""

from __future__ import annotations

import asyncio
import hmac
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from quorumlog import proto as wire
from quorumlog import rpc
from quorumlog.bookie import (
    BookieConfig,
    JournalWrite,
    LacWaiters,
    MemoryLedgerStore,
    absent_error,
    add_entries,
    add_entry,
    add_flags,
    apply_journal_record,
    batch_bounds,
    fence_ledger,
    lac_entry,
    lac_or_none,
    lac_passed,
    split_batch,
    write_lac,
)
from quorumlog.bookie import long_poll_ms as long_poll_ms_of
from quorumlog.errors import DeadlineExceededError, QuorumlogError, invariant
from quorumlog.ledger import BatchReply, EntryReply, LacReply, LedgerMetadata, LedgerState
from quorumlog.meta import KeyValue
from quorumlog.proto import (
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedError,
)
from quorumlog.sim._trace import Tracer


@dataclass(frozen=True, slots=True)
class LedgerViolation:
    """A ledger guarantee that did not hold in a simulated run."""

    invariant_name: str
    detail: str


class SimBookie:
    """One bookie: the real request rules over real ledger state, with a
    simulated disk (see the module docstring)."""

    def __init__(self, bookie_id: str, rng: random.Random, tracer: Tracer,
                 loop: asyncio.AbstractEventLoop, sync_ms: tuple[int, int]) -> None:
        self.id = bookie_id
        self.rng = rng
        self.tracer = tracer
        self.loop = loop
        self.sync_ms = sync_ms
        self.config = BookieConfig()
        self.up = True
        self.lost = False  # its disk was lost: only a format brings it back (empty)
        self.formatted = False  # re-added after the loss, as a new instance
        self.lost_entries: dict[int, set[int]] = {}  # what the lost disk held
        self.limbo_floor = 0  # ledger ids below it: never "no such entry" (bookie limbo)
        self.incarnation = 0
        self.slow_ms = 0
        self.refuses_connections = True  # while down: refuse (else: silence)
        self._memory = MemoryLedgerStore()  # what the running bookie holds
        self._durable = MemoryLedgerStore()  # what its disk holds: the synced journal, replayed
        self._journal: list[tuple[bytes, asyncio.Future[None] | None]] = []  # not yet synced
        self._journal_index = 0
        self._disk_keys: dict[int, bytes] = {}  # replay's master-key cache, for the disk
        self._sync_scheduled = False
        self.waiters = LacWaiters(self.config.long_poll_parked_max)

    # ----- durability -----------------------------------------------------------

    def _log(self, write: JournalWrite) -> asyncio.Future[None] | None:
        """Journal the records of a change (already applied to memory by the
        bookie's rules); a future for the answer's "fsync" (None: answer now)."""
        records = write.records
        future = self.loop.create_future() if write.answer_when_durable else None
        for i, record in enumerate(records):
            self._journal.append((record, future if i == len(records) - 1 else None))
        if records and not self._sync_scheduled:
            self._sync_scheduled = True
            delay = self.rng.randint(*self.sync_ms) + self.slow_ms
            incarnation = self.incarnation
            self.loop.call_later(delay / 1000, self._sync, incarnation)
        return future

    def _to_disk(self, record: bytes) -> None:
        """A journal record reached the disk: what a restart replays (real replay rule)."""
        self._journal_index += 1
        apply_journal_record(self._durable, self._journal_index, record, self._disk_keys)

    def _sync(self, incarnation: int) -> None:
        if incarnation != self.incarnation:
            return
        self._sync_scheduled = False
        journal, self._journal = self._journal, []
        for record, future in journal:
            self._to_disk(record)
            if future is not None and not future.done():
                future.set_result(None)

    def crash(self, *, lose_disk: bool = False) -> str:
        """Stop; keep what was synced (and maybe a prefix of the rest)."""
        self.up = False
        self.incarnation += 1
        self._sync_scheduled = False
        kept = self.rng.randint(0, len(self._journal)) if self.rng.random() < 0.3 else 0
        for record, _ in self._journal[:kept]:
            self._to_disk(record)
        lost = len(self._journal) - kept
        self._journal = []
        self.waiters.cancel_all()
        if lose_disk:
            self.lost = True
            self.formatted = False
            for ledger_id in self._durable.ledger_ids():
                self.lost_entries.setdefault(ledger_id, set()).update(
                    self._durable.entries(ledger_id))
            self._durable = MemoryLedgerStore()
            self._disk_keys = {}
        self._memory = self._durable.copy()
        return f"unsynced records lost={lost} kept={kept}" + (" DISK LOST" if lose_disk else "")

    def restart(self) -> None:
        invariant(not self.lost or self.formatted,
                  f"bookie {self.id} lost its disk: it starts again only after a format")
        self.up = True

    def start_formatted(self, limbo_floor: int) -> None:
        """Come back after ``quorumlog bookie format``: empty, a new instance, with
        the ledgers older than ``limbo_floor`` in limbo."""
        invariant(self.lost and not self.up, f"bookie {self.id}: format is for a lost disk")
        self.formatted = True
        self.limbo_floor = limbo_floor
        self.up = True

    # ----- requests (the bookie's rules: quorumlog.bookie) ----------------------------

    def _absent(self, error: NoSuchEntryError | NoSuchLedgerError, ledger_id: int,
                entry_id: int) -> QuorumlogError:
        return absent_error(error, self.id, ledger_id, entry_id, self.limbo_floor)

    def add(self, ledger_id: int, entry_id: int, key: bytes, envelope: bytes,
            flags: int) -> asyncio.Future[None] | None:
        asked = add_flags(flags)
        future = self._log(add_entry(self._memory, ledger_id, entry_id, bytes(envelope), key,
                                     recovery=asked.recovery, journal_data=asked.journal_data))
        self._wake(ledger_id)
        return future

    def add_batch(self, ledger_id: int, key: bytes, entries: list[tuple[int, bytes]],
                  flags: int) -> list[QuorumlogError | None] | asyncio.Future[Any]:
        """A batch of adds, by the bookie's rules: the batch checked as the server
        checks it, each entry applied in order, one "fsync" answers them all."""
        entries = split_batch(b"".join(data for _, data in entries), [e for e, _ in entries],
                              [len(data) for _, data in entries])
        asked = add_flags(flags)
        batch = add_entries(self._memory, ledger_id, entries, key, recovery=asked.recovery,
                            entry_max_bytes=self.config.storage.entry_max_bytes,
                            journal_data=asked.journal_data)
        durable = self._log(batch.write)
        self._wake(ledger_id)
        errors = list(batch.errors)
        if durable is None:
            return errors  # nothing accepted: answer now
        answer: asyncio.Future[list[QuorumlogError | None]] = self.loop.create_future()

        def synced(_: asyncio.Future[None]) -> None:
            if durable.cancelled():
                answer.cancel()
            elif not answer.done():
                answer.set_result(errors)

        durable.add_done_callback(synced)
        return answer

    def flush_ledger(self, ledger_id: int, key: bytes,
                     entry_ids: Sequence[int]) -> asyncio.Future[int]:
        """The server's checkpoint flush, then its check: after a delay the journal
        is synced and the disk holds what memory holds; answered with the count,
        or NoSuchEntryError when some of ``entry_ids`` are not on the disk then."""
        if len(entry_ids) > wire.FLUSH_ENTRIES_MAX:
            raise QuorumlogError(f"a flush checks at most {wire.FLUSH_ENTRIES_MAX} entries")
        info = self._memory.ledger_info(ledger_id)
        if not hmac.compare_digest(info.master_key, key):
            raise UnauthorizedError(f"master key does not match ledger {ledger_id}'s")
        out: asyncio.Future[int] = self.loop.create_future()
        incarnation = self.incarnation

        def flushed() -> None:
            if incarnation != self.incarnation or out.done():
                return  # crashed meanwhile: never answered
            self._sync(incarnation)
            self._durable = self._memory.copy()
            held = self._durable.entries(ledger_id)
            missing = [entry_id for entry_id in entry_ids if entry_id not in held]
            if missing:
                out.set_exception(NoSuchEntryError(
                    f"bookie {self.id} lost {len(missing)} entries of ledger {ledger_id}"))
                out.exception()  # retrieved: a run may end before the client reads it
            else:
                out.set_result(len(entry_ids))

        delay_ms = self.rng.randint(*self.sync_ms) + self.slow_ms
        self.loop.call_later(delay_ms / 1000, flushed)
        return out

    def fence(self, ledger_id: int, key: bytes) -> asyncio.Future[None] | None:
        future = self._log(fence_ledger(self._memory, ledger_id, key))
        self._wake(ledger_id)
        return future

    def read_entry(self, ledger_id: int, entry_id: int) -> EntryReply:
        try:
            envelope = self._memory.get_entry(ledger_id, entry_id)
        except (NoSuchEntryError, NoSuchLedgerError) as exc:
            raise self._absent(exc, ledger_id, entry_id) from None
        return EntryReply(envelope, self._memory.last_add_confirmed(ledger_id))

    def read_batch(self, ledger_id: int, first: int, max_entries: int,
                   max_bytes: int) -> BatchReply:
        max_entries, max_bytes = batch_bounds(self.config, max_entries, max_bytes)
        try:
            entries = self._memory.read_batch(ledger_id, first, max_entries, max_bytes)
        except (NoSuchEntryError, NoSuchLedgerError) as exc:
            raise self._absent(exc, ledger_id, first) from None
        return BatchReply(b"".join(entries), [len(e) for e in entries],
                          self._memory.last_add_confirmed(ledger_id))

    def lac_reply(self, ledger_id: int, previous_lac: int, with_entry: bool) -> LacReply:
        info = self._memory.ledger_info(ledger_id)
        envelope = lac_entry(self._memory, ledger_id, previous_lac) if with_entry else b""
        return LacReply(info.last_add_confirmed, info.last_entry_id, info.fenced,
                        envelope or None)

    def lac_now(self, ledger_id: int) -> int | None:
        return lac_or_none(self._memory, ledger_id)

    def write_lac(self, ledger_id: int, key: bytes, lac: int) -> asyncio.Future[None] | None:
        future = self._log(write_lac(self._memory, ledger_id, key, lac))
        self._wake(ledger_id)
        return future

    def long_poll(self, ledger_id: int, previous_lac: int, wait_ms: int,
                  with_entry: bool) -> asyncio.Future[LacReply]:
        """Answer a LAC read once the LAC passes ``previous_lac`` or ``wait_ms`` ends
        (as the bookie server: at the waiter bound, answer at once)."""
        out: asyncio.Future[LacReply] = self.loop.create_future()

        def answer() -> None:
            try:
                out.set_result(self.lac_reply(ledger_id, previous_lac, with_entry))
            except QuorumlogError as exc:
                out.set_exception(exc)
                out.exception()  # retrieved: a run may end before the client reads it

        if self.waiters.full:
            answer()
            return out
        waiter = self.waiters.park(ledger_id, previous_lac)
        timer = self.loop.call_later(wait_ms / 1000, _succeed, waiter, None)

        def settled(_: asyncio.Future[None]) -> None:
            timer.cancel()
            self.waiters.unpark(ledger_id, waiter)
            if waiter.cancelled():
                out.cancel()
            elif not out.done():
                answer()

        waiter.add_done_callback(settled)
        return out

    def _wake(self, ledger_id: int) -> None:
        if self.waiters:
            self.waiters.wake(ledger_id, lac_or_none(self._memory, ledger_id))

    def delete_ledger(self, ledger_id: int, key: bytes) -> bool:
        """Drop the local copy (the bookie's ``DeleteLedgerRequest``; the key must
        match). Applied to the disk at once: a copy coming back after a crash is
        harmless, and not what a run checks."""
        info = self._memory.ledger_info(ledger_id)
        if not hmac.compare_digest(info.master_key, key):
            raise UnauthorizedError(f"master key does not match ledger {ledger_id}'s")
        self._durable.delete_ledger(ledger_id)
        return self._memory.delete_ledger(ledger_id)

    def entries(self, ledger_id: int) -> dict[int, bytes]:
        """The entries the running bookie holds (a copy)."""
        return self._memory.entries(ledger_id)

    def damage_entry(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        """A fault: the held copy of an entry is replaced (bit rot)."""
        self._memory.damage_entry(ledger_id, entry_id, data)

    def durable_entries(self, ledger_id: int) -> dict[int, bytes]:
        return self._durable.entries(ledger_id)


@dataclass(slots=True)
class NetworkFaults:
    delay_ms_min: int = 0
    delay_ms_max: int = 2
    drop_probability: float = 0.0
    refused_delay_ms: int = 1


class SimNetworkState:
    """Links between clients and bookies: partitions, faults, the bookies."""

    def __init__(self, rng: random.Random, tracer: Tracer,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.rng = rng
        self.tracer = tracer
        self.loop = loop
        self.faults = NetworkFaults()
        self.bookies: dict[str, SimBookie] = {}
        self.blocked: set[tuple[str, str]] = set()  # (client, bookie), both ways
        self.cut_clients: dict[str, float] = {}  # crashed clients -> when they died
        self.requests = 0
        self.request_counts: dict[str, int] = {}  # by request kind

    def delay_s(self) -> float:
        return self.rng.randint(self.faults.delay_ms_min, self.faults.delay_ms_max) / 1000

    def link_up(self, client: str, bookie: str) -> bool:
        return client not in self.cut_clients and (client, bookie) not in self.blocked

    def crash_client(self, client: str) -> None:
        """The client dies: nothing more in or out; each request it had sent is
        still delivered or not at random (what was in the kernel's buffers)."""
        self.cut_clients[client] = self.loop.time()

    def delivers(self, client: str, bookie: str, sent_s: float) -> bool:
        """Whether a request sent at ``sent_s`` reaches the bookie now."""
        if (client, bookie) in self.blocked:
            return False
        died = self.cut_clients.get(client)
        return died is None or (sent_s < died and self.rng.random() < 0.5)

    def lost(self) -> bool:
        return self.faults.drop_probability > 0 and self.rng.random() < self.faults.drop_probability


Handler = Callable[[SimBookie], Any]


class SimBookieNetwork:
    """A :class:`quorumlog.ledger.BookieTransport` for one simulated client."""

    def __init__(self, client: str, state: SimNetworkState) -> None:
        self.client = client
        self.state = state

    def _request(self, bookie_id: str, what: str, handler: Handler,
                 timeout_s: float) -> asyncio.Future[Any]:
        state = self.state
        loop = state.loop
        state.requests += 1
        state.request_counts[what] = state.request_counts.get(what, 0) + 1
        future: asyncio.Future[Any] = loop.create_future()
        timer = loop.call_later(timeout_s, _expire, future,
                                f"{what} to bookie {bookie_id} got no response within "
                                f"{timeout_s:.3f}s")
        future.add_done_callback(lambda _: timer.cancel())
        bookie = state.bookies.get(bookie_id)
        if bookie is None:
            loop.call_soon(_fail, future, rpc.ConnectFailedError(f"unknown bookie {bookie_id}"))
            return future
        if not state.link_up(self.client, bookie_id) or state.lost():
            return future  # lost: the caller times out
        if not bookie.up:
            if bookie.refuses_connections:
                loop.call_later(state.faults.refused_delay_ms / 1000, _fail, future,
                                rpc.ConnectFailedError(f"cannot connect to {bookie_id}"))
            return future
        loop.call_later(state.delay_s() + bookie.slow_ms / 1000, self._deliver, bookie,
                        bookie.incarnation, handler, future, loop.time())
        return future

    def _deliver(self, bookie: SimBookie, incarnation: int, handler: Handler,
                 future: asyncio.Future[Any], sent_s: float) -> None:
        if not bookie.up or bookie.incarnation != incarnation:
            return
        if not self.state.delivers(self.client, bookie.id, sent_s):
            return
        try:
            result = handler(bookie)
        except QuorumlogError as exc:
            self._respond(bookie, incarnation, future, None, exc)
            return
        if isinstance(result, asyncio.Future):
            result.add_done_callback(
                lambda f: self._respond(bookie, incarnation, future, *_outcome(f)))
        else:
            self._respond(bookie, incarnation, future, result, None)

    def _respond(self, bookie: SimBookie, incarnation: int, future: asyncio.Future[Any],
                 result: Any, error: BaseException | None) -> None:
        if isinstance(error, _CancelledError) or bookie.incarnation != incarnation:
            return  # the bookie crashed before answering
        state = self.state
        if not state.link_up(self.client, bookie.id) or state.lost():
            return
        if error is not None:
            state.loop.call_later(state.delay_s(), _fail, future, error)
        else:
            state.loop.call_later(state.delay_s(), _succeed, future, result)

    # ----- BookieTransport --------------------------------------------------------

    def add_entry(self, bookie: str, ledger_id: int, entry_id: int, master_key: bytes,
                  envelope: bytes, *, flags: int, timeout_s: float) -> asyncio.Future[Any]:
        return self._request(
            bookie, "AddEntryRequest",
            lambda b: b.add(ledger_id, entry_id, master_key, envelope, flags), timeout_s)

    def add_entries(self, bookie: str, ledger_id: int, master_key: bytes,
                    entries: Sequence[tuple[int, bytes]], *, flags: int,
                    timeout_s: float) -> asyncio.Future[list[QuorumlogError | None]]:
        batch = [(entry_id, bytes(envelope)) for entry_id, envelope in entries]
        return self._request(
            bookie, "AddEntriesRequest",
            lambda b: b.add_batch(ledger_id, master_key, batch, flags), timeout_s)

    async def flush_ledger(self, bookie: str, ledger_id: int, master_key: bytes,
                           entry_ids: Sequence[int], *, timeout_s: float) -> int:
        ids = list(entry_ids)
        result: int = await self._request(
            bookie, "FlushLedgerRequest", lambda b: b.flush_ledger(ledger_id, master_key, ids),
            timeout_s)
        return result

    async def read_entry(self, bookie: str, ledger_id: int, entry_id: int, *,
                         timeout_s: float, fence: bool = False,
                         master_key: bytes = b"") -> EntryReply:
        if not fence:
            result: EntryReply = await self._request(
                bookie, "ReadEntryRequest", lambda b: b.read_entry(ledger_id, entry_id),
                timeout_s)
            return result

        def fenced_read(b: SimBookie) -> asyncio.Future[EntryReply]:
            synced = b.fence(ledger_id, master_key)
            out: asyncio.Future[EntryReply] = b.loop.create_future()

            def answer(_: Any) -> None:
                if out.done():
                    return
                try:
                    out.set_result(b.read_entry(ledger_id, entry_id))
                except QuorumlogError as exc:
                    out.set_exception(exc)
                    out.exception()  # retrieved: a run may end before the client reads it

            if synced is None:
                answer(None)
            else:
                synced.add_done_callback(
                    lambda f: out.cancel() if f.cancelled() else answer(None))
            return out

        result = await self._request(bookie, "ReadEntryRequest(fence)", fenced_read,
                                     timeout_s)
        return result

    async def read_batch(self, bookie: str, ledger_id: int, first_entry_id: int, *,
                         max_entries: int, max_bytes: int, timeout_s: float) -> BatchReply:
        result: BatchReply = await self._request(
            bookie, "ReadBatchRequest",
            lambda b: b.read_batch(ledger_id, first_entry_id, max_entries, max_bytes),
            timeout_s)
        return result

    async def read_lac(self, bookie: str, ledger_id: int, *, timeout_s: float,
                       previous_lac: int = -1, long_poll_ms: int = 0,
                       with_entry: bool = False) -> LacReply:
        def handle(b: SimBookie) -> LacReply | asyncio.Future[LacReply]:
            # Like the real bookie, a long poll on a ledger it does not know
            # (yet) waits too, and answers NoSuchLedgerError if it still does not.
            wait_ms = long_poll_ms_of(b.config, long_poll_ms)
            if wait_ms > 0 and not lac_passed(b.lac_now(ledger_id), previous_lac):
                return b.long_poll(ledger_id, previous_lac, wait_ms, with_entry)
            return b.lac_reply(ledger_id, previous_lac, with_entry)

        result: LacReply = await self._request(
            bookie, "ReadLacRequest", handle, timeout_s + long_poll_ms / 1000)
        return result

    async def fence(self, bookie: str, ledger_id: int, master_key: bytes, *,
                    timeout_s: float) -> LacReply:
        def handle(b: SimBookie) -> asyncio.Future[LacReply]:
            synced = b.fence(ledger_id, master_key)
            out: asyncio.Future[LacReply] = b.loop.create_future()

            def answer() -> None:
                if out.done():
                    return
                try:  # the bookie may have lost its disk since the fence synced
                    out.set_result(b.lac_reply(ledger_id, -1, False))
                except QuorumlogError as exc:
                    out.set_exception(exc)
                    out.exception()  # retrieved: a run may end before the client reads it

            if synced is None:
                answer()
            else:
                synced.add_done_callback(lambda f: out.cancel() if f.cancelled() else answer())
            return out

        result: LacReply = await self._request(bookie, "FenceRequest", handle, timeout_s)
        return result

    async def write_lac(self, bookie: str, ledger_id: int, master_key: bytes, lac: int, *,
                        timeout_s: float) -> None:
        await self._request(bookie, "WriteLacRequest",
                            lambda b: b.write_lac(ledger_id, master_key, lac), timeout_s)

    async def delete_ledger(self, bookie: str, ledger_id: int, master_key: bytes, *,
                            timeout_s: float) -> bool:
        def handle(b: SimBookie) -> bool:
            try:
                return b.delete_ledger(ledger_id, master_key)
            except NoSuchLedgerError:
                return False

        result: bool = await self._request(bookie, "DeleteLedgerRequest", handle, timeout_s)
        return result

    async def close(self) -> None:
        return None


class _CancelledError(Exception):
    pass


def _outcome(future: asyncio.Future[Any]) -> tuple[Any, BaseException | None]:
    if future.cancelled():
        return None, _CancelledError()
    error = future.exception()
    return (None, error) if error is not None else (future.result(), None)


def _expire(future: asyncio.Future[Any], message: str) -> None:
    if not future.done():
        future.set_exception(DeadlineExceededError(message))


def _fail(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


def _succeed(future: asyncio.Future[Any], result: Any) -> None:
    if not future.done():
        future.set_result(result)


class SimMetaStore:
    """Meta for the simulation: atomic CAS with latency, bookie registrations,
    and the metadata invariants checked on every write."""

    def __init__(self, rng: random.Random, tracer: Tracer, network: SimNetworkState,
                 delay_ms: tuple[int, int] = (1, 3)) -> None:
        self.rng = rng
        self.tracer = tracer
        self.network = network
        self.delay_ms = delay_ms
        self._data: dict[str, tuple[bytes, int, int, int]] = {}  # value, version, create, mod
        self._revision = 0
        self._ids: dict[str, int] = {}
        self.violations: list[LedgerViolation] = []
        self.closed_seen: dict[int, int] = {}  # ledger -> last entry when first closed

    async def _latency(self) -> None:
        await asyncio.sleep(self.rng.randint(*self.delay_ms) / 1000)

    def _kv(self, key: str) -> KeyValue | None:
        item = self._data.get(key)
        if item is None:
            return None
        value, version, create, mod = item
        return KeyValue(key=key, value=value, create_revision=create, mod_revision=mod,
                        version=version)

    async def get(self, key: str) -> KeyValue | None:
        await self._latency()
        kv = self._kv(key)
        await self._latency()
        return kv

    async def cas(self, key: str, expected_version: int, value: bytes) -> bool:
        await self._latency()
        current = self._data.get(key)
        version = current[1] if current else 0
        ok = version == expected_version
        if ok:
            self._write(key, value, current)
        await self._latency()
        return ok

    def _write(self, key: str, value: bytes, current: tuple[bytes, int, int, int] | None) -> None:
        self._revision += 1
        self._check_ledger_write(key, current[0] if current else None, value)
        create = current[2] if current else self._revision
        self._data[key] = (value, (current[1] if current else 0) + 1, create, self._revision)

    def _check_ledger_write(self, key: str, old: bytes | None, new: bytes) -> None:
        ledger_id = wire.ledger_id_of_key(key)
        if ledger_id is None:
            return
        metadata = LedgerMetadata.decode(new)
        state = f"{metadata.state.value}" + (
            f" last={metadata.last_entry_id}" if metadata.is_closed else "")
        fragments = _fragments(metadata)
        self.tracer.event(_ms(self.network),
                          f"META ledger {ledger_id} -> {state} ensembles=[{fragments}]")
        if old is not None:
            before = LedgerMetadata.decode(old)
            if before.is_closed and (not metadata.is_closed
                                     or metadata.last_entry_id != before.last_entry_id):
                self.violations.append(LedgerViolation(
                    "closed-ledger-changed",
                    f"ledger {ledger_id} was CLOSED at entry {before.last_entry_id} and was "
                    f"rewritten as {metadata.state.value} last={metadata.last_entry_id}"))
            if before.state is LedgerState.IN_RECOVERY and metadata.state is LedgerState.OPEN:
                self.violations.append(LedgerViolation(
                    "recovery-undone", f"ledger {ledger_id} went from IN_RECOVERY back to OPEN"))
            if (before.state is LedgerState.IN_RECOVERY
                    and metadata.state is LedgerState.IN_RECOVERY
                    and metadata.ensembles != before.ensembles):
                # While IN_RECOVERY the metadata must name the writer's ensembles:
                # a recovery fragment published before its bookies hold the
                # entries lets a concurrent recoverer count their "no such entry".
                self.violations.append(LedgerViolation(
                    "recovery-ensemble-published",
                    f"ledger {ledger_id}: an ensemble change was published while IN_RECOVERY "
                    f"(fragments {_fragments(before)} -> {_fragments(metadata)})"))
        if metadata.is_closed:
            first = self.closed_seen.setdefault(ledger_id, metadata.last_entry_id)
            if first != metadata.last_entry_id:
                self.violations.append(LedgerViolation(
                    "closed-ledger-changed",
                    f"ledger {ledger_id} closed at {first}, later at {metadata.last_entry_id}"))

    def peek_next_ledger_id(self) -> int:
        """The ledger id ``next_id`` would hand out now (no latency; the operator's view)."""
        return self._ids.get(wire.LEDGER_ID_COUNTER, 0) + 1

    async def next_id(self, name: str, count: int = 1) -> int:
        await self._latency()
        first = self._ids.get(name, 0) + 1
        self._ids[name] = first + count - 1
        await self._latency()
        return first

    async def list_keys(self, prefix: str, *, limit: int = 0) -> list[KeyValue]:
        await self._latency()
        if prefix == wire.BOOKIE_REGISTRY_PREFIX:
            out = [
                KeyValue(key=prefix + b.id, value=wire.BookieRegistration(
                    id=b.id, address=b.id, labels={"rack": f"rack-{i % 3}"}).encode(),
                    create_revision=1, mod_revision=1, version=1)
                for i, b in enumerate(self.network.bookies.values()) if b.up
            ]
        else:
            out = [kv for key in sorted(self._data) if key.startswith(prefix)
                   if (kv := self._kv(key)) is not None]
        await self._latency()
        return out[:limit] if limit else out

    async def delete(self, key: str, *, prefix: bool = False) -> int:
        await self._latency()
        keys = [k for k in sorted(self._data) if k.startswith(key)] if prefix else (
            [key] if key in self._data else [])
        for k in keys:
            del self._data[k]
        await self._latency()
        return len(keys)

    def peek(self, ledger_id: int) -> LedgerMetadata | None:
        """The metadata as stored now (no latency; for the checker)."""
        item = self._data.get(wire.ledger_key(ledger_id))
        return LedgerMetadata.decode(item[0]) if item else None


def _fragments(metadata: LedgerMetadata) -> str:
    return " ".join(f"{f.first_entry_id}:{','.join(f.bookies)}" for f in metadata.ensembles)


def _ms(network: SimNetworkState) -> int:
    return int(network.loop.time() * 1000 + 1e-9)


class LedgerWorld:
    """Bookies, meta and network on the running (virtual-time) loop, and
    clients plugged into them: the setting of simulator runs and of the
    ledger client's deterministic unit tests."""

    def __init__(self, *, bookies: int, seed: int = 0, tracer: Tracer | None = None,
                 delay_ms_max: int = 2, sync_ms: tuple[int, int] = (0, 2)) -> None:
        self.loop = asyncio.get_running_loop()
        root = random.Random(seed)
        self.tracer = tracer or Tracer()
        self.network = SimNetworkState(random.Random(root.getrandbits(64)), self.tracer,
                                       self.loop)
        self.network.faults.delay_ms_max = delay_ms_max
        for i in range(bookies):
            self.add_bookie(f"b{i}", random.Random(root.getrandbits(64)), sync_ms)
        self.meta = SimMetaStore(random.Random(root.getrandbits(64)), self.tracer,
                                 self.network)
        self._client_rng = random.Random(root.getrandbits(64))

    def add_bookie(self, bookie_id: str, rng: random.Random,
                   sync_ms: tuple[int, int] = (0, 2)) -> SimBookie:
        bookie = SimBookie(bookie_id, rng, self.tracer, self.loop, sync_ms)
        self.network.bookies[bookie_id] = bookie
        return bookie

    @property
    def bookies(self) -> dict[str, SimBookie]:
        return self.network.bookies

    def now_ms(self) -> int:
        return _ms(self.network)

    # The clients' quorumlog.clock.Clock: the world's virtual time.
    def wall_ms(self) -> int:
        return _ms(self.network)

    def monotonic_s(self) -> float:
        return _ms(self.network) / 1000

    def transport(self, name: str) -> SimBookieNetwork:
        """The ``BookieTransport`` of a client called ``name`` in this world."""
        return SimBookieNetwork(name, self.network)

    def client(self, name: str, config: Any = None, *, log: Any = None,
               transport: Any = None) -> Any:
        """A ``LedgerClient`` whose bookie traffic goes through this world as
        ``name`` (through ``transport`` when given, e.g. a wrapper of
        :meth:`transport`)."""
        from quorumlog.ledger import LedgerClient

        bookies = transport if transport is not None else self.transport(name)
        return LedgerClient(self.meta, bookies, config=config,
                            rng=random.Random(self._client_rng.getrandbits(64)),
                            clock=self, log=log or _QuietLog())


class _QuietLog:
    def _event(self, event: str, **kw: Any) -> None:
        return None

    debug = info = warning = error = _event
