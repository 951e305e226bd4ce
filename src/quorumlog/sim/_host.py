"""One simulated node process: a Raft core, its disk, its key-value state machine.

The host is the driver of :class:`~quorumlog.raft.RaftNode` in the
simulator. It handles every ``Ready`` in the documented order:

1. persist: snapshot, then entries, then hard state, as records on a
   :class:`SimDisk` (in that order, so a crash that keeps a prefix of the
   unsynced records never keeps a commit index without its entries), and
   ``sync()`` when ``must_sync`` - and also whenever the Ready installs a
   snapshot (as etcd's driver does: a snapshot file is always fsynced);
2. send the messages;
3. install the snapshot in the state machine, apply committed entries, serve
   reads whose index is applied;
4. ``advance``.

Client requests: a write or log read is proposed (only the leader accepts;
others answer "not leader" with a hint) and answered by the node that
applies it, if that node still holds the request. A ReadIndex read goes
through ``read_index`` (followers forward it to the leader) and is answered
once the read index is applied locally.

Crash: the in-memory Raft core, storage, state machine and pending requests
are dropped; the disk loses (part of) its unsynced tail. Restart: a fresh
``MemoryStorage`` is rebuilt from the surviving records, the state machine
from the snapshot in it, and a new core starts with ``applied`` = the
snapshot index, so every committed entry after the snapshot is applied again.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from quorumlog.errors import InvariantViolation, ProtocolError, invariant
from quorumlog.raft import (
    ConfChange,
    ConfChangeError,
    ConfChangePendingError,
    ConfState,
    Entry,
    EntryType,
    HardState,
    MemoryStorage,
    Message,
    MessageType,
    ProposalDroppedError,
    RaftConfig,
    RaftNode,
    Ready,
    Role,
    Snapshot,
    format_message,
)
from quorumlog.sim._client import ClientRequest, ClientResponse
from quorumlog.sim._config import FaultMix
from quorumlog.sim._disk import CrashOutcome, SimDisk
from quorumlog.sim._invariants import (
    DurabilityPromise,
    DurableView,
    RaftInvariants,
    fail,
)
from quorumlog.sim._kv import KvOp, KvStateMachine, decode_command, encode_command

LOG_READ_BYTES_MAX = 1 << 40
"""Byte cap for reading a whole (short, simulated) log back from storage."""

READIES_PER_FLUSH_MAX = 1_000
"""Readies one input may cause before the core is declared not to settle."""

PENDING_REQUESTS_MAX = 10_000
"""Client requests one node holds while waiting for them to apply."""


class EntriesRecord(NamedTuple):
    entries: tuple[Entry, ...]


DiskRecord = Snapshot | EntriesRecord | HardState


def tear_record(record: DiskRecord, rng: random.Random) -> DiskRecord | None:
    """A torn write: a prefix of an entries batch; any other record is lost whole."""
    if isinstance(record, EntriesRecord) and len(record.entries) > 1:
        return EntriesRecord(record.entries[: rng.randrange(1, len(record.entries))])
    return None


@dataclass(slots=True)
class HostStats:
    readies: int = 0
    protocol_errors: int = 0
    proposals_dropped: int = 0
    snapshots_installed: int = 0
    compactions: int = 0


@dataclass(slots=True)
class Outbox:
    """Where a host's effects go (the simulator's network and nemesis)."""

    send_raft: Callable[[Message], None]
    send_client: Callable[[int, ClientResponse], None]
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
    _raft: RaftNode | None = None
    _storage: MemoryStorage | None = None
    _kv: KvStateMachine = field(default_factory=KvStateMachine)
    _pending_writes: dict[tuple[int, int], ClientRequest] = field(default_factory=dict)
    _pending_reads: dict[bytes, ClientRequest] = field(default_factory=dict)
    _waiting_reads: list[tuple[int, ClientRequest]] = field(default_factory=list)
    _read_counter: int = 0
    _was_leader: bool = False
    _promise: DurabilityPromise | None = None
    _synced_hard_state: HardState = field(default_factory=HardState)
    _unsynced_from_index: int = 0  # lowest index written since the last sync; 0: none

    def __post_init__(self) -> None:
        self.disk = SimDisk(tear_record)
        self.joined = self.bootstrap is not None

    # -- accessors ---------------------------------------------------------------

    @property
    def raft(self) -> RaftNode:
        raft = self._raft
        if raft is None:
            raise InvariantViolation(f"invariant violated: node {self.node_id} is not running")
        return raft

    @property
    def storage(self) -> MemoryStorage:
        storage = self._storage
        if storage is None:
            raise InvariantViolation(f"invariant violated: node {self.node_id} is not running")
        return storage

    @property
    def kv(self) -> KvStateMachine:
        return self._kv

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
            _replay(storage, record)
        snapshot = storage.snapshot()
        self._storage = storage
        self._kv = KvStateMachine.at_snapshot(snapshot.data, snapshot.meta.index)
        raft = RaftNode(self.raft_config, storage, self.rng)
        self._raft = raft
        self._synced_hard_state = storage.hard_state()  # all of it survived the crash
        self._unsynced_from_index = 0
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
        self._raft = None
        self._storage = None
        self._kv = KvStateMachine()
        self._pending_writes.clear()
        self._pending_reads.clear()
        self._waiting_reads.clear()
        self.up = False
        self.crash_requested = False
        self.crash_mid_send = False
        return outcome

    # -- inputs ----------------------------------------------------------------------

    def tick(self) -> None:
        self.raft.tick()
        self.flush()

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
            if request.read_index and request.command.op is KvOp.GET:
                self._read_counter += 1
                context = (
                    f"{self.node_id}.{request.client_id}.{request.seq}.{self._read_counter}"
                ).encode()
                raft.read_index(context)
                self._pending_reads[context] = request
            else:
                raft.propose(encode_command(request.command))
                self._pending_writes[(request.client_id, request.seq)] = request
        except ProposalDroppedError as exc:
            self.stats.proposals_dropped += 1
            self._reject(request, leader_hint=exc.leader_hint)
        self.flush()

    def _reject(self, request: ClientRequest, *, leader_hint: int) -> None:
        response = ClientResponse(request.client_id, request.seq, False, None, leader_hint)
        self.outbox.send_client(request.client_id, response)

    # -- Ready -----------------------------------------------------------------------

    def flush(self) -> None:
        """Handle Readies until there are none, or a crash was requested."""
        raft = self.raft
        readies = 0
        while not self.crash_requested and raft.has_ready():
            readies += 1
            if readies > READIES_PER_FLUSH_MAX:
                fail(
                    "run-bounded",
                    f"node {self.node_id} produced more than {READIES_PER_FLUSH_MAX} Readies "
                    "after one input: the core does not settle",
                )
            ready = raft.ready()
            self.stats.readies += 1
            self._persist(ready)
            self._send_all(ready)
            self._apply(ready)
            raft.advance(ready)
            for message in ready.messages:
                if message.type is MessageType.SNAP:
                    raft.report_snapshot(message.to, ok=True)
            self._report_state()

    def sync(self) -> None:
        """fsync: everything written so far is durable."""
        self.disk.sync()
        if self._storage is not None:
            self._synced_hard_state = self._storage.hard_state()
        self._unsynced_from_index = 0

    def _send_all(self, ready: Ready) -> None:
        durable = DurableView(
            self._synced_hard_state, self._unsynced_from_index, self.storage.last_index()
        )
        outbox = self.outbox
        for message in ready.messages:
            if not self.crash_mid_send and outbox.dies_before_send(self.node_id, message):
                self.crash_requested = self.crash_mid_send = True
            if self.crash_mid_send:
                # The process dies with these still queued: they never leave (what it
                # persisted stays, and it still applies what it had committed).
                self._trace(f"node {self.node_id} dies before sending {format_message(message)}")
                continue
            self.invariants.on_send(self.node_id, message, durable)
            self.outbox.send_raft(message)
            self.outbox.on_sent(self.node_id, message)

    def _persist(self, ready: Ready) -> None:
        storage, disk = self.storage, self.disk
        if ready.snapshot is not None:
            storage.apply_snapshot(ready.snapshot)
            disk.write(ready.snapshot)
        if ready.entries:
            fresh = [e for e in ready.entries if e.index >= storage.first_index()]
            if fresh:
                first, last = fresh[0].index, storage.last_index()
                prev_term = storage.term(first - 1)
                replaced = (
                    storage.entries(first, last + 1, LOG_READ_BYTES_MAX) if first <= last else []
                )
                self.invariants.on_persist_entries(self.node_id, fresh, prev_term, replaced)
            storage.append(ready.entries)
            disk.write(EntriesRecord(tuple(ready.entries)))
            first_written = ready.entries[0].index
            if not self._unsynced_from_index or first_written < self._unsynced_from_index:
                self._unsynced_from_index = first_written
        if ready.hard_state is not None:
            storage.set_hard_state(ready.hard_state)
            disk.write(ready.hard_state)
        if ready.must_sync or ready.snapshot is not None:
            self.sync()

    def _apply(self, ready: Ready) -> None:
        if ready.snapshot is not None:
            self._install_snapshot(ready.snapshot)
        kv = self._kv
        for entry in ready.committed_entries:
            if ready.snapshot is not None and entry.index <= kv.applied_index:
                continue  # covered by the snapshot installed just now
            if entry.index != kv.applied_index + 1:
                fail(
                    "applied-in-order",
                    f"node {self.node_id} is handed entry {entry.index} to apply after "
                    f"{kv.applied_index}",
                )
            kv.note_entry(entry.index, entry.term, entry.data)
            self.invariants.on_apply(self.node_id, entry, kv.digest)
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
        self._kv = KvStateMachine.at_snapshot(snapshot.data, snapshot.meta.index)
        self.invariants.on_snapshot_installed(self.node_id, snapshot, self._kv.digest)
        self._trace(f"node {self.node_id} installs snapshot {snapshot.meta.term}/"
                    f"{snapshot.meta.index} epoch={snapshot.meta.epoch}")

    def _apply_command(self, entry: Entry) -> None:
        command = decode_command(entry.data)
        applied = self._kv.apply(command)
        request = self._pending_writes.pop((command.client_id, command.seq), None)
        if request is None or applied.stale:
            return
        response = ClientResponse(command.client_id, command.seq, True, applied.result)
        self.outbox.send_client(command.client_id, response)

    def _serve_reads(self) -> None:
        if not self._waiting_reads:
            return
        applied = self._kv.applied_index
        still: list[tuple[int, ClientRequest]] = []
        for index, request in self._waiting_reads:
            if index > applied:
                still.append((index, request))
                continue
            value = self._kv.get(request.command.key)
            response = ClientResponse(request.client_id, request.seq, True, value)
            self.outbox.send_client(request.client_id, response)
        self._waiting_reads = still

    def _report_state(self) -> None:
        raft = self.raft
        invariant(
            self._kv.applied_index == raft.applied_index,
            f"node {self.node_id}: state machine at {self._kv.applied_index}, "
            f"core applied {raft.applied_index}",
        )
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
        raft, storage, kv = self.raft, self.storage, self._kv
        snapshot_index = storage.snapshot().meta.index
        if kv.applied_index - snapshot_index < min_entries:
            return False
        self.sync()  # the checkpoint below replaces the disk: nothing may be lost
        storage.create_snapshot(kv.applied_index, raft.conf_state, kv.snapshot(), raft.epoch)
        compact_to = max(kv.applied_index - keep_entries, snapshot_index + 1)
        storage.compact(compact_to)
        self.disk.rewrite(
            [storage.snapshot(), EntriesRecord(tuple(self.log_entries())), storage.hard_state()]
        )
        self.stats.compactions += 1
        self._trace(f"node {self.node_id} snapshots at {kv.applied_index}, "
                    f"compacts to {compact_to}")
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


def _replay(storage: MemoryStorage, record: DiskRecord) -> None:
    if isinstance(record, Snapshot):
        if record.meta.index > storage.snapshot().meta.index:
            storage.apply_snapshot(record)
    elif isinstance(record, EntriesRecord):
        storage.append(list(record.entries))
    else:
        storage.set_hard_state(record)


def _describe_conf_change(data: bytes) -> str:
    change = ConfChange.decode(data)
    if not change.changes:
        return "leave joint"
    parts = [f"{c.type.name.lower()} {c.node_id}" for c in change.changes]
    return ", ".join(parts) + f" ({change.transition})"
