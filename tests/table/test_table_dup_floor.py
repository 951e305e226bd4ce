"""The log floor every replica computes for its table's duplications
(``DupManager.compaction_floor``): don't compact while unknown, never past the
smallest confirmed_decree of the active duplications, free once removed."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from quorumlog.table import DupProgress, DupRecord, DupState, TableStore
from quorumlog.table._dup_shipper import DupManager, DupSettings, HostedPartition

GROUP = 1 << 48 | 1 << 20 | 3
SETTINGS = DupSettings(block_entries_max=10, block_bytes_max=1 << 20, hash_keys_in_flight_max=4,
                       refresh_interval_ms=100, progress_interval_ms=0, idle_poll_ms=10,
                       remote_deadline_s=1.0, cluster_id=1)


def test_floor_rules(tmp_path: Path) -> None:
    store = TableStore(tmp_path / "s", cluster_id=1)
    hosted = [HostedPartition("t", 3, GROUP, store)]
    manager = DupManager(1, cast(Any, None), cast(Any, None), clusters={}, settings=SETTINGS,
                         hosted=lambda: hosted)
    assert manager.compaction_floor(GROUP + 1) is None  # not a replica of a table here
    assert manager.compaction_floor(GROUP) == 0  # nothing read from meta yet: keep the log
    manager.set_dups({})
    assert manager.compaction_floor(GROUP) is None  # no duplication: no bound
    one = DupRecord(dup_id=1, remote="b", state=DupState.LOG)
    two = DupRecord(dup_id=2, remote="c", state=DupState.PAUSE)
    manager.set_dups({"t": [one, two]})
    assert manager.compaction_floor(GROUP) == 0  # confirmed decrees not read yet
    manager._known = True
    assert manager.compaction_floor(GROUP) == 0  # no start recorded for partition 3 yet
    manager.progress = {("t", 1, 3): DupProgress(confirmed_decree=50),
                        ("t", 2, 3): DupProgress(confirmed_decree=20),
                        ("t", 2, 4): DupProgress(confirmed_decree=1)}
    assert manager.compaction_floor(GROUP) == 20  # a paused duplication holds the log too
    manager.set_dups({"t": [one, DupRecord(dup_id=2, remote="c", state=DupState.REMOVED)]})
    assert manager.compaction_floor(GROUP) == 50  # removal releases its floor
    manager.set_dups({"t": []})
    assert manager.compaction_floor(GROUP) is None
    store.close()
