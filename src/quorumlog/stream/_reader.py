"""Reading a stream partition: start positions, ledger walking, tailing.

A :class:`PartitionReader` walks the partition's ledger list from a start
position: closed ledgers are read to their recorded end, the open ledger up
to its LAC (never past it), then it waits: a long-poll on the bookies for the
next entry of the open ledger, or a watch on the partition's head for a new
ledger. It looks ledgers up one at a time (:class:`LedgerList`: the head, or
one archive run), never loading the whole list.
Start positions: a :class:`Position` (or a :class:`SeqPosition`, found
without a search), ``"earliest"``, ``"latest"``, or a publish time (first
message published at or after it: a binary search over the ledgers' running
maximum of publish times, then over the entries of one ledger).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import msgspec
import quorumlog_native

from quorumlog.errors import QuorumlogError, UsageError
from quorumlog.ledger import EntryBatch, LedgerClient
from quorumlog.log import get_logger
from quorumlog.stream._entry import (
    BATCH_MESSAGES_MAX,
    ENTRY_PREFIX_WORD,
    decode_entry,
    decode_properties,
    first_publish_time_ms,
)
from quorumlog.stream._errors import BadPositionError, DataLossError, MessageFormatError
from quorumlog.stream._layout import (
    CompactionRecord,
    LedgerInfo,
    PartitionHead,
    StreamRecord,
    compaction_key,
    partition_key,
)
from quorumlog.stream._ledgers import LedgerList
from quorumlog.stream._meta import watch_key_once
from quorumlog.stream._metrics import stream_metrics
from quorumlog.stream._offload import OffloadedLedger, load_offload
from quorumlog.stream._position import EARLIEST, LATEST, Position, SeqPosition
from quorumlog.stream._retention import EntrySearch

log = get_logger(__name__)

READ_BATCH_ENTRIES = 256  # entries per bookie read while catching up
TAIL_POLL_MS = 500  # one long-poll (bookie LAC or meta watch) while tailing
HANDLES_MAX = 16  # cached ledger read handles per reader
COMPACTED_READ_CHUNKS = 16  # chunks (a positions entry and a messages entry each) per read

# A position, "earliest" / "latest", or a publish time in ms.
StartSpec = Position | SeqPosition | str | int


class Message(msgspec.Struct, frozen=True, gc=False):
    """A message read from a stream.

    A msgspec Struct left out of the garbage collector (its fields are ids,
    bytes and a str -> str mapping: no cycle possible): a reader makes one per
    message, and as a frozen dataclass each cost 1 µs to build and one more
    tracked object for the collector while the caller holds it.
    """

    stream: str
    partition: int
    position: Position
    seq: int  # the ledger's place in the partition (orders positions)
    publish_time_ms: int
    key: bytes | None
    properties: Mapping[str, str]
    value: bytes
    batch_size: int = 1
    # How many times a consumer delivered this message again (a negative
    # acknowledgement or an acknowledgement timeout; Pulsar's redeliveryCount).
    redelivery_count: int = 0

    @property
    def seq_position(self) -> SeqPosition:
        return SeqPosition(self.seq, self.position.entry_id, self.position.batch_index,
                           self.position.ledger_id)


class LedgerHandles:
    """Read handles of a stream's ledgers, bounded LRU: a closed ledger that
    was offloaded (tiered storage) is read from its Parquet file
    (:class:`OffloadedLedger`; from the bookies instead when the file cannot be
    read and the bookies still hold the ledger), any other one from the
    bookies (opened without recovery)."""

    def __init__(self, client: LedgerClient, record: StreamRecord) -> None:
        self._client = client
        self._password = record.password
        self._stream = record.name
        self._handles: dict[int, Any] = {}

    async def get(self, info: LedgerInfo) -> Any:
        handle = self._handles.pop(info.ledger_id, None)
        if handle is not None and not info.is_open and not handle.is_closed:
            handle = None  # it closed since: open again for its final LAC
        if handle is None and not info.is_open:
            offloaded = await load_offload(self._client.meta, self._stream, info.ledger_id)
            if offloaded is not None:
                ledger_id = info.ledger_id
                handle = OffloadedLedger(offloaded, self._stream,
                                         bookies=lambda: self._open_bookies(ledger_id))
        if handle is None:
            handle = await self._client.open_ledger(info.ledger_id, password=self._password,
                                                    recovery=False)
        self._handles[info.ledger_id] = handle
        while len(self._handles) > HANDLES_MAX:
            self._handles.pop(next(iter(self._handles)))
        return handle

    async def _open_bookies(self, ledger_id: int) -> Any:
        return await self._client.open_ledger(ledger_id, password=self._password,
                                              recovery=False)

    def forget(self, ledger_id: int) -> None:
        self._handles.pop(ledger_id, None)


def decode_messages(stream: str, partition: int, info: LedgerInfo, entries: list[Any], *,
                    start: SeqPosition | None, skip_before_ms: int) -> list[Message]:
    out: list[Message] = []
    append = out.append
    ledger_id, seq = info.ledger_id, info.seq
    for entry in entries:
        entry_id = entry.entry_id
        decoded = decode_entry(bytes(entry.payload))
        count = len(decoded)
        for message in decoded:
            if start is not None and (seq, entry_id, message.batch_index) < start.key:
                continue
            if message.publish_time_ms < skip_before_ms:
                continue
            append(Message(stream, partition, Position(ledger_id, entry_id, message.batch_index),
                           seq, message.publish_time_ms, message.key, message.properties,
                           message.value, count))
    return out


def decode_batch_messages(stream: str, partition: int, info: LedgerInfo,
                          batches: list[EntryBatch], *, start: SeqPosition | None,
                          skip_before_ms: int) -> list[Message]:
    """:func:`decode_messages` of entry batches read in bulk: each batch's
    entries are checked and cut into columns in one C pass
    (``quorumlog_native.stream_columns``), and Python only builds the
    messages. A batch that breaks the format goes through
    :func:`decode_messages`, which raises MessageFormatError naming the entry."""
    out: list[Message] = []
    append = out.append
    ledger_id, seq = info.ledger_id, info.seq
    for batch in batches:
        columns = quorumlog_native.stream_columns(batch.buffer, batch.starts, batch.ends,
                                                  ENTRY_PREFIX_WORD, BATCH_MESSAGES_MAX)
        if columns is None:
            out += decode_messages(stream, partition, info, batch.entries(), start=start,
                                   skip_before_ms=skip_before_ms)
            continue
        (rows, entry_pos, batch_index, publish, key_valid, key_offsets, key_data,
         value_offsets, value_data, props_start, props_length, props_any) = columns
        entries = memoryview(entry_pos).cast("i").tolist()
        indexes = memoryview(batch_index).cast("i").tolist()
        publish_ms = memoryview(publish).cast("q").tolist()
        key_at = memoryview(key_offsets).cast("i").tolist()
        value_at = memoryview(value_offsets).cast("i").tolist()
        props_at = memoryview(props_start).cast("i").tolist() if props_any else None
        props_bytes = memoryview(props_length).cast("i").tolist() if props_any else None
        sizes = [0] * len(batch)
        for entry in entries:
            sizes[entry] += 1
        first = batch.first_entry_id
        view = memoryview(batch.buffer)
        for row in range(rows):
            entry_id, index = first + entries[row], indexes[row]
            if start is not None and (seq, entry_id, index) < start.key:
                continue
            if publish_ms[row] < skip_before_ms:
                continue
            key = (key_data[key_at[row]:key_at[row + 1]]
                   if key_valid[row >> 3] >> (row & 7) & 1 else None)
            properties: dict[str, str] = {}
            if props_bytes is not None and props_at is not None and props_bytes[row]:
                at = props_at[row]
                properties = decode_properties(view[at:at + props_bytes[row]])
            append(Message(stream, partition, Position(ledger_id, entry_id, index), seq,
                           publish_ms[row], key, properties,
                           value_data[value_at[row]:value_at[row + 1]],
                           sizes[entries[row]]))
    return out


_COMPACTED_POSITIONS = msgspec.msgpack.Decoder(list[tuple[int, int, int, int, int]])


def decode_compacted_chunk(stream: str, partition: int, positions: bytes,
                           messages: bytes) -> list[Message]:
    """The messages of one chunk of a compacted ledger: a positions entry (msgpack
    ``[[seq, ledger_id, entry_id, batch_index, batch_size], ...]``, each
    message's place in the partition's own ledgers) and a messages entry (the
    stream entry format, the same messages in the same order)."""
    try:
        places = _COMPACTED_POSITIONS.decode(positions)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise MessageFormatError(f"compacted ledger of {stream!r} partition {partition}: "
                                 f"bad positions entry: {exc}") from None
    decoded = decode_entry(messages)
    if len(places) != len(decoded):
        raise MessageFormatError(
            f"compacted ledger of {stream!r} partition {partition}: {len(places)} positions "
            f"for {len(decoded)} messages")
    return [Message(stream, partition, Position(ledger_id, entry_id, batch_index), seq,
                    message.publish_time_ms, message.key, message.properties, message.value,
                    batch_size)
            for (seq, ledger_id, entry_id, batch_index, batch_size), message
            in zip(places, decoded, strict=True)]


async def load_compaction(client: LedgerClient, stream: str,
                          partition: int) -> CompactionRecord | None:
    """The partition's compaction record, if it was ever compacted."""
    kv = await client.meta.get(compaction_key(stream, partition))
    if kv is None:
        return None
    record = CompactionRecord.decode(kv.value)
    return record if record.ledger_id else None


async def resolve_start(client: LedgerClient, handles: LedgerHandles, record: StreamRecord,
                        partition: int, spec: StartSpec, *,
                        ledgers: LedgerList | None = None) -> tuple[SeqPosition, int]:
    """The first position to read for ``spec``, and a publish time to skip before."""
    if ledgers is None:
        ledgers = LedgerList(client.meta, record.name, partition)
    head = ledgers.head if ledgers.loaded else await ledgers.refresh()
    if spec == EARLIEST:
        return await first_position(ledgers), 0
    if spec == LATEST:
        return await end_position(handles, head), 0
    if isinstance(spec, SeqPosition):
        info = await ledgers.get(spec.seq)
        if info is not None and info.ledger_id == spec.ledger_id:
            return spec, 0
        spec = spec.position
    if isinstance(spec, Position):
        found = await ledgers.find(spec.ledger_id)
        if found is None:
            raise BadPositionError(
                f"stream {record.name!r} partition {partition} has no ledger {spec.ledger_id} "
                "(trimmed, or never part of this partition)"
            )
        return SeqPosition(found.seq, spec.entry_id, spec.batch_index, found.ledger_id), 0
    if isinstance(spec, int) and not isinstance(spec, bool):
        return await _seek_time(handles, ledgers, spec), spec
    raise UsageError(f"a start position is a Position, 'earliest', 'latest' or a publish time "
                     f"in ms, got {spec!r}")


async def first_position(ledgers: LedgerList) -> SeqPosition:
    """The position of the first message kept (where "earliest" starts)."""
    head = ledgers.head if ledgers.loaded else await ledgers.refresh()
    info = await ledgers.get(head.first_seq)
    return SeqPosition(head.first_seq, 0, 0, info.ledger_id if info else 0)


async def end_position(handles: LedgerHandles, head: PartitionHead) -> SeqPosition:
    """The position after the last readable message (where "latest" starts)."""
    last = head.last_ledger
    if last is None:
        return SeqPosition(head.next_seq, 0, 0, 0)
    if not last.is_open:
        return SeqPosition(last.seq, last.entries, 0, last.ledger_id)
    handle = await handles.get(last)
    lac = int(await handle.read_last_add_confirmed())
    return SeqPosition(last.seq, lac + 1, 0, last.ledger_id)


async def _seek_time(handles: LedgerHandles, ledgers: LedgerList,
                     publish_ms: int) -> SeqPosition:
    info = await ledgers.first_at_publish(publish_ms)
    if info is None:
        return await end_position(handles, ledgers.head)
    handle = await handles.get(info)
    last_entry = info.entries - 1
    if info.is_open:
        last_entry = int(await handle.read_last_add_confirmed())
    if last_entry < 0:
        return SeqPosition(info.seq, 0, 0, info.ledger_id)
    search = EntrySearch(0, last_entry, publish_ms)
    while (probe := search.probe()) is not None:
        [entry] = await handle.read_batch(probe, probe)
        search.feed(probe, first_publish_time_ms(bytes(entry.payload)))
    return SeqPosition(info.seq, search.result, 0, info.ledger_id)


# Before every message of a partition: with a compacted view, "earliest" starts
# here, at the view's first message (whose ledger retention may have trimmed).
VIEW_START = SeqPosition(0, 0, 0, 0)


async def past_view(ledgers: LedgerList, compaction: CompactionRecord) -> SeqPosition:
    """Where a read goes on after a compacted view: just after its horizon; or,
    when retention has trimmed the horizon's ledger since and nothing after the
    horizon went with it, at the first ledger kept (a read from just after the
    horizon would report data loss that is not there)."""
    after = SeqPosition(compaction.horizon_seq, compaction.horizon_entry + 1, 0,
                        compaction.horizon_ledger)
    if compaction.horizon_offset < 0:
        return after
    head = await ledgers.refresh()
    if after.seq >= head.first_seq:
        return after
    first = await ledgers.get(head.first_seq)
    starts_at = head.trimmed_entries if first is None else first.entries_before
    if starts_at != compaction.horizon_offset:
        return after  # entries after the horizon were trimmed: the read reports it
    return SeqPosition(head.first_seq, 0, 0, 0 if first is None else first.ledger_id)


class PartitionReader:
    """Reads one partition in order from a start position; tails the open ledger."""

    def __init__(self, client: LedgerClient, record: StreamRecord, partition: int,
                 start: SeqPosition, *, skip_before_ms: int = 0, skip_data_loss: bool = False,
                 handles: LedgerHandles | None = None, ledgers: LedgerList | None = None,
                 compacted: CompactionRecord | None = None) -> None:
        """``compacted``: read the compacted view (Pulsar's ``readCompacted``) up to
        its horizon when the start is at or before it, then the ledgers after it."""
        self._client = client
        self._record = record
        self.stream = record.name
        self.partition = partition
        self._seq = start.seq
        self._entry = start.entry_id
        self._start: SeqPosition | None = start if start.batch_index else None
        self._skip_before_ms = skip_before_ms
        self._skip_data_loss = skip_data_loss
        self._handles = handles or LedgerHandles(client, record)
        self._ledgers = ledgers or LedgerList(client.meta, record.name, partition)
        self._lac: dict[int, int] = {}
        self._metrics = stream_metrics(record.name)
        self._compacted: CompactionRecord | None = None
        self._compacted_handle: Any = None
        self._compacted_entry = 0  # next entry of the compacted ledger to read
        self._compacted_from = start.key  # deliver compacted messages at or after this
        if compacted is not None and compacted.ledger_id and \
                (start.seq, start.entry_id) <= compacted.horizon_key:
            self._compacted = compacted

    @property
    def next_position(self) -> tuple[int, int]:
        """(seq, entry_id) of the next entry to read."""
        return (self._seq, self._entry)

    async def next_batch(self, wait_ms: int = 0) -> list[Message]:
        """The next messages in order; [] if none arrived within ``wait_ms``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        ledgers = self._ledgers
        while self._compacted is not None:
            compacted = await self._read_compacted()
            if compacted:
                return compacted
        if not ledgers.loaded:
            await ledgers.refresh()
        while True:
            info = await ledgers.get(self._seq)
            if info is None:
                if self._seq < ledgers.head.first_seq:
                    self._data_loss(ledgers.head)
                    continue
                head = await ledgers.refresh()
                if self._seq < head.next_seq:
                    continue
                remaining = int((deadline - loop.time()) * 1000)
                if remaining <= 0:
                    return []
                await watch_key_once(
                    self._client.meta, partition_key(self.stream, self.partition),
                    start_revision=ledgers.revision + 1,
                    wait_ms=min(remaining, TAIL_POLL_MS))
                await ledgers.refresh()
                continue
            if not info.is_open:
                if self._entry >= info.entries:
                    self._seq += 1
                    self._entry = 0
                    self._handles.forget(info.ledger_id)
                    continue
                last = min(info.entries - 1, self._entry + READ_BATCH_ENTRIES - 1)
                messages = await self._read(info, last)
                if messages:
                    return messages
                continue
            batch = await self._read_open(info, deadline)
            if batch is None:
                await ledgers.refresh()
                if loop.time() >= deadline and (
                        (now := await ledgers.get(self._seq)) is None or now.is_open):
                    return []
                continue
            if batch:
                return batch

    async def _read_compacted(self) -> list[Message]:
        """The next chunks of the compacted ledger (at or after the start); at its
        end, go on in the partition's ledgers after the horizon ([] then)."""
        record = self._compacted
        assert record is not None
        last = record.entries - 1
        if self._compacted_entry > last:
            # Everything up to the horizon came from the compacted view.
            self._compacted, self._compacted_handle = None, None
            resume = await past_view(self._ledgers, record)
            if (self._seq, self._entry) < (resume.seq, resume.entry_id):
                self._seq, self._entry = resume.seq, resume.entry_id
                self._start = None
            return []
        first = self._compacted_entry
        upto = min(last, first + 2 * COMPACTED_READ_CHUNKS - 1)
        try:
            if self._compacted_handle is None:
                self._compacted_handle = await self._client.open_ledger(
                    record.ledger_id, password=self._record.password, recovery=False)
            entries = await self._compacted_handle.read_batch(first, upto)
        except QuorumlogError:
            # A newer compaction replaced (and deleted) this compacted ledger
            # while it was read: go on in the new one, from where this stopped
            # (its messages carry their positions, so none comes twice).
            newer = await load_compaction(self._client, self.stream, self.partition)
            if newer is None or newer.ledger_id == record.ledger_id:
                raise
            log.info("stream_compacted_ledger_replaced", stream=self.stream,
                     partition=self.partition, old=record.ledger_id, new=newer.ledger_id)
            self._compacted, self._compacted_handle = newer, None
            self._compacted_entry = 0
            return []
        complete = len(entries) - len(entries) % 2
        if complete == 0:
            raise QuorumlogError(f"compacted ledger {record.ledger_id}: empty read of entries "
                                 f"{first}..{upto}", retriable=True)
        out: list[Message] = []
        start = self._compacted_from
        for index in range(0, complete, 2):
            chunk = decode_compacted_chunk(self.stream, self.partition,
                                           bytes(entries[index].payload),
                                           bytes(entries[index + 1].payload))
            out.extend(m for m in chunk
                       if (m.seq, m.position.entry_id, m.position.batch_index) >= start)
        self._compacted_entry = int(entries[complete - 1].entry_id) + 1
        if out:
            last_message = out[-1]
            self._compacted_from = (last_message.seq, last_message.position.entry_id,
                                    last_message.position.batch_index + 1)
        self._after_read(out)
        return out

    @property
    def in_compacted_view(self) -> bool:
        """True while the next messages come from the compacted view."""
        return self._compacted is not None

    async def next_compacted_batch(self) -> list[Message]:
        """The next messages of the compacted view ([] at a chunk boundary, or once
        it is over: ``in_compacted_view`` then turns false)."""
        return await self._read_compacted() if self._compacted is not None else []

    def _data_loss(self, head: PartitionHead) -> None:
        message = (f"stream {self.stream!r} partition {self.partition}: the next ledger to read "
                   f"(seq {self._seq}) was trimmed; the partition now starts at seq "
                   f"{head.first_seq}")
        if not self._skip_data_loss:
            raise DataLossError(message)
        log.warning("stream_data_loss_skipped", stream=self.stream, partition=self.partition,
                    from_seq=self._seq, to_seq=head.first_seq)
        self._seq, self._entry, self._start = head.first_seq, 0, None

    async def _read(self, info: LedgerInfo, last: int) -> list[Message]:
        handle = await self._handles.get(info)
        try:
            batches = await handle.read_batch_raw(self._entry, last)
        except QuorumlogError:
            # A handle opened on the bookies before the ledger was offloaded, whose
            # bookie copy was deleted since (the deletion lag passed mid-read):
            # go on from the Parquet copy, if there is one.
            if info.is_open or isinstance(handle, OffloadedLedger):
                raise
            self._handles.forget(info.ledger_id)
            handle = await self._handles.get(info)
            if not isinstance(handle, OffloadedLedger):
                raise
            batches = await handle.read_batch_raw(self._entry, last)
        batches = [batch for batch in batches if len(batch)]
        if not batches:
            raise QuorumlogError(f"ledger {info.ledger_id}: empty read of entries "
                                 f"{self._entry}..{last}", retriable=True)
        messages = decode_batch_messages(self.stream, self.partition, info, batches,
                                         start=self._start, skip_before_ms=self._skip_before_ms)
        self._entry = batches[-1].last_entry_id + 1
        self._after_read(messages)
        return messages

    def _after_read(self, messages: list[Message]) -> None:
        metrics = self._metrics
        metrics.out_messages += len(messages)
        metrics.out_bytes += sum(len(message.value) for message in messages)
        self._start = None
        if messages and self._skip_before_ms:
            self._skip_before_ms = 0  # publish times do not decrease inside a ledger

    async def _read_open(self, info: LedgerInfo, deadline: float) -> list[Message] | None:
        """Read up to the LAC of the open ledger; None when waiting timed out."""
        handle = await self._handles.get(info)
        lac = self._lac.get(info.ledger_id, -1)
        if self._entry > lac:
            lac = max(lac, int(await handle.read_last_add_confirmed()))
            self._lac[info.ledger_id] = lac
        if self._entry <= lac:
            return await self._read(info, min(lac, self._entry + READ_BATCH_ENTRIES - 1))
        loop = asyncio.get_running_loop()
        remaining = int((deadline - loop.time()) * 1000)
        entry = await handle.wait_for_entry(after=self._entry - 1,
                                            timeout_ms=max(1, min(remaining, TAIL_POLL_MS)))
        if entry is None:
            return None
        self._lac[info.ledger_id] = max(lac, int(entry.entry_id))
        if int(entry.entry_id) != self._entry:
            return []  # read the range normally on the next turn
        messages = decode_messages(self.stream, self.partition, info, [entry],
                                   start=self._start, skip_before_ms=self._skip_before_ms)
        self._entry += 1
        self._after_read(messages)
        return messages

    def skip_to(self, position: SeqPosition) -> None:
        self._seq, self._entry = position.seq, position.entry_id
        self._start = position if position.batch_index else None


async def compacted_view(client: LedgerClient, record: StreamRecord, partition: int,
                         compaction: CompactionRecord, start: SeqPosition = VIEW_START
                         ) -> AsyncGenerator[list[Message], None]:
    """The messages of a partition's compacted view at or after ``start``, chunk by
    chunk, and nothing after its horizon (the Spark source's ``readCompacted``).
    A newer compaction that replaces the view meanwhile is read on from where
    this one stopped, up to its own (later) horizon."""
    reader = PartitionReader(client, record, partition, start, compacted=compaction)
    while reader.in_compacted_view:
        batch = await reader.next_compacted_batch()
        if batch:
            yield batch


class Reader:
    """Position-based reads of one stream (every partition or chosen ones).

    ``async for message in reader`` tails forever; ``read_next(wait_ms)``
    returns None when nothing arrived in time. Each partition is read by its
    own task into a bounded queue; messages of one partition keep their order.
    """

    def __init__(self, parts: list[PartitionReader], *, queue_batches_max: int = 0) -> None:
        self._parts = parts
        self._buffer: list[Message] = []
        self._queue: asyncio.Queue[list[Message] | BaseException] = asyncio.Queue(
            queue_batches_max or 2 * len(parts) + 2)
        self._tasks: dict[PartitionReader, asyncio.Task[None]] = {}
        self._started = False
        self._paused: asyncio.Event = asyncio.Event()
        self._paused.set()

    @classmethod
    async def open(cls, client: LedgerClient, record: StreamRecord,
                   start: StartSpec | Mapping[int, StartSpec] = EARLIEST, *,
                   partitions: list[int] | None = None, skip_data_loss: bool = False,
                   read_compacted: bool = False) -> Reader:
        chosen = partitions if partitions is not None else list(range(record.config.partitions))
        parts = []
        for partition in chosen:
            if not 0 <= partition < record.config.partitions:
                raise UsageError(f"stream {record.name!r} has no partition {partition}")
            spec = start.get(partition, EARLIEST) if isinstance(start, Mapping) else start
            handles = LedgerHandles(client, record)
            ledgers = LedgerList(client.meta, record.name, partition)
            compacted = (await load_compaction(client, record.name, partition)
                         if read_compacted else None)
            if compacted is not None and spec == EARLIEST:
                # The compacted view outlives the ledgers it was read from
                # (retention may have trimmed them): earliest starts in it.
                position, skip_ms = VIEW_START, 0
            elif (compacted is not None and isinstance(spec, SeqPosition)
                  and (spec.seq, spec.entry_id) <= compacted.horizon_key):
                # A message of the view (its seq_position): its ledger may be gone.
                position, skip_ms = spec, 0
            else:
                position, skip_ms = await resolve_start(client, handles, record, partition,
                                                        spec, ledgers=ledgers)
            parts.append(PartitionReader(client, record, partition, position,
                                         skip_before_ms=skip_ms, skip_data_loss=skip_data_loss,
                                         handles=handles, ledgers=ledgers, compacted=compacted))
        return cls(parts)

    def _start(self) -> None:
        if not self._started:
            self._started = True
            for part in self._parts:
                self._tasks[part] = asyncio.get_running_loop().create_task(self._run(part))

    def add(self, part: PartitionReader) -> None:
        """Read one more partition (a failover consumer given a partition)."""
        self._parts.append(part)
        if self._started:
            self._tasks[part] = asyncio.get_running_loop().create_task(self._run(part))

    async def remove(self, partition: int) -> None:
        """Stop reading ``partition`` and drop what was fetched of it and not yet
        returned (a failover consumer handing the partition over): a reader of it
        added later starts clean, with nothing of this one queued before it."""
        gone = [part for part in self._parts if part.partition == partition]
        self._parts = [part for part in self._parts if part.partition != partition]
        tasks = [task for part in gone if (task := self._tasks.pop(part, None)) is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._buffer = [m for m in self._buffer if m.partition != partition]
        kept = []
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if isinstance(item, BaseException) or not item or item[0].partition != partition:
                kept.append(item)
        for item in kept:  # no await in between: room for each, as before the drain
            self._queue.put_nowait(item)

    async def _run(self, part: PartitionReader) -> None:
        try:
            while True:
                await self._paused.wait()
                batch = await part.next_batch(TAIL_POLL_MS)
                if batch:
                    await self._queue.put(batch)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # handed to the reader of the queue
            await self._queue.put(exc)

    def pause(self, paused: bool) -> None:
        """Stop (or resume) fetching; what is fetched already is still returned."""
        if paused:
            self._paused.clear()
        else:
            self._paused.set()

    async def read_next(self, wait_ms: int = TAIL_POLL_MS) -> Message | None:
        if not self._buffer:
            batch = await self.read_batch(wait_ms)
            self._buffer = list(reversed(batch))
        return self._buffer.pop() if self._buffer else None

    async def read_batch(self, wait_ms: int = TAIL_POLL_MS) -> list[Message]:
        if self._buffer:
            out, self._buffer = list(reversed(self._buffer)), []
            return out
        self._start()
        try:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the
            # result when the caller is cancelled just as the get completes,
            # and the cancellation is lost (a consumer task that never stops).
            async with asyncio.timeout(wait_ms / 1000):
                item = await self._queue.get()
        except TimeoutError:
            return []
        if isinstance(item, BaseException):
            raise item
        return item

    def __aiter__(self) -> Reader:
        return self

    async def __anext__(self) -> Message:
        while True:
            message = await self.read_next()
            if message is not None:
                return message

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks = {}

    async def __aenter__(self) -> Reader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def partition_readers(self) -> list[PartitionReader]:
        return list(self._parts)
