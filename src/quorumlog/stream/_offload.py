"""Tiered storage: closed ledgers offloaded to Parquet and read back transparently.

After Pulsar's tiered storage (ledger offload). A closed ledger of a stream is
copied to one Parquet file (a local path, or a URL that ``pyarrow.fs`` opens:
``file://``, ``s3://``, ``gs://``, ``hdfs://``, ``abfs://``; any fsspec URL
when fsspec is installed). The file is read back and checked against what was
read from the bookies, and only then is an :class:`OffloadRecord` written to
meta: the record is the commit point, a crash before it leaves an unreferenced
file and nothing else. From then on every reader (``Reader``, consumers,
``seek``, the Spark source) reads that ledger from the file. The bookies' copy
is deleted by the stream trimmer once the record's deletion lag has passed
(Pulsar's ``managedLedgerOffloadDeletionLagMs``, 4 h by default), so a reader
that opened the ledger on the bookies just before the record finishes its
read. Trimming an offloaded ledger (retention, TTL, ``stream delete``)
deletes its file and its record.

The file holds one row per entry, in entry order: ``entry_id`` (int64) and
``payload`` (binary: the entry exactly as the stream wrote it, one message or
a batch of them in the stream's entry format), zstd-compressed, one row group
per read chunk (at most ``ROW_GROUP_ENTRIES_MAX`` entries and about
``ROW_GROUP_BYTES_MAX`` bytes). Page checksums are written and checked on
every read, and the key-value metadata names the stream, partition, ledger
and entry count, which a reader checks against the record before it trusts
the file.
"""

from __future__ import annotations

import array
import asyncio
import os
import re
import secrets
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import crc32c

from quorumlog.errors import QuorumlogError, UsageError
from quorumlog.ledger import EntryBatch, LedgerClient, LedgerEntry
from quorumlog.log import get_logger
from quorumlog.meta import DeleteOp, MetaClient, PutOp
from quorumlog.stream._config import OFFLOAD_DELETION_LAG_MS_DEFAULT
from quorumlog.stream._errors import OffloadError
from quorumlog.stream._layout import (
    LedgerInfo,
    OffloadRecord,
    StreamRecord,
    offload_key,
    offload_pending_key,
    offload_prefix,
)
from quorumlog.stream._ledgers import LedgerList
from quorumlog.stream._meta import version_is

log = get_logger(__name__)

FILE_FORMAT_VERSION = "1"
ROW_GROUP_ENTRIES_MAX = 8_192
ROW_GROUP_BYTES_MAX = 8 * 1024 * 1024
DELETION_LAG_MS_DEFAULT = OFFLOAD_DELETION_LAG_MS_DEFAULT
RECORDS_PER_READ = 1_000
ORPHAN_AGE_MS_DEFAULT = 3600 * 1000
"""A Parquet file under the target that no record names is deleted by the next
offload run once it is this old (a run that died between its file and its
record left it; a live run commits within seconds of its last write)."""
LOOKUPS_IN_FLIGHT_MAX = 32
_META_KEYS = ("quorumlog.format", "quorumlog.stream", "quorumlog.partition",
              "quorumlog.ledger_id", "quorumlog.entries")


def _pyarrow() -> tuple[Any, Any, Any]:
    """pyarrow, pyarrow.parquet and pyarrow.fs, or a UsageError saying how to get them."""
    try:
        import pyarrow
        import pyarrow.fs
        import pyarrow.parquet
    except ImportError:
        raise UsageError("offloaded ledgers are Parquet files: reading or writing them needs "
                         "pyarrow (pip install 'quorumlog[spark]')") from None
    return pyarrow, pyarrow.parquet, pyarrow.fs


def normalize_target(target: str) -> str:
    """``target`` as stored in records: a local path made absolute (records must
    not depend on the current directory), a URL as given; checked to be one
    that a filesystem opens (a UsageError otherwise)."""
    target = target.strip()
    if not target:
        raise UsageError("the offload target is empty: give a directory or a URL")
    target = os.path.abspath(target) if "://" not in target else target.rstrip("/")
    open_filesystem(target)
    return target


def open_filesystem(url: str) -> tuple[Any, str]:
    """(pyarrow FileSystem, path in it) for a local path or a URL."""
    pa, _, pafs = _pyarrow()
    if "://" not in url:
        return pafs.LocalFileSystem(), os.path.abspath(url)
    try:
        fs, path = pafs.FileSystem.from_uri(url)
        return fs, str(path)
    except pa.ArrowException as exc:  # an unknown scheme, or one this pyarrow lacks
        try:
            import fsspec  # type: ignore[import-not-found]  # optional: any fsspec URL
        except ImportError:
            raise UsageError(f"offload target {url!r}: pyarrow cannot open it ({exc}); "
                             "install fsspec for other URL schemes") from None
        spec_fs, spec_path = fsspec.core.url_to_fs(url)
        return pafs.PyFileSystem(pafs.FSSpecHandler(spec_fs)), str(spec_path)


_OWN_FILE = re.compile(r"/\d{4}/\d{20}-[0-9a-f]{12}\.parquet")
"""A file's path under ``<target>/<stream>`` as :func:`ledger_file_url` makes it."""


def ledger_file_url(target: str, stream: str, partition: int, ledger_id: int) -> str:
    """A new file name for the ledger under ``target`` (a random suffix: two
    offload runs racing on one ledger never write the same file)."""
    token = secrets.token_hex(6)
    return f"{target}/{stream}/{partition:04d}/{ledger_id:020d}-{token}.parquet"


def delete_file(url: str) -> None:
    """Delete an offloaded file; one already gone is not an error."""
    _, _, pafs = _pyarrow()
    fs, path = open_filesystem(url)
    try:
        if fs.get_file_info(path).type == pafs.FileType.NotFound:
            return
        fs.delete_file(path)
    except OSError as exc:
        raise OffloadError(f"cannot delete the offloaded file {url}: {exc}",
                           retriable=True) from None


# ----- writing --------------------------------------------------------------------------


class _FileWriter:
    """Writes one ledger's Parquet file, chunk by chunk (blocking: run in a thread)."""

    def __init__(self, url: str, metadata: dict[str, str]) -> None:
        pa, pq, _ = _pyarrow()
        self.url = url
        self._pa = pa
        fs, path = open_filesystem(url)
        self._fs, self._path = fs, path
        self._schema = pa.schema([pa.field("entry_id", pa.int64(), nullable=False),
                                  pa.field("payload", pa.binary(), nullable=False)],
                                 metadata=metadata)
        try:
            fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
            self._sink = fs.open_output_stream(path)
            self._writer = pq.ParquetWriter(self._sink, self._schema, compression="zstd",
                                            write_page_checksum=True)
        except OSError as exc:
            raise OffloadError(f"cannot write the offload file {url}: {exc}",
                               retriable=True) from None

    def write(self, first_entry_id: int, payloads: Sequence[bytes]) -> None:
        pa = self._pa
        table = pa.table([pa.array(range(first_entry_id, first_entry_id + len(payloads)),
                                   pa.int64()),
                          pa.array(payloads, pa.binary())], schema=self._schema)
        try:
            self._writer.write_table(table, row_group_size=len(payloads))
        except OSError as exc:
            raise OffloadError(f"cannot write the offload file {self.url}: {exc}",
                               retriable=True) from None

    def close(self) -> None:
        """Finish the file; a local one is fsynced with the directories up to the
        target (object stores make an upload durable when it completes), so the
        record committed next never names a file a crash could take back."""
        _, _, pafs = _pyarrow()
        try:
            self._writer.close()
            self._sink.close()
            if isinstance(self._fs, pafs.LocalFileSystem):
                _fsync(self._path)
                parent = os.path.dirname(self._path)
                for directory in (parent, os.path.dirname(parent),
                                  os.path.dirname(os.path.dirname(parent))):
                    _fsync(directory)
        except OSError as exc:
            raise OffloadError(f"cannot write the offload file {self.url}: {exc}",
                               retriable=True) from None

    def abort(self) -> None:
        try:
            self._writer.close()
            self._sink.close()
        except Exception:
            pass
        try:
            delete_file(self.url)
        except OffloadError as exc:
            log.warning("stream_offload_file_left", url=self.url, error=exc.message)


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ----- reading --------------------------------------------------------------------------


def _bounds(column: Any) -> tuple[Any, array.array[int], array.array[int]]:
    """A binary Arrow array's data buffer and each value's (start, end) in it."""
    count = len(column)
    offsets: array.array[int] = array.array("i")
    buffers = column.buffers()
    if count:
        raw = memoryview(buffers[1])[4 * column.offset: 4 * (column.offset + count + 1)]
        offsets.frombytes(raw)
    data = buffers[2] if buffers[2] is not None else b""
    return data, array.array("q", offsets[:-1]), array.array("q", offsets[1:])


class OffloadedLedger:
    """Reads one offloaded ledger from its Parquet file: the part of a ledger
    ``ReadHandle`` that stream readers use (closed, LAC = last entry). The
    blocking methods (``*_sync``) are for threads; the async ones run them in
    a worker thread so a reader's event loop never waits on the file."""

    def __init__(self, record: OffloadRecord, stream: str, *,
                 bookies: Callable[[], Awaitable[Any]] | None = None) -> None:
        self.record = record
        self.stream = stream
        self._file: Any = None
        self._groups: list[tuple[int, int]] = []  # (first entry id, entries) per row group
        self._cached: tuple[int, EntryBatch] | None = None
        # Opens the ledger on the bookies: read from there when the file cannot
        # be read and the bookies' copy is still kept (its deletion lag).
        self._open_bookies = bookies
        self._bookies: Any = None

    @property
    def id(self) -> int:
        return self.record.ledger_id

    @property
    def is_closed(self) -> bool:
        return True

    @property
    def last_add_confirmed(self) -> int:
        return self.record.entries - 1

    def _error(self, problem: str) -> OffloadError:
        record = self.record
        return OffloadError(f"stream {self.stream!r} partition {record.partition} ledger "
                            f"{record.ledger_id}: its offloaded copy {record.url} {problem}")

    def _open(self) -> Any:
        if self._file is not None:
            return self._file
        _, pq, _ = _pyarrow()
        record = self.record
        try:
            fs, path = open_filesystem(record.url)
            parquet = pq.ParquetFile(fs.open_input_file(path), page_checksum_verification=True)
        except FileNotFoundError:
            raise self._error("is missing") from None
        except (OSError, ValueError) as exc:  # ArrowInvalid is a ValueError
            raise self._error(f"cannot be read: {exc}") from None
        raw = parquet.schema_arrow.metadata or {}
        found = {key: raw.get(key.encode(), b"").decode(errors="replace") for key in _META_KEYS}
        expected = {"quorumlog.format": FILE_FORMAT_VERSION, "quorumlog.stream": self.stream,
                    "quorumlog.partition": str(record.partition),
                    "quorumlog.ledger_id": str(record.ledger_id),
                    "quorumlog.entries": str(record.entries)}
        if found != expected or parquet.metadata.num_rows != record.entries:
            raise self._error(f"is not this ledger's file (its metadata says {found}, "
                              f"{parquet.metadata.num_rows} rows)")
        first = 0
        for index in range(parquet.metadata.num_row_groups):
            rows = parquet.metadata.row_group(index).num_rows
            self._groups.append((first, rows))
            first += rows
        self._file = parquet
        return parquet

    def _group(self, index: int) -> EntryBatch:
        if self._cached is not None and self._cached[0] == index:
            return self._cached[1]
        first, rows = self._groups[index]
        try:
            table = self._open().read_row_group(index, columns=["entry_id", "payload"])
        except (OSError, ValueError) as exc:
            raise self._error(f"cannot be read: {exc}") from None
        ids = table.column("entry_id").combine_chunks()
        payload = table.column("payload").combine_chunks()
        if (len(ids) != rows or len(payload) != rows or payload.null_count
                or ids.to_pylist() != list(range(first, first + rows))):
            raise self._error(f"has row group {index} out of order (expected entries "
                              f"{first}..{first + rows - 1})")
        data, starts, ends = _bounds(payload)
        batch = EntryBatch(self.record.ledger_id, first, data, starts, ends)
        self._cached = (index, batch)
        return batch

    def read_raw_sync(self, first: int, last: int) -> list[EntryBatch]:
        """Entries ``first..last`` as batches (the buffers of the row groups read)."""
        self._open()
        if first < 0 or last > self.last_add_confirmed or first > last:
            raise UsageError(f"ledger {self.id} (offloaded) holds entries "
                             f"0..{self.last_add_confirmed}, not {first}..{last}")
        out = []
        for index, (group_first, rows) in enumerate(self._groups):
            if group_first + rows <= first or group_first > last:
                continue
            batch = self._group(index)
            low = max(first, group_first) - group_first
            high = min(last, group_first + rows - 1) - group_first + 1
            out.append(EntryBatch(batch.ledger_id, group_first + low, batch.buffer,
                                  batch.starts[low:high], batch.ends[low:high]))
        return out

    async def read_batch_raw(self, first: int, last: int) -> list[EntryBatch]:
        if self._bookies is not None:
            batches: list[EntryBatch] = await self._bookies.read_batch_raw(first, last)
            return batches
        try:
            return await asyncio.to_thread(self.read_raw_sync, first, last)
        except OffloadError as exc:
            if self._open_bookies is None:
                raise
            try:
                self._bookies = await self._open_bookies()
            except QuorumlogError as gone:  # the bookies' copy is deleted: only the file
                raise OffloadError(f"{exc.message}; the bookies no longer hold it either "
                                   f"({gone.message})") from None
            log.warning("stream_offloaded_copy_unreadable", stream=self.stream,
                        partition=self.record.partition, ledger_id=self.record.ledger_id,
                        url=self.record.url, error=exc.message, reading="bookies")
            batches = await self._bookies.read_batch_raw(first, last)
            return batches

    async def read_batch(self, first: int, last: int) -> list[LedgerEntry]:
        batches = await self.read_batch_raw(first, last)
        return [entry for batch in batches for entry in batch.entries()]

    async def read_entry(self, entry_id: int) -> LedgerEntry:
        [entry] = await self.read_batch(entry_id, entry_id)
        return entry

    async def read_last_add_confirmed(self) -> int:
        return self.last_add_confirmed

    async def wait_for_entry(self, after: int, timeout_ms: int = 1000) -> LedgerEntry | None:
        if after + 1 > self.last_add_confirmed:
            return None  # closed: nothing comes after the last entry
        return await self.read_entry(after + 1)

    async def close(self) -> None:
        self._file, self._cached = None, None
        if self._bookies is not None:
            await self._bookies.close()
            self._bookies = None


def verify_file(record: OffloadRecord, stream: str) -> None:
    """Read the whole file back: row count, entry ids in order, and the CRC32C
    chained over every payload equal to the record's (blocking)."""
    ledger = OffloadedLedger(record, stream)
    crc = 0
    size = 0
    if record.entries:
        for batch in ledger.read_raw_sync(0, record.entries - 1):
            buffer = memoryview(batch.buffer)
            for start, end in zip(batch.starts, batch.ends, strict=True):
                crc = crc32c.crc32c(buffer[start:end], crc)
                size += end - start
    if crc != record.payload_crc32c or size != record.payload_bytes:
        raise ledger._error("does not hold what the bookies held (CRC32C or size differ)")


# ----- meta -----------------------------------------------------------------------------


async def load_offload(meta: MetaClient, stream: str, ledger_id: int) -> OffloadRecord | None:
    kv = await meta.get(offload_key(stream, ledger_id))
    return None if kv is None else OffloadRecord.decode(kv.value)


async def load_offloads(meta: MetaClient, stream: str,
                        ledger_ids: Iterable[int]) -> dict[int, OffloadRecord]:
    """The offload records of these ledgers (the ones offloaded), by id."""
    slots = asyncio.Semaphore(LOOKUPS_IN_FLIGHT_MAX)

    async def one(ledger_id: int) -> OffloadRecord | None:
        async with slots:
            return await load_offload(meta, stream, ledger_id)

    ids = sorted(set(ledger_ids))
    found = await asyncio.gather(*(one(ledger_id) for ledger_id in ids))
    return {ledger_id: rec for ledger_id, rec in zip(ids, found, strict=True) if rec is not None}


async def offloaded_records(meta: MetaClient, stream: str) -> list[OffloadRecord]:
    """Every offload record of the stream, in ledger id order (paged reads)."""
    prefix = offload_prefix(stream)
    end = prefix[:-1] + chr(ord("/") + 1)
    start = prefix
    out: list[OffloadRecord] = []
    while True:
        result, _ = await meta.range(start, end=end, limit=RECORDS_PER_READ)
        out += [OffloadRecord.decode(kv.value) for kv in result.kvs]
        if len(result.kvs) < RECORDS_PER_READ:
            return out
        start = result.kvs[-1].key + "\x00"


async def drop_offloaded(meta: MetaClient, stream: str, ledger_id: int) -> bool:
    """Delete the ledger's offloaded file, then its record; False if it had none."""
    record = await load_offload(meta, stream, ledger_id)
    if record is None:
        return False
    await asyncio.to_thread(delete_file, record.url)
    await meta.txn(success=[DeleteOp(key=offload_key(stream, ledger_id)),
                            DeleteOp(key=offload_pending_key(stream, ledger_id))])
    log.info("stream_offload_dropped", stream=stream, ledger_id=ledger_id, url=record.url)
    return True


# ----- offloading -----------------------------------------------------------------------


@dataclass(slots=True)
class OffloadOutcome:
    """What offloading one ledger did: ``offloaded``; ``already`` (a record
    exists, from an earlier or a concurrent run); ``trimmed`` (retention took
    the ledger meanwhile: the file and record were dropped again); ``failed``
    (the Spark job only: ``error`` says why, the ledger stays on the bookies)."""

    partition: int
    ledger_id: int
    seq: int
    status: str
    entries: int = 0
    payload_bytes: int = 0
    file_bytes: int = 0
    url: str = ""
    error: str = ""  # why it failed (status ``failed``: the Spark job reports, not raises)


async def offload_candidates(client: LedgerClient, record: StreamRecord, *,
                             keep_bytes: int = 0,
                             partitions: Sequence[int] | None = None
                             ) -> list[tuple[int, LedgerInfo]]:
    """The closed ledgers with entries that are not offloaded yet, oldest
    first per partition; per partition the newest closed ledgers holding up to
    ``keep_bytes`` stay on the bookies only (Pulsar's offload size threshold)."""
    if keep_bytes < 0:
        raise UsageError(f"keep_bytes must be 0 or more, not {keep_bytes}")
    chosen = list(range(record.config.partitions)) if partitions is None else list(partitions)
    for partition in chosen:
        if not 0 <= partition < record.config.partitions:
            raise UsageError(f"stream {record.name!r} has no partition {partition}")
    done = {rec.ledger_id for rec in await offloaded_records(client.meta, record.name)}
    out: list[tuple[int, LedgerInfo]] = []
    for partition in chosen:
        ledgers = LedgerList(client.meta, record.name, partition)
        head = await ledgers.refresh()
        closed = [info async for info in ledgers.iterate(head.first_seq)
                  if not info.is_open and info.entries > 0]
        kept = 0
        while closed and kept + closed[-1].size_bytes <= keep_bytes:
            kept += closed.pop().size_bytes
        out += [(partition, info) for info in closed if info.ledger_id not in done]
    return out


async def offload_ledger(client: LedgerClient, record: StreamRecord, partition: int,
                         info: LedgerInfo, target: str, *,
                         deletion_lag_ms: int = DELETION_LAG_MS_DEFAULT) -> OffloadOutcome:
    """Copy one closed ledger to a new Parquet file under ``target``, verify the
    file, then commit its :class:`OffloadRecord` (see the module docstring)."""
    if deletion_lag_ms < 0:
        raise UsageError(f"the deletion lag must be 0 or more ms, not {deletion_lag_ms}")
    meta, stream = client.meta, record.name
    outcome = OffloadOutcome(partition, info.ledger_id, info.seq, "already")
    key = offload_key(stream, info.ledger_id)
    if info.is_open:
        raise UsageError(f"stream {stream!r} ledger {info.ledger_id} is open: only closed "
                         "ledgers are offloaded")
    if await meta.get(key) is not None:
        return outcome
    handle = await client.open_ledger(info.ledger_id, password=record.password,
                                      recovery=False)
    if not handle.is_closed or handle.last_add_confirmed != info.entries - 1:
        raise OffloadError(f"stream {stream!r} ledger {info.ledger_id}: the stream lists "
                           f"{info.entries} entries but the ledger is "
                           f"{'closed' if handle.is_closed else 'open'} at LAC "
                           f"{handle.last_add_confirmed}; not offloaded")
    url = ledger_file_url(normalize_target(target), stream, partition, info.ledger_id)
    metadata = dict(zip(_META_KEYS, (FILE_FORMAT_VERSION, stream, str(partition),
                                     str(info.ledger_id), str(info.entries)), strict=True))
    writer = await asyncio.to_thread(_FileWriter, url, metadata)
    crc, size, first = 0, 0, 0
    chunk = ROW_GROUP_ENTRIES_MAX
    try:
        while first < info.entries:
            last = min(info.entries - 1, first + chunk - 1)
            payloads = [payload for batch in await handle.read_batch_raw(first, last)
                        for payload in batch.payloads()]
            if len(payloads) != last - first + 1:
                raise OffloadError(f"stream {stream!r} ledger {info.ledger_id}: read "
                                   f"{len(payloads)} entries of {first}..{last}", retriable=True)
            for payload in payloads:
                crc = crc32c.crc32c(payload, crc)
                size += len(payload)
            await asyncio.to_thread(writer.write, first, payloads)
            first = last + 1
            average = max(1, size // first)
            chunk = max(1, min(ROW_GROUP_ENTRIES_MAX, ROW_GROUP_BYTES_MAX // average))
        await asyncio.to_thread(writer.close)
        offloaded = OffloadRecord(
            ledger_id=info.ledger_id, partition=partition, seq=info.seq, url=url,
            entries=info.entries, payload_bytes=size, payload_crc32c=crc,
            offloaded_ms=client.clock.wall_ms(),
            delete_after_ms=client.clock.wall_ms() + deletion_lag_ms)
        await asyncio.to_thread(verify_file, offloaded, stream)
        file_bytes = await asyncio.to_thread(_file_size, url)
    except BaseException:
        await asyncio.to_thread(writer.abort)
        raise
    result = await meta.txn(compares=[version_is(key, 0)],
                            success=[PutOp(key=key, value=offloaded.encode()),
                                     PutOp(key=offload_pending_key(stream, info.ledger_id),
                                           value=b"")])
    if not result.succeeded:  # another run offloaded it first: its file stays
        await asyncio.to_thread(delete_file, url)
        return outcome
    if not await _still_listed(meta, stream, partition, info):
        await drop_offloaded(meta, stream, info.ledger_id)
        outcome.status = "trimmed"
        return outcome
    log.info("stream_ledger_offloaded", stream=stream, partition=partition,
             ledger_id=info.ledger_id, entries=info.entries, url=url)
    outcome.status, outcome.entries, outcome.payload_bytes = "offloaded", info.entries, size
    outcome.file_bytes, outcome.url = file_bytes, url
    return outcome


def _file_size(url: str) -> int:
    fs, path = open_filesystem(url)
    return int(fs.get_file_info(path).size or 0)


async def _still_listed(meta: MetaClient, stream: str, partition: int, info: LedgerInfo) -> bool:
    """Whether the partition still keeps the ledger, read after the record was
    written: if trimming took it before that read, this run drops the record it
    wrote; if after, the trim's trash finds the record and drops it."""
    try:
        current = await LedgerList(meta, stream, partition).get(info.seq)
    except QuorumlogError as exc:
        if exc.retriable:
            raise
        return False  # the stream is gone
    return current is not None and current.ledger_id == info.ledger_id


# ----- orphans --------------------------------------------------------------------------


def _list_files(base: str) -> list[tuple[str, int]]:
    """(url, mtime in ms) of every offload file under ``base`` (blocking)."""
    _, _, pafs = _pyarrow()
    fs, path = open_filesystem(base)
    try:
        infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    except OSError as exc:
        raise OffloadError(f"cannot list the offload target {base}: {exc}",
                           retriable=True) from None
    out = []
    for info in infos:
        # Only files named as offload_ledger names them: a target may be shared
        # with other data (a lake's bucket), which a sweep must never touch.
        if info.type == pafs.FileType.File and _OWN_FILE.fullmatch(info.path[len(path):]):
            mtime_ms = int(info.mtime.timestamp() * 1000) if info.mtime is not None else 0
            out.append((base + info.path[len(path):], mtime_ms))
    return out


async def sweep_orphans(meta: MetaClient, stream: str, target: str, now_ms: int, *,
                        older_than_ms: int = ORPHAN_AGE_MS_DEFAULT) -> list[str]:
    """Delete the stream's Parquet files under ``target`` that no offload record
    names and that are older than ``older_than_ms``; their urls. A file's
    ledger record is read again just before it goes, so a file committed
    since the listing stays."""
    base = f"{normalize_target(target)}/{stream}"
    files = await asyncio.to_thread(_list_files, base)
    if not files:
        return []
    named = {record.url for record in await offloaded_records(meta, stream)}
    gone = []
    for url, mtime_ms in files:
        if url in named or now_ms - mtime_ms < older_than_ms:
            continue
        ledger = url.rsplit("/", 1)[-1].split("-", 1)[0]
        if ledger.isdigit():
            current = await load_offload(meta, stream, int(ledger))
            if current is not None and current.url == url:
                continue
        await asyncio.to_thread(delete_file, url)
        log.info("stream_offload_orphan_deleted", stream=stream, url=url)
        gone.append(url)
    return gone


async def offload_by_policy(client: LedgerClient, record: StreamRecord, *,
                            ledgers_max: int) -> list[OffloadOutcome]:
    """One round of the stream's automatic offload (its :class:`OffloadPolicy`;
    nothing when the policy is off): at most ``ledgers_max`` of the ledgers past
    the threshold, oldest first, taking the partitions in turn; then the files
    of runs that died before their commit are swept (once an hour old)."""
    policy = record.config.offload
    if not policy.enabled:
        return []
    target = await asyncio.to_thread(normalize_target, policy.target)
    todo = await offload_candidates(client, record, keep_bytes=policy.threshold_bytes)
    turn: dict[int, int] = {}
    ranked = []
    for partition, info in todo:  # oldest first within each partition
        turn[partition] = turn.get(partition, -1) + 1
        ranked.append((turn[partition], partition, info))
    ranked.sort(key=lambda item: (item[0], item[1]))
    out = [await offload_ledger(client, record, partition, info, target,
                                deletion_lag_ms=policy.deletion_lag_ms)
           for _, partition, info in ranked[:ledgers_max]]
    await sweep_orphans(client.meta, record.name, target, client.clock.wall_ms())
    return out
