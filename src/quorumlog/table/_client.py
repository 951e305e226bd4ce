"""Table clients: :class:`TableClient` (asyncio) and :class:`BlockingTableClient`.

A client reads a table's layout from meta (cached; refreshed when a node says
it hosts no replica), routes a request to the partition of its hash_key
(``crc32c(hash_key) % P``), and sends it to the partition's leader: the last
leader it saw, else the members in turn, following ``NotLeaderError`` hints,
until the operation's deadline. Keys and values are checked before anything
is sent.

A write whose outcome is unknown (the leader lost leadership or the
connection dropped after sending) is retried with the same proposal id
``(client_id, seq, first_outstanding_seq)``: the partition answers a write it
already applied with its first result (table/_sessions.py), so a retried
``incr`` or ``check_and_mutate`` applies once. ``exactly_once=False`` sends
no proposal id (a retry may apply twice, as in Pegasus).
"""

from __future__ import annotations

import asyncio
import functools
import random
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec

from quorumlog import rpc
from quorumlog.errors import (
    DeadlineExceededError,
    NotLeaderError,
    ProtocolError,
    TransientError,
    UsageError,
    invariant,
)
from quorumlog.meta import MetaClient
from quorumlog.table._codec import check_key, check_value
from quorumlog.table._commands import (
    NON_IDEMPOTENT_REFUSED,
    CheckAndMutateCommand,
    CheckResult,
    CheckType,
    DeleteCommand,
    DuplicateCommand,
    IncrCommand,
    IncrResult,
    MultiDeleteCommand,
    MultiSetCommand,
    Mutation,
    Refused,
    SetCommand,
    WriteCommand,
    WriteResult,
)
from quorumlog.table._dup_layout import (
    DupProgress,
    DupRecord,
    DupState,
    FailMode,
    TableFlags,
    add_dup,
    get_dup,
    list_dups,
    read_progress,
    set_flags,
    update_dup,
)
from quorumlog.table._errors import (
    BadTableRequestError,
    NonIdempotentWriteRefusedError,
    NotAnIntegerError,
    WriteOutcomeUnknownError,
)
from quorumlog.table._heartbeat import fetch_schedule
from quorumlog.table._layout import (
    TableLayout,
    create_table,
    draining_nodes,
    drop_table,
    group_id_of,
    list_tables,
    partition_of,
    set_draining,
    table_info,
    table_nodes,
)
from quorumlog.table._messages import (
    WRITE_BATCH_BYTES_MAX,
    WRITE_BATCH_WRITES_MAX,
    WRITE_BATCHED_BYTES_MAX,
    PartitionNotHostedError,
    TableCountRequest,
    TableGetRequest,
    TableMultiGetRequest,
    TableScanRequest,
    TableScanResponse,
    TableTtlRequest,
    TableWriteBatchRequest,
    TableWriteBatchResponse,
    TableWriteItem,
    TableWriteRequest,
    TableWriteResponse,
)
from quorumlog.table._sessions import SESSION_EXPIRED, STALE_SEQUENCE
from quorumlog.table._store import SCAN_LIMIT_MAX, ScanItem

T = TypeVar("T")

OPERATION_DEADLINE_S = 20.0  # all attempts of one operation (covers a re-election)
REQUEST_TIMEOUT_S = 5.0  # one attempt
RETRY_BACKOFF_S = 0.05  # after a round of members without a leader
SCAN_PAGE_RECORDS = 1000
# Looking up which replica leads each partition (to read stale from followers)
# waits this long for the meta leader's scheduler view, then reads without a choice.
FOLLOWER_LOOKUP_DEADLINE_S = 5.0
DUP_START_DEADLINE_S = 30.0  # dup add waits this long for every partition to start shipping
DUP_START_POLL_S = 0.1
SESSION_RESTARTS_MAX = 1  # a write refused as session_expired is sent again in a new session


class _WriterSession:
    """The client's proposal ids for one partition: a random client id and a
    sequence counted from 1, with the seqs still waiting for an answer."""

    def __init__(self) -> None:
        self.client_id = secrets.randbits(63) or 1
        self._next_seq = 1
        self._outstanding: set[int] = set()

    def begin(self) -> int:
        seq = self._next_seq
        self._next_seq += 1
        self._outstanding.add(seq)
        return seq

    def end(self, seq: int) -> None:
        self._outstanding.discard(seq)

    def first_outstanding(self) -> int:
        return min(self._outstanding, default=self._next_seq)


@dataclass(slots=True)
class _OpenBatch:
    pool: rpc.Pool
    items: list[TableWriteItem] = field(default_factory=list)
    futures: list[asyncio.Future[TableWriteResponse]] = field(default_factory=list)
    bytes: int = 0


class _WriteBatcher:
    """The writes a client's tasks start in one event-loop turn, per (leader
    address, table, group), go in one TableWriteBatchRequest (a lone one as a
    TableWriteRequest). Each write gets its own answer or error, so the routing
    and retries of a write stay its own (``TableClient._route``)."""

    def __init__(self, timeout_s: float) -> None:
        self._timeout_s = timeout_s
        self._open: dict[tuple[str, int, int], _OpenBatch] = {}
        self._sending: set[asyncio.Future[Any]] = set()
        self.batches_sent = 0  # requests, batched or alone (tests and benchmarks read it)
        self.writes_sent = 0

    def write(self, pool: rpc.Pool, address: str, group: tuple[int, int],
              item: TableWriteItem, size: int) -> asyncio.Future[TableWriteResponse]:
        """Queue ``item`` for the leader at ``address`` of ``group`` (table id,
        group index); the future of its answer."""
        loop = asyncio.get_running_loop()
        key = (address, *group)
        batch = self._open.get(key)
        if batch is None:
            batch = self._open[key] = _OpenBatch(pool)
            loop.call_soon(self._send, key, batch)
        future: asyncio.Future[TableWriteResponse] = loop.create_future()
        batch.items.append(item)
        batch.futures.append(future)
        batch.bytes += size
        if len(batch.items) >= WRITE_BATCH_WRITES_MAX or batch.bytes >= WRITE_BATCH_BYTES_MAX:
            self._send(key, batch)
        return future

    def _send(self, key: tuple[str, int, int], batch: _OpenBatch) -> None:
        if self._open.get(key) is not batch:
            return  # sent when it filled up
        del self._open[key]
        self.batches_sent += 1
        self.writes_sent += len(batch.items)
        address, table_id, partition = key
        sending: asyncio.Future[Any]
        if len(batch.items) == 1:
            item = batch.items[0]
            sending = asyncio.ensure_future(batch.pool.call(address, TableWriteRequest(
                table_id=table_id, partition=partition, commands=item.commands,
                client_id=item.client_id, seq=item.seq,
                first_outstanding_seq=item.first_outstanding_seq), timeout_s=self._timeout_s))
        else:
            sending = asyncio.ensure_future(batch.pool.call(address, TableWriteBatchRequest(
                table_id=table_id, partition=partition, writes=batch.items),
                timeout_s=self._timeout_s))
        self._sending.add(sending)
        sending.add_done_callback(functools.partial(self._answered, batch))

    def _answered(self, batch: _OpenBatch, sending: asyncio.Future[Any]) -> None:
        self._sending.discard(sending)
        waiting = batch.futures
        if sending.cancelled():
            for future in waiting:
                future.cancel()
            return
        error = sending.exception()
        response = None if error is not None else sending.result()
        if isinstance(response, TableWriteBatchResponse) and not (
                len(response.results) == len(response.errors) == len(waiting)):
            error = ProtocolError(f"a write batch of {len(waiting)} got "
                                  f"{len(response.results)} results and "
                                  f"{len(response.errors)} errors back")
        for index, future in enumerate(waiting):
            if future.done():
                continue  # its caller gave up
            if error is not None:
                future.set_exception(error)
            elif isinstance(response, TableWriteBatchResponse):
                wire = response.errors[index]
                if wire is not None:
                    future.set_exception(rpc.error_from_wire(wire))
                else:
                    future.set_result(TableWriteResponse(results=response.results[index]))
            elif isinstance(response, TableWriteResponse):
                future.set_result(response)
            else:
                future.set_exception(ProtocolError(
                    f"a write got {type(response).__name__} back"))


def _batched_size(commands: Sequence[WriteCommand]) -> int | None:
    """The key and value bytes of a write the batcher takes (sets and deletes up
    to ``WRITE_BATCHED_BYTES_MAX``), None for one that goes alone."""
    size = 0
    for command in commands:
        if isinstance(command, SetCommand):
            size += len(command.hash_key) + len(command.sort_key) + len(command.value)
        elif isinstance(command, DeleteCommand):
            size += len(command.hash_key) + len(command.sort_key)
        else:
            return None
    return size if size <= WRITE_BATCHED_BYTES_MAX else None


class TableClient:
    """asyncio client; ``async with TableClient(meta_addresses) as tables:``.

    Writes that the client's tasks start in the same event-loop turn for the
    same group go to its leader in one request (``_WriteBatcher``), each with
    its own proposal id and answer."""

    def __init__(self, meta_addresses: Sequence[str], *,
                 deadline_s: float = OPERATION_DEADLINE_S,
                 request_timeout_s: float = REQUEST_TIMEOUT_S,
                 exactly_once: bool = True) -> None:
        # Layout lookups are part of an operation: the same deadline bounds them
        # (before, a duplication shipper's remote client, 2-10 s, could hang in
        # meta's own 20 s of retries while the remote was cut off, its error
        # unrecorded).
        self.meta = MetaClient(meta_addresses, deadline_s=deadline_s,
                               request_timeout_s=request_timeout_s)
        self._meta_addresses = list(meta_addresses)
        self._exactly_once = exactly_once
        self._sessions: dict[tuple[int, int], _WriterSession] = {}
        self._pool = rpc.Pool()
        self._deadline_s = deadline_s
        self._request_timeout_s = request_timeout_s
        self._batcher = _WriteBatcher(request_timeout_s)
        self._layouts: dict[str, TableLayout] = {}
        self._addresses: dict[int, str] = {}
        self._leaders: dict[tuple[int, int], str] = {}

    async def __aenter__(self) -> TableClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._pool.close()
        await self.meta.close()

    # ----- administration ---------------------------------------------------------

    async def create_table(self, name: str, *, partitions: int = 8, replicas: int = 3,
                           copysets: int | None = None) -> TableLayout:
        """``copysets``: the Raft groups the partitions live in (None: one per
        partition; docs/table.md, "Partitions and copysets")."""
        return await create_table(self.meta, name, partitions=partitions, replicas=replicas,
                                  copysets=copysets)

    async def drop_table(self, name: str) -> None:
        await drop_table(self.meta, name)
        self._layouts.pop(name, None)

    async def list_tables(self) -> list[TableLayout]:
        return await list_tables(self.meta)

    async def table_info(self, name: str) -> TableLayout:
        return await table_info(self.meta, name)

    async def drain_node(self, node_id: int) -> None:
        """Move every replica off table node ``node_id`` and place nothing new there
        (Curve's chunkserver retirement): the scheduler moves one replica at a time
        (learner, catch-up, promote + remove; leadership handed over first).
        ``table schedule`` shows what is left; ``undrain_node`` stops it."""
        await set_draining(self.meta, node_id, True)

    async def undrain_node(self, node_id: int) -> None:
        await set_draining(self.meta, node_id, False)

    async def draining_nodes(self) -> frozenset[int]:
        return await draining_nodes(self.meta)

    # ----- duplication (docs/duplication.md) -------------------------------------------

    async def add_dup(self, table: str, remote: str, *, checkpoint: bool = False,
                      start_deadline_s: float = DUP_START_DEADLINE_S) -> DupRecord:
        """Add a duplication and wait until every partition's leader recorded
        where its shipping starts: writes acknowledged after this returns ship.
        ``checkpoint``: the records the table holds are copied first (state
        prepare until every partition is done; ``dup_progress`` shows it)."""
        record = await add_dup(self.meta, table, remote, checkpoint=checkpoint)
        groups = (await table_info(self.meta, table)).record.groups  # progress is per group
        deadline = time.monotonic() + start_deadline_s
        while len(await read_progress(self.meta, table, record.dup_id)) < groups:
            if time.monotonic() > deadline:
                raise DeadlineExceededError(
                    f"duplication {record.dup_id} of {table!r} was added, but not every "
                    f"partition's leader started it within {start_deadline_s:.0f} s; "
                    f"`quorumlog dup status {table} {record.dup_id}` shows which did")
            await asyncio.sleep(DUP_START_POLL_S)
        return record

    async def list_dups(self, table: str) -> list[DupRecord]:
        await table_info(self.meta, table)
        return await list_dups(self.meta, table)

    async def update_dup(self, table: str, dup_id: int, *, state: DupState | None = None,
                         fail_mode: FailMode | None = None) -> DupRecord:
        return await update_dup(self.meta, table, dup_id, state=state, fail_mode=fail_mode)

    async def dup_progress(self, table: str, dup_id: int) -> dict[int, DupProgress]:
        """Per partition: confirmed_decree and the shipper's counters."""
        await get_dup(self.meta, table, dup_id)
        return await read_progress(self.meta, table, dup_id)

    async def set_table_flags(self, table: str, flags: TableFlags) -> None:
        await set_flags(self.meta, table, flags)

    # ----- writes -------------------------------------------------------------------

    async def set(self, table: str, hash_key: bytes, sort_key: bytes, value: bytes, *,
                  ttl_s: int = 0) -> None:
        check_key(hash_key, sort_key)
        check_value(value)
        await self._write_one(table, hash_key, SetCommand(hash_key, sort_key, value, ttl_s))

    async def multi_set(self, table: str, hash_key: bytes, items: dict[bytes, bytes], *,
                        ttl_s: int = 0) -> None:
        for sort_key, value in items.items():
            check_key(hash_key, sort_key)
            check_value(value)
        await self._write_one(table, hash_key,
                              MultiSetCommand(hash_key, tuple(items.items()), ttl_s))

    async def delete(self, table: str, hash_key: bytes, sort_key: bytes) -> None:
        check_key(hash_key, sort_key)
        await self._write_one(table, hash_key, DeleteCommand(hash_key, sort_key))

    async def multi_delete(self, table: str, hash_key: bytes, sort_keys: Sequence[bytes]) -> None:
        for sort_key in sort_keys:
            check_key(hash_key, sort_key)
        await self._write_one(table, hash_key, MultiDeleteCommand(hash_key, tuple(sort_keys)))

    async def incr(self, table: str, hash_key: bytes, sort_key: bytes, increment: int = 1, *,
                   ttl_s: int = 0) -> int:
        check_key(hash_key, sort_key)
        result = await self._write_one(table, hash_key,
                                       IncrCommand(hash_key, sort_key, increment, ttl_s))
        assert isinstance(result, IncrResult)
        return result.value

    async def check_and_mutate(self, table: str, hash_key: bytes, *, check_sort_key: bytes,
                               check_type: CheckType, operand: bytes,
                               mutations: Sequence[Mutation],
                               return_check_value: bool = False) -> CheckResult:
        check_key(hash_key, check_sort_key)
        for mutation in mutations:
            check_key(hash_key, mutation.sort_key)
            if mutation.value is not None:
                check_value(mutation.value)
        result = await self._write_one(table, hash_key, CheckAndMutateCommand(
            hash_key, check_sort_key, check_type, operand, tuple(mutations),
            return_check_value))
        assert isinstance(result, CheckResult)
        return result

    async def check_and_set(self, table: str, hash_key: bytes, *, check_sort_key: bytes,
                            check_type: CheckType, operand: bytes, set_sort_key: bytes,
                            value: bytes, ttl_s: int = 0,
                            return_check_value: bool = False) -> CheckResult:
        return await self.check_and_mutate(
            table, hash_key, check_sort_key=check_sort_key, check_type=check_type,
            operand=operand, mutations=[Mutation(set_sort_key, value, ttl_s)],
            return_check_value=return_check_value)

    async def duplicate(self, table: str, command: DuplicateCommand) -> None:
        """Apply records shipped from another cluster, last writer wins by
        timetag (duplication; docs/duplication.md)."""
        await self._write_one(table, command.hash_key, command)

    async def _write_one(self, table: str, hash_key: bytes, command: WriteCommand) -> WriteResult:
        for _ in range(SESSION_RESTARTS_MAX + 1):
            result = await self._write_once(table, hash_key, command)
            if not (isinstance(result, Refused) and result.code == SESSION_EXPIRED):
                break
        return self._result(command, result)

    async def _write_once(self, table: str, hash_key: bytes,
                          command: WriteCommand) -> WriteResult:
        """One write, retried with one proposal id until a leader answers."""
        proposals: dict[tuple[int, int], tuple[_WriterSession, int]] = {}
        size = _batched_size((command,))

        async def send(address: str, layout: TableLayout, partition: int) -> TableWriteResponse:
            key = (layout.record.table_id, partition)
            if self._exactly_once and key not in proposals:
                session = self._sessions.get(key)
                if session is None:  # not setdefault: a session draws its id from the OS
                    session = self._sessions[key] = _WriterSession()
                proposals[key] = (session, session.begin())
            client_id = seq = first = 0
            if key in proposals:
                session, seq = proposals[key]
                client_id, first = session.client_id, session.first_outstanding()
            if size is not None:
                return await self._batcher.write(self._pool, address, key, TableWriteItem(
                    commands=[command], client_id=client_id, seq=seq,
                    first_outstanding_seq=first), size)
            return await self._pool.call(address, TableWriteRequest(
                table_id=key[0], partition=partition, commands=[command],
                client_id=client_id, seq=seq, first_outstanding_seq=first),
                timeout_s=self._request_timeout_s)

        try:
            response = await self._route(table, hash_key, send)
        finally:
            for session, seq in proposals.values():
                session.end(seq)
        result = response.results[0]
        if isinstance(result, Refused) and result.code == SESSION_EXPIRED:
            for key, (session, _) in proposals.items():
                if self._sessions.get(key) is session:
                    del self._sessions[key]  # the next write starts a new session
        return result

    @staticmethod
    def _result(command: WriteCommand, result: WriteResult) -> WriteResult:
        if isinstance(result, Refused) and result.code == STALE_SEQUENCE:
            raise WriteOutcomeUnknownError(result.message)
        if isinstance(result, Refused) and result.code == NON_IDEMPOTENT_REFUSED:
            raise NonIdempotentWriteRefusedError(result.message)
        if isinstance(result, Refused):
            if isinstance(command, IncrCommand) or "integer" in result.message:
                raise NotAnIntegerError(result.message)
            raise BadTableRequestError(result.message)
        return result

    # ----- reads ----------------------------------------------------------------------

    async def get(self, table: str, hash_key: bytes, sort_key: bytes, *,
                  stale_ok: bool = False) -> bytes | None:
        """The value, or None. Linearizable; ``stale_ok``: any replica answers
        from its own store, possibly missing recent writes (a follower read)."""
        check_key(hash_key, sort_key)

        async def send(address: str, layout: TableLayout, partition: int) -> bytes | None:
            response = await self._pool.call(address, TableGetRequest(
                table_id=layout.record.table_id, partition=partition, hash_key=hash_key,
                sort_key=sort_key, stale_ok=stale_ok), timeout_s=self._request_timeout_s)
            return response.value

        return await self._route(table, hash_key, send, stale_ok=stale_ok)

    async def multi_get(self, table: str, hash_key: bytes,
                        sort_keys: Sequence[bytes], *,
                        stale_ok: bool = False) -> dict[bytes, bytes]:
        for sort_key in sort_keys:
            check_key(hash_key, sort_key)

        async def send(address: str, layout: TableLayout, partition: int) -> dict[bytes, bytes]:
            response = await self._pool.call(address, TableMultiGetRequest(
                table_id=layout.record.table_id, partition=partition, hash_key=hash_key,
                sort_keys=list(sort_keys), stale_ok=stale_ok), timeout_s=self._request_timeout_s)
            return response.values

        return await self._route(table, hash_key, send, stale_ok=stale_ok)

    async def ttl(self, table: str, hash_key: bytes, sort_key: bytes, *,
                  stale_ok: bool = False) -> int | None:
        """Seconds left; -1 for no TTL; None when the key is absent."""
        check_key(hash_key, sort_key)

        async def send(address: str, layout: TableLayout, partition: int) -> int | None:
            response = await self._pool.call(address, TableTtlRequest(
                table_id=layout.record.table_id, partition=partition, hash_key=hash_key,
                sort_key=sort_key, stale_ok=stale_ok), timeout_s=self._request_timeout_s)
            return response.ttl_s if response.exists else None

        return await self._route(table, hash_key, send, stale_ok=stale_ok)

    async def sort_key_count(self, table: str, hash_key: bytes, *,
                             stale_ok: bool = False) -> int:
        check_key(hash_key)

        async def send(address: str, layout: TableLayout, partition: int) -> int:
            response = await self._pool.call(address, TableCountRequest(
                table_id=layout.record.table_id, partition=partition, hash_key=hash_key,
                stale_ok=stale_ok), timeout_s=self._request_timeout_s)
            return response.count

        return await self._route(table, hash_key, send, stale_ok=stale_ok)

    async def scan(self, table: str, hash_key: bytes, *, start: bytes = b"",
                   stop: bytes | None = None, start_inclusive: bool = True,
                   stop_inclusive: bool = False, reverse: bool = False,
                   page_records: int = SCAN_PAGE_RECORDS,
                   stale_ok: bool = False) -> AsyncIterator[tuple[bytes, bytes]]:
        """(sort_key, value) of ``hash_key`` in the range, fetched a page at a time."""
        check_key(hash_key, start)
        if stop is not None:
            check_key(hash_key, stop)
        _check_page(page_records)
        after: bytes | None = None
        pin = _Pin()  # a stale scan pages through one replica while it answers
        while True:
            items, after = await self._scan_page(table, hash_key, None, TableScanRequest(
                table_id=0, partition=0, hash_key=hash_key, start=start, stop=stop,
                start_inclusive=start_inclusive, stop_inclusive=stop_inclusive,
                limit=page_records, reverse=reverse, after=after, stale_ok=stale_ok), pin=pin)
            for _, sort_key, value in items:
                yield sort_key, value
            if after is None:
                return

    async def full_scan(self, table: str, *, page_records: int = SCAN_PAGE_RECORDS,
                        stale_ok: bool = False, snapshot: bool = False
                        ) -> AsyncIterator[tuple[bytes, bytes, bytes]]:
        """(hash_key, sort_key, value) of the whole table, partition by partition.
        ``stale_ok``: each partition is read from one replica's own store (followers
        before the leader the client knows of), as it is; no ReadIndex round.
        ``snapshot``: each partition's pages from one point in time (a scan
        context, as :meth:`scan_records`); partitions are not at the same point."""
        _check_page(page_records)
        layout = await self._layout(table)
        for partition in range(layout.record.partitions):
            if snapshot:
                async for record in self.scan_records(table, partition,
                                                      page_records=page_records,
                                                      stale_ok=stale_ok, snapshot=True):
                    yield record.hash_key, record.sort_key, record.value
                continue
            after: bytes | None = None
            pin = _Pin()
            while True:
                items, after = await self._scan_page(table, b"", partition, TableScanRequest(
                    table_id=0, partition=partition, full=True, limit=page_records,
                    after=after, stale_ok=stale_ok), pin=pin)
                for item in items:
                    yield item
                if after is None:
                    break

    async def scan_records(self, table: str, partition: int, *, hash_key: bytes | None = None,
                           start: bytes = b"", stop: bytes | None = None,
                           start_inclusive: bool = True, stop_inclusive: bool = False,
                           page_records: int = SCAN_PAGE_RECORDS, stale_ok: bool = False,
                           prefer_node: int = 0, snapshot: bool = False
                           ) -> AsyncIterator[ScanItem]:
        """Live records of one partition with their expire_ts_s and timetag: the
        whole partition, or (``hash_key``) a sort-key range of one hash_key, which
        must belong to ``partition``. For bulk readers such as Spark.

        ``stale_ok``: read one replica's own store (``prefer_node`` first if it
        hosts the partition, e.g. a follower from :meth:`stale_read_nodes`), every
        page from the same replica while it answers.

        ``snapshot``: every page from one point in time (a scan context on the
        replica that answers the first page, table/_scan_contexts.py); if that
        replica stops answering or the context expires, the scan raises
        (``ScanContextExpiredError`` or the transport's error) rather than go on
        from another point in time: read the partition again."""
        _check_page(page_records)
        if hash_key is not None:
            check_key(hash_key, start)
            if stop is not None:
                check_key(hash_key, stop)
        after: bytes | None = None
        if prefer_node:
            await self._layout(table)  # learns the nodes' addresses
        pin = _Pin(self._addresses.get(prefer_node) if prefer_node else None)
        context_id = 0
        while True:
            template = TableScanRequest(
                table_id=0, partition=partition, hash_key=hash_key or b"",
                full=hash_key is None, start=start, stop=stop, start_inclusive=start_inclusive,
                stop_inclusive=stop_inclusive, limit=page_records, after=after, details=True,
                stale_ok=stale_ok, open_context=snapshot and not context_id,
                context_id=context_id)
            if context_id:
                response = await self._context_page(table, pin.address or "", template)
            else:
                response = await self._scan_response(table, partition, template, pin)
            context_id = response.context_id
            for (h, s, v), (expire_ts_s, timetag) in zip(response.items, response.details,
                                                         strict=True):
                yield ScanItem(h, s, v, expire_ts_s, timetag)
            after = response.next_after
            if after is None:
                return

    async def stale_read_nodes(self, table: str) -> tuple[int, ...]:
        """Per partition, a replica to read stale from that does not lead it (by the
        meta leader's scheduler view; followers taken in turn to spread the reads),
        or 0 where none is known (no view within ``FOLLOWER_LOOKUP_DEADLINE_S``, a
        one-replica group)."""
        layout = await self._layout(table)
        try:
            view = await fetch_schedule(self._meta_addresses, self._pool,
                                        deadline_s=FOLLOWER_LOOKUP_DEADLINE_S)
        except DeadlineExceededError:
            return (0,) * layout.record.partitions
        leaders = {g.group_id: g.leader for g in view.groups}
        out = []
        for p in range(layout.record.partitions):
            copyset = layout.record.copyset_of(p)
            leader = leaders.get(group_id_of(layout.record.table_id, copyset), 0)
            followers = [m for m in layout.partitions[copyset].members if m != leader]
            out.append(followers[p % len(followers)] if leader and followers else 0)
        return tuple(out)

    async def _context_page(self, table: str, address: str,
                            template: TableScanRequest) -> TableScanResponse:
        """The next page of a snapshot scan, from the node that holds its context."""
        invariant(bool(address), "a snapshot scan's context has a node")
        layout = await self._layout(table)
        request = _scan_request(template, layout, layout.record.copyset_of(template.partition))
        response: TableScanResponse = await self._pool.call(
            address, request, timeout_s=self._request_timeout_s)
        return response

    async def _scan_response(self, table: str, partition: int, template: TableScanRequest,
                             pin: _Pin) -> TableScanResponse:
        async def send(address: str, layout: TableLayout, target: int) -> TableScanResponse:
            request = _scan_request(template, layout, target)
            response: TableScanResponse = await self._pool.call(
                address, request, timeout_s=self._request_timeout_s)
            pin.address = address
            return response

        return await self._route(table, b"", send, partition=partition,
                                 stale_ok=template.stale_ok, prefer=pin.address)

    async def _scan_page(self, table: str, hash_key: bytes, partition: int | None,
                         template: TableScanRequest, *, pin: _Pin | None = None
                         ) -> tuple[list[tuple[bytes, bytes, bytes]], bytes | None]:
        async def send(address: str, layout: TableLayout, target: int
                       ) -> tuple[list[tuple[bytes, bytes, bytes]], bytes | None]:
            request = _scan_request(template, layout, target)
            response = await self._pool.call(address, request,
                                             timeout_s=self._request_timeout_s)
            if pin is not None:
                pin.address = address
            return response.items, response.next_after

        return await self._route(table, hash_key, send, partition=partition,
                                 stale_ok=template.stale_ok,
                                 prefer=pin.address if pin is not None else None)

    # ----- routing ----------------------------------------------------------------------

    async def _layout(self, table: str, *, refresh: bool = False) -> TableLayout:
        layout = self._layouts.get(table)
        if layout is None or refresh:
            layout = await table_info(self.meta, table)  # UnknownTableError
            self._layouts[table] = layout
            nodes = await table_nodes(self.meta)
            self._addresses.update({n.node_id: n.address for n in nodes.values()})
        return layout

    async def _route(self, table: str, hash_key: bytes,
                     send: Callable[[str, TableLayout, int], Awaitable[T]], *,
                     partition: int | None = None, stale_ok: bool = False,
                     prefer: str | None = None) -> T:
        """Send to the partition's leader, or with ``stale_ok`` to its replicas: the
        ``prefer`` address first if it is one, then the others in a random order with
        the leader the client knows of last (follower reads spread over the copyset,
        off the leader)."""
        cached = None if stale_ok else self._layouts.get(table)
        if cached is not None:  # the common case: the leader is known, one try
            target = cached.record.copyset_of(partition if partition is not None else
                                              partition_of(hash_key, cached.record.partitions))
            key = (cached.record.table_id, target)
            address = self._leaders.get(key)
            if address is not None:
                try:
                    return await send(address, cached, target)
                except NotLeaderError as exc:
                    self._leaders.pop(key, None)
                    if exc.leader_hint:
                        self._leaders[key] = exc.leader_hint
                except PartitionNotHostedError:
                    pass
                except TransientError:
                    self._leaders.pop(key, None)
        deadline = time.monotonic() + self._deadline_s
        layout = await self._layout(table)
        last: Exception | None = None
        while time.monotonic() < deadline:
            target = layout.record.copyset_of(partition if partition is not None else
                                              partition_of(hash_key, layout.record.partitions))
            key = (layout.record.table_id, target)
            members = layout.partitions[target].members
            candidates = [self._leaders[key]] if key in self._leaders and not stale_ok else []
            candidates += [self._addresses[m] for m in members if m in self._addresses]
            if stale_ok:
                candidates = _stale_order(candidates, prefer, self._leaders.get(key))
            for address in dict.fromkeys(candidates):
                try:
                    result = await send(address, layout, target)
                except NotLeaderError as exc:
                    last = exc
                    self._leaders.pop(key, None)
                    if exc.leader_hint:
                        self._leaders[key] = exc.leader_hint
                        break
                    continue
                except PartitionNotHostedError as exc:
                    last = exc
                    continue
                except TransientError as exc:
                    last = exc
                    self._leaders.pop(key, None)
                    continue
                if not stale_ok:
                    self._leaders[key] = address
                return result
            else:
                await asyncio.sleep(RETRY_BACKOFF_S)
                # The refresh asks meta, which may itself be unreachable: it
                # gets what is left of the operation's deadline, no more.
                remaining_s = deadline - time.monotonic()
                if remaining_s <= 0:
                    break
                try:
                    async with asyncio.timeout(remaining_s):
                        layout = await self._layout(table, refresh=True)
                except TimeoutError:
                    break
                except TransientError as exc:
                    last = exc
        raise DeadlineExceededError(
            f"table {table!r}: no leader of the partition answered within "
            f"{self._deadline_s:.0f} s (last error: {last}); check `quorumlog status`")


def _scan_request(template: TableScanRequest, layout: TableLayout,
                  group: int) -> TableScanRequest:
    """``template`` (its ``partition`` the table partition) as sent to ``group``,
    the copyset that holds the partition: a full scan of a copyset that holds
    several partitions names the one it reads."""
    several = layout.record.groups < layout.record.partitions
    return msgspec.structs.replace(
        template, table_id=layout.record.table_id, partition=group,
        of_partitions=layout.record.partitions if template.full and several else 0,
        of_partition=template.partition if template.full and several else 0)


class _Pin:
    """The replica a stale scan reads its pages from (the last one that answered)."""

    __slots__ = ("address",)

    def __init__(self, address: str | None = None) -> None:
        self.address = address


def _stale_order(candidates: list[str], prefer: str | None, leader: str | None) -> list[str]:
    """Replicas to try for a stale read: ``prefer`` first, the known leader last."""
    first = [prefer] if prefer in candidates else []
    last = [leader] if leader in candidates and leader != prefer else []
    rest = [c for c in candidates if c not in first and c not in last]
    return first + random.sample(rest, len(rest)) + last


def _check_page(page_records: int) -> None:
    if not 1 <= page_records <= SCAN_LIMIT_MAX:
        raise UsageError(f"page_records must be in 1..{SCAN_LIMIT_MAX}, got {page_records}")


class BlockingTableClient:
    """The same operations, blocking, on an event loop of their own (``rpc.LoopThread``).

    Scans return lists (every page fetched)."""

    def __init__(self, meta_addresses: Sequence[str], **options: Any) -> None:
        self._thread = rpc.LoopThread("table-client")
        self._client: TableClient = self._thread.call(_make(meta_addresses, options))

    def __enter__(self) -> BlockingTableClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if not self._thread.closed:
            self._thread.call(self._client.close())
            self._thread.close()

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._client, name)
        if name in ("scan", "full_scan", "scan_records"):
            return lambda *a, **k: self._thread.call(_collect(method(*a, **k)))
        if name.startswith("_") or not asyncio.iscoroutinefunction(method):
            raise AttributeError(name)
        return lambda *a, **k: self._thread.call(method(*a, **k))


async def _make(meta_addresses: Sequence[str], options: dict[str, Any]) -> TableClient:
    return TableClient(meta_addresses, **options)


async def _collect(iterator: AsyncIterator[T]) -> list[T]:
    return [item async for item in iterator]
