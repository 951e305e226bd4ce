"""Quorum math of the BookKeeper ledger protocol, as tiny pure objects.

Everything here is deterministic and I/O free so it can be tested exhaustively
and driven by the simulator:

* :class:`Schedule` — ensemble size E, write quorum Qw, ack quorum Qa; entry
  ``i`` goes to the Qw bookies starting at ensemble index ``i mod E``
  (striping); ``fence_quorum`` is Qf = Qw - Qa + 1.
* :class:`AckSet` — acks for one entry: "complete and check" / "fail and
  check", after BookKeeper's ``AckSet``.
* :class:`CoverageSet` — fencing (and LAC reads during recovery) succeed once
  every write set has at least Qf responses: then no writer can gather Qa acks
  for any entry on the fenced ensemble.
* :class:`RecoveryRead` — the decision for one entry during recovery: found on
  any bookie → recoverable; Qf explicit "no such entry" answers in its write
  set → not recoverable, stop; "unknown" answers (timeouts, errors) never count
  as "no such entry".
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

from quorumlog.errors import UsageError, invariant


class Schedule:
    """The striping schedule of one ledger fragment (E, Qw, Qa)."""

    __slots__ = ("ack_quorum", "ensemble_size", "write_quorum")

    def __init__(self, ensemble_size: int, write_quorum: int, ack_quorum: int) -> None:
        if not ensemble_size >= write_quorum >= ack_quorum >= 1:
            raise UsageError(
                f"need ensemble >= write_quorum >= ack_quorum >= 1, got "
                f"E={ensemble_size} Qw={write_quorum} Qa={ack_quorum}"
            )
        self.ensemble_size = ensemble_size
        self.write_quorum = write_quorum
        self.ack_quorum = ack_quorum

    @property
    def fence_quorum(self) -> int:
        """Qf: responses needed per write set so a writer cannot reach Qa."""
        return self.write_quorum - self.ack_quorum + 1

    def write_set(self, entry_id: int) -> tuple[int, ...]:
        """Ensemble indexes that store ``entry_id``, in write order."""
        invariant(entry_id >= 0, f"entry id {entry_id} must be >= 0")
        first = entry_id % self.ensemble_size
        return tuple((first + k) % self.ensemble_size for k in range(self.write_quorum))

    def stores(self, entry_id: int, bookie_index: int) -> bool:
        """Whether ensemble member ``bookie_index`` stores ``entry_id``."""
        offset = (bookie_index - entry_id) % self.ensemble_size
        return offset < self.write_quorum

    def ack_set(self) -> AckSet:
        return AckSet(self.ack_quorum)

    def coverage_set(self) -> CoverageSet:
        return CoverageSet(self)

    def __repr__(self) -> str:
        return f"Schedule(E={self.ensemble_size}, Qw={self.write_quorum}, Qa={self.ack_quorum})"


class AckSet:
    """Acks of one entry's write set; the entry is durable at Qa acks.

    The acked and failed bookies are bit masks over ensemble indexes, not
    sets: the write handle makes one AckSet per entry in flight, and two
    sets each were two more objects per entry for the garbage collector to
    track (ints are not tracked).
    """

    __slots__ = ("_ack_quorum", "_acked", "_failed")

    def __init__(self, ack_quorum: int) -> None:
        self._ack_quorum = ack_quorum
        self._acked = 0  # bit i: ensemble index i acked
        self._failed = 0  # bit i: ensemble index i failed

    def complete_and_check(self, bookie_index: int) -> bool:
        """Record an ack; True once Qa distinct bookies acked."""
        bit = 1 << bookie_index  # a negative index raises ValueError
        self._failed &= ~bit
        self._acked |= bit
        return self._acked.bit_count() >= self._ack_quorum

    def fail_and_check(self, bookie_index: int) -> bool:
        """Record a failure; True if the entry had already reached Qa acks.

        An ack recorded earlier from the same bookie is withdrawn: its replica
        is being replaced, so the entry must be resent to the new member.
        """
        bit = 1 << bookie_index  # a negative index raises ValueError
        self._acked &= ~bit
        self._failed |= bit
        return self._acked.bit_count() >= self._ack_quorum

    def remove(self, bookie_index: int) -> None:
        """Forget a bookie (replaced by an ensemble change)."""
        bit = 1 << bookie_index  # a negative index raises ValueError
        self._acked &= ~bit
        self._failed &= ~bit

    @property
    def complete(self) -> bool:
        return self._acked.bit_count() >= self._ack_quorum

    @property
    def acked(self) -> frozenset[int]:
        return _indexes(self._acked)

    @property
    def failed(self) -> frozenset[int]:
        return _indexes(self._failed)


def _indexes(mask: int) -> frozenset[int]:
    """The ensemble indexes whose bits are set in ``mask``."""
    return frozenset(i for i in range(mask.bit_length()) if mask >> i & 1)


class CoverageSet:
    """Tracks fence/LAC-read responses until every write set has Qf of them."""

    __slots__ = ("_responded", "_schedule")

    def __init__(self, schedule: Schedule) -> None:
        self._schedule = schedule
        self._responded: set[int] = set()

    def add(self, bookie_index: int) -> bool:
        """Record a successful response; True once the ensemble is covered."""
        invariant(
            0 <= bookie_index < self._schedule.ensemble_size,
            f"bookie index {bookie_index} outside ensemble of {self._schedule.ensemble_size}",
        )
        self._responded.add(bookie_index)
        return self.covered

    @property
    def covered(self) -> bool:
        s = self._schedule
        qf = s.fence_quorum
        # Write sets are the E rotations; each needs >= Qf responders.
        for first in range(s.ensemble_size):
            members = ((first + k) % s.ensemble_size for k in range(s.write_quorum))
            if sum(1 for m in members if m in self._responded) < qf:
                return False
        return True


class ReadAnswer(enum.Enum):
    FOUND = "found"
    NO_SUCH_ENTRY = "no_such_entry"
    UNKNOWN = "unknown"  # timeout, connection error, bookie error: proves nothing


class RecoveryVerdict(enum.Enum):
    PENDING = "pending"  # ask more bookies / wait for answers
    RECOVERABLE = "recoverable"  # found somewhere: rewrite it to its whole write set
    END_OF_LEDGER = "end_of_ledger"  # Qf explicit "no such entry": stop here
    UNDECIDABLE = "undecidable"  # all answered, neither rule fired: recovery fails, retry


class RecoveryRead:
    """Decision for one entry read during recovery (pure)."""

    __slots__ = ("_answers", "_fence_quorum", "_write_set")

    def __init__(self, schedule: Schedule, entry_id: int) -> None:
        self._write_set = frozenset(schedule.write_set(entry_id))
        self._fence_quorum = schedule.fence_quorum
        self._answers: dict[int, ReadAnswer] = {}

    def record(self, bookie_index: int, answer: ReadAnswer) -> RecoveryVerdict:
        invariant(
            bookie_index in self._write_set,
            f"bookie index {bookie_index} is not in the write set {sorted(self._write_set)}",
        )
        # A FOUND answer is final for this bookie; later answers do not undo it.
        if self._answers.get(bookie_index) is not ReadAnswer.FOUND:
            self._answers[bookie_index] = answer
        return self.verdict

    @property
    def verdict(self) -> RecoveryVerdict:
        answers = self._answers.values()
        if any(a is ReadAnswer.FOUND for a in answers):
            return RecoveryVerdict.RECOVERABLE
        missing = sum(1 for a in answers if a is ReadAnswer.NO_SUCH_ENTRY)
        if missing >= self._fence_quorum:
            return RecoveryVerdict.END_OF_LEDGER
        if len(self._answers) == len(self._write_set):
            return RecoveryVerdict.UNDECIDABLE
        return RecoveryVerdict.PENDING

    def unasked(self) -> list[int]:
        return sorted(self._write_set - self._answers.keys())


class LacTracker:
    """Advances the last-add-confirmed in order as entries reach Qa.

    ``confirm(entry_id)`` marks one entry durable; the LAC moves over every
    contiguous confirmed entry. Entries confirmed out of order wait in a set
    bounded by the number of outstanding adds the caller allows.
    """

    __slots__ = ("_confirmed", "_lac")

    def __init__(self, lac: int = -1) -> None:
        self._lac = lac
        self._confirmed: set[int] = set()

    @property
    def lac(self) -> int:
        return self._lac

    def confirm(self, entry_id: int) -> list[int]:
        """Record ``entry_id`` as durable; return entries newly covered by the LAC."""
        if entry_id <= self._lac:
            return []
        self._confirmed.add(entry_id)
        advanced: list[int] = []
        while self._lac + 1 in self._confirmed:
            self._lac += 1
            self._confirmed.remove(self._lac)
            advanced.append(self._lac)
        return advanced

    def pending(self) -> Iterable[int]:
        return iter(sorted(self._confirmed))
