"""Writing ledgers outside the partition writer and linking them atomically.

This is the all-or-nothing write path of Spark jobs:

1. each task writes its rows into its own new ledger per stream partition
   (:func:`write_job_ledger`), after putting a ``pending/<job>/<ledger>``
   marker, and closes it;
2. the driver's commit (:func:`link_job_ledgers`) links every task's ledgers
   into the partitions' ledger lists in **one** meta transaction, which also
   removes the job's pending markers (and, for a streaming write, records the
   micro-batch id, so a batch committed once is never linked again);
3. abort (:func:`abort_job_ledgers`) deletes them.

Commit and abort both end the job by writing its ``jobs/<job>`` mark in the
same step that decides its fate; a pending marker can only be put while that
mark is absent (one transaction). Spark may still run task attempts after the
driver gave up on a job (tasks of a failed stage are killed asynchronously), so
without the mark a late attempt would leave a ledger nobody links or deletes.
With it, the late attempt's marker transaction fails and it deletes its own
ledger; every marker put before the mark is seen by the commit or the abort.

Only the last ledger of a list may be open, so the commit first fences and
recovers the partition's open ledger (the live writer's appends then fail as
fenced; the writer completes what was durable and goes on in a new ledger
after the linked ones: ``_writer`` step 5).
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Iterable

from quorumlog import rpc
from quorumlog.errors import DeadlineExceededError, QuorumlogError, UsageError
from quorumlog.ledger import LedgerClient, WriteHandle
from quorumlog.log import get_logger
from quorumlog.meta import Compare, DeleteOp, PutOp
from quorumlog.meta._commands import Op
from quorumlog.stream._entry import OutgoingMessage, encode_entry
from quorumlog.stream._errors import JobEndedError
from quorumlog.stream._layout import (
    LEDGER_META_JOB,
    LEDGER_META_PARTITION,
    LEDGER_META_STREAM,
    JobMark,
    JobState,
    LedgerStats,
    PartitionLedgers,
    PendingLedger,
    SinkMark,
    StreamRecord,
    check_name,
    job_key,
    jobs_prefix,
    partition_key,
    pending_key,
    pending_prefix,
    sink_key,
)
from quorumlog.stream._meta import CAS_ATTEMPTS_MAX, load_partition, now_ms, version_is
from quorumlog.stream._writer import recover_ledger_stats

log = get_logger(__name__)

APPENDS_IN_FLIGHT_MAX = 256  # pipelined appends of one task ledger
ENTRY_BYTES_TARGET = 128 * 1024  # messages packed per entry (same as the producer's batch)
ENTRY_MESSAGES_MAX = 1000
# Job marks outlive every task attempt of their job by far; older ones are
# removed (at most JOB_MARKS_FORGET_MAX per commit or abort) to keep meta small.
JOB_MARK_RETENTION_MS = 24 * 3600 * 1000
JOB_MARKS_FORGET_MAX = 100
JOB_MARKS_SCAN_MAX = 1000


class JobLedgerWriter:
    """Writes messages of one job into a new ledger of one partition (not linked)."""

    def __init__(self, client: LedgerClient, record: StreamRecord, partition: int,
                 job: str) -> None:
        check_name("job id", job)
        self._client = client
        self._record = record
        self.partition = partition
        self._job = job
        self._handle: WriteHandle | None = None
        self.ledger_id = -1
        self._batch: list[OutgoingMessage] = []
        self._batch_bytes = 0
        self._inflight: set[asyncio.Future[int]] = set()
        self._entries = 0
        self._size = 0
        self._first_ms = 0
        self._last_ms = 0
        self._last_entry_messages = 0
        self._created_ms = 0

    async def open(self) -> None:
        config = self._record.config
        self._created_ms = now_ms()
        handle = await self._client.create_ledger(
            ensemble=config.ensemble_size, write_quorum=config.write_quorum,
            ack_quorum=config.ack_quorum, digest=config.digest.value,
            password=self._record.password,
            metadata={LEDGER_META_STREAM: self._record.name.encode(),
                      LEDGER_META_PARTITION: str(self.partition).encode(),
                      LEDGER_META_JOB: self._job.encode()},
        )
        self._handle = handle
        self.ledger_id = int(handle.id)
        marker = PendingLedger(partition=self.partition, created_ms=self._created_ms)
        stream = self._record.name
        result = await self._client.meta.txn(
            compares=[version_is(job_key(stream, self._job), 0)],
            success=[PutOp(key=pending_key(stream, self._job, self.ledger_id),
                           value=marker.encode())])
        if not result.succeeded:
            await self._client.delete_ledger(self.ledger_id)
            self.ledger_id = -1
            raise JobEndedError(f"write job {self._job} of stream {stream!r} has already "
                                "ended (committed or aborted); this task attempt wrote nothing")

    async def add(self, message: OutgoingMessage) -> None:
        self._batch.append(message)
        self._batch_bytes += message.encoded_size()
        if len(self._batch) >= ENTRY_MESSAGES_MAX or self._batch_bytes >= ENTRY_BYTES_TARGET:
            await self._flush()

    async def _flush(self) -> None:
        if not self._batch:
            return
        payload = encode_entry(self._batch)
        if self._entries == 0:
            self._first_ms = self._batch[0].publish_time_ms
        self._last_ms = self._batch[-1].publish_time_ms
        self._last_entry_messages = len(self._batch)
        self._entries += 1
        self._size += len(payload)
        self._batch, self._batch_bytes = [], 0
        assert self._handle is not None
        while True:
            if len(self._inflight) < APPENDS_IN_FLIGHT_MAX:
                try:
                    self._inflight.add(self._handle.append_async(payload))
                    return
                except rpc.BackpressureError:
                    pass
            done, _ = await asyncio.wait(self._inflight, return_when=asyncio.FIRST_COMPLETED)
            self._inflight -= done
            for future in done:
                future.result()

    async def close(self) -> LedgerStats:
        await self._flush()
        if self._inflight:
            await asyncio.gather(*self._inflight)
            self._inflight.clear()
        assert self._handle is not None
        await self._handle.close()
        return LedgerStats(ledger_id=self.ledger_id, entries=self._entries, size_bytes=self._size,
                           first_publish_ms=self._first_ms, last_publish_ms=self._last_ms,
                           last_entry_messages=self._last_entry_messages,
                           created_ms=self._created_ms)

    async def discard(self) -> None:
        """Delete the ledger and its marker (a failed task cleans up after itself)."""
        for future in self._inflight:
            future.cancel()
        if self.ledger_id >= 0:
            try:
                await self._client.delete_ledger(self.ledger_id)
                await self._client.meta.delete(
                    pending_key(self._record.name, self._job, self.ledger_id))
            except QuorumlogError as exc:
                log.warning("job_ledger_discard_failed", ledger_id=self.ledger_id,
                            error=exc.message)


async def link_job_ledgers(client: LedgerClient, record: StreamRecord, job: str,
                           ledgers: dict[int, list[LedgerStats]], *,
                           sink: tuple[str, int] | None = None) -> bool:
    """Link every ledger of the job into its partition, in one transaction.

    ``ledgers`` maps partition -> closed ledgers in the order to link them.
    ``sink`` = (writer id, micro-batch id) makes the link idempotent per batch:
    returns False (and deletes the ledgers) if that batch was linked before.
    """
    stream = record.name
    for partition in ledgers:
        if not 0 <= partition < record.config.partitions:
            raise UsageError(f"stream {stream!r} has no partition {partition}")
    rng = random.Random()
    for attempt in range(CAS_ATTEMPTS_MAX):
        compares: list[Compare] = []
        ops: list[Op] = []
        if sink is not None:
            writer_id, batch_id = sink
            key = sink_key(stream, writer_id)
            kv = await client.meta.get(key)
            if kv is not None and SinkMark.decode(kv.value).batch_id >= batch_id:
                log.info("stream_batch_already_linked", stream=stream, writer=writer_id,
                         batch=batch_id)
                await abort_job_ledgers(client, record, job, ledgers)
                return False
            compares.append(version_is(key, kv.version if kv else 0))
            ops.append(PutOp(key=key, value=SinkMark(batch_id=batch_id,
                                                     committed_ms=now_ms()).encode()))
        for partition, stats in sorted(ledgers.items()):
            if not stats:
                continue
            listing, kv = await load_partition(client.meta, stream, partition)
            listing = await _closed_for_link(client, record, listing)
            linked = listing.with_ledgers_linked(list(stats), now_ms())
            compares.append(version_is(partition_key(stream, partition), kv.version))
            ops.append(PutOp(key=partition_key(stream, partition), value=linked.encode()))
        linked_ids = {s.ledger_id for stats in ledgers.values() for s in stats}
        # Ledgers of failed task attempts of this job: marked pending, never linked.
        leftovers = [int(kv.key.rsplit("/", 1)[1])
                     for kv in await client.meta.list_keys(pending_prefix(stream, job))]
        leftovers = [i for i in leftovers if i not in linked_ids]
        ops.append(DeleteOp(key=pending_prefix(stream, job), prefix=True))
        compares.append(version_is(job_key(stream, job), 0))
        ops.append(PutOp(key=job_key(stream, job),
                         value=JobMark(state=JobState.COMMITTED, ended_ms=now_ms()).encode()))
        result = await client.meta.txn(compares=compares, success=ops)
        if not result.succeeded and await _job_state(client, stream, job) is not None:
            raise UsageError(f"write job {job} of stream {stream!r} has already ended; "
                             "a job is committed or aborted once")
        if result.succeeded:
            log.info("stream_job_linked", stream=stream, job=job, ledgers=len(linked_ids),
                     discarded=len(leftovers))
            for ledger_id in leftovers:
                try:
                    await client.delete_ledger(ledger_id)
                except QuorumlogError as exc:
                    log.warning("job_ledger_leftover_not_deleted", ledger_id=ledger_id,
                                error=exc.message)
            await _forget_old_jobs(client, stream)
            return True
        await asyncio.sleep(min(0.2, 0.002 * 2**min(attempt, 7)) * rng.random())
    raise DeadlineExceededError(f"stream {stream!r}: the ledger lists kept changing while "
                                f"linking job {job}; it was not linked (abort deletes it)")


async def _closed_for_link(client: LedgerClient, record: StreamRecord,
                           listing: PartitionLedgers) -> PartitionLedgers:
    current = listing.open_ledger
    if current is None:
        return listing
    stats = await recover_ledger_stats(client, record, current.ledger_id, current.created_ms)
    return listing.with_ledger_closed(stats, now_ms())


async def abort_job_ledgers(client: LedgerClient, record: StreamRecord, job: str,
                            ledgers: dict[int, list[LedgerStats]] | None = None,
                            extra_ids: Iterable[int] = ()) -> list[int]:
    """End the job as aborted, then delete its ledgers: those given, and every
    one still marked pending. A job that was committed is left alone."""
    stream = record.name
    mark = JobMark(state=JobState.ABORTED, ended_ms=now_ms()).encode()
    ended = await client.meta.txn(compares=[version_is(job_key(stream, job), 0)],
                                  success=[PutOp(key=job_key(stream, job), value=mark)])
    if not ended.succeeded and await _job_state(client, stream, job) is JobState.COMMITTED:
        log.warning("stream_job_abort_after_commit_ignored", stream=stream, job=job)
        return []
    ids = {s.ledger_id for stats in (ledgers or {}).values() for s in stats} | set(extra_ids)
    for kv in await client.meta.list_keys(pending_prefix(record.name, job)):
        ids.add(int(kv.key.rsplit("/", 1)[1]))
    for ledger_id in sorted(ids):
        try:
            await client.delete_ledger(ledger_id)
        except QuorumlogError as exc:
            if exc.retriable:
                raise
    await client.meta.delete(pending_prefix(record.name, job), prefix=True)
    await _forget_old_jobs(client, stream)
    return sorted(ids)


async def _job_state(client: LedgerClient, stream: str, job: str) -> JobState | None:
    kv = await client.meta.get(job_key(stream, job))
    return None if kv is None else JobMark.decode(kv.value).state


def new_job_id(kind: str) -> str:
    """A job id that sorts by creation time, so old job marks are found by a range read."""
    check_name("job kind", kind)
    return f"{now_ms():013d}-{kind}-{uuid.uuid4().hex[:16]}"


async def _forget_old_jobs(client: LedgerClient, stream: str) -> None:
    """Remove marks of jobs that ended over JOB_MARK_RETENTION_MS ago.

    Ids from :func:`new_job_id` sort by creation time, so only jobs created
    before the horizon are read (at most JOB_MARKS_SCAN_MAX keys, at most
    JOB_MARKS_FORGET_MAX deleted per call)."""
    horizon = now_ms() - JOB_MARK_RETENTION_MS
    result, _ = await client.meta.range(jobs_prefix(stream),
                                        end=f"{jobs_prefix(stream)}{horizon:013d}",
                                        limit=JOB_MARKS_SCAN_MAX)
    old = [kv.key for kv in result.kvs if JobMark.decode(kv.value).ended_ms < horizon]
    for key in old[:JOB_MARKS_FORGET_MAX]:
        await client.meta.delete(key)
