"""The driver's put path: what a proposal waits for, and in which order.

- The leader's AppendEntries are in the sockets before its own fdatasync (a
  small pass syncs on the loop thread: before, the frames went out only when
  the loop turned after the sync, so leader and followers synced one after the
  other instead of at the same time).
- ``propose_nowait``: the future of a proposal, with deadlines.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
from pathlib import Path
from typing import Any

import pytest

from quorumlog.errors import DeadlineExceededError
from quorumlog.raft._driver import HostConfig

from .driver_support import GROUP, Member, run_cluster, wait_leader

# As the metadata service runs: one group per host, its own WAL synced (no host journal).
CONFIG = HostConfig(tick_interval_ms=20, election_timeout_ticks=10, inline_sync_entries_max=64,
                    shared_journal=False)


def _queued_bytes(members: list[Member], fd: int) -> int | None:
    """Frames queued in user space (not yet handed to a socket) by the host
    whose WAL ``fd`` is; None if no host's is. (The hosts share this process:
    another host's signs of life, queued until the loop turns, are not the
    syncing host's.)"""
    for member in members:
        host = member.host
        if host is not None and host.group(GROUP).storage._wal._writer.fd == fd:
            return sum(connection._protocol._out_bytes
                       for connection in host._pool._connections.values())
    return None


def test_the_leaders_append_entries_leave_before_its_own_fdatasync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop_thread = threading.get_ident()
    queued_at_sync: list[int] = []
    real = os.fdatasync

    async def body(members: list[Member]) -> None:
        leader = await wait_leader(members)
        assert leader.host is not None
        await leader.host.propose(GROUP, b"warm-up", timeout_s=10)  # connections open

        def recording_fdatasync(fd: int) -> None:
            if threading.get_ident() == loop_thread:  # inline syncs: the loop is blocked
                queued = _queued_bytes(members, fd)
                if queued is not None:
                    queued_at_sync.append(queued)
            real(fd)

        monkeypatch.setattr(os, "fdatasync", recording_fdatasync)
        try:
            for i in range(20):
                assert await leader.host.propose(GROUP, b"p%d" % i, timeout_s=10) == b"p%d" % i
        finally:
            monkeypatch.setattr(os, "fdatasync", real)

    run_cluster(tmp_path, body, config=CONFIG)
    assert len(queued_at_sync) >= 20, queued_at_sync  # leader's and followers' passes
    assert queued_at_sync == [0] * len(queued_at_sync), queued_at_sync


def test_propose_nowait_resolves_and_expires_proposals_by_their_deadline(tmp_path: Path) -> None:
    config = HostConfig(tick_interval_ms=20, election_timeout_ticks=10, proposal_timeout_ms=300)

    async def body(members: list[Member]) -> None:
        leader = await wait_leader(members)
        assert leader.host is not None
        host = leader.host
        assert await host.propose_nowait(GROUP, b"a") == b"a"
        # Cut the leader off (its followers stop): nothing commits any more.
        for member in members:
            if member is not leader:
                await member.stop()
        loop = asyncio.get_running_loop()
        started = loop.time()
        default = host.propose_nowait(GROUP, b"default deadline")   # the ticker's queue
        explicit = host.propose_nowait(GROUP, b"own deadline", timeout_s=0.1)  # a timer
        with pytest.raises(DeadlineExceededError, match="not applied within the deadline"):
            await explicit
        assert loop.time() - started < 0.3
        assert not default.done()
        with pytest.raises(DeadlineExceededError, match="not applied within the deadline"):
            await default
        # One tick of slack at most past proposal_timeout_ms.
        assert 0.3 <= loop.time() - started < 0.3 + 0.2
        assert len(host.group(GROUP).proposals) == 0  # the expired ones are forgotten
        assert not host._proposal_deadlines

    run_cluster(tmp_path, body, config=config)


def test_answers_of_committed_entries_do_not_wait_for_the_next_batchs_fdatasync(
    tmp_path: Path,
) -> None:
    """Under load a leader's pass has entries that became committed and new
    ones to write: the committed ones (durable here since an earlier pass) are
    applied and answered before the new ones' fdatasync, never past what this
    member has persisted."""
    config = HostConfig(tick_interval_ms=20, election_timeout_ticks=10,
                        inline_sync_entries_max=0)  # every syncing pass on the I/O thread
    early: list[tuple[int, int, int]] = []  # (applied index, persisted last, first new)

    async def body(members: list[Member]) -> None:
        leader = await wait_leader(members)
        host = leader.host
        assert host is not None
        real = host._apply_durable

        def recording(group: Any, ready: Any) -> bool:
            before = group.applied_index
            persisted = group.storage.last_index()
            first_new = ready.entries[0].index if ready.entries else persisted + 1
            answered: bool = real(group, ready)
            if group.applied_index > before:
                early.append((group.applied_index, persisted, first_new))
            return answered

        host._apply_durable = recording  # type: ignore[method-assign]

        async def worker(n: int) -> None:
            # Closed loop, each worker at its own pace (not waiting for state):
            # in lockstep every answer comes in one pass and every proposal in
            # the next, and no pass would carry both.
            pace = random.Random(n)
            for i in range(200):
                if len(early) >= 3:
                    return
                data = b"%d-%d" % (n, i)
                assert await host.propose(GROUP, data, timeout_s=10) == data
                await asyncio.sleep(pace.random() * 0.002)

        await asyncio.gather(*(worker(n) for n in range(32)))

    run_cluster(tmp_path, body, config=config)
    assert early, "no pass applied committed entries before writing new ones"
    assert all(applied <= persisted and applied < first_new
               for applied, persisted, first_new in early), early

