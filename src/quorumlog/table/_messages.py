"""The table rpc contract: requests a ``TableClient`` sends to partition leaders.

Type ids and error codes 3000..3999 (docs/rpc.md). Every request names the
table id and the partition; a node that does not host that partition's
replica answers ``PartitionNotHostedError`` (retriable: the client's layout is
stale), a follower answers ``NotLeaderError`` with the leader's address.
Reads are linearizable: the leader confirms its leadership (ReadIndex) and
waits until it has applied up to the read index before reading. A read with
``stale_ok`` is answered by any replica from its own store, without asking
the leader: it may miss writes the replica has not applied yet.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec

from quorumlog import rpc
from quorumlog.errors import TransientError
from quorumlog.table._commands import WriteCommand, WriteResult
from quorumlog.table._errors import (
    BadTableRequestError,
    DiskInsufficientError,
    KeyTooLargeError,
    NotAnIntegerError,
    ScanContextExpiredError,
    ScanContextsFullError,
    TableError,
    ValueTooLargeError,
)
from quorumlog.table._layout import TableExistsError, UnknownTableError
from quorumlog.table._placement import NotEnoughTableNodesError


class PartitionNotHostedError(TableError, TransientError):
    """This node hosts no replica of the partition (the client's layout is stale,
    or the node has not opened it yet): refresh the layout and retry."""


class TableWriteResponse(rpc.Message, frozen=True):
    type_id: ClassVar[int] = 3001
    results: list[WriteResult]


class TableWriteRequest(rpc.Request[TableWriteResponse], frozen=True):
    """Commands of one partition, applied in order in one Raft entry.

    ``client_id``/``seq``/``first_outstanding_seq``: the write's proposal id
    (``TableEntry``); a retry carries the same one and gets the first answer.
    """

    type_id: ClassVar[int] = 3000
    table_id: int
    partition: int
    commands: list[WriteCommand]
    client_id: int = 0
    seq: int = 0
    first_outstanding_seq: int = 0


WRITE_BATCH_WRITES_MAX = 256
"""Writes one TableWriteBatchRequest holds at most."""
WRITE_BATCH_BYTES_MAX = 1024 * 1024
"""Keys and values a client puts in one batch at most; a write larger than
``WRITE_BATCHED_BYTES_MAX`` goes alone, as a TableWriteRequest."""
WRITE_BATCHED_BYTES_MAX = 64 * 1024


class TableWriteItem(msgspec.Struct, frozen=True):
    """One write of a :class:`TableWriteBatchRequest`: what a TableWriteRequest
    carries besides the table and partition."""

    commands: list[WriteCommand]
    client_id: int = 0
    seq: int = 0
    first_outstanding_seq: int = 0


class TableWriteBatchResponse(rpc.Message, frozen=True):
    """Per write, in order: its results, or (``errors``) why it failed; a write
    that failed has no results (an empty list) and is retried by the client
    with its proposal id, like a TableWriteRequest that failed."""

    type_id: ClassVar[int] = 3013
    results: list[list[WriteResult]]
    errors: list[rpc.ErrorResponse | None]


class TableWriteBatchRequest(rpc.Request[TableWriteBatchResponse], frozen=True):
    """Independent writes of one partition group, each with its own proposal id,
    sent together by a client that had several at once (``TableClient`` batches
    the writes its tasks start in one event-loop turn). The leader proposes
    each as a TableWriteRequest's write; they may share log entries. The
    whole batch fails only when this node is not the leader (or hosts no
    replica); any other failure is per write."""

    type_id: ClassVar[int] = 3012
    table_id: int
    partition: int
    writes: list[TableWriteItem]


class TableGetResponse(rpc.Message, frozen=True):
    type_id: ClassVar[int] = 3003
    value: bytes | None


class TableGetRequest(rpc.Request[TableGetResponse], frozen=True):
    type_id: ClassVar[int] = 3002
    table_id: int
    partition: int
    hash_key: bytes
    sort_key: bytes
    stale_ok: bool = False  # any replica answers from its own store (no ReadIndex)


class TableMultiGetResponse(rpc.Message, frozen=True):
    type_id: ClassVar[int] = 3005
    values: dict[bytes, bytes]


class TableMultiGetRequest(rpc.Request[TableMultiGetResponse], frozen=True):
    type_id: ClassVar[int] = 3004
    table_id: int
    partition: int
    hash_key: bytes
    sort_keys: list[bytes]
    stale_ok: bool = False  # any replica answers from its own store (no ReadIndex)


class TableScanResponse(rpc.Message, frozen=True):
    type_id: ClassVar[int] = 3007
    items: list[tuple[bytes, bytes, bytes]]  # (hash_key, sort_key, value)
    next_after: bytes | None
    # With ``details``: (expire_ts_s, timetag) of each item, in the same order.
    details: list[tuple[int, int]] = []
    # A snapshot scan's context for the next page (0: none, or this was the last page).
    context_id: int = 0


class TableScanRequest(rpc.Request[TableScanResponse], frozen=True):
    """A sort-key range of one hash_key, or (``full``) the whole partition."""

    type_id: ClassVar[int] = 3006
    table_id: int
    partition: int
    hash_key: bytes = b""
    full: bool = False
    start: bytes = b""
    stop: bytes | None = None
    start_inclusive: bool = True
    stop_inclusive: bool = False
    limit: int = 100
    reverse: bool = False
    after: bytes | None = None
    details: bool = False  # also answer each record's expire_ts_s and timetag
    stale_ok: bool = False  # any replica answers from its own store (no ReadIndex)
    # Snapshot scans (table/_scan_contexts.py): open a context on this first page,
    # or read the next page of an open one (sent to the node that holds it).
    open_context: bool = False
    context_id: int = 0
    # A full scan of one partition of a group that holds several (a copyset):
    # only the records whose hash_key is in partition ``of_partition`` of a table
    # of ``of_partitions`` partitions (0: every record of the group).
    of_partitions: int = 0
    of_partition: int = 0


class TableCountResponse(rpc.Message, frozen=True):
    type_id: ClassVar[int] = 3009
    count: int


class TableCountRequest(rpc.Request[TableCountResponse], frozen=True):
    type_id: ClassVar[int] = 3008
    table_id: int
    partition: int
    hash_key: bytes
    stale_ok: bool = False  # any replica answers from its own store (no ReadIndex)


class TableTtlResponse(rpc.Message, frozen=True):
    type_id: ClassVar[int] = 3011
    exists: bool
    ttl_s: int  # -1: no TTL


class TableTtlRequest(rpc.Request[TableTtlResponse], frozen=True):
    type_id: ClassVar[int] = 3010
    table_id: int
    partition: int
    hash_key: bytes
    sort_key: bytes
    stale_ok: bool = False  # any replica answers from its own store (no ReadIndex)


TableReadRequest = (TableGetRequest | TableMultiGetRequest | TableScanRequest
                    | TableCountRequest | TableTtlRequest)

for _code, _cls in (
    (3000, TableError),
    (3001, KeyTooLargeError),
    (3002, ValueTooLargeError),
    (3003, BadTableRequestError),
    (3004, NotAnIntegerError),
    (3005, UnknownTableError),
    (3006, PartitionNotHostedError),
    (3007, TableExistsError),
    (3008, NotEnoughTableNodesError),
    (3009, ScanContextExpiredError),
    (3010, ScanContextsFullError),
    (3011, DiskInsufficientError),
):
    rpc.register_error(_code, _cls)
