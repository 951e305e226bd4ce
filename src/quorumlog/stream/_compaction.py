"""Topic compaction: the latest message of every key (Pulsar's ``topics compact``).

A stream used as a changelog (the state of each key, like a Pulsar topic read
with ``readCompacted`` or through a ``TableView``) needs only the last
message of each key to rebuild its state, whatever retention removed since.
:func:`compact_partition` writes that view to a **compacted ledger** of the
partition, in two passes as Pulsar's ``TwoPhaseCompactor`` does, so that only
keys and positions (not values) are held in memory:

1. read the previous compacted ledger (if any), then the partition's messages
   from after its horizon up to the last readable entry, and keep, for each
   key, the position of its latest message;
2. read the same again and write to a new ledger every message that is its
   key's latest, unless its value is empty (a **tombstone**: the key is
   removed from the view), and every message without a key (left alone, as
   Pulsar's documentation says).

The new ledger is named in the partition's :class:`CompactionRecord` (before
its first entry as ``pending_ledger_id``, so that the ledger of a run that
dies is deleted by the next run or by the stream's delete), then committed
with the horizon (the last entry read) by a compare-and-swap, and the
previous compacted ledger is deleted. Two runs at once: the second one's
compare-and-swap fails and it deletes its ledger
(:class:`CompactionConflictError`).

The compacted ledger is read in chunks: a positions entry (msgpack
``[[seq, ledger_id, entry_id, batch_index, batch_size], ...]``) then a
messages entry (the stream entry format, the same messages): every message
keeps its position, and a messages entry is never larger than the entries
its messages came from (each fits alone, as it did when produced).
Readers with ``read_compacted`` read it up to the horizon, then the
partition's ledgers after it (``PartitionReader``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec

from quorumlog.errors import QuorumlogError
from quorumlog.ledger import LedgerClient
from quorumlog.log import get_logger
from quorumlog.stream._entry import OutgoingMessage, checked_message_bytes, encode_entry
from quorumlog.stream._errors import StreamError
from quorumlog.stream._layout import (
    LEDGER_META_COMPACTED,
    LEDGER_META_PARTITION,
    LEDGER_META_STREAM,
    CompactionRecord,
    StreamRecord,
    compaction_key,
    compaction_prefix,
)
from quorumlog.stream._ledgers import LedgerList
from quorumlog.stream._position import SeqPosition
from quorumlog.stream._reader import (
    COMPACTED_READ_CHUNKS,
    LedgerHandles,
    Message,
    PartitionReader,
    decode_compacted_chunk,
    end_position,
    first_position,
)

log = get_logger(__name__)

CHUNK_MESSAGES_MAX = 1000  # messages per chunk of the compacted ledger
CHUNK_BYTES_MAX = 1024 * 1024  # message bytes per chunk (one message may exceed it alone)
SCAN_WAIT_MS = 200  # one wait of a scan for entries it knows are there
SCAN_STALL_MS = 30_000  # a scan that gets nothing for this long fails (retriable)


class CompactionConflictError(StreamError):
    """Another compaction of the partition committed first; run it again."""

    retriable = True


class CompactionOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What one partition's compaction did."""

    partition: int
    compacted: bool  # False: nothing new since the last compaction
    ledger_id: int  # the compacted ledger now (0: none)
    previous_ledger_id: int
    horizon: SeqPosition | None  # the last entry covered
    read: int  # messages read in the first pass (the previous view's included)
    kept: int  # messages in the compacted ledger
    keys: int
    tombstones: int  # keys removed by an empty value
    payload_bytes: int


async def compaction_records(client: LedgerClient, record: StreamRecord
                             ) -> dict[int, CompactionRecord]:
    """Every partition's compaction record (compacted or with a pending ledger)."""
    prefix = compaction_prefix(record.name)
    return {int(kv.key[len(prefix):]): CompactionRecord.decode(kv.value)
            for kv in await client.meta.list_keys(prefix)}


async def compact_partition(
    client: LedgerClient, record: StreamRecord, partition: int, *,
    progress: Callable[[int], None] | None = None,
) -> CompactionOutcome:
    """Compact one partition (module docstring); ``progress(messages)`` after each
    batch read, in both passes."""
    meta, key = client.meta, compaction_key(record.name, partition)
    kv = await meta.get(key)
    current = CompactionRecord.decode(kv.value) if kv is not None else CompactionRecord()
    version = kv.version if kv is not None else 0
    if current.pending_ledger_id:  # the ledger of a run that died before its commit
        await delete_stream_ledger(client, current.pending_ledger_id)
        current = msgspec.structs.replace(current, pending_ledger_id=0)
        version = await _cas(client, key, version, current)

    ledgers = LedgerList(meta, record.name, partition)
    head = await ledgers.refresh()
    handles = LedgerHandles(client, record)
    end = await end_position(handles, head)
    if current.ledger_id:
        start = SeqPosition(current.horizon_seq, current.horizon_entry + 1, 0, 0)
    else:
        start = await first_position(ledgers)
    nothing = CompactionOutcome(
        partition=partition, compacted=False, ledger_id=current.ledger_id,
        previous_ledger_id=current.ledger_id, horizon=_horizon(current), read=0,
        kept=current.messages, keys=current.keys, tombstones=0,
        payload_bytes=current.payload_bytes)
    if (start.seq, start.entry_id) >= (end.seq, end.entry_id):
        return nothing

    # Pass 1: the latest position of every key, and the horizon.
    latest: dict[bytes, tuple[int, int, int]] = {}
    horizon: tuple[int, int, int] | None = None
    first: SeqPosition | None = None  # the first message read after the previous view
    read = 0

    def note(batch: list[Message]) -> None:
        nonlocal read
        for message in batch:
            if message.key is not None:
                latest[message.key] = (message.seq, message.position.entry_id,
                                       message.position.batch_index)
        read += len(batch)
        if progress is not None:
            progress(len(batch))

    async for batch in _previous_view(client, record, partition, current):
        note(batch)
    # Ledgers trimmed since the last run were never compacted: skipped, logged.
    async for batch in _originals(client, record, partition, start,
                                  (end.seq, end.entry_id), skip_data_loss=True):
        if first is None:
            first = batch[0].seq_position
        note(batch)
        last = batch[-1]
        horizon = (last.seq, last.position.entry_id, last.position.ledger_id)
    if horizon is None or first is None:
        return nothing  # nothing new since the previous view
    horizon_info = await ledgers.get(horizon[0])
    # Where the view ends in the partition's whole history: a reader past the view
    # whose next ledger retention trimmed since learns from it whether anything
    # after the horizon went with it.
    horizon_offset = (-1 if horizon_info is None
                      else horizon_info.entries_before + horizon[1] + 1)

    # Pass 2: write the view to a new ledger, named pending first.
    config = record.config
    handle = await client.create_ledger(
        ensemble=config.ensemble_size, write_quorum=config.write_quorum,
        ack_quorum=config.ack_quorum, digest=config.digest.value, password=record.password,
        metadata={LEDGER_META_STREAM: record.name.encode(),
                  LEDGER_META_PARTITION: str(partition).encode(),
                  LEDGER_META_COMPACTED: b"1"})
    try:
        version = await _cas(client, key, version,
                             msgspec.structs.replace(current, pending_ledger_id=handle.id))
    except BaseException:
        await delete_stream_ledger(client, handle.id)
        raise
    writer = _ChunkWriter(handle, client.config.entry_max_bytes)
    tombstones: set[bytes] = set()

    async def write(batch: list[Message]) -> None:
        for message in batch:
            if message.key is None:
                await writer.add(message)
                continue
            if latest.get(message.key) != (message.seq, message.position.entry_id,
                                           message.position.batch_index):
                continue
            if message.value:
                await writer.add(message)
            else:
                tombstones.add(message.key)
        if progress is not None:
            progress(len(batch))

    try:
        async for batch in _previous_view(client, record, partition, current):
            await write(batch)
        # The same messages as pass 1: a ledger trimmed in between fails the run.
        async for batch in _originals(client, record, partition, first,
                                      (horizon[0], horizon[1] + 1), skip_data_loss=False):
            await write(batch)
        await writer.flush()
        await handle.close()
        committed = CompactionRecord(
            ledger_id=handle.id, horizon_seq=horizon[0], horizon_entry=horizon[1],
            horizon_ledger=horizon[2], horizon_offset=horizon_offset,
            entries=writer.entries, messages=writer.messages,
            keys=len(latest) - len(tombstones), payload_bytes=writer.payload_bytes,
            compacted_ms=client.clock.wall_ms())
        await _cas(client, key, version, committed)
    except BaseException:
        # Not committed: the ledger goes, and the record forgets it (if this
        # fails too, the next run deletes it by the pending id).
        try:
            await delete_stream_ledger(client, handle.id)
            await _cas(client, key, version,
                       msgspec.structs.replace(current, pending_ledger_id=0))
        except QuorumlogError as exc:
            log.warning("stream_compaction_cleanup_failed", stream=record.name,
                        partition=partition, ledger=handle.id, error=exc.message)
        raise
    if current.ledger_id:
        await delete_stream_ledger(client, current.ledger_id)
    log.info("stream_compacted", stream=record.name, partition=partition, ledger=handle.id,
             horizon=list(horizon), read=read, kept=writer.messages)
    return CompactionOutcome(
        partition=partition, compacted=True, ledger_id=handle.id,
        previous_ledger_id=current.ledger_id, horizon=_horizon(committed), read=read,
        kept=writer.messages, keys=committed.keys, tombstones=len(tombstones),
        payload_bytes=writer.payload_bytes)


async def bytes_after_horizon(client: LedgerClient, record: StreamRecord,
                              partition: int) -> int:
    """Bytes of the partition's closed ledgers not yet compacted: after the
    horizon (the horizon's own ledger pro rata of its entries). The open
    ledger's are not known without reading it: counted once it closes."""
    kv = await client.meta.get(compaction_key(record.name, partition))
    current = CompactionRecord.decode(kv.value) if kv is not None else CompactionRecord()
    ledgers = LedgerList(client.meta, record.name, partition)
    await ledgers.refresh()
    start = current.horizon_seq if current.ledger_id else 0
    total = 0
    async for info in ledgers.iterate(start):
        if info.is_open or not info.entries:
            continue
        if current.ledger_id and info.seq == current.horizon_seq:
            left = info.entries - 1 - current.horizon_entry
            total += info.size_bytes * max(left, 0) // info.entries
        else:
            total += info.size_bytes
    return total


async def compact_by_policy(client: LedgerClient, record: StreamRecord
                            ) -> list[CompactionOutcome]:
    """The trimmer's round for one stream: compact each partition whose closed
    ledgers after the horizon hold more than ``compaction_threshold_bytes``
    (Pulsar's ``compaction-threshold``); nothing when it is -1."""
    threshold = record.config.compaction_threshold_bytes
    if threshold < 0:
        return []
    outcomes = []
    for partition in range(record.config.partitions):
        if await bytes_after_horizon(client, record, partition) > threshold:
            outcomes.append(await compact_partition(client, record, partition))
    return outcomes


async def delete_stream_ledger(client: LedgerClient, ledger_id: int) -> None:
    """Delete one of a stream's ledgers (force: it names its stream); one already
    gone is not an error, a retriable failure is raised (the caller runs again)."""
    try:
        await client.delete_ledger(ledger_id, force=True)
    except QuorumlogError as exc:
        if exc.retriable:
            raise
        log.info("stream_ledger_already_gone", ledger_id=ledger_id, error=exc.message)


async def delete_compaction(client: LedgerClient, record: StreamRecord) -> list[int]:
    """Delete every compacted (and pending) ledger of the stream (its delete)."""
    deleted = []
    for compaction in (await compaction_records(client, record)).values():
        for ledger_id in (compaction.ledger_id, compaction.pending_ledger_id):
            if ledger_id:
                await delete_stream_ledger(client, ledger_id)
                deleted.append(ledger_id)
    return deleted


def _horizon(record: CompactionRecord) -> SeqPosition | None:
    if not record.ledger_id:
        return None
    return SeqPosition(record.horizon_seq, record.horizon_entry, 0, record.horizon_ledger)


async def _cas(client: LedgerClient, key: str, version: int, record: CompactionRecord) -> int:
    """Write ``record`` if ``key`` is still at ``version`` (0: absent); the new version."""
    if not await client.meta.cas(key, version, record.encode()):
        raise CompactionConflictError(
            f"{key} changed under this compaction (another compaction of the partition "
            "ran at the same time); run it again")
    kv = await client.meta.get(key)
    assert kv is not None
    new_version: int = kv.version
    return new_version


async def _previous_view(client: LedgerClient, record: StreamRecord, partition: int,
                         current: CompactionRecord) -> AsyncIterator[list[Message]]:
    """The messages of the partition's compacted ledger, if any, in order."""
    if not current.ledger_id:
        return
    handle = await client.open_ledger(current.ledger_id, password=record.password,
                                      recovery=False)
    for first in range(0, current.entries, 2 * COMPACTED_READ_CHUNKS):
        last = min(current.entries - 1, first + 2 * COMPACTED_READ_CHUNKS - 1)
        entries = await handle.read_batch(first, last)
        if len(entries) != last - first + 1:
            raise QuorumlogError(f"compacted ledger {current.ledger_id}: read {len(entries)} "
                                 f"of entries {first}..{last}", retriable=True)
        batch: list[Message] = []
        for index in range(0, len(entries), 2):
            batch.extend(decode_compacted_chunk(
                record.name, partition, bytes(entries[index].payload),
                bytes(entries[index + 1].payload)))
        yield batch


async def _originals(client: LedgerClient, record: StreamRecord, partition: int,
                     start: SeqPosition, stop: tuple[int, int], *,
                     skip_data_loss: bool) -> AsyncIterator[list[Message]]:
    """The partition's messages from ``start`` up to the entry (seq, entry id)
    ``stop``, not included; every one of them was readable when called."""
    reader = PartitionReader(client, record, partition, start, skip_data_loss=skip_data_loss)
    waits = 0
    while reader.next_position < stop:
        batch = await reader.next_batch(SCAN_WAIT_MS)
        if not batch:
            waits += 1
            if waits * SCAN_WAIT_MS > SCAN_STALL_MS:
                raise QuorumlogError(
                    f"stream {record.name!r} partition {partition}: entries before {stop} were "
                    f"readable but none came in {SCAN_STALL_MS // 1000} s (at "
                    f"{reader.next_position})", retriable=True)
            continue
        waits = 0
        kept = [m for m in batch if (m.seq, m.position.entry_id) < stop]
        if kept:
            yield kept
        if len(kept) < len(batch):
            return


class _ChunkWriter:
    """Writes the compacted ledger: a positions entry and a messages entry per
    chunk of up to CHUNK_MESSAGES_MAX messages and CHUNK_BYTES_MAX bytes."""

    def __init__(self, handle: Any, entry_max_bytes: int) -> None:
        self._handle = handle
        self._entry_max_bytes = entry_max_bytes
        self._places: list[tuple[int, int, int, int, int]] = []
        self._messages: list[OutgoingMessage] = []
        self._bytes = 0
        self.entries = 0
        self.messages = 0
        self.payload_bytes = 0

    async def add(self, message: Message) -> None:
        outgoing = OutgoingMessage(message.value, message.key, message.properties or None,
                                   message.publish_time_ms)
        size = checked_message_bytes(outgoing)
        if self._messages and (len(self._messages) >= CHUNK_MESSAGES_MAX
                               or self._bytes + size > min(CHUNK_BYTES_MAX,
                                                           self._entry_max_bytes - 64)):
            await self.flush()
        position = message.position
        self._places.append((message.seq, position.ledger_id, position.entry_id,
                             position.batch_index, message.batch_size))
        self._messages.append(outgoing)
        self._bytes += size
        self.payload_bytes += len(message.value)

    async def flush(self) -> None:
        if not self._messages:
            return
        await self._handle.append(msgspec.msgpack.encode(self._places))
        await self._handle.append(encode_entry(self._messages))
        self.entries += 2
        self.messages += len(self._messages)
        self._places, self._messages, self._bytes = [], [], 0
