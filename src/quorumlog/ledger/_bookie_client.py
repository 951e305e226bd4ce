"""Talking to bookies: the small interface the ledger protocol drives, and its
implementation over ``quorumlog.rpc``.

The protocol code (write handle, recovery, reads) only sees
:class:`BookieTransport`; the simulator plugs in simulated bookies behind the
same interface, so one body of protocol code runs against both.

Every answer is one of five outcomes (:func:`outcome_of`):

- ``OK``;
- ``NO_SUCH_ENTRY``: the bookie said it does not hold the entry (or the
  ledger) - an explicit, trustworthy "no";
- ``FENCED``: the ledger is fenced on that bookie (a recovering client took
  over);
- ``UNAUTHORIZED``: the master key does not match (wrong password);
- ``UNKNOWN``: anything else - a timeout, a closed connection, a bookie that
  is read-only or overloaded, a bad reply. It proves nothing: recovery never
  counts it as "no such entry".
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from quorumlog import proto as wire
from quorumlog import rpc
from quorumlog.errors import QuorumlogError, UsageError
from quorumlog.proto import (
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedError,
)

ADD_FLAGS_NONE = 0

T = TypeVar("T")


class BookieOutcome(enum.Enum):
    OK = "ok"
    NO_SUCH_ENTRY = "no_such_entry"
    FENCED = "fenced"
    UNAUTHORIZED = "unauthorized"
    UNKNOWN = "unknown"


def outcome_of(error: BaseException | None) -> BookieOutcome:
    """Map a bookie call's error (None: success) to its outcome."""
    if error is None:
        return BookieOutcome.OK
    if isinstance(error, NoSuchEntryError | NoSuchLedgerError):
        return BookieOutcome.NO_SUCH_ENTRY
    if isinstance(error, LedgerFencedError):
        return BookieOutcome.FENCED
    if isinstance(error, UnauthorizedError):
        return BookieOutcome.UNAUTHORIZED
    return BookieOutcome.UNKNOWN


@dataclass(frozen=True, slots=True)
class EntryReply:
    """One entry read from one bookie: its envelope and the bookie's LAC."""

    envelope: bytes | memoryview
    lac: int


@dataclass(frozen=True, slots=True)
class BatchReply:
    """Consecutive envelopes from ``first_entry_id`` on (maybe fewer than asked),
    back to back in ``buffer``, ``sizes[i]`` bytes each (checked to add up)."""

    buffer: bytes | memoryview
    sizes: list[int]
    lac: int

    def __post_init__(self) -> None:
        if sum(self.sizes) != len(self.buffer) or (self.sizes and min(self.sizes) < 0):
            raise rpc.ConnectionClosedError(
                f"a bookie sent a batch of {len(self.buffer)} bytes whose entry sizes "
                f"do not add up to it")

    def envelopes(self) -> list[bytes | memoryview]:
        """The envelopes one by one (a view each, no copy)."""
        view = memoryview(self.buffer)
        out: list[bytes | memoryview] = []
        offset = 0
        for size in self.sizes:
            out.append(view[offset:offset + size])
            offset += size
        return out


@dataclass(frozen=True, slots=True)
class LacReply:
    """A bookie's view of a ledger: LAC, last entry held, fenced flag, and (for a
    long poll with ``with_entry``) the envelope of entry ``previous_lac + 1``."""

    lac: int
    last_entry_id: int
    fenced: bool
    envelope: bytes | memoryview | None = None


class BookieTransport(Protocol):
    """Per-bookie calls. Each raises the bookie's error class on an error
    answer, and something mapping to ``UNKNOWN`` on timeouts and lost
    connections (see :func:`outcome_of`)."""

    def add_entry(
        self, bookie: str, ledger_id: int, entry_id: int, master_key: bytes,
        envelope: bytes, *, flags: int, timeout_s: float,
    ) -> asyncio.Future[Any]:
        """Send one add now (no coroutine per add); the future fails on error."""
        ...

    def add_entries(
        self, bookie: str, ledger_id: int, master_key: bytes,
        entries: Sequence[tuple[int, bytes]], *, flags: int, timeout_s: float,
    ) -> asyncio.Future[list[QuorumlogError | None]]:
        """Send a batch of adds to one ledger now (entry ids strictly ascending,
        at most ``proto.ADD_BATCH_ENTRIES_MAX``). The future's result holds
        each entry's error in order (None: durable on the bookie); the future
        fails when the whole request does (timeout, lost connection, a
        malformed batch): then no entry's fate is known."""
        ...

    async def read_entry(
        self, bookie: str, ledger_id: int, entry_id: int, *, timeout_s: float,
        fence: bool = False, master_key: bytes = b"",
    ) -> EntryReply: ...

    async def read_batch(
        self, bookie: str, ledger_id: int, first_entry_id: int, *, max_entries: int,
        max_bytes: int, timeout_s: float,
    ) -> BatchReply: ...

    async def read_lac(
        self, bookie: str, ledger_id: int, *, timeout_s: float, previous_lac: int = -1,
        long_poll_ms: int = 0, with_entry: bool = False,
    ) -> LacReply: ...

    async def fence(
        self, bookie: str, ledger_id: int, master_key: bytes, *, timeout_s: float
    ) -> LacReply: ...

    async def write_lac(
        self, bookie: str, ledger_id: int, master_key: bytes, lac: int, *, timeout_s: float
    ) -> None: ...

    async def delete_ledger(
        self, bookie: str, ledger_id: int, master_key: bytes, *, timeout_s: float
    ) -> bool: ...

    async def flush_ledger(
        self, bookie: str, ledger_id: int, master_key: bytes, entry_ids: Sequence[int], *,
        timeout_s: float,
    ) -> int:
        """Have ``bookie`` flush its write cache (synced) and check that it then
        durably holds each of ``entry_ids`` (at most ``proto.FLUSH_ENTRIES_MAX``)
        of the ledger: what makes ``FLAG_NO_JOURNAL`` adds durable. Returns how
        many it holds (all); NoSuchEntryError / NoSuchLedgerError when some are
        gone (the bookie restarted since the adds)."""
        ...

    async def close(self) -> None: ...


class RpcBookieTransport:
    """:class:`BookieTransport` over an ``rpc.Pool`` (bookie id = its address).

    Adds take a fast path: ``send_nowait`` on the open connection, returning
    the rpc layer's own future (no task per add). When there is no open
    connection yet, or the connection's in-flight window or write buffer is
    full, the add goes through a task that waits for capacity instead.
    """

    def __init__(self, pool: rpc.Pool, *, own_pool: bool = False) -> None:
        self._pool = pool
        self._own_pool = own_pool
        self._connections: dict[str, rpc.Connection] = {}
        # Answers of batched adds run in the context the transport was made in
        # (add_done_callback without one copies the current context: one more
        # object per request for the garbage collector to track).
        self._context = contextvars.copy_context()

    @property
    def pool(self) -> rpc.Pool:
        return self._pool

    def add_entry(
        self, bookie: str, ledger_id: int, entry_id: int, master_key: bytes,
        envelope: bytes, *, flags: int, timeout_s: float,
    ) -> asyncio.Future[Any]:
        request = wire.AddEntryRequest(
            ledger_id=ledger_id, entry_id=entry_id, master_key=master_key, flags=flags
        )
        return self._send_now(bookie, request, envelope, timeout_s)

    def add_entries(
        self, bookie: str, ledger_id: int, master_key: bytes,
        entries: Sequence[tuple[int, bytes]], *, flags: int, timeout_s: float,
    ) -> asyncio.Future[list[QuorumlogError | None]]:
        sent, entry_ids = self._send_batch(bookie, ledger_id, master_key, entries,
                                           flags=flags, timeout_s=timeout_s)
        out: asyncio.Future[list[QuorumlogError | None]] = (
            asyncio.get_running_loop().create_future())
        sent.add_done_callback(functools.partial(_batch_answer, out, bookie, entry_ids),
                               context=self._context)
        return out

    def add_entries_then(
        self, bookie: str, ledger_id: int, master_key: bytes,
        entries: Sequence[tuple[int, bytes]], *, flags: int, timeout_s: float,
        then: BatchAnswer,
    ) -> None:
        """``add_entries``, with the answer handed to ``then`` by the request's
        own done-callback instead of through a second future: one event-loop
        pass sooner (``WriteHandle`` uses it when its transport has it)."""
        sent, entry_ids = self._send_batch(bookie, ledger_id, master_key, entries,
                                           flags=flags, timeout_s=timeout_s)
        sent.add_done_callback(functools.partial(_batch_answer_then, then, bookie, entry_ids),
                               context=self._context)

    def _send_batch(
        self, bookie: str, ledger_id: int, master_key: bytes,
        entries: Sequence[tuple[int, bytes]], *, flags: int, timeout_s: float,
    ) -> tuple[asyncio.Future[Any], list[int]]:
        """One AddEntriesRequest for ``entries``, sent now: its future and the ids."""
        entry_ids = [entry_id for entry_id, _ in entries]
        request = wire.AddEntriesRequest(
            ledger_id=ledger_id, entry_ids=entry_ids,
            sizes=[len(envelope) for _, envelope in entries], master_key=master_key,
            flags=flags)
        payload = b"".join(envelope for _, envelope in entries)
        return self._send_now(bookie, request, payload, timeout_s), entry_ids

    def _send_now(
        self, bookie: str, request: rpc.Request[Any], payload: bytes, timeout_s: float
    ) -> asyncio.Future[Any]:
        """``send_nowait`` on the open connection, or a task that waits for one."""
        connection = self._connections.get(bookie)
        if connection is not None and not connection.closed:
            try:
                return connection.send_nowait(request, payload=payload, timeout_s=timeout_s)
            except rpc.BackpressureError:
                pass
        return asyncio.get_running_loop().create_task(
            self._call(bookie, request, payload, timeout_s))

    async def _connection(self, bookie: str) -> rpc.Connection:
        connection = self._connections.get(bookie)
        if connection is None or connection.closed:
            connection = await self._pool.get(bookie)
            self._connections[bookie] = connection
        return connection

    async def _call(
        self, bookie: str, request: rpc.Request[Any], payload: bytes | None, timeout_s: float
    ) -> tuple[Any, memoryview]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            async with asyncio.timeout_at(deadline):
                connection = await self._connection(bookie)
        except TimeoutError:
            raise rpc.ConnectFailedError(
                f"no connection to bookie {bookie} within {timeout_s:.3f}s"
            ) from None
        remaining = max(deadline - loop.time(), 0.001)
        return await connection.call_with_payload(request, payload=payload, timeout_s=remaining)

    async def read_entry(
        self, bookie: str, ledger_id: int, entry_id: int, *, timeout_s: float,
        fence: bool = False, master_key: bytes = b"",
    ) -> EntryReply:
        request = wire.ReadEntryRequest(
            ledger_id=ledger_id, entry_id=entry_id,
            flags=wire.FLAG_FENCE if fence else 0, master_key=master_key if fence else b"",
        )
        response, payload = await self._call(bookie, request, None, timeout_s)
        return EntryReply(payload, response.lac)

    async def read_batch(
        self, bookie: str, ledger_id: int, first_entry_id: int, *, max_entries: int,
        max_bytes: int, timeout_s: float,
    ) -> BatchReply:
        request = wire.ReadBatchRequest(
            ledger_id=ledger_id, first_entry_id=first_entry_id, max_entries=max_entries,
            max_bytes=max_bytes,
        )
        response, payload = await self._call(bookie, request, None, timeout_s)
        return BatchReply(payload, response.sizes, response.lac)

    async def read_lac(
        self, bookie: str, ledger_id: int, *, timeout_s: float, previous_lac: int = -1,
        long_poll_ms: int = 0, with_entry: bool = False,
    ) -> LacReply:
        if long_poll_ms < 0:
            raise UsageError(f"long_poll_ms must be >= 0, got {long_poll_ms}")
        request = wire.ReadLacRequest(
            ledger_id=ledger_id, previous_lac=previous_lac, timeout_ms=long_poll_ms,
            with_entry=with_entry,
        )
        response, payload = await self._call(
            bookie, request, None, timeout_s + long_poll_ms / 1000
        )
        return LacReply(response.lac, response.last_entry_id, response.fenced,
                        payload if len(payload) else None)

    async def fence(
        self, bookie: str, ledger_id: int, master_key: bytes, *, timeout_s: float
    ) -> LacReply:
        request = wire.FenceRequest(ledger_id=ledger_id, master_key=master_key)
        response, _ = await self._call(bookie, request, None, timeout_s)
        return LacReply(response.lac, response.last_entry_id, response.fenced)

    async def write_lac(
        self, bookie: str, ledger_id: int, master_key: bytes, lac: int, *, timeout_s: float
    ) -> None:
        request = wire.WriteLacRequest(ledger_id=ledger_id, master_key=master_key, lac=lac)
        await self._call(bookie, request, None, timeout_s)

    async def delete_ledger(
        self, bookie: str, ledger_id: int, master_key: bytes, *, timeout_s: float
    ) -> bool:
        """Drop ``bookie``'s copy of the ledger; False if it held none."""
        request = wire.DeleteLedgerRequest(ledger_id=ledger_id, master_key=master_key)
        response, _ = await self._call(bookie, request, None, timeout_s)
        return bool(response.deleted)

    async def flush_ledger(
        self, bookie: str, ledger_id: int, master_key: bytes, entry_ids: Sequence[int], *,
        timeout_s: float,
    ) -> int:
        request = wire.FlushLedgerRequest(ledger_id=ledger_id, master_key=master_key,
                                          entry_ids=list(entry_ids))
        response, _ = await self._call(bookie, request, None, timeout_s)
        return int(response.entries_durable)

    async def close(self) -> None:
        self._connections.clear()
        if self._own_pool:
            await self._pool.close()


BatchAnswer = Callable[[list[QuorumlogError | None] | None, BaseException | None], None]
"""``then(errors, None)``: each entry's error in order (None: durable);
``then(None, error)``: the request failed as a whole (no entry's fate known)."""


def _batch_outcome(
    bookie: str, entry_ids: list[int], sent: asyncio.Future[Any],
) -> tuple[list[QuorumlogError | None] | None, BaseException | None]:
    """An ``AddEntriesResponse`` as per-entry errors, or the whole request's error."""
    if sent.cancelled():
        return None, rpc.ConnectionClosedError(f"a batch of adds to {bookie} was cancelled")
    error = sent.exception()
    if error is not None:
        return None, error
    response = sent.result()[0]
    if (response.entry_ids != entry_ids or len(response.codes) != len(entry_ids)
            or len(response.messages) != len(entry_ids)):
        return None, rpc.ConnectionClosedError(
            f"bookie {bookie} answered a batch of {len(entry_ids)} adds with results for "
            f"entries {response.entry_ids[:8]}...; the batch's outcome is unknown")
    return [wire.entry_error(code, message)
            for code, message in zip(response.codes, response.messages, strict=True)], None


def _batch_answer(
    out: asyncio.Future[list[QuorumlogError | None]], bookie: str, entry_ids: list[int],
    sent: asyncio.Future[Any],
) -> None:
    """Turn an ``AddEntriesResponse`` into the per-entry errors of ``out``."""
    if out.done():
        return
    errors, error = _batch_outcome(bookie, entry_ids, sent)
    if errors is None:
        out.set_exception(error or rpc.ConnectionClosedError("a batch of adds failed"))
    else:
        out.set_result(errors)


def _batch_answer_then(then: BatchAnswer, bookie: str, entry_ids: list[int],
                       sent: asyncio.Future[Any]) -> None:
    errors, error = _batch_outcome(bookie, entry_ids, sent)
    then(errors, error)


def in_order(done: set[T], started: Iterable[T]) -> list[T]:
    """The finished ones of ``started``, in the order they were started (a set's
    order depends on object addresses; the simulator needs runs to repeat)."""
    return [task for task in started if task in done]


def cancel_quietly(tasks: Iterable[asyncio.Future[Any]]) -> None:
    """Cancel futures nobody will await, consuming their outcomes (no
    "exception was never retrieved" noise)."""
    for task in tasks:
        if task.done():
            if not task.cancelled():
                task.exception()
        else:
            task.cancel()
            task.add_done_callback(_consume)


def _consume(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()
