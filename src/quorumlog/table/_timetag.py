"""Timetags: the version every table value carries (Pegasus hot backup).

``timetag = timestamp_us << 8 | cluster_id << 1 | delete_flag``: 56 bits of
microseconds since the Unix epoch (enough until the year 4253), the 7-bit id
of the cluster that accepted the write (1..127), and whether the write was a
delete. Comparing two timetags as integers orders writes by time, then by
cluster id: the last-writer-wins rule of cross-cluster duplication. Within one
cluster the partition's leader stamps its writes with a timestamp that never
goes backwards (:class:`TimetagClock`), so later writes always win.
"""

from __future__ import annotations

from dataclasses import dataclass

from quorumlog.errors import UsageError

CLUSTER_ID_MIN = 1
CLUSTER_ID_MAX = 127
TIMESTAMP_US_MAX = (1 << 56) - 1
_CLUSTER_SHIFT = 1
_TIMESTAMP_SHIFT = 8


def check_cluster_id(cluster_id: int) -> int:
    if not CLUSTER_ID_MIN <= cluster_id <= CLUSTER_ID_MAX:
        raise UsageError(f"cluster_id {cluster_id} out of range {CLUSTER_ID_MIN}.."
                         f"{CLUSTER_ID_MAX} (7 bits of the timetag)")
    return cluster_id


def make_timetag(timestamp_us: int, cluster_id: int, *, deleted: bool = False) -> int:
    if not 0 <= timestamp_us <= TIMESTAMP_US_MAX:
        raise UsageError(f"timestamp_us {timestamp_us} does not fit the timetag's 56 bits")
    check_cluster_id(cluster_id)
    return (timestamp_us << _TIMESTAMP_SHIFT) | (cluster_id << _CLUSTER_SHIFT) | int(deleted)


@dataclass(frozen=True, slots=True)
class Timetag:
    timestamp_us: int
    cluster_id: int
    deleted: bool

    @classmethod
    def parse(cls, timetag: int) -> Timetag:
        return cls(timestamp_us=timetag >> _TIMESTAMP_SHIFT,
                   cluster_id=(timetag >> _CLUSTER_SHIFT) & CLUSTER_ID_MAX,
                   deleted=bool(timetag & 1))


class TimetagClock:
    """Timestamps for one partition leader's writes: the wall clock in
    microseconds, but never before (or equal to) the last one it gave.

    A new leader starts from the largest timestamp it has applied
    (:meth:`observe`), so a leader whose clock is behind its predecessor's still
    gives later writes larger timetags.
    """

    __slots__ = ("_last_us",)

    def __init__(self) -> None:
        self._last_us = 0

    def observe(self, timestamp_us: int) -> None:
        self._last_us = max(self._last_us, timestamp_us)

    def next(self, wall_us: int) -> int:
        self._last_us = max(wall_us, self._last_us + 1)
        return self._last_us
