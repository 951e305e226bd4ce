"""One simulated node process: a Raft core, its disk, the metadata state machine.

The host wires :class:`~quorumlog.raft.RaftNode` to the simulator with the
production ready pass (:class:`~quorumlog.raft.ReadyPass`, the one
``RaftHost`` runs): its storage is ``_raft_storage.SimRaftStorage`` (records
on a :class:`SimDisk`), its transport the simulated network. So, per
``Ready``, in production order:

1. a leader's messages leave (before its own write, Raft §10.2.1);
2. persist, then install in the ``MemoryStorage`` the core reads;
3. everyone else's messages leave;
4. install the snapshot in the state machine, apply committed entries, serve
   reads whose index is applied; ``advance``.

A process that dies while its leader messages leave (the nemesis's "leader
dies while sending") does nothing after that: it neither persists nor
applies that Ready. One that dies while the others' messages leave has
persisted already; the rest of its messages are lost, and it still applies
what it had committed (in memory only: the crash drops it).

The state machine is the real :class:`~quorumlog.meta.MetaStateMachine`,
with the log digest the invariants compare next to it (``_machine``).

Client requests: a write or log read (an encoded meta ``Request``) is
proposed (only the leader accepts; others answer "not leader" with a hint)
and answered by the node that proposed it, when the entry at the position the
core appended it at - (term, index), as ``RaftHost`` matches proposals - is
applied. A ReadIndex read goes through ``read_index`` (followers forward it
to the leader) and is answered from the state machine once the read index is
applied locally.

Crash: the in-memory Raft core, storage, state machine and pending requests
are dropped; the disk loses (part of) its unsynced tail. Restart: a fresh
``MemoryStorage`` is rebuilt from the surviving records, the state machine
from the snapshot in it, and a new core starts with ``applied`` = the
snapshot index, so every committed entry after the snapshot is applied again.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from quorumlog.errors import InvariantViolation, ProtocolError, invariant
from quorumlog.meta import MetaStateMachine
from quorumlog.raft import (
    CompactedError,
    ConfChange,
    ConfChangeError,
    ConfChangePendingError,
    ConfState,
    Entry,
    EntryType,
    MemoryStorage,
    Message,
    MessageType,
    PeerLiveness,
    ProposalDroppedError,
    RaftConfig,
    RaftNode,
    Ready,
    ReadyPass,
    Role,
    Snapshot,
    compaction_target,
    first_retained_index,
    format_message,
    retained_from,
    snapshot_tail,
)
from quorumlog.sim._client import ClientRequest, ClientResponse, ClientResult
from quorumlog.sim._config import FaultMix
from quorumlog.sim._disk import CrashOutcome, SimDisk
from quorumlog.sim._invariants import (
    DurabilityPromise,
    RaftInvariants,
    fail,
)
from quorumlog.sim._machine import (
    SNAPSHOT_ENCODER,
    LogDigest,
    MachineFactory,
    SimSnapshot,
    SimStateMachine,
    restore_state,
    snapshot_tail_of,
)
from quorumlog.sim._raft_storage import (
    LOG_READ_BYTES_MAX,
    DiskRecord,
    EntriesRecord,
    SimRaftStorage,
    replay_record,
    tear_record,
)

READIES_PER_FLUSH_MAX = 1_000
"""Readies one input may cause before the core is declared not to settle."""

PENDING_REQUESTS_MAX = 10_000
"""Client requests one node holds while waiting for them to apply."""

@dataclass(frozen=True, slots=True)
class SimGroup:
    """The one Raft group of a simulated process, as the ready pass sees it."""

    node: RaftNode
    storage: SimRaftStorage
    group_id: int = 0


@dataclass(frozen=True, slots=True)
class _SimTransport:
    send: Callable[[Sequence[tuple[int, Message]]], None]


@dataclass(slots=True)
class HostStats:
    readies: int = 0
    protocol_errors: int = 0
    proposals_dropped: int = 0
    snapshots_installed: int = 0
    compactions: int = 0
    tails_kept: int = 0  # snapshots that kept the log after the compaction floor
    tails_left_out: int = 0  # ... that could not (the entries were gone, or too many)


@dataclass(slots=True)
class Outbox:
    """Where a host's effects go (the simulator's network and nemesis)."""

    send_raft: Callable[[Message], None]
    send_client: Callable[[int, ClientResponse], None]
    send_beat: Callable[[int], None]  # an empty message to a peer host (PeerLiveness)
    on_sent: Callable[[int, Message], None]
    dies_before_send: Callable[[int, Message], bool]
    trace: Callable[[str], None] | None


@dataclass(slots=True)
class SimRaftHost:
    node_id: int
    raft_config: RaftConfig
    bootstrap: ConfState | None  # None: added later, starts with empty storage
    invariants: RaftInvariants
    outbox: Outbox
    rng: random.Random
    disk: SimDisk[DiskRecord] = field(init=False)
    stats: HostStats = field(default_factory=HostStats)
    up: bool = False
    decommissioned: bool = False
    joined: bool = False  # has been in its own applied configuration
    removed_since_ms: int = -1  # first seen outside the leader's configuration
    crash_requested: bool = False
    crash_mid_send: bool = False  # the crash cuts off the rest of the Ready's messages
    _group: SimGroup | None = None
    _raft: RaftNode | None = None  # _group.node, read on every input
    _pass: ReadyPass[SimGroup] = field(init=False)
    # The state machine: MetaStateMachine, or what ``machine_factory`` makes.
    machine_factory: MachineFactory = MetaStateMachine
    _machine: SimStateMachine = field(default_factory=MetaStateMachine)
    # A proposal's payload as the leader proposes it (the table replica stamps
    # its timestamp, as TableService does); None: as the client sent it.
    prepare_proposal: Callable[[SimStateMachine, bytes], bytes] | None = None
    # RaftHost.compaction_floor for this replica (None: no bound), and
    # HostConfig.snapshot_log_tail_bytes_max.
    compaction_floor: Callable[[], int | None] | None = None
    snapshot_log_tail_bytes_max: int = 1 << 20
    _tail_cache: tuple[int, list[Entry]] = (-1, [])
    _log_digest: LogDigest = field(default_factory=LogDigest)
    # Proposed requests by log index: (term the core appended them in, request).
    _pending_writes: dict[int, tuple[int, ClientRequest]] = field(default_factory=dict)
    _pending_reads: dict[bytes, ClientRequest] = field(default_factory=dict)
    _waiting_reads: list[tuple[int, ClientRequest]] = field(default_factory=list)
    _read_counter: int = 0
    _was_leader: bool = False
    _promise: DurabilityPromise | None = None
    # Process liveness of the peers, as RaftHost keeps it (quiescent runs only).
    _liveness: PeerLiveness | None = None

    def __post_init__(self) -> None:
        self.disk = SimDisk(tear_record)
        self.joined = self.bootstrap is not None
        self._pass = ReadyPass(_SimTransport(self._send_all), self._apply)

    # -- accessors ---------------------------------------------------------------

    @property
    def group(self) -> SimGroup:
        group = self._group
        if group is None:
            raise InvariantViolation(f"invariant violated: node {self.node_id} is not running")
        return group

    @property
    def raft(self) -> RaftNode:
        raft = self._raft
        if raft is None:
            raise InvariantViolation(f"invariant violated: node {self.node_id} is not running")
        return raft

    @property
    def storage(self) -> MemoryStorage:
        return self.group.storage.memory

    @property
    def machine(self) -> SimStateMachine:
        return self._machine

    def retained_entries(self, group_id: int, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        """``RaftHost.retained_entries``: the Raft log, or below it the current
        snapshot's log tail (``raft.retained_from``)."""
        storage = self.storage
        if lo >= storage.first_index():
            return retained_from(storage, [], lo, hi, max_bytes, group_id=group_id)
        snapshot = storage.snapshot()
        if self._tail_cache[0] != snapshot.meta.index:
            self._tail_cache = (snapshot.meta.index, snapshot_tail_of(snapshot))
        return retained_from(storage, self._tail_cache[1], lo, hi, max_bytes,
                             group_id=group_id)

    @property
    def applied_index(self) -> int:
        return self._log_digest.applied_index

    def log_entries(self) -> list[Entry]:
        storage = self.storage
        return storage.entries(storage.first_index(), storage.last_index() + 1, LOG_READ_BYTES_MAX)

    def _log_terms(self) -> dict[int, int]:
        return {entry.index: entry.term for entry in self.log_entries()}

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        """Start (or restart) from what the disk holds."""
        invariant(not self.up and not self.decommissioned, f"node {self.node_id} cannot start")
        storage = MemoryStorage(self.bootstrap)
        for record in self.disk.records():
            replay_record(storage, record)
        snapshot = storage.snapshot()
        self._machine, self._log_digest = restore_state(snapshot, self.machine_factory)
        raft = RaftNode(self.raft_config, storage, self.rng)
        self._group = SimGroup(
            raft, SimRaftStorage(self.node_id, storage, self.disk, self.invariants))
        self._raft = raft
        if self.raft_config.quiesce_idle:
            # A fresh process has heard from nobody yet, as a restarted RaftHost.
            self._liveness = PeerLiveness(self.raft_config.election_timeout_ticks)
        self.up = True
        self._was_leader = False
        if self._promise is not None:
            # What the restarted core believes, not just what is stored.
            self.invariants.on_restart(
                self.node_id, self._promise,
                term=raft.term, vote=raft.vote, commit=raft.commit_index,
                snapshot_index=snapshot.meta.index, log_terms=self._log_terms(),
            )
            self._promise = None
        self._report_state()

    def crash(self, rng: random.Random, mix: FaultMix) -> CrashOutcome:
        invariant(self.up, f"node {self.node_id} is already down")
        self._promise = self.invariants.promise_at_crash(self.node_id, self._log_terms())
        outcome = self.disk.crash(rng, mix)
        self._group = self._raft = None
        # Dropped with the process (a restart rebuilds it from the disk).
        self._machine, self._log_digest = MetaStateMachine(), LogDigest()
        self._pending_writes.clear()
        self._pending_reads.clear()
        self._waiting_reads.clear()
        self.up = False
        self.crash_requested = False
        self.crash_mid_send = False
        return outcome

    # -- inputs ----------------------------------------------------------------------

    def tick(self) -> None:
        """One tick, in RaftHost's order: liveness changes (they wake a quiesced
        core), the core's tick, its Readies, then a beat to each quiet peer."""
        raft, liveness = self.raft, self._liveness
        if liveness is not None:
            changed = liveness.tick()
            if changed:
                self._trace(f"node {self.node_id} liveness changed: {sorted(changed)}")
                raft.peer_liveness_changed(changed)
        raft.tick()
        self.flush()
        if liveness is not None and self.up and not self.crash_requested:
            peers = raft.conf_state.members() - {self.node_id}
            for peer in liveness.beat_targets(peers):
                self.outbox.send_beat(peer)

    def heard(self, peer: int) -> None:
        """Something from ``peer``'s process arrived."""
        if self._liveness is not None:
            self._liveness.heard(peer)

    def deliver(self, message: Message) -> None:
        try:
            self.raft.step(message)
        except ProtocolError as exc:
            self.stats.protocol_errors += 1
            self._trace(f"node {self.node_id} drops {message.type.name}: {exc.message}")
        self.flush()

    def on_client_request(self, request: ClientRequest) -> None:
        if len(self._pending_writes) + len(self._pending_reads) >= PENDING_REQUESTS_MAX:
            self._reject(request, leader_hint=0)
            return
        raft = self.raft
        try:
            if request.read_index:
                self._read_counter += 1
                context = (
                    f"{self.node_id}.{request.client_id}.{request.seq}.{self._read_counter}"
                ).encode()
                raft.read_index(context)
                self._pending_reads[context] = request
            else:
                payload = request.payload
                if self.prepare_proposal is not None:
                    payload = self.prepare_proposal(self._machine, payload)
                term, index = raft.propose(payload)
                self._pending_writes[index] = (term, request)
        except ProposalDroppedError as exc:
            self.stats.proposals_dropped += 1
            self._reject(request, leader_hint=exc.leader_hint)
        self.flush()

    def _reject(self, request: ClientRequest, *, leader_hint: int) -> None:
        response = ClientResponse(request.client_id, request.seq, False, None, leader_hint)
        self.outbox.send_client(request.client_id, response)

    # -- Ready -----------------------------------------------------------------------

    def flush(self) -> None:
        """Run ready passes until there is no Ready, or a crash was requested."""
        group = self.group
        raft = group.node
        readies = 0
        while not self.crash_requested:
            pending = self._pass.begin((group,))
            if pending is None:
                return
            readies += 1
            if readies > READIES_PER_FLUSH_MAX:
                fail(
                    "run-bounded",
                    f"node {self.node_id} produced more than {READIES_PER_FLUSH_MAX} Readies "
                    "after one input: the core does not settle",
                )
            self.stats.readies += 1
            if self.crash_mid_send:
                return  # died while its leader messages left: nothing more happens
            pending.persist()
            self._pass.finish(pending)
            for _, ready in pending.batch:
                for message in ready.messages:
                    if message.type is MessageType.SNAP:
                        raft.report_snapshot(message.to, ok=True)
            self._report_state()

    def sync(self) -> None:
        """fsync: everything written so far is durable."""
        if self._group is None:
            self.disk.sync()
        else:
            self._group.storage.sync()

    def _send_all(self, messages: Sequence[tuple[int, Message]]) -> None:
        """The ready pass's transport: the simulated network (and the nemesis,
        which may kill the process between two messages)."""
        durable = self.group.storage.durable_view()
        outbox = self.outbox
        for _, message in messages:
            if not self.crash_mid_send and outbox.dies_before_send(self.node_id, message):
                self.crash_requested = self.crash_mid_send = True
            if self.crash_mid_send:
                # The process dies with these still queued: they never leave.
                self._trace(f"node {self.node_id} dies before sending {format_message(message)}")
                continue
            self.invariants.on_send(self.node_id, message, durable)
            if self._liveness is not None:
                self._liveness.sent(message.to)
            outbox.send_raft(message)
            outbox.on_sent(self.node_id, message)

    def _apply(self, _group: SimGroup, ready: Ready) -> None:
        """The ready pass's application step."""
        if ready.snapshot is not None:
            self._install_snapshot(ready.snapshot)
        log_digest = self._log_digest
        for entry in ready.committed_entries:
            if ready.snapshot is not None and entry.index <= log_digest.applied_index:
                continue  # covered by the snapshot installed just now
            if entry.index != log_digest.applied_index + 1:
                fail(
                    "applied-in-order",
                    f"node {self.node_id} is handed entry {entry.index} to apply after "
                    f"{log_digest.applied_index}",
                )
            log_digest.note(entry)
            self.invariants.on_apply(self.node_id, entry, log_digest.digest)
            if entry.type is EntryType.CONF_CHANGE:
                self._trace(f"node {self.node_id} applies conf change {entry.index}: "
                            f"{_describe_conf_change(entry.data)}")
            elif entry.data:
                self._apply_command(entry)
        for read_state in ready.read_states:
            request = self._pending_reads.pop(read_state.context, None)
            if request is not None:
                self._waiting_reads.append((read_state.index, request))
        self._serve_reads()

    def _install_snapshot(self, snapshot: Snapshot) -> None:
        self.stats.snapshots_installed += 1
        self._machine, self._log_digest = restore_state(snapshot, self.machine_factory)
        self.invariants.on_snapshot_installed(self.node_id, snapshot, self._log_digest.digest)
        self._trace(f"node {self.node_id} installs snapshot {snapshot.meta.term}/"
                    f"{snapshot.meta.index} epoch={snapshot.meta.epoch}")

    def _apply_command(self, entry: Entry) -> None:
        machine = self._machine
        result: ClientResult = None  # a table replica's answer: applied (ok) is all
        if isinstance(machine, MetaStateMachine):
            outcome = machine.apply(entry.index, entry.data)
            # One client request per entry here: the simulator does not combine
            # meta requests (tests/meta/test_state.py checks that
            # a combined entry applies as its requests one by one).
            invariant(isinstance(outcome, tuple), "a simulated meta entry holds one request")
            result = outcome[0] if isinstance(outcome, tuple) else None
        else:
            machine.apply(entry.index, entry.data)
        pending = self._pending_writes.pop(entry.index, None)
        if pending is None or pending[0] != entry.term:
            return  # not proposed here, or another leader's entry replaced it
        request = pending[1]
        response = ClientResponse(request.client_id, request.seq, True, result)
        self.outbox.send_client(request.client_id, response)

    def _serve_reads(self) -> None:
        if not self._waiting_reads:
            return
        applied = self._log_digest.applied_index
        still: list[tuple[int, ClientRequest]] = []
        for index, request in self._waiting_reads:
            if index > applied:
                still.append((index, request))
                continue
            machine = self._machine
            invariant(isinstance(machine, MetaStateMachine), "reads are served by meta machines")
            value = machine.get(request.key) if isinstance(machine, MetaStateMachine) else None
            response = ClientResponse(request.client_id, request.seq, True, value)
            self.outbox.send_client(request.client_id, response)
        self._waiting_reads = still

    def _report_state(self) -> None:
        raft = self.raft
        if self._log_digest.applied_index != raft.applied_index:  # formatted only on failure
            invariant(False, f"node {self.node_id}: state machine at "
                      f"{self._log_digest.applied_index}, core applied {raft.applied_index}")
        if not self.joined and self.node_id in raft.conf_state.members():
            self.joined = True
        is_leader = raft.role is Role.LEADER
        commit = raft.commit_index
        self.invariants.on_state(
            self.node_id, is_leader=is_leader, term=raft.term, commit=commit,
            commit_term=self.storage.term(commit) if is_leader else 0,
            applied=raft.applied_index, epoch=raft.epoch,
        )
        if is_leader and not self._was_leader:
            storage = self.storage
            log = {entry.index: entry for entry in self.log_entries()}
            self.invariants.on_became_leader(
                self.node_id, storage.snapshot().meta.index, log
            )
            self._trace(f"node {self.node_id} becomes leader term={raft.term} "
                        f"last={raft.last_index} commit={raft.commit_index}")
        self._was_leader = is_leader

    # -- operations started by the nemesis -----------------------------------------------

    def compact(self, *, min_entries: int, keep_entries: int) -> bool:
        """Snapshot the state machine at the applied index and compact the log."""
        raft, storage, applied = self.raft, self.storage, self._log_digest
        snapshot_index = storage.snapshot().meta.index
        if applied.applied_index - snapshot_index < min_entries:
            return False
        self.sync()  # the checkpoint below replaces the disk: nothing may be lost
        index = applied.applied_index
        floor = None if self.compaction_floor is None else self.compaction_floor()
        try:  # RaftHost._snapshot_tail
            tail = snapshot_tail(
                lambda lo, hi, size: self.retained_entries(0, lo, hi, size),
                floor, index, self.snapshot_log_tail_bytes_max,
                first_retained=first_retained_index(
                    storage, snapshot_tail_of(storage.snapshot()))) or []
            self.stats.tails_kept += bool(tail)
        except CompactedError:
            tail = []
            self.stats.tails_left_out += 1
        data = SNAPSHOT_ENCODER.encode(
            SimSnapshot(applied.digest, self._machine.snapshot(), tail))
        storage.create_snapshot(index, raft.conf_state, data, raft.epoch)
        compact_to = compaction_target(max(index - keep_entries, snapshot_index + 1), floor)
        if compact_to >= storage.first_index():
            storage.compact(compact_to)
        kept = self.log_entries()
        if self.compaction_floor is not None:
            # As the WAL: a restart replays the entries after the newest snapshot
            # only; the log below it (kept in memory for the floor) survives in
            # the snapshot's tail alone (RaftHost, docs/duplication.md).
            kept = [entry for entry in kept if entry.index > index]
        self.disk.rewrite([storage.snapshot(), EntriesRecord(tuple(kept)), storage.hard_state()])
        self.stats.compactions += 1
        self._trace(f"node {self.node_id} snapshots at {index}, compacts to {compact_to}"
                    f" (floor {floor}, tail {len(tail)})")
        return True

    def propose_conf_change(self, change: ConfChange) -> bool:
        try:
            self.raft.propose_conf_change(change)
        except (ProposalDroppedError, ConfChangePendingError, ConfChangeError) as exc:
            self._trace(f"node {self.node_id} refuses conf change: {exc.message}")
            return False
        self.flush()
        return True

    def _trace(self, text: str) -> None:
        if self.outbox.trace is not None:
            self.outbox.trace(text)


def _describe_conf_change(data: bytes) -> str:
    change = ConfChange.decode(data)
    if not change.changes:
        return "leave joint"
    parts = [f"{c.type.name.lower()} {c.node_id}" for c in change.changes]
    return ", ".join(parts) + f" ({change.transition})"
