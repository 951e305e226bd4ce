"""The ``quorumlog`` PySpark data source: batch and streaming read and write."""

from __future__ import annotations

import array
import concurrent.futures
import dataclasses
import datetime
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from quorumlog.errors import UsageError
from quorumlog.ledger import EntryBatch, LedgerClient, ReadHandle
from quorumlog.log import get_logger
from quorumlog.spark import _io
from quorumlog.spark._arrow import (
    SCHEMA_DDL,
    EntryColumns,
    check_write_schema,
    messages_of,
    record_batch,
    record_batch_of_entries,
    record_batch_of_messages,
)
from quorumlog.spark._options import SourceOptions, parse
from quorumlog.spark._plan import (
    Pruning,
    ReadTask,
    advance,
    check_start,
    group_tasks,
    ledger_end,
    offset_json,
    parse_offset,
    plan_partition,
    plan_view,
    position_offset,
    split_limit,
)
from quorumlog.stream import (
    EARLIEST,
    LATEST,
    VIEW_START,
    ColumnSink,
    CompactionRecord,
    JobLedgerWriter,
    LedgerHandles,
    LedgerInfo,
    LedgerList,
    LedgerStats,
    Message,
    OffloadedLedger,
    OffloadRecord,
    PartitionHead,
    Position,
    RoundRobin,
    SeqPosition,
    StartSpec,
    StreamRecord,
    abort_job_ledgers,
    compacted_view,
    decode_entry_columns,
    end_position,
    first_position,
    link_job_ledgers,
    load_compaction,
    load_offloads,
    load_record,
    new_job_id,
    parse_positions,
    partition_for_key,
    past_view,
    resolve_start,
)

log = get_logger(__name__)

READ_CHUNK_BYTES = 8 * 1024 * 1024  # entries fetched per bookie round of a task
# Entries decoded as one chunk (READ_CHUNK_BYTES bounds it too): larger chunks
# spread the ~40 Arrow calls of a decode over more rows (8,192 until issue 17's
# second round; one 100 B message per entry makes a chunk of ~6 MB).
READ_CHUNK_ENTRIES_MAX = 32768
READ_CHUNK_ENTRIES_FIRST = 256  # before the entry size is known
OFFLOADED_CHUNK_ENTRIES = 8192  # entries per read of an offloaded ledger (its row groups' bound)
BATCH_ID_PROPERTY = "streaming.sql.batchId"  # Spark's local property in micro-batch tasks


class QuorumlogDataSource(DataSource):
    """``spark.read.format("quorumlog")`` / ``readStream`` / ``write`` / ``writeStream``.

    Register with ``quorumlog.spark.register(spark)``. Options: see docs/spark.md.
    """

    @classmethod
    def name(cls) -> str:
        return "quorumlog"

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self._parsed: SourceOptions = parse(options)

    def schema(self) -> str:
        return SCHEMA_DDL

    def _record(self) -> StreamRecord:
        return _io.stream_record(self._parsed.meta, self._parsed.stream)

    def reader(self, schema: StructType) -> DataSourceReader:
        return QuorumlogReader(self._parsed, self._record())

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        if self._parsed.read_compacted:
            raise UsageError("option readCompacted applies to batch reads (spark.read): a "
                             "streaming query reads every message")
        return QuorumlogStreamReader(self._parsed, self._record())

    def writer(self, schema: StructType, overwrite: bool) -> QuorumlogWriter:
        _check_write(schema, overwrite)
        return QuorumlogWriter(self._parsed, self._record())

    def streamWriter(self, schema: StructType,  # noqa: N802
                     overwrite: bool) -> QuorumlogStreamWriter:
        _check_write(schema, overwrite)
        if self._parsed.writer_id is None:
            raise UsageError("a streaming write needs option checkpointLocation (or writerId): "
                             "it names the query so a restarted query never commits a "
                             "micro-batch twice")
        return QuorumlogStreamWriter(self._parsed, self._record(), self._parsed.writer_id)


class QuorumlogScanDataSource(QuorumlogDataSource):
    """The same source for a session with Python filter pushdown off (Spark's
    default): its batch reader does not implement ``pushFilters``, which Spark
    refuses there (``DATA_SOURCE_PUSHDOWN_DISABLED``). It reads the same rows;
    it only cannot skip ledgers and entries by the query's filters.
    ``register`` picks this class or :class:`QuorumlogDataSource` by the
    session's setting."""

    def reader(self, schema: StructType) -> DataSourceReader:
        return QuorumlogScanReader(self._parsed, self._record())


def _check_write(schema: StructType, overwrite: bool) -> None:
    if overwrite:
        raise UsageError("a quorumlog stream is append-only: use mode('append')")
    check_write_schema({f.name: f.dataType.simpleString() for f in schema.fields})


# ----- reading ---------------------------------------------------------------------------


class QuorumlogInputPartition(InputPartition):
    """One Spark task's read: its ReadTasks (consecutive ranges of one stream
    partition, ``group_tasks``) plus what the executor needs to do them."""

    def __init__(self, tasks: tuple[ReadTask, ...], meta: tuple[str, ...], password: bytes,
                 batch_rows: int) -> None:
        super().__init__(tasks)
        self.tasks = tasks
        self.meta = meta
        self.password = password
        self.batch_rows = batch_rows


def read_partition(partition: QuorumlogInputPartition) -> Iterator[pa.RecordBatch]:
    """Read one Spark task's ranges in order: from the bookies (never past the
    LAC seen at planning), from a ledger's Parquet copy when it was offloaded,
    or from a compacted view."""
    for on_bookies, run in itertools.groupby(
            partition.tasks, key=lambda task: task.view is None and task.offload is None):
        if on_bookies:
            yield from _read_bookies(partition, list(run))
            continue
        for task in run:
            if task.view is not None:
                yield from _read_view(partition, task, task.view)
            elif task.offload is not None:
                yield from _read_offloaded(partition, task, task.offload)


def _read_bookies(partition: QuorumlogInputPartition,
                  tasks: list[ReadTask]) -> Iterator[pa.RecordBatch]:
    """Consecutive ranges read straight from the bookies, a chunk at a time.

    The next chunk (of this range or the next one, whose ledger it opens) is
    read on the I/O loop while this thread decodes the current one into
    Arrow, so the network and the decode overlap across ranges too."""
    client = _io.ledger_client(partition.meta)
    handles: dict[int, ReadHandle] = {}

    async def fetch(task: ReadTask, first: int, last: int) -> list[EntryBatch]:
        handle = handles.get(task.ledger_id)
        if handle is None:
            handle = await client.open_ledger(task.ledger_id, password=partition.password,
                                              recovery=False)
            handles[task.ledger_id] = handle
        return await handle.read_batch_raw(first, last)

    chunk = READ_CHUNK_ENTRIES_FIRST  # before the entry size is known
    position = (0, tasks[0].first_entry)  # (index in tasks, next entry to read)

    def submit() -> tuple[ReadTask, concurrent.futures.Future[list[EntryBatch]]] | None:
        nonlocal position
        index, first = position
        while first > tasks[index].last_entry:
            index += 1
            if index == len(tasks):
                return None
            first = tasks[index].first_entry
        task = tasks[index]
        last = min(task.last_entry, first + chunk - 1)
        position = (index, last + 1)
        return task, _io.submit(fetch(task, first, last))

    pending = submit()
    try:
        while pending is not None:
            task, future = pending
            batches = future.result(_io.CALL_TIMEOUT_S)
            entries = sum(map(len, batches))
            # The bytes the chunk's entries span (envelope headers included):
            # O(1) per batch, where payload_bytes sums every bound.
            size = sum(batch.ends[-1] - batch.starts[0] for batch in batches if len(batch))
            average = max(1, size // max(1, entries))
            chunk = max(1, min(READ_CHUNK_ENTRIES_MAX, READ_CHUNK_BYTES // average))
            pending = submit()
            batch = _decode_chunk(task, batches)
            for offset in range(0, batch.num_rows, partition.batch_rows):
                yield batch.slice(offset, partition.batch_rows)
    finally:
        if pending is not None:
            pending[1].cancel()


def _read_planned(partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """A planned task's rows. A plan of no tasks (an empty stream, filters that
    prune every ledger) reaches the executor as the one empty partition Spark
    substitutes, ``InputPartition(None)`` (pyspark's plan_data_source_read):
    it holds no rows."""
    if isinstance(partition, QuorumlogInputPartition):
        return read_partition(partition)
    if getattr(partition, "value", None) is None:
        return iter(())
    raise UsageError(f"not a quorumlog stream partition: {partition!r}")


def _read_view(partition: QuorumlogInputPartition, task: ReadTask,
               view: CompactionRecord) -> Iterator[pa.RecordBatch]:
    """readCompacted: the task's messages of the partition's compacted view, a
    chunk of the compacted ledger at a time (a newer compaction that replaced
    it meanwhile is read on, never past the planned ``view_to``)."""
    client = _io.ledger_client(partition.meta)
    record = _io.run(load_record(client.meta, task.stream))
    start = SeqPosition(*task.view_from, 0)
    chunks = compacted_view(client, record, task.partition, view, start)

    async def next_chunk() -> list[Message] | None:
        return await anext(chunks, None)

    try:
        while (messages := _io.run(next_chunk())) is not None:
            kept = [m for m in messages
                    if (m.seq, m.position.entry_id, m.position.batch_index) < task.view_to]
            if kept:
                batch = record_batch_of_messages(kept, publish_min_ms=task.publish_min_ms,
                                                 publish_max_ms=task.publish_max_ms)
                for offset in range(0, batch.num_rows, partition.batch_rows):
                    yield batch.slice(offset, partition.batch_rows)
            if len(kept) < len(messages):
                break  # past the end planned
    finally:
        _io.run(chunks.aclose())


def _read_offloaded(partition: QuorumlogInputPartition, task: ReadTask,
                    offload: OffloadRecord) -> Iterator[pa.RecordBatch]:
    """A task's entries from the ledger's Parquet file, a row group at a time
    (the file's page checksums and metadata are checked as it is read)."""
    ledger = OffloadedLedger(offload, task.stream)
    first = task.first_entry
    while first <= task.last_entry:
        last = min(task.last_entry, first + OFFLOADED_CHUNK_ENTRIES - 1)
        batch = _decode_chunk(task, ledger.read_raw_sync(first, last))
        for offset in range(0, batch.num_rows, partition.batch_rows):
            yield batch.slice(offset, partition.batch_rows)
        first = last + 1


async def _with_offloads(client: LedgerClient, record: StreamRecord,
                         tasks: list[ReadTask]) -> list[ReadTask]:
    """The tasks, those over an offloaded ledger pointed at its Parquet copy."""
    found = await load_offloads(client.meta, record.name, {task.ledger_id for task in tasks})
    return [dataclasses.replace(task, offload=found[task.ledger_id])
            if task.ledger_id in found else task for task in tasks]


def entry_columns(batches: list[EntryBatch]) -> EntryColumns:
    """One buffer for a chunk's consecutive entry batches (one memcpy), with
    their payload bounds shifted into it."""
    if len(batches) == 1:
        only = batches[0]
        return EntryColumns(only.buffer, _int64(only.starts), _int64(only.ends),
                            only.first_entry_id)
    shift = 0
    starts, ends = [], []
    for batch in batches:
        offset = pa.scalar(shift, pa.int64())  # an Arrow scalar: see _arrow._timestamps
        starts.append(pc.add(_int64(batch.starts), offset))
        ends.append(pc.add(_int64(batch.ends), offset))
        shift += len(batch.buffer)
    first = batches[0].first_entry_id if batches else 0
    return EntryColumns(b"".join(batch.buffer for batch in batches),
                        pa.concat_arrays(starts) if starts else pa.array([], pa.int64()),
                        pa.concat_arrays(ends) if ends else pa.array([], pa.int64()), first)


def _int64(values: array.array[int]) -> pa.Array:
    """An int64 Arrow array over an ``array("q")`` (no copy)."""
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])


def _decode_chunk(task: ReadTask, batches: list[EntryBatch]) -> pa.RecordBatch:
    """Rows of a chunk of consecutive entries, built column-wise from the
    buffers; an entry that breaks the format is decoded entry by entry, which
    raises MessageFormatError naming it."""
    if batches:
        first_id, last_id = batches[0].first_entry_id, batches[-1].last_entry_id
        columns = entry_columns(batches)
        rows = record_batch_of_entries(
            task.stream, task.partition, task.ledger_id, columns,
            first_batch=task.first_batch if first_id == task.first_entry else 0,
            last_entry_last_batch=(task.end_batch - 1 if task.end_batch > 0
                                   and last_id == task.last_entry else -1),
            publish_min_ms=task.publish_min_ms, publish_max_ms=task.publish_max_ms)
        if rows is not None:
            return rows
    sink = ColumnSink()
    for batch in batches:
        for k, payload in enumerate(batch.payloads()):
            entry_id = batch.first_entry_id + k
            first_batch = task.first_batch if entry_id == task.first_entry else 0
            last_batch = (task.end_batch - 1 if task.end_batch > 0
                          and entry_id == task.last_entry else -1)
            decode_entry_columns(payload, sink, entry_id, first_batch, last_batch)
    return record_batch(task.stream, task.partition, task.ledger_id, sink,
                        publish_min_ms=task.publish_min_ms, publish_max_ms=task.publish_max_ms)


def _wrap(tasks: list[ReadTask], options: SourceOptions, record: StreamRecord
          ) -> list[QuorumlogInputPartition]:
    return [QuorumlogInputPartition(group, options.meta, record.password,
                                    options.arrow_batch_rows)
            for group in group_tasks(tasks, options.max_rows_per_partition)]


@dataclass
class _PartitionView:
    """What planning knows of one partition: its head (read once) and where
    its readable messages start and end. Ledgers are read from ``ledgers``
    only for the seqs a plan covers."""

    ledgers: LedgerList
    first: SeqPosition  # the first message kept
    end: SeqPosition  # after the last readable message
    open_lac: int | None

    @property
    def head(self) -> PartitionHead:
        return self.ledgers.head

    async def offset(self, position: SeqPosition) -> int:
        """Entries of the partition before ``position`` (trimmed ones included)."""
        info = await self.ledgers.get(position.seq)
        return position_offset(info, self.head, position, self.open_lac)

    async def advance(self, start: SeqPosition, end: SeqPosition, entries: int) -> SeqPosition:
        """The position ``entries`` entries after ``start``, not past ``end``:
        a binary search for the ledger that holds it, then a walk over the
        ledgers from ``start`` to there."""
        if entries <= 0:
            return start
        target = await self.offset(start) + entries
        lac = self.open_lac

        def holds_target(info: LedgerInfo) -> bool:
            return info.entries_before + ledger_end(info, lac if info.is_open else None) >= target

        last = min(await self.ledgers.bisect(holds_target), end.seq)
        stretch = await self.ledgers.slice(start.seq, last + 1)
        return advance(stretch, start, end, lac, entries)


async def _view(client: LedgerClient, record: StreamRecord, partition: int,
                handles: LedgerHandles) -> _PartitionView:
    ledgers = LedgerList(client.meta, record.name, partition)
    head = await ledgers.refresh()
    end = await end_position(handles, head)
    lac = end.entry_id - 1 if head.open_ledger is not None else None
    return _PartitionView(ledgers, await first_position(ledgers), end, lac)


def _position_specs(raw: str | None, partitions: int, default: str) -> dict[int, StartSpec]:
    specs: dict[int, StartSpec] = dict.fromkeys(range(partitions), default)
    if raw is not None:
        specs.update(parse_positions(raw, partitions))
    return specs


async def _start_of(client: LedgerClient, record: StreamRecord, options: SourceOptions, *,
                    partition: int, view: _PartitionView, handles: LedgerHandles,
                    default: str) -> tuple[SeqPosition, int | None]:
    spec: StartSpec
    if options.starting_time_ms is not None:
        spec = options.starting_time_ms
    else:
        spec = _position_specs(options.starting_positions, record.config.partitions,
                               default)[partition]
    start, skip_ms = await resolve_start(client, handles, record, partition, spec,
                                         ledgers=view.ledgers)
    return start, skip_ms or None


async def _end_of(record: StreamRecord, options: SourceOptions, partition: int,
                  view: _PartitionView) -> SeqPosition:
    spec = _position_specs(options.ending_positions, record.config.partitions,
                           LATEST)[partition]
    if spec == LATEST:
        return view.end
    if spec == EARLIEST:
        return view.first
    assert isinstance(spec, Position)
    info = await view.ledgers.find(spec.ledger_id)
    if info is None:
        raise UsageError(f"endingPositions: stream {record.name!r} partition {partition} has "
                         f"no ledger {spec.ledger_id}")
    return min(SeqPosition(info.seq, spec.entry_id, spec.batch_index, info.ledger_id), view.end)


class QuorumlogReader(DataSourceReader):
    def __init__(self, options: SourceOptions, record: StreamRecord) -> None:
        self.options = options
        self.record = record
        self.pruning = Pruning()

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:  # noqa: N802
        """Use filters on partition, ledger_id, entry_id and publish_time to skip
        ledgers and entries; every filter is still returned, so Spark re-checks
        each row (the pruning only needs to be conservative)."""
        for item in filters:
            _prune(self.pruning, item)
            yield item

    def partitions(self) -> Sequence[InputPartition]:
        options, record = self.options, self.record
        pruning = self.pruning
        pruning.narrow_publish(None, None if options.ending_time_ms is None
                               else options.ending_time_ms - 1)

        async def plan() -> list[ReadTask]:
            client = await _io._client(options.meta)
            tasks: list[ReadTask] = []
            for partition in range(record.config.partitions):
                if pruning.partitions is not None and partition not in pruning.partitions:
                    continue
                handles = LedgerHandles(client, record)
                view = await _view(client, record, partition, handles)
                start, skip_ms = await _start_of(client, record, options, partition=partition,
                                                 view=view, handles=handles, default=EARLIEST)
                end = await _end_of(record, options, partition, view)
                if options.read_compacted:
                    view_task, start = await _plan_compacted(
                        client, record, options, partition, view, start=start, end=end,
                        pruning=pruning)
                    if view_task is not None:
                        tasks.append(_with_publish_min(view_task, skip_ms))
                start, _ = check_start(record.name, partition, view.first, start,
                                       fail_on_data_loss=True)
                stretch = await view.ledgers.slice(start.seq, end.seq + 1)
                part_tasks = plan_partition(record.name, partition, stretch, start, end,
                                            open_lac=view.open_lac,
                                            max_entries=options.max_rows_per_partition,
                                            pruning=pruning)
                tasks += [_with_start_time(t, start.seq, skip_ms) for t in part_tasks]
            return await _with_offloads(client, record, tasks)

        _io.ledger_client(options.meta)
        tasks = _io.run(plan())
        partitions = _wrap(tasks, options, record)
        log.info("spark_read_planned", stream=record.name, ranges=len(tasks),
                 tasks=len(partitions))
        return partitions

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_planned(partition)


async def _plan_compacted(client: LedgerClient, record: StreamRecord, options: SourceOptions,
                          partition: int, view: _PartitionView, *, start: SeqPosition,
                          end: SeqPosition, pruning: Pruning
                          ) -> tuple[ReadTask | None, SeqPosition]:
    """readCompacted: the task reading the partition's compacted view, if the read
    covers some of it, and where the read of its ledgers starts. "earliest" and
    a start by time begin at the view's first message (one whose ledger
    retention trimmed included; by time, its rows are filtered)."""
    compaction = await load_compaction(client, record.name, partition)
    if compaction is None or not compaction.ledger_id:
        return None, start
    spec = None if options.starting_time_ms is not None else _position_specs(
        options.starting_positions, record.config.partitions, EARLIEST)[partition]
    view_start = start if isinstance(spec, Position) else VIEW_START
    if (view_start.seq, view_start.entry_id) > compaction.horizon_key:
        return None, start
    task, _ = plan_view(record.name, partition, compaction, view_start, end, pruning=pruning)
    return task, max(start, await past_view(view.ledgers, compaction))


def _with_publish_min(task: ReadTask, skip_ms: int | None) -> ReadTask:
    if skip_ms is None:
        return task
    low = skip_ms if task.publish_min_ms is None else max(task.publish_min_ms, skip_ms)
    return dataclasses.replace(task, publish_min_ms=low)


def _with_start_time(task: ReadTask, start_seq: int, skip_ms: int | None) -> ReadTask:
    """A start found by publish time skips earlier messages of the start ledger
    (publish times do not decrease inside a ledger)."""
    return task if task.seq != start_seq else _with_publish_min(task, skip_ms)


def _prune(pruning: Pruning, item: Filter) -> None:
    attribute: tuple[str, ...] = getattr(item, "attribute", ())
    column = attribute[0] if len(attribute) == 1 else ""
    value: Any = getattr(item, "value", None)
    if column == "publish_time":
        ms = _epoch_ms(value)
        if ms is None:
            return
        if isinstance(item, GreaterThan | GreaterThanOrEqual):
            pruning.narrow_publish(ms, None)
        elif isinstance(item, LessThan | LessThanOrEqual):
            pruning.narrow_publish(None, ms)
        elif isinstance(item, EqualTo):
            pruning.narrow_publish(ms, ms)
    elif column in ("partition", "ledger_id"):
        values: set[int] | None = None
        if isinstance(item, EqualTo) and isinstance(value, int):
            values = {value}
        elif isinstance(item, In) and all(isinstance(v, int) for v in value):
            values = set(value)
        if values is None:
            return
        if column == "partition":
            pruning.partitions = values if pruning.partitions is None else (
                pruning.partitions & values)
        else:
            pruning.ledgers = values if pruning.ledgers is None else pruning.ledgers & values
    elif column == "entry_id" and isinstance(value, int):
        if isinstance(item, GreaterThan | GreaterThanOrEqual | EqualTo):
            pruning.entry_min = max(pruning.entry_min or 0, value)
        if isinstance(item, LessThan | LessThanOrEqual | EqualTo):
            pruning.entry_max = value if pruning.entry_max is None else min(
                pruning.entry_max, value)


def _epoch_ms(value: Any) -> int | None:
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.UTC)
        return int(value.timestamp() * 1000)
    return None


# ----- streaming read --------------------------------------------------------------------


class QuorumlogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are per-partition positions; see ``_plan`` for the JSON."""

    def __init__(self, options: SourceOptions, record: StreamRecord) -> None:
        self.options = options
        self.record = record
        self._target: dict[int, SeqPosition] | None = None

    def _views(self) -> dict[int, _PartitionView]:
        async def go() -> dict[int, _PartitionView]:
            client = await _io._client(self.options.meta)
            handles = LedgerHandles(client, self.record)
            return {p: await _view(client, self.record, p, handles)
                    for p in range(self.record.config.partitions)}

        return _io.run(go())

    def initialOffset(self) -> dict[str, Any]:  # noqa: N802
        options, record = self.options, self.record

        async def go() -> dict[int, SeqPosition]:
            client = await _io._client(options.meta)
            handles = LedgerHandles(client, record)
            out = {}
            for partition in range(record.config.partitions):
                view = await _view(client, record, partition, handles)
                start, _ = await _start_of(client, record, options, partition=partition,
                                           view=view, handles=handles, default=LATEST)
                out[partition] = start
            return out

        _io.ledger_client(options.meta)
        return offset_json(_io.run(go()))

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        limit = self.options.max_entries_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        _io.ledger_client(self.options.meta)
        self._target = {p: view.end for p, view in self._views().items()}

    def reportLatestOffset(self) -> dict[str, Any] | None:  # noqa: N802
        _io.ledger_client(self.options.meta)
        return offset_json({p: view.end for p, view in self._views().items()})

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:  # noqa: N802
        partitions = self.record.config.partitions
        starts = parse_offset(start, partitions)
        options, record, target = self.options, self.record, self._target

        async def go() -> dict[int, SeqPosition]:
            client = await _io._client(options.meta)
            handles = LedgerHandles(client, record)
            views = {p: await _view(client, record, p, handles) for p in range(partitions)}
            ends: dict[int, SeqPosition] = {}
            begins: dict[int, SeqPosition] = {}
            for partition, view in views.items():
                begin = starts.get(partition, view.first)
                begin, _ = check_start(record.name, partition, view.first, begin,
                                       fail_on_data_loss=options.fail_on_data_loss)
                end = view.end
                if target is not None and partition in target:
                    end = min(end, target[partition])
                begins[partition], ends[partition] = begin, max(end, begin)
            if isinstance(limit, ReadMaxRows):
                lags = {p: max(0, await views[p].offset(ends[p]) - await views[p].offset(begins[p]))
                        for p in views}
                shares = split_limit(lags, limit.max_rows)
                ends = {p: await views[p].advance(begins[p], ends[p], shares[p]) for p in views}
            return ends

        _io.ledger_client(options.meta)
        return offset_json(_io.run(go()))

    def partitions(self, start: dict[str, Any], end: dict[str, Any]
                   ) -> Sequence[InputPartition]:
        partitions = self.record.config.partitions
        starts, ends = parse_offset(start, partitions), parse_offset(end, partitions)
        options, record = self.options, self.record

        async def plan() -> list[ReadTask]:
            client = await _io._client(options.meta)
            handles = LedgerHandles(client, record)
            tasks: list[ReadTask] = []
            for partition, stop in ends.items():
                view = await _view(client, record, partition, handles)
                begin = starts.get(partition, view.first)
                begin, warning = check_start(record.name, partition, view.first, begin,
                                             fail_on_data_loss=options.fail_on_data_loss)
                if warning:
                    log.warning("spark_stream_data_loss_skipped", message=warning)
                lac = view.open_lac
                current = view.head.open_ledger
                if current is not None and current.seq == stop.seq:
                    lac = max(lac or -1, stop.entry_id - 1)
                stretch = await view.ledgers.slice(begin.seq, stop.seq + 1)
                tasks += plan_partition(record.name, partition, stretch, begin, stop,
                                        open_lac=lac, max_entries=options.max_rows_per_partition)
            return await _with_offloads(client, record, tasks)

        _io.ledger_client(options.meta)
        return _wrap(_io.run(plan()), options, record)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_planned(partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: positions are the state, kept by Spark's checkpoint."""

    def stop(self) -> None:
        """The process's client stays for reuse; nothing per query to close."""


# ----- writing ---------------------------------------------------------------------------


@dataclass
class QuorumlogCommitMessage(WriterCommitMessage):
    """What one write task produced: its closed ledgers per stream partition."""

    ledgers: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    task: int = 0

    def stats(self) -> dict[int, list[LedgerStats]]:
        return {p: [msgspec.convert(s, LedgerStats) for s in items]
                for p, items in self.ledgers.items()}


def write_task(options: SourceOptions, record: StreamRecord, job: str,
               batches: Iterator[pa.RecordBatch]) -> QuorumlogCommitMessage:
    """Write this task's rows into one new ledger per stream partition (not linked)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    task_id = context.partitionId() if context is not None else 0
    client = _io.ledger_client(options.meta)
    writers: dict[int, JobLedgerWriter] = {}
    round_robin = RoundRobin(task_id)
    partitions = record.config.partitions
    last_ms = 0

    async def add(rows: list[tuple[int | None, Any]]) -> None:
        for chosen, message in rows:
            partition = (partition_for_key(message.key, partitions, round_robin.next())
                         if chosen is None else chosen)
            if not 0 <= partition < partitions:
                raise UsageError(f"row names partition {partition}; stream {record.name!r} "
                                 f"has {partitions}")
            writer = writers.get(partition)
            if writer is None:
                writer = JobLedgerWriter(client, record, partition, job)
                writers[partition] = writer
                await writer.open()
            await writer.add(message)

    async def close_all() -> dict[int, list[dict[str, Any]]]:
        return {p: [msgspec.to_builtins(await w.close())] for p, w in sorted(writers.items())}

    async def discard_all() -> None:
        for writer in writers.values():
            await writer.discard()

    try:
        for batch in batches:
            last_ms = max(client.clock.wall_ms(), last_ms)
            _io.run(add(list(messages_of(batch, last_ms))))
        return QuorumlogCommitMessage(ledgers=_io.run(close_all()), task=task_id)
    except BaseException:
        _io.run(discard_all())
        raise


def _merge(messages: Sequence[WriterCommitMessage | None]) -> dict[int, list[LedgerStats]]:
    merged: dict[int, list[LedgerStats]] = {}
    ordered = sorted((m for m in messages if isinstance(m, QuorumlogCommitMessage)),
                     key=lambda m: m.task)
    for message in ordered:
        for partition, stats in message.stats().items():
            merged.setdefault(partition, []).extend(stats)
    return merged


class QuorumlogWriter(DataSourceArrowWriter):
    """All-or-nothing batch write: tasks write ledgers, commit links them in one
    meta transaction, abort deletes them."""

    def __init__(self, options: SourceOptions, record: StreamRecord) -> None:
        self.options = options
        self.record = record
        self.job = new_job_id("spark", _io.ledger_client(options.meta).clock)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> QuorumlogCommitMessage:
        return write_task(self.options, self.record, self.job, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        client = _io.ledger_client(self.options.meta)
        _io.run(link_job_ledgers(client, self.record, self.job, _merge(messages)))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        client = _io.ledger_client(self.options.meta)
        deleted = _io.run(abort_job_ledgers(client, self.record, self.job, _merge(messages)))
        log.info("spark_write_aborted", stream=self.record.name, job=self.job,
                 ledgers=len(deleted))


class QuorumlogStreamWriter(DataSourceStreamArrowWriter):
    """Per-micro-batch atomic streaming write: a batch is linked in one meta
    transaction that also records its id for this query (``writerId``, by
    default derived from the checkpoint location); a batch committed before is
    never linked again, so a restarted query does not duplicate it."""

    def __init__(self, options: SourceOptions, record: StreamRecord, writer_id: str) -> None:
        self.options = options
        self.record = record
        self.writer_id = writer_id
        # One job per micro-batch (a job ends once), under this run's prefix.
        self.job_prefix = new_job_id("stream", _io.ledger_client(options.meta).clock)

    def job(self, batch_id: int) -> str:
        return f"{self.job_prefix}-b{batch_id:012d}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> QuorumlogCommitMessage:
        from pyspark import TaskContext

        context = TaskContext.get()
        batch = context.getLocalProperty(BATCH_ID_PROPERTY) if context is not None else None
        if batch is None or not batch.isdigit():
            raise UsageError("the quorumlog streaming sink runs only inside a micro-batch "
                             f"(Spark set no {BATCH_ID_PROPERTY!r} for this task)")
        return write_task(self.options, self.record, self.job(int(batch)), iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        client = _io.ledger_client(self.options.meta)
        linked = _io.run(link_job_ledgers(client, self.record, self.job(batchId),
                                          _merge(messages), sink=(self.writer_id, batchId)))
        if not linked:
            log.info("spark_stream_batch_already_committed", writer=self.writer_id,
                     batch=batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        client = _io.ledger_client(self.options.meta)
        _io.run(abort_job_ledgers(client, self.record, self.job(batchId), _merge(messages)))


class QuorumlogScanReader(QuorumlogReader):
    """:class:`QuorumlogReader` without filter pushdown (see
    :class:`QuorumlogScanDataSource`): Spark checks whether a reader's
    ``pushFilters`` is the base class's, so this one is."""

    pushFilters = DataSourceReader.pushFilters  # type: ignore[assignment]  # noqa: N815
