"""The ledger client: create, open (with or without recovery), delete, list.

::

    async with LedgerClient.connect(["127.0.0.1:7101"]) as client:
        lh = await client.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2,
                                        password=b"secret")
        await lh.append(b"payload")
        await lh.close()
        rh = await client.open_ledger(lh.id, password=b"secret")

Creating a ledger contacts no bookie: the ensemble is chosen from the
registered, writable bookies in meta (``/bookies/available/``), the id comes
from ``next_id(LEDGER_ID_COUNTER)`` and the metadata is written with a
compare-and-swap on an absent key.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from typing import Any

from quorumlog import proto as wire
from quorumlog import rpc
from quorumlog.clock import Clock
from quorumlog.errors import QuorumlogError, UsageError
from quorumlog.ledger._bookie_client import (
    BookieOutcome,
    BookieTransport,
    RpcBookieTransport,
    outcome_of,
)
from quorumlog.ledger._config import LedgerClientConfig
from quorumlog.ledger._context import LedgerContext, MetaStore, check_password
from quorumlog.ledger._errors import EntryUnavailableError, LedgerClosedError, LedgerWriteError
from quorumlog.ledger._metadata import (
    Fragment,
    LedgerMetadata,
    LedgerState,
    password_digest,
)
from quorumlog.ledger._placement import choose_rack_aware, choose_random
from quorumlog.ledger._quorum import Schedule
from quorumlog.ledger._read import ReadHandle
from quorumlog.ledger._recovery import recover
from quorumlog.ledger._write import RACK_LABELS, WriteHandle, known_placement
from quorumlog.proto import DigestType

CUSTOM_METADATA_BYTES_MAX = 64 * 1024
"""Custom metadata per ledger (it lives in every copy of the metadata)."""

LIST_LIMIT_DEFAULT = 10_000
"""Ledger ids one ``list_ledgers`` call returns at most (meta's range limit)."""


class LedgerClient:
    """asyncio client of the ledger protocol (see the module docstring).

    Built from a meta store and a bookie transport; ``LedgerClient.connect``
    builds both over the network. The simulator builds it from simulated ones.
    """

    def __init__(
        self, meta: MetaStore, bookies: BookieTransport, *,
        config: LedgerClientConfig | None = None, rng: random.Random | None = None,
        clock: Clock | None = None, log: Any = None,
        on_close: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        config = config or LedgerClientConfig()
        config.validate()
        self._ctx = LedgerContext(meta, bookies, config, rng or random.Random())
        if clock is not None:
            self._ctx.clock = clock
        if log is not None:
            self._ctx.log = log
        self._on_close = on_close
        self._closed = False

    @classmethod
    def connect(
        cls, addresses: Sequence[str], *, config: LedgerClientConfig | None = None,
        security: rpc.RpcSecurityConfig | None = None, clock: Clock | None = None,
    ) -> _Connecting:
        """``await LedgerClient.connect(meta_addresses)`` or ``async with ...``."""
        return _Connecting(lambda: _connect(addresses, config, security, clock))

    @property
    def meta(self) -> Any:
        """The meta client this ledger client uses (shared; do not close it)."""
        return self._ctx.meta

    @property
    def config(self) -> LedgerClientConfig:
        return self._ctx.config

    @property
    def clock(self) -> Clock:
        """Where this client and what runs on it (streams) read time."""
        return self._ctx.clock

    @property
    def context(self) -> LedgerContext:
        return self._ctx

    async def __aenter__(self) -> LedgerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._ctx.bookies.close()
        if self._on_close is not None:
            await self._on_close()

    def _check_open(self) -> None:
        if self._closed:
            raise UsageError("the ledger client is closed")

    # ----- create ------------------------------------------------------------

    async def create_ledger(
        self, ensemble: int = 3, write_quorum: int = 2, ack_quorum: int = 2, *,
        digest: str | DigestType = "crc32c", password: bytes = b"",
        placement: str = "random", metadata: Mapping[str, bytes] | None = None,
        bookies: Sequence[str] | None = None,
    ) -> WriteHandle:
        """A new ledger, open for writing by this client only. ``bookies`` pins
        the first ensemble (``ensemble`` writable registered bookies, in order)
        instead of the placement policy choosing it: a health check of given
        bookies (BookKeeper's bookie sanity check pins its local bookie)."""
        self._check_open()
        schedule = Schedule(ensemble, write_quorum, ack_quorum)  # E >= Qw >= Qa >= 1
        digest_type = _digest_type(digest)
        custom = _custom(metadata)
        if placement not in RACK_LABELS:
            raise UsageError(
                f"unknown placement {placement!r}: use one of {', '.join(RACK_LABELS)}")
        if bookies is None:
            bookies = await self._place(schedule, placement)
        else:
            bookies = await self._pinned(schedule, bookies)
        ledger_id = await self._ctx.meta.next_id(wire.LEDGER_ID_COUNTER)
        created = LedgerMetadata(
            ledger_id=ledger_id, ensemble_size=ensemble, write_quorum=write_quorum,
            ack_quorum=ack_quorum, digest=digest_type, password_sha256=password_digest(password),
            ensembles=(Fragment(0, bookies),), custom=custom, created_ms=self._ctx.clock.wall_ms(),
            password=password, placement=placement,
        )
        if not await self._ctx.meta.cas(wire.ledger_key(ledger_id), 0, created.encode()):
            raise QuorumlogError(
                f"ledger id {ledger_id} is already taken in meta ({wire.ledger_key(ledger_id)}):"
                " the id counter was reset or another tool wrote ledger keys; not overwriting")
        self._ctx.log.debug("ledger_created", ledger=ledger_id, ensemble=list(bookies),
                            e=ensemble, qw=write_quorum, qa=ack_quorum)
        return WriteHandle(self._ctx, created, 1, password, placement=placement)

    async def _pinned(self, schedule: Schedule, bookies: Sequence[str]) -> tuple[str, ...]:
        chosen = tuple(bookies)
        if len(chosen) != schedule.ensemble_size or len(set(chosen)) != len(chosen):
            raise UsageError(f"an ensemble of {schedule.ensemble_size} needs as many distinct "
                             f"bookies, not {list(chosen)}")
        writable = {c.address for c in await self._ctx.candidates(None) if c.writable}
        refused = [b for b in chosen if b not in writable]
        if refused:
            raise UsageError(f"bookie(s) {', '.join(refused)} are not registered and writable "
                             "(quorumlog bookie list shows the bookies)")
        return chosen

    async def _place(self, schedule: Schedule, placement: str) -> tuple[str, ...]:
        label = RACK_LABELS[placement]
        candidates = await self._ctx.candidates(label)
        if label is None:
            return choose_random(candidates, schedule.ensemble_size, self._ctx.rng).bookies
        chosen = choose_rack_aware(
            candidates, schedule.ensemble_size, write_quorum=schedule.write_quorum,
            min_racks=self._ctx.config.placement_min_racks, rng=self._ctx.rng)
        if not chosen.spread_ok:
            self._ctx.log.warning("ledger_placement_spread_short", placement=placement,
                                  ensemble=list(chosen.bookies))
        return chosen.bookies

    # ----- open ----------------------------------------------------------------

    async def open_ledger(
        self, ledger_id: int, *, password: bytes = b"", recovery: bool = True
    ) -> ReadHandle:
        """Open for reading. ``recovery=True`` fences the ledger, recovers its
        last entries and closes it (the writer, if alive, is locked out);
        ``recovery=False`` reads an open ledger alongside its writer, up to
        the LAC the bookies report."""
        self._check_open()
        metadata, version = await self._ctx.load_metadata(ledger_id)
        check_password(metadata, password)
        if recovery and not metadata.is_closed:
            metadata, version = await recover(self._ctx, ledger_id, password)
        handle = ReadHandle(self._ctx, metadata, version, password)
        if not metadata.is_closed:
            try:
                await handle.read_last_add_confirmed()
            except QuorumlogError as exc:  # readable up to the last fragment's start
                self._ctx.log.info("ledger_open_lac_unknown", ledger=ledger_id,
                                   error=exc.message)
        return handle

    async def open_for_append(self, ledger_id: int, *, password: bytes = b"") -> WriteHandle:
        """Continue writing an OPEN ledger whose previous writer finished with
        ``WriteHandle.detach()`` (the ``quorumlog ledger append`` command).

        Only safe when no other writer is alive: the ledger protocol has one
        writer per ledger. Every bookie of the last fragment must answer, and
        none may hold an entry past the LAC (a writer that did not finish
        left them: recover the ledger instead). The resumed handle does not
        know the ledger's length: it closes with ``length_bytes = -1``.
        """
        self._check_open()
        metadata, version = await self._ctx.load_metadata(ledger_id)
        check_password(metadata, password)
        if metadata.state is not LedgerState.OPEN:
            raise LedgerClosedError(
                f"ledger {ledger_id} is {metadata.state.value}: it cannot take more entries")
        fragment = metadata.ensembles[-1]
        timeout_s = self._ctx.config.read_timeout_ms / 1000
        replies = await asyncio.gather(*(
            self._ctx.bookies.read_lac(bookie, ledger_id, timeout_s=timeout_s)
            for bookie in fragment.bookies), return_exceptions=True)
        lac, last = fragment.first_entry_id - 1, -1
        for bookie, reply in zip(fragment.bookies, replies, strict=True):
            if isinstance(reply, BaseException):
                if outcome_of(reply) is BookieOutcome.NO_SUCH_ENTRY:
                    continue  # this bookie has nothing of the ledger yet
                raise EntryUnavailableError(
                    f"cannot find the end of ledger {ledger_id}: bookie {bookie} did not "
                    f"answer ({reply}); every bookie of its last fragment must answer")
            lac, last = max(lac, reply.lac), max(last, reply.last_entry_id)
        if last > lac:
            raise LedgerWriteError(
                f"ledger {ledger_id} holds entries {lac + 1}..{last} past its LAC {lac}: its "
                "last writer did not finish; recover it (`quorumlog ledger recover`) and "
                "write to a new ledger")
        return WriteHandle(self._ctx, metadata, version, password, lac=lac,
                           length_known=False, placement=known_placement(metadata.placement))

    async def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        self._check_open()
        metadata, _ = await self._ctx.load_metadata(ledger_id)
        return metadata

    async def last_add_confirmed(self, ledger_id: int) -> int:
        """The LAC of a ledger as its bookies know it, without opening it (no
        password, no fencing): a closed ledger's last entry from metadata; for
        an open one, the highest LAC the bookies of its last fragment report
        (BookKeeper's ``readLastAddConfirmed``: a lower bound while the writer
        runs). -1 when nothing is confirmed; EntryUnavailableError when no
        bookie of the last fragment answers."""
        self._check_open()
        metadata, _ = await self._ctx.load_metadata(ledger_id)
        if metadata.is_closed:
            return metadata.last_entry_id
        fragment = metadata.ensembles[-1]
        timeout_s = self._ctx.config.read_timeout_ms / 1000
        replies = await asyncio.gather(*(
            self._ctx.bookies.read_lac(bookie, ledger_id, timeout_s=timeout_s)
            for bookie in fragment.bookies), return_exceptions=True)
        lac, answered = fragment.first_entry_id - 1, False
        for reply in replies:
            if isinstance(reply, BaseException):
                if outcome_of(reply) is BookieOutcome.NO_SUCH_ENTRY:
                    answered = True  # this bookie has nothing of the ledger yet
                continue
            answered, lac = True, max(lac, reply.lac)
        if not answered:
            raise EntryUnavailableError(
                f"ledger {ledger_id}: no bookie of its last fragment "
                f"({', '.join(fragment.bookies)}) answered for its LAC")
        return lac

    # ----- delete and list -------------------------------------------------------

    async def delete_ledger(self, ledger_id: int, *, force: bool = False) -> None:
        """Remove the metadata; bookies garbage-collect the entries.

        A ledger whose custom metadata names an owner (``OWNER_METADATA_KEYS``:
        a stream's ledgers) is refused with a UsageError naming the owner unless
        ``force``: deleting it under its owner loses the owner's data (a stream
        can no longer be read from its start). Owners delete their own ledgers
        with ``force=True``.
        """
        self._check_open()
        metadata, _ = await self._ctx.load_metadata(ledger_id)  # NoSuchLedgerError if unknown
        owner = ledger_owner(metadata.custom)
        if owner and not force:
            raise UsageError(
                f"ledger {ledger_id} belongs to {owner}; deleting it would lose that data "
                "for every reader. Let the owner delete it (quorumlog stream trim / stream "
                "delete), or force it with --force (force=True)")
        if not await self._ctx.meta.delete(wire.ledger_key(ledger_id)):
            await self._ctx.load_metadata(ledger_id)  # raises unless re-created meanwhile

    async def list_ledgers(self, *, limit: int = LIST_LIMIT_DEFAULT) -> list[int]:
        """Ledger ids in meta, ascending (at most ``limit``)."""
        self._check_open()
        ids = []
        for kv in await self._ctx.meta.list_keys(wire.LEDGER_KEY_PREFIX, limit=limit):
            ledger_id = wire.ledger_id_of_key(kv.key)
            if ledger_id is not None:
                ids.append(ledger_id)
        return ids


OWNER_METADATA_KEYS: tuple[str, ...] = ("quorumlog.stream",)
"""Custom metadata keys that name a ledger's owner; a ledger carrying one is
deleted only with ``force`` (streams write their name under "quorumlog.stream")."""


def ledger_owner(custom: Mapping[str, bytes]) -> str:
    """Who owns a ledger, from its custom metadata ("" if nobody claims it)."""
    if not any(key in custom for key in OWNER_METADATA_KEYS):
        return ""
    return ", ".join(f"{key.removeprefix('quorumlog.')} {value.decode(errors='replace')!r}"
                     for key, value in sorted(custom.items()) if key.startswith("quorumlog."))


def _digest_type(digest: str | DigestType) -> DigestType:
    try:
        return DigestType(digest)
    except ValueError:
        raise UsageError(
            f"unknown digest {digest!r}: use {DigestType.CRC32C.value!r} or "
            f"{DigestType.HMAC_SHA256.value!r}") from None


def _custom(metadata: Mapping[str, bytes] | None) -> dict[str, bytes]:
    custom = dict(metadata or {})
    size = 0
    for key, value in custom.items():
        if not isinstance(key, str) or not isinstance(value, bytes):
            raise UsageError("custom metadata maps str keys to bytes values")
        size += len(key) + len(value)
    if size > CUSTOM_METADATA_BYTES_MAX:
        raise UsageError(
            f"custom metadata of {size} bytes exceeds {CUSTOM_METADATA_BYTES_MAX} bytes")
    return custom


async def _connect(
    addresses: Sequence[str], config: LedgerClientConfig | None,
    security: rpc.RpcSecurityConfig | None, clock: Clock | None = None,
) -> LedgerClient:
    from quorumlog.meta import MetaClient

    config = config or LedgerClientConfig()
    config.validate()
    meta = MetaClient(list(addresses))
    in_flight = max(rpc.RpcConfig().max_in_flight_requests, config.outstanding_adds_max + 1024)
    pool = rpc.Pool(config=rpc.RpcConfig(max_in_flight_requests=in_flight,
                                          write_buffer_high_water_bytes=16 * 1024 * 1024),
                    security=security)
    return LedgerClient(meta, RpcBookieTransport(pool, own_pool=True), config=config,
                        clock=clock, on_close=meta.close)


class _Connecting:
    """What ``LedgerClient.connect`` returns: awaitable, and an async context
    manager that closes the client on exit."""

    def __init__(self, factory: Callable[[], Awaitable[LedgerClient]]) -> None:
        self._factory = factory
        self._client: LedgerClient | None = None

    def __await__(self) -> Generator[Any, None, LedgerClient]:
        return self._open().__await__()

    async def _open(self) -> LedgerClient:
        self._client = await self._factory()
        return self._client

    async def __aenter__(self) -> LedgerClient:
        return await self._open()

    async def __aexit__(self, *exc: object) -> None:
        if self._client is not None:
            await self._client.close()
