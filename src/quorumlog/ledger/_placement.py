"""Placement policies: which bookies form an ensemble (pure, seeded).

* ``random``: E distinct writable bookies chosen uniformly.
* ``rack_aware``: spreads members over racks so that every write set (Qw
  consecutive ensemble members, wrapping) spans at least ``min_racks`` racks
  when the registered bookies allow it; falls back to the best spread possible
  and says so through :attr:`Placement.spread_ok`.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from quorumlog.errors import TransientError


@dataclass(frozen=True, slots=True)
class BookieCandidate:
    address: str
    rack: str = "default"
    writable: bool = True


@dataclass(frozen=True, slots=True)
class Placement:
    bookies: tuple[str, ...]
    spread_ok: bool


class NotEnoughBookiesError(TransientError):
    """Fewer writable bookies are registered than the ensemble needs."""


def _writable(candidates: Sequence[BookieCandidate], exclude: set[str]) -> list[BookieCandidate]:
    return [c for c in candidates if c.writable and c.address not in exclude]


def choose_random(
    candidates: Sequence[BookieCandidate], size: int, rng: random.Random,
    exclude: set[str] | None = None,
) -> Placement:
    pool = _writable(candidates, exclude or set())
    if len(pool) < size:
        raise NotEnoughBookiesError(
            f"need {size} writable bookies, {len(pool)} available; start more bookies "
            "or lower the ensemble size"
        )
    chosen = rng.sample(sorted(pool, key=lambda c: c.address), size)
    return Placement(tuple(c.address for c in chosen), True)


def write_sets_spread(racks: Sequence[str], write_quorum: int, min_racks: int) -> bool:
    """Whether every write set of an ensemble whose bookies sit in ``racks`` spans
    ``min_racks`` racks (or its whole write quorum, if smaller)."""
    n = len(racks)
    return all(
        len({racks[(first + k) % n] for k in range(write_quorum)}) >= min(min_racks, write_quorum)
        for first in range(n)
    )


def choose_rack_aware(
    candidates: Sequence[BookieCandidate], size: int, *, write_quorum: int, min_racks: int,
    rng: random.Random, exclude: set[str] | None = None,
) -> Placement:
    """Round-robin over shuffled racks, so consecutive members differ in rack."""
    pool = _writable(candidates, exclude or set())
    if len(pool) < size:
        raise NotEnoughBookiesError(
            f"need {size} writable bookies, {len(pool)} available; start more bookies "
            "or lower the ensemble size"
        )
    by_rack: dict[str, list[BookieCandidate]] = defaultdict(list)
    for c in sorted(pool, key=lambda c: c.address):
        by_rack[c.rack].append(c)
    racks = sorted(by_rack)
    rng.shuffle(racks)
    for rack in racks:
        rng.shuffle(by_rack[rack])
    chosen: list[BookieCandidate] = []
    while len(chosen) < size:
        for rack in racks:
            if by_rack[rack] and len(chosen) < size:
                chosen.append(by_rack[rack].pop())
    ok = write_sets_spread([c.rack for c in chosen], write_quorum, min_racks)
    return Placement(tuple(c.address for c in chosen), ok)


def choose_replacement(
    candidates: Sequence[BookieCandidate], ensemble: Sequence[str], index: int,
    rng: random.Random, *, write_quorum: int = 1, min_racks: int = 1,
) -> str:
    """A bookie to replace ``ensemble[index]``: not already in the ensemble,
    preferring one whose rack keeps every write set spread."""
    pool = _writable(candidates, set(ensemble))
    if not pool:
        raise NotEnoughBookiesError(
            f"no writable bookie outside the ensemble to replace {ensemble[index]}"
        )
    racks = {c.address: c.rack for c in candidates}
    rng_pool = sorted(pool, key=lambda c: c.address)
    rng.shuffle(rng_pool)
    for candidate in rng_pool:
        trial = [racks.get(b, "default") for b in ensemble]
        trial[index] = candidate.rack
        if write_sets_spread(trial, write_quorum, min_racks):
            return candidate.address
    return rng_pool[0].address
