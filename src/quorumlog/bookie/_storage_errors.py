"""Errors that stay inside a bookie: they describe its own disks, not a request.

The errors a bookie answers to ledger clients (``NoSuchEntryError``,
``LedgerFencedError``, ...) are part of the wire contract and live in
``quorumlog.proto``.
"""

from __future__ import annotations

from pathlib import Path

from quorumlog.errors import CorruptionError, StorageError


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
