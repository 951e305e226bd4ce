"""Errors of streams. All derive from the quorumlog error tree."""

from __future__ import annotations

from quorumlog.errors import (
    CorruptionError,
    QuorumlogError,
    StorageError,
    TransientError,
    UsageError,
)


class StreamError(QuorumlogError):
    """Base of the errors specific to streams."""


class StreamNotFoundError(StreamError, UsageError):
    """No stream of that name exists (create it with ``quorumlog stream create``)."""


class StreamExistsError(StreamError, UsageError):
    """A stream of that name already exists."""


class BadPositionError(StreamError, UsageError):
    """A position, offset or positions JSON is malformed or names no data of the stream."""


class WriterBusyError(StreamError, TransientError):
    """Another writer holds the partition's lease; retry after it expires, or steal it."""


class ProducerFencedError(StreamError):
    """This producer lost its partition lease to another writer.

    Messages whose send had not completed were not written (the ones that were
    durable before the takeover completed normally). Create a new producer to
    continue; it takes the lease over when the other writer is gone.
    """


class MessageTooLargeError(StreamError, UsageError):
    """A message (or the entry it would be written in) is larger than the ledger's
    ``entry_max_bytes``. Nothing was sent; a retry cannot help: split the message,
    or raise ``entry_max_bytes`` of the ledger client and of every bookie."""


class WriterStuckError(StreamError):
    """The same entries failed in several fresh ledgers in a row, with no entry
    written in between: a new ledger does not fix what is wrong, so the writer
    stops instead of creating ledgers in a loop. Check the bookies and the
    ledger client's limits, then create a new producer."""


class StreamInUseError(StreamError, UsageError):
    """A destructive operation found live producers or consumers on the stream.

    Nothing was deleted. Stop them first, or force it (``force=True``,
    ``--force``): their next send or acknowledgement then fails.
    """


class SubscriptionNotFoundError(StreamError, UsageError):
    """The stream has no subscription of that name (``quorumlog stream subscriptions``)."""


class SubscriptionBusyError(StreamError, TransientError):
    """Another consumer holds the subscription (subscriptions are exclusive)."""


class DataLossError(StreamError, StorageError):
    """Data a reader needs was trimmed (deleted by retention) before it was read."""


class JobEndedError(StreamError):
    """A Spark write job already committed or aborted; a late task attempt's
    ledger is deleted instead of being left behind."""


class MessageFormatError(StreamError, CorruptionError):
    """An entry of a stream ledger is not in the stream entry format."""


class OffloadError(StreamError, StorageError):
    """An offloaded ledger's Parquet file is missing, unreadable or not what its
    record says (a damaged or replaced file), or the offload target refused a write."""
