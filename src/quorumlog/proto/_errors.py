"""The errors that cross the wire between bookies and ledger clients.

A bookie raises them for a request; the rpc layer sends their code; the
ledger client decodes them back into the same classes (one table,
``WIRE_ERROR_CODES``, registered with ``quorumlog.rpc`` on import). All derive
from :class:`QuorumlogError`; the retriable ones also derive from
:class:`TransientError`, so ``retriable`` is ``True``.
"""

from __future__ import annotations

from quorumlog import rpc
from quorumlog.errors import CorruptionError, QuorumlogError, TransientError, UsageError


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
    (see ``quorumlog.bookie``'s limbo records): never counts as "no such
    entry" in recovery.
    """


class BadEnvelopeError(UsageError):
    """An entry envelope that is not well formed (sizes, ids or digest type)."""


class DigestMismatchError(CorruptionError):
    """An entry's digest does not match its content."""


# The bookie's error codes (1200-1299). A code never changes meaning: old
# clients decode new bookies' answers with this table.
WIRE_ERROR_CODES: tuple[tuple[int, type[QuorumlogError]], ...] = (
    (1200, BookieError),
    (1201, NoSuchLedgerError),
    (1202, NoSuchEntryError),
    (1203, UnauthorizedError),
    (1204, LedgerFencedError),
    (1205, EntryTooLargeError),
    (1206, WriteCacheFullError),
    (1207, ReadOnlyError),
    (1208, BadEnvelopeError),
    (1209, DigestMismatchError),
    (1210, EntryInLimboError),
)

for _code, _cls in WIRE_ERROR_CODES:
    rpc.register_error(_code, _cls)
