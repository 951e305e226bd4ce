"""Scrub of one ledger fragment: read every replica of every entry and say
which replicas are missing entries, hold corrupt ones (digest mismatch), or
could not be read; and which registered bookies hold a ledger that no
fragment names (extra replicas). The Spark audit job (``quorumlog audit``,
``quorumlog.spark.audit``) runs it once per fragment; ``repair_tasks`` files
under-replication tasks for what it found (docs/recovery.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass

from quorumlog import proto as wire
from quorumlog.errors import QuorumlogError
from quorumlog.ledger import LedgerClient, LedgerMetadata, RpcBookieTransport
from quorumlog.meta import MetaClient
from quorumlog.recovery import _layout as layout
from quorumlog.recovery._auditor import file_task, ids_under
from quorumlog.recovery._plan import slots_to_replace

OK, MISSING, CORRUPT, UNREACHABLE, EXTRA = "ok", "missing", "corrupt", "unreachable", "extra"
PROBLEMS = (MISSING, CORRUPT, EXTRA, UNREACHABLE)
EXTRA_FRAGMENT_INDEX = -1  # report rows about a whole ledger, not one fragment


@dataclass(slots=True)
class ReplicaReport:
    """What one bookie holds of one fragment (or, ``status`` extra, of a ledger
    that names it nowhere)."""

    ledger_id: int
    fragment_index: int
    first_entry_id: int
    last_entry_id: int
    bookie: str
    status: str          # ok | missing | corrupt | unreachable | extra
    expected: int = 0    # entries its write sets put on it
    held: int = 0        # read back with a matching digest
    missing: int = 0
    corrupt: int = 0
    unreachable: int = 0
    first_bad_entry: int = -1
    detail: str = ""


def _status(report: ReplicaReport) -> str:
    if report.corrupt:
        return CORRUPT
    if report.missing:
        return MISSING
    if report.unreachable:
        return UNREACHABLE
    return OK


async def audit_fragment(client: LedgerClient, metadata: LedgerMetadata, fragment_index: int,
                         *, reads_in_flight_max: int, timeout_s: float) -> list[ReplicaReport]:
    """One report per bookie of the fragment of a CLOSED ledger."""
    fragment = metadata.ensembles[fragment_index]
    password = metadata.known_password()
    verify = password is not None or metadata.digest is not wire.DigestType.HMAC_SHA256
    key = (wire.mac_key(password) if password is not None
           and metadata.digest is wire.DigestType.HMAC_SHA256 else b"")
    slots = [s for s in slots_to_replace(metadata, fragment.bookies)
             if s.fragment_index == fragment_index]
    reports: list[ReplicaReport] = []
    reads: list[tuple[ReplicaReport, int]] = []
    for slot in slots:
        entries = [e for e in range(slot.first_entry_id, slot.last_entry_id + 1)
                   if metadata.schedule.stores(e, slot.position)]
        report = ReplicaReport(metadata.ledger_id, fragment_index, slot.first_entry_id,
                               slot.last_entry_id, slot.bookie, OK, expected=len(entries))
        if not verify:
            report.detail = "HMAC password not in metadata: presence checked, not digests"
        reports.append(report)
        reads.extend((report, e) for e in entries)
    limit = asyncio.Semaphore(reads_in_flight_max)

    async def read(report: ReplicaReport, entry_id: int) -> None:
        async with limit:
            try:
                reply = await client.context.bookies.read_entry(
                    report.bookie, metadata.ledger_id, entry_id, timeout_s=timeout_s)
                if verify:
                    wire.decode_entry(reply.envelope, ledger_id=metadata.ledger_id,
                                      entry_id=entry_id, digest=metadata.digest, key=key,
                                      source=report.bookie)
                report.held += 1
                return
            except (wire.NoSuchEntryError, wire.NoSuchLedgerError):
                report.missing += 1
            except wire.DigestMismatchError as exc:
                report.corrupt += 1
                report.detail = exc.message
            except QuorumlogError as exc:
                report.unreachable += 1
                report.detail = report.detail or exc.message
            if report.first_bad_entry < 0 or entry_id < report.first_bad_entry:
                report.first_bad_entry = entry_id

    await asyncio.gather(*(read(r, e) for r, e in reads))
    for report in reports:
        report.status = _status(report)
    return reports


async def audit_extra(client: LedgerClient, metadata: LedgerMetadata, registered: Iterable[str],
                      *, timeout_s: float) -> list[ReplicaReport]:
    """Registered bookies that hold the ledger although no fragment names them
    (a stale copy left behind by re-replication, or a write that went astray)."""
    named = {b for fragment in metadata.ensembles for b in fragment.bookies}
    out: list[ReplicaReport] = []
    transport = client.context.bookies
    if not isinstance(transport, RpcBookieTransport):
        return out  # a transport without admin calls (the simulator's)
    pool = transport.pool
    for bookie in sorted(set(registered) - named):
        try:
            info = await pool.call(bookie, wire.LedgerInfoRequest(ledger_id=metadata.ledger_id),
                                   timeout_s=timeout_s)
        except QuorumlogError:
            continue
        if info.exists:
            out.append(ReplicaReport(
                metadata.ledger_id, EXTRA_FRAGMENT_INDEX, 0, metadata.last_entry_id, bookie,
                EXTRA, held=info.last_entry_id + 1,
                detail=f"holds the ledger (last entry {info.last_entry_id}) but no fragment "
                "names it; garbage collection does not drop it while the ledger exists"))
    return out


async def repair_tasks(meta: MetaClient, reports: Iterable[ReplicaReport],
                       now_ms: int) -> list[int]:
    """File an under-replication task per ledger for its missing or corrupt
    replicas (the worker re-reads each, verifying digests, and copies the
    incomplete ones to a replacement). Ledgers whose task was filed or widened."""
    wanted: dict[int, set[str]] = {}
    for report in reports:
        if report.status in (MISSING, CORRUPT):
            wanted.setdefault(report.ledger_id, set()).add(report.bookie)
    tasks = {int(k): layout.ReplicationTask.decode(v)
             for k, v in (await ids_under(meta, layout.TASK_PREFIX)).items()}
    filed = []
    for ledger_id, bookies in sorted(wanted.items()):
        if await file_task(meta, ledger_id, tuple(sorted(bookies)), tasks, now_ms):
            filed.append(ledger_id)
    return filed
