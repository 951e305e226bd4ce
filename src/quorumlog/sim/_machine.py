"""The simulated process's state machine: the real ``MetaStateMachine``, plus
the log digest the invariants compare.

:class:`LogDigest` is a hash chained over every applied log entry (index,
term, payload), so two replicas at the same applied index have the same
digest iff they applied the same entries. A snapshot's data in the simulator
is a :class:`SimSnapshot`: the state machine's own snapshot and that digest,
which lets the invariants check that an installed snapshot is the state the
log would have produced.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import msgspec

from quorumlog.errors import ProtocolError, invariant
from quorumlog.meta import MetaStateMachine
from quorumlog.raft import Entry, Snapshot


class SimStateMachine(Protocol):
    """What a simulated process runs as its state machine: the real
    ``MetaStateMachine`` (every runner), or a table partition replica (the table
    runner's dup mix, ``_table_dup``)."""

    def apply(self, index: int, data: bytes) -> object: ...

    def snapshot(self) -> bytes: ...

    def restore(self, data: bytes) -> None: ...


MachineFactory = Callable[[], SimStateMachine]

DIGEST_BYTES = 16


@dataclass(slots=True)
class LogDigest:
    """The applied index and a hash chained over every applied entry."""

    applied_index: int = 0
    digest: bytes = bytes(DIGEST_BYTES)

    def note(self, entry: Entry) -> None:
        if entry.index != self.applied_index + 1:  # formatted only on failure
            invariant(False, f"entry {entry.index} applied after {self.applied_index}: "
                      "entries must be applied in order without gaps")
        self.applied_index = entry.index
        hasher = hashlib.blake2b(self.digest, digest_size=DIGEST_BYTES)
        hasher.update(entry.index.to_bytes(8, "big"))
        hasher.update(entry.term.to_bytes(8, "big"))
        hasher.update(entry.data)
        self.digest = hasher.digest()


class SimSnapshot(msgspec.Struct, frozen=True, array_like=True):
    """A Raft snapshot's data in the simulator: the state machine's snapshot and
    the log digest at the snapshot index."""

    digest: bytes
    state: bytes
    # The entries after the compaction floor the snapshot covers (its log
    # tail: ``raft.snapshot_tail``; empty without a floor below its index).
    tail: list[Entry] = []


SNAPSHOT_ENCODER = msgspec.msgpack.Encoder()
_snapshot_decoder = msgspec.msgpack.Decoder(SimSnapshot)


def restore_state(snapshot: Snapshot, factory: MachineFactory = MetaStateMachine,
                  ) -> tuple[SimStateMachine, LogDigest]:
    """The state machine and digest a Raft snapshot holds (empty data: bootstrap)."""
    machine = factory()
    if not snapshot.data:
        return machine, LogDigest(snapshot.meta.index)
    try:
        sim_snapshot = _snapshot_decoder.decode(snapshot.data)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"snapshot is not a simulator snapshot: {exc}") from None
    machine.restore(sim_snapshot.state)
    return machine, LogDigest(snapshot.meta.index, sim_snapshot.digest)


def snapshot_tail_of(snapshot: Snapshot) -> list[Entry]:
    """The log tail kept with a snapshot ([] for bootstrap or none)."""
    if not snapshot.data:
        return []
    return _snapshot_decoder.decode(snapshot.data).tail
