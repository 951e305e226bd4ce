"""Reading ledgers: entries from replicas, speculative and batch reads, LAC
reads, long-poll tailing, and the read handle.

- An entry is read from the first bookie of its write set; an error moves to
  the next replica at once, and a replica that has not answered within
  ``speculative_read_delay_ms`` gets company from the next one; the first
  valid copy wins. Every copy's digest is checked; a mismatch names the
  bookie.
- When E == Qw (no striping) every bookie of a fragment holds every entry of
  it, so ranges are read in batches (``ReadBatchRequest``).
- Reads never go past the LAC: the metadata's last entry for closed ledgers,
  the LAC learned from bookies for open ones.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncGenerator, Awaitable

from quorumlog.errors import QuorumlogError, UsageError
from quorumlog.ledger._batch import EntryBatch, LedgerEntry
from quorumlog.ledger._bookie_client import (
    BatchReply,
    BookieOutcome,
    LacReply,
    cancel_quietly,
    in_order,
    outcome_of,
)
from quorumlog.ledger._context import LedgerContext
from quorumlog.ledger._errors import EntryUnavailableError, ReadPastLacError
from quorumlog.ledger._fanout import fan_out
from quorumlog.ledger._metadata import LedgerMetadata
from quorumlog.ledger._metrics import LEDGER_METRICS
from quorumlog.proto import (
    DIGEST_SIZES,
    ENVELOPE_HEADER,
    DigestMismatchError,
    DigestType,
    NoSuchEntryError,
    UnauthorizedError,
    crc32c_batch_bounds,
    decode_entry,
    mac_key,
)


class EntryReader:
    """Reads entries of one ledger from its bookies (no LAC checks here)."""

    def __init__(self, ctx: LedgerContext, ledger_id: int, digest: DigestType,
                 password: bytes) -> None:
        self._ctx = ctx
        self._ledger_id = ledger_id
        self._digest = digest
        self._key = mac_key(password) if digest is DigestType.HMAC_SHA256 else b""
        self._timeout_s = ctx.config.read_timeout_ms / 1000
        self._speculative_s = ctx.config.speculative_read_delay_ms / 1000

    def decode(self, envelope: bytes | memoryview, entry_id: int, bookie: str) -> LedgerEntry:
        """Verify one envelope (ids, digest type, digest) read from ``bookie``."""
        parsed = decode_entry(envelope, ledger_id=self._ledger_id, entry_id=entry_id,
                              digest=self._digest, key=self._key, source=bookie)
        LEDGER_METRICS.read_entries += 1
        LEDGER_METRICS.read_bytes += len(parsed.payload)
        return LedgerEntry(self._ledger_id, entry_id, bytes(parsed.payload))

    def verify_batch(self, reply: BatchReply, first_entry_id: int, count: int,
                     bookie: str) -> EntryBatch:
        """The longest prefix (at most ``count``) of a batch read's envelopes
        whose ids and digests check out, checked in one pass over the buffer.
        A bad envelope ends the prefix and is logged with the precise error;
        the caller reads the rest from another replica."""
        sizes = reply.sizes[:count]
        if self._digest is DigestType.CRC32C:
            starts, ends, payload_bytes = crc32c_batch_bounds(reply.buffer, sizes,
                                                              self._ledger_id, first_entry_id)
        else:
            starts, ends = self._verify_keyed(reply.buffer, sizes, first_entry_id)
            payload_bytes = sum(ends) - sum(starts)
        batch = EntryBatch(self._ledger_id, first_entry_id, reply.buffer, starts, ends)
        if len(batch) < len(sizes):
            bad = len(batch)
            offset = sum(sizes[:bad])
            envelope = memoryview(reply.buffer)[offset:offset + sizes[bad]]
            try:
                self.decode(envelope, first_entry_id + bad, bookie)
            except DigestMismatchError as exc:
                self._ctx.log.warning("ledger_entry_digest_mismatch", bookie=bookie,
                                      ledger=self._ledger_id, entry=first_entry_id + bad,
                                      error=str(exc))
        LEDGER_METRICS.read_entries += len(batch)
        LEDGER_METRICS.read_bytes += payload_bytes
        return batch

    def _verify_keyed(self, buffer: bytes | memoryview, sizes: list[int],
                      first_entry_id: int) -> tuple[array.array[int], array.array[int]]:
        """Payload bounds of the valid prefix of HMAC envelopes (one decode each)."""
        starts: array.array[int] = array.array("q")
        ends: array.array[int] = array.array("q")
        view = memoryview(buffer)
        skip = ENVELOPE_HEADER.size + DIGEST_SIZES[DigestType.HMAC_SHA256]
        position = 0
        for k, size in enumerate(sizes):
            try:
                decode_entry(view[position:position + size], ledger_id=self._ledger_id,
                             entry_id=first_entry_id + k, digest=self._digest, key=self._key)
            except DigestMismatchError:
                break
            starts.append(position + skip)
            ends.append(position + size)
            position += size
        return starts, ends

    async def _read_one(self, bookie: str, entry_id: int) -> LedgerEntry:
        loop = asyncio.get_running_loop()
        started_s = loop.time()
        reply = await self._ctx.bookies.read_entry(
            bookie, self._ledger_id, entry_id, timeout_s=self._timeout_s)
        LEDGER_METRICS.read_latency.observe(loop.time() - started_s)
        return self.decode(reply.envelope, entry_id, bookie)

    async def read_entry(self, metadata: LedgerMetadata, entry_id: int) -> LedgerEntry:
        """One entry from its replicas: next replica on error, speculative after a delay."""
        replicas = metadata.write_set_bookies(entry_id)
        errors: dict[str, BaseException] = {}
        tasks: dict[asyncio.Task[LedgerEntry], str] = {}
        tried = 0

        def launch() -> None:
            nonlocal tried
            bookie = replicas[tried]
            tried += 1
            tasks[asyncio.ensure_future(self._read_one(bookie, entry_id))] = bookie

        launch()
        try:
            while tasks:
                timeout = self._speculative_s if tried < len(replicas) else None
                done, _ = await asyncio.wait(tasks, timeout=timeout,
                                             return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    launch()  # the slow replica gets company
                    continue
                for task in in_order(done, tasks):
                    bookie = tasks.pop(task)
                    error = task.exception()
                    if error is None:
                        return task.result()
                    if isinstance(error, UnauthorizedError):
                        raise error
                    if isinstance(error, DigestMismatchError):
                        self._ctx.log.warning("ledger_entry_digest_mismatch", bookie=bookie,
                                              ledger=self._ledger_id, entry=entry_id,
                                              error=str(error))
                    errors[bookie] = error
                    if tried < len(replicas):
                        launch()
        finally:
            cancel_quietly(tasks)
        raise _read_failure(self._ledger_id, entry_id, errors)

    async def read_range(self, metadata: LedgerMetadata, first: int,
                         last: int) -> AsyncGenerator[EntryBatch, None]:
        """Entries ``first..last`` in order, as batches (pipelined; batch reads
        when E == Qw). Never yields an empty batch."""
        if metadata.ensemble_size == metadata.write_quorum:
            async for batch in self._read_batches(metadata, first, last):
                yield batch
            return
        window = self._ctx.config.read_entries_in_flight_max
        in_flight: deque[asyncio.Task[LedgerEntry]] = deque()
        next_id = first
        try:
            while next_id <= last or in_flight:
                while next_id <= last and len(in_flight) < window:
                    in_flight.append(asyncio.ensure_future(self.read_entry(metadata, next_id)))
                    next_id += 1
                ready = [await in_flight.popleft()]
                while in_flight and in_flight[0].done():  # hand out what is here together
                    ready.append(in_flight.popleft().result())
                yield EntryBatch.of_entries(self._ledger_id, ready)
        finally:
            cancel_quietly(in_flight)

    async def _read_batches(self, metadata: LedgerMetadata, first: int,
                            last: int) -> AsyncGenerator[EntryBatch, None]:
        """Batch reads pipelined over the replicas: up to ``batch_reads_in_flight_max``
        segments are being read while the oldest one is handed out. A segment
        that fails or comes back short is finished by :meth:`_read_segment`."""
        window = self._ctx.config.batch_reads_in_flight_max
        in_flight: deque[tuple[int, int, str, asyncio.Task[BatchReply]]] = deque()
        next_id, rotation = first, 0
        try:
            while next_id <= last or in_flight:
                while next_id <= last and len(in_flight) < window:
                    segment_last, bookies = self._segment(metadata, next_id, last)
                    bookie = bookies[rotation % len(bookies)]
                    rotation += 1
                    in_flight.append((next_id, segment_last, bookie, asyncio.ensure_future(
                        self._batch(bookie, next_id, segment_last))))
                    next_id = segment_last + 1
                segment_first, segment_last, bookie, task = in_flight.popleft()
                got = await self._batch_entries(bookie, segment_first, segment_last, task)
                if got is not None:
                    yield got
                after = segment_first if got is None else got.last_entry_id + 1
                if after <= segment_last:
                    async for batch in self._read_segment(metadata, after, segment_last):
                        yield batch
        finally:
            cancel_quietly([task for *_, task in in_flight])

    def _segment(self, metadata: LedgerMetadata, entry_id: int,
                 last: int) -> tuple[int, list[str]]:
        """Last entry of one batch read from ``entry_id`` (within one fragment)
        and the replicas holding it."""
        index = metadata.fragment_index(entry_id)
        fragment_last = (metadata.ensembles[index + 1].first_entry_id - 1
                         if index + 1 < len(metadata.ensembles) else last)
        count = min(self._ctx.config.batch_read_entries_max,
                    min(last, fragment_last) - entry_id + 1)
        return entry_id + count - 1, list(metadata.ensembles[index].bookies)

    async def _batch_entries(self, bookie: str, first: int, last: int,
                             reply: Awaitable[BatchReply]) -> EntryBatch | None:
        """The verified entries of one batch read; None when it failed or the
        first entry did not verify (logged). A bookie refusing the master key
        is raised: no replica will do better."""
        try:
            batch = self.verify_batch(await reply, first, last - first + 1, bookie)
        except QuorumlogError as exc:
            if isinstance(exc, UnauthorizedError):
                raise
            self._ctx.log.debug("ledger_batch_read_failed", bookie=bookie,
                                ledger=self._ledger_id, entry=first, error=str(exc))
            return None
        return batch if len(batch) else None

    async def _batch(self, bookie: str, first: int, last: int) -> BatchReply:
        loop = asyncio.get_running_loop()
        started_s = loop.time()
        reply = await self._ctx.bookies.read_batch(
            bookie, self._ledger_id, first, max_entries=last - first + 1,
            max_bytes=self._ctx.config.batch_read_bytes_max, timeout_s=self._timeout_s)
        LEDGER_METRICS.read_latency.observe(loop.time() - started_s)
        return reply

    async def _read_segment(self, metadata: LedgerMetadata, first: int,
                            last: int) -> AsyncGenerator[EntryBatch, None]:
        """Entries ``first..last`` one batch at a time, trying each replica in
        turn, then single reads (which raise the precise error)."""
        entry_id = first
        while entry_id <= last:
            segment_last, bookies = self._segment(metadata, entry_id, last)
            got: EntryBatch | None = None
            for bookie in bookies:
                got = await self._batch_entries(bookie, entry_id, segment_last,
                                                self._batch(bookie, entry_id, segment_last))
                if got is not None:
                    break
            if got is None:  # the precise error, or the entry from a retried replica
                got = EntryBatch.of_entries(self._ledger_id,
                                            [await self.read_entry(metadata, entry_id)])
            yield got
            entry_id = got.last_entry_id + 1

    async def read_lac(self, metadata: LedgerMetadata) -> int:
        """The highest LAC the last fragment's bookies report (at least the
        fragment's first entry - 1, which the writer had confirmed)."""
        fragment = metadata.ensembles[-1]
        coverage = metadata.schedule.coverage_set()
        lac = fragment.first_entry_id - 1
        answered = False
        errors: dict[str, BaseException] = {}
        async with contextlib.aclosing(fan_out(enumerate(fragment.bookies),
                                               self._lac_read)) as answers:
            async for answer in answers:
                if answer.error is None:
                    answered = True
                    lac = max(lac, answer.result().lac)
                    if coverage.add(answer.index):
                        return lac
                elif answer.outcome is BookieOutcome.NO_SUCH_ENTRY:
                    answered = True  # the bookie has nothing of this ledger yet
                    if coverage.add(answer.index):
                        return lac
                else:
                    errors[answer.bookie] = answer.error
        if not answered:
            raise EntryUnavailableError(
                f"ledger {self._ledger_id}: no bookie answered a LAC read: "
                + _describe(errors))
        return lac

    def _lac_read(self, bookie: str) -> Awaitable[LacReply]:
        return self._ctx.bookies.read_lac(bookie, self._ledger_id, timeout_s=self._timeout_s)

    async def long_poll(self, metadata: LedgerMetadata, after: int,
                        timeout_ms: int) -> tuple[int, LedgerEntry | None]:
        """Wait until some bookie of entry ``after + 1``'s write set has a LAC
        past ``after``; return (that LAC, the entry if it came along)."""
        bookies = metadata.write_set_bookies(after + 1)

        def poll(bookie: str) -> Awaitable[LacReply]:
            return self._ctx.bookies.read_lac(
                bookie, self._ledger_id, timeout_s=self._timeout_s, previous_lac=after,
                long_poll_ms=timeout_ms, with_entry=True)

        best = after
        errors: dict[str, BaseException] = {}
        async with contextlib.aclosing(fan_out(enumerate(bookies), poll)) as answers:
            async for answer in answers:
                bookie = answer.bookie
                if answer.error is not None:
                    if answer.outcome is not BookieOutcome.NO_SUCH_ENTRY:
                        errors[bookie] = answer.error  # (no such ledger yet: nothing new)
                    continue
                reply = answer.result()
                if reply.lac <= after:
                    continue
                best = max(best, reply.lac)
                if reply.envelope is not None:
                    try:
                        return best, self.decode(reply.envelope, after + 1, bookie)
                    except DigestMismatchError as exc:
                        self._ctx.log.warning("ledger_entry_digest_mismatch",
                                              bookie=bookie, error=str(exc))
                return best, None
        if len(errors) == len(bookies):
            raise EntryUnavailableError(
                f"ledger {self._ledger_id}: no bookie of entry {after + 1}'s write set "
                f"answered a long poll: {_describe(errors)}")
        return best, None


def _describe(errors: dict[str, BaseException]) -> str:
    return "; ".join(f"{bookie}: {error}" for bookie, error in errors.items()) or "no replicas"


def _read_failure(ledger_id: int, entry_id: int, errors: dict[str, BaseException]) -> Exception:
    mismatches = {b: e for b, e in errors.items() if isinstance(e, DigestMismatchError)}
    if mismatches:
        return DigestMismatchError(
            f"entry {ledger_id}:{entry_id}: no valid copy; digest mismatch on bookie(s) "
            f"{', '.join(sorted(mismatches))}: {_describe(errors)}")
    if errors and all(outcome_of(e) is BookieOutcome.NO_SUCH_ENTRY for e in errors.values()):
        return NoSuchEntryError(
            f"entry {ledger_id}:{entry_id} is on none of its replicas "
            f"({', '.join(errors)}): the ledger was deleted or its data lost")
    return EntryUnavailableError(
        f"entry {ledger_id}:{entry_id}: no replica answered with it: {_describe(errors)}")


class ReadHandle:
    """A ledger opened for reading (with or without recovery).

    For a closed ledger the LAC is the metadata's last entry; for an open one
    it is what the bookies reported (``read_last_add_confirmed``,
    ``wait_for_entry``), and it only moves forward.
    """

    def __init__(self, ctx: LedgerContext, metadata: LedgerMetadata, version: int,
                 password: bytes, *, lac: int = -1) -> None:
        self._ctx = ctx
        self._metadata = metadata
        self._version = version
        self._reader = EntryReader(ctx, metadata.ledger_id, metadata.digest, password)
        self._lac = metadata.last_entry_id if metadata.is_closed else max(
            lac, metadata.ensembles[-1].first_entry_id - 1)
        self._ahead: dict[int, LedgerEntry] = {}  # read-ahead of wait_for_entry

    @property
    def id(self) -> int:
        return self._metadata.ledger_id

    @property
    def metadata(self) -> LedgerMetadata:
        return self._metadata

    @property
    def last_add_confirmed(self) -> int:
        return self._lac

    @property
    def is_closed(self) -> bool:
        return self._metadata.is_closed

    def __repr__(self) -> str:
        return f"ReadHandle(id={self.id}, lac={self._lac}, state={self._metadata.state.value})"

    async def refresh(self) -> LedgerMetadata:
        """Re-read the metadata (ensemble changes, close by the writer)."""
        metadata, version = await self._ctx.load_metadata(self.id)
        if version >= self._version:
            self._metadata, self._version = metadata, version
            if metadata.is_closed:
                self._lac = metadata.last_entry_id
        return self._metadata

    async def _check_range(self, first: int, last: int) -> None:
        if first < 0 or last < first:
            raise UsageError(f"bad entry range {first}..{last}: need 0 <= first <= last")
        if last > self._lac and not self.is_closed:
            await self.read_last_add_confirmed()
        if last > self._lac:
            raise ReadPastLacError(
                f"ledger {self.id}: entry {last} is past the last add confirmed "
                f"({self._lac}){' of the closed ledger' if self.is_closed else ''}; "
                "entries past the LAC may never exist")

    async def read_raw(self, first: int, last: int) -> AsyncGenerator[EntryBatch, None]:
        """Entries ``first..last`` (inclusive) in order, as :class:`EntryBatch`
        values (one buffer each, digests checked, no per-entry objects); never
        past the LAC."""
        await self._check_range(first, last)
        next_id = first
        refreshed = False
        while next_id <= last:
            try:
                async for batch in self._reader.read_range(self._metadata, next_id, last):
                    next_id = batch.last_entry_id + 1
                    yield batch
            except (EntryUnavailableError, NoSuchEntryError):
                if self.is_closed or refreshed:
                    raise
                refreshed = True
                await self.refresh()  # an ensemble change may have moved entries

    async def read(self, first: int, last: int) -> AsyncGenerator[LedgerEntry, None]:
        """Entries ``first..last`` (inclusive) in order; never past the LAC."""
        async with contextlib.aclosing(self.read_raw(first, last)) as batches:
            async for batch in batches:
                for entry in batch.entries():
                    yield entry

    async def read_batch(self, first: int, last: int) -> list[LedgerEntry]:
        return [entry async for entry in self.read(first, last)]

    async def read_batch_raw(self, first: int, last: int) -> list[EntryBatch]:
        """Entries ``first..last`` as a few :class:`EntryBatch` values (bulk readers)."""
        return [batch async for batch in self.read_raw(first, last)]

    async def read_entry(self, entry_id: int) -> LedgerEntry:
        await self._check_range(entry_id, entry_id)
        try:
            return await self._reader.read_entry(self._metadata, entry_id)
        except (EntryUnavailableError, NoSuchEntryError):
            if self.is_closed:
                raise
            await self.refresh()  # an ensemble change may have moved it
            return await self._reader.read_entry(self._metadata, entry_id)

    async def read_last_add_confirmed(self) -> int:
        """Ask the bookies (open ledgers); the metadata's last entry once closed."""
        if self.is_closed:
            return self._lac
        try:
            lac = await self._reader.read_lac(self._metadata)
        except EntryUnavailableError:
            if (await self.refresh()).is_closed:
                return self._lac
            raise
        self._lac = max(self._lac, lac)
        return self._lac

    async def wait_for_entry(self, after: int, timeout_ms: int = 1000) -> LedgerEntry | None:
        """Entry ``after + 1`` once it is confirmed; None if it is not within
        ``timeout_ms`` (long poll on the bookies), or never will be (closed).

        A reader that is behind (``after + 1`` is already below the LAC) gets
        entries from a read-ahead of up to ``tail_read_ahead_entries``, so
        calling this in a loop reads in batches, not one round trip per entry.
        """
        if after < -1 or timeout_ms < 0:
            raise UsageError(f"need after >= -1 and timeout_ms >= 0, got {after}, {timeout_ms}")
        if after < self._lac:
            return await self._next(after + 1)
        if self.is_closed:
            return None
        lac, entry = await self._reader.long_poll(self._metadata, after, timeout_ms)
        self._lac = max(self._lac, lac)
        if entry is not None:
            return entry
        if after < self._lac:
            return await self._next(after + 1)
        with contextlib.suppress(QuorumlogError):
            await self.refresh()  # closed meanwhile? moved to new bookies?
        if after < self._lac:
            return await self._next(after + 1)
        return None

    async def _next(self, entry_id: int) -> LedgerEntry:
        """Entry ``entry_id`` (<= LAC), reading ahead while the reader is behind."""
        ahead = self._ahead
        entry = ahead.pop(entry_id, None)
        if entry is not None:
            return entry
        ahead.clear()  # the reader jumped: drop what it skipped
        config = self._ctx.config
        last = min(self._lac, entry_id + config.tail_read_ahead_entries - 1)
        if last == entry_id:
            return await self.read_entry(entry_id)
        first: LedgerEntry | None = None
        size = 0
        async with contextlib.aclosing(self.read(entry_id, last)) as entries:
            async for entry in entries:
                if first is None:
                    first = entry
                else:
                    ahead[entry.entry_id] = entry
                size += len(entry.payload)
                if size >= config.batch_read_bytes_max:
                    break  # bounded in bytes too
        return first if first is not None else await self.read_entry(entry_id)

    async def close(self) -> None:
        """Nothing to release; for symmetry with the write handle."""

