"""The Spark offload job (tiered storage): a stream's closed ledgers copied to
Parquet, one unit of work per ledger.

    from quorumlog.spark import local_session, offload
    result = offload(local_session(), meta="127.0.0.1:7101", stream="events",
                     target="/data/offload")

The driver lists the closed ledgers that are not offloaded yet
(``stream.offload_candidates``: per partition the newest closed ledgers
holding up to ``keep_bytes`` stay on the bookies only, Pulsar's offload
threshold) and parallelizes them. Each Spark task copies its ledgers, each to
a new Parquet file under ``target``, reads every file back and checks it
against what the bookies held, then commits the ledger's offload record in
meta (``stream.offload_ledger``). From then on every reader, this data source
included, reads those ledgers from their files; the nodes' stream trimmer
deletes the bookies' copy once ``deletion_lag_ms`` has passed. A ledger that
fails is reported (``failed``) and left on the bookies; running the job
again offloads what is left, and deletes the files of runs that died
before their commit (``stream.sweep_orphans``, once an hour old). See
docs/stream.md, "Tiered storage".
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from quorumlog.errors import QuorumlogError, UsageError
from quorumlog.spark import _io
from quorumlog.stream import (
    DELETION_LAG_MS_DEFAULT,
    LedgerInfo,
    OffloadOutcome,
    load_record,
    normalize_target,
    offload_candidates,
    offload_ledger,
    sweep_orphans,
)

OFFLOAD_TASKS_MAX = 64
"""Spark tasks of one offload run: ledgers are spread over at most this many."""
OUTCOME_FIELDS = ("partition", "ledger_id", "seq", "status", "entries", "payload_bytes",
                  "file_bytes", "url", "error")


@dataclass(slots=True)
class OffloadResult:
    stream: str
    target: str
    candidates: int = 0         # closed ledgers not offloaded when the job was planned
    offloaded: int = 0
    already: int = 0            # offloaded by another run meanwhile
    trimmed: int = 0            # trimmed by retention meanwhile (file and record dropped)
    entries: int = 0
    payload_bytes: int = 0
    file_bytes: int = 0
    failed: list[tuple[int, str]] = field(default_factory=list)  # (ledger id, error)
    orphans_deleted: list[str] = field(default_factory=list)  # files of runs that died
    outcomes: list[OffloadOutcome] = field(default_factory=list)
    seconds: float = 0.0


def _offload_partition(addresses: tuple[str, ...], stream: str, target: str,
                       deletion_lag_ms: int,
                       items: Iterator[tuple[int, LedgerInfo]]) -> Iterator[tuple[Any, ...]]:
    """Runs in a Spark Python worker: offload this task's ledgers, one by one
    (one bounded call each); a ledger that fails is reported, not raised."""
    for partition, info in items:
        async def go(partition: int = partition, info: LedgerInfo = info) -> OffloadOutcome:
            client = await _io._client(addresses)
            record = await load_record(client.meta, stream)
            return await offload_ledger(client, record, partition, info, target,
                                        deletion_lag_ms=deletion_lag_ms)

        try:
            outcome = _io.run(go())
        except QuorumlogError as exc:
            yield (partition, info.ledger_id, info.seq, "failed", 0, 0, 0, "", exc.message)
            continue
        yield tuple(getattr(outcome, name) for name in OUTCOME_FIELDS)


def offload(spark: Any, meta: str | Sequence[str], stream: str, target: str, *,
            keep_bytes: int = 0, deletion_lag_ms: int = DELETION_LAG_MS_DEFAULT,
            partitions: Sequence[int] | None = None, tasks: int | None = None) -> OffloadResult:
    """Offload ``stream``'s closed ledgers to Parquet files under ``target``
    (a directory or a URL); see the module docstring."""
    addresses = [a.strip() for a in (meta.split(",") if isinstance(meta, str) else meta)
                 if a.strip()]
    if not addresses:
        raise UsageError("offload needs the meta addresses of the cluster")
    if tasks is not None and tasks <= 0:
        raise UsageError(f"offload tasks must be positive, not {tasks}")
    if deletion_lag_ms < 0:
        raise UsageError(f"the deletion lag must be 0 or more ms, not {deletion_lag_ms}")
    target = normalize_target(target)
    started = time.monotonic()

    async def plan() -> list[tuple[int, LedgerInfo]]:
        client = await _io._client(tuple(addresses))
        record = await load_record(client.meta, stream)
        return await offload_candidates(client, record, keep_bytes=keep_bytes,
                                        partitions=partitions)

    items = _io.run(plan())
    out = OffloadResult(stream=stream, target=target, candidates=len(items))
    if items:
        slices = tasks or max(1, min(len(items), OFFLOAD_TASKS_MAX))
        rows = spark.sparkContext.parallelize(items, slices).mapPartitions(
            partial(_offload_partition, tuple(addresses), stream, target,
                    deletion_lag_ms)).collect()
        for row in sorted(rows):
            outcome = OffloadOutcome(*row)
            if outcome.status == "failed":
                out.failed.append((outcome.ledger_id, outcome.error))
                continue
            out.outcomes.append(outcome)
            if outcome.status == "offloaded":
                out.offloaded += 1
                out.entries += outcome.entries
                out.payload_bytes += outcome.payload_bytes
                out.file_bytes += outcome.file_bytes
            elif outcome.status == "already":
                out.already += 1
            else:
                out.trimmed += 1

    async def sweep() -> list[str]:
        client = await _io._client(tuple(addresses))
        return await sweep_orphans(client.meta, stream, target, client.clock.wall_ms())

    out.orphans_deleted = _io.run(sweep())
    out.seconds = time.monotonic() - started
    return out
