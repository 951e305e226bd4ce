"""A simulated disk: synced records survive a crash, unsynced ones may not.

The disk is an append-only sequence of records (a write-ahead log). Records
written since the last ``sync()`` form the *unsynced tail*. On a crash:

- with probability ``1 - unsynced_tail_survives_probability`` the whole tail is
  lost;
- otherwise a random prefix of the tail reached the platter (a log is written
  in order), and with probability ``torn_write_probability`` the last record of
  that prefix is *torn*: only part of it is there. What "part" means is up to
  the record type (``tear``), e.g. a prefix of a batch of entries; a record
  that cannot be partial (one CRC-checked frame) is dropped whole.

After a crash the process restarts from :meth:`SimDisk.durable_records`.
``rewrite`` replaces the whole contents at once and durably (a checkpoint
written to a new file, synced and renamed over the old one).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from quorumlog.errors import invariant
from quorumlog.sim._config import FaultMix

R = TypeVar("R")

DISK_RECORDS_MAX = 1_000_000
"""Records one simulated disk holds before the run is declared broken."""


@dataclass(frozen=True, slots=True)
class CrashOutcome:
    lost_records: int
    kept_unsynced_records: int
    torn: bool


@dataclass(slots=True)
class SimDisk(Generic[R]):
    """Records of type ``R``; ``tear(record, rng)`` returns a partial record or None."""

    tear: Callable[[R, random.Random], R | None]
    _synced: list[R] = field(default_factory=list)
    _unsynced: list[R] = field(default_factory=list)
    syncs: int = 0
    writes: int = 0

    def write(self, record: R) -> None:
        invariant(
            len(self._synced) + len(self._unsynced) < DISK_RECORDS_MAX,
            f"simulated disk holds more than {DISK_RECORDS_MAX} records; compact it",
        )
        self._unsynced.append(record)
        self.writes += 1

    def sync(self) -> None:
        if self._unsynced:
            self._synced.extend(self._unsynced)
            self._unsynced.clear()
        self.syncs += 1

    def rewrite(self, records: Iterable[R]) -> None:
        """Durably replace everything (checkpoint + atomic rename)."""
        self._synced = list(records)
        self._unsynced.clear()
        self.syncs += 1

    @property
    def unsynced_records(self) -> int:
        return len(self._unsynced)

    def records(self) -> list[R]:
        """What a running process sees: synced and unsynced records."""
        return [*self._synced, *self._unsynced]

    def durable_records(self) -> list[R]:
        return list(self._synced)

    def crash(self, rng: random.Random, mix: FaultMix) -> CrashOutcome:
        """Lose (part of) the unsynced tail, maybe tearing its last surviving write."""
        tail = self._unsynced
        self._unsynced = []
        if not tail:
            return CrashOutcome(0, 0, torn=False)
        if rng.random() >= mix.unsynced_tail_survives_probability:
            return CrashOutcome(len(tail), 0, torn=False)
        kept = rng.randint(1, len(tail))
        survivors = tail[:kept]
        torn = rng.random() < mix.torn_write_probability
        if torn:
            partial = self.tear(survivors[-1], rng)
            survivors = survivors[:-1] if partial is None else [*survivors[:-1], partial]
        self._synced.extend(survivors)
        return CrashOutcome(len(tail) - kept, kept, torn=torn)
