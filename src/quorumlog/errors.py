"""The one error tree of quorumlog.

Every error a user can see derives from :class:`QuorumlogError`, says what
happened and what to do, and carries ``retriable``: whether the same request
may succeed if simply tried again (a leader change, a closed connection), or
will fail the same way until something changes (bad input, corruption).

Two families are kept apart, as in h11: :class:`UsageError` ("you misused
it": a caller bug or bad argument) and :class:`ProtocolError` ("the peer sent
garbage"). :class:`InvariantViolation` is a programmer error inside quorumlog
and is never caught to continue.
"""

from __future__ import annotations

from typing import NoReturn


class QuorumlogError(Exception):
    """Base of every quorumlog error."""

    retriable: bool = False

    def __init__(self, message: str, *, retriable: bool | None = None) -> None:
        super().__init__(message)
        if retriable is not None:
            self.retriable = retriable

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class UsageError(QuorumlogError):
    """The caller misused an API or passed a bad argument."""


class ConfigError(UsageError):
    """A configuration file or environment override is invalid."""


class ProtocolError(QuorumlogError):
    """A peer sent something malformed or out of protocol."""


class StorageError(QuorumlogError):
    """Something on disk is wrong: corruption, mismatch, missing files."""


class CorruptionError(StorageError):
    """Data on disk failed a check (CRC, length, framing)."""


class LockedError(StorageError):
    """Another process holds an exclusive lock on a directory."""


class TransientError(QuorumlogError):
    """A condition that may clear by itself: retry with backoff."""

    retriable = True


class NotLeaderError(TransientError):
    """The contacted member is not the leader; ``leader_hint`` may say who is."""

    def __init__(self, message: str, *, leader_hint: str | None = None) -> None:
        super().__init__(message)
        self.leader_hint = leader_hint


class DeadlineExceededError(TransientError):
    """An operation did not complete before its deadline."""


class InvariantViolation(QuorumlogError):  # noqa: N818 - the name says what it is
    """An internal invariant failed: a bug in quorumlog, never bad input."""


def invariant(condition: object, message: str) -> None:
    """Check an invariant; unlike ``assert`` it is not stripped by ``python -O``.

    Use it for programmer errors only. Operating errors (disk full, peer gone,
    bad input) are raised as the matching :class:`QuorumlogError` subclass.
    """
    if not condition:
        _fail(message)


def _fail(message: str) -> NoReturn:
    raise InvariantViolation(f"invariant violated: {message}")
