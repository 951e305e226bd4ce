"""Seeded simulator runs of the ledger protocol.

The real client code (``quorumlog.ledger``: write handle, ensemble changes,
recovery, reads, long polls) runs on a virtual-time event loop against
simulated bookies and meta (``_ledger_world``). One run:

- a writer creates a ledger with a random (E, Qw, Qa), digest and pipeline
  depth, and appends entries;
- a tailing reader opens the ledger without recovery and follows it with
  ``wait_for_entry`` (long polls), checking every entry it sees;
- the nemesis of the fault mix crashes and restarts bookies (a crash loses
  what the bookie had not synced; at most Qa - 1 bookies lose their disk for
  good), partitions clients from bookies, makes bookies slow, drops messages;
  a bookie whose disk was lost is started again by the "operator": the
  bookie's identity check (``bookie._cookie.decide``) must refuse it, and a
  format may then re-add it, empty, answering for older ledgers by the
  bookie's limbo rule (``bookie.limbo_error``: "unknown", never "no such
  entry");
- the run ends one of three ways: the writer closes the ledger; the writer
  crashes and a recovering client (sometimes two at once) opens the ledger
  with recovery; or the writer keeps writing (a "zombie") while it is
  recovered from under it;
- then faults heal, the ledger is recovered (retrying while recovery cannot
  decide) and read back in full.

Invariants (a failure names one and the seed replays it):

- ``acked-lost``: every entry acknowledged to the writer is readable after
  recovery, with its payload;
- ``fenced-writer-committed``: after the ledger is closed by recovery, the
  old writer gets no acknowledgement past the closed last entry;
- ``closed-ledger-changed``: once CLOSED, the last entry never changes
  (checked on every metadata write, and by reopening);
- ``recoveries-disagree``: concurrent recoveries return the same last entry;
- ``recovery-ensemble-published``: while a ledger is IN_RECOVERY its
  ensembles never change (a recovery publishes its ensemble changes only in
  the close);
- ``under-replicated``: once closed, every entry up to the last is held
  durably by at least Qa bookies of its write set in the closed metadata (a
  bookie that lost its disk counts as holding it: that loss is the
  nemesis's, at most Qa - 1 of them) - the write sets recovery published can
  vouch for their entries;
- ``read-past-lac``: a reader never sees an entry past the LAC (the writer's,
  or the closed ledger's), nor a payload the writer did not write;
- ``acks-out-of-order``: appends complete in entry order;
- ``liveness``: once faults heal, recovery succeeds and the run finishes.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import random
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quorumlog import rpc
from quorumlog.bookie import Cookie, DirectoryRole, DirectoryState, InvalidCookieError, decide
from quorumlog.errors import InvariantViolation, QuorumlogError
from quorumlog.ledger import (
    LedgerClient,
    LedgerClientConfig,
    LedgerEntry,
    ReadHandle,
    WriteHandle,
)
from quorumlog.sim._ledger_loop import SimDeadlockError, run_virtual
from quorumlog.sim._ledger_world import LedgerViolation, LedgerWorld, SimBookie
from quorumlog.sim._trace import Tracer

PASSWORD = b"sim-password"

SHAPES = [(3, 3, 2), (3, 2, 2), (3, 3, 3), (5, 3, 2), (4, 3, 2), (2, 2, 1), (3, 3, 1),
          (5, 5, 3), (4, 2, 2), (3, 2, 1), (5, 4, 3), (1, 1, 1)]
"""(E, Qw, Qa) shapes runs pick from."""

FINAL_RECOVERY_ATTEMPTS_MAX = 20
"""Recovery attempts after the heal before the run is declared not live."""

FORMAT_PROBABILITY = 0.6
"""Of a refused start after a lost disk: the operator re-adds the bookie (else
it stays out for good)."""

RUN_VIRTUAL_MS_MAX = 600_000
"""A run that has not finished after this much virtual time is not live."""


@dataclass(frozen=True, slots=True)
class LedgerFaultMix:
    """What goes wrong in a run (probabilities per nemesis step)."""

    name: str
    crash_probability: float = 0.0
    lose_disk_probability: float = 0.0  # of a crash: the disk is gone for good
    partition_probability: float = 0.0
    slow_probability: float = 0.0
    drop_probability: float = 0.0
    delay_ms_max: int = 2
    # Aimed at the start of recovery (when a fault does the most harm).
    recovery_partition_probability: float = 0.0
    recovery_crash_probability: float = 0.0
    endings: tuple[str, ...] = ("close", "crash", "zombie")


LEDGER_MIXES: dict[str, LedgerFaultMix] = {
    m.name: m for m in (
        LedgerFaultMix("calm"),
        LedgerFaultMix("crashes", crash_probability=0.15, lose_disk_probability=0.3,
                       recovery_crash_probability=0.5),
        LedgerFaultMix("partitions", partition_probability=0.2,
                       recovery_partition_probability=0.7),
        LedgerFaultMix("slow", slow_probability=0.2, delay_ms_max=5),
        LedgerFaultMix("lossy", drop_probability=0.03, delay_ms_max=4),
        # Aimed at recovery: slow and lossy links leave the last entries on some
        # bookies only, the writer always dies or is taken over, and bookies
        # crash or are cut off from the recoverer as recovery starts.
        LedgerFaultMix("recovery", slow_probability=0.3, drop_probability=0.02,
                       delay_ms_max=6, recovery_partition_probability=0.6,
                       recovery_crash_probability=0.8, lose_disk_probability=0.3,
                       endings=("crash", "zombie")),
        LedgerFaultMix("everything", crash_probability=0.08, lose_disk_probability=0.3,
                       partition_probability=0.08, slow_probability=0.08,
                       drop_probability=0.01, delay_ms_max=4,
                       recovery_partition_probability=0.5, recovery_crash_probability=0.3),
    )
}
LEDGER_MIX_ROTATION = tuple(LEDGER_MIXES)


def ledger_mix_for_seed(name: str, seed: int) -> LedgerFaultMix:
    """The mix called ``name``; "all" rotates through every mix by seed."""
    if name == "all":
        return LEDGER_MIXES[LEDGER_MIX_ROTATION[seed % len(LEDGER_MIX_ROTATION)]]
    if name not in LEDGER_MIXES:
        from quorumlog.errors import UsageError

        raise UsageError(f"unknown ledger fault mix {name!r}: use "
                         f"{', '.join(LEDGER_MIX_ROTATION)} or all")
    return LEDGER_MIXES[name]


@dataclass(slots=True)
class LedgerSimResult:
    seed: int
    mix: str
    passed: bool
    violation: str = ""
    detail: str = ""
    shape: tuple[int, int, int] = (0, 0, 0)
    ending: str = ""
    trace: list[str] = field(default_factory=list)
    trace_hash: str = ""
    stats: dict[str, int] = field(default_factory=dict)


class _SimLog:
    """The ledger client's logger in a run: events go to the transcript."""

    def __init__(self, tracer: Tracer, now_ms: Callable[[], int], name: str) -> None:
        self._tracer = tracer
        self._now_ms = now_ms
        self._name = name

    def _event(self, event: str, **kw: Any) -> None:
        if self._tracer.enabled:
            fields = " ".join(f"{k}={v}" for k, v in kw.items())
            self._tracer.event(self._now_ms(), f"{self._name} {event} {fields}".rstrip())

    debug = info = warning = error = _event


@dataclass(slots=True)
class _Truth:
    """What happened, as the checker knows it."""

    ledger_id: int | None = None
    attempted: dict[int, bytes] = field(default_factory=dict)
    acked: dict[int, tuple[bytes, int]] = field(default_factory=dict)  # entry -> payload, ms
    last_ack: int = -1
    writer: WriteHandle | None = None
    closed_by_recovery_ms: int | None = None
    recovered_last: list[int] = field(default_factory=list)
    seen: int = 0


class LedgerSimulation:
    """One seeded run (see the module docstring)."""

    def __init__(self, seed: int, mix: LedgerFaultMix, *, keep_trace: bool = False) -> None:
        self.seed = seed
        self.mix = mix
        root = random.Random(seed)
        streams = [random.Random(root.getrandbits(64)) for _ in range(8)]
        self.rng_plan, self.rng_nemesis, self.rng_net, self.rng_bookies = streams[:4]
        self.rng_meta, self.rng_writer, self.rng_clients, self.rng_reader = streams[4:]
        self.tracer = Tracer(keep_lines=keep_trace)
        self.shape: tuple[int, int, int] = self.rng_plan.choice(SHAPES)
        self.ending = self.rng_plan.choice(mix.endings)
        self.recoverers = 2 if self.rng_plan.random() < 0.35 else 1
        self.digest = self.rng_plan.choice(["crc32c", "hmac-sha256"])
        self.entries = self.rng_plan.randint(5, 120)
        self.window = self.rng_plan.choice([1, 2, 4, 16, 64])
        self.bookie_count = self.shape[0] + self.rng_plan.randint(1, 3)
        self.end_ms = self.rng_plan.randint(20, 300)
        self.truth = _Truth()
        self.violations: list[LedgerViolation] = []
        self.loop: asyncio.AbstractEventLoop | None = None
        self.clients = 0
        self.disks_lost = 0

    # ----- setup ------------------------------------------------------------------

    def now_ms(self) -> int:
        assert self.loop is not None
        return int(self.loop.time() * 1000 + 1e-9)

    def trace(self, text: str) -> None:
        if self.tracer.enabled:
            self.tracer.event(self.now_ms(), text)

    def _client(self, name: str) -> LedgerClient:
        self.clients += 1
        config = LedgerClientConfig(
            add_timeout_ms=self.rng_clients.choice([100, 300, 1000]),
            read_timeout_ms=self.rng_clients.choice([100, 300]),
            speculative_read_delay_ms=20, explicit_lac_interval_ms=10,
            outstanding_adds_max=max(self.window, 1), ensemble_changes_max=64,
            replacement_attempts_max=10, replacement_backoff_ms=20,
        )
        client: LedgerClient = self.world.client(
            name, config, log=_SimLog(self.tracer, self.now_ms, name))
        return client

    def fail(self, name: str, detail: str) -> None:
        self.violations.append(LedgerViolation(name, detail))
        self.trace(f"VIOLATION {name}: {detail}")

    # ----- the run ----------------------------------------------------------------

    def run(self) -> LedgerSimResult:
        result = LedgerSimResult(self.seed, self.mix.name, True, shape=self.shape,
                                 ending=self.ending)
        try:
            run_virtual(self._main())
        except SimDeadlockError as exc:
            self.fail("liveness", f"deadlock: {exc}")
        except InvariantViolation as exc:
            self.fail("internal-invariant", f"{exc}\n{traceback.format_exc()}")
        violations = self.meta_violations() + self.violations
        if violations:
            first = violations[0]
            result.passed = False
            result.violation = first.invariant_name
            result.detail = first.detail
        result.trace = list(self.tracer.lines)
        result.trace_hash = self.tracer.digest()
        result.stats = {
            "entries_acked": len(self.truth.acked), "entries_seen": self.truth.seen,
            "bookie_requests": self.network.requests if self.loop else 0,
        }
        return result

    def meta_violations(self) -> list[LedgerViolation]:
        return list(self.meta.violations) if self.loop is not None else []

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.world = LedgerWorld(bookies=self.bookie_count, seed=self.rng_bookies.getrandbits(64),
                                 tracer=self.tracer, delay_ms_max=self.mix.delay_ms_max)
        self.network = self.world.network
        self.meta = self.world.meta
        e, w, a = self.shape
        self.trace(f"START seed={self.seed} mix={self.mix.name} shape=({e},{w},{a}) "
                   f"bookies={self.bookie_count} entries={self.entries} window={self.window} "
                   f"ending={self.ending} recoverers={self.recoverers} digest={self.digest}")
        try:
            async with asyncio.timeout(RUN_VIRTUAL_MS_MAX / 1000):
                await self._scenario()
        except TimeoutError:
            self.fail("liveness", f"the run did not finish within {RUN_VIRTUAL_MS_MAX} ms")

    async def _scenario(self) -> None:
        writer_client = self._client("writer")
        nemesis_stop = asyncio.Event()
        nemesis = asyncio.ensure_future(self._nemesis(nemesis_stop))
        writer_done = asyncio.Event()
        writer = asyncio.ensure_future(self._writer(writer_client, writer_done))
        ledger_ready = asyncio.ensure_future(self._wait_ledger())
        await asyncio.wait([writer, ledger_ready], return_when=asyncio.FIRST_COMPLETED)
        reader_stop = asyncio.Event()
        reader = asyncio.ensure_future(self._reader(reader_stop)) if (
            self.truth.ledger_id is not None) else None
        await self._ending(writer, writer_done)
        nemesis_stop.set()
        await nemesis
        self._heal()
        if not writer.done():
            await writer
        writer.result()
        await self._final_check()
        reader_stop.set()
        if reader is not None:
            await reader
            reader.result()
        ledger_ready.cancel()

    async def _wait_ledger(self) -> None:
        while self.truth.ledger_id is None:
            await asyncio.sleep(0.001)

    # ----- actors -------------------------------------------------------------------

    async def _writer(self, client: LedgerClient, done: asyncio.Event) -> None:
        e, w, a = self.shape
        truth = self.truth
        rng = self.rng_writer
        try:
            handle = await client.create_ledger(e, w, a, digest=self.digest, password=PASSWORD)
        except QuorumlogError as exc:
            self.trace(f"writer create failed: {exc}")
            done.set()
            return
        truth.ledger_id = handle.id
        truth.writer = handle
        self.trace(f"writer created ledger {handle.id} "
                   f"ensemble={list(handle.metadata.current_ensemble)}")
        in_flight: deque[asyncio.Future[int]] = deque()
        try:
            for i in range(self.entries + (10_000 if self.ending == "zombie" else 0)):
                if done.is_set():
                    break
                payload = f"s{self.seed}-e{i}-".encode() + bytes(rng.randint(0, 40))
                truth.attempted[i] = payload
                try:
                    future = handle.append_async(payload)
                except rpc.BackpressureError:
                    await in_flight[0]
                    future = handle.append_async(payload)
                future.add_done_callback(functools.partial(self._acked, index=i,
                                                           payload=payload))
                in_flight.append(future)
                while len(in_flight) >= self.window or (in_flight and in_flight[0].done()):
                    await in_flight.popleft()
                if rng.random() < 0.3:
                    await asyncio.sleep(rng.randint(0, 3) / 1000)
            while in_flight:
                await in_flight.popleft()
            if self.ending == "close" and not done.is_set():
                await handle.close()
                self.trace(f"writer closed ledger at {handle.last_add_confirmed}")
        except QuorumlogError as exc:
            self.trace(f"writer stopped: {type(exc).__name__}: {exc}")
            for future in in_flight:
                if future.done() and not future.cancelled():
                    future.exception()
            if self.ending != "crash":
                await self._zombie_close(handle)
        finally:
            done.set()

    async def _zombie_close(self, handle: WriteHandle) -> None:
        """A fenced writer's close must not succeed with another last entry."""
        try:
            await handle.close()
        except QuorumlogError as exc:
            self.trace(f"writer close failed: {type(exc).__name__}: {exc}")
            return
        final = self.meta.peek(handle.id)
        if final is not None and final.last_entry_id != handle.last_add_confirmed:
            self.fail("closed-ledger-changed",
                      f"writer closed ledger with LAC {handle.last_add_confirmed} but the "
                      f"metadata says {final.last_entry_id}")

    def _acked(self, future: asyncio.Future[int], *, index: int, payload: bytes) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        entry_id = future.result()
        truth = self.truth
        if entry_id != index:
            self.fail("acks-out-of-order", f"append #{index} completed as entry {entry_id}")
        if entry_id <= truth.last_ack:
            self.fail("acks-out-of-order",
                      f"entry {entry_id} acknowledged after entry {truth.last_ack}")
        truth.last_ack = max(truth.last_ack, entry_id)
        truth.acked[entry_id] = (payload, self.now_ms())
        closed = truth.closed_by_recovery_ms
        final = self.meta.peek(truth.ledger_id) if truth.ledger_id is not None else None
        if closed is not None and final is not None and final.is_closed and (
                entry_id > final.last_entry_id):
            self.fail("fenced-writer-committed",
                      f"entry {entry_id} acknowledged to the old writer at {self.now_ms()} ms, "
                      f"after recovery closed the ledger at entry {final.last_entry_id} "
                      f"({closed} ms)")
        self.trace(f"writer ack {entry_id}")

    def _lac_bound(self) -> int:
        bound = self.truth.writer.last_add_confirmed if self.truth.writer else -1
        if self.truth.ledger_id is not None:
            final = self.meta.peek(self.truth.ledger_id)
            if final is not None and final.is_closed:
                bound = max(bound, final.last_entry_id)
        return bound

    async def _reader(self, stop: asyncio.Event) -> None:
        assert self.truth.ledger_id is not None
        client = self._client("reader")
        handle: ReadHandle | None = None
        seen = -1
        while not stop.is_set():
            try:
                if handle is None:
                    handle = await client.open_ledger(self.truth.ledger_id, password=PASSWORD,
                                                      recovery=False)
                entry = await handle.wait_for_entry(seen, timeout_ms=20)
            except QuorumlogError as exc:
                self.trace(f"reader error: {type(exc).__name__}: {exc}")
                await asyncio.sleep(0.01)
                continue
            if entry is None:
                if handle.is_closed and seen >= handle.last_add_confirmed:
                    break
                continue
            self._check_seen(entry)
            seen = entry.entry_id
        await client.close()

    def _check_seen(self, entry: LedgerEntry) -> None:
        bound = self._lac_bound()
        self.truth.seen += 1
        if entry.entry_id > bound:
            self.fail("read-past-lac",
                      f"reader saw entry {entry.entry_id} while the LAC was {bound}")
        expected = self.truth.attempted.get(entry.entry_id)
        if expected != entry.payload:
            self.fail("read-past-lac",
                      f"reader saw entry {entry.entry_id} = {entry.payload[:30]!r}, the writer "
                      f"wrote {expected[:30] if expected else None!r}")

    async def _ending(self, writer: asyncio.Future[None], writer_done: asyncio.Event) -> None:
        if self.ending == "close":
            return
        await _sleep_until(writer, self.end_ms / 1000)
        if self.truth.ledger_id is None:
            return
        if self.ending == "crash":
            self.network.crash_client("writer")
            writer_done.set()
            if self.truth.writer is not None:
                await self.truth.writer.abort()
            self.trace("CRASH writer")
        self._targeted_faults()
        recoveries = [asyncio.ensure_future(self._recover(f"recoverer{i}"))
                      for i in range(self.recoverers)]
        results = [await r for r in recoveries]
        lasts = sorted({r for r in results if r is not None})
        if len(lasts) > 1:
            self.fail("recoveries-disagree", f"concurrent recoveries closed at {lasts}")
        if self.ending == "zombie":
            # The old writer keeps going a while after the close; then it stops.
            await _sleep_until(writer, 0.05)
            writer_done.set()

    def _targeted_faults(self) -> None:
        """Faults aimed at the moment recovery starts: a recoverer cut off from a
        bookie of the ensemble (its answers become "unknown"), a bookie crash."""
        rng = self.rng_nemesis
        mix = self.mix
        writer = self.truth.writer
        if writer is None:
            return
        ensemble = list(writer.metadata.current_ensemble)
        for i in range(self.recoverers):
            if rng.random() < mix.recovery_partition_probability:
                cut = rng.choice(ensemble)
                self.network.blocked.add((f"recoverer{i}", cut))
                self.trace(f"PARTITION recoverer{i} | {cut} (targeted)")
                self.loop_call_later(rng.randint(20, 400), self._unblock, f"recoverer{i}", cut)
        if rng.random() < mix.recovery_crash_probability:
            bookie = self.network.bookies[rng.choice(ensemble)]
            if bookie.up:
                self._crash(bookie, "(targeted) ", restart_ms=(20, 400))

    async def _recover(self, name: str, attempts: int = 3) -> int | None:
        assert self.truth.ledger_id is not None
        client = self._client(name)
        try:
            for attempt in range(attempts):
                try:
                    handle = await client.open_ledger(self.truth.ledger_id, password=PASSWORD)
                except QuorumlogError as exc:
                    self.trace(f"{name} recovery attempt {attempt} failed: "
                               f"{type(exc).__name__}: {exc}")
                    await asyncio.sleep(0.05)
                    continue
                last = handle.last_add_confirmed
                if self.truth.closed_by_recovery_ms is None:
                    self.truth.closed_by_recovery_ms = self.now_ms()
                self.truth.recovered_last.append(last)
                self.trace(f"{name} recovered ledger: last entry {last}")
                return last
            return None
        finally:
            await client.close()

    # ----- nemesis --------------------------------------------------------------------

    async def _nemesis(self, stop: asyncio.Event) -> None:
        rng = self.rng_nemesis
        mix = self.mix
        self.network.faults.drop_probability = mix.drop_probability
        while not stop.is_set():
            await asyncio.sleep(rng.randint(5, 20) / 1000)
            bookies = list(self.network.bookies.values())
            if rng.random() < mix.crash_probability:
                bookie = rng.choice(bookies)
                if bookie.up:
                    self._crash(bookie, "", restart_ms=(10, 200))
            if rng.random() < mix.partition_probability:
                client = rng.choice(["writer", "reader", "recoverer0", "recoverer1"])
                bookie = rng.choice(bookies)
                self.network.blocked.add((client, bookie.id))
                self.trace(f"PARTITION {client} | {bookie.id}")
                self.loop_call_later(rng.randint(10, 300), self._unblock, client, bookie.id)
            if rng.random() < mix.slow_probability:
                bookie = rng.choice(bookies)
                bookie.slow_ms = rng.choice([20, 100, 400])
                self.trace(f"SLOW bookie {bookie.id} +{bookie.slow_ms}ms")
                self.loop_call_later(rng.randint(20, 300), self._unslow, bookie)

    def _crash(self, bookie: SimBookie, what: str, *, restart_ms: tuple[int, int]) -> None:
        """Crash a bookie; maybe its disk is lost (fewer than Qa disks in a run -
        the guarantee's premise - and enough bookies left for a full ensemble)."""
        rng = self.rng_nemesis
        lost_max = min(self.shape[2] - 1, self.bookie_count - self.shape[0])
        lose = self.disks_lost < lost_max and rng.random() < self.mix.lose_disk_probability
        self.disks_lost += lose
        bookie.refuses_connections = rng.random() < 0.5
        self.trace(f"CRASH bookie {bookie.id} {what}{bookie.crash(lose_disk=lose)}")
        if lose:
            self.loop_call_later(rng.randint(*restart_ms), self._operator_restart, bookie)
        else:
            self.loop_call_later(rng.randint(*restart_ms), self._restart, bookie)

    def _operator_restart(self, bookie: SimBookie) -> None:
        """The operator starts a bookie whose disk was replaced: the identity
        check (the bookie's own rule, ``decide``) must refuse it; then, maybe,
        the operator formats it and it comes back as a new, empty instance."""
        if bookie.up:
            return
        directories = [DirectoryState(role, Path(f"/sim/{bookie.id}/{role}"), None, blank=True)
                       for role in DirectoryRole]
        meta_cookie = Cookie(bookie_id=bookie.id, instance_id=f"{bookie.id}-instance",
                             journal_dir=f"/sim/{bookie.id}/journal",
                             ledger_dir=f"/sim/{bookie.id}/ledger", created_at_ms=0)
        try:
            decide(bookie.id, directories, meta_cookie, with_meta=True)
        except InvalidCookieError as exc:
            self.trace(f"REFUSED start of bookie {bookie.id}: {exc.message.split(':')[0]}")
            if self.rng_nemesis.random() < FORMAT_PROBABILITY:
                self.loop_call_later(self.rng_nemesis.randint(10, 200), self._format, bookie)
            return
        # The check let an empty bookie through as its old self (it must not).
        bookie.formatted = True
        bookie.restart()
        self.trace(f"RESTART bookie {bookie.id} with an empty disk, as its old self")

    def _format(self, bookie: SimBookie) -> None:
        """``quorumlog bookie format``: the limbo floor is the next ledger id."""
        if bookie.up:
            return
        floor = self.meta.peek_next_ledger_id()
        bookie.start_formatted(floor)
        self.trace(f"FORMAT bookie {bookie.id}: a new instance; ledgers below {floor} "
                   "in limbo")

    def loop_call_later(self, delay_ms: int, callback: Callable[..., None], *args: Any) -> None:
        assert self.loop is not None
        self.loop.call_later(delay_ms / 1000, callback, *args)

    def _restart(self, bookie: SimBookie) -> None:
        if not bookie.up and (not bookie.lost or bookie.formatted):
            bookie.restart()
            self.trace(f"RESTART bookie {bookie.id}")

    def _unblock(self, client: str, bookie_id: str) -> None:
        self.network.blocked.discard((client, bookie_id))

    def _unslow(self, bookie: SimBookie) -> None:
        bookie.slow_ms = 0

    def _heal(self) -> None:
        self.network.blocked.clear()
        self.network.faults.drop_probability = 0.0
        for bookie in self.network.bookies.values():
            bookie.slow_ms = 0
            if not bookie.up and (not bookie.lost or bookie.formatted):
                bookie.restart()
        self.trace("HEAL: partitions, drops and slowness end; crashed bookies restart")

    # ----- the final check ----------------------------------------------------------------

    async def _final_check(self) -> None:
        truth = self.truth
        if truth.ledger_id is None:
            if truth.acked:
                self.fail("acked-lost", "entries were acknowledged but no ledger exists")
            return
        last = await self._recover("final", attempts=FINAL_RECOVERY_ATTEMPTS_MAX)
        if last is None:
            self.fail("liveness", f"recovery kept failing after the heal "
                                  f"({FINAL_RECOVERY_ATTEMPTS_MAX} attempts)")
            return
        self._check_replication(truth.ledger_id, last)
        for entry_id, (_, at_ms) in sorted(truth.acked.items()):
            if entry_id > last:
                closed = truth.closed_by_recovery_ms
                name = ("fenced-writer-committed" if closed is not None and at_ms > closed
                        else "acked-lost")
                self.fail(name, f"entry {entry_id} was acknowledged at {at_ms} ms but the "
                                f"ledger was closed at entry {last}")
                return
        client = self._client("checker")
        try:
            handle = await client.open_ledger(truth.ledger_id, password=PASSWORD,
                                              recovery=False)
            if handle.last_add_confirmed != last:
                self.fail("closed-ledger-changed",
                          f"reopened: last entry {handle.last_add_confirmed}, recovered {last}")
            if last >= 0:
                entries = await _read_all(handle, last)
                for entry in entries:
                    self._check_final(entry)
        except QuorumlogError as exc:
            self.fail("acked-lost", f"reading the recovered ledger failed: "
                                    f"{type(exc).__name__}: {exc}")
        finally:
            await client.close()
        again = await self._recover("final-again")
        if again is not None and again != last:
            self.fail("closed-ledger-changed", f"recovered again: last entry {again} != {last}")
        self.trace(f"END last={last} acked={len(truth.acked)}")

    def _check_replication(self, ledger_id: int, last: int) -> None:
        """Every entry of the closed ledger on Qa bookies of its write set."""
        metadata = self.meta.peek(ledger_id)
        if metadata is None or not metadata.is_closed:
            self.fail("liveness", f"ledger {ledger_id} is not CLOSED after recovery")
            return
        held = {b.id: set(b.durable_entries(ledger_id)) | b.lost_entries.get(ledger_id, set())
                for b in self.network.bookies.values()}
        ack_quorum = metadata.ack_quorum
        for entry_id in range(last + 1):
            write_set = metadata.write_set_bookies(entry_id)
            copies = [b for b in write_set if entry_id in held[b]]
            if len(copies) < ack_quorum:
                self.fail("under-replicated",
                          f"entry {entry_id} is held by {copies} of its write set "
                          f"{list(write_set)}, fewer than Qa={ack_quorum}")
                return

    def _check_final(self, entry: LedgerEntry) -> None:
        acked = self.truth.acked.get(entry.entry_id)
        if acked is not None and acked[0] != entry.payload:
            self.fail("acked-lost", f"entry {entry.entry_id} reads {entry.payload[:30]!r}, "
                                    f"the writer's was {acked[0][:30]!r}")
        elif self.truth.attempted.get(entry.entry_id) != entry.payload:
            self.fail("read-past-lac", f"entry {entry.entry_id} reads {entry.payload[:30]!r},"
                                       " which the writer never wrote")


async def _read_all(handle: ReadHandle, last: int) -> list[LedgerEntry]:
    for attempt in range(10):
        try:
            return await handle.read_batch(0, last)
        except QuorumlogError:
            if attempt == 9:
                raise
            await asyncio.sleep(0.05)
    return []


async def _sleep_until(task: asyncio.Future[None], seconds: float) -> None:
    await asyncio.wait([task], timeout=seconds)


def run_ledger_seed(seed: int, mix: LedgerFaultMix | str = "all", *,
                    keep_trace: bool = False) -> LedgerSimResult:
    """One seeded run; ``mix`` may be a mix, a mix name or "all" (rotate by seed)."""
    chosen = ledger_mix_for_seed(mix, seed) if isinstance(mix, str) else mix
    return LedgerSimulation(seed, chosen, keep_trace=keep_trace).run()


def _run_chunk(specs: list[tuple[int, str]]) -> list[LedgerSimResult]:
    return [run_ledger_seed(seed, mix) for seed, mix in specs]


def run_ledger_many(
    seeds: Iterable[int], mix: str = "all", *, jobs: int = 1,
    on_result: Callable[[LedgerSimResult], None] | None = None,
) -> list[LedgerSimResult]:
    """Run many seeds (``jobs`` worker processes); results sorted by seed."""
    specs = [(seed, mix) for seed in seeds]
    results: list[LedgerSimResult] = []
    if jobs <= 1:
        for seed, name in specs:
            result = run_ledger_seed(seed, name)
            results.append(result)
            if on_result is not None:
                on_result(result)
        return results
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    chunks = [specs[i:i + 25] for i in range(0, len(specs), 25)]
    with ProcessPoolExecutor(max_workers=jobs,
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        for chunk in pool.map(_run_chunk, chunks):
            for result in chunk:
                results.append(result)
                if on_result is not None:
                    on_result(result)
    return sorted(results, key=lambda r: r.seed)


def summarize(results: Iterable[LedgerSimResult]) -> Iterator[str]:
    """One line per failure (for test assertion messages)."""
    for r in results:
        if not r.passed:
            yield (f"seed {r.seed} mix={r.mix} shape={r.shape} ending={r.ending}: "
                   f"{r.violation}: {r.detail.splitlines()[0] if r.detail else ''}")


def fingerprint(result: LedgerSimResult) -> str:
    data = f"{result.seed}|{result.passed}|{result.violation}|{sorted(result.stats.items())}"
    return hashlib.sha256(data.encode()).hexdigest()
