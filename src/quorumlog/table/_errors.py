"""Errors of tables. All derive from the quorumlog error tree."""

from __future__ import annotations

from quorumlog.errors import QuorumlogError, TransientError, UsageError


class TableError(QuorumlogError):
    """Base of the errors specific to tables."""


class KeyTooLargeError(TableError, UsageError):
    """A hash_key or sort_key is over its limit (docs/table.md, "Limits")."""


class ValueTooLargeError(TableError, UsageError):
    """A value is over ``VALUE_BYTES_MAX``; split it over several sort keys."""


class BadTableRequestError(TableError, UsageError):
    """A table request is malformed: a wrong type, an operand that is not an
    integer where an integer compare needs one, an empty hash_key."""


class NotAnIntegerError(BadTableRequestError):
    """A value or operand that must be a decimal 64-bit integer is not (``increment``,
    integer compares of ``check_and_set``)."""


class DiskInsufficientError(TableError):
    """The partition leader's data disk is past ``[table]
    disk_usage_threshold_fraction``: writes other than deletes are refused
    until space frees (Pegasus's ERR_DISK_INSUFFICIENT; reads go on)."""


class WriteOutcomeUnknownError(TableError):
    """A retried write whose first attempt may or may not have applied, and whose
    result the partition no longer keeps (the client had more than
    ``CLIENT_RESULTS_WINDOW_WRITES`` later writes to that partition meanwhile):
    read the data to learn the outcome."""


class NonIdempotentWriteRefusedError(TableError, UsageError):
    """An increment or check-and-mutate on a duplicated table: under
    last-writer-wins, concurrent ones on two clusters do not add up, so the
    table refuses them unless allowed (``quorumlog dup allow-non-idempotent``)."""


class ScanContextExpiredError(TableError):
    """A snapshot scan's context is gone (idle too long, its node restarted, or its
    replica moved away): read the partition again from the start."""


class ScanContextsFullError(TableError, TransientError):
    """A node has as many snapshot scans open as it allows; retry later."""
