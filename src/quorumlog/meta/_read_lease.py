"""The leader lease of meta's ``lease`` read mode (Raft dissertation, 6.4.1).

A linearizable read needs the leader to know it is still the leader. ReadIndex
asks a quorum every time (one heartbeat round per read batch). A lease
remembers the answer for a while: when a heartbeat round that the leader
*started* at time ``start`` is acknowledged by a quorum, no other leader can
be elected before ``start + lease``, because every follower of that quorum
reset its election timer after ``start`` and refuses votes (and pre-votes)
for ``election_timeout_ticks`` after hearing from a leader (check-quorum), and
every new leader needs one of them. So until then the leader may serve reads
from its own state at its commit index, without a round trip.

A lease belongs to one *leadership*, the pair (term, epoch): a new term is
a new leader, and the Raft epoch also moves with every configuration change,
after which the quorum that granted the lease may no longer intersect every
quorum of the group. Either change ends the lease; the next ReadIndex round
grants a new one.

The follower's refusal lasts ``election_timeout_ticks`` of *its* ticks, the
first of which may come at once: at least ``(election_timeout_ticks - 1) *
tick_interval_ms`` of its clock. The leader measures the lease on its own
clock, so the lease is that time divided by the clock drift bound
(``1 + lease_clock_drift_percent / 100``): safe as long as no clock runs
faster than another by more than that. The leader's clock is the boot-time
clock (it keeps counting while the process is stopped or the machine
sleeps), so a paused leader wakes up with an expired lease.

Nothing here reads a clock: times are passed in (seconds, one clock).
"""

from __future__ import annotations

from quorumlog.errors import invariant

Leadership = tuple[int, int]  # (term, epoch) of the leader holding the lease
PERCENT = 100


def lease_duration_s(
    *, election_timeout_ticks: int, tick_interval_ms: int, clock_drift_percent: int
) -> float:
    """How long after a quorum-confirmed start no other leader can exist."""
    invariant(election_timeout_ticks >= 2, "a lease needs election_timeout_ticks >= 2")
    invariant(0 <= clock_drift_percent < PERCENT, "clock drift must be in [0, 100) percent")
    follower_guard_ms = (election_timeout_ticks - 1) * tick_interval_ms
    return follower_guard_ms / 1000 * PERCENT / (PERCENT + clock_drift_percent)


class ReadLease:
    """The current lease: valid for one leadership, until a point in time."""

    def __init__(self, duration_s: float) -> None:
        invariant(duration_s > 0, "a lease must last some time")
        self.duration_s = duration_s
        self._leadership: Leadership = (0, 0)
        self._until_s = 0.0

    def extend(self, *, start_s: float, leadership: Leadership) -> None:
        """A quorum acknowledged ``leadership`` as of ``start_s``."""
        if leadership != self._leadership:
            self._leadership, self._until_s = leadership, 0.0
        self._until_s = max(self._until_s, start_s + self.duration_s)

    def remaining_s(self, *, now_s: float, leadership: Leadership) -> float:
        """Time left (0 when expired or granted to another leadership)."""
        if leadership != self._leadership:
            return 0.0
        return max(0.0, self._until_s - now_s)

    def valid(self, *, now_s: float, leadership: Leadership) -> bool:
        return self.remaining_s(now_s=now_s, leadership=leadership) > 0

    def drop(self) -> None:
        self._until_s = 0.0
