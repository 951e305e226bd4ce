"""Errors of the ledger client.

Bookie-side answers keep the wire contract's classes (``quorumlog.proto``):
``LedgerFencedError`` (a recovering client fenced the ledger),
``UnauthorizedError`` (wrong password / master key), ``NoSuchLedgerError``
(unknown ledger id), ``NoSuchEntryError``. The client adds the conditions that
only it can see.
"""

from __future__ import annotations

from quorumlog.errors import QuorumlogError, TransientError, UsageError


class LedgerClosedError(UsageError):
    """The handle is closed (or closing): no more appends."""


class ReadPastLacError(UsageError):
    """A read asked for entries past the last add confirmed: they may never exist."""


class LedgerWriteError(QuorumlogError):
    """The write handle failed for good (too many ensemble changes, no usable
    bookies, a bookie refusing the entry); close it and write to a new ledger."""


class LedgerRecoveryError(TransientError):
    """Recovery could not decide (bookies unreachable, timeouts): nothing was
    closed; opening with recovery again may succeed once bookies answer."""


class EntryUnavailableError(TransientError):
    """No replica of an entry answered with a valid copy (timeouts, errors)."""


class MetadataConflictError(TransientError):
    """The ledger metadata kept changing under a compare-and-swap; retry."""
