"""Errors raised by the bookie's ledger storage.

All derive from :class:`BookieError` (a :class:`QuorumlogError`); the retriable
ones also derive from :class:`TransientError`, so ``retriable`` is ``True``.
"""

from __future__ import annotations

from pathlib import Path

from quorumlog.errors import CorruptionError, QuorumlogError, StorageError, TransientError


class BookieError(QuorumlogError):
    """Base of the errors the ledger storage raises for a request."""


class NoSuchLedgerError(BookieError):
    """The ledger is unknown to this bookie, or it was deleted."""


class NoSuchEntryError(BookieError):
    """The ledger exists but this bookie does not hold the entry."""


class UnauthorizedError(BookieError):
    """The master key given does not match the one the ledger was created with."""


class LedgerFencedError(BookieError):
    """The ledger is fenced: only recovery adds are accepted."""


class EntryTooLargeError(BookieError):
    """An entry is larger than ``entry_max_bytes``."""


class WriteCacheFullError(BookieError, TransientError):
    """Both halves of the write cache stayed full for ``add_max_wait_ms``."""


class ReadOnlyError(BookieError, TransientError):
    """The ledger directory is over its disk usage threshold; adds are refused."""


class EntryInLimboError(BookieError, TransientError):
    """The bookie does not hold the entry, but may have lost it with a wiped disk.

    Answered instead of NoSuchEntryError / NoSuchLedgerError by a bookie that
    was re-added after losing its data, for ledgers older than the re-add
    (see ``_limbo.py``): never counts as "no such entry" in recovery.
    """


class EntryLogCorruptionError(CorruptionError):
    """An entry log frame failed its checks; names the file and the offset."""

    def __init__(self, path: Path, offset: int, reason: str) -> None:
        super().__init__(
            f"entry log {path} is corrupt at offset {offset}: {reason}; "
            "the entry must be re-replicated from another bookie"
        )
        self.path = path
        self.offset = offset
        self.reason = reason


class InvalidCookieError(StorageError):
    """The bookie's directories or meta do not hold its identity: it refuses to start.

    Raised at start-up when the cookies (BookKeeper's name for a bookie's
    identity) in its journal, ledger and index directories are missing, from
    another bookie or instance, or disagree with the cookie in meta. The
    message says what happened and how to recover (``quorumlog bookie format``).
    """
