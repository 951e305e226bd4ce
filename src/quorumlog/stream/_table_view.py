"""A stream as a key -> value map kept up to date (Pulsar's ``TableView``).

:class:`TableView` reads every partition of a stream from the earliest
position, through the compacted view when the stream was compacted
(``read_compacted``: the latest message of each key, however much
retention trimmed), then follows new messages. A message with a key sets the
key to its value; an empty value (a tombstone) removes it; a message without
a key is not part of the table. ``open`` returns once the view holds
everything readable when it was called, and :meth:`TableView.refresh` waits
for what was readable when *it* was called, so a read after ``refresh``
sees every write acknowledged before it by a live producer (the end of an
open ledger is its LAC as the bookies report it, plus what they confirm
within ``LAC_SETTLE_MS``: the producer publishes its LAC explicitly 20 ms
after its last add). A retriable read error (a bookie restarting) is
retried with backoff; another one fails the view (``refresh`` raises it).

Each partition is read by its own task with a :class:`PartitionReader`; a
batch is applied as soon as it is read, before the next read, so the
reader's next position is exactly how far the table is applied.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, ItemsView, Iterator, KeysView
from typing import Any

from quorumlog.errors import DeadlineExceededError, QuorumlogError
from quorumlog.ledger import LedgerClient
from quorumlog.log import get_logger
from quorumlog.stream._layout import StreamRecord
from quorumlog.stream._ledgers import LedgerList
from quorumlog.stream._position import EARLIEST, SeqPosition
from quorumlog.stream._reader import (
    TAIL_POLL_MS,
    LedgerHandles,
    Message,
    PartitionReader,
    end_position,
    load_compaction,
    resolve_start,
)

log = get_logger(__name__)

REFRESH_TIMEOUT_S = 60.0
# The LAC a bookie reports trails the last acknowledged entry until the writer's
# next add or its explicit LAC (LedgerClientConfig.explicit_lac_interval_ms,
# 20 ms): refresh long-polls the open ledger this long for entries past it.
LAC_SETTLE_MS = 200
RETRY_BACKOFF_S = (0.1, 2.0)  # a retriable read error: wait, from the first to the cap
Listener = Callable[[bytes, bytes | None], None]


def _key(key: bytes | str) -> bytes:
    return key.encode() if isinstance(key, str) else key


class TableView:
    """The latest value of every key of a stream (module docstring)."""

    def __init__(self, client: LedgerClient, record: StreamRecord,
                 parts: list[PartitionReader]) -> None:
        self._client = client
        self._record = record
        self._parts = parts
        self._data: dict[bytes, bytes] = {}
        self._listeners: list[Listener] = []
        self._progress = asyncio.Condition()
        self._tasks: list[asyncio.Task[None]] = []
        self._failed: BaseException | None = None

    @classmethod
    async def open(cls, client: LedgerClient, record: StreamRecord, *,
                   timeout_s: float = REFRESH_TIMEOUT_S) -> TableView:
        parts = []
        for partition in range(record.config.partitions):
            compacted = await load_compaction(client, record.name, partition)
            handles = LedgerHandles(client, record)
            ledgers = LedgerList(client.meta, record.name, partition)
            if compacted is not None:
                start = SeqPosition(0, 0, 0, 0)  # the view first, even past retention
            else:
                start, _ = await resolve_start(client, handles, record, partition, EARLIEST,
                                               ledgers=ledgers)
            parts.append(PartitionReader(client, record, partition, start, handles=handles,
                                         ledgers=ledgers, compacted=compacted))
        view = cls(client, record, parts)
        view._tasks = [asyncio.get_running_loop().create_task(
            view._follow(part), name=f"table-view-{record.name}-{part.partition}")
            for part in parts]
        try:
            await view.refresh(timeout_s=timeout_s)
        except BaseException:
            await view.close()
            raise
        return view

    # ----- the map ------------------------------------------------------------------

    def get(self, key: bytes | str) -> bytes | None:
        return self._data.get(_key(key))

    def __contains__(self, key: object) -> bool:
        return isinstance(key, bytes | str) and _key(key) in self._data

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._data)

    def keys(self) -> KeysView[bytes]:
        return self._data.keys()

    def items(self) -> ItemsView[bytes, bytes]:
        return self._data.items()

    def snapshot(self) -> dict[bytes, bytes]:
        """A copy of the map as it is now."""
        return dict(self._data)

    def listen(self, listener: Listener) -> None:
        """Call ``listener(key, value)`` for every change from now on (value None:
        the key was removed), on the event loop, in each partition's order."""
        self._listeners.append(listener)

    @property
    def stream(self) -> str:
        return self._record.name

    # ----- keeping up ------------------------------------------------------------------

    async def refresh(self, *, timeout_s: float = REFRESH_TIMEOUT_S) -> None:
        """Return once the map holds every message readable when called (Pulsar's
        ``TableView.refreshAsync``); DeadlineExceededError after ``timeout_s``."""
        ends = list(await asyncio.gather(*(self._end(part.partition) for part in self._parts)))
        try:
            async with asyncio.timeout(timeout_s), self._progress:
                await self._progress.wait_for(lambda: self._failed is not None or all(
                    part.next_position >= end for part, end in zip(self._parts, ends,
                                                                   strict=True)))
        except TimeoutError:
            raise DeadlineExceededError(
                f"table view of {self._record.name!r}: not caught up within {timeout_s:.0f} s "
                f"(at {[p.next_position for p in self._parts]}, to {ends})") from None
        if self._failed is not None:
            raise self._failed

    async def _end(self, partition: int) -> tuple[int, int]:
        """(seq, entry id) after the partition's last acknowledged entry: the end
        position, then, in an open ledger, entries confirmed within LAC_SETTLE_MS
        past the LAC the bookies reported (the writer's explicit LAC)."""
        handles = LedgerHandles(self._client, self._record)
        head = await LedgerList(self._client.meta, self._record.name, partition).refresh()
        end = await end_position(handles, head)
        last = head.last_ledger
        if last is None or not last.is_open:
            return (end.seq, end.entry_id)
        handle = await handles.get(last)
        entry_id = end.entry_id
        while (entry := await handle.wait_for_entry(entry_id - 1, LAC_SETTLE_MS)) is not None:
            entry_id = int(entry.entry_id) + 1
        return (end.seq, entry_id)

    async def _follow(self, part: PartitionReader) -> None:
        backoff_s = RETRY_BACKOFF_S[0]
        while True:
            try:
                batch = await part.next_batch(TAIL_POLL_MS)
            except asyncio.CancelledError:
                raise
            except QuorumlogError as exc:
                log.warning("stream_table_view_read_failed", stream=self._record.name,
                            partition=part.partition, error=exc.message,
                            retrying=exc.retriable)
                if exc.retriable:  # a bookie or meta away for a moment: the position holds
                    await asyncio.sleep(backoff_s)
                    backoff_s = min(backoff_s * 2, RETRY_BACKOFF_S[1])
                    continue
                self._failed = exc
                async with self._progress:
                    self._progress.notify_all()
                return
            backoff_s = RETRY_BACKOFF_S[0]
            self._apply(batch)
            async with self._progress:
                self._progress.notify_all()

    def _apply(self, batch: list[Message]) -> None:
        data, listeners = self._data, self._listeners
        for message in batch:
            key = message.key
            if key is None:
                continue
            value: bytes | None = message.value
            if value:
                data[key] = value
            else:
                value = None
                data.pop(key, None)
            for listener in listeners:
                try:
                    listener(key, value)
                except Exception:  # a listener's bug must not stop the view
                    log.exception("stream_table_view_listener_failed",
                                  stream=self._record.name)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    async def __aenter__(self) -> TableView:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
