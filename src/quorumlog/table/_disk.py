"""Writes refused before the data disk fills (Pegasus's ``ERR_DISK_INSUFFICIENT``).

A write that fails for want of space fails the node (the WALs and RocksDB
cannot go on after a failed write, as etcd's cannot): if every replica's disk
fills together, as they do holding the same data, the whole table stops.
So a partition leader refuses writes once its data disk is used past
``[table] disk_usage_threshold_fraction`` (0.95, BookKeeper's bookie
threshold) with :class:`DiskInsufficientError`, until the use falls below
``disk_usage_lwm_fraction`` (0.90) again. Reads go on, and so do deletes:
they are how a user frees space. The disk is looked at (``statvfs``) at most
every ``disk_check_interval_ms`` on the write path, so a burst can still
overshoot the threshold by what that many milliseconds of writes take.

Only the leader's own disk is checked: a follower whose disk fills alone
(a smaller disk) fails and the partition goes on with the others, which the
scheduler then replaces.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

from quorumlog.log import get_logger

_log = get_logger(__name__)


class DiskGuard:
    """Whether writes are refused for the disk of ``directory``."""

    def __init__(self, directory: Path, *, threshold_fraction: float, lwm_fraction: float,
                 interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._directory = directory
        self._threshold = threshold_fraction
        self._lwm = lwm_fraction
        self._interval_s = interval_s
        self._clock = clock
        self._checked_at = -float("inf")
        self.full = False
        self.usage = 0.0

    def check(self) -> bool:
        """True while writes are refused (the disk is looked at again when the
        last look is older than the interval)."""
        now = self._clock()
        if now - self._checked_at >= self._interval_s:
            self._checked_at = now
            self._look()
        return self.full

    def _look(self) -> None:
        try:
            usage = shutil.disk_usage(self._directory)
        except OSError:
            return  # keep the last verdict: a failing stat says nothing about space
        self.usage = usage.used / usage.total if usage.total else 0.0
        if not self.full and self.usage >= self._threshold:
            self.full = True
            _log.warning("table_disk_full", directory=str(self._directory),
                         usage=round(self.usage, 4), threshold=self._threshold,
                         free_bytes=usage.free)
        elif self.full and self.usage < self._lwm:
            self.full = False
            _log.info("table_disk_ok", directory=str(self._directory),
                      usage=round(self.usage, 4), lwm=self._lwm, free_bytes=usage.free)

    def message(self) -> str:
        return (f"the data disk of this partition's leader is {self.usage:.1%} full, over "
                f"[table] disk_usage_threshold_fraction {self._threshold:.0%}: writes are "
                f"refused until it is below {self._lwm:.0%} (reads and deletes go on; free "
                "space or add disk)")
