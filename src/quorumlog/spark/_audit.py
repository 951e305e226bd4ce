"""The Spark audit (scrub) job: every replica of every entry of every closed
ledger, read and digest-checked, one unit of work per fragment.

    from quorumlog.spark import audit, local_session
    result = audit(local_session(), meta="127.0.0.1:7101", output="/tmp/audit.parquet")

The driver lists the ledgers in meta and parallelizes their (ledger,
fragment) pairs; each Spark task audits its fragments (``recovery.
audit_fragment``: per bookie of the fragment, the entries its write sets put
on it - held with a matching digest, missing, corrupt or unreadable) and, for
each ledger's first fragment, asks the other registered bookies whether they
hold the ledger anyway (extra replicas). The report has one row per replica
(``REPORT_DDL``); it is written as Parquet when ``output`` is given, and the
driver returns counts by status and the problem rows. With ``repair=True``
the driver files an under-replication task for each ledger with a missing or
corrupt replica (the recovery workers copy those replicas elsewhere), and
drops the extra copies of ledgers found fully replicated
(``recovery.delete_extra_copies``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from quorumlog import proto as wire
from quorumlog.clock import SYSTEM_CLOCK
from quorumlog.errors import UsageError
from quorumlog.ledger import LedgerClient, LedgerMetadata
from quorumlog.recovery import (
    PROBLEMS,
    ReplicaReport,
    audit_extra,
    audit_fragment,
    delete_extra_copies,
    repair_tasks,
)
from quorumlog.spark import _io

AUDIT_TASKS_MAX = 256
"""Spark tasks of one audit: fragments are spread over at most this many."""
FRAGMENTS_IN_FLIGHT_MAX = 16
"""Fragments one Spark task audits at once."""
READS_IN_FLIGHT_MAX = 32
"""Replica reads in flight for one fragment."""
REQUEST_TIMEOUT_S = 10.0
"""One bookie read; past it the replica counts as unreachable for that entry."""
LEDGERS_PER_PAGE = 1_000
"""Ledger metadata keys read per meta range call while planning."""

REPORT_COLUMNS = ("ledger_id", "fragment_index", "first_entry_id", "last_entry_id", "bookie",
                  "status", "expected", "held", "missing", "corrupt", "unreachable",
                  "first_bad_entry", "detail")
REPORT_DDL = ("ledger_id long, fragment_index int, first_entry_id long, last_entry_id long, "
              "bookie string, status string, expected long, held long, missing long, "
              "corrupt long, unreachable long, first_bad_entry long, detail string")


@dataclass(slots=True)
class AuditResult:
    ledgers: int = 0              # closed ledgers audited
    ledgers_open: int = 0         # skipped: still open (their writer owns the tail)
    fragments: int = 0
    replicas: int = 0             # report rows (replica of a fragment, or extra copy)
    entries_read: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    problems: list[ReplicaReport] = field(default_factory=list)
    tasks_filed: list[int] = field(default_factory=list)
    extra_deleted: list[tuple[int, str]] = field(default_factory=list)  # (ledger, bookie)
    output: str | None = None
    seconds: float = 0.0


def _row(report: ReplicaReport) -> tuple[Any, ...]:
    return tuple(getattr(report, name) for name in REPORT_COLUMNS)


async def _plan(addresses: Sequence[str]) -> tuple[list[tuple[int, int]], int, list[str]]:
    """(ledger, fragment) pairs of every closed ledger with entries, the number
    of open ledgers skipped, and the registered bookies."""
    client = await _io._client(tuple(addresses))
    items: list[tuple[int, int]] = []
    open_ledgers = 0
    start, end = wire.LEDGER_KEY_PREFIX, wire.LEDGER_KEY_PREFIX[:-1] + chr(ord("/") + 1)
    while True:
        result, _ = await client.meta.range(start, end=end, limit=LEDGERS_PER_PAGE)
        for kv in result.kvs:
            metadata = LedgerMetadata.decode(kv.value)
            if not metadata.is_closed:
                open_ledgers += 1
                continue
            items.extend((metadata.ledger_id, index) for index, fragment
                         in enumerate(metadata.ensembles)
                         if fragment.first_entry_id <= metadata.last_entry_id or index == 0)
        if len(result.kvs) < LEDGERS_PER_PAGE:
            break
        start = result.kvs[-1].key + "\x00"
    registered = sorted(kv.key[len(wire.BOOKIE_REGISTRY_PREFIX):]
                        for kv in await client.meta.list_keys(wire.BOOKIE_REGISTRY_PREFIX))
    return items, open_ledgers, registered


async def _audit_one(client: LedgerClient, ledger_id: int, fragment_index: int,
                     registered: Sequence[str]) -> list[ReplicaReport]:
    try:
        metadata, _ = await client.context.load_metadata(ledger_id)
    except wire.NoSuchLedgerError:
        return []  # deleted since the plan
    reports = await audit_fragment(client, metadata, fragment_index,
                                   reads_in_flight_max=READS_IN_FLIGHT_MAX,
                                   timeout_s=REQUEST_TIMEOUT_S)
    if fragment_index == 0:
        reports += await audit_extra(client, metadata, registered, timeout_s=REQUEST_TIMEOUT_S)
    return reports


async def _audit_many(addresses: tuple[str, ...], registered: tuple[str, ...],
                      items: list[tuple[int, int]]) -> list[tuple[Any, ...]]:
    client = await _io._client(addresses)
    limit = asyncio.Semaphore(FRAGMENTS_IN_FLIGHT_MAX)

    async def one(ledger_id: int, index: int) -> list[ReplicaReport]:
        async with limit:
            return await _audit_one(client, ledger_id, index, registered)

    done = await asyncio.gather(*(one(ledger_id, index) for ledger_id, index in items))
    return [_row(report) for reports in done for report in reports]


def _audit_partition(addresses: tuple[str, ...], registered: tuple[str, ...],
                     items: Iterator[tuple[int, int]]) -> Iterator[tuple[Any, ...]]:
    """Runs in a Spark Python worker: audit this task's fragments."""
    yield from _io.run(_audit_many(addresses, registered, list(items)))


def audit(spark: Any, meta: str | Sequence[str], *, output: str | None = None,
          repair: bool = False, tasks: int | None = None) -> AuditResult:
    """Audit every closed ledger of the cluster at ``meta`` (addresses, or one
    comma-separated string); see the module docstring."""
    addresses = [a.strip() for a in (meta.split(",") if isinstance(meta, str) else meta)
                 if a.strip()]
    if not addresses:
        raise UsageError("audit needs the meta addresses of the cluster")
    if tasks is not None and tasks <= 0:
        raise UsageError(f"audit tasks must be positive, not {tasks}")
    started = time.monotonic()
    items, open_ledgers, registered = _io.run(_plan(addresses))
    out = AuditResult(ledgers=len({ledger_id for ledger_id, _ in items}),
                      ledgers_open=open_ledgers, fragments=len(items), output=output)
    slices = tasks or max(1, min(len(items), AUDIT_TASKS_MAX))
    rdd = spark.sparkContext.parallelize(items, slices).mapPartitions(
        partial(_audit_partition, tuple(addresses), tuple(registered)))
    frame = spark.createDataFrame(rdd, REPORT_DDL).persist()
    try:
        if output is not None:
            frame.write.mode("overwrite").parquet(output)
        for row in frame.groupBy("status").count().collect():
            out.by_status[row["status"]] = int(row["count"])
        totals = frame.selectExpr("count(*) AS n", "sum(held + missing + corrupt + "
                                  "unreachable) AS reads").collect()[0]
        out.replicas = int(totals["n"])
        out.entries_read = int(totals["reads"] or 0)
        for row in frame.filter(frame.status.isin(*PROBLEMS)).orderBy(
                "ledger_id", "fragment_index", "bookie").collect():
            out.problems.append(ReplicaReport(**row.asDict()))
    finally:
        frame.unpersist()
    if repair:
        out.tasks_filed, out.extra_deleted = _io.run(_repair(addresses, out.problems))
    out.seconds = time.monotonic() - started
    return out


async def _repair(addresses: Sequence[str],
                  problems: list[ReplicaReport]) -> tuple[list[int], list[tuple[int, str]]]:
    client = await _io._client(tuple(addresses))
    filed = await repair_tasks(client.meta, problems, SYSTEM_CLOCK.wall_ms())
    dropped = await delete_extra_copies(client, client.meta, problems,
                                        timeout_s=REQUEST_TIMEOUT_S)
    return filed, dropped
