"""The storage a Raft core reads, and the in-memory reference implementation.

The core only reads storage; the caller writes it after persisting what a
``Ready`` lists (``append``, ``set_hard_state``, ``apply_snapshot``), as with
etcd's MemoryStorage. Ranges are half-open, reads have byte caps.

Bootstrapping (after TiKV): ``MemoryStorage(ConfState(voters={1, 2, 3}))``
starts every founding member from a snapshot at index :data:`BOOTSTRAP_INDEX`,
term :data:`BOOTSTRAP_TERM`, holding that configuration and no data. The log
proper starts after it, so a member added later (empty storage) always needs
index 1 from the leader, finds it compacted, and receives the snapshot: that is
how it learns the founding configuration, which is in no log entry.
"""

from __future__ import annotations

from typing import Protocol

from quorumlog.errors import UsageError, invariant
from quorumlog.raft._errors import CompactedError, SnapshotOutOfDateError, UnavailableError
from quorumlog.raft._size import limit_size
from quorumlog.raft._types import ConfState, Entry, HardState, Snapshot, SnapshotMeta

BOOTSTRAP_INDEX = 1
BOOTSTRAP_TERM = 1

EMPTY_CONF_STATE = ConfState(voters=frozenset())


class RaftStorage(Protocol):
    """What a core reads from stable storage. Read-only from the core's side."""

    def initial_state(self) -> tuple[HardState, ConfState]:
        """The persisted hard state and the configuration of the latest snapshot."""
        ...

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        """Entries [lo, hi), cut at ``max_bytes`` but never empty if lo < hi.

        Raises CompactedError if ``lo`` is compacted, UnavailableError if
        ``hi`` is past ``last_index() + 1``.
        """
        ...

    def term(self, index: int) -> int:
        """Term of the entry at ``index`` (``first_index() - 1`` included)."""
        ...

    def first_index(self) -> int:
        """Index of the first entry that may be read (after the snapshot)."""
        ...

    def last_index(self) -> int:
        """Index of the last stored entry (the snapshot's index if none)."""
        ...

    def snapshot(self) -> Snapshot:
        """The latest snapshot (index 0 if none); may raise
        SnapshotTemporarilyUnavailableError."""
        ...


def bootstrap_snapshot(conf_state: ConfState) -> Snapshot:
    """The snapshot founding members start from (see the module docstring)."""
    meta = SnapshotMeta(index=BOOTSTRAP_INDEX, term=BOOTSTRAP_TERM, conf_state=conf_state, epoch=0)
    return Snapshot(meta=meta, data=b"")


class MemoryStorage:
    """In-memory RaftStorage for tests, the simulator and benchmarks."""

    __slots__ = ("_entries", "_hard_state", "_offset", "_offset_term", "_snapshot")

    def __init__(self, conf_state: ConfState | None = None) -> None:
        if conf_state is None or conf_state.is_empty:
            snap = Snapshot(
                meta=SnapshotMeta(index=0, term=0, conf_state=EMPTY_CONF_STATE, epoch=0)
            )
            hard_state = HardState()
        else:
            snap = bootstrap_snapshot(conf_state)
            hard_state = HardState(term=BOOTSTRAP_TERM, vote=0, commit=BOOTSTRAP_INDEX)
        self._snapshot = snap
        self._hard_state = hard_state
        # Entries after the compaction point: _entries[i] has index _offset + 1 + i.
        self._offset = snap.meta.index
        self._offset_term = snap.meta.term
        self._entries: list[Entry] = []

    # -- RaftStorage ------------------------------------------------------------

    def initial_state(self) -> tuple[HardState, ConfState]:
        return self._hard_state, self._snapshot.meta.conf_state

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        if lo <= self._offset:
            raise CompactedError(f"entries [{lo}, {hi}): compacted up to {self._offset}")
        if hi > self.last_index() + 1:
            raise UnavailableError(f"entries [{lo}, {hi}): last index is {self.last_index()}")
        invariant(lo <= hi, f"entries: lo {lo} > hi {hi}")
        base = self._offset + 1
        return limit_size(self._entries[lo - base : hi - base], max_bytes)

    def term(self, index: int) -> int:
        if index == self._offset:
            return self._offset_term
        if index < self._offset:
            raise CompactedError(f"term of {index}: compacted up to {self._offset}")
        if index > self._offset + len(self._entries):
            raise UnavailableError(f"term of {index}: last index is {self.last_index()}")
        return self._entries[index - self._offset - 1].term

    def first_index(self) -> int:
        return self._offset + 1

    def last_index(self) -> int:
        return self._offset + len(self._entries)

    def snapshot(self) -> Snapshot:
        return self._snapshot

    # -- writes by the caller ---------------------------------------------------

    def hard_state(self) -> HardState:
        return self._hard_state

    def set_hard_state(self, hard_state: HardState) -> None:
        self._hard_state = hard_state

    def install(self, hard_state: HardState | None, entries: list[Entry],
                snapshot: Snapshot | None) -> None:
        """Take in what a persisted Ready changed: a newer snapshot, entries, hard state."""
        if snapshot is not None and snapshot.meta.index > self._snapshot.meta.index:
            self.apply_snapshot(snapshot)
        if entries:
            self.append(entries)
        if hard_state is not None:
            self.set_hard_state(hard_state)

    def append(self, entries: list[Entry]) -> None:
        """Append, replacing any stored suffix that ``entries`` overlaps."""
        if not entries:
            return
        first = entries[0].index
        if entries[-1].index <= self._offset:
            return
        if first <= self._offset:
            entries = entries[self._offset + 1 - first :]
            first = self._offset + 1
        position = first - self._offset - 1
        if position > len(self._entries):
            raise UsageError(
                f"append at index {first} leaves a gap after last index {self.last_index()}"
            )
        if position < len(self._entries):
            del self._entries[position:]
        self._entries.extend(entries)

    def apply_snapshot(self, snapshot: Snapshot) -> None:
        """Replace the whole log by ``snapshot`` (a follower installing one)."""
        if snapshot.meta.index <= self._snapshot.meta.index:
            raise SnapshotOutOfDateError(
                f"snapshot at {snapshot.meta.index} is not newer than the stored one "
                f"at {self._snapshot.meta.index}"
            )
        self._snapshot = snapshot
        self._offset = snapshot.meta.index
        self._offset_term = snapshot.meta.term
        self._entries = []

    def create_snapshot(
        self, index: int, conf_state: ConfState, data: bytes, epoch: int
    ) -> Snapshot:
        """Record application state as of applied ``index`` (entries are kept).

        ``conf_state`` and ``epoch`` must be those at ``index``: take
        ``node.conf_state`` and ``node.epoch`` when ``node.applied_index == index``.
        """
        if index <= self._snapshot.meta.index:
            raise SnapshotOutOfDateError(
                f"snapshot at {index} is not newer than the stored one "
                f"at {self._snapshot.meta.index}"
            )
        if index > self.last_index():
            raise UsageError(f"snapshot at {index} is past the last index {self.last_index()}")
        meta = SnapshotMeta(index=index, term=self.term(index), conf_state=conf_state, epoch=epoch)
        self._snapshot = Snapshot(meta=meta, data=data)
        return self._snapshot

    def compact(self, index: int) -> None:
        """Drop entries up to and including ``index`` (at most the snapshot's index)."""
        if index <= self._offset:
            raise CompactedError(f"compact to {index}: already compacted up to {self._offset}")
        if index > self._snapshot.meta.index:
            raise UsageError(
                f"compact to {index} is past the snapshot at {self._snapshot.meta.index}; "
                "create a snapshot first so lagging followers can still catch up"
            )
        term = self.term(index)
        del self._entries[: index - self._offset]
        self._offset = index
        self._offset_term = term
