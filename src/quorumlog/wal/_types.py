"""Values and errors of the WAL API (frozen msgspec Structs)."""

from __future__ import annotations

import msgspec

from quorumlog.errors import CorruptionError, StorageError


class WalEntry(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One log entry: its index and opaque data (Raft encodes term/type inside)."""

    index: int
    data: bytes


class SnapshotMarker(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The (term, index) of a snapshot, as recorded in the WAL."""

    term: int
    index: int

    def __str__(self) -> str:
        return f"(term={self.term}, index={self.index})"


class WalContents(msgspec.Struct, frozen=True, kw_only=True):
    """What :meth:`Wal.read_all` returns.

    ``entries`` are contiguous and all have ``index`` greater than the
    snapshot the WAL was opened at; ``state`` is the last state record.
    """

    metadata: bytes
    state: bytes | None
    entries: list[WalEntry]


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot file's contents: its marker and the caller's opaque data."""

    marker: SnapshotMarker
    data: bytes


class SnapshotMismatchError(CorruptionError):
    """The WAL holds a snapshot marker with the requested index but another term."""


class SnapshotNotFoundError(StorageError):
    """The requested snapshot marker is not in the WAL (or no file matches)."""
