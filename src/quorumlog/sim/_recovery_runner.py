"""Seeded simulator runs of auto-recovery: the real auditor and workers.

The production recovery role (``quorumlog.recovery.RecoveryService``: the
auditor candidate, the replication worker, their sessions, locks, tasks and
metadata swaps) runs unchanged on the virtual-time loop, on three simulated
nodes, against the ledger world's bookies (``_ledger_world``: the bookie's
own rules, simulated disks) and a meta store with sessions
(``_recovery_world``). One run:

- a writer creates closed ledgers of random shapes (E, Qw, Qa; Qw = 1
  included), digests and placements, and sometimes leaves one OPEN (its
  writer goes away);
- the nemesis, for a while: crashes recovery nodes (a crash is a SIGKILL: the
  loops stop where they stand, mid-copy included; the session, the auditor
  lease and task locks expire in meta) and restarts them; stalls a node's
  keep-alives so its session expires while it keeps working (a paused
  process); crashes bookies and restarts them before the recovery delay, or
  after it; loses a bookie's disk for good (at most ``losses_max``);
- then every fault heals (the lost bookies stay lost), and the run waits
  until no task is pending.

Invariants (a failure names one and the seed replays it):

- ``swap-before-copy``: a metadata write that swaps a bookie into a closed
  ledger's fragment names only bookies that durably hold every entry the
  fragment's write sets put on them (checked at the write);
- ``slot-swapped-twice``: each fragment position is swapped at most once per
  loss: the bookie swapped out had an outage after it took the position;
- ``task-for-returned-bookie``: a task names a bookie only after it has been
  gone for ``lost_bookie_recovery_delay_ms`` without a break (a bookie back
  before the delay leaves no task);
- ``under-replicated``: at the end, every entry of every closed ledger is
  held, with its original bytes, by every bookie of its write set, each one
  up - unless the ledger's task says ``lost``/``failed``;
- ``lost-wrongly``: a ledger reported lost (or failed) has an entry that no
  live bookie of its write set holds (a bookie gone past the delay that
  comes back with the data reopens the task);
- ``task-left-behind`` / ``liveness``: once faults heal, every task is done
  (or reported) within ``SETTLE_VIRTUAL_MS_MAX``.
"""

from __future__ import annotations

import asyncio
import functools
import random
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from quorumlog import proto as wire
from quorumlog.errors import InvariantViolation
from quorumlog.ledger import LedgerClient, LedgerClientConfig, LedgerMetadata
from quorumlog.recovery import TASK_PREFIX, RecoveryConfig, RecoveryService, ReplicationTask
from quorumlog.sim._ledger_loop import SimDeadlockError, run_virtual
from quorumlog.sim._ledger_world import LedgerViolation, LedgerWorld, SimBookie
from quorumlog.sim._recovery_world import NodeMeta, SimRecoveryMeta
from quorumlog.sim._trace import Tracer

PASSWORD = b"sim-recovery"

SHAPES = [(3, 3, 2), (3, 2, 2), (4, 2, 2), (3, 3, 3), (2, 2, 1), (4, 3, 2), (2, 1, 1),
          (1, 1, 1), (3, 2, 1)]
"""(E, Qw, Qa) shapes the ledgers pick from (Qw = 1: a loss there is reported lost)."""

NODES = 3
"""Recovery nodes (auditor candidate + worker each)."""

LOST_BOOKIE_DELAY_MS = 2_000
STALE_WINDOW_MS = 3_000
"""A task may name a bookie whose qualifying outage (>= the delay) ended this
recently: the auditor read the registrations before it came back."""

SETTLE_VIRTUAL_MS_MAX = 300_000
"""After the heal, tasks must be done (or reported) within this much virtual time."""

RUN_VIRTUAL_MS_MAX = 900_000
"""A run that has not finished after this much virtual time is not live."""

NEMESIS_STEP_MS = (100, 900)


@dataclass(slots=True)
class RecoverySimResult:
    seed: int
    passed: bool
    violation: str = ""
    detail: str = ""
    trace: list[str] = field(default_factory=list)
    trace_hash: str = ""
    stats: dict[str, int] = field(default_factory=dict)


class _TraceLog:
    """A ledger client's logger in a run: events go to the transcript."""

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
class _Node:
    name: str
    incarnation: int = 0
    service: RecoveryService | None = None
    meta: NodeMeta | None = None
    client_name: str = ""

    @property
    def up(self) -> bool:
        return self.service is not None


class RecoverySimulation:
    """One seeded run (see the module docstring)."""

    def __init__(self, seed: int, *, keep_trace: bool = False) -> None:
        self.seed = seed
        root = random.Random(seed)
        streams = [random.Random(root.getrandbits(64)) for _ in range(5)]
        self.rng_plan, self.rng_nemesis, self.rng_world, self.rng_nodes, self.rng_data = streams
        self.tracer = Tracer(keep_lines=keep_trace)
        plan = self.rng_plan
        self.ledgers = plan.randint(3, 10)
        self.shapes = [plan.choice(SHAPES) for _ in range(self.ledgers)]
        self.losses_max = plan.choice([1, 1, 2])
        widest = max(e for e, _, _ in self.shapes)
        self.bookie_count = max(widest + self.losses_max + 1, 4) + plan.randint(0, 1)
        self.leave_open = plan.random() < 0.4
        self.nemesis_ms = plan.randint(4_000, 30_000)
        self.config = RecoveryConfig(
            lost_bookie_recovery_delay_ms=LOST_BOOKIE_DELAY_MS, audit_interval_ms=200,
            worker_poll_interval_ms=plan.choice([100, 250]), lease_ttl_ms=1_000,
            open_ledger_grace_ms=1_500, task_attempts_max=12, retry_backoff_ms=20,
            throttle_bytes_per_s=plan.choice([20_000, 200_000, 10_000_000]),
            copy_batch_entries_max=plan.choice([1, 4, 16]), request_timeout_ms=300,
            audit_ledgers_per_page=plan.choice([2, 1000]), check_interval_ms=0)
        self.violations: list[LedgerViolation] = []
        self.nodes = [_Node(f"r{i}") for i in range(NODES)]
        self.truth: dict[int, dict[int, bytes]] = {}  # ledger -> entry -> envelope
        self.down: dict[str, list[list[int | None]]] = {}  # bookie -> [start, end] outages
        self.lost_for_good: set[str] = set()
        self.slot_placed_ms: dict[tuple[int, int, int], int] = {}  # (ledger, fragment, position)
        self.stats: dict[str, int] = {"node_crashes": 0, "bookie_outages": 0, "disks_lost": 0,
                                      "swaps": 0, "tasks_filed": 0, "keepalive_stalls": 0}
        self.loop: asyncio.AbstractEventLoop | None = None
        self._timers: list[asyncio.Future[None]] = []

    # ----- plumbing ---------------------------------------------------------------

    def now_ms(self) -> int:
        return int(asyncio.get_running_loop().time() * 1000 + 1e-9)

    def trace(self, text: str) -> None:
        if self.tracer.enabled:
            self.tracer.event(self.now_ms(), text)

    def fail(self, name: str, detail: str) -> None:
        self.violations.append(LedgerViolation(name, detail))
        self.trace(f"VIOLATION {name}: {detail}")

    def run(self) -> RecoverySimResult:
        result = RecoverySimResult(self.seed, True)
        try:
            run_virtual(self._main())
        except SimDeadlockError as exc:
            self.fail("liveness", f"deadlock: {exc}")
        except InvariantViolation as exc:
            self.fail("internal-invariant", f"{exc}\n{traceback.format_exc()}")
        violations = (list(self.meta.violations) if self.loop else []) + self.violations
        if violations:
            result.passed = False
            result.violation = violations[0].invariant_name
            result.detail = violations[0].detail
        result.trace = list(self.tracer.lines)
        result.trace_hash = self.tracer.digest()
        result.stats = dict(self.stats)
        return result

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.world = LedgerWorld(bookies=self.bookie_count, seed=self.rng_world.getrandbits(64),
                                 tracer=self.tracer, delay_ms_max=2)
        self.network = self.world.network
        self.meta = SimRecoveryMeta(random.Random(self.rng_world.getrandbits(64)), self.tracer,
                                    self.network)
        self.world.meta = self.meta
        self.meta.on_write.append(self._on_meta_write)
        for bookie in self.world.bookies:
            self.meta.put_now(f"{wire.BOOKIE_COOKIE_PREFIX}{bookie}", b"cookie")
            self.meta.put_now(f"{wire.BOOKIE_REGISTRATIONS_PREFIX}{bookie}", b"")
        self.trace(f"START seed={self.seed} bookies={self.bookie_count} shapes={self.shapes} "
                   f"open={self.leave_open} losses_max={self.losses_max} "
                   f"nemesis_ms={self.nemesis_ms} throttle={self.config.throttle_bytes_per_s}")
        try:
            async with asyncio.timeout(RUN_VIRTUAL_MS_MAX / 1000):
                await self._scenario()
        except TimeoutError:
            self.fail("liveness", f"the run did not finish within {RUN_VIRTUAL_MS_MAX} ms")
        for node in self.nodes:
            self._crash_node(node)

    async def _scenario(self) -> None:
        await self._write_ledgers()
        for node in self.nodes:
            self._start_node(node)
        await self._nemesis()
        self._heal()
        if await self._settle():
            for node in self.nodes:
                self._crash_node(node)
            await asyncio.sleep(0.1)  # in-flight adds reach the disks
            self._final_check()

    # ----- the data -----------------------------------------------------------------

    async def _write_ledgers(self) -> None:
        client = self.world.client("writer", LedgerClientConfig(
            add_timeout_ms=1_000, read_timeout_ms=300),
            log=_TraceLog(self.tracer, self.now_ms, "writer"))
        rng = self.rng_data
        for index, (e, w, a) in enumerate(self.shapes):
            placement = rng.choice(["random", "rack_aware"])
            handle = await client.create_ledger(
                e, w, a, digest=rng.choice(["crc32c", "hmac-sha256"]), password=PASSWORD,
                placement=placement)
            for i in range(rng.randint(1, 40)):
                await handle.append(f"l{handle.id}-e{i}-".encode() + bytes(rng.randint(0, 300)))
            if index == len(self.shapes) - 1 and self.leave_open:
                self.trace(f"writer leaves ledger {handle.id} OPEN")
            else:
                await handle.close()
        await asyncio.sleep(0.05)  # every add reaches every write set's disks
        for bookie in self.world.bookies.values():
            for metadata in self._ledgers():
                for entry_id, data in bookie.durable_entries(metadata.ledger_id).items():
                    self.truth.setdefault(metadata.ledger_id, {})[entry_id] = data
        self.trace(f"wrote {len(self.truth)} ledgers, "
                   f"{sum(len(v) for v in self.truth.values())} entries")

    def _ledgers(self) -> list[LedgerMetadata]:
        out = []
        for key, value in self.meta.values(wire.LEDGER_KEY_PREFIX).items():
            if wire.ledger_id_of_key(key) is not None:
                out.append(LedgerMetadata.decode(value))
        return out

    # ----- nodes ----------------------------------------------------------------------

    def _start_node(self, node: _Node) -> None:
        node.incarnation += 1
        node.meta = NodeMeta(self.meta)
        node.client_name = f"{node.name}.{node.incarnation}"
        config = LedgerClientConfig(add_timeout_ms=300, read_timeout_ms=300,
                                    replacement_attempts_max=10, replacement_backoff_ms=20)
        client = LedgerClient(node.meta, self.world.transport(node.client_name), config=config,
                              rng=random.Random(self.rng_nodes.getrandbits(64)),
                              clock=self.world,
                              log=_TraceLog(self.tracer, self.now_ms, node.client_name))
        node.service = RecoveryService(node.name, [], self.config)
        node.service.start_with(client, node.meta, clock=self.world,
                                rng=random.Random(self.rng_nodes.getrandbits(64)))
        self.trace(f"NODE {node.name} starts (incarnation {node.incarnation})")

    def _crash_node(self, node: _Node) -> None:
        if node.service is None or node.meta is None:
            return
        node.meta.alive = False
        self.network.crash_client(node.client_name)
        node.service.abort()
        node.service = None
        self.trace(f"NODE {node.name} crashes")

    # ----- the nemesis ----------------------------------------------------------------------

    async def _nemesis(self) -> None:
        rng = self.rng_nemesis
        end_ms = self.now_ms() + self.nemesis_ms
        timers: list[asyncio.Task[None]] = []
        while self.now_ms() < end_ms:
            await asyncio.sleep(rng.randint(*NEMESIS_STEP_MS) / 1000)
            roll = rng.random()
            if roll < 0.2:
                up = [n for n in self.nodes if n.up]
                if up:
                    node = rng.choice(up)
                    self._crash_node(node)
                    self.stats["node_crashes"] += 1
                    revive = functools.partial(self._revive, node)
                    timers.append(asyncio.ensure_future(
                        self._later(rng.randint(100, 4_000), revive)))
            elif roll < 0.3:
                self._stall_keepalives(rng)
            elif roll < 0.45:
                self._outage(rng.randint(50, LOST_BOOKIE_DELAY_MS * 4 // 5))
            elif roll < 0.55:
                self._outage(rng.randint(LOST_BOOKIE_DELAY_MS + 500, LOST_BOOKIE_DELAY_MS + 6_000))
            elif roll < 0.62 and len(self.lost_for_good) < self.losses_max:
                self._lose_disk()
        for timer in timers:
            timer.cancel()

    async def _later(self, delay_ms: int, action: Callable[[], None]) -> None:
        await asyncio.sleep(delay_ms / 1000)
        action()

    def _revive(self, node: _Node) -> None:
        if not node.up:
            self._start_node(node)

    def _stall_keepalives(self, rng: random.Random) -> None:
        up = [n for n in self.nodes if n.up and n.service is not None]
        if not up:
            return
        node = rng.choice(up)
        session = node.service.session_id if node.service is not None else 0
        if not session:
            return
        self.meta.keepalives_blocked.add(session)
        self.stats["keepalive_stalls"] += 1
        self.trace(f"NEMESIS keep-alives of {node.name} (session {session}) are lost")

    def _up_bookies(self) -> list[SimBookie]:
        return [b for b in self.world.bookies.values() if b.up]

    def _outage(self, duration_ms: int) -> None:
        candidates = self._up_bookies()
        if len(candidates) <= self.bookie_count - self.losses_max - 1:
            return  # keep enough bookies up for the replacements
        bookie = self.rng_nemesis.choice(candidates)
        self._bookie_down(bookie, lose_disk=False)
        self.stats["bookie_outages"] += 1
        self._timers.append(asyncio.ensure_future(
            self._later(duration_ms, lambda: self._bookie_up(bookie))))
        self.trace(f"NEMESIS bookie {bookie.id} down for {duration_ms} ms")

    def _lose_disk(self) -> None:
        candidates = self._up_bookies()
        if not candidates:
            return
        bookie = self.rng_nemesis.choice(candidates)
        self._bookie_down(bookie, lose_disk=True)
        self.lost_for_good.add(bookie.id)
        self.stats["disks_lost"] += 1
        self.trace(f"NEMESIS bookie {bookie.id} lost for good")

    def _bookie_down(self, bookie: SimBookie, *, lose_disk: bool) -> None:
        outcome = bookie.crash(lose_disk=lose_disk)
        self.down.setdefault(bookie.id, []).append([self.now_ms(), None])
        self.trace(f"BOOKIE {bookie.id} crashes: {outcome}")

    def _bookie_up(self, bookie: SimBookie) -> None:
        if bookie.up or bookie.id in self.lost_for_good:
            return
        # The bookie's registration counts itself first (bookie._registration).
        self.meta.put_now(f"{wire.BOOKIE_REGISTRATIONS_PREFIX}{bookie.id}", b"")
        bookie.restart()
        self.down[bookie.id][-1][1] = self.now_ms()
        self.trace(f"BOOKIE {bookie.id} restarts")

    def _heal(self) -> None:
        self.meta.keepalives_blocked.clear()
        for bookie in self.world.bookies.values():
            self._bookie_up(bookie)
        for node in self.nodes:
            self._revive(node)
        self.trace(f"HEAL: nodes and bookies restart; lost for good: {sorted(self.lost_for_good)}")

    async def _settle(self) -> bool:
        """Wait until no task is pending or locked; False (a violation) if never."""
        await asyncio.sleep((LOST_BOOKIE_DELAY_MS + 4 * self.config.audit_interval_ms
                             + self.config.lease_ttl_ms) / 1000)
        deadline = self.now_ms() + SETTLE_VIRTUAL_MS_MAX
        while self.now_ms() < deadline:
            tasks = self._tasks()
            locks = self.meta.values("/underreplicated-locks/")
            unfiled = [m.ledger_id for m in self._ledgers()
                       if _named(m) & self.lost_for_good and m.ledger_id not in tasks]
            if not locks and not unfiled and all(
                    t.state.value != "pending" for t in tasks.values()):
                return True
            await asyncio.sleep(0.5)
        self.fail("task-left-behind", f"{SETTLE_VIRTUAL_MS_MAX} ms after the heal: tasks "
                                      f"{_describe(self._tasks())}")
        return False

    def _tasks(self) -> dict[int, ReplicationTask]:
        return {int(k[len(TASK_PREFIX):]): ReplicationTask.decode(v)
                for k, v in self.meta.values(TASK_PREFIX).items()}

    # ----- invariants at every write ------------------------------------------------------

    def _on_meta_write(self, key: str, old: bytes | None, new: bytes) -> None:
        if key.startswith(TASK_PREFIX):
            self._check_task_write(old, new)
            return
        ledger_id = wire.ledger_id_of_key(key)
        if ledger_id is None or old is None:
            return
        before, after = LedgerMetadata.decode(old), LedgerMetadata.decode(new)
        if not (before.is_closed and after.is_closed):
            return
        self._check_swap(before, after)

    def _check_task_write(self, old: bytes | None, new: bytes) -> None:
        task = ReplicationTask.decode(new)
        named_before = set(ReplicationTask.decode(old).bookies) if old else set()
        if old is None:
            self.stats["tasks_filed"] += 1
        now = self.now_ms()
        for bookie in sorted(set(task.bookies) - named_before):
            qualifying = [
                (start, end) for start, end in self.down.get(bookie, [])
                if ((end if end is not None else now) - (start or 0) >= LOST_BOOKIE_DELAY_MS
                    and (end is None or end >= now - STALE_WINDOW_MS))]
            if not qualifying:
                self.fail("task-for-returned-bookie",
                          f"ledger {task.ledger_id}: a task names bookie {bookie}, whose "
                          f"outages {self.down.get(bookie, [])} never reached "
                          f"{LOST_BOOKIE_DELAY_MS} ms recently (now {now} ms)")

    def _check_swap(self, before: LedgerMetadata, after: LedgerMetadata) -> None:
        ledger_id = after.ledger_id
        if len(before.ensembles) != len(after.ensembles):
            return
        for index, (old_f, new_f) in enumerate(zip(before.ensembles, after.ensembles,
                                                   strict=True)):
            for position, (old_b, new_b) in enumerate(zip(old_f.bookies, new_f.bookies,
                                                          strict=True)):
                if old_b == new_b:
                    continue
                self.stats["swaps"] += 1
                slot = (ledger_id, index, position)
                placed_ms = self.slot_placed_ms.get(slot, 0)
                self.slot_placed_ms[slot] = self.now_ms()
                # An outage after it took the position, or going on then (it lost
                # its disk between the copy and the swap).
                if not any(end is None or end >= placed_ms
                           for _, end in self.down.get(old_b, [])):
                    self.fail("slot-swapped-twice",
                              f"ledger {ledger_id} fragment {index} position {position}: "
                              f"{old_b} swapped out for {new_b} with no outage of {old_b} since "
                              f"it took the position ({placed_ms} ms)")
        for entry_id in range(after.last_entry_id + 1):
            newcomers = set(after.write_set_bookies(entry_id)) - set(
                before.write_set_bookies(entry_id))
            for bookie in sorted(newcomers):
                sim_bookie = self.world.bookies[bookie]
                if entry_id in sim_bookie.lost_entries.get(ledger_id, set()):
                    continue  # copied, then its disk was lost before the swap landed
                held = sim_bookie.durable_entries(ledger_id).get(entry_id)
                if held is None or held != self.truth.get(ledger_id, {}).get(entry_id, held):
                    self.fail("swap-before-copy",
                              f"ledger {ledger_id}: bookie {bookie} was swapped in for entry "
                              f"{entry_id} but does not hold it durably "
                              f"({'absent' if held is None else 'different bytes'})")
                    return

    # ----- the final check -----------------------------------------------------------------

    def _final_check(self) -> None:
        tasks = self._tasks()
        up = {b.id: b for b in self.world.bookies.values() if b.up}
        for metadata in self._ledgers():
            ledger_id = metadata.ledger_id
            task = tasks.get(ledger_id)
            if not metadata.is_closed:
                # Recovery cannot close it without the lost bookie's answers (a
                # write set wholly on it): it must at least be reported.
                if _named(metadata) & self.lost_for_good and (
                        task is None or task.state.value not in ("lost", "failed")):
                    self.fail("under-replicated",
                              f"ledger {ledger_id} is still {metadata.state.value}, names a lost "
                              f"bookie and is not reported: {_describe(tasks)}")
                continue
            # Gone: no live bookie of its write set holds it (a stale copy on a
            # bookie swapped out earlier is not one recovery may know of).
            gone = [e for e in range(metadata.last_entry_id + 1)
                    if not any(e in up[b].durable_entries(ledger_id)
                               for b in metadata.write_set_bookies(e) if b in up)]
            if task is not None and task.state.value in ("lost", "failed"):
                if not gone:
                    self.fail("lost-wrongly",
                              f"ledger {ledger_id} is reported {task.state.value} "
                              f"({task.error}) but every entry is on a live bookie")
                continue
            if task is not None:
                self.fail("task-left-behind", f"ledger {ledger_id}: {_describe(tasks)}")
            self._check_full_quorum(metadata, up)

    def _check_full_quorum(self, metadata: LedgerMetadata, up: dict[str, SimBookie]) -> None:
        ledger_id = metadata.ledger_id
        truth = self.truth.get(ledger_id, {})
        for entry_id in range(metadata.last_entry_id + 1):
            for bookie in metadata.write_set_bookies(entry_id):
                held = up[bookie].durable_entries(ledger_id).get(entry_id) if (
                    bookie in up) else None
                if held is None or held != truth.get(entry_id, held):
                    where = "down" if bookie not in up else (
                        "absent" if held is None else "different bytes")
                    self.fail("under-replicated",
                              f"ledger {ledger_id} entry {entry_id}: write-set bookie {bookie} "
                              f"({where}); lost for good: {sorted(self.lost_for_good)}")
                    return


def _named(metadata: LedgerMetadata) -> set[str]:
    return {b for fragment in metadata.ensembles for b in fragment.bookies}


def _describe(tasks: dict[int, ReplicationTask]) -> str:
    return "; ".join(f"{lid}: {t.state.value} {list(t.bookies)} attempts={t.attempts} "
                     f"{t.error[:120]}" for lid, t in sorted(tasks.items())) or "none"


def run_recovery_seed(seed: int, *, keep_trace: bool = False) -> RecoverySimResult:
    """One seeded run of the auditor and workers (see the module docstring)."""
    return RecoverySimulation(seed, keep_trace=keep_trace).run()


def _run_chunk(seeds: list[int]) -> list[RecoverySimResult]:
    return [run_recovery_seed(seed) for seed in seeds]


def run_recovery_many(
    seeds: Iterable[int], *, jobs: int = 1,
    on_result: Callable[[RecoverySimResult], None] | None = None,
) -> list[RecoverySimResult]:
    """Run many seeds (``jobs`` worker processes); results sorted by seed."""
    chosen = list(seeds)
    results: list[RecoverySimResult] = []
    if jobs <= 1:
        for seed in chosen:
            result = run_recovery_seed(seed)
            results.append(result)
            if on_result is not None:
                on_result(result)
        return results
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    chunks = [chosen[i:i + 10] for i in range(0, len(chosen), 10)]
    with ProcessPoolExecutor(max_workers=jobs,
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        for chunk in pool.map(_run_chunk, chunks):
            for result in chunk:
                results.append(result)
                if on_result is not None:
                    on_result(result)
    return sorted(results, key=lambda r: r.seed)


def summarize(results: Iterable[RecoverySimResult]) -> Iterator[str]:
    """One line per failure (for test assertion messages)."""
    for r in results:
        if not r.passed:
            yield (f"seed {r.seed}: {r.violation}: "
                   f"{r.detail.splitlines()[0] if r.detail else ''}")
