"""The Raft log as a core sees it: stable storage plus an unstable tail.

After etcd's raftLog/unstable. Entries the core appended (leader) or accepted
(follower) stay in :class:`Unstable` until the caller persisted them and
called ``advance``; a snapshot received from the leader waits there too.
``committed`` and ``applied`` live here; ``applied <= committed`` always, and
nothing at or before ``committed`` is ever replaced.
"""

from __future__ import annotations

from quorumlog.errors import invariant
from quorumlog.raft._errors import CompactedError, UnavailableError
from quorumlog.raft._size import limit_size
from quorumlog.raft._storage import RaftStorage
from quorumlog.raft._types import Entry, Snapshot


class Unstable:
    """Entries (and maybe a snapshot) not yet handed to stable storage.

    ``entries[i]`` has index ``offset + i``; with a snapshot, ``offset`` is
    ``snapshot.meta.index + 1``.
    """

    __slots__ = ("entries", "offset", "snapshot")

    def __init__(self, offset: int) -> None:
        self.offset = offset
        self.entries: list[Entry] = []
        self.snapshot: Snapshot | None = None

    def maybe_first_index(self) -> int | None:
        return self.snapshot.meta.index + 1 if self.snapshot is not None else None

    def maybe_last_index(self) -> int | None:
        if self.entries:
            return self.offset + len(self.entries) - 1
        if self.snapshot is not None:
            return self.snapshot.meta.index
        return None

    def maybe_term(self, index: int) -> int | None:
        if index < self.offset:
            snap = self.snapshot
            if snap is not None and snap.meta.index == index:
                return snap.meta.term
            return None
        position = index - self.offset
        if position >= len(self.entries):
            return None
        return self.entries[position].term

    def stable_to(self, index: int, term: int) -> None:
        """Entries up to ``index`` reached storage; drop them if still ours."""
        found = self.maybe_term(index)
        if found is None or found != term or index < self.offset:
            return  # replaced meanwhile (a newer leader overwrote them) or a snapshot
        del self.entries[: index + 1 - self.offset]
        self.offset = index + 1

    def stable_snapshot_to(self, index: int) -> None:
        if self.snapshot is not None and self.snapshot.meta.index == index:
            self.snapshot = None

    def restore(self, snapshot: Snapshot) -> None:
        self.offset = snapshot.meta.index + 1
        self.entries = []
        self.snapshot = snapshot

    def truncate_and_append(self, entries: list[Entry]) -> None:
        after = entries[0].index
        end = self.offset + len(self.entries)
        if after == end:
            self.entries.extend(entries)
        elif after <= self.offset:
            # Replace everything unstable: the new entries start at or before it.
            self.offset = after
            self.entries = list(entries)
        else:
            del self.entries[after - self.offset :]
            self.entries.extend(entries)

    def slice(self, lo: int, hi: int) -> list[Entry]:
        invariant(
            self.offset <= lo <= hi <= self.offset + len(self.entries),
            f"unstable slice [{lo},{hi}) out of [{self.offset},{self.offset + len(self.entries)})",
        )
        return self.entries[lo - self.offset : hi - self.offset]


class RaftLog:
    """Storage + unstable tail + commit/apply cursors."""

    __slots__ = ("applied", "committed", "storage", "unstable")

    def __init__(self, storage: RaftStorage) -> None:
        self.storage = storage
        first = storage.first_index()
        last = storage.last_index()
        self.unstable = Unstable(last + 1)
        self.committed = first - 1
        self.applied = first - 1

    # -- positions ----------------------------------------------------------------

    def first_index(self) -> int:
        snap = self.unstable.snapshot
        return snap.meta.index + 1 if snap is not None else self.storage.first_index()

    def last_index(self) -> int:
        unstable = self.unstable
        if unstable.entries:
            return unstable.offset + len(unstable.entries) - 1
        if unstable.snapshot is not None:
            return unstable.snapshot.meta.index
        return self.storage.last_index()

    def term(self, index: int) -> int:
        """Term at ``index``; CompactedError / UnavailableError out of range.

        Everything before the unstable tail is in storage (the caller persisted
        it before ``advance``), so storage answers for it and raises if compacted.
        """
        unstable = self.unstable
        offset = unstable.offset
        if index >= offset:
            position = index - offset
            if position < len(unstable.entries):
                return unstable.entries[position].term
            raise UnavailableError(f"term of {index}: last index is {self.last_index()}")
        snap = unstable.snapshot
        if snap is not None:
            if index == snap.meta.index:
                return snap.meta.term
            raise CompactedError(f"term of {index}: compacted before {snap.meta.index + 1}")
        return self.storage.term(index)

    def term_or_zero(self, index: int) -> int:
        try:
            return self.term(index)
        except (CompactedError, UnavailableError):
            return 0

    def last_term(self) -> int:
        return self.term(self.last_index())

    def match_term(self, index: int, term: int) -> bool:
        try:
            return self.term(index) == term
        except (CompactedError, UnavailableError):
            return False

    def is_up_to_date(self, last_index: int, term: int) -> bool:
        """Whether a log ending at (term, last_index) is at least as new as ours."""
        our_term = self.last_term()
        return term > our_term or (term == our_term and last_index >= self.last_index())

    # -- appending ------------------------------------------------------------------

    def append(self, entries: list[Entry]) -> int:
        if not entries:
            return self.last_index()
        after = entries[0].index - 1
        invariant(
            after >= self.committed,
            f"append after {after} would overwrite committed entries up to {self.committed}",
        )
        self.unstable.truncate_and_append(entries)
        return self.last_index()

    def find_conflict(self, entries: tuple[Entry, ...]) -> int:
        """Index of the first entry whose term differs from ours (0 if none).

        Entries past our last index count as conflicting (they are new).
        """
        last = self.last_index()
        if entries[0].index > last:
            return entries[0].index
        for entry in entries:
            if entry.index > last:
                return entry.index
            if not self.match_term(entry.index, entry.term):
                return entry.index
        return 0

    def find_conflict_by_term(self, index: int, term: int) -> tuple[int, int]:
        """Largest (index', term') with index' <= index and term' <= term.

        The fast back-off of rejected appends: every entry in between has a
        term above ``term`` and cannot match the other log.
        """
        while index > 0:
            try:
                our_term = self.term(index)
            except (CompactedError, UnavailableError):
                return index, 0
            if our_term <= term:
                return index, our_term
            index -= 1
        return 0, 0

    def maybe_append(
        self, index: int, log_term: int, committed: int, entries: tuple[Entry, ...]
    ) -> int | None:
        """Follower side of APP: the new last index, or None if (log_term, index)
        does not match our log."""
        if not self.match_term(index, log_term):
            return None
        last_new = index + len(entries)
        if entries:
            conflict = self.find_conflict(entries)
            if conflict:
                invariant(
                    conflict > self.committed,
                    f"entry {conflict} conflicts with committed entries up to {self.committed}",
                )
                self.append(list(entries[conflict - entries[0].index :]))
        self.commit_to(min(committed, last_new))
        return last_new

    # -- commit / apply -------------------------------------------------------------

    def commit_to(self, index: int) -> None:
        if index > self.committed:
            invariant(
                index <= self.last_index(),
                f"commit {index} is past the last index {self.last_index()}",
            )
            self.committed = index

    def maybe_commit(self, index: int, term: int) -> bool:
        """Commit ``index`` if it is newer and was written in ``term``.

        Raft only commits entries of the current term by counting replicas;
        older entries commit with them (Raft paper, section 5.4.2).
        """
        if index > self.committed and self.term_or_zero(index) == term:
            self.commit_to(index)
            return True
        return False

    def applied_to(self, index: int) -> None:
        invariant(
            self.applied <= index <= self.committed,
            f"applied {index} outside [{self.applied}, {self.committed}]",
        )
        self.applied = index

    def has_next_committed_entries(self) -> bool:
        if self.unstable.snapshot is not None:
            return False
        return self.committed > max(self.applied, self.first_index() - 1)

    def next_committed_entries(self, max_bytes: int) -> list[Entry]:
        if not self.has_next_committed_entries():
            return []
        lo = max(self.applied + 1, self.first_index())
        return self.slice(lo, self.committed + 1, max_bytes)

    # -- reading ------------------------------------------------------------------

    def entries_from(self, index: int, max_bytes: int) -> list[Entry]:
        last = self.last_index()
        if index > last:
            return []
        return self.slice(index, last + 1, max_bytes)

    def slice(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        """Entries [lo, hi) capped at ``max_bytes`` (never empty if lo < hi)."""
        if lo >= hi:
            return []
        if lo < self.first_index():
            raise CompactedError(f"entries from {lo}: compacted before {self.first_index()}")
        if hi > self.last_index() + 1:
            raise UnavailableError(f"entries to {hi}: last index is {self.last_index()}")
        offset = self.unstable.offset
        if lo >= offset:
            return limit_size(self.unstable.slice(lo, hi), max_bytes)
        stored = self.storage.entries(lo, min(hi, offset), max_bytes)
        if hi <= offset or len(stored) < min(hi, offset) - lo:
            return stored
        rest = self.unstable.slice(offset, hi)
        return limit_size(stored + rest, max_bytes)

    def snapshot(self) -> Snapshot:
        if self.unstable.snapshot is not None:
            return self.unstable.snapshot
        return self.storage.snapshot()

    def restore(self, snapshot: Snapshot) -> None:
        self.committed = snapshot.meta.index
        self.unstable.restore(snapshot)

    def unstable_entries(self) -> list[Entry]:
        return list(self.unstable.entries)

    def stable_to(self, index: int, term: int) -> None:
        self.unstable.stable_to(index, term)

    def stable_snapshot_to(self, index: int) -> None:
        self.unstable.stable_snapshot_to(index)
