"""Scrub of one ledger fragment: read every replica of every entry and say
which replicas are missing entries, hold corrupt ones (digest mismatch), or
could not be read; and which registered bookies hold a ledger that no
fragment names (extra replicas). The Spark audit job (``quorumlog audit``,
``quorumlog.spark.audit``) runs it once per fragment; ``repair_tasks`` files
under-replication tasks for what it found, and ``delete_extra_copies`` drops
the extra replicas of ledgers found fully replicated (docs/recovery.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass

from quorumlog import proto as wire
from quorumlog.errors import QuorumlogError
from quorumlog.ledger import LedgerClient, LedgerMetadata, RpcBookieTransport, master_key
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


EXTRA_DELETE_LOCK_TTL_MS = 10_000
"""The session holding a ledger's task lock while its extra copies are dropped
(a crashed repair's locks go after this)."""


async def delete_extra_copies(client: LedgerClient, meta: MetaClient,
                              problems: Iterable[ReplicaReport], *,
                              timeout_s: float) -> list[tuple[int, str]]:
    """Drop each extra copy in ``problems`` (a bookie holding a ledger no fragment
    names) whose ledger is fully replicated: no missing, corrupt or unreachable
    replica in the same audit, CLOSED, no under-replication task, and the
    bookie still named nowhere in its metadata (read again now). Meanwhile it
    holds the ledger's task lock, so no worker copies the ledger to a bookie
    (its copy precedes its swap, under that lock) while the copy there is
    dropped. The (ledger, bookie) pairs dropped."""
    rows = list(problems)
    unhealthy = {r.ledger_id for r in rows if r.status in (MISSING, CORRUPT, UNREACHABLE)}
    extra = sorted({(r.ledger_id, r.bookie) for r in rows
                    if r.status == EXTRA and r.ledger_id not in unhealthy})
    if not extra:
        return []
    session_id = await meta.create_session(EXTRA_DELETE_LOCK_TTL_MS)
    dropped: list[tuple[int, str]] = []
    try:
        for ledger_id, bookie in extra:
            lock = layout.lock_key(ledger_id)
            if not await meta.cas(lock, 0, b"audit-repair", session_id=session_id):
                continue  # a worker is copying this ledger: leave it for the next audit
            try:
                if await _extra_copy_unneeded(client, meta, ledger_id, bookie):
                    password = (await client.context.load_metadata(ledger_id))[0].known_password()
                    if password is not None and await client.context.bookies.delete_ledger(
                            bookie, ledger_id, master_key(password), timeout_s=timeout_s):
                        dropped.append((ledger_id, bookie))
            finally:
                await meta.delete(lock)
    finally:
        await meta.revoke_session(session_id)
    return dropped


async def _extra_copy_unneeded(client: LedgerClient, meta: MetaClient, ledger_id: int,
                               bookie: str) -> bool:
    if await meta.get(layout.task_key(ledger_id)) is not None:
        return False  # under repair: the copy may be about to be named
    try:
        metadata, _ = await client.context.load_metadata(ledger_id)
    except wire.NoSuchLedgerError:
        return False  # deleted: garbage collection drops every copy
    named = {b for fragment in metadata.ensembles for b in fragment.bookies}
    return metadata.is_closed and bookie not in named
