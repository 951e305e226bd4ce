"""A partition's ledger list in meta, read in bounded pieces.

The head key says which ledgers are kept and holds the last ones; older
ledgers are in archive runs (see ``_layout``). :class:`LedgerList` reads the
head, then only the runs a caller needs: one ledger by seq (one range read of
at most one run), a stretch of seqs (range reads of ``RUNS_PER_READ`` runs),
or a binary search over the runs (:class:`SeqSearch`) for the first ledger at
a publish time or an entry offset. Nothing here holds the whole list in
memory; a few recently read runs are cached (closed ledgers never change).

Every range read is bounded at both ends by seq (``run_key``), so meta
scans a bounded number of keys for it however long the list is.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator, Callable

from quorumlog.errors import invariant
from quorumlog.meta import MetaClient
from quorumlog.stream._errors import MessageFormatError
from quorumlog.stream._layout import (
    LEDGER_RECORD_BYTES_MAX,
    RUN_LEDGERS_MAX,
    LedgerInfo,
    LedgerRun,
    PartitionHead,
    run_key,
)
from quorumlog.stream._meta import load_head
from quorumlog.stream._retention import SeqSearch, holds_publish_at, publish_reached

# Archive runs per range read: at most ~2.8 MiB per response
# (RUNS_PER_READ * RUN_LEDGERS_MAX * LEDGER_RECORD_BYTES_MAX), well under the
# rpc frame limit (16 MiB).
RUNS_PER_READ = 4
# Runs one LedgerList keeps (a reader walks forward; each partition reader has
# its own list): at most ~2.8 MiB, typically tens of KiB (rollover runs are small).
RUNS_CACHED_MAX = RUNS_PER_READ
# Re-reads of the head when a run vanished under a read (trimmed meanwhile);
# a run still missing after that is a broken archive.
STALE_RETRIES_MAX = 3

invariant(RUNS_PER_READ * RUN_LEDGERS_MAX * LEDGER_RECORD_BYTES_MAX < 4 * 1024 * 1024,
          "one archive range read must stay a few MiB")


class LedgerList:
    """Reads one partition's ledger list: the head, then archive runs on demand."""

    def __init__(self, meta: MetaClient, stream: str, partition: int) -> None:
        self._meta = meta
        self.stream = stream
        self.partition = partition
        self._head: PartitionHead | None = None
        self.revision = 0  # mod revision of the head read last (to watch for changes)
        self.version = 0  # version of the head read last (to compare-and-swap it)
        self._runs: OrderedDict[int, LedgerRun] = OrderedDict()  # last seq -> run, LRU

    @property
    def loaded(self) -> bool:
        return self._head is not None

    @property
    def head(self) -> PartitionHead:
        invariant(self._head is not None, "read the head first (refresh)")
        assert self._head is not None
        return self._head

    async def refresh(self) -> PartitionHead:
        head, kv = await load_head(self._meta, self.stream, self.partition)
        self._head, self.revision, self.version = head, kv.mod_revision, kv.version
        return head

    async def _loaded_head(self) -> PartitionHead:
        return self._head if self._head is not None else await self.refresh()

    # ----- one ledger ------------------------------------------------------------------

    async def get(self, seq: int) -> LedgerInfo | None:
        """The ledger at ``seq``; None if the list does not keep it (trimmed,
        or not created yet) as of the head last read."""
        head = await self._loaded_head()
        for _ in range(STALE_RETRIES_MAX):
            if not head.first_seq <= seq < head.next_seq:
                return None
            info = head.in_tail(seq)
            if info is not None:
                return info
            run = await self._run_holding(seq, head)
            if run is not None:
                return run.get(seq)
            head = await self.refresh()  # trimmed meanwhile: the head says so
        raise self._broken(seq)

    async def _run_holding(self, seq: int, head: PartitionHead) -> LedgerRun | None:
        for run in self._runs.values():
            if run.first_seq <= seq <= run.last_seq:
                self._runs.move_to_end(run.last_seq)
                return run
        # The run holding seq ends before seq + RUN_LEDGERS_MAX and before the tail.
        end = min(seq + RUN_LEDGERS_MAX, head.tail_first_seq)
        result, _ = await self._meta.range(run_key(self.stream, self.partition, seq),
                                           end=run_key(self.stream, self.partition, end),
                                           limit=1)
        if not result.kvs:
            return None
        run = self._remember(LedgerRun.decode(result.kvs[0].value))
        return run if run.first_seq <= seq else None

    def _remember(self, run: LedgerRun) -> LedgerRun:
        self._runs[run.last_seq] = run
        self._runs.move_to_end(run.last_seq)
        while len(self._runs) > RUNS_CACHED_MAX:
            self._runs.popitem(last=False)
        return run

    def _broken(self, seq: int) -> MessageFormatError:
        return MessageFormatError(
            f"stream {self.stream!r} partition {self.partition}: the head keeps seq {seq} "
            "but no archive run holds it (the partition's metadata in meta is damaged)")

    # ----- stretches ---------------------------------------------------------------------

    async def runs_from(self, seq: int, count: int) -> list[LedgerRun]:
        """Up to ``count`` archive runs, from the one holding ``seq`` on (one range read)."""
        head = await self._loaded_head()
        end = min(seq + count * RUN_LEDGERS_MAX, head.tail_first_seq)
        if seq >= end:
            return []
        result, _ = await self._meta.range(run_key(self.stream, self.partition, seq),
                                           end=run_key(self.stream, self.partition, end),
                                           limit=count)
        return [self._remember(LedgerRun.decode(kv.value)) for kv in result.kvs]

    async def iterate(self, start: int, stop: int | None = None) -> AsyncIterator[LedgerInfo]:
        """The kept ledgers with seq in ``[start, stop)`` (default: to the end), in order.

        Ledgers trimmed while the walk goes on are skipped (they are gone)."""
        head = await self._loaded_head()
        seq = max(start, head.first_seq)
        end = head.next_seq if stop is None else min(stop, head.next_seq)
        stale = 0
        while seq < min(end, head.tail_first_seq):
            runs = await self.runs_from(seq, RUNS_PER_READ)
            if not runs or runs[0].first_seq > seq:
                stale += 1
                if stale > STALE_RETRIES_MAX:
                    raise self._broken(seq)
                head = await self.refresh()
                seq = max(seq, head.first_seq)
                continue
            for run in runs:
                for info in run.ledgers:
                    if seq <= info.seq < end:
                        yield info
                seq = max(seq, run.last_seq + 1)
        for info in head.tail:
            if seq <= info.seq < end:
                yield info

    async def slice(self, start: int, stop: int | None = None) -> tuple[LedgerInfo, ...]:
        """The kept ledgers with seq in ``[start, stop)``, loaded."""
        return tuple([info async for info in self.iterate(start, stop)])

    # ----- searches ----------------------------------------------------------------------

    async def bisect(self, predicate: Callable[[LedgerInfo], bool]) -> int:
        """The first kept seq whose ledger satisfies ``predicate`` (which, once
        true, stays true along the list), or ``next_seq``: about log2(runs)
        range reads."""
        head = await self._loaded_head()
        for _ in range(STALE_RETRIES_MAX):
            if head.tail and not predicate(head.tail[0]):
                return next((info.seq for info in head.tail if predicate(info)), head.next_seq)
            search = SeqSearch(head.first_seq, head.tail_first_seq, predicate)
            while (probe := search.probe()) is not None:
                run = await self._run_holding(probe, head)
                if run is None:
                    break
                search.feed(run.ledgers)
            else:
                return search.result
            head = await self.refresh()  # a run went (trimmed): search the new list
        raise self._broken(head.first_seq)

    async def first_at_publish(self, publish_ms: int) -> LedgerInfo | None:
        """The first kept ledger that may hold a message published at or after
        ``publish_ms`` (see ``_retention.holds_publish_at``); None if none may."""
        reached = await self.bisect(publish_reached(publish_ms))
        async for info in self.iterate(reached):  # usually the first one
            if holds_publish_at(info, publish_ms):
                return info
        return None

    async def leading_runs(self, runs_max: int, ledgers_max: int) -> list[LedgerRun]:
        """The archive's first runs, from ``first_seq`` of the head last read:
        at most ``runs_max`` runs, stopping once they hold ``ledgers_max``
        ledgers. (The head is read again if the archive changed under it.)"""
        head = await self._loaded_head()
        for _ in range(STALE_RETRIES_MAX):
            runs = await self._leading_runs(head, runs_max, ledgers_max)
            if runs is not None:
                return runs
            head = await self.refresh()
        raise self._broken(head.first_seq)

    async def _leading_runs(self, head: PartitionHead, runs_max: int,
                            ledgers_max: int) -> list[LedgerRun] | None:
        runs: list[LedgerRun] = []
        seq = head.first_seq
        held = 0
        while seq < head.tail_first_seq and len(runs) < runs_max and held < ledgers_max:
            batch = await self.runs_from(seq, min(RUNS_PER_READ, runs_max - len(runs)))
            if not batch or batch[0].first_seq != seq:
                return None  # trimmed meanwhile
            for run in batch:
                runs.append(run)
                held += len(run.ledgers)
                seq = run.last_seq + 1
                if held >= ledgers_max:
                    break
        return runs

    async def find(self, ledger_id: int) -> LedgerInfo | None:
        """The kept ledger with this id, if any.

        The tail first; then a binary search over the runs by id, which is
        the answer while ids grew along the list (``ids_ascending``: a
        writer's ledgers do). Ledgers a Spark job linked may be older than the
        ones before them; then a walk over the whole archive follows a miss."""
        head = await self._loaded_head()
        for info in reversed(head.tail):
            if info.ledger_id == ledger_id:
                return info
        found = await self._find_in_id_order(ledger_id, head)
        if found is not None or head.ids_ascending:
            return found
        async for info in self.iterate(head.first_seq, head.tail_first_seq):
            if info.ledger_id == ledger_id:
                return info
        return None

    async def _find_in_id_order(self, ledger_id: int, head: PartitionHead) -> LedgerInfo | None:
        low, high = head.first_seq, head.tail_first_seq
        while low < high:
            run = await self._run_holding((low + high) // 2, head)
            if run is None:
                return None
            ids = [info.ledger_id for info in run.ledgers]
            if ledger_id in ids:
                return run.ledgers[ids.index(ledger_id)]
            if ledger_id < min(ids):
                high = run.first_seq
            elif ledger_id > max(ids):
                low = run.last_seq + 1
            else:
                return None
        return None
