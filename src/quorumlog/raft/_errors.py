"""Errors of the Raft core, all in the quorumlog error tree."""

from __future__ import annotations

from quorumlog.errors import StorageError, TransientError, UsageError


class ProposalDroppedError(TransientError):
    """A proposal (or read, or transfer) was not accepted; retry elsewhere/later.

    Raised when this node is not the leader, when a leader transfer is in
    progress, or when the uncommitted-bytes budget is used up. ``leader_hint``
    is the leader this node knows of (0 = unknown): send the request there.
    """

    def __init__(self, message: str, *, leader_hint: int = 0) -> None:
        super().__init__(message)
        self.leader_hint = leader_hint


class ConfChangePendingError(UsageError):
    """A membership change is already in flight; wait until it is applied."""


class CompactedError(StorageError):
    """The requested log index lies at or before the last compaction point."""

    retriable = False


class UnavailableError(StorageError):
    """The requested log index lies after the last stored entry."""


class SnapshotOutOfDateError(UsageError):
    """A snapshot at or before the current snapshot's index was supplied."""


class SnapshotTemporarilyUnavailableError(TransientError):
    """Storage cannot produce a snapshot right now; the leader retries later."""
