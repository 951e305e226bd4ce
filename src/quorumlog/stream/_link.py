"""Writing ledgers outside the partition writer and linking them atomically.

This is the all-or-nothing write path of Spark jobs:

1. each task writes its rows into its own new ledger per stream partition
   (:class:`JobLedgerWriter`), after putting a ``pending/<job>/<ledger>``
   marker, and closes it;
2. the driver's commit (:func:`link_job_ledgers`) links every task's ledgers
   into the partitions' ledger lists in **one** meta transaction, which also
   removes the job's pending markers (and, for a streaming write, records the
   micro-batch id, so a batch committed once is never linked again);
3. abort (:func:`abort_job_ledgers`) deletes them.

The commit's transaction writes each touched partition's head (compare and
put; the linked ledgers go into the head's tail, or also into archive runs
when one partition gets more than a head holds) plus the job's own
operations (job mark compare and put, the pending markers' prefix delete, a
streaming write's sink mark compare and put): ``LINK_FIXED_OPS + 2 *
partitions`` operations for ordinary jobs. Meta bounds
one transaction to ``txn_ops_max`` (128) operations and one Raft entry to
8 MiB, hence ``LINK_LEDGERS_MAX`` and the check in :func:`commit_ops`, which
fails a commit that would pass them with a clear error before sending it.
After the commit each touched head is tidied (its long tail archived) in
its own transaction: that changes how the list is stored, not the list.

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
from quorumlog.clock import Clock
from quorumlog.errors import DeadlineExceededError, QuorumlogError, UsageError
from quorumlog.ledger import LedgerClient, WriteHandle
from quorumlog.log import get_logger
from quorumlog.meta import Compare, DeleteOp, Op, PutOp
from quorumlog.stream._config import LINK_FIXED_OPS, LINK_OPS_PER_PARTITION, TXN_OPS_MAX
from quorumlog.stream._entry import OutgoingMessage, encode_entry
from quorumlog.stream._errors import JobEndedError
from quorumlog.stream._layout import (
    HEAD_LEDGERS_MAX,
    LEDGER_META_JOB,
    LEDGER_META_PARTITION,
    LEDGER_META_STREAM,
    RUN_LEDGERS_MAX,
    JobMark,
    JobState,
    LedgerStats,
    PartitionHead,
    PendingLedger,
    SinkMark,
    StreamRecord,
    check_name,
    job_key,
    jobs_prefix,
    partition_key,
    pending_key,
    pending_prefix,
    run_key,
    sink_key,
)
from quorumlog.stream._meta import (
    CAS_ATTEMPTS_MAX,
    load_head,
    tidy_partition,
    version_is,
)
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
# Ledgers one commit links: their records (~180 bytes each, at most
# LEDGER_RECORD_BYTES_MAX) ride in one Raft entry, which meta caps at 8 MiB.
LINK_LEDGERS_MAX = 16_384


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
        self._created_ms = self._client.clock.wall_ms()
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
            await self._client.delete_ledger(self.ledger_id, force=True)
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
                await self._client.delete_ledger(self.ledger_id, force=True)
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
                                                     committed_ms=client.clock.wall_ms()).encode()))
        heads = {}
        for partition, stats in sorted(ledgers.items()):
            if stats:
                head, kv = await load_head(client.meta, stream, partition)
                heads[partition] = (await _closed_for_link(client, record, head), kv.version)
        linked_ids = {s.ledger_id for stats in ledgers.values() for s in stats}
        # Ledgers of failed task attempts of this job: marked pending, never linked.
        leftovers = [int(kv.key.rsplit("/", 1)[1])
                     for kv in await client.meta.list_keys(pending_prefix(stream, job))]
        leftovers = [i for i in leftovers if i not in linked_ids]
        ops.append(DeleteOp(key=pending_prefix(stream, job), prefix=True))
        compares.append(version_is(job_key(stream, job), 0))
        ended = JobMark(state=JobState.COMMITTED, ended_ms=client.clock.wall_ms())
        ops.append(PutOp(key=job_key(stream, job), value=ended.encode()))
        link_compares, link_ops = commit_ops(stream, job, heads, ledgers, client.clock.wall_ms(),
                                             fixed_ops=len(compares) + len(ops))
        result = await client.meta.txn(compares=[*compares, *link_compares],
                                       success=[*ops, *link_ops])
        if not result.succeeded and await _job_state(client, stream, job) is not None:
            raise UsageError(f"write job {job} of stream {stream!r} has already ended; "
                             "a job is committed or aborted once")
        if result.succeeded:
            log.info("stream_job_linked", stream=stream, job=job, ledgers=len(linked_ids),
                     discarded=len(leftovers))
            await _after_link(client, stream, heads, leftovers)
            return True
        await asyncio.sleep(min(0.2, 0.002 * 2**min(attempt, 7)) * rng.random())
    raise DeadlineExceededError(f"stream {stream!r}: the ledger lists kept changing while "
                                f"linking job {job}; it was not linked (abort deletes it)")


def commit_ops(stream: str, job: str, heads: dict[int, tuple[PartitionHead, int]],
               ledgers: dict[int, list[LedgerStats]], closed_ms: int, *,
               fixed_ops: int = LINK_FIXED_OPS) -> tuple[list[Compare], list[Op]]:
    """The heads' compares and puts that link ``ledgers`` (pure).

    ``heads`` maps partition -> (head with no open ledger, its version).
    Raises UsageError when the commit would pass meta's bounds on one
    transaction (``LINK_LEDGERS_MAX`` ledgers, ``TXN_OPS_MAX`` operations
    with the job's own ``fixed_ops``)."""
    total = sum(len(stats) for stats in ledgers.values())
    if total > LINK_LEDGERS_MAX:
        raise UsageError(
            f"write job {job} of stream {stream!r} wrote {total} ledgers; one commit links at "
            f"most {LINK_LEDGERS_MAX} (they go into one meta transaction): write the data in "
            "several jobs, or with fewer Spark tasks (coalesce the DataFrame)")
    compares: list[Compare] = []
    ops: list[Op] = []
    for partition, stats in sorted(ledgers.items()):
        if not stats:
            continue
        head, version = heads[partition]
        linked, runs = head.with_ledgers_linked(stats, closed_ms).archived(HEAD_LEDGERS_MAX)
        compares.append(version_is(partition_key(stream, partition), version))
        ops.append(PutOp(key=partition_key(stream, partition), value=linked.encode()))
        ops += [PutOp(key=run_key(stream, partition, run.last_seq), value=run.encode())
                for run in runs]
    needed = fixed_ops + len(compares) + len(ops)
    if needed > TXN_OPS_MAX:
        most = (TXN_OPS_MAX - LINK_FIXED_OPS) // LINK_OPS_PER_PARTITION
        raise UsageError(
            f"write job {job} of stream {stream!r} links ledgers into {len(compares)} "
            f"partitions: that needs {needed} meta operations in one transaction, more than "
            f"meta's txn_ops_max {TXN_OPS_MAX}. A commit links into at most {most} partitions "
            f"(one more operation per {RUN_LEDGERS_MAX} ledgers past {HEAD_LEDGERS_MAX} in one "
            "partition): write the partitions in several jobs (filter the DataFrame by its "
            "`partition` column)")
    return compares, ops


async def _after_link(client: LedgerClient, stream: str,
                      heads: dict[int, tuple[PartitionHead, int]], leftovers: list[int]) -> None:
    """Tidy the heads the commit grew, delete failed attempts' ledgers, forget old jobs.

    None of it changes what the stream holds; what a crash leaves here is
    done by the next writer or trim (tails), or ``stream trim`` (orphans)."""
    for partition in heads:
        try:
            await tidy_partition(client.meta, stream, partition)
        except QuorumlogError as exc:
            log.warning("stream_tidy_after_link_failed", stream=stream, partition=partition,
                        error=exc.message)
    for ledger_id in leftovers:
        try:
            await client.delete_ledger(ledger_id, force=True)
        except QuorumlogError as exc:
            log.warning("job_ledger_leftover_not_deleted", ledger_id=ledger_id,
                        error=exc.message)
    await _forget_old_jobs(client, stream)


async def _closed_for_link(client: LedgerClient, record: StreamRecord,
                           head: PartitionHead) -> PartitionHead:
    current = head.open_ledger
    if current is None:
        return head
    stats = await recover_ledger_stats(client, record, current.ledger_id, current.created_ms)
    return head.with_ledger_closed(stats, client.clock.wall_ms())


async def abort_job_ledgers(client: LedgerClient, record: StreamRecord, job: str,
                            ledgers: dict[int, list[LedgerStats]] | None = None,
                            extra_ids: Iterable[int] = ()) -> list[int]:
    """End the job as aborted, then delete its ledgers: those given, and every
    one still marked pending. A job that was committed is left alone."""
    stream = record.name
    mark = JobMark(state=JobState.ABORTED, ended_ms=client.clock.wall_ms()).encode()
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
            await client.delete_ledger(ledger_id, force=True)
        except QuorumlogError as exc:
            if exc.retriable:
                raise
    await client.meta.delete(pending_prefix(record.name, job), prefix=True)
    await _forget_old_jobs(client, stream)
    return sorted(ids)


async def _job_state(client: LedgerClient, stream: str, job: str) -> JobState | None:
    kv = await client.meta.get(job_key(stream, job))
    return None if kv is None else JobMark.decode(kv.value).state


def new_job_id(kind: str, clock: Clock) -> str:
    """A job id that sorts by creation time (``clock``'s), so old job marks are
    found by a range read."""
    check_name("job kind", kind)
    return f"{clock.wall_ms():013d}-{kind}-{uuid.uuid4().hex[:16]}"


async def _forget_old_jobs(client: LedgerClient, stream: str) -> None:
    """Remove marks of jobs that ended over JOB_MARK_RETENTION_MS ago.

    Ids from :func:`new_job_id` sort by creation time, so only jobs created
    before the horizon are read (at most JOB_MARKS_SCAN_MAX keys, at most
    JOB_MARKS_FORGET_MAX deleted per call)."""
    horizon = client.clock.wall_ms() - JOB_MARK_RETENTION_MS
    result, _ = await client.meta.range(jobs_prefix(stream),
                                        end=f"{jobs_prefix(stream)}{horizon:013d}",
                                        limit=JOB_MARKS_SCAN_MAX)
    old = [kv.key for kv in result.kvs if JobMark.decode(kv.value).ended_ms < horizon]
    for key in old[:JOB_MARKS_FORGET_MAX]:
        await client.meta.delete(key)
