"""Duplication in the table simulator (``quorumlog sim table --mix dup``).

The table runner's groups run, in this mix, real table partition replicas:
:class:`SimTableReplica` is the production ``PartitionMachine`` over a real
``TableStore`` (RocksDB, in a directory of the run), snapshots are its
RocksDB checkpoints (``snapshot_files`` / ``restore_files``), and proposals
are stamped by the leader's ``TimetagClock`` as ``TableService`` does. A
snapshot keeps its log tail (``raft.snapshot_tail``) and no replica compacts
past its compaction floor (``raft.compaction_target`` with the floor
``table.compaction_floor_of`` computes from what the node knows).

:class:`DupWorld` is the rest of the duplication: the remote cluster (one
production ``PartitionMachine`` per partition, cluster id 2, applying the
shipped ``DuplicateCommand`` s last-writer-wins), ``confirmed_decree`` per
partition as meta holds it, and the shipper's step: the leader reads the
log after ``confirmed_decree`` with ``retained_entries`` (``raft.retained_from``)
and builds the block with the production ``table.block_of``; the simulator
only carries it to the remote (which may be down: slow mode waits, skip mode
counts and drops) and moves ``confirmed_decree``. Nodes learn the confirmed
decrees with their heartbeat answers (delayed, lost, cut by partitions) and
forget them when they crash. Tombstone collection is the production
``table.collection_entry``, proposed by each leader every
``tombstone_gc_interval_ms``.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from quorumlog.errors import StorageError, invariant
from quorumlog.raft import BOOTSTRAP_INDEX, Entry
from quorumlog.table import (
    DeleteCommand,
    DuplicateCommand,
    DupProgress,
    DupRecord,
    DupState,
    FailMode,
    PartitionMachine,
    SetCommand,
    TableEntry,
    TableStore,
    TimetagClock,
    block_of,
    combine_entries,
    compaction_floor_of,
    decode_entry,
    encode_entry,
    observe_duplicates,
)

SOURCE_CLUSTER_ID = 1
REMOTE_CLUSTER_ID = 2
DUP_ID = 1
TABLE_NAME = "sim"
US_PER_MS = 1000
SHM_DIRECTORY = Path("/dev/shm")  # RocksDB files of a run in memory where there is one

_ENCODER = msgspec.msgpack.Encoder()
_CHECKPOINT_DECODER = msgspec.msgpack.Decoder(tuple[str, bytes])

Record = tuple[bytes, int]  # (value, timetag) of a live record


class RunFiles:
    """The directory of one run's RocksDB stores and checkpoints, with
    deterministic names (a counter), removed when the run ends."""

    def __init__(self) -> None:
        parent = SHM_DIRECTORY if SHM_DIRECTORY.is_dir() else None
        self.root = Path(tempfile.mkdtemp(prefix="quorumlog-simdup-", dir=parent))
        self._counter = 0

    def new_name(self, kind: str) -> str:
        self._counter += 1
        return f"{kind}-{self._counter}"

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


class SimTableReplica:
    """A partition replica's state machine (``sim._machine.SimStateMachine``):
    the production ``PartitionMachine`` on a fresh RocksDB store."""

    def __init__(self, files: RunFiles, cluster_id: int) -> None:
        self._files = files
        store = TableStore(files.root / files.new_name("store"), cluster_id=cluster_id)
        self.machine = PartitionMachine(store, TimetagClock(), files.root / "staging")

    @property
    def store(self) -> TableStore:
        return self.machine.store

    def apply(self, index: int, data: bytes) -> tuple[object, object]:
        return self.machine.apply(index, data), None

    def snapshot(self) -> bytes:
        name = self._files.new_name("checkpoint")
        metadata = self.machine.snapshot_files(self._files.root / name)
        return _ENCODER.encode((name, metadata))

    def restore(self, data: bytes) -> None:
        if not data:
            return
        try:
            name, metadata = _CHECKPOINT_DECODER.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise StorageError(f"simulated snapshot is not a table checkpoint: {exc}") from None
        self.machine.restore_files(self._files.root / name, metadata)


def stamp_proposal(replica: object, payloads: list[bytes], now_us: int) -> bytes:
    """``TableService._on_write`` on the leader for each write of one ready
    pass, then ``RaftHost``'s combining: each entry gets the leader clock's
    timestamp (after the shipped timetags it carries), and several share one
    log entry (``combine_entries``)."""
    if not isinstance(replica, SimTableReplica):
        invariant(len(payloads) == 1, "only table replicas combine writes")
        return payloads[0]
    clock = replica.machine.clock
    stamped = []
    for payload in payloads:
        entry = decode_entry(payload)
        observe_duplicates(clock, entry.commands)
        stamped.append(encode_entry(TableEntry(
            timestamp_us=clock.next(now_us), commands=entry.commands, client_id=entry.client_id,
            seq=entry.seq, first_outstanding_seq=entry.first_outstanding_seq, gc=entry.gc)))
    return stamped[0] if len(stamped) == 1 else combine_entries(stamped)


def write_payload(client_id: int, seq: int, hash_key: bytes, sort_key: bytes,
                  value: bytes | None, *, first_outstanding_seq: int | None = None) -> bytes:
    """A writer's exactly-once write (set, or delete with ``value`` None),
    stamped by the leader that proposes it; ``first_outstanding_seq`` is
    ``seq`` unless given."""
    command = (DeleteCommand(hash_key, sort_key) if value is None
               else SetCommand(hash_key, sort_key, value))
    return encode_entry(TableEntry(
        timestamp_us=0, commands=(command,), client_id=client_id, seq=seq,
        first_outstanding_seq=seq if first_outstanding_seq is None else first_outstanding_seq))


def live_records(store: TableStore, *,
                 page_records: int = 1000) -> dict[tuple[bytes, bytes], Record]:
    """Every live record of a store (tombstones left out; nothing expires here)."""
    out: dict[tuple[bytes, bytes], Record] = {}
    after: bytes | None = None
    while True:
        page, after = store.stored_page(after, page_records, 1 << 30)
        for hash_key, sort_key, record in page:
            if not record.deleted:
                out[(hash_key, sort_key)] = (record.value, record.timetag)
        if after is None:
            return out


@dataclass(slots=True)
class DupStats:
    shipped_blocks: int = 0
    shipped_mutations: int = 0
    skipped_mutations: int = 0
    remote_outages: int = 0
    gc_proposed: int = 0
    combined_proposals: int = 0  # log entries holding a writer's and another client's write
    floor_refreshes: int = 0


@dataclass(slots=True)
class DupWorld:
    """The remote cluster, meta's ``confirmed_decree`` and every node's view of it."""

    files: RunFiles
    groups: int
    fail_mode: FailMode
    remote: dict[int, SimTableReplica] = field(default_factory=dict)
    remote_decree: dict[int, int] = field(default_factory=dict)
    confirmed: dict[int, int] = field(default_factory=dict)  # meta: group -> confirmed_decree
    # What each node read (heartbeat answers); absent: not read since it started.
    known: dict[int, dict[int, int]] = field(default_factory=dict)
    skipped_keys: dict[int, set[tuple[bytes, bytes]]] = field(default_factory=dict)
    remote_down: bool = False
    stats: DupStats = field(default_factory=DupStats)

    def __post_init__(self) -> None:
        for gid in range(1, self.groups + 1):
            self.remote[gid] = SimTableReplica(self.files, REMOTE_CLUSTER_ID)
            self.remote_decree[gid] = 0
            # `dup add` before the first write (production: the leader's applied
            # index when it records the start, here the bootstrap): every write ships.
            self.confirmed[gid] = BOOTSTRAP_INDEX
            self.skipped_keys[gid] = set()

    @property
    def record(self) -> DupRecord:
        return DupRecord(dup_id=DUP_ID, remote="remote", state=DupState.LOG,
                         fail_mode=self.fail_mode)

    def floor(self, node_id: int, gid: int) -> int | None:
        """``DupManager.compaction_floor`` on ``node_id`` for the replica of ``gid``."""
        known = self.known.get(node_id)
        progress = {} if known is None else {
            (TABLE_NAME, DUP_ID, g): DupProgress(confirmed_decree=c) for g, c in known.items()}
        return compaction_floor_of([self.record], progress, TABLE_NAME, gid,
                                   dups_known=known is not None,
                                   progress_known=known is not None)

    def learn(self, node_id: int, confirmed: tuple[tuple[int, int], ...]) -> None:
        """A node read the progress from meta (it only ever moves forward there)."""
        self.known[node_id] = dict(confirmed)
        self.stats.floor_refreshes += 1

    def forget(self, node_id: int) -> None:
        """A crash: the node knows nothing until it reads meta again."""
        self.known.pop(node_id, None)

    def progress(self) -> tuple[tuple[int, int], ...]:
        return tuple(sorted(self.confirmed.items()))

    def ship(self, gid: int, entries: list[Entry], store: TableStore, now_ms: int) -> bool:
        """One block (``Shipper._step``): to the remote, then confirmed. False
        if the remote is down in slow mode (the block waits)."""
        block = block_of(entries, store)
        if self.remote_down:
            if self.fail_mode is FailMode.SLOW:
                return False
            for command in block.commands.values():
                for record in command.records:
                    self.skipped_keys[gid].add((command.hash_key, record[0]))
            self.stats.skipped_mutations += block.mutations
        else:
            for command in block.commands.values():
                self._apply_remote(gid, command, now_ms)
            self.stats.shipped_mutations += block.mutations
        self.stats.shipped_blocks += 1
        self.confirmed[gid] = max(self.confirmed[gid], block.last_decree)
        return True

    def _apply_remote(self, gid: int, command: DuplicateCommand, now_ms: int) -> None:
        """The remote partition's leader proposes the duplicate write; it applies."""
        replica = self.remote[gid]
        self.remote_decree[gid] += 1
        entry = TableEntry(timestamp_us=replica.machine.clock.next(now_ms * US_PER_MS),
                           commands=(command,))
        replica.apply(self.remote_decree[gid], encode_entry(entry))

    def differences(self, gid: int, source: TableStore) -> list[str]:
        """Keys whose live value or timetag differs between the source and the
        remote, except keys skip mode skipped (and counted)."""
        ours, theirs = live_records(source), live_records(self.remote[gid].store)
        out = []
        for key in sorted(set(ours) | set(theirs)):
            if ours.get(key) != theirs.get(key) and key not in self.skipped_keys[gid]:
                out.append(f"{key[0]!r}/{key[1]!r}: source {_show(ours.get(key))}, "
                           f"remote {_show(theirs.get(key))}")
        return out


def _show(record: Record | None) -> str:
    return "nothing" if record is None else f"{record[0]!r}@{record[1]:#x}"
