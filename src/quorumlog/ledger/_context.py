"""What every ledger operation shares: the meta store, the bookie transport,
the settings, a seeded random source and a clock; plus metadata I/O.

:class:`MetaStore` is the part of ``quorumlog.meta.MetaClient`` the ledger
protocol uses; the simulator plugs in an in-memory store with the same
methods.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from quorumlog import proto as wire
from quorumlog.clock import SYSTEM_CLOCK, Clock
from quorumlog.errors import UsageError
from quorumlog.ledger._bookie_client import BookieTransport
from quorumlog.ledger._config import LedgerClientConfig
from quorumlog.ledger._metadata import LedgerMetadata, password_digest
from quorumlog.ledger._placement import BookieCandidate
from quorumlog.log import get_logger
from quorumlog.proto import NoSuchLedgerError, UnauthorizedError

DEFAULT_RACK = "default"


class StoredValue(Protocol):
    """A key's value and version as the meta store returns it (``KeyValue``)."""

    @property
    def key(self) -> str: ...

    @property
    def value(self) -> bytes: ...

    @property
    def version(self) -> int: ...


class MetaStore(Protocol):
    """The meta operations the ledger protocol needs (``MetaClient`` has them)."""

    async def get(self, key: str) -> Any: ...  # StoredValue | None

    async def cas(self, key: str, expected_version: int, value: bytes) -> bool: ...

    async def next_id(self, name: str, count: int = 1) -> int: ...

    async def list_keys(self, prefix: str, *, limit: int = 0) -> list[Any]: ...

    async def delete(self, key: str, *, prefix: bool = False) -> int: ...


@dataclass(slots=True)
class LedgerContext:
    meta: MetaStore
    bookies: BookieTransport
    config: LedgerClientConfig = field(default_factory=LedgerClientConfig)
    rng: random.Random = field(default_factory=random.Random)
    clock: Clock = SYSTEM_CLOCK  # every time the protocol stamps (created_ms) comes from here
    log: Any = field(default_factory=lambda: get_logger("quorumlog.ledger"))

    async def load_metadata(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        """The ledger's metadata and its version; NoSuchLedgerError if absent."""
        if ledger_id < 0:
            raise UsageError(f"ledger ids are >= 0, got {ledger_id}")
        kv = await self.meta.get(wire.ledger_key(ledger_id))
        if kv is None:
            raise NoSuchLedgerError(
                f"ledger {ledger_id} does not exist (no metadata at {wire.ledger_key(ledger_id)}); "
                "it was never created or was deleted"
            )
        return LedgerMetadata.decode(kv.value), int(kv.version)

    async def candidates(self, rack_label: str | None) -> list[BookieCandidate]:
        """Registered bookies, sorted by id; the failure domain from ``rack_label``.
        A read-only or draining (decommissioned) bookie is not writable: no new
        ensemble or replacement names it."""
        draining = {kv.key[len(wire.BOOKIE_DRAINING_PREFIX):]
                    for kv in await self.meta.list_keys(wire.BOOKIE_DRAINING_PREFIX)}
        out: list[BookieCandidate] = []
        for kv in await self.meta.list_keys(wire.BOOKIE_REGISTRY_PREFIX):
            try:
                registration = wire.BookieRegistration.decode(kv.value)
            except (msgspec.DecodeError, msgspec.ValidationError):
                self.log.warning("bookie_registration_malformed", key=kv.key)
                continue
            rack = registration.labels.get(rack_label, DEFAULT_RACK) if rack_label else DEFAULT_RACK
            writable = not registration.read_only and registration.id not in draining
            out.append(BookieCandidate(registration.id, rack, writable))
        out.sort(key=lambda c: c.address)
        return out


def check_password(metadata: LedgerMetadata, password: bytes) -> None:
    if password_digest(password) != metadata.password_sha256:
        raise UnauthorizedError(
            f"wrong password for ledger {metadata.ledger_id}: it does not match the one "
            "the ledger was created with"
        )
