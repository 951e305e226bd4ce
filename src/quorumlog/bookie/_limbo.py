"""Limbo: what a re-added bookie says about entries it may have lost.

A bookie whose disks were wiped comes back, after ``quorumlog bookie format``,
as a new instance under its old id - and its old id is what ledger metadata
names in ensembles. Entries the old instance acknowledged are gone from it. If
it answered "no such entry" for them, ledger recovery would count that answer
towards Qf and could close a ledger before an acknowledged entry (BookKeeper
issue #2908): a recoverable loss would become silent truncation.

So ``format`` records a *limbo floor* in meta (``/bookies/limbo/<id>``): the
next ledger id at the time of the format. Every ledger with a smaller id may
have had entries on the old instance. For those ledgers the new instance never
gives a negative answer: a read of an entry (or a ledger) it does not hold
answers :class:`EntryInLimboError`, which clients count as "unknown" - never as
"no such entry" (BookKeeper's BP-44 "limbo" state). Ledgers created after the
format (ids at or above the floor) could not have named the old instance, and
are answered normally.

The rule (``limbo_error``) is pure and shared by the bookie server and the
simulator. Clearing limbo is the job of re-replication (auto-recovery, a later
part): until then the re-added bookie simply never vouches for old ledgers.
"""

from __future__ import annotations

import msgspec

from quorumlog.proto import BOOKIE_LIMBO_PREFIX, EntryInLimboError


class LimboRecord(msgspec.Struct, frozen=True, kw_only=True):
    """Meta's record of a re-added bookie (``/bookies/limbo/<id>``)."""

    bookie_id: str
    ledger_id_floor: int  # ledgers with smaller ids may have had entries on a wiped instance
    formatted_at_ms: int  # wall clock, Unix epoch
    previous_instance_id: str = ""  # "" when meta had no cookie for it

    def encode(self) -> bytes:
        return msgspec.json.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> LimboRecord:
        return msgspec.json.decode(data, type=cls)


def limbo_key(bookie_id: str) -> str:
    """The meta key of a bookie's limbo record (persistent)."""
    return f"{BOOKIE_LIMBO_PREFIX}{bookie_id}"


def in_limbo(ledger_id: int, ledger_id_floor: int) -> bool:
    """Whether a wiped earlier instance may have held entries of ``ledger_id``."""
    return ledger_id < ledger_id_floor


def limbo_error(bookie_id: str, ledger_id: int, entry_id: int,
                ledger_id_floor: int) -> EntryInLimboError | None:
    """The answer for an entry this bookie does not hold: None -> "no such entry"
    may be said; an error -> say this instead (the entry may have been lost)."""
    if not in_limbo(ledger_id, ledger_id_floor):
        return None
    return EntryInLimboError(
        f"bookie {bookie_id} does not hold entry {ledger_id}:{entry_id}, but it was re-added "
        f"after losing its data and ledger {ledger_id} is older than that "
        f"(ledger ids below {ledger_id_floor}): the entry may have been lost with the old "
        "disks, so this is not a 'no such entry'; read another replica")
