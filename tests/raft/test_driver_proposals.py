"""The driver matches a proposal to its result by log position (term, index).

Proposal ids counted from ``node_id << 48`` in every process repeated after a
restart: a leader restarted with uncommitted proposals of its own and elected
again resolved its new proposals with the results of the old entries.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from quorumlog.errors import NotLeaderError, QuorumlogError, UsageError
from quorumlog.raft import Entry, EntryType, ProposalDroppedError, Role
from quorumlog.raft._driver import HostConfig, Proposal, ProposalWaiters

from .driver_support import GROUP, Member, run_cluster, wait_leader, wait_until

UNCOMMITTED = 20
# A leader cut off from its followers keeps leading for one election timeout
# (check-quorum): 50 ticks of 20 ms leave a second to append the proposals.
CONFIG = HostConfig(tick_interval_ms=20, election_timeout_ticks=50)


def test_restarted_leader_answers_each_client_with_its_own_result(tmp_path: Path) -> None:
    run_cluster(tmp_path, _restart_with_uncommitted_proposals, config=CONFIG)


async def _restart_with_uncommitted_proposals(members: list[Member]) -> None:
    leader = await wait_leader(members)
    assert leader.host is not None
    await leader.host.propose(GROUP, b"first")
    followers = [m for m in members if m is not leader]
    await asyncio.gather(*(f.stop() for f in followers))
    # Proposals the leader appends but cannot commit: no follower hears them.
    host = leader.host
    old = [asyncio.ensure_future(host.propose(GROUP, b"old-%d" % i, timeout_s=30))
           for i in range(UNCOMMITTED)]
    group = host.group(GROUP)
    last = group.storage.last_index()
    await wait_until(lambda: group.storage.last_index() >= last + UNCOMMITTED,
                     what="proposals appended and persisted")
    assert group.node.commit_index < group.node.last_index
    await leader.stop()
    outcomes = await asyncio.gather(*old, return_exceptions=True)
    assert all(isinstance(o, QuorumlogError) and o.retriable for o in outcomes), outcomes

    # The leader comes back with one follower: only it can win (its log is
    # longer), and its first act as leader is to propose again. Its old
    # entries commit with its new term's first entry, after the new proposals
    # are already waiting.
    new: list[asyncio.Future[object]] = []

    def on_role_change(group_id: int, role: Role, leader_id: int) -> None:
        if role is Role.LEADER and not new:
            assert leader.host is not None
            new.extend(asyncio.ensure_future(leader.host.propose(GROUP, b"new-%d" % i))
                       for i in range(UNCOMMITTED))

    await leader.start(None, on_role_change)
    await followers[0].start(None)
    await wait_until(lambda: len(new) == UNCOMMITTED, timeout_s=30, what="re-election")
    results = await asyncio.gather(*new)
    assert results == [b"new-%d" % i for i in range(UNCOMMITTED)]
    want = [b"first"] + [b"old-%d" % i for i in range(UNCOMMITTED)] + list(results)
    await wait_until(lambda: followers[0].machine.items == want, what="the follower applied all")
    assert leader.machine.items == want


def _waiters() -> tuple[ProposalWaiters, asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    return ProposalWaiters(GROUP), loop


def test_an_entry_of_another_term_at_the_index_fails_the_proposal_retriably() -> None:
    waiters, loop = _waiters()
    try:
        unknown = NotLeaderError("outcome unknown")
        mine = Proposal(loop.create_future(), term=3, index=10)
        other = Proposal(loop.create_future(), term=3, index=11)
        waiters.add(mine, unknown)
        waiters.add(other, unknown)
        # A later leader's entry at index 10: proposal 10 never applies.
        assert waiters.take(Entry(4, 10, EntryType.NORMAL, b"theirs")) is None
        error = mine.future.exception()
        assert isinstance(error, ProposalDroppedError) and error.retriable
        assert "replaced" in error.message
        # The entry of the proposal's own term at its index is the proposal.
        assert waiters.take(Entry(3, 11, EntryType.NORMAL, b"mine")) is other
        assert not other.future.done() and len(waiters) == 0
    finally:
        loop.close()


def test_a_snapshot_past_waiting_proposals_fails_them_as_unknown() -> None:
    waiters, loop = _waiters()
    try:
        unknown = NotLeaderError("outcome unknown")
        proposals = [Proposal(loop.create_future(), term=2, index=i) for i in (5, 6, 9)]
        for proposal in proposals:
            waiters.add(proposal, unknown)
        waiters.fail_up_to(6, unknown)
        assert [p.future.done() for p in proposals] == [True, True, False]
        assert proposals[0].future.exception() is unknown
        waiters.discard(proposals[2])
        assert len(waiters) == 0
    finally:
        loop.close()


def test_empty_proposals_are_refused(tmp_path: Path) -> None:
    async def body(members: list[Member]) -> None:
        leader = await wait_leader(members)
        assert leader.host is not None
        with pytest.raises(UsageError, match="non-empty"):
            await leader.host.propose(GROUP, b"")
        assert await leader.host.propose(GROUP, b"x") == b"x"

    run_cluster(tmp_path, body, config=HostConfig(tick_interval_ms=20), node_ids=(1,),
                voters=(1,))
