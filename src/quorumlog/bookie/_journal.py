"""The bookie journal: a WAL of adds and ledger changes with adaptive group commit.

Every add (its entry envelope, as received) and every ledger change that must
survive a restart (a master key seen for the first time, fencing, an explicit
LAC, a deletion) is one journal *record*. An envelope starts with its ledger id
(< 2**63), so its first byte is below 0x80; control records start with
``CONTROL_TAG`` (0xFF) followed by msgpack.

Records go into WAL entries (index = journal position): the small records of
one write (under ``VECTORED_RECORD_MIN_BYTES``) are packed into one entry, a
msgpack array of byte strings (first byte 0x90-0x9F, 0xDC or 0xDD), so the WAL
frames and CRCs once per write instead of once per record; a large record is
an entry of its own, which the WAL writes without copying it (pwritev).

Threads: ``append``/``force``/``wait_for_room`` run on the event loop; one
journal thread takes queued records, writes them with one ``pwrite`` and one
``fdatasync`` (the WAL's ``save``), then settles the futures of the whole batch
with a single ``call_soon_threadsafe``.

Group commit, bounded and adaptive:

- records are queued in *groups* of at most ``max_batch_bytes``; each group
  has one future for its synced records and one for its no-sync records, so a
  batch settles with a handful of future operations, not one per record;
- a record that finds the journal thread idle (empty queue) is written at
  once: no waiting when the load is low;
- when records were already queued when the thread finished its previous
  write (the disk is the bottleneck), the thread waits until the oldest queued
  record is ``max_wait_us`` old or ``max_batch_bytes`` are queued, whichever
  comes first, so more records share the next fdatasync;
- no-sync records (``FLAG_NO_SYNC``, BookKeeper's deferred sync) are answered
  once written (in the page cache: they survive a process crash, not a power
  loss); ``force()`` answers after an fdatasync that covers everything
  appended before it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

import msgspec

from quorumlog.errors import (
    CorruptionError,
    StorageError,
    TransientError,
    UsageError,
    invariant,
)
from quorumlog.log import get_logger
from quorumlog.wal import Wal, WalConfig, WalEntry

_log = get_logger(__name__)

JOURNAL_METADATA = b"quorumlog bookie journal v1"
CONTROL_TAG = 0xFF
_CONTROL_PREFIX = bytes([CONTROL_TAG])
_THREAD_NAME = "bookie-journal"
# Most records in one write (bounds the WAL's pwritev vectors and the batch list).
BATCH_RECORDS_MAX = 8192
# Records at least this large are WAL entries of their own (no copy into a batch).
VECTORED_RECORD_MIN_BYTES = 8 * 1024
_ARRAY_TAGS = frozenset([*range(0x90, 0xA0), 0xDC, 0xDD])  # msgpack array headers
_BATCH_ENCODER = msgspec.msgpack.Encoder()
_BATCH_DECODER = msgspec.msgpack.Decoder(list[bytes])


class KeyRecord(msgspec.Struct, frozen=True, array_like=True, tag="key"):
    """The master key of a ledger this bookie saw for the first time."""

    ledger_id: int
    master_key: bytes


class FenceRecord(msgspec.Struct, frozen=True, array_like=True, tag="fence"):
    ledger_id: int
    master_key: bytes


class LacRecord(msgspec.Struct, frozen=True, array_like=True, tag="lac"):
    """An explicit LAC (WriteLacRequest)."""

    ledger_id: int
    lac: int


class DeleteRecord(msgspec.Struct, frozen=True, array_like=True, tag="delete"):
    """A ledger deleted by garbage collection (replay must not bring it back)."""

    ledger_id: int


ControlRecord = KeyRecord | FenceRecord | LacRecord | DeleteRecord
_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(ControlRecord)


def encode_control(record: ControlRecord) -> bytes:
    return _CONTROL_PREFIX + _ENCODER.encode(record)


def unpack_entry(data: bytes) -> list[bytes]:
    """The records in one WAL entry of the journal (a batch, or one record)."""
    if data and data[0] in _ARRAY_TAGS:
        try:
            return _BATCH_DECODER.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise CorruptionError(f"journal batch entry is not valid: {exc}") from None
    return [data]


def decode_record(data: bytes) -> ControlRecord | None:
    """The control record in ``data``; None when ``data`` is an entry envelope."""
    if not data or data[0] != CONTROL_TAG:
        return None
    try:
        record: ControlRecord = _DECODER.decode(memoryview(data)[1:])
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise CorruptionError(f"journal control record is not valid: {exc}") from None
    return record


def encode_position(index: int) -> bytes:
    """A checkpoint token for LedgerStorage.flush: the journal index, 8 bytes."""
    return index.to_bytes(8, "big")


def decode_position(token: bytes | None) -> int:
    if token is None:
        return 0
    if len(token) != 8:
        raise CorruptionError(
            f"ledger storage checkpoint has {len(token)} bytes, not a journal position; "
            "was this ledger directory written by another program?")
    return int.from_bytes(token, "big")


class JournalFullError(TransientError):
    """The journal queue is over ``journal_queue_max_bytes`` (the disk is too slow)."""


class _Group:
    """Records appended one after another, written together, settled together."""

    __slots__ = ("created", "records", "size_bytes", "sync", "synced", "written")

    def __init__(self, created: float) -> None:
        self.created = created
        self.records: list[bytes] = []
        self.size_bytes = 0
        self.sync = False
        self.synced: asyncio.Future[None] | None = None  # sync records and force()
        self.written: asyncio.Future[None] | None = None  # no-sync records


def _settle(future: asyncio.Future[None] | None, error: str | None) -> None:
    if future is None or future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(StorageError(error))


class Journal:
    """The journal of one bookie. See the module docstring.

    Life cycle: ``Journal.open(dir, ...)`` (creates the WAL if missing),
    ``take_replay()`` (the records on disk, once), ``start(loop)``, appends,
    ``close()``.
    """

    def __init__(
        self,
        wal: Wal,
        *,
        created: bool,
        max_wait_us: int,
        max_batch_bytes: int,
        queue_max_bytes: int,
        on_fsync: Callable[[float], None] | None = None,
        on_batch: Callable[[int, int], None] | None = None,
    ) -> None:
        self._wal = wal
        self.created = created
        contents = wal.read_all()
        self.metadata = contents.metadata
        self._replay: list[WalEntry] | None = contents.entries
        self._max_wait_s = max_wait_us / 1_000_000
        self._max_batch_bytes = max_batch_bytes
        self._queue_max_bytes = queue_max_bytes
        self._on_fsync = on_fsync
        self._on_batch = on_batch
        self._cond = threading.Condition(threading.Lock())
        self._groups: deque[_Group] = deque()
        self._open: _Group | None = None
        self._queued_bytes = 0
        self._idle = False  # the thread waits for any record
        self._collecting = False  # the thread waits for a full batch or the deadline
        self._closing = False
        self._failure: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._room_waiters: list[asyncio.Future[None]] = []
        self._failed = asyncio.Event()  # set on the loop once ``failure`` is set
        last = wal.last_index
        self._appended_records = 0  # loop side
        self._synced_records = 0  # journal thread side: records covered by an fdatasync
        self._written_records = 0  # journal thread side: records written
        self._next_index = last + 1  # journal thread side: WAL indexes
        self._written_index = last
        self._synced_index = last
        self.fsyncs = 0
        self.batches = 0
        self.records_written = 0
        self.bytes_written = 0

    # ---------------------------------------------------------------- opening

    @classmethod
    def open(
        cls,
        directory: str | Path,
        *,
        max_wait_us: int,
        max_batch_bytes: int,
        queue_max_bytes: int,
        segment_size_bytes: int,
        on_fsync: Callable[[float], None] | None = None,
        on_batch: Callable[[int, int], None] | None = None,
    ) -> Journal:
        """Open (repairing a torn tail) or create the journal in ``directory``.

        Damage other than a torn tail raises CorruptionError with a message
        that names the journal and what to do.
        """
        path = Path(directory)
        config = WalConfig(segment_size_bytes=segment_size_bytes,
                           batch_size_max_bytes=max(max_batch_bytes, 1 << 20),
                           record_size_max_bytes=max(16 << 20, 2 * max_batch_bytes + (1 << 20)))
        created = not Wal.exists(path)
        try:
            if created:
                wal = Wal.create(path, JOURNAL_METADATA, config=config)
            else:
                wal = Wal.open(path, config=config)
        except CorruptionError as exc:
            raise CorruptionError(
                f"bookie journal {path} is damaged beyond a torn tail, so the bookie refuses "
                "to start (acknowledged entries may be in it). To bring the bookie back today, "
                "stop its node and re-add it as a new instance: `quorumlog bookie format "
                "--force <bookie id, its host:port> --config <its node config>` (docs/bookie.md, "
                "\"Re-adding a wiped bookie\"). The entries it stored are given up: the "
                "ledgers it held stay under-replicated until they are re-replicated, which "
                "nothing does automatically yet (auto-recovery is not built). The damage: "
                f"{exc.message}") from None
        try:
            journal = cls(wal, created=created, max_wait_us=max_wait_us,
                          max_batch_bytes=max_batch_bytes, queue_max_bytes=queue_max_bytes,
                          on_fsync=on_fsync, on_batch=on_batch)
        except BaseException:
            wal.close()
            raise
        if journal.metadata != JOURNAL_METADATA:
            wal.close()
            raise CorruptionError(
                f"{path} holds a WAL that is not a bookie journal; point journal_dir at a "
                "directory of its own")
        if wal.repair_report is not None:
            _log.warning("journal_torn_tail_repaired", directory=str(path),
                         report=str(wal.repair_report))
        return journal

    @property
    def directory(self) -> Path:
        return self._wal.directory

    def take_replay(self) -> list[WalEntry]:
        """The WAL entries found on disk when opened (once); ``unpack_entry`` each."""
        if self._replay is None:
            raise UsageError("the journal's records were already taken")
        entries, self._replay = self._replay, None
        return entries

    # ------------------------------------------------------------- positions

    @property
    def last_index(self) -> int:
        """The journal position (WAL index) of the last write."""
        return self._written_index

    @property
    def synced_index(self) -> int:
        """Every journal position up to here is on disk and fdatasynced."""
        return self._synced_index

    @property
    def appended_records(self) -> int:
        """Records appended since start (event loop side)."""
        return self._appended_records

    @property
    def unsynced(self) -> bool:
        """Records were appended that no fdatasync covers yet."""
        return self._synced_records < self._appended_records

    @property
    def queued_bytes(self) -> int:
        return self._queued_bytes

    @property
    def failure(self) -> str | None:
        return self._failure

    async def wait_failed(self) -> str:
        """Wait until the journal fails (a write or fdatasync error); its message."""
        await self._failed.wait()
        failure = self._failure
        invariant(failure is not None, "journal failure event set without a failure")
        return failure or ""

    # ----------------------------------------------------------------- start

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the journal thread; futures are settled on ``loop``."""
        if self._thread is not None:
            raise UsageError("journal already started")
        self._loop = loop
        self._thread = threading.Thread(target=self._main, name=_THREAD_NAME, daemon=True)
        self._thread.start()

    # ------------------------------------------------------- event loop side

    def append(self, data: bytes, *, sync: bool = True) -> asyncio.Future[None]:
        """Queue one record; the future is done once it is written (and synced if ``sync``).

        Call on the event loop without awaiting in between a change to the
        ledger storage and its record, so that journal order is storage order.
        """
        loop = self._loop
        if loop is None or self._closing or self._failure is not None:
            self._refuse()
        size = len(data)
        with self._cond:
            group = self._open
            if group is None or group.size_bytes >= self._max_batch_bytes or (
                    len(group.records) >= BATCH_RECORDS_MAX):
                group = _Group(time.monotonic())
                self._groups.append(group)
                self._open = group
            group.records.append(data)
            group.size_bytes += size
            self._queued_bytes += size
            self._appended_records += 1
            if sync:
                group.sync = True
                future = group.synced
                if future is None:
                    future = group.synced = loop.create_future()
            else:
                future = group.written
                if future is None:
                    future = group.written = loop.create_future()
            if self._idle or (self._collecting and self._queued_bytes >= self._max_batch_bytes):
                self._cond.notify()
        return future

    def append_many(self, records: Sequence[bytes], *, sync: bool = True) -> asyncio.Future[None]:
        """Queue records in order under one lock hold (a batch of adds); the future
        is done once the last one is written (and synced if ``sync``), which
        covers the others: groups are written and settled in order."""
        loop = self._loop
        if loop is None or self._closing or self._failure is not None:
            self._refuse()
        invariant(bool(records), "append_many needs at least one record")
        size = sum(map(len, records))
        if size > self._max_batch_bytes or len(records) > BATCH_RECORDS_MAX:
            for record in records[:-1]:  # larger than a group: one by one
                self.append_quiet(record)
            return self.append(records[-1], sync=sync)
        with self._cond:
            group = self._open
            if group is None or group.size_bytes + size > self._max_batch_bytes or (
                    len(group.records) + len(records) > BATCH_RECORDS_MAX):
                group = _Group(time.monotonic())
                self._groups.append(group)
                self._open = group
            group.records.extend(records)
            group.size_bytes += size
            self._queued_bytes += size
            self._appended_records += len(records)
            if sync:
                group.sync = True
                future = group.synced
                if future is None:
                    future = group.synced = loop.create_future()
            else:
                future = group.written
                if future is None:
                    future = group.written = loop.create_future()
            if self._idle or (self._collecting and self._queued_bytes >= self._max_batch_bytes):
                self._cond.notify()
        return future

    def append_quiet(self, data: bytes) -> None:
        """Queue a record nobody waits for; it is durable with the next fdatasync.

        For a record that must precede another one (a ledger's master key
        before its first add), whose own future covers both.
        """
        if self._loop is None or self._closing or self._failure is not None:
            self._refuse()
        with self._cond:
            group = self._open
            if group is None or group.size_bytes >= self._max_batch_bytes:
                group = _Group(time.monotonic())
                self._groups.append(group)
                self._open = group
            group.records.append(data)
            group.size_bytes += len(data)
            self._queued_bytes += len(data)
            self._appended_records += 1
            if self._idle:
                self._cond.notify()

    def force(self) -> asyncio.Future[None]:
        """A future done after an fdatasync covering every record appended so far."""
        loop = self._loop
        if loop is None or self._closing or self._failure is not None:
            self._refuse()
        with self._cond:
            if not self._groups and self._synced_records >= self._appended_records:
                done = loop.create_future()
                done.set_result(None)
                return done
            group = self._open
            if group is None:
                group = _Group(time.monotonic())
                self._groups.append(group)
                self._open = group
            group.sync = True
            future = group.synced
            if future is None:
                future = group.synced = loop.create_future()
            if self._idle or self._collecting:
                self._cond.notify()
        return future

    async def sync_position(self) -> int:
        """Make everything appended so far durable; return a synced journal position.

        Every record appended before the call is at or before the position.
        """
        await self.force()
        return self._synced_index

    @property
    def full(self) -> bool:
        return self._queued_bytes >= self._queue_max_bytes

    async def wait_for_room(self) -> None:
        """Wait while ``queue_max_bytes`` are queued (an add's backpressure)."""
        loop = asyncio.get_running_loop()
        while self.full:
            if self._failure is not None or self._closing:
                self._refuse()
            waiter = loop.create_future()
            self._room_waiters.append(waiter)
            await waiter

    def _refuse(self) -> NoReturn:
        if self._failure is not None:
            raise StorageError(self._failure)
        if self._loop is None:
            raise TransientError("the bookie journal is not started yet; retry shortly")
        raise TransientError("the bookie journal is closing; retry on another bookie")

    def _settle_batch(
        self, groups: list[_Group], written_error: str | None, synced_error: str | None,
        settle_synced: bool,
    ) -> None:
        """On the loop: settle the futures of a written batch and wake room waiters."""
        for group in groups:
            _settle(group.written, written_error)
            if settle_synced:
                _settle(group.synced, synced_error)
        if self._room_waiters and not self.full:
            waiters, self._room_waiters = self._room_waiters, []
            for waiter in waiters:
                _settle(waiter, None)

    # ---------------------------------------------------------- journal thread

    def _main(self) -> None:
        busy = False
        while True:
            groups = self._next_batch(busy)
            if groups is None:
                return
            self._write(groups)
            with self._cond:
                busy = bool(self._groups)

    def _next_batch(self, busy: bool) -> list[_Group] | None:
        """Wait for records (adaptively, see the module docstring) and take a batch."""
        with self._cond:
            while not self._groups:
                if self._closing:
                    return None
                self._idle = True
                self._cond.wait()
                self._idle = False
                busy = False  # the first record after an idle spell goes out at once
            if busy and self._max_wait_s > 0:
                deadline = self._groups[0].created + self._max_wait_s
                self._collecting = True
                while self._queued_bytes < self._max_batch_bytes and not self._closing:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
                self._collecting = False
            return self._take()

    def _take(self) -> list[_Group]:
        """Groups for one write, up to max_batch_bytes (at least one); lock held."""
        taken = [self._groups.popleft()]
        size = taken[0].size_bytes
        count = len(taken[0].records)
        while self._groups:
            group = self._groups[0]
            if size + group.size_bytes > self._max_batch_bytes or (
                    count + len(group.records) > BATCH_RECORDS_MAX):
                break
            taken.append(self._groups.popleft())
            size += group.size_bytes
            count += len(group.records)
        if self._open is not None and self._open in taken:
            self._open = None
        self._queued_bytes -= size
        return taken

    def _entries(self, groups: list[_Group]) -> list[WalEntry]:
        """The WAL entries of one write: small records packed, large ones alone."""
        index = self._next_index
        entries: list[WalEntry] = []
        small: list[bytes] = []
        for group in groups:
            for data in group.records:
                if len(data) < VECTORED_RECORD_MIN_BYTES:
                    small.append(data)
                    continue
                if small:
                    entries.append(WalEntry(index=index, data=_BATCH_ENCODER.encode(small)))
                    index += 1
                    small = []
                entries.append(WalEntry(index=index, data=data))
                index += 1
        if small:
            entries.append(WalEntry(index=index, data=_BATCH_ENCODER.encode(small)))
        return entries

    def _write(self, groups: list[_Group]) -> None:
        entries = self._entries(groups)
        records = sum(len(group.records) for group in groups)
        size = sum(group.size_bytes for group in groups)
        sync = any(group.sync for group in groups)
        deferred = any(group.written is not None for group in groups)
        error: str | None = None
        try:
            if entries:
                self._wal.save(entries=entries, sync=False)
                self._written_index = entries[-1].index
                self._next_index = self._written_index + 1
            if deferred:  # no-sync records are answered once written
                self._call(groups, None, None, False)
            if sync and self._synced_index < self._written_index:
                start = time.perf_counter()
                self._wal.sync()
                self.fsyncs += 1
                if self._on_fsync is not None:
                    self._on_fsync(time.perf_counter() - start)
            if sync:
                self._synced_index = self._written_index
                self._synced_records = self._written_records + records
        except (StorageError, UsageError, OSError) as exc:
            error = self._fail(exc)
        self._written_records += records
        self.batches += 1
        self.records_written += records
        self.bytes_written += size
        if self._on_batch is not None:
            self._on_batch(records, size)
        self._call(groups, error, error, True)

    def _call(self, groups: list[_Group], written_error: str | None,
              synced_error: str | None, settle_synced: bool) -> None:
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            loop.call_soon_threadsafe(self._settle_batch, groups, written_error, synced_error,
                                      settle_synced)

    def _fail(self, exc: BaseException) -> str:
        message = (
            f"bookie journal {self._wal.directory} failed to write ({exc}); the bookie "
            "refuses adds until it is restarted (restart replays the journal)")
        _log.error("journal_write_failed", directory=str(self._wal.directory), error=str(exc))
        with self._cond:
            self._failure = message
            failed = list(self._groups)
            self._groups.clear()
            self._open = None
            self._queued_bytes = 0
        self._call(failed, message, message, True)
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(self._failed.set)
        return message

    # ----------------------------------------------------------------- maintenance

    def release_to(self, index: int) -> int:
        """Remove whole segments before the one holding ``index``; blocking (worker thread)."""
        return len(self._wal.release_to(index))

    def close(self) -> None:
        """Write what is queued, fdatasync, stop the thread, close the WAL (blocking)."""
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        try:
            self._wal.close()
        except StorageError as exc:
            _log.error("journal_close_failed", error=exc.message)
