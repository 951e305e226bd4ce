"""Duplication on a table node: the shippers of the partitions it leads, and
the log floor of every partition it hosts (docs/duplication.md).

:class:`DupManager` runs one loop per node. Every ``dup_refresh_interval_ms``
it reads every partition's ``confirmed_decree`` from meta (``/dup-progress/``)
and starts a :class:`Shipper` for each (partition it leads, duplication in
state log), stopping those whose partition it no longer leads or whose
duplication paused or went. It also answers the Raft host's
``compaction_floor``: no replica compacts its log past the smallest
``confirmed_decree`` of its table's active duplications, and while a replica
does not know it yet (no read of meta since it opened, or a duplication with
no progress recorded) it does not compact at all.

A shipper reads the group's log after ``confirmed_decree`` a block at a time
(bounded in entries and bytes), collects the (hash_key, sort_key) pairs the
block's writes touched, and ships each pair's record as this replica stores
it now (value, expiry and timetag, tombstones included) as a
:class:`DuplicateCommand` to the remote cluster, one command per hash_key:
hash keys in parallel, each hash key's blocks in order. The record stored now
is the result of every write up to now, with the timetag the local write gave
it, so last-writer-wins makes the remote converge also for increments,
check-and-mutate and retried writes; duplicate writes themselves are never
shipped again. ``confirmed_decree`` moves in meta (compare-and-swap) after the
remote acknowledged the whole block.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from quorumlog import chunks
from quorumlog.errors import QuorumlogError, UsageError
from quorumlog.log import get_logger
from quorumlog.meta import Compare, CompareOp, CompareTarget, MetaClient, PutOp
from quorumlog.raft import CompactedError, Entry, EntryType, RaftHost, Role
from quorumlog.table import _dup_metrics as metrics
from quorumlog.table._client import TableClient
from quorumlog.table._commands import (
    CheckAndMutateCommand,
    DeleteCommand,
    DuplicateCommand,
    IncrCommand,
    MultiDeleteCommand,
    MultiSetCommand,
    SetCommand,
    WriteCommand,
    entries_of,
)
from quorumlog.table._dup_layout import (
    DupProgress,
    DupRecord,
    DupState,
    FailMode,
    decode_progress,
    encode_dup,
    get_dup,
    parse_progress,
    progress_key,
    read_progress,
    update_dup,
)
from quorumlog.table._layout import DUP_PROGRESS_PREFIX, table_info
from quorumlog.table._store import TableStore

_log = get_logger(__name__)

US_PER_MS = 1000
RETRY_BACKOFF_MS_MIN = 50
RETRY_BACKOFF_MS_MAX = 5_000
ERROR_TEXT_BYTES_MAX = 300
REPORT_INTERVAL_MS_MIN = 50  # a stuck block's lag is written at least this far apart


@dataclass(frozen=True, slots=True)
class DupSettings:
    """The ``[table] dup_*`` fields a node runs duplication with."""

    block_entries_max: int
    block_bytes_max: int
    hash_keys_in_flight_max: int
    refresh_interval_ms: int
    progress_interval_ms: int
    idle_poll_ms: int
    remote_deadline_s: float
    cluster_id: int


@dataclass(frozen=True, slots=True)
class HostedPartition:
    table: str
    partition: int
    group_id: int
    store: TableStore


def touched_keys(command: WriteCommand) -> list[tuple[bytes, bytes]]:
    """The (hash_key, sort_key) pairs a local write may change; none for a
    duplicate write (it is never shipped again)."""
    if isinstance(command, (SetCommand, DeleteCommand, IncrCommand)):
        return [(command.hash_key, command.sort_key)]
    if isinstance(command, MultiSetCommand):
        return [(command.hash_key, sort_key) for sort_key, _ in command.items]
    if isinstance(command, MultiDeleteCommand):
        return [(command.hash_key, sort_key) for sort_key in command.sort_keys]
    if isinstance(command, CheckAndMutateCommand):
        return [(command.hash_key, m.sort_key) for m in command.mutations]
    return []


def compaction_floor_of(active: list[DupRecord], progress: dict[tuple[str, int, int], DupProgress],
                        table: str, partition: int, *, dups_known: bool,
                        progress_known: bool) -> int | None:
    """The highest log index a replica of ``table``'s ``partition`` may compact
    up to, from what its node knows (None: no bound): the smallest
    ``confirmed_decree`` of the table's ``active`` duplications. Unknown means
    keep: 0 until the node has read the duplications (``dups_known``) and, with
    one active, the progress from meta (``progress_known``), and while a
    partition has no progress recorded."""
    if not dups_known:
        return 0  # not known yet: keep everything
    if not active:
        return None
    if not progress_known:
        return 0  # confirmed decrees not read yet
    floor: int | None = None
    for dup in active:
        found = progress.get((table, dup.dup_id, partition))
        if found is None:
            return 0  # the leader has not recorded where shipping starts
        floor = found.confirmed_decree if floor is None else min(floor, found.confirmed_decree)
    return floor


@dataclass(slots=True)
class Block:
    """One block of the log as duplicate writes: hash_key -> its records."""

    last_decree: int
    commands: dict[bytes, DuplicateCommand]
    oldest_timestamp_us: int
    mutations: int = 0
    bytes: int = 0


def block_of(entries: list[Entry], store: TableStore) -> Block:
    """The records a block of log entries touched, as this replica stores them now."""
    touched: dict[bytes, dict[bytes, None]] = {}
    oldest_us = 0
    for entry in entries:
        if entry.type is not EntryType.NORMAL or not entry.data:
            continue
        for table_entry in entries_of(entry.data):
            oldest_us = oldest_us or table_entry.timestamp_us
            for command in table_entry.commands:
                for hash_key, sort_key in touched_keys(command):
                    touched.setdefault(hash_key, {})[sort_key] = None
    block = Block(last_decree=entries[-1].index, commands={}, oldest_timestamp_us=oldest_us)
    for hash_key, sort_keys in touched.items():
        records = []
        for sort_key in sort_keys:
            record = store.stored_record(hash_key, sort_key)
            if record is None:
                continue  # refused, or collected since: nothing to ship
            records.append((sort_key, record.value, record.expire_ts_s, record.timetag))
            block.mutations += 1
            block.bytes += len(hash_key) + len(sort_key) + len(record.value)
        if records:
            block.commands[hash_key] = DuplicateCommand(hash_key, tuple(records))
    return block


DUPLICATE_COMMAND_BYTES_MAX = 4 * 1024 * 1024
"""Record bytes of one duplicate call (one record at least). A hash key's records
in one block can add up past what the remote takes in one Raft entry (8 MiB,
``max_entry_data_bytes``), which no retry would ever get through: they go as
several calls (each record is applied last-writer-wins on its own)."""


def split_duplicate(command: DuplicateCommand,
                    bytes_max: int = DUPLICATE_COMMAND_BYTES_MAX) -> list[DuplicateCommand]:
    """``command`` as commands of at most ``bytes_max`` of record bytes each."""
    pieces = chunks.by_size(command.records, lambda record: len(record[0]) + len(record[1]),
                            bytes_max)
    if len(pieces) == 1:
        return [command]
    return [DuplicateCommand(command.hash_key, tuple(piece)) for piece in pieces]


@dataclass(slots=True)
class Shipper:
    """Ships one partition's log to one remote cluster while this node leads it."""

    manager: DupManager
    hosted: HostedPartition
    dup: DupRecord
    confirmed_decree: int = -1
    progress: DupProgress = field(default_factory=lambda: DupProgress(confirmed_decree=0))
    progress_version: int = 0
    last_report_s: float = 0.0
    report_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    written: DupProgress | None = None  # as last written to meta

    @property
    def labels(self) -> tuple[str, str, str]:
        return (self.hosted.table, str(self.dup.dup_id), str(self.hosted.partition))

    async def run(self) -> None:
        backoff_ms = RETRY_BACKOFF_MS_MIN
        while True:
            try:
                if self.confirmed_decree < 0:
                    await self._load()
                    continue
                if not self.progress.prepared:
                    await self._copy_checkpoint()
                    continue
                shipped = await self._step()
                backoff_ms = RETRY_BACKOFF_MS_MIN
                if not shipped:
                    await asyncio.sleep(self.manager.settings.idle_poll_ms / 1000)
            except QuorumlogError as exc:
                self._set(error=exc.message[:ERROR_TEXT_BYTES_MAX])
                _log.warning("dup_ship_failed", table=self.hosted.table, dup=self.dup.dup_id,
                             partition=self.hosted.partition, error=exc.message)
                await self._report(force=True)
                await asyncio.sleep(backoff_ms / 1000)
                backoff_ms = min(2 * backoff_ms, RETRY_BACKOFF_MS_MAX)

    def _set(self, **changes: object) -> None:
        self.progress = DupProgress(**{**_fields(self.progress), **changes})  # type: ignore[arg-type]

    async def _load(self) -> None:
        """confirmed_decree from meta; a partition with none starts at what it has
        applied now (only writes from here on ship)."""
        meta = self.manager.meta
        key = progress_key(self.hosted.table, self.dup.dup_id, self.hosted.partition)
        kv = await meta.get(key)
        if kv is None:
            record, _ = await get_dup(meta, self.hosted.table, self.dup.dup_id)
            if not record.active:
                return  # removed meanwhile: its progress must not come back
            start = self.manager.host.group(self.hosted.group_id).applied_index
            progress = DupProgress(confirmed_decree=start, leader=self.manager.node_id,
                                   updated_ms=_now_ms(),
                                   prepared=record.state is not DupState.PREPARE)
            result = await meta.txn(
                compares=[Compare(key=key, target=CompareTarget.VERSION, op=CompareOp.EQUAL,
                                  version=0)],
                success=[PutOp(key=key, value=encode_dup(progress))])
            if not result.succeeded:
                return  # another leader recorded it meanwhile: read it next round
            self.progress, self.progress_version = progress, 1
        else:
            self.progress, self.progress_version = decode_progress(kv.value), kv.version
        self.confirmed_decree = self.progress.confirmed_decree
        self.manager.progress[(self.hosted.table, self.dup.dup_id, self.hosted.partition)] = (
            self.progress)
        _log.info("dup_shipper_started", table=self.hosted.table, dup=self.dup.dup_id,
                  partition=self.hosted.partition, confirmed_decree=self.confirmed_decree)

    async def _copy_checkpoint(self) -> None:
        """--checkpoint: ship every record this replica holds (its state at or
        after confirmed_decree, recorded before the copy began), a page at a
        time; then mark the partition prepared, and move the duplication to
        log when every partition is. Log entries after confirmed_decree ship
        next; last-writer-wins makes the order of the two irrelevant."""
        settings = self.manager.settings
        after: bytes | None = None
        copied = 0
        while True:
            page, after = self.hosted.store.stored_page(after, settings.block_entries_max,
                                                        settings.block_bytes_max)
            commands: dict[bytes, list[tuple[bytes, bytes, int, int]]] = {}
            size = 0
            for hash_key, sort_key, record in page:
                commands.setdefault(hash_key, []).append(
                    (sort_key, record.value, record.expire_ts_s, record.timetag))
                size += len(hash_key) + len(sort_key) + len(record.value)
            block = Block(last_decree=self.confirmed_decree, oldest_timestamp_us=0,
                          mutations=len(page), bytes=size,
                          commands={h: DuplicateCommand(h, tuple(r)) for h, r in commands.items()})
            await self._ship(block)
            copied += len(page)
            self._set(checkpoint_records=copied)
            await self._report(force=False)
            if after is None:
                break
        self._set(prepared=True)
        await self._report(force=True)
        _log.info("dup_checkpoint_copied", table=self.hosted.table, dup=self.dup.dup_id,
                  partition=self.hosted.partition, records=copied)
        await self.manager.finish_prepare(self.hosted.table, self.dup.dup_id)

    async def _step(self) -> bool:
        """Ship the next block; False when there was nothing to ship."""
        settings = self.manager.settings
        group = self.manager.host.group(self.hosted.group_id)
        applied = group.applied_index
        pending = applied - self.confirmed_decree
        metrics.PENDING_DECREES.labels(*self.labels).set(pending)
        if pending <= 0:
            metrics.LAG_MS.labels(*self.labels).set(0)
            self._set(pending_decrees=0, lag_ms=0, error="", log_lost=False)
            metrics.LOG_LOST.labels(*self.labels).set(0)
            await self._report(force=False)
            return False
        try:
            # The Raft log, or below it the tail kept with the snapshot (a
            # replica rebuilt from a snapshot, or restarted: "learn step back").
            entries = self.manager.host.retained_entries(
                self.hosted.group_id, self.confirmed_decree + 1,
                min(applied, self.confirmed_decree + settings.block_entries_max) + 1,
                settings.block_bytes_max)
        except CompactedError:
            await self._log_lost(group.storage.first_index())
            return False
        block = block_of(entries, self.hosted.store)
        lag_ms = max(0, _now_ms() - block.oldest_timestamp_us // US_PER_MS) \
            if block.oldest_timestamp_us else 0
        metrics.LAG_MS.labels(*self.labels).set(lag_ms)
        self._set(pending_decrees=pending, lag_ms=lag_ms)
        await self._ship(block)
        self.confirmed_decree = block.last_decree
        self._set(confirmed_decree=block.last_decree, pending_decrees=applied - block.last_decree,
                  lag_ms=lag_ms, error="", log_lost=False)
        metrics.LOG_LOST.labels(*self.labels).set(0)
        await self._report(force=False)
        return True

    async def _log_lost(self, first_index: int) -> None:
        """The entries after confirmed_decree are gone on this leader: in
        neither its Raft log nor the log tail kept with its snapshot (the tail
        was longer than ``snapshot_log_tail_bytes_max``, or the log was
        compacted before this node knew of the duplication). Never skipped silently:
        the partition resyncs — shipping starts again at its applied index,
        after a copy of every record its store holds (what those entries left,
        with their timetags; last-writer-wins on the remote) — and says so:
        ``log_lost`` and the error in ``dup status`` while the copy runs,
        ``resyncs`` counted there and in ``quorumlog_dup_resyncs``, an error line."""
        start = self.manager.host.group(self.hosted.group_id).applied_index
        message = (f"log after confirmed_decree {self.confirmed_decree} is compacted on this "
                   f"leader (first index {first_index}); resyncing: copying the partition's "
                   f"records, then shipping the log after {start}")
        metrics.LOG_LOST.labels(*self.labels).set(1)
        metrics.RESYNCS.labels(*self.labels).inc()
        _log.error("dup_log_lost", table=self.hosted.table, dup=self.dup.dup_id,
                   partition=self.hosted.partition, confirmed_decree=self.confirmed_decree,
                   first_index=first_index, resync_from=start)
        self.confirmed_decree = start
        self._set(log_lost=True, error=message, confirmed_decree=start, prepared=False,
                  resyncs=self.progress.resyncs + 1, checkpoint_records=0)
        await self._report(force=True)

    async def _ship(self, block: Block) -> None:
        """Every hash_key of the block to the remote, in parallel; slow mode
        retries each until acknowledged, skip mode counts and drops failures."""
        client = self.manager.remote_client(self.dup.remote)
        limit = asyncio.Semaphore(self.manager.settings.hash_keys_in_flight_max)

        skipped = 0

        async def one(command: DuplicateCommand) -> None:
            nonlocal skipped
            backoff_ms = RETRY_BACKOFF_MS_MIN
            while True:
                try:
                    async with limit:
                        await client.duplicate(self.hosted.table, command)
                    return
                except QuorumlogError as exc:
                    self._set(error=exc.message[:ERROR_TEXT_BYTES_MAX])
                    if self.dup.fail_mode is FailMode.SKIP:
                        skipped += len(command.records)
                        return
                    await self._report(force=False)
                    await asyncio.sleep(backoff_ms / 1000)
                    backoff_ms = min(2 * backoff_ms, RETRY_BACKOFF_MS_MAX)

        shipping = asyncio.ensure_future(
            asyncio.gather(*(one(piece) for command in block.commands.values()
                             for piece in split_duplicate(command))))
        try:
            while not shipping.done():  # the lag stays visible while a block is stuck
                await asyncio.wait({shipping}, timeout=self._report_interval_s())
                if not shipping.done():
                    self._set(lag_ms=_now_ms() - block.oldest_timestamp_us // US_PER_MS)
                    metrics.LAG_MS.labels(*self.labels).set(self.progress.lag_ms)
                    await self._report(force=True)
        finally:
            shipping.cancel()
        shipping.result()
        shipped = block.mutations - skipped
        metrics.SHIPPED_MUTATIONS.labels(*self.labels).inc(shipped)
        metrics.SHIPPED_BYTES.labels(*self.labels).inc(block.bytes if not skipped else 0)
        metrics.SKIPPED_MUTATIONS.labels(*self.labels).inc(skipped)
        self._set(shipped_mutations=self.progress.shipped_mutations + shipped,
                  shipped_bytes=self.progress.shipped_bytes + (block.bytes if not skipped else 0),
                  skipped_mutations=self.progress.skipped_mutations + skipped)

    def _report_interval_s(self) -> float:
        return max(self.manager.settings.progress_interval_ms, REPORT_INTERVAL_MS_MIN) / 1000

    async def _report(self, *, force: bool) -> None:
        """Write progress to meta (CAS) at most every progress_interval_ms, or now."""
        async with self.report_lock:
            await self._report_locked(force=force)

    async def _report_locked(self, *, force: bool) -> None:
        now = time.monotonic()
        interval_s = self.manager.settings.progress_interval_ms / 1000
        if not force and (now - self.last_report_s < interval_s
                          or self.progress == self.written):
            return  # too soon, or nothing changed since the last write
        self.last_report_s = now
        meta = self.manager.meta
        key = progress_key(self.hosted.table, self.dup.dup_id, self.hosted.partition)
        self._set(leader=self.manager.node_id, updated_ms=_now_ms())
        result = await meta.txn(
            compares=[Compare(key=key, target=CompareTarget.VERSION, op=CompareOp.EQUAL,
                              version=self.progress_version)],
            success=[PutOp(key=key, value=encode_dup(self.progress))])
        if result.succeeded:
            self.progress_version += 1
            self.written = self.progress
            self.manager.progress[(self.hosted.table, self.dup.dup_id,
                                   self.hosted.partition)] = self.progress
            return
        # Another leader wrote meanwhile (or the duplication was removed): start over.
        self.confirmed_decree = -1


def _fields(progress: DupProgress) -> dict[str, object]:
    return {name: getattr(progress, name) for name in progress.__struct_fields__}


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class DupManager:
    """Duplication on one table node; see the module docstring."""

    def __init__(self, node_id: int, host: RaftHost, meta: MetaClient, *,
                 clusters: dict[str, list[str]], settings: DupSettings,
                 hosted: Callable[[], list[HostedPartition]]) -> None:
        self.node_id = node_id
        self.host = host
        self.meta = meta
        self.clusters = clusters
        self.settings = settings
        self._hosted = hosted
        self.dups: dict[str, list[DupRecord]] = {}
        self.progress: dict[tuple[str, int, int], DupProgress] = {}
        self._known = False  # progress read from meta at least once
        self._dups_known = False  # the table watch delivered the duplications at least once
        self._shippers: dict[tuple[int, int], tuple[Shipper, asyncio.Task[None]]] = {}
        self._remotes: dict[str, TableClient] = {}
        self._task: asyncio.Task[None] | None = None

    def set_dups(self, dups: dict[str, list[DupRecord]]) -> None:
        self.dups = dups
        self._dups_known = True

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="dup-manager")

    async def close(self) -> None:
        tasks = [task for _, task in self._shippers.values()]
        if self._task is not None:
            tasks.append(self._task)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._shippers.clear()
        for client in self._remotes.values():
            await client.close()

    def remote_client(self, name: str) -> TableClient:
        client = self._remotes.get(name)
        if client is None:
            addresses = self.clusters.get(name)
            if not addresses:
                raise UnknownRemoteClusterError(
                    f"remote cluster {name!r} is not in [clusters] of node {self.node_id}'s "
                    f"config (known: {sorted(self.clusters) or 'none'}); add "
                    f"`{name} = [\"host:port\", ...]` (its meta addresses) and restart the node")
            client = TableClient(addresses, exactly_once=False,
                                 deadline_s=self.settings.remote_deadline_s)
            self._remotes[name] = client
        return client

    async def finish_prepare(self, table: str, dup_id: int) -> None:
        """Move a duplication from prepare to log once every partition copied."""
        groups = (await table_info(self.meta, table)).record.groups  # progress is per group
        progress = await read_progress(self.meta, table, dup_id)
        if len(progress) < groups or not all(p.prepared for p in progress.values()):
            return
        record, _ = await get_dup(self.meta, table, dup_id)
        if record.state is DupState.PREPARE:
            with contextlib.suppress(UsageError):  # another partition's leader did it
                await update_dup(self.meta, table, dup_id, state=DupState.LOG)
                _log.info("dup_prepared", table=table, dup=dup_id)

    def active_dups(self, table: str) -> list[DupRecord]:
        return [dup for dup in self.dups.get(table, []) if dup.active]

    def compaction_floor(self, group_id: int) -> int | None:
        """The highest log index this replica may compact up to (None: no bound)."""
        hosted = {h.group_id: h for h in self._hosted()}.get(group_id)
        if hosted is None:
            return None
        return compaction_floor_of(self.active_dups(hosted.table), self.progress,
                                   hosted.table, hosted.partition,
                                   dups_known=self._dups_known, progress_known=self._known)

    async def _loop(self) -> None:
        while True:
            try:
                if not any(self.active_dups(table) for table in self.dups):
                    self._known = False  # nothing to hold: no reads of meta meanwhile
                    self._reconcile()
                    await asyncio.sleep(self.settings.refresh_interval_ms / 1000)
                    continue
                kvs = await self.meta.list_keys(DUP_PROGRESS_PREFIX)
                self.progress = parse_progress([(kv.key, kv.value) for kv in kvs])
                self._known = True
            except QuorumlogError as exc:
                _log.warning("dup_progress_read_failed", node=self.node_id, error=exc.message)
            self._reconcile()
            await asyncio.sleep(self.settings.refresh_interval_ms / 1000)

    def _reconcile(self) -> None:
        """A shipper for each (partition led here, duplication in state log)."""
        wanted: dict[tuple[int, int], tuple[HostedPartition, DupRecord]] = {}
        for hosted in self._hosted():
            try:
                role = self.host.group(hosted.group_id).role
            except QuorumlogError:
                continue
            if role is not Role.LEADER:
                continue
            for dup in self.active_dups(hosted.table):
                if dup.state in (DupState.LOG, DupState.PREPARE):
                    wanted[(hosted.group_id, dup.dup_id)] = (hosted, dup)
        for key, (shipper, task) in list(self._shippers.items()):
            if task.done() and not task.cancelled() and task.exception() is not None:
                _log.error("dup_shipper_crashed", table=shipper.hosted.table,
                           dup=shipper.dup.dup_id, partition=shipper.hosted.partition,
                           error=repr(task.exception()))
            if key not in wanted or wanted[key][1] != shipper.dup or task.done():
                task.cancel()
                del self._shippers[key]
        for key, (hosted, dup) in wanted.items():
            if key not in self._shippers:
                shipper = Shipper(self, hosted, dup)
                task = asyncio.get_running_loop().create_task(
                    shipper.run(), name=f"dup-{hosted.table}-{dup.dup_id}-{hosted.partition}")
                self._shippers[key] = (shipper, task)


class UnknownRemoteClusterError(QuorumlogError):
    """The duplication names a cluster this node's ``[clusters]`` config lacks."""
