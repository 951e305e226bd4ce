"""The log tail rules (``raft._log_tail``), pure: what a snapshot keeps after the
compaction floor, read from the Raft log and the current snapshot's tail."""

from __future__ import annotations

import functools

import pytest

from quorumlog.raft import (
    CompactedError,
    ConfState,
    Entry,
    MemoryStorage,
    Snapshot,
    SnapshotMeta,
    first_retained_index,
    retained_from,
    snapshot_tail,
)

TAIL_BYTES_MAX = 1 << 20


def _installed(snapshot_index: int, last: int) -> MemoryStorage:
    """A replica that installed a snapshot at ``snapshot_index`` and then appended up
    to ``last``."""
    log = MemoryStorage(ConfState(voters=frozenset({1, 2, 3})))
    log.apply_snapshot(Snapshot(meta=SnapshotMeta(
        index=snapshot_index, term=2, conf_state=ConfState(voters=frozenset({1, 2, 3})),
        epoch=1)))
    log.append([Entry(term=2, index=i) for i in range(snapshot_index + 1, last + 1)])
    return log


def test_a_floor_below_what_is_retained_keeps_what_is_retained() -> None:
    """Found by the table simulator's dup mix (seed 775620660968): a replica installed
    a snapshot at 37 whose tail held 36..37; its floor, a heartbeat behind, was 34.
    Its next snapshot (at 45) kept no tail at all, losing entry 37, which the shipper
    had not confirmed (confirmed_decree 36)."""
    log = _installed(37, 45)
    tail = [Entry(term=2, index=36), Entry(term=2, index=37)]
    read = functools.partial(retained_from, log, tail, group_id=7)
    assert first_retained_index(log, tail) == 36
    with pytest.raises(CompactedError):  # the rule before the fix
        snapshot_tail(read, 34, 45, TAIL_BYTES_MAX)
    kept = snapshot_tail(read, 34, 45, TAIL_BYTES_MAX,
                         first_retained=first_retained_index(log, tail))
    assert kept is not None and [e.index for e in kept] == list(range(36, 46))
    # A floor inside what is retained keeps exactly (floor, index].
    kept = snapshot_tail(read, 40, 45, TAIL_BYTES_MAX, first_retained=36)
    assert kept is not None and [e.index for e in kept] == list(range(41, 46))


def test_a_tail_that_does_not_reach_the_log_is_not_retained() -> None:
    log = _installed(37, 45)
    assert first_retained_index(log, [Entry(term=2, index=30)]) == 38
    assert first_retained_index(log, []) == 38
