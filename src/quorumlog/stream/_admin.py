"""Stream administration: create, list, describe, trim (retention + TTL), delete.

Deletion is meta first: trimmed ledgers leave the ledger list and their ids
go into a ``trash/<p>-<first seq>`` record in the same transaction; then the
ledgers are deleted (their metadata keys go, bookies garbage-collect their
entries) and the record removed. A crash in between leaves the record, and the
next trim finishes the job. One trim transaction removes at most
``TRIM_LEDGERS_PER_TXN`` ledgers or ``TRIM_RUNS_PER_TXN`` archive runs; a trim
call runs up to ``TRIM_STEPS_MAX`` of them per partition and the next call goes
on. Ledgers a Spark write created but never linked (a crashed driver) have
``pending/<job>/<ledger>`` markers; trim deletes those older than
``pending_ttl_ms``.

Offloaded ledgers (tiered storage, ``_offload``): emptying the trash deletes
a trimmed ledger's Parquet file and offload record before the ledger itself;
each trim also deletes the bookies' copy of every offloaded ledger whose
deletion lag has passed (``offload-pending/`` keys).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from quorumlog.errors import DeadlineExceededError, QuorumlogError, TransientError
from quorumlog.ledger import LedgerClient
from quorumlog.log import get_logger
from quorumlog.meta import DeleteOp, PutOp
from quorumlog.stream._compaction import (
    compaction_records,
    delete_compaction,
    delete_stream_ledger,
)
from quorumlog.stream._config import OffloadPolicy, RetentionPolicy, StreamConfig
from quorumlog.stream._cursor import CursorState
from quorumlog.stream._entry import first_publish_time_ms
from quorumlog.stream._errors import (
    MessageFormatError,
    StreamExistsError,
    StreamInUseError,
    StreamNotFoundError,
)
from quorumlog.stream._layout import (
    NAMES_PREFIX,
    LedgerInfo,
    OffloadRecord,
    PartitionHead,
    PendingLedger,
    StreamRecord,
    StreamState,
    TrashRecord,
    check_name,
    config_key,
    cursor_key_kind,
    cursors_prefix,
    name_key,
    offload_key,
    offload_pending_key,
    offload_pending_prefix,
    partition_key,
    pending_prefix,
    run_key,
    stream_prefix,
    trash_key,
    trash_prefix,
    trim_step,
    writer_key,
)
from quorumlog.stream._ledgers import LedgerList
from quorumlog.stream._link import abort_job_ledgers
from quorumlog.stream._meta import CAS_ATTEMPTS_MAX, load_record, version_is
from quorumlog.stream._offload import (
    OffloadedLedger,
    drop_offloaded,
    load_offload,
    normalize_target,
    offloaded_records,
)
from quorumlog.stream._position import SeqPosition
from quorumlog.stream._retention import EntrySearch, ledgers_to_trim, ttl_mark_delete

log = get_logger(__name__)

# One trim transaction: head compare + put, whole runs deleted, one run
# rewritten, one trash record: TRIM_RUNS_PER_TXN + 4 operations, under meta's
# txn_ops_max (128). The trash record lists the ledger ids (~9 bytes each).
TRIM_LEDGERS_PER_TXN = 4096
TRIM_RUNS_PER_TXN = 64
TRIM_STEPS_MAX = 64  # trim transactions per partition per call; the next call goes on
INFO_LEDGERS_MAX = 1000  # ledgers per partition `stream info` lists (the last ones)
TRASH_RECORDS_PER_READ = 16
# Ledger deletes of `stream delete` in flight at once (each is one meta round trip).
DELETE_LEDGERS_IN_FLIGHT_MAX = 32
TTL_WINDOW_LEDGERS = 64  # ledgers before the TTL boundary looked at for the last whole one
PENDING_TTL_MS = 24 * 3600 * 1000  # a Spark write job's unlinked ledgers are orphans after this
ENTRY_END = 2**31 - 1  # batch_index meaning "every message of the entry"


async def create_stream(client: LedgerClient, name: str, config: StreamConfig) -> StreamRecord:
    check_name("stream", name)
    config.validate()
    record = StreamRecord(name=name, config=config, password=os.urandom(16),
                          created_ms=client.clock.wall_ms())
    ops: list[Any] = [PutOp(key=name_key(name), value=b""),
                      PutOp(key=config_key(name), value=record.encode())]
    empty = PartitionHead().encode()
    ops += [PutOp(key=partition_key(name, p), value=empty) for p in range(config.partitions)]
    result = await client.meta.txn(compares=[version_is(name_key(name), 0)], success=ops)
    if not result.succeeded:
        raise StreamExistsError(f"stream {name!r} already exists")
    log.info("stream_created", stream=name, partitions=config.partitions)
    return record


async def update_stream(client: LedgerClient, name: str, *,
                        retention: RetentionPolicy | None = None,
                        offload: OffloadPolicy | None = None,
                        compaction_threshold_bytes: int | None = None) -> StreamRecord:
    """Change a live stream's retention and TTL, its offload policy or its
    compaction threshold (Pulsar's ``topics set-retention``, ``set-message-ttl``,
    ``set-offload-policies``, ``set-compaction-threshold``).

    The nodes' trimmer applies them at its next round. Partitions, the
    ledgers' parameters and rollover are fixed when the stream is created.
    """
    check_name("stream", name)
    if offload is not None and offload.target.strip():
        target = await asyncio.to_thread(normalize_target, offload.target)
        offload = msgspec.structs.replace(offload, target=target)
    for _ in range(CAS_ATTEMPTS_MAX):
        kv = await client.meta.get(config_key(name))
        if kv is None:
            raise StreamNotFoundError(f"stream {name!r} does not exist")
        record = StreamRecord.decode(kv.value)
        if record.state is StreamState.DELETING:
            raise StreamNotFoundError(f"stream {name!r} is being deleted")
        config = msgspec.structs.replace(
            record.config, retention=retention or record.config.retention,
            offload=offload or record.config.offload,
            compaction_threshold_bytes=record.config.compaction_threshold_bytes
            if compaction_threshold_bytes is None else compaction_threshold_bytes)
        config.validate()
        updated = msgspec.structs.replace(record, config=config)
        if await client.meta.cas(config_key(name), kv.version, updated.encode()):
            log.info("stream_updated", stream=name, retention=msgspec.to_builtins(
                config.retention), offload=msgspec.to_builtins(config.offload),
                compaction_threshold_bytes=config.compaction_threshold_bytes)
            return updated
    raise TransientError(f"stream {name!r}: its record kept changing; nothing was updated, "
                         "try again")


async def list_streams(client: LedgerClient) -> list[str]:
    kvs = await client.meta.list_keys(NAMES_PREFIX)
    return [kv.key[len(NAMES_PREFIX):] for kv in kvs]


async def cursor_states(client: LedgerClient, stream: str
                        ) -> dict[str, dict[int, tuple[CursorState, int]]]:
    """subscription -> partition -> (state, version)."""
    prefix = cursors_prefix(stream)
    out: dict[str, dict[int, tuple[CursorState, int]]] = {}
    for kv in await client.meta.list_keys(prefix):
        subscription, _, tail = kv.key[len(prefix):].partition("/")
        if not tail.isdigit():
            continue
        out.setdefault(subscription, {})[int(tail)] = (CursorState.decode(kv.value), kv.version)
    return out


def _tier(offloaded: OffloadRecord | None) -> str:
    """Where a ledger's entries are read from: ``bookies``, ``offloaded`` (the
    Parquet file; the bookies still hold a copy) or ``offloaded-only``."""
    if offloaded is None:
        return "bookies"
    return "offloaded-only" if offloaded.bookies_deleted_ms else "offloaded"


async def stream_info(client: LedgerClient, name: str) -> dict[str, Any]:
    """Everything about a stream, as plain data (``stream info --json``)."""
    record = await load_record(client.meta, name)
    cursors = await cursor_states(client, name)
    offloaded = {r.ledger_id: r for r in await offloaded_records(client.meta, name)}
    compactions = await compaction_records(client, record)
    partitions = []
    for p in range(record.config.partitions):
        ledgers = LedgerList(client.meta, name, p)
        head = await ledgers.refresh()
        shown = [{**msgspec.to_builtins(info), "tier": _tier(offloaded.get(info.ledger_id))}
                 async for info in
                 ledgers.iterate(max(head.first_seq, head.next_seq - INFO_LEDGERS_MAX))]
        mine = [r for r in offloaded.values() if r.partition == p]
        writer = await client.meta.get(writer_key(name, p))
        partitions.append({
            "partition": p,
            "ledgers": shown,  # the last INFO_LEDGERS_MAX ledgers
            "ledger_count": head.ledger_count,
            "first_seq": head.first_seq,
            "next_seq": head.next_seq,
            "entries": head.kept_entries,
            "size_bytes": head.kept_bytes,
            "trimmed_entries": head.trimmed_entries,
            "writer_epoch": head.writer_epoch,
            "writer": writer is not None,
            "offloaded_ledgers": len(mine),
            "offloaded_bytes": sum(r.payload_bytes for r in mine),
            "compaction": msgspec.to_builtins(compactions[p])
            if p in compactions and compactions[p].ledger_id else None,
        })
    return {
        "name": name,
        "created_ms": record.created_ms,
        "config": msgspec.to_builtins(record.config),
        "partitions": partitions,
        "subscriptions": {
            sub: {str(p): msgspec.to_builtins(state) for p, (state, _) in per.items()}
            for sub, per in cursors.items()
        },
    }


@dataclass
class TrimReport:
    deleted_ledgers: list[int] = field(default_factory=list)
    expired_cursors: int = 0
    orphans_deleted: list[int] = field(default_factory=list)
    offloaded_copies_deleted: list[int] = field(default_factory=list)  # bookie copies, past lag


async def trim_stream(client: LedgerClient, name: str, *,
                      retention: RetentionPolicy | None = None, at_ms: int | None = None,
                      pending_ttl_ms: int = PENDING_TTL_MS) -> TrimReport:
    """Apply TTL and retention now; delete what they free (meta first)."""
    record = await load_record(client.meta, name)
    policy = retention or record.config.retention
    now = client.clock.wall_ms() if at_ms is None else at_ms
    report = TrimReport()
    for partition in range(record.config.partitions):
        if policy.message_ttl_ms > 0:
            report.expired_cursors += await _expire(client, record, partition,
                                                    policy.message_ttl_ms, now)
        await _trim_partition(client, record, partition, policy, now)
    report.deleted_ledgers = await _empty_trash(client, name)  # this run's and a crashed run's
    report.orphans_deleted = await _delete_orphans(client, name, now, pending_ttl_ms)
    report.offloaded_copies_deleted = await _delete_offloaded_copies(client, name, now)
    return report


async def _delete_offloaded_copies(client: LedgerClient, name: str, now: int) -> list[int]:
    """Delete the bookies' copy of every offloaded ledger whose deletion lag has
    passed; its record keeps when (``bookies_deleted_ms``)."""
    deleted = []
    prefix = offload_pending_prefix(name)
    for kv in await client.meta.list_keys(prefix):
        ledger_id = int(kv.key[len(prefix):])
        key = offload_key(name, ledger_id)
        current = await client.meta.get(key)
        if current is None:  # dropped (trimmed) meanwhile
            await client.meta.delete(kv.key)
            continue
        record = OffloadRecord.decode(current.value)
        if record.delete_after_ms > now:
            continue
        await delete_stream_ledger(client, ledger_id)
        done = msgspec.structs.replace(record, bookies_deleted_ms=now)
        await client.meta.txn(compares=[version_is(key, current.version)],
                              success=[PutOp(key=key, value=done.encode()),
                                       DeleteOp(key=offload_pending_key(name, ledger_id))])
        deleted.append(ledger_id)
        log.info("stream_offloaded_copy_deleted", stream=name, ledger_id=ledger_id)
    return deleted


async def _trim_partition(client: LedgerClient, record: StreamRecord, partition: int,
                          policy: RetentionPolicy, now: int) -> list[int]:
    """Remove the ledgers retention frees from the list, in bounded steps."""
    cursors = await cursor_states(client, record.name)
    states = [per[partition][0] for per in cursors.values() if partition in per]
    removed: list[int] = []
    for _ in range(TRIM_STEPS_MAX):
        chosen = await _trim_step(client, record, partition, states, policy=policy, now=now)
        if not chosen:
            break
        removed += chosen
    return removed


async def _trim_step(client: LedgerClient, record: StreamRecord, partition: int,
                     states: list[CursorState], *, policy: RetentionPolicy,
                     now: int) -> list[int]:
    """One transaction: the first ledgers retention frees leave the list (their
    runs deleted or rewritten, the head's counters moved) and go to the trash.
    The trash record depends on the list read, so it compares the head's version."""
    key = partition_key(record.name, partition)
    for _ in range(CAS_ATTEMPTS_MAX):
        ledgers = LedgerList(client.meta, record.name, partition)
        await ledgers.refresh()
        runs = await ledgers.leading_runs(TRIM_RUNS_PER_TXN, TRIM_LEDGERS_PER_TXN)
        head = ledgers.head  # the head the runs were read against (and its version)
        loaded: list[LedgerInfo] = [info for run in runs for info in run.ledgers]
        if not runs or runs[-1].last_seq + 1 == head.tail_first_seq:
            loaded += head.tail  # the walk may go on into the head's ledgers
        count = min(ledgers_to_trim(head, loaded, states, policy, now), TRIM_LEDGERS_PER_TXN)
        if count == 0:
            return []
        step = trim_step(head, runs, count)
        chosen = [info.ledger_id for info in step.trimmed]
        ops = [PutOp(key=key, value=step.head.encode()),
               *(DeleteOp(key=run_key(record.name, partition, last)) for last in step.deleted_runs),
               PutOp(key=trash_key(record.name, partition, head.first_seq),
                     value=TrashRecord(ledger_ids=tuple(chosen)).encode())]
        if step.rewritten is not None:
            ops.append(PutOp(key=run_key(record.name, partition, step.rewritten.last_seq),
                             value=step.rewritten.encode()))
        result = await client.meta.txn(compares=[version_is(key, ledgers.version)], success=ops)
        if result.succeeded:
            log.info("stream_trimmed", stream=record.name, partition=partition,
                     ledgers=len(chosen), first=chosen[0], last=chosen[-1])
            return chosen
    raise DeadlineExceededError(f"stream {record.name!r} partition {partition}: the ledger "
                                "list kept changing while trimming; try again")


async def _empty_trash(client: LedgerClient, name: str) -> list[int]:
    """Delete the ledgers of every trash record, then the record (a few records
    per read: each lists up to TRIM_LEDGERS_PER_TXN ids)."""
    deleted = []
    while kvs := await client.meta.list_keys(trash_prefix(name), limit=TRASH_RECORDS_PER_READ):
        for kv in kvs:
            for ledger_id in TrashRecord.decode(kv.value).ledger_ids:
                await drop_offloaded(client.meta, name, ledger_id)
                await delete_stream_ledger(client, ledger_id)
                deleted.append(ledger_id)
            await client.meta.delete(kv.key)
    return deleted


async def _delete_orphans(client: LedgerClient, name: str, now: int, ttl_ms: int) -> list[int]:
    """Abort every write job with a ledger marked pending over ``ttl_ms`` ago (its
    driver died before commit or abort) and delete its pending ledgers.

    The job is ended first (``abort_job_ledgers``: its ``jobs/`` mark, compared
    absent): a job still running past the TTL then fails its commit ("already
    ended") instead of linking ledgers this deleted, and no task attempt can
    mark a new one. A committed job is left alone."""
    prefix = pending_prefix(name)
    stale = sorted({kv.key[len(prefix):].split("/", 1)[0]
                    for kv in await client.meta.list_keys(prefix)
                    if now - PendingLedger.decode(kv.value).created_ms >= ttl_ms})
    if not stale:
        return []
    record = await load_record(client.meta, name)
    deleted = []
    for job in stale:
        log.info("stream_orphan_job_aborted", stream=name, job=job, ttl_ms=ttl_ms)
        deleted += await abort_job_ledgers(client, record, job)
    return deleted


async def _expire(client: LedgerClient, record: StreamRecord, partition: int, ttl_ms: int,
                  now: int) -> int:
    """Acknowledge messages older than the TTL on every cursor (CAS per cursor).

    The first ledger not entirely older than the cutoff is found by binary
    search; the whole ledgers before it expire (the window just before it
    holds the last of them) and, within it, the entries before the cutoff."""
    ledgers = LedgerList(client.meta, record.name, partition)
    head = await ledgers.refresh()
    cutoff = now - ttl_ms
    boundary = await ledgers.first_at_publish(cutoff)
    end = head.next_seq if boundary is None else boundary.seq
    window = [info async for info in
              ledgers.iterate(max(head.first_seq, end - TTL_WINDOW_LEDGERS), end)]
    partial = await _partial_expiry(client, record, boundary, cutoff)
    changed = 0
    for subscription, per in (await cursor_states(client, record.name)).items():
        if partition not in per:
            continue
        state, version = per[partition]
        target = ttl_mark_delete(window, state, ttl_ms, now)
        if partial is not None and (target is None or partial > target):
            target = partial
        if target is None or (state.mark_delete is not None and state.mark_delete >= target):
            continue
        new = CursorState(mark_delete=target,
                          ranges=tuple(r for r in state.ranges if r[0] > target),
                          start=state.start, updated_ms=now)
        key = f"{cursors_prefix(record.name)}{subscription}/{partition:04d}"
        if await client.meta.cas(key, version, new.encode()):
            changed += 1
    return changed


async def _partial_expiry(client: LedgerClient, record: StreamRecord,
                          info: LedgerInfo | None, cutoff: int) -> SeqPosition | None:
    """The last whole entry older than ``cutoff`` in ``info``, the first ledger
    that is not entirely older (binary search over its entries)."""
    if info is None or info.is_open or info.entries == 0 or info.first_publish_ms >= cutoff:
        return None
    offloaded = await load_offload(client.meta, record.name, info.ledger_id)
    handle: Any = (OffloadedLedger(offloaded, record.name) if offloaded is not None
                   else await client.open_ledger(info.ledger_id, password=record.password,
                                                 recovery=False))
    search = EntrySearch(0, info.entries - 1, cutoff)
    while (probe := search.probe()) is not None:
        [entry] = await handle.read_batch(probe, probe)
        search.feed(probe, first_publish_time_ms(bytes(entry.payload)))
    if search.result == 0:
        return None
    return SeqPosition(info.seq, search.result - 1, ENTRY_END, info.ledger_id)


async def stream_users(client: LedgerClient, name: str) -> tuple[list[int], list[str]]:
    """Partitions with a live writer, and subscriptions with a live consumer.

    Both hold ephemeral keys bound to their meta sessions, so a key present is a
    producer or consumer that kept its session alive within its lease.
    """
    writers_dir = writer_key(name, 0).rsplit("/", 1)[0] + "/"
    cursors_dir = cursors_prefix(name)
    partitions = [int(kv.key[len(writers_dir):])
                  for kv in await client.meta.list_keys(writers_dir)]
    subscriptions = {subscription for subscription, kind, _ in
                     (cursor_key_kind(name, kv.key)
                      for kv in await client.meta.list_keys(cursors_dir))
                     if kind in ("owner", "member")}
    return sorted(partitions), sorted(subscriptions)


async def delete_stream(client: LedgerClient, name: str, *, force: bool = False,
                        progress: Callable[[int, int], None] | None = None) -> list[int]:
    """Delete the stream: mark it, delete every ledger, then its keys.

    Refuses (:class:`StreamInUseError`) while a producer or consumer is live on
    it, unless ``force`` (Pulsar's ``topics delete`` without ``-f``); a delete
    already under way is resumed without asking again. The listed ledgers go
    ``DELETE_LEDGERS_IN_FLIGHT_MAX`` at a time; ``progress(done, total)`` is
    called as they do (the CLI's progress bar).
    """
    check_name("stream", name)
    kv = await client.meta.get(config_key(name))
    if kv is None:
        raise StreamNotFoundError(f"stream {name!r} does not exist")
    record = StreamRecord.decode(kv.value)
    if record.state is not StreamState.DELETING and not force:
        partitions, subscriptions = await stream_users(client, name)
        if partitions or subscriptions:
            users = []
            if partitions:
                users.append(f"a live producer (partitions {partitions})")
            if subscriptions:
                users.append(f"live consumers of subscriptions {subscriptions}")
            raise StreamInUseError(
                f"stream {name!r} has {' and '.join(users)}; nothing was deleted. Close them "
                "first (or wait for their leases to expire), or force the delete with "
                "--force / force=True: their next send or acknowledgement then fails")
    if record.state is not StreamState.DELETING:
        marked = msgspec.structs.replace(record, state=StreamState.DELETING)
        if not await client.meta.cas(config_key(name), kv.version, marked.encode()):
            raise StreamNotFoundError(f"stream {name!r} changed while deleting; try again")
    if force:
        await _fence_open_ledgers(client, record)
    listed = [ledger_id for partition in range(record.config.partitions)
              for ledger_id in await _partition_ledger_ids(client, name, partition)]
    done = 0
    if progress is not None:
        progress(0, len(listed))
    slots = asyncio.Semaphore(DELETE_LEDGERS_IN_FLIGHT_MAX)

    async def delete_one(ledger_id: int) -> None:
        nonlocal done
        async with slots:
            await delete_stream_ledger(client, ledger_id)
        done += 1
        if progress is not None:
            progress(done, len(listed))

    # Every task is awaited; the first error (a retriable meta failure) is
    # raised after the others finished, and a rerun resumes the delete.
    results = await asyncio.gather(*(delete_one(i) for i in listed), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    deleted = list(listed)
    deleted += await delete_compaction(client, record)
    for offloaded in await offloaded_records(client.meta, name):
        await drop_offloaded(client.meta, name, offloaded.ledger_id)
    deleted += await _empty_trash(client, name)
    deleted += await _delete_orphans(client, name, client.clock.wall_ms(), 0)
    await client.meta.txn(success=[DeleteOp(key=stream_prefix(name), prefix=True),
                                   DeleteOp(key=name_key(name))])
    log.info("stream_deleted", stream=name, ledgers=len(deleted))
    return deleted


async def _fence_open_ledgers(client: LedgerClient, record: StreamRecord) -> None:
    """Fence every partition's open ledger so live writers stop before it goes.

    Without this a producer of a force-deleted stream would go on appending to
    its ledger on the bookies (they learn of a deletion only at their next
    garbage collection) and see its sends succeed. Fenced, its next append
    fails and it finds the stream gone.
    """
    for partition in range(record.config.partitions):
        try:
            head = await LedgerList(client.meta, record.name, partition).refresh()
        except QuorumlogError as exc:
            log.info("stream_delete_head_unreadable", stream=record.name, partition=partition,
                     error=exc.message)
            continue
        open_ledger = head.open_ledger
        if open_ledger is None:
            continue
        try:
            await client.open_ledger(open_ledger.ledger_id, password=record.password,
                                     recovery=True)
        except QuorumlogError as exc:
            if exc.retriable:
                raise
            log.info("stream_delete_fence_skipped", ledger_id=open_ledger.ledger_id,
                     error=exc.message)


async def _partition_ledger_ids(client: LedgerClient, name: str, partition: int) -> list[int]:
    """Every ledger id of the partition's list; also of a list in the old layout
    (one value, version 1), so that such a stream can still be deleted."""
    ledgers = LedgerList(client.meta, name, partition)
    try:
        await ledgers.refresh()
    except MessageFormatError:
        kv = await client.meta.get(partition_key(name, partition))
        if kv is None:
            return []
        try:
            legacy = msgspec.msgpack.decode(kv.value, type=_LegacyList)
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise MessageFormatError(f"stream {name!r} partition {partition}: the ledger list "
                                     "in meta is malformed") from None
        return [info.ledger_id for info in legacy.ledgers]
    return [info.ledger_id async for info in ledgers.iterate(ledgers.head.first_seq)]


class _LegacyLedger(msgspec.Struct):
    ledger_id: int


class _LegacyList(msgspec.Struct):
    """The ledger ids of a version-1 partition value (one list of every ledger)."""

    ledgers: list[_LegacyLedger]
