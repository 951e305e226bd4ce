"""Open with recovery: fence the ledger, find its true end, close it.

1. Metadata state OPEN -> IN_RECOVERY by compare-and-swap (a ledger already
   IN_RECOVERY - another recoverer, maybe dead - is recovered again; a CLOSED
   one needs nothing). From then on the writer cannot change the ensemble.
2. Fence the bookies of the last fragment (``FenceRequest``, which also
   returns their LAC) until every write set has Qf = Qw - Qa + 1 answers
   (``CoverageSet``): then no writer can gather Qa acks for any entry.
3. Start at LAC = max(metadata, bookie LACs, last fragment's first entry - 1)
   and read forward with recovery reads (``FLAG_FENCE``) to the whole write
   set of each entry (``RecoveryRead``): found on any bookie -> recoverable,
   rewritten to its whole write set with ``FLAG_RECOVERY`` (through a write
   handle in recovery mode, so ensemble changes work here too); Qf explicit
   "no such entry" -> the end; timeouts and errors are "unknown" and never
   count as "no such entry" - if every bookie answered and neither rule
   fired, recovery fails (retriable) without closing anything.
   Reads run ahead in a window that starts small and doubles while entries
   are found; verdicts are taken in entry order.
4. CLOSED with the recovered LAC, by compare-and-swap. If another recoverer
   closed it first, its result stands (concurrent recoveries agree on the
   first close).

Recovery-time ensemble changes stay inside the recovering write handle and
reach meta only with the close (see ``_write``): while the ledger is
IN_RECOVERY its last fragment is the old writer's, so every recoverer -
concurrent or later - fences and scans bookies that can vouch for each entry
(Qa of every write set hold each acknowledged entry). A replacement bookie
never saw the old writer's entries; its "no such entry" would prove nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable

from quorumlog import proto as wire
from quorumlog.errors import QuorumlogError, invariant
from quorumlog.ledger._bookie_client import (
    BookieOutcome,
    EntryReply,
    LacReply,
    cancel_quietly,
    outcome_of,
)
from quorumlog.ledger._context import LedgerContext
from quorumlog.ledger._errors import LedgerRecoveryError
from quorumlog.ledger._fanout import fan_out
from quorumlog.ledger._metadata import Fragment, LedgerMetadata, LedgerState, master_key
from quorumlog.ledger._metrics import LEDGER_METRICS
from quorumlog.ledger._quorum import ReadAnswer, RecoveryRead, RecoveryVerdict
from quorumlog.ledger._write import ClosedByOtherError, WriteHandle, known_placement
from quorumlog.proto import (
    DigestMismatchError,
    DigestType,
    UnauthorizedError,
    decode_entry,
    mac_key,
)

RECOVERY_WINDOW_INITIAL = 4
"""Entries read ahead at the start of the scan (doubles while entries are found)."""


def answer_of(error: BaseException | None) -> ReadAnswer:
    """A recovery read's answer: only an explicit "no such entry" counts as one."""
    outcome = outcome_of(error)
    if outcome is BookieOutcome.OK:
        return ReadAnswer.FOUND
    if outcome is BookieOutcome.NO_SUCH_ENTRY:
        return ReadAnswer.NO_SUCH_ENTRY
    return ReadAnswer.UNKNOWN


class _Found:
    __slots__ = ("envelope", "size")

    def __init__(self, envelope: bytes, size: int) -> None:
        self.envelope = envelope
        self.size = size


async def recover(ctx: LedgerContext, ledger_id: int, password: bytes) -> tuple[
        LedgerMetadata, int]:
    """Recover and close ``ledger_id``; return its closed metadata and version."""
    try:
        result = await _recover(ctx, ledger_id, password)
    except QuorumlogError:
        LEDGER_METRICS.recoveries_failed += 1
        raise
    LEDGER_METRICS.recoveries_ok += 1
    return result


async def _recover(ctx: LedgerContext, ledger_id: int, password: bytes) -> tuple[
        LedgerMetadata, int]:
    metadata, version = await _mark_in_recovery(ctx, ledger_id)
    if metadata.is_closed:
        return metadata, version
    fragment = metadata.ensembles[-1]
    key = master_key(password)
    bookie_lac = await _fence(ctx, metadata, fragment, key)
    start_lac = max(bookie_lac, fragment.first_entry_id - 1, metadata.last_entry_id)
    ctx.log.info("ledger_recovery_started", ledger=ledger_id, lac=start_lac,
                 ensemble=list(fragment.bookies))
    handle = WriteHandle(ctx, metadata, version, password, recovery=True, lac=start_lac,
                         placement=known_placement(metadata.placement))
    try:
        await _scan(ctx, metadata, fragment, handle, start_lac=start_lac, key=key,
                    password=password)
        await handle.close()
    except ClosedByOtherError as exc:
        ctx.log.info("ledger_recovery_lost_race", ledger=ledger_id,
                     last_entry=exc.metadata.last_entry_id)
        return exc.metadata, exc.version
    finally:
        await handle.abort()
    ctx.log.info("ledger_recovered", ledger=ledger_id,
                 last_entry=handle.metadata.last_entry_id,
                 rewritten=handle.last_add_confirmed - start_lac)
    return handle.metadata, handle.metadata_version


async def _mark_in_recovery(ctx: LedgerContext, ledger_id: int) -> tuple[LedgerMetadata, int]:
    for _ in range(ctx.config.metadata_cas_attempts_max):
        metadata, version = await ctx.load_metadata(ledger_id)
        if metadata.state is not LedgerState.OPEN:
            return metadata, version  # CLOSED: done; IN_RECOVERY: recover again
        marked = metadata.in_recovery()
        try:
            if await ctx.meta.cas(wire.ledger_key(ledger_id), version, marked.encode()):
                return marked, version + 1
        except QuorumlogError as exc:
            if not exc.retriable:
                raise
    raise LedgerRecoveryError(
        f"ledger {ledger_id}: could not mark it IN_RECOVERY (metadata kept changing)")


async def _fence(ctx: LedgerContext, metadata: LedgerMetadata, fragment: Fragment,
                 key: bytes) -> int:
    """Fence the fragment's bookies until every write set has Qf of them; the max LAC."""
    coverage = metadata.schedule.coverage_set()
    timeout_s = ctx.config.read_timeout_ms / 1000

    def fence(bookie: str) -> Awaitable[LacReply]:
        return ctx.bookies.fence(bookie, metadata.ledger_id, key, timeout_s=timeout_s)

    lac = -1
    errors: dict[str, str] = {}
    async with contextlib.aclosing(fan_out(enumerate(fragment.bookies), fence)) as answers:
        async for answer in answers:
            if answer.error is None:
                lac = max(lac, answer.result().lac)
                if coverage.add(answer.index):
                    return lac
                continue
            if answer.outcome is BookieOutcome.UNAUTHORIZED:
                raise UnauthorizedError(
                    f"bookie {answer.bookie} refused to fence ledger {metadata.ledger_id}: "
                    f"wrong password ({answer.error})")
            errors[answer.bookie] = str(answer.error)
    raise LedgerRecoveryError(
        f"ledger {metadata.ledger_id}: could not fence Qf={metadata.schedule.fence_quorum} "
        f"bookies of every write set: {'; '.join(f'{b}: {e}' for b, e in errors.items())}")


async def _scan(ctx: LedgerContext, metadata: LedgerMetadata, fragment: Fragment,
                handle: WriteHandle, *, start_lac: int, key: bytes, password: bytes) -> None:
    """Read forward from start_lac + 1; rewrite what is found; stop at the end."""
    window_max = ctx.config.recovery_reads_in_flight_max
    window = min(RECOVERY_WINDOW_INITIAL, window_max)
    reads: deque[tuple[int, asyncio.Task[_Found | None]]] = deque()
    next_id = start_lac + 1
    digest_key = mac_key(password) if metadata.digest is DigestType.HMAC_SHA256 else b""
    try:
        while True:
            while len(reads) < window:
                reads.append((next_id, asyncio.ensure_future(
                    _recovery_read(ctx, metadata, fragment, next_id, key=key,
                                   digest_key=digest_key))))
                next_id += 1
            entry_id, task = reads.popleft()
            found = await task
            if handle.failure is not None:
                raise handle.failure
            if found is None:
                return  # the end of the ledger
            handle.add_recovered(entry_id, found.envelope, found.size)
            window = min(window * 2, window_max)
    finally:
        cancel_quietly(t for _, t in reads)


async def _recovery_read(ctx: LedgerContext, metadata: LedgerMetadata, fragment: Fragment,
                         entry_id: int, *, key: bytes, digest_key: bytes) -> _Found | None:
    """Ask the entry's whole write set (fencing reads); found -> its envelope,
    the end -> None, undecidable -> LedgerRecoveryError."""
    schedule = metadata.schedule
    decision = RecoveryRead(schedule, entry_id)
    timeout_s = ctx.config.read_timeout_ms / 1000

    def read(bookie: str) -> Awaitable[EntryReply]:
        return ctx.bookies.read_entry(bookie, metadata.ledger_id, entry_id, timeout_s=timeout_s,
                                      fence=True, master_key=key)

    targets = [(index, fragment.bookies[index]) for index in schedule.write_set(entry_id)]
    errors: dict[str, str] = {}
    async with contextlib.aclosing(fan_out(targets, read)) as answers:
        async for answer in answers:
            bookie, error = answer.bookie, answer.error
            if answer.outcome is BookieOutcome.UNAUTHORIZED:
                raise UnauthorizedError(
                    f"bookie {bookie} refused a recovery read of ledger "
                    f"{metadata.ledger_id}: wrong password ({error})")
            if error is None:
                envelope = answer.result().envelope
                try:
                    parsed = decode_entry(envelope, ledger_id=metadata.ledger_id,
                                          entry_id=entry_id, digest=metadata.digest,
                                          key=digest_key, source=bookie)
                except DigestMismatchError as exc:
                    ctx.log.warning("ledger_entry_digest_mismatch", bookie=bookie,
                                    error=str(exc))
                    errors[bookie] = str(exc)
                    decision.record(answer.index, ReadAnswer.UNKNOWN)
                    continue
                verdict = decision.record(answer.index, ReadAnswer.FOUND)
                invariant(verdict is RecoveryVerdict.RECOVERABLE, "found means recoverable")
                return _Found(bytes(envelope), len(parsed.payload))
            errors[bookie] = str(error)
            verdict = decision.record(answer.index, answer_of(error))
            if verdict is RecoveryVerdict.END_OF_LEDGER:
                return None
    raise LedgerRecoveryError(
        f"ledger {metadata.ledger_id}: cannot tell whether entry {entry_id} exists: "
        f"fewer than Qf={schedule.fence_quorum} bookies said 'no such entry' and none had "
        f"it ({'; '.join(f'{b}: {e}' for b, e in errors.items())}); retry when the "
        "bookies answer")
