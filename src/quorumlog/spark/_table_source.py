"""The ``quorumlog.table`` PySpark data source: batch read and upsert write of a table.

Read: one Spark partition per table partition, each a paged scan of one
point in time of that partition (``snapshot``, default true: a scan context
on the replica, table/_scan_contexts.py; a task whose context is lost fails
and Spark runs it again) on its leader (linearizable reads) or, with ``staleOk=true``, of one of
its followers (the driver picks a non-leader replica of each partition from the
meta leader's scheduler view, in turn, so the reads stay off the leaders; a
follower read may miss the latest writes, docs/table.md), as Arrow batches with
the columns
``hash_key, sort_key, value`` (binary), ``timetag`` and ``expire_ts`` (long;
0: no TTL). Pushdown: ``hash_key = x`` (or ``IN``) reads only the partitions
of those hash keys, with a sort-key scan of each; sort_key comparisons narrow
that scan. Every filter is still returned to Spark, which re-checks each row.

Write: upserts by (hash_key, sort_key): each task groups its rows by hash_key
into ``multi_set`` calls of ``WRITE_BATCH_ITEMS_MAX`` items. A write is
idempotent (the same rows give the same table), not atomic: a failed job may
leave part of its rows written, and running it again completes it. An
optional ``ttl_s`` column sets each row's TTL (0 or null: none).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
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
from pyspark.sql.types import StructType

from quorumlog import chunks
from quorumlog.errors import UsageError
from quorumlog.spark import _io
from quorumlog.table import SCAN_LIMIT_MAX, TableClient, partition_of

TABLE_SCHEMA_DDL = ("hash_key binary, sort_key binary, value binary, timetag bigint, "
                    "expire_ts bigint")
TABLE_ARROW_SCHEMA = pa.schema([
    ("hash_key", pa.binary()), ("sort_key", pa.binary()), ("value", pa.binary()),
    ("timetag", pa.int64()), ("expire_ts", pa.int64())])
PAGE_RECORDS_DEFAULT = 1000  # records per scan page = rows per Arrow batch
WRITE_BATCH_ITEMS_MAX = 500  # sort keys of one multi_set call
# Bytes of keys and values of one multi_set call (one item at least): a call is
# one Raft entry, at most 8 MiB (max_entry_data_bytes); before, 500 values of
# 100 KB under one hash key made a 50 MB call that failed the job.
WRITE_BATCH_BYTES_MAX = 4 * 1024 * 1024
WRITES_IN_FLIGHT_MAX = 16  # multi_set calls one task has outstanding
WRITE_COLUMNS = {"hash_key", "sort_key", "value", "ttl_s"}
_KEY_TYPES = {"binary", "string"}
_TTL_TYPES = {"int", "bigint", "smallint", "tinyint"}


@dataclass(frozen=True, slots=True)
class TableOptions:
    meta: tuple[str, ...]
    table: str
    page_records: int
    stale_ok: bool = False
    snapshot: bool = True


def parse_table_options(options: Mapping[str, str]) -> TableOptions:
    lowered = {k.lower(): v for k, v in options.items()}
    meta = tuple(a.strip() for a in lowered.get("meta", "").split(",") if a.strip())
    if not meta:
        raise UsageError("option meta is required: the meta service addresses, "
                         "host:port separated by commas")
    table = lowered.get("table", "")
    if not table:
        raise UsageError("option table is required: the name of the quorumlog table")
    raw = lowered.get("pagerecords", str(PAGE_RECORDS_DEFAULT))
    try:
        page = int(raw)
    except ValueError:
        raise UsageError(f"option pageRecords={raw!r} is not an integer") from None
    if not 1 <= page <= SCAN_LIMIT_MAX:
        raise UsageError(f"option pageRecords={page} must be in 1..{SCAN_LIMIT_MAX}")
    flags = {}
    for name, default in (("staleOk", "false"), ("snapshot", "true")):
        value = lowered.get(name.lower(), default).strip().lower()
        if value not in ("true", "false"):
            raise UsageError(f"option {name}={value!r} must be true or false")
        flags[name] = value == "true"
    return TableOptions(meta, table, page, stale_ok=flags["staleOk"],
                        snapshot=flags["snapshot"])


def _client(meta: tuple[str, ...]) -> TableClient:
    """This process's table client for ``meta`` (kept open on the quorumlog loop)."""

    async def make() -> TableClient:
        clients: dict[tuple[str, ...], TableClient] = _io._state.setdefault("tables", {})
        client = clients.get(meta)
        if client is None:
            # Upserts are idempotent: no exactly-once bookkeeping is needed.
            client = TableClient(list(meta), exactly_once=False)
            clients[meta] = client
        return client

    _io._loop()
    return _io.run(make())


class QuorumlogTableDataSource(DataSource):
    """``spark.read.format("quorumlog.table")`` / ``df.write.format("quorumlog.table")``."""

    @classmethod
    def name(cls) -> str:
        return "quorumlog.table"

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self._parsed = parse_table_options(options)

    def schema(self) -> str:
        return TABLE_SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return TableReader(self._parsed)

    def writer(self, schema: StructType, overwrite: bool) -> TableWriter:
        if overwrite:
            raise UsageError("mode overwrite is not supported for a quorumlog table: "
                             "writes are upserts by key; use mode append")
        check_table_write_schema({f.name: f.dataType.simpleString() for f in schema.fields})
        return TableWriter(self._parsed, "ttl_s" in schema.fieldNames())


class QuorumlogTableScanDataSource(QuorumlogTableDataSource):
    """The table source for a session with Python filter pushdown off (Spark's
    default; see ``QuorumlogScanDataSource``): every partition is scanned and
    Spark filters the rows."""

    def reader(self, schema: StructType) -> DataSourceReader:
        return TableScanReader(self._parsed)


def check_table_write_schema(field_types: Mapping[str, str]) -> None:
    unknown = sorted(set(field_types) - WRITE_COLUMNS)
    if unknown:
        raise UsageError(f"cannot write columns {unknown} to a quorumlog table: the columns "
                         "are hash_key, sort_key, value (binary or string) and ttl_s (int)")
    for name in ("hash_key", "sort_key", "value"):
        if name not in field_types:
            raise UsageError(f"writing to a quorumlog table needs a {name!r} column "
                             "(binary or string)")
        if field_types[name] not in _KEY_TYPES:
            raise UsageError(f"column {name} has type {field_types[name]}; a quorumlog table "
                             "takes binary or string")
    if "ttl_s" in field_types and field_types["ttl_s"] not in _TTL_TYPES:
        raise UsageError(f"column ttl_s has type {field_types['ttl_s']}; it takes an integer")


# ----- read ------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Pushdown:
    hash_keys: set[bytes] | None = None  # None: every hash key
    start: bytes = b""
    start_inclusive: bool = True
    stop: bytes | None = None
    stop_inclusive: bool = False

    def narrow_start(self, value: bytes, inclusive: bool) -> None:
        if value > self.start or (value == self.start and not inclusive):
            self.start, self.start_inclusive = value, inclusive

    def narrow_stop(self, value: bytes, inclusive: bool) -> None:
        if self.stop is None or value < self.stop or (value == self.stop and not inclusive):
            self.stop, self.stop_inclusive = value, inclusive


def _as_key(value: Any) -> bytes | None:
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    return None


def push_filter(pushdown: _Pushdown, item: Filter) -> None:
    """Narrow the scan by one filter Spark offers; anything else is ignored
    (the narrowing only needs to be conservative: Spark re-checks every row)."""
    attribute: tuple[str, ...] = getattr(item, "attribute", ())
    column = attribute[0] if len(attribute) == 1 else ""
    if column == "hash_key":
        keys: set[bytes] | None = None
        if isinstance(item, EqualTo):
            key = _as_key(item.value)
            keys = None if key is None else {key}
        elif isinstance(item, In):
            found = [_as_key(v) for v in item.value]
            keys = None if None in found else {k for k in found if k is not None}
        if keys is not None:
            pushdown.hash_keys = keys if pushdown.hash_keys is None else (
                pushdown.hash_keys & keys)
    elif column == "sort_key":
        value = _as_key(getattr(item, "value", None))
        if value is None:
            return
        if isinstance(item, GreaterThan | GreaterThanOrEqual | EqualTo):
            pushdown.narrow_start(value, not isinstance(item, GreaterThan))
        if isinstance(item, LessThan | LessThanOrEqual | EqualTo):
            pushdown.narrow_stop(value, not isinstance(item, LessThan))


class TablePartition(InputPartition):
    """One table partition to read: whole, or the sort-key range of one hash key."""

    def __init__(self, partition: int, hash_key: bytes | None, pushdown: _Pushdown,
                 read_node: int = 0) -> None:
        super().__init__(partition)
        self.partition = partition
        self.hash_key = hash_key
        self.pushdown = pushdown
        self.read_node = read_node  # staleOk: the replica to read first (0: any)


class TableReader(DataSourceReader):
    def __init__(self, options: TableOptions) -> None:
        self.options = options
        self.pushdown = _Pushdown()

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:  # noqa: N802
        for item in filters:
            push_filter(self.pushdown, item)
            yield item

    def partitions(self) -> Sequence[InputPartition]:
        client = _client(self.options.meta)
        layout = _io.run(client.table_info(self.options.table))
        count = layout.record.partitions
        nodes = (_io.run(client.stale_read_nodes(self.options.table))
                 if self.options.stale_ok else (0,) * count)
        if self.pushdown.hash_keys is None:
            return [TablePartition(p, None, self.pushdown, nodes[p]) for p in range(count)]
        return [TablePartition(partition_of(key, count), key, self.pushdown,
                               nodes[partition_of(key, count)])
                for key in sorted(self.pushdown.hash_keys)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, TablePartition):
            return read_table_partition(self.options, partition)
        if getattr(partition, "value", None) is None:  # Spark's InputPartition(None): no task
            return iter(())
        raise UsageError(f"not a quorumlog table partition: {partition!r}")


def read_table_partition(options: TableOptions,
                         partition: TablePartition) -> Iterator[pa.RecordBatch]:
    """Arrow batches of one task, a scan page each (one page fetched per batch)."""
    client = _client(options.meta)
    push = partition.pushdown
    pages = client.scan_records(
        options.table, partition.partition, hash_key=partition.hash_key,
        start=push.start if partition.hash_key is not None else b"",
        stop=push.stop if partition.hash_key is not None else None,
        start_inclusive=push.start_inclusive or partition.hash_key is None,
        stop_inclusive=push.stop_inclusive, page_records=options.page_records,
        stale_ok=options.stale_ok, prefer_node=partition.read_node, snapshot=options.snapshot)

    async def next_page() -> list[Any]:
        rows = []
        async for item in pages:
            rows.append(item)
            if len(rows) == options.page_records:
                break
        return rows

    while True:
        rows = _io.run(next_page())
        if rows:
            yield pa.RecordBatch.from_arrays([
                pa.array([r.hash_key for r in rows], pa.binary()),
                pa.array([r.sort_key for r in rows], pa.binary()),
                pa.array([r.value for r in rows], pa.binary()),
                pa.array([r.timetag for r in rows], pa.int64()),
                pa.array([r.expire_ts_s for r in rows], pa.int64())],
                schema=TABLE_ARROW_SCHEMA)
        if len(rows) < options.page_records:
            return


# ----- write -----------------------------------------------------------------------------------


class TableCommitMessage(WriterCommitMessage):
    def __init__(self, rows: int) -> None:
        self.rows = rows


def _column(batch: pa.RecordBatch, name: str) -> list[Any]:
    return batch.column(batch.schema.get_field_index(name)).to_pylist()  # type: ignore[no-any-return]


def _bytes(value: Any, column: str) -> bytes:
    key = _as_key(value)
    if key is None:
        raise UsageError(f"column {column} has a null; every row needs a {column}")
    return key


class TableWriter(DataSourceArrowWriter):
    def __init__(self, options: TableOptions, with_ttl: bool) -> None:
        self.options = options
        self.with_ttl = with_ttl

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TableCommitMessage:
        client = _client(self.options.meta)
        rows = 0
        for batch in iterator:
            groups: dict[tuple[bytes, int], dict[bytes, bytes]] = {}
            ttls = _column(batch, "ttl_s") if self.with_ttl else [0] * batch.num_rows
            for hash_key, sort_key, value, ttl in zip(
                    _column(batch, "hash_key"), _column(batch, "sort_key"),
                    _column(batch, "value"), ttls, strict=True):
                group = groups.setdefault((_bytes(hash_key, "hash_key"), int(ttl or 0)), {})
                group[_bytes(sort_key, "sort_key")] = _bytes(value, "value")
            _io.run(_upsert(client, self.options.table, groups))
            rows += batch.num_rows
        return TableCommitMessage(rows)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to do: every task's upserts are applied when it returns."""

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to undo: upserts are idempotent; run the job again to finish it."""


async def _upsert(client: TableClient, table: str,
                  groups: dict[tuple[bytes, int], dict[bytes, bytes]]) -> None:
    calls: list[tuple[bytes, int, dict[bytes, bytes]]] = []
    for (hash_key, ttl_s), items in groups.items():
        calls += [(hash_key, ttl_s, dict(run)) for run in chunks.by_size(
            items.items(), lambda item: len(item[0]) + len(item[1]), WRITE_BATCH_BYTES_MAX,
            WRITE_BATCH_ITEMS_MAX)]
    limit = asyncio.Semaphore(WRITES_IN_FLIGHT_MAX)

    async def one(hash_key: bytes, ttl_s: int, items: dict[bytes, bytes]) -> None:
        async with limit:
            await client.multi_set(table, hash_key, items, ttl_s=ttl_s)

    await asyncio.gather(*(one(*call) for call in calls))


class TableScanReader(TableReader):
    """:class:`TableReader` without filter pushdown (Spark checks whether a
    reader's ``pushFilters`` is the base class's)."""

    pushFilters = DataSourceReader.pushFilters  # type: ignore[assignment]  # noqa: N815
