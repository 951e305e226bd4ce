"""Pure decisions of auto-recovery: which bookies count as lost, which ledger
fragments need a new replica, and which entries a replica position holds.

No I/O and no clock: the auditor and the workers pass in what they read from
meta and the time, so the decisions are testable on their own.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from quorumlog.errors import invariant
from quorumlog.ledger import (
    RACK_LABELS,
    BookieCandidate,
    LedgerMetadata,
    choose_replacement,
    known_placement,
    write_sets_spread,
)


def lost_bookies(missing_since_ms: Mapping[str, int], now_ms: int, delay_ms: int,
                 draining: Iterable[str] = ()) -> set[str]:
    """Bookies to replicate away: unregistered for at least ``delay_ms``, or
    draining (decommission: at once, while they still serve reads)."""
    lost = {bookie for bookie, since in missing_since_ms.items() if now_ms - since >= delay_ms}
    return lost | set(draining)


def bookies_to_replace(metadata: LedgerMetadata, lost: set[str]) -> tuple[str, ...]:
    """The lost bookies some fragment of the ledger names (sorted)."""
    named = {bookie for fragment in metadata.ensembles for bookie in fragment.bookies}
    return tuple(sorted(named & lost))


@dataclass(frozen=True, slots=True)
class Slot:
    """One replica position of one fragment: ensemble index ``position`` of
    the fragment ``fragment_index``, covering entries ``first..last``."""

    fragment_index: int
    first_entry_id: int
    position: int
    bookie: str
    last_entry_id: int  # < first_entry_id: the fragment holds no entry


def slots_to_replace(metadata: LedgerMetadata, bookies: Iterable[str]) -> list[Slot]:
    """Every (fragment, position) naming one of ``bookies``; the ledger must be CLOSED
    (an open ledger's last fragment has no known end)."""
    invariant(metadata.is_closed, "only a closed ledger's fragments have known ends")
    wanted = set(bookies)
    out: list[Slot] = []
    for index, fragment in enumerate(metadata.ensembles):
        if index + 1 < len(metadata.ensembles):
            last = metadata.ensembles[index + 1].first_entry_id - 1
        else:
            last = metadata.last_entry_id
        last = min(last, metadata.last_entry_id)
        for position, bookie in enumerate(fragment.bookies):
            if bookie in wanted:
                out.append(Slot(index, fragment.first_entry_id, position, bookie, last))
    return out


def entries_of_slot(metadata: LedgerMetadata, slot: Slot) -> list[int]:
    """Entry ids the replica at ``slot`` stores (its write sets name it)."""
    schedule = metadata.schedule
    return [entry_id for entry_id in range(slot.first_entry_id, slot.last_entry_id + 1)
            if schedule.stores(entry_id, slot.position)]


def sources_for(metadata: LedgerMetadata, slot: Slot, entry_id: int,
                avoid: set[str]) -> list[str]:
    """Bookies of ``entry_id``'s write set to read it from, other than the slot's own
    bookie; those in ``avoid`` (lost, unregistered) last."""
    ensemble = metadata.ensembles[slot.fragment_index].bookies
    write_set = [ensemble[i] for i in metadata.schedule.write_set(entry_id)
                 if i != slot.position]
    return [b for b in write_set if b not in avoid] + [b for b in write_set if b in avoid]


def placement_label(metadata: LedgerMetadata) -> str | None:
    """The bookie label naming the failure domain of the ledger's placement policy
    (None for random placement)."""
    return RACK_LABELS[known_placement(metadata.placement)]


def replacement_for(metadata: LedgerMetadata, slot: Slot, candidates: Sequence[BookieCandidate],
                    rng: random.Random, *, min_racks: int) -> str:
    """A writable bookie outside the slot's fragment, chosen by the ledger's own
    placement policy: for rack/zone-aware ledgers (``candidates`` labelled with
    :func:`placement_label`) one that keeps every write set of the fragment over
    ``min_racks`` failure domains when any does, as ensemble creation and
    ensemble changes choose."""
    fragment = metadata.ensembles[slot.fragment_index].bookies
    aware = placement_label(metadata) is not None
    return choose_replacement(candidates, fragment, slot.position, rng,
                              write_quorum=metadata.write_quorum,
                              min_racks=min_racks if aware else 1)


def misplaced_bookies(metadata: LedgerMetadata, candidates: Sequence[BookieCandidate], *,
                      min_racks: int) -> set[str]:
    """Bookies of a rack/zone-aware ledger to move elsewhere: in a fragment whose
    write sets do not all span ``min_racks`` failure domains (``candidates``
    labelled with :func:`placement_label`), the last position whose move to one
    writable candidate outside the fragment would make them all do so. Nothing
    when no single move can (too few racks registered), or a bookie of the
    fragment is not registered (its rack is unknown: the lost-bookie path)."""
    if placement_label(metadata) is None:
        return set()
    racks = {c.address: c.rack for c in candidates}
    quorum = metadata.write_quorum
    out: set[str] = set()
    for fragment in metadata.ensembles:
        if any(b not in racks for b in fragment.bookies):
            continue
        current = [racks[b] for b in fragment.bookies]
        if write_sets_spread(current, quorum, min_racks):
            continue
        pool = {c.rack for c in candidates if c.writable and c.address not in fragment.bookies}
        for position in reversed(range(len(current))):
            if any(write_sets_spread([*current[:position], rack, *current[position + 1:]],
                                     quorum, min_racks) for rack in sorted(pool)):
                out.add(fragment.bookies[position])
                break
    return out
