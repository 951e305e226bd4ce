"""The asyncio driver: runs many Raft cores of one process against the WAL and rpc.

One :class:`RaftHost` per process hosts any number of groups keyed by group
id (the tables' copysets need many; the metadata service uses one). It owns:

* one ticker for every group (``tick_interval_ms``);
* one *ready pass* at a time (``_ready_pass.ReadyPass``, the implementation
  the simulator runs too): collect the Ready of every group that has one,
  send the leaders' messages, persist all of them in one hop to the I/O
  thread (group commit across groups: the fsyncs of one pass share the hop,
  and proposals that arrived meanwhile share each fsync), then send the
  others' messages — coalesced into one request per peer process — then
  apply committed entries, then advance;
* the state machines (one per group) and the futures of local proposals and
  linearizable reads;
* snapshots every ``snapshot_entries`` applied entries, then log compaction;
* snapshot transfers: a SNAP message the core emits is not sent as a message
  but streamed to the follower in chunks (``_snapshot_transfer``), and the
  outcome is reported to the core with ``report_snapshot``.

The order inside a pass is the one :class:`~quorumlog.raft.Ready` demands:
nothing leaves this process before the state it promises is durable.

A local proposal is matched to its result by the log position the core
appended it at, (term, index), as etcd's applications do: the proposal was
applied if and only if the entry applied at that index has that term. (Ids
counted per process repeated after a restart, so a restarted leader could hand
one client the result of another's command.)
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
import random
import shutil
import struct
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import msgspec

from quorumlog import rpc
from quorumlog.config import Config, require
from quorumlog.errors import (
    DeadlineExceededError,
    NotLeaderError,
    ProtocolError,
    QuorumlogError,
    UsageError,
    invariant,
)
from quorumlog.log import get_logger
from quorumlog.raft._config import MIB, RaftConfig
from quorumlog.raft._errors import CompactedError, ProposalDroppedError
from quorumlog.raft._file_snapshot import (
    AnyStateMachine,
    Checkpoints,
    FileSnapshotMachine,
    decode_manifest,
    restore_machine,
)
from quorumlog.raft._journal import CHECKPOINT_BYTES_DEFAULT, JOURNAL_DIR_NAME, HostJournal
from quorumlog.raft._liveness import PeerLiveness
from quorumlog.raft._log_tail import (
    compaction_target,
    first_retained_index,
    read_log_tail,
    retained_from,
    snapshot_tail,
)
from quorumlog.raft._node import QUIESCE_CONTEXT, RaftNode
from quorumlog.raft._ready_pass import AfterAdvance, PendingPass, ReadyPass
from quorumlog.raft._snapshot_transfer import (
    FileSource,
    ReceiveStats,
    SnapshotReceiver,
    SnapshotSender,
    SnapshotTransferConfig,
)
from quorumlog.raft._types import (
    ConfChange,
    ConfState,
    Entry,
    EntryType,
    Message,
    MessageType,
    Ready,
    Role,
    decode_message,
    encode_message,
)
from quorumlog.raft._wal_storage import WalRaftStorage
from quorumlog.wal import WalConfig

_log = get_logger(__name__)

T = TypeVar("T")

PEERS_REFRESH_TICKS = 10
"""How often (in ticks) the host recomputes the peer processes of its groups."""

INCOMING_SNAPSHOTS_DIR_NAME = "incoming-snapshots"


def group_directory(data_dir: str | os.PathLike[str], group_id: int) -> Path:
    """Where a RaftHost on ``data_dir`` keeps group ``group_id`` (its WAL and
    snapshots): what ``WalRaftStorage.create_from_snapshot`` writes to restore
    a group from a backup."""
    return Path(data_dir) / f"group-{group_id:016x}"
"""Staging directory of snapshot transfers under the host's data directory."""


class HostConfig(Config, frozen=True):
    # Wall time of one Raft tick: election after 10-20 ticks = 1-2 s at 100 ms.
    tick_interval_ms: int = 100
    election_timeout_ticks: int = 10
    heartbeat_interval_ticks: int = 1
    # Take a snapshot (and compact the log) after this many applied entries.
    snapshot_entries: int = 10_000
    # Keep this many entries before the snapshot for slow followers.
    compaction_margin_entries: int = 1_000
    # How long a proposal may wait for its entry to apply.
    proposal_timeout_ms: int = 5_000
    # Raft messages to one peer are sent as one request, bounded in count and in
    # bytes: one request must stay within the rpc frame limit (16 MiB), and a
    # batch of large APP messages would not (a message alone always fits: APP
    # carries at most max_entries_per_message_bytes or one entry).
    messages_per_send_max: int = 4096
    message_bytes_per_send_max: int = 4 * MIB
    # Proposals waiting for the next ready pass, per group (backpressure bound).
    queued_proposals_max: int = 10_000
    # Combinable proposals queued for one group before a pass are proposed as
    # one entry (``add_group``'s ``combine``), of at most this many proposals
    # and bytes (a larger proposal goes alone): one entry's apply holds the
    # apply thread, and one AppendEntries message carries it whole.
    combined_proposals_max: int = 256
    combined_proposal_bytes_max: int = 1 * MIB
    send_timeout_ms: int = 2_000
    # A follower sent a snapshot gets nothing else until the transfer is
    # reported; this is the core's safety net should no report come (the driver
    # reports every transfer, and keeps one transfer per follower running even
    # when the core asks again meanwhile).
    snapshot_wait_ticks_max: int = 100
    # Messages the core rejects are logged at most once per group and sender
    # per interval, with the count of rejections since the last line: a member
    # whose log lost entries rejects every heartbeat (about 10 a second at the
    # default tick) and must not flood its log while it waits for an operator.
    rejected_message_log_interval_ms: int = 10_000
    snapshot_transfer: SnapshotTransferConfig = msgspec.field(
        default_factory=SnapshotTransferConfig)
    # Many groups per process (docs/raft.md, "Many groups per process").
    # Coalesced heartbeats: every heartbeat and heartbeat answer without a read
    # context travels to a peer process as a compact (group, term, commit,
    # index) row of one request per pass, not as an encoded message each.
    coalesce_heartbeats: bool = True
    # Quiescence of idle groups (RaftConfig.quiesce_idle): a quiesced group is
    # not ticked and sends nothing; the host then sends each peer process an
    # empty request per tick as its sign of life.
    quiesce_idle_groups: bool = True
    # A peer process not heard from for this many ticks counts as dead, which
    # wakes the quiesced groups it leads (their followers then elect a new
    # leader within an election timeout or two) or is a member of; 0 means
    # election_timeout_ticks (what a follower would wait for a heartbeat).
    peer_dead_after_ticks: int = 0
    # A file snapshot of a group with a compaction floor keeps the log after
    # the floor up to its index (``_log_tail``: Pegasus's learn step back) if
    # those entries take at most this many bytes; a longer tail is left out
    # (logged), and a duplication that needs it resyncs its partition. The
    # file is written with every snapshot, so this also bounds that cost.
    snapshot_log_tail_bytes_max: int = 64 * MIB
    # The WAL of each group: a process hosting 1,000 groups preallocates one
    # segment per group, so the segment size bounds its disk use at rest.
    wal: WalConfig = msgspec.field(default_factory=WalConfig)
    # The host journal's WAL (one per process, shared by every group); None:
    # the same as ``wal``. A table node keeps small group segments (many
    # groups) but a full-size journal (all of their writes pass through it).
    journal_wal: WalConfig | None = None
    # One host journal for every group (``_journal``): a pass writes the
    # groups' WALs unsynced and fdatasyncs the journal once, instead of one
    # fdatasync per group written. Off, each group syncs its own WAL (one
    # group per host, as the metadata service has, gains nothing from it).
    shared_journal: bool = True
    # A pass that fsyncs at most this many new entries (and no snapshot) is
    # persisted on the event loop, not on the I/O thread: for one client the
    # fdatasync (0.1-0.2 ms here) costs less than the two thread hand-offs
    # around it, each of which waits for the GIL and, on a loaded machine,
    # for a CPU (a put crossed four of them: leader and follower, there and
    # back). Larger passes keep the hop, so the loop takes in requests while
    # the I/O thread syncs, and so does a pass that answered proposals (a
    # leader's under load), whose answers go out during the sync, not after.
    # 0: always the I/O thread.
    inline_sync_entries_max: int = 4
    # Journal bytes between checkpoints (each syncs the group WALs written
    # since the last one and releases the journal's covered segments).
    journal_checkpoint_bytes: int = CHECKPOINT_BYTES_DEFAULT

    def validate(self) -> None:
        require(self.tick_interval_ms >= 1, "tick_interval_ms must be >= 1")
        require(self.journal_checkpoint_bytes >= 1, "journal_checkpoint_bytes must be >= 1")
        require(self.inline_sync_entries_max >= 0, "inline_sync_entries_max must be >= 0")
        require(self.peer_dead_after_ticks >= 0, "peer_dead_after_ticks must be >= 0")
        self.wal.validate()
        if self.journal_wal is not None:
            self.journal_wal.validate()
        require(self.snapshot_entries >= 1, "snapshot_entries must be >= 1")
        require(self.snapshot_log_tail_bytes_max >= 0, "snapshot_log_tail_bytes_max must be >= 0")
        require(self.rejected_message_log_interval_ms >= 0,
                "rejected_message_log_interval_ms must be >= 0")
        require(self.compaction_margin_entries >= 0, "compaction_margin_entries must be >= 0")
        require(self.proposal_timeout_ms >= 1, "proposal_timeout_ms must be >= 1")
        require(self.messages_per_send_max >= 1, "messages_per_send_max must be >= 1")
        require(self.message_bytes_per_send_max >= 1, "message_bytes_per_send_max must be >= 1")
        require(self.queued_proposals_max >= 1, "queued_proposals_max must be >= 1")
        require(self.combined_proposals_max >= 1, "combined_proposals_max must be >= 1")
        require(self.combined_proposal_bytes_max >= 1, "combined_proposal_bytes_max must be >= 1")
        require(
            self.snapshot_wait_ticks_max > self.election_timeout_ticks,
            "snapshot_wait_ticks_max must exceed election_timeout_ticks",
        )
        self.snapshot_transfer.validate()


class RaftMessagesResponse(rpc.Message, frozen=True):
    type_id: ClassVar[int] = 1001
    accepted: int


HeartbeatRow = tuple[int, int, int, int, bool]
"""A coalesced HEARTBEAT: (group id, term, commit, index, quiesce)."""

HeartbeatResponseRow = tuple[int, int, int]
"""A coalesced HEARTBEAT_RESP: (group id, term, index)."""


class RaftMessagesRequest(rpc.Request[RaftMessagesResponse], frozen=True):
    """Raft messages from one process to another: (group id, encoded message),
    and the coalesced heartbeats and answers (from ``from_node`` to ``to_node``)
    as rows. An empty request is the sender's sign of life (PeerLiveness)."""

    type_id: ClassVar[int] = 1000
    from_node: int
    messages: list[tuple[int, bytes]]
    to_node: int = 0
    heartbeats: list[HeartbeatRow] = msgspec.field(default_factory=list)
    heartbeat_responses: list[HeartbeatResponseRow] = msgspec.field(default_factory=list)


@dataclass(slots=True, eq=False)
class Proposal:
    """A local proposal: its future, and where the core appended it (0 = not yet).

    ``combinable``: the group's ``combine`` may put it in one entry with the
    combinable proposals queued next to it (see ``combine_queued``)."""

    future: asyncio.Future[Any]
    data: bytes = b""
    term: int = 0
    index: int = 0
    combinable: bool = False
    # A combined proposal's members, answered as soon as it is applied (its
    # future's callback, _members_done, covers the failures).
    members: list[Proposal] | None = None


Combine = Callable[[list[bytes]], bytes]
"""A group's combiner: the data of several proposals as the data of one entry,
whose apply returns one result per proposal, in order (a list)."""


COMBINED_MSGPACK_MAX = 0xFFFF
"""Most items :func:`combine_msgpack` puts in one entry (a msgpack array16;
far above ``HostConfig.combined_proposals_max``)."""


def combine_msgpack(encoded: list[bytes]) -> bytes:
    """The combiner of a group whose proposals are each one msgpack item (a map
    or a scalar, never an array): one msgpack array of them, the encodings
    reused as they are, so the machine tells a combined entry from a single one
    by its first byte (meta's Requests, the table's TableEntries)."""
    count = len(encoded)
    if not 1 <= count <= COMBINED_MSGPACK_MAX:
        raise UsageError(f"{count} proposals cannot be combined (1..{COMBINED_MSGPACK_MAX})")
    # A fixarray up to 15 items, an array16 above.
    header = bytes((0x90 | count,)) if count <= 15 else b"\xdc" + count.to_bytes(2, "big")
    return header + b"".join(encoded)


def combine_queued(queued: list[Proposal], combine: Combine, *, count_max: int,
                   bytes_max: int) -> list[Proposal]:
    """The proposals to hand to the core: every run of consecutive combinable
    proposals (at most ``count_max`` proposals and ``bytes_max`` bytes) as one
    proposal whose future answers each of them with its own result; the rest
    as they are. The order of the proposals is kept."""
    out: list[Proposal] = []
    run: list[Proposal] = []
    size = 0
    for proposal in queued:
        if run and (not proposal.combinable or len(run) == count_max
                    or size + len(proposal.data) > bytes_max):
            out.append(_combined(run, combine))
            run, size = [], 0
        if proposal.combinable and len(proposal.data) < bytes_max:
            run.append(proposal)
            size += len(proposal.data)
        else:
            out.append(proposal)
    if run:
        out.append(_combined(run, combine))
    return out


def _combined(run: list[Proposal], combine: Combine) -> Proposal:
    if len(run) == 1:
        return run[0]
    combined = Proposal(run[0].future.get_loop().create_future(),
                        combine([p.data for p in run]), members=run)
    combined.future.add_done_callback(functools.partial(_members_done, run))
    return combined


def _members_done(members: list[Proposal], combined: asyncio.Future[Any]) -> None:
    """A combined proposal is done: each member gets its own result (applied:
    answered already, see ``_apply_normal``), or the error."""
    error = combined.exception() if not combined.cancelled() else ProposalDroppedError(
        "the combined proposal was cancelled; retry")
    if error is not None:
        for member in members:
            if not member.future.done():
                member.future.set_exception(error)
        return
    _answer_members(members, combined.result())


def _answer_members(members: list[Proposal], results: Any) -> None:
    invariant(isinstance(results, list) and len(results) == len(members),
              "a combined entry's apply answers each of its proposals")
    for member, result in zip(members, results, strict=True):
        _resolve(member.future, result)


class ProposalWaiters:
    """Local proposals by the log position the core appended them at.

    When the entry at a proposal's index is applied, :meth:`take` returns the
    proposal if the entry has the proposal's term (it is that proposal: the
    caller resolves it with the result), and otherwise fails it with a
    retriable ProposalDroppedError: a later leader put another entry at that
    index, and an entry is applied at one index only, so the proposal never
    applies. Log positions stay unique across restarts; ids counted per
    process did not.
    """

    __slots__ = ("_by_index", "group_id")

    def __init__(self, group_id: int) -> None:
        self.group_id = group_id
        self._by_index: dict[int, Proposal] = {}

    def __len__(self) -> int:
        return len(self._by_index)

    def add(self, proposal: Proposal, outcome_unknown: QuorumlogError) -> None:
        """Wait for ``proposal`` at its (term, index)."""
        invariant(proposal.term > 0 and proposal.index > 0,
                  "a proposal waits only once the core appended it")
        previous = self._by_index.get(proposal.index)
        if previous is not None:
            # Leadership was lost and won again at the same index without the
            # role change being seen: whether the old entry commits is unknown.
            _fail(previous.future, outcome_unknown)
        self._by_index[proposal.index] = proposal

    def discard(self, proposal: Proposal) -> None:
        """Stop waiting for ``proposal`` (its caller gave up)."""
        if self._by_index.get(proposal.index) is proposal:
            del self._by_index[proposal.index]

    def take(self, entry: Entry) -> Proposal | None:
        """The proposal that ``entry`` (being applied) is, if any; see the class doc."""
        proposal = self._by_index.pop(entry.index, None)
        if proposal is None or proposal.term == entry.term:
            return proposal
        _fail(proposal.future, ProposalDroppedError(
            f"group {self.group_id}: the proposal appended at index {entry.index} in term "
            f"{proposal.term} was replaced by an entry of term {entry.term} (a new leader's "
            "log won); it was not applied, retry it"))
        return None

    def fail_up_to(self, index: int, error: QuorumlogError) -> None:
        """Fail every proposal at or below ``index`` (a snapshot jumped past them)."""
        for position in [i for i in self._by_index if i <= index]:
            _fail(self._by_index.pop(position).future, error)

    def fail_all(self, error: QuorumlogError) -> None:
        for proposal in self._by_index.values():
            _fail(proposal.future, error)
        self._by_index.clear()


class LogRateLimiter:
    """At most one log line per key and interval; counts the lines it held back.

    ``admit(key, now_s)`` returns None to stay quiet, or the number of
    occurrences suppressed since the key's last line (0 for a first line).
    Keys are (group, sender node id): bounded by the groups and members.
    """

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._last: dict[Any, tuple[float, int]] = {}

    def admit(self, key: Any, now_s: float) -> int | None:
        last = self._last.get(key)
        if last is not None and now_s - last[0] < self.interval_s:
            self._last[key] = (last[0], last[1] + 1)
            return None
        self._last[key] = (now_s, 0)
        return 0 if last is None else last[1]


@dataclass(slots=True)
class SnapshotSendStats:
    transfers_completed: int = 0
    transfers_failed: int = 0
    bytes_sent: int = 0


@dataclass(slots=True)
class _Group:
    group_id: int
    node: RaftNode
    storage: WalRaftStorage
    machine: AnyStateMachine
    applied_index: int
    snapshot_index: int
    proposals: ProposalWaiters
    combine: Combine | None = None  # see add_group
    # Proposals of this pass, handed to the core together (one append, one
    # round of AppendEntries) at the start of the next ready pass.
    queued: list[Proposal] = field(default_factory=list)
    reads: dict[bytes, asyncio.Future[int]] = field(default_factory=dict)
    waiting_reads: list[tuple[int, asyncio.Future[int]]] = field(default_factory=list)
    role: Role = Role.FOLLOWER
    leader_id: int = 0
    # The log tail of the current snapshot (``_log_tail``), read on first use:
    # (snapshot index, entries).
    log_tail: tuple[int, list[Entry]] | None = None


@dataclass(frozen=True, slots=True)
class _RpcTransport:
    """The ready pass's transport in a process: the host's coalescing rpc sender."""

    send: Callable[[Sequence[tuple[int, Message]]], None]


class RaftHost:
    """Runs Raft groups in one asyncio process; see the module docstring."""

    def __init__(
        self,
        node_id: int,
        addresses: dict[int, str],
        data_dir: str | Path,
        *,
        config: HostConfig | None = None,
        pool: rpc.Pool | None = None,
        rng: random.Random | None = None,
    ) -> None:
        invariant(node_id in addresses, f"node {node_id} must be in the address map")
        self.node_id = node_id
        self.addresses = dict(addresses)
        self.data_dir = Path(data_dir)
        self.config = config or HostConfig()
        self.config.validate()
        self._pool = pool if pool is not None else rpc.Pool()  # an empty Pool is falsy (len 0)
        self._own_pool = pool is None
        self._rng = rng or random.Random()
        self._groups: dict[int, _Group] = {}
        self._journal = (HostJournal.open(
            self.data_dir / JOURNAL_DIR_NAME, config=self.config.journal_wal or self.config.wal,
            checkpoint_bytes=self.config.journal_checkpoint_bytes)
            if self.config.shared_journal else None)
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"raft-io-{node_id}")
        # Snapshot transfers write and read staging files on a thread of their
        # own, so a large transfer never delays the WAL's fsyncs.
        self._snapshot_io = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"raft-snap-{node_id}")
        # A pool of its own for snapshot streams: chunks never queue in front
        # of heartbeats on the Raft message connections.
        self._snapshot_pool = rpc.Pool(config=self._pool.config, security=self._pool.security)
        self._snapshot_sender = SnapshotSender(
            node_id, self.config.snapshot_transfer, self._snapshot_pool,
            lambda: self._rng.getrandbits(63))
        self._snapshot_receiver = SnapshotReceiver(
            self.data_dir / INCOMING_SNAPSHOTS_DIR_NAME, self.config.snapshot_transfer,
            self._snapshot_io, hosts_group=self._groups.__contains__,
            deliver=self._deliver_snapshot)
        self._snapshot_sends: dict[tuple[int, int], asyncio.Task[None]] = {}
        # Default-timeout proposals in the order made: (deadline, group, proposal).
        self._proposal_deadlines: deque[tuple[float, int, Proposal]] = deque()
        # Connections ``_send_all`` wrote to, flushed when it returns.
        self._flush_after: list[rpc.Connection] = []
        self._pass: ReadyPass[_Group] = ReadyPass(
            _RpcTransport(self._send_all), self._apply_ready)
        self._rejections = LogRateLimiter(self.config.rejected_message_log_interval_ms / 1000)
        self._liveness = PeerLiveness(
            self.config.peer_dead_after_ticks or self.config.election_timeout_ticks)
        # Peer processes of this host's groups (recomputed every few ticks).
        self._peers: set[int] = set()
        self._ticks = 0
        self.snapshot_send_stats = SnapshotSendStats()
        self._work = asyncio.Event()  # hosts are created inside the running loop
        self._pass_lock = asyncio.Lock()  # a group leaves only between ready passes
        self._tasks: list[asyncio.Task[None]] = []
        self._read_ids = itertools.count(1)
        self._closed = False
        # Set when the ready loop dies; the node process exits on it.
        self.failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.on_role_change: Callable[[int, Role, int], None] | None = None
        # Addresses of members that joined after start-up (the application keeps
        # them in replicated state, e.g. the meta service under /_meta/members/).
        self.resolver: Callable[[int], str | None] | None = None
        # The highest index a group's log may be compacted up to (None: no
        # bound), asked before every compaction: table duplication keeps the
        # log its shippers have not confirmed (docs/duplication.md).
        self.compaction_floor: Callable[[int], int | None] | None = None

    # ----- lifecycle --------------------------------------------------------

    def handlers(self) -> dict[type[rpc.Request[Any]], Any]:
        """The rpc handlers this host serves (add them to the process's server)."""
        return {RaftMessagesRequest: self._on_messages, **self._snapshot_receiver.handlers()}

    @property
    def snapshot_receive_stats(self) -> ReceiveStats:
        """Counters of snapshots received (completed and refused transfers, bytes)."""
        return self._snapshot_receiver.stats

    def add_group(
        self, group_id: int, voters: set[int] | None, machine: AnyStateMachine,
        *, broadcast_commit: bool = True, combine: Combine | None = None,
    ) -> None:
        """Open (or create) group ``group_id``; ``voters`` bootstraps a new group.

        A member joining an existing group passes ``voters=None`` and learns the
        configuration from the leader. ``broadcast_commit``: see RaftConfig.
        ``combine``: the group takes combinable proposals (``propose(...,
        combine=True)``); those queued together before a ready pass become one
        entry (``combine_queued``), and the machine's apply of such an entry
        returns a list with one result per proposal.
        """
        invariant(group_id not in self._groups, f"group {group_id} is already hosted")
        cs = ConfState(voters=frozenset(voters)) if voters else None
        storage = WalRaftStorage.open(group_directory(self.data_dir, group_id), conf_state=cs,
                                      config=self.config.wal, journal=self._journal,
                                      group_id=group_id)
        snap = storage.snapshot()
        try:
            restore_machine(machine, storage.directory, snap)
        except BaseException:
            storage.close()
            raise
        # Checkpoints no snapshot record names: cut short by a crash, or replaced.
        Checkpoints(storage.directory).purge(keep_index=snap.meta.index, newer_too=True)
        applied = snap.meta.index
        raft_config = RaftConfig(
            node_id=self.node_id,
            election_timeout_ticks=self.config.election_timeout_ticks,
            heartbeat_interval_ticks=self.config.heartbeat_interval_ticks,
            max_snapshot_wait_ticks=self.config.snapshot_wait_ticks_max,
            quiesce_idle=self.config.quiesce_idle_groups,
            broadcast_commit=broadcast_commit,
        )
        node = RaftNode(raft_config, storage, random.Random(self._rng.random()), applied=applied)
        self._groups[group_id] = _Group(
            group_id, node, storage, machine, applied, applied, ProposalWaiters(group_id),
            combine)
        self._kick()

    async def remove_group(self, group_id: int) -> None:
        """Stop hosting ``group_id`` and delete its Raft log and snapshots from disk.

        For a group whose data is gone for good (a dropped table's partition):
        waits for the ready pass in progress, fails the group's pending
        proposals and reads, cancels its snapshot sends, closes its storage and
        removes its directory. Messages for it that arrive later are dropped
        like those of any group this node does not host. The state machine is
        the caller's to close.
        """
        async with self._pass_lock:
            group = self._groups.pop(group_id, None)
            if group is None:
                return
            for key, task in list(self._snapshot_sends.items()):
                if key[0] == group_id:
                    task.cancel()
            _fail_all(group, ProposalDroppedError(f"raft group {group_id} was removed"))
            if self._journal is not None:
                # Its journaled writes must never replay into a later group of this id.
                await asyncio.get_running_loop().run_in_executor(
                    self._io, self._journal.forget, group_id)
            group.storage.close()
        directory = group_directory(self.data_dir, group_id)
        await asyncio.get_running_loop().run_in_executor(
            self._io, functools.partial(shutil.rmtree, directory, ignore_errors=True))
        _log.info("raft_group_removed", node=self.node_id, group=group_id)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._ticker(), name=f"raft-ticker-{self.node_id}"),
            loop.create_task(self._ready_loop(), name=f"raft-ready-{self.node_id}"),
        ]

    async def close(self) -> None:
        self._closed = True
        tasks = [*self._tasks, *self._snapshot_sends.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for group in self._groups.values():
            _fail_all(group, ProposalDroppedError("the raft host is shutting down"))
        journal, self._journal = self._journal, None  # close() may be called twice
        if journal is not None:
            try:  # on the I/O thread, after any persist a cancelled pass left running
                await asyncio.get_running_loop().run_in_executor(self._io, journal.checkpoint)
            except (QuorumlogError, OSError) as exc:  # a restart replays the journal instead
                _log.warning("raft_journal_checkpoint_failed", node=self.node_id, error=str(exc))
            journal.close()
        for group in self._groups.values():
            group.storage.close()
        if self._own_pool:
            await self._pool.close()
        await self._snapshot_pool.close()
        self._snapshot_io.shutdown(wait=True)
        self._snapshot_receiver.close()
        self._io.shutdown(wait=True)

    # ----- client operations -----------------------------------------------

    def group(self, group_id: int) -> _Group:
        group = self._groups.get(group_id)
        if group is None:
            raise UsageError(f"raft group {group_id} is not hosted on node {self.node_id}")
        return group

    def retained_entries(self, group_id: int, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        """Entries [lo, hi) of the group's log, at most ``max_bytes`` (at least
        one entry): from the Raft log, or below its first index from the log
        tail kept with the current snapshot (``_log_tail``), which holds the
        entries after the compaction floor that the snapshot covers. May
        return fewer than asked (the tail's part first); CompactedError if
        ``lo`` is in neither."""
        group = self.group(group_id)
        tail = self._log_tail(group) if lo < group.storage.first_index() else []
        return retained_from(group.storage, tail, lo, hi, max_bytes, group_id=group_id)

    def _log_tail(self, group: _Group) -> list[Entry]:
        snapshot = group.storage.snapshot()
        index = snapshot.meta.index
        if group.log_tail is None or group.log_tail[0] != index:
            entries: list[Entry] = []
            if snapshot.data and isinstance(group.machine, FileSnapshotMachine):
                entries = read_log_tail(Checkpoints(group.storage.directory).path(index))
            group.log_tail = (index, entries)
        return group.log_tail[1]

    def _snapshot_tail(self, group: _Group, index: int) -> list[Entry] | None:
        """The entries after the compaction floor up to ``index`` to keep with a
        snapshot at ``index``; None without a floor below it, or if they are
        gone already or longer than ``snapshot_log_tail_bytes_max`` (logged)."""
        floor = None if self.compaction_floor is None else self.compaction_floor(group.group_id)
        bound = self.config.snapshot_log_tail_bytes_max
        try:
            return snapshot_tail(functools.partial(self.retained_entries, group.group_id),
                                 floor, index, bound, first_retained=first_retained_index(
                                     group.storage, self._log_tail(group)))
        except CompactedError as exc:
            _log.warning("raft_snapshot_log_tail_left_out", node=self.node_id,
                         group=group.group_id, floor=floor, index=index, reason=exc.message)
            return None

    def address_of(self, node_id: int) -> str | None:
        address = self.addresses.get(node_id)
        if address is None and self.resolver is not None:
            address = self.resolver(node_id)
        return address

    def leader_address(self, group_id: int) -> str | None:
        leader = self.group(group_id).node.leader_id
        return self.address_of(leader) if leader else None

    async def propose(self, group_id: int, data: bytes, *, timeout_s: float | None = None,
                      combine: bool = False) -> Any:
        """Replicate ``data``; return what the state machine's apply returned.

        Raises NotLeaderError or ProposalDroppedError (retriable) when the
        proposal was not, or may not have been, applied, and
        DeadlineExceededError when it was not applied in time. ``combine``:
        the proposal may share an entry with others (``add_group``).
        """
        return await self.propose_nowait(group_id, data, timeout_s=timeout_s, combine=combine)

    def propose_nowait(
        self, group_id: int, data: bytes, *, timeout_s: float | None = None,
        combine: bool = False,
    ) -> asyncio.Future[Any]:
        """:meth:`propose` without a coroutine: the future of the apply result.

        Raises at once what :meth:`propose` raises before queueing (not the
        leader, queue full, bad data); the future fails like :meth:`propose`.
        For a caller that answers many requests (meta's write handler): no
        task or coroutine per proposal, and with the default timeout no timer
        either - the ticker expires proposals in the order they were made.
        """
        group = self.group(group_id)
        if not isinstance(data, bytes) or not data:
            # Empty entries are the leaders' own (never applied): a proposal has data.
            raise UsageError("a proposal must be non-empty bytes")
        if combine and group.combine is None:
            raise UsageError(f"group {group_id} was added without a combiner: "
                             "its proposals cannot be combined")
        self.require_leader(group)
        if len(group.queued) >= self.config.queued_proposals_max:
            raise ProposalDroppedError(
                f"group {group_id}: {len(group.queued)} proposals already queued; retry later"
            )
        loop = asyncio.get_running_loop()
        proposal = Proposal(loop.create_future(), data, combinable=combine)
        group.queued.append(proposal)
        self._kick()
        if timeout_s is None:
            # Deadlines of default-timeout proposals only grow: a queue, checked per tick.
            self._proposal_deadlines.append(
                (loop.time() + self.config.proposal_timeout_ms / 1000, group_id, proposal))
        else:
            handle = loop.call_later(timeout_s, self._expire_proposal, group_id, proposal)
            proposal.future.add_done_callback(lambda _: handle.cancel())
        return proposal.future

    def _expire_proposal(self, group_id: int, proposal: Proposal) -> None:
        if proposal.future.done():
            return
        proposal.future.set_exception(DeadlineExceededError(
            f"group {group_id}: proposal not applied within the deadline"))
        group = self._groups.get(group_id)
        if group is not None:
            group.proposals.discard(proposal)

    def _expire_proposals(self, now: float) -> None:
        """Fail the default-timeout proposals whose deadline passed (each tick)."""
        deadlines = self._proposal_deadlines
        while deadlines and (deadlines[0][2].future.done() or deadlines[0][0] <= now):
            _, group_id, proposal = deadlines.popleft()
            self._expire_proposal(group_id, proposal)

    async def read_barrier(self, group_id: int, *, timeout_s: float | None = None) -> int:
        """Wait until a linearizable read may be served (ReadIndex); return the index."""
        group = self.group(group_id)
        self.require_leader(group)
        context = struct.pack("<QQ", self.node_id, next(self._read_ids))
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        group.reads[context] = future
        group.node.read_index(context)
        self._kick()
        try:
            return await _with_deadline(
                future, self._timeout(timeout_s),
                f"group {group_id}: read index not confirmed within the deadline")
        finally:
            group.reads.pop(context, None)

    async def change_membership(
        self, group_id: int, change: ConfChange, *, timeout_s: float | None = None
    ) -> ConfState:
        """Propose a configuration change and wait until it is applied here."""
        group = self.group(group_id)
        self.require_leader(group)
        term, index = group.node.propose_conf_change(change)
        proposal = Proposal(asyncio.get_running_loop().create_future(), term=term, index=index)
        group.proposals.add(proposal, self._outcome_unknown(group, "leadership changed"))
        self._kick()
        try:
            conf_state: ConfState = await _with_deadline(
                proposal.future, self._timeout(timeout_s),
                f"group {group_id}: conf change not applied within the deadline")
            return conf_state
        finally:
            group.proposals.discard(proposal)

    def transfer_leader(self, group_id: int, target: int) -> None:
        self.group(group_id).node.transfer_leader(target)
        self._kick()

    def status(self) -> list[dict[str, Any]]:
        out = []
        for gid, group in sorted(self._groups.items()):
            node = group.node
            out.append({
                "group": gid,
                "role": node.role.name.lower(),
                "term": node.term,
                "leader": node.leader_id,
                "commit_index": node.commit_index,
                "applied_index": group.applied_index,
                "epoch": node.epoch,
                "voters": sorted(node.conf_state.voters),
                "learners": sorted(node.conf_state.learners),
            })
        return out

    def require_leader(self, group: _Group) -> None:
        if group.node.role is not Role.LEADER:
            leader = group.node.leader_id
            raise NotLeaderError(
                f"node {self.node_id} is not the leader of group {group.group_id}"
                + (f"; try node {leader}" if leader else "; no leader known yet, retry"),
                leader_hint=self.address_of(leader) if leader else None,
            )

    def _timeout(self, timeout_s: float | None) -> float:
        return timeout_s if timeout_s is not None else self.config.proposal_timeout_ms / 1000

    def _outcome_unknown(self, group: _Group, why: str) -> NotLeaderError:
        leader = group.node.leader_id
        return NotLeaderError(
            f"node {self.node_id}, group {group.group_id}: {why}; the outcome of the "
            "proposal is unknown, retry with the same request id",
            leader_hint=self.address_of(leader) if leader else None,
        )

    # ----- the loops ----------------------------------------------------------

    def _kick(self) -> None:
        self._work.set()

    async def _ticker(self) -> None:
        interval = self.config.tick_interval_ms / 1000
        while not self._closed:
            await asyncio.sleep(interval)
            self._tick()

    def _tick(self) -> None:
        """One tick: liveness changes first (they wake quiesced groups), then
        every awake group's clock, then a sign of life to quiet peers."""
        changed = self._liveness.tick()
        self._expire_proposals(asyncio.get_running_loop().time())
        groups = self._groups.values()
        if changed:
            for group in groups:
                group.node.peer_liveness_changed(changed)
        for group in groups:
            node = group.node
            if not node.quiesced:
                node.tick()
        if self._ticks % PEERS_REFRESH_TICKS == 0:
            self._peers = {peer for group in groups
                           for peer in group.node.conf_state.members()} - {self.node_id}
        self._ticks += 1
        for peer in self._liveness.beat_targets(self._peers):
            if self.address_of(peer) is not None:  # a member still joining has none yet
                self._send(peer, RaftMessagesRequest(
                    from_node=self.node_id, messages=[], to_node=peer), ())
        for connection in self._flush_after:  # now, as _send_all does (see there)
            connection.flush()
        self._flush_after.clear()
        self._kick()

    async def _ready_loop(self) -> None:
        while not self._closed:
            await self._work.wait()
            self._work.clear()
            try:
                async with self._pass_lock:
                    await self._ready_pass()
            except Exception as exc:
                # Storage or state machine failed mid-pass: the groups' state is
                # unknown, so this host must stop rather than limp on.
                _log.exception("raft_ready_pass_failed", node=self.node_id)
                if not self.failed.done():
                    self.failed.set_exception(exc)
                raise

    def _propose_queued(self, group: _Group) -> None:
        queued, group.queued = group.queued, []
        live = [p for p in queued if not p.future.done()]  # not timed out meanwhile
        if not live:
            return
        if group.combine is not None:
            live = combine_queued(live, group.combine,
                                  count_max=self.config.combined_proposals_max,
                                  bytes_max=self.config.combined_proposal_bytes_max)
        try:
            term, first = group.node.propose_batch([p.data for p in live])
        except QuorumlogError as exc:
            error = exc
            if isinstance(exc, ProposalDroppedError) and group.node.role is not Role.LEADER:
                error = NotLeaderError(exc.message, leader_hint=self.address_of(
                    group.node.leader_id) if group.node.leader_id else None)
            for proposal in live:
                _fail(proposal.future, error)
            return
        unknown = self._outcome_unknown(group, "leadership changed")
        for offset, proposal in enumerate(live):
            proposal.term, proposal.index, proposal.data = term, first + offset, b""
            group.proposals.add(proposal, unknown)

    async def _ready_pass(self) -> None:
        for group in self._groups.values():
            if group.queued:
                self._propose_queued(group)
        pending = self._pass.begin(self._groups.values())
        if pending is None:
            return
        answered = False
        if pending.needs_sync:
            for group, ready in pending.batch:
                # Only to answer local proposals sooner: a member without any
                # (a follower) applies after its write, as its acknowledgement
                # leaves first (ReadyPass.finish sends, then applies).
                if (ready.committed_entries and group.proposals
                        and self._apply_durable(group, ready)):
                    answered = True
        # A pass that answered proposals syncs on the I/O thread even when small:
        # the loop sends the answers meanwhile instead of after the fdatasync.
        if pending.needs_sync and (answered or not self._sync_inline(pending)):
            await asyncio.get_running_loop().run_in_executor(
                self._io, self._persist, pending, True)
        else:
            # Nothing to fsync (only a new commit index, say), or a small pass:
            # the write costs less than the two thread hand-offs of the I/O thread.
            self._persist(pending, pending.needs_sync)
        self._pass.finish(pending)
        for group, _ in pending.batch:
            await self._maybe_snapshot(group)
        if any(g.node.has_ready() for g in self._groups.values()):
            self._kick()

    def _apply_durable(self, group: _Group, ready: Ready) -> bool:
        """Apply, before this pass's write, the committed entries that are already
        durable here, and answer their proposals.

        A leader's pass under load carries both: entries that became committed
        (answers waiting) and new proposals to write. The answers need not wait
        for the new entries' fdatasync (0.2-3 ms here): an entry below the
        Ready's first new entry and within the storage the core reads (which
        only holds what earlier passes persisted) is durable on this member,
        and committed means durable on a quorum. Normal entries only, up to
        the first conf change (the core applies those in ``advance()``, after
        which their proposals resolve) and not when the Ready installs a
        snapshot; ``_apply`` skips what is applied here."""
        if ready.snapshot is not None or ready.soft_state is not None:
            return False
        durable = group.storage.last_index()
        if ready.entries:
            durable = min(durable, ready.entries[0].index - 1)
        proposals = group.proposals
        answered = False
        for entry in ready.committed_entries:
            if entry.index > durable or entry.type is not EntryType.NORMAL:
                break
            if entry.index > group.applied_index:
                proposal = proposals.take(entry) if proposals else None
                answered = answered or proposal is not None
                _apply_normal(group, entry, proposal)
        return answered

    def _sync_inline(self, pending: PendingPass[_Group]) -> bool:
        """Whether a pass that fsyncs is persisted on the loop (``inline_sync_entries_max``)."""
        bound = self.config.inline_sync_entries_max
        entries = 0
        for _, ready in pending.batch:
            if ready.snapshot is not None:
                return False
            entries += len(ready.entries)
            if entries > bound:
                return False
        return bound > 0

    def _persist(self, pending: PendingPass[_Group], sync: bool) -> None:
        """Persist a pass: every group's WAL, then (shared journal) the journal,
        whose one fdatasync makes all of the pass's groups durable."""
        pending.persist()
        if self._journal is not None:
            self._journal.flush(sync=sync)

    # ----- messages -------------------------------------------------------------

    def _send_all(self, messages: Sequence[tuple[int, Message]]) -> None:
        """The ready pass's transport: one request per peer (bounded), SNAP
        messages as snapshot transfers."""
        per_peer: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
        heartbeats: dict[int, list[HeartbeatRow]] = defaultdict(list)
        responses: dict[int, list[HeartbeatResponseRow]] = defaultdict(list)
        coalesce = self.config.coalesce_heartbeats
        for group_id, message in messages:
            kind = message.type
            if kind is MessageType.SNAP:
                self._start_snapshot_send(group_id, message)
            elif coalesce and kind is MessageType.HEARTBEAT and (
                    not message.context or message.context == QUIESCE_CONTEXT):
                heartbeats[message.to].append(
                    (group_id, message.term, message.commit, message.index,
                     bool(message.context)))
            elif (coalesce and kind is MessageType.HEARTBEAT_RESP and not message.context
                  and not message.reject):
                responses[message.to].append((group_id, message.term, message.index))
            else:
                per_peer[message.to].append((group_id, encode_message(message)))
        count_max = self.config.messages_per_send_max
        bytes_max = self.config.message_bytes_per_send_max
        me = self.node_id
        flush = self._flush_after
        flush.clear()
        for peer, encoded in per_peer.items():
            for chunk in split_messages(encoded, count_max, bytes_max):
                self._send(peer, RaftMessagesRequest(from_node=me, messages=chunk),
                           [gid for gid, _ in chunk])
        # Rows are a few dozen bytes: count_max of them stay far below bytes_max.
        for peer in heartbeats.keys() | responses.keys():
            beats, answers = heartbeats.get(peer, []), responses.get(peer, [])
            for start in range(0, max(len(beats), len(answers)), count_max):
                rows = beats[start:start + count_max]
                answer_rows = answers[start:start + count_max]
                self._send(peer, RaftMessagesRequest(
                    from_node=me, messages=[], to_node=peer, heartbeats=rows,
                    heartbeat_responses=answer_rows),
                    [row[0] for row in rows] + [row[0] for row in answer_rows])
        # Write now, not when the loop next turns: the leader sends before its
        # own fsync, which may run on this thread (inline sync), and both
        # sides have applying to do after sending; the peers work meanwhile.
        for connection in flush:
            connection.flush()
        flush.clear()

    def _send(self, peer: int, request: RaftMessagesRequest,
              group_ids: Sequence[int]) -> None:
        self._liveness.sent(peer)
        address = self.address_of(peer)
        if address is None:
            _log.warning("raft_unknown_peer", node=self.node_id, peer=peer)
            return
        # One-way: a Raft message's answer comes back as a message of its own,
        # so an rpc response would only cost both sides a frame and a send.
        connection = self._pool.get_nowait(address)
        if connection is not None:
            try:
                connection.send_oneway(request)
            except QuorumlogError:  # closed, or the peer is not reading
                self._unreachable(peer, group_ids)
                return
            self._flush_after.append(connection)
            return
        task = asyncio.get_running_loop().create_task(self._connect_and_send(address, request))
        task.add_done_callback(lambda t: self._sent(t, peer, group_ids))

    async def _connect_and_send(self, address: str, request: RaftMessagesRequest) -> None:
        async with asyncio.timeout(self.config.send_timeout_ms / 1000):
            connection = await self._pool.get(address)
        connection.send_oneway(request)

    def _sent(self, task: asyncio.Task[Any], peer: int, group_ids: Sequence[int]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        self._unreachable(peer, group_ids)

    def _unreachable(self, peer: int, group_ids: Sequence[int]) -> None:
        for group_id in set(group_ids):
            group = self._groups.get(group_id)
            if group is not None:
                group.node.report_unreachable(peer)
        self._kick()

    # ----- snapshot transfers ------------------------------------------------------

    def _start_snapshot_send(self, group_id: int, message: Message) -> None:
        """Stream the snapshot of a SNAP message the core emitted (one transfer per
        follower and group at a time: a running one reports when it ends)."""
        key = (group_id, message.to)
        if key in self._snapshot_sends:
            return
        task = asyncio.get_running_loop().create_task(
            self._send_snapshot(group_id, message),
            name=f"raft-snapshot-{self.node_id}-{group_id}-{message.to}")
        self._snapshot_sends[key] = task
        # A task cancelled before it ran never reaches its finally: forget it here.
        task.add_done_callback(lambda done: self._forget_snapshot_send(key, done))

    def _forget_snapshot_send(self, key: tuple[int, int], task: asyncio.Task[None]) -> None:
        if self._snapshot_sends.get(key) is task:
            del self._snapshot_sends[key]

    async def _send_snapshot(self, group_id: int, message: Message) -> None:
        peer, ok = message.to, False
        loop = asyncio.get_running_loop()
        try:
            delay_s = self._snapshot_sender.delay_s(group_id, peer, loop.time())
            if delay_s > 0:
                await asyncio.sleep(delay_s)  # backoff after a failed transfer
            address = self.address_of(peer)
            if address is None:
                raise UsageError(f"no address known for node {peer}")
            started = loop.time()
            sent_bytes = await self._snapshot_sender.send(
                address, group_id, message, self._snapshot_files(group_id, message))
            self.snapshot_send_stats.transfers_completed += 1
            self.snapshot_send_stats.bytes_sent += sent_bytes
            ok = True
            _log.info("raft_snapshot_sent", node=self.node_id, group=group_id, peer=peer,
                      bytes=sent_bytes, duration_ms=round((loop.time() - started) * 1000))
        except (QuorumlogError, OSError, TimeoutError) as exc:
            self.snapshot_send_stats.transfers_failed += 1
            _log.warning("raft_snapshot_send_failed", node=self.node_id, group=group_id,
                         peer=peer, error=str(exc))
        finally:
            # Forget the transfer before reporting: the core may ask for the
            # next one in the very next pass.
            self._snapshot_sends.pop((group_id, peer), None)
            self._snapshot_sender.finished(group_id, peer, ok=ok, now=loop.time())
            group = self._groups.get(group_id)
            if group is not None and not self._closed:
                # Success: the core waits for the follower's answer; failure: it
                # probes again (and the next transfer waits out the backoff).
                group.node.report_snapshot(peer, ok)
                self._kick()

    def _snapshot_files(self, group_id: int, message: Message) -> FileSource | None:
        """The checkpoint files a SNAP message's snapshot names (file machines)."""
        group = self.group(group_id)
        snapshot = message.snapshot
        if (snapshot is None or not snapshot.data
                or not isinstance(group.machine, FileSnapshotMachine)):
            return None  # bytes, or the bootstrap snapshot (no state, no files)
        path, manifest = Checkpoints(group.storage.directory).check(snapshot)
        return FileSource(path, [(f.name, f.size_bytes) for f in manifest.files],
                          self._snapshot_io)

    def _deliver_snapshot(self, group_id: int, message: Message, files: Path | None) -> None:
        """Step a complete incoming SNAP message (the receiver verified it); a file
        snapshot's files first become the group's checkpoint at its index."""
        group = self.group(group_id)
        snapshot = message.snapshot
        invariant(snapshot is not None, "the receiver delivers SNAP messages")
        if (isinstance(group.machine, FileSnapshotMachine) and snapshot is not None
                and snapshot.data):  # the bootstrap snapshot has no state, no files
            manifest = decode_manifest(snapshot.data)
            if files is None and manifest.files:
                raise ProtocolError(f"file snapshot for group {group_id} came without its files")
            if files is not None:
                Checkpoints(group.storage.directory).adopt(files, snapshot.meta.index, manifest)
        elif files is not None:
            raise ProtocolError(
                f"group {group_id} keeps bytes snapshots; the sender sent files")
        group.node.step(message)
        self._kick()

    async def _on_messages(
        self, request: RaftMessagesRequest, ctx: rpc.RequestContext
    ) -> RaftMessagesResponse:
        sender = request.from_node
        if request.to_node not in (0, self.node_id):
            _log.warning("raft_misaddressed_request", node=self.node_id,
                         to_node=request.to_node, sender=sender, peer=ctx.peer)
            return RaftMessagesResponse(accepted=0)
        self._liveness.heard(sender)
        accepted = 0
        for group_id, data in request.messages:
            accepted += self._step(group_id, decode_message(data), ctx)
        me = self.node_id
        for group_id, term, commit, index, quiesce in request.heartbeats:
            accepted += self._step(group_id, Message(
                type=MessageType.HEARTBEAT, to=me, from_=sender, term=term, commit=commit,
                index=index, context=QUIESCE_CONTEXT if quiesce else b""), ctx)
        for group_id, term, index in request.heartbeat_responses:
            accepted += self._step(group_id, Message(
                type=MessageType.HEARTBEAT_RESP, to=me, from_=sender, term=term,
                index=index), ctx)
        if accepted:
            self._kick()
        return RaftMessagesResponse(accepted=accepted)

    def _step(self, group_id: int, message: Message, ctx: rpc.RequestContext) -> int:
        """Step one incoming message into its group; 1 if the core took it."""
        group = self._groups.get(group_id)
        if group is None:
            _log.warning("raft_unknown_group", node=self.node_id, group=group_id,
                         peer=ctx.peer)
            return 0
        try:
            group.node.step(message)
        except QuorumlogError as exc:
            suppressed = self._rejections.admit(
                (group_id, message.from_), asyncio.get_running_loop().time())
            if suppressed is not None:
                _log.warning("raft_message_rejected", node=self.node_id, group=group_id,
                             sender=message.from_, peer=ctx.peer, error=exc.message,
                             suppressed_since_last_line=suppressed)
            return 0
        return 1

    # ----- applying -------------------------------------------------------------

    def _apply_ready(self, group: _Group, ready: Ready) -> AfterAdvance | None:
        """The ready pass's application step; conf change proposals are resolved
        after ``advance()``, which is where the core switches configuration."""
        conf_changes = self._apply(group, ready)
        if not conf_changes and not any(e.type is EntryType.CONF_CHANGE
                                        for e in ready.committed_entries):
            return None

        def resolve_conf_changes() -> None:
            conf = group.node.conf_state
            _log.info("raft_membership_changed", node=self.node_id, group=group.group_id,
                      voters=sorted(conf.voters), learners=sorted(conf.learners),
                      voters_outgoing=sorted(conf.voters_outgoing), term=group.node.term)
            for proposal in conf_changes:
                _resolve(proposal.future, group.node.conf_state)

        return resolve_conf_changes

    def _apply(self, group: _Group, ready: Ready) -> list[Proposal]:
        """Install the snapshot, apply committed entries, resolve their proposals;
        return the conf change proposals to resolve once the core applied them."""
        if ready.soft_state is not None:
            self._role_changed(group, ready.soft_state.role, ready.soft_state.leader_id)
        if ready.snapshot is not None and ready.snapshot.meta.index > group.applied_index:
            index = ready.snapshot.meta.index
            _log.info("raft_snapshot_installed", node=self.node_id, group=group.group_id,
                      index=index, term=ready.snapshot.meta.term,
                      voters=sorted(ready.snapshot.meta.conf_state.voters))
            restore_machine(group.machine, group.storage.directory, ready.snapshot)
            Checkpoints(group.storage.directory).purge(keep_index=index)
            group.applied_index = group.snapshot_index = index
            group.proposals.fail_up_to(index, self._outcome_unknown(
                group, "a snapshot from the leader replaced the log"))
        proposals = group.proposals
        conf_changes: list[Proposal] = []
        for entry in ready.committed_entries:
            if entry.index <= group.applied_index:
                continue
            proposal = proposals.take(entry) if proposals else None
            # The core switches configuration itself in advance(); a conf
            # change entry has nothing for the state machine.
            if entry.type is EntryType.CONF_CHANGE:
                if proposal is not None:
                    conf_changes.append(proposal)
            else:
                _apply_normal(group, entry, proposal)
            group.applied_index = entry.index
        for read in ready.read_states:
            future = group.reads.pop(read.context, None)
            if future is not None:
                group.waiting_reads.append((read.index, future))
        self._release_reads(group)
        return conf_changes

    def _release_reads(self, group: _Group) -> None:
        still: list[tuple[int, asyncio.Future[int]]] = []
        for index, future in group.waiting_reads:
            if index <= group.applied_index:
                if not future.done():
                    future.set_result(index)
            else:
                still.append((index, future))
        group.waiting_reads = still

    def _role_changed(self, group: _Group, role: Role, leader_id: int) -> None:
        was_leader = group.role is Role.LEADER
        if leader_id != group.leader_id:
            # One line per leader change on every member: after a kill, the
            # survivors' logs say who took over, in which term (issue 18).
            _log.info("raft_leader_changed", node=self.node_id, group=group.group_id,
                      old_leader=group.leader_id or None, new_leader=leader_id or None,
                      term=group.node.term, role=role.name.lower())
        elif role is not group.role:
            _log.info("raft_role_changed", node=self.node_id, group=group.group_id,
                      old_role=group.role.name.lower(), new_role=role.name.lower(),
                      term=group.node.term, leader=leader_id or None)
        group.role, group.leader_id = role, leader_id
        if was_leader and role is not Role.LEADER:
            hint = self.address_of(leader_id) if leader_id else None
            _fail_all(group, NotLeaderError(
                f"node {self.node_id} lost leadership of group {group.group_id}; the "
                "outcome of in-flight proposals is unknown, retry with the same request id",
                leader_hint=hint,
            ))
            # Snapshots for followers are the leader's business: stop sending.
            for (group_id, _), task in self._snapshot_sends.items():
                if group_id == group.group_id:
                    task.cancel()
        if self.on_role_change is not None:
            self.on_role_change(group.group_id, role, leader_id)

    async def _maybe_snapshot(self, group: _Group) -> None:
        """Snapshot the state machine on the loop (a consistent cut), write it on
        the I/O thread, then compact on the loop (the core reads the storage).

        A file machine checkpoints into a directory that is synced and renamed
        into place before the snapshot record naming it is written; the record
        holds the manifest, index, term, conf state and epoch."""
        if group.applied_index - group.snapshot_index < self.config.snapshot_entries:
            return
        loop = asyncio.get_running_loop()
        index, conf_state, epoch = group.applied_index, group.node.conf_state, group.node.epoch
        machine = group.machine
        if isinstance(machine, FileSnapshotMachine):
            checkpoints = Checkpoints(group.storage.directory)
            temp, data = checkpoints.take(machine, index,
                                          log_tail=self._snapshot_tail(group, index))
            await loop.run_in_executor(self._io, checkpoints.seal, temp, index)
        else:
            data = machine.snapshot()
        snapshot = group.storage.create_snapshot(index, conf_state, data, epoch)
        await loop.run_in_executor(self._io, group.storage.persist_snapshot, snapshot)
        if isinstance(machine, FileSnapshotMachine):
            await loop.run_in_executor(
                self._io, functools.partial(checkpoints.purge, keep_index=index))
        group.snapshot_index = index
        floor = None if self.compaction_floor is None else self.compaction_floor(group.group_id)
        compact_to = compaction_target(index - self.config.compaction_margin_entries, floor)
        if compact_to >= group.storage.first_index():
            group.storage.compact(compact_to)
            await loop.run_in_executor(self._io, group.storage.release_wal, compact_to)


def split_messages(
    messages: list[tuple[int, bytes]], count_max: int, bytes_max: int
) -> list[list[tuple[int, bytes]]]:
    """Cut encoded messages, in order, into requests of at most ``count_max``
    messages and ``bytes_max`` bytes (a single larger message goes alone)."""
    requests: list[list[tuple[int, bytes]]] = []
    start = size = 0
    for position, (_, data) in enumerate(messages):
        if position > start and (position - start >= count_max or size + len(data) > bytes_max):
            requests.append(messages[start:position])
            start, size = position, 0
        size += len(data)
    if start < len(messages):
        requests.append(messages[start:])
    return requests


async def _with_deadline(future: asyncio.Future[T], timeout_s: float, message: str) -> T:
    """Await ``future``; DeadlineExceededError after ``timeout_s``.

    One timer handle instead of asyncio.wait_for's extra task and futures: this
    runs once per proposal and per linearizable read.
    """
    handle = asyncio.get_running_loop().call_later(timeout_s, _expire, future, message)
    try:
        return await future
    finally:
        handle.cancel()


def _expire(future: asyncio.Future[Any], message: str) -> None:
    if not future.done():
        future.set_exception(DeadlineExceededError(message))


def _apply_normal(group: _Group, entry: Entry, proposal: Proposal | None) -> None:
    """Apply a committed normal entry and answer its proposal, if it is local."""
    if entry.data:
        result = group.machine.apply(entry.index, entry.data)
        if proposal is not None:
            if proposal.members is not None:
                # Now, not a loop turn later from the combined future's callback.
                _answer_members(proposal.members, result)
            _resolve(proposal.future, result)
    else:
        invariant(proposal is None, "a proposal matched a leader's empty entry")
    group.applied_index = entry.index


def _resolve(future: asyncio.Future[Any], result: Any) -> None:
    if not future.done():
        future.set_result(result)


def _fail(future: asyncio.Future[Any], error: QuorumlogError) -> None:
    if not future.done():
        future.set_exception(error)


def _fail_all(group: _Group, error: QuorumlogError) -> None:
    group.proposals.fail_all(error)
    for proposal in group.queued:
        _fail(proposal.future, error)
    group.queued.clear()
    for future in group.reads.values():
        if not future.done():
            future.set_exception(error)
    group.reads.clear()
    for _, future in group.waiting_reads:
        if not future.done():
            future.set_exception(error)
    group.waiting_reads.clear()

