"""RaftNode behaviours one at a time: persistence order, flow control, reads, limits."""

from __future__ import annotations

import random

import pytest

from quorumlog.raft import (
    ConfChange,
    ConfChangeSingle,
    ConfChangeType,
    ConfState,
    EntryType,
    MemoryStorage,
    Message,
    MessageType,
    ProposalDroppedError,
    RaftConfig,
    RaftNode,
    Role,
)
from quorumlog.raft._progress import ProgressState

from .network import Network

MT = MessageType


def test_vote_is_persisted_in_the_same_ready_as_the_answer() -> None:
    net = Network([1, 2, 3], seed=41, pre_vote=False)
    net.nodes[1].campaign()
    rd = net.nodes[1].ready()
    assert rd.hard_state is not None and rd.hard_state.vote == 1 and rd.must_sync
    net.nodes[1].advance(rd)
    vote = next(m for m in rd.messages if m.to == 2)
    net.nodes[2].step(vote)
    answer = net.nodes[2].ready()
    assert answer.hard_state is not None
    assert (answer.hard_state.term, answer.hard_state.vote) == (2, 1)
    assert answer.must_sync
    assert [m.type for m in answer.messages] == [MT.VOTE_RESP]


def test_commit_only_change_needs_no_sync() -> None:
    net = Network([1, 2, 3], seed=42)
    net.elect(1)
    net.nodes[1].propose(b"x")
    net.handle_ready(1)
    for m in list(net.queue):
        if m.to == 2:
            net.nodes[2].step(m)
    net.queue.clear()
    rd = net.nodes[2].ready()
    assert rd.entries and rd.must_sync
    net.storages[2].append(rd.entries)
    net.nodes[2].advance(rd)
    net.nodes[2].step(Message(type=MT.HEARTBEAT, to=2, from_=1, term=2, commit=3))
    rd = net.nodes[2].ready()
    assert rd.hard_state is not None and rd.hard_state.commit == 3 and not rd.must_sync


def test_single_node_group() -> None:
    storage = MemoryStorage(ConfState(voters=frozenset({1})))
    node = RaftNode(RaftConfig(node_id=1), storage, random.Random(1))
    node.campaign()
    assert node.role == Role.LEADER
    node.propose(b"a")
    node.read_index(b"r")
    rd = node.ready()
    assert [e.data for e in rd.committed_entries] == [b"", b"a"]
    assert [(r.index, r.context) for r in rd.read_states] == [(3, b"r")]
    assert not rd.messages


def test_uncommitted_budget_drops_proposals() -> None:
    net = Network([1, 2, 3], seed=43, max_uncommitted_entries_bytes=1000,
                  max_entry_data_bytes=1000)
    net.elect(1)
    net.isolate(1)
    net.nodes[1].propose(b"x" * 600)
    with pytest.raises(ProposalDroppedError, match="uncommitted") as info:
        net.nodes[1].propose(b"x" * 600)
    assert info.value.leader_hint == 1
    net.heal()
    net.tick(1)
    net.deliver()
    net.nodes[1].propose(b"x" * 600)  # the budget frees up as entries commit


def test_messages_are_batched_by_bytes_and_inflights_bounded() -> None:
    net = Network([1, 2, 3], seed=44, max_entries_per_message_bytes=1000,
                  max_inflight_messages=3)
    net.elect(1)
    leader = net.nodes[1]
    leader.propose_batch([b"y" * 400] * 20)
    rd = leader.ready()
    to_2 = [m for m in rd.messages if m.to == 2]
    assert [len(m.entries) for m in to_2] == [2, 2, 2]  # 3 inflight, 2 x 416 B per message
    assert leader.status()["progress"][2]["inflight_messages"] == 3
    leader.advance(rd)
    net.storages[1].append(rd.entries)
    net.queue.extend(rd.messages)
    net.deliver()
    assert net.nodes[2].commit_index == leader.last_index == 22


def test_probe_until_match_then_replicate() -> None:
    net = Network([1, 2, 3], seed=45)
    net.elect(1)
    progress = net.nodes[1].status()["progress"]
    assert progress[2]["state"] == "REPLICATE"
    net.nodes[1].report_unreachable(2)
    assert net.nodes[1].status()["progress"][2]["state"] == "PROBE"
    net.propose(1, b"a")
    assert net.nodes[1].status()["progress"][2]["state"] == "REPLICATE"
    net.nodes[2].report_unreachable(3)  # followers ignore it


def test_failed_snapshot_falls_back_to_probe() -> None:
    net = Network([1, 2, 3], seed=46)
    net.report_snapshots = False
    net.elect(1)
    net.isolate(3)
    net.propose(1, b"a")
    leader, storage = net.nodes[1], net.storages[1]
    storage.create_snapshot(leader.applied_index, leader.conf_state, b"s", leader.epoch)
    storage.compact(leader.applied_index)
    net.heal()
    net.tick(1)
    net.handle_ready(1)
    for m in list(net.queue):
        net.deliver_one(m) if m.type != MT.SNAP else None
    net.queue.clear()
    net.deliver()
    assert leader.status()["progress"][3]["state"] in ("SNAPSHOT", "REPLICATE")
    pr = leader._tracker.progress[3]
    pr.become_snapshot(3)
    leader.report_snapshot(3, False)
    assert pr.state == ProgressState.PROBE and pr.is_paused() and pr.pending_snapshot == 0


def test_read_index_waits_for_the_first_commit_of_the_term() -> None:
    net = Network([1, 2, 3], seed=47, pre_vote=False)
    leader = net.nodes[1]
    leader.campaign()
    net.handle_ready(1)
    while net.queue:
        m = net.queue.popleft()
        if m.type == MT.VOTE:
            net.deliver_one(m)
    for node_id in (2, 3):
        net.handle_ready(node_id)
    while net.queue:
        m = net.queue.popleft()
        if m.to == 1:
            net.deliver_one(m)
    assert leader.role == Role.LEADER and leader.commit_index == 1
    leader.read_index(b"early")
    assert leader.status()["pending_read_index"] == 1
    net.queue.clear()
    net.tick(1)
    net.deliver()
    reads = [line for line in net.transcript if "read_state" in line]
    assert reads == ["1: read_state index=2 ctx=early"]


def test_lease_based_reads_need_no_round_trip() -> None:
    net = Network([1, 2, 3], seed=48, read_only_mode="lease_based")
    net.elect(1)
    net.tick(1)  # one heartbeat round answered by a quorum: the lease holds
    net.deliver()
    net.nodes[1].read_index(b"fast")
    rd = net.nodes[1].ready()
    assert [(r.index, r.context) for r in rd.read_states] == [(2, b"fast")]
    assert not rd.messages


def test_a_leader_without_a_fresh_quorum_confirms_reads_instead_of_trusting_its_lease() -> None:
    """A deposed leader used to answer lease reads until its next check-quorum,
    up to two election timeouts after it lost its quorum, while the others
    had elected a new leader after one: a stale read with equal clocks."""
    for seed in range(5):
        net = Network([1, 2, 3], seed=seed, read_only_mode="lease_based",
                      election_timeout_ticks=10)
        net.elect(1)
        net.propose(1, b"v1")
        net.tick(1)
        net.deliver()
        net.isolate(1)
        new = None
        for _ in range(200):
            for node in net.nodes.values():
                node.tick()
            net.deliver()
            leaders = [i for i in (2, 3) if net.nodes[i].role == Role.LEADER]
            if leaders:
                new = leaders[0]
                break
        assert new is not None, f"seed {seed}: no new leader"
        net.propose(new, b"v2")
        committed = net.nodes[new].commit_index
        old = net.nodes[1]
        if old.role == Role.LEADER:
            old.read_index(b"r")
            stale = [r.index for r in old.ready().read_states if r.index < committed]
            assert not stale, (f"seed {seed}: deposed leader 1 served a lease read at "
                               f"{stale} while leader {new} committed {committed}")


def test_read_queue_is_bounded() -> None:
    net = Network([1, 2, 3], seed=49, max_pending_read_index_requests=2)
    net.elect(1)
    net.isolate(1)
    net.nodes[1].read_index(b"a")
    net.nodes[1].read_index(b"b")
    with pytest.raises(ProposalDroppedError, match="max_pending_read_index_requests"):
        net.nodes[1].read_index(b"c")


def test_removed_node_stops_campaigning() -> None:
    net = Network([1, 2, 3, 4], seed=50)
    net.elect(1)
    net.change(1, ConfChange(changes=(ConfChangeSingle(ConfChangeType.REMOVE_NODE, 4),)))
    removed = net.nodes[4]
    assert 4 not in removed.conf_state.voters
    net.isolate(4)
    removed.tick()
    for _ in range(100):
        removed.tick()
    assert removed.role == Role.FOLLOWER and not removed.ready().messages
    with pytest.raises(Exception, match="not a voter"):
        removed.campaign()


def test_joint_configuration_needs_both_majorities() -> None:
    net = Network([1, 2, 3], seed=51)
    net.elect(1)
    net.start(4)
    net.start(5)
    net.cut(1, 4)
    net.cut(1, 5)
    change = ConfChange(changes=(ConfChangeSingle(ConfChangeType.ADD_NODE, 4),
                                 ConfChangeSingle(ConfChangeType.ADD_NODE, 5),
                                 ConfChangeSingle(ConfChangeType.REMOVE_NODE, 3)))
    net.change(1, change)
    leader = net.nodes[1]
    assert leader.conf_state.voters_outgoing == {1, 2, 3}
    before = leader.commit_index
    net.propose(1, b"stuck")
    assert leader.commit_index == before  # the new half {1, 2, 4, 5} has only 1 and 2
    net.heal()
    net.tick(1)
    net.deliver()
    assert leader.conf_state.voters == {1, 2, 4, 5} and not leader.conf_state.voters_outgoing
    assert net.applied[5][-1] == b"stuck"


def test_learner_does_not_count_for_commit() -> None:
    net = Network([1, 2, 3], seed=52, voters=[1, 2], learners=[3])
    net.elect(1)
    net.cut(1, 2)
    net.propose(1, b"x")
    assert net.nodes[3].last_index == net.nodes[1].last_index
    assert net.nodes[1].commit_index < net.nodes[1].last_index


def test_status_is_plain_data() -> None:
    net = Network([1, 2, 3], seed=53)
    net.elect(1)
    status = net.nodes[1].status()
    assert status["role"] == "LEADER" and status["voters"] == [1, 2, 3]
    assert set(status["progress"]) == {1, 2, 3}
    assert "progress" not in net.nodes[2].status()


def test_forwarded_proposals_and_transfer_requests() -> None:
    net = Network([1, 2, 3], seed=54)
    net.elect(1)
    net.nodes[1].step(Message(type=MT.PROP, to=1, from_=2,
                              entries=(net.log_of(1)[0].__class__(0, 0, data=b"fwd"),)))
    net.deliver()
    assert net.applied[3][-1] == b"fwd"
    net.nodes[2].transfer_leader(3)  # a follower asks the leader
    net.deliver()
    assert net.leaders() == [3]


def test_illegal_role_transitions_fail_at_once() -> None:
    from quorumlog.errors import InvariantViolation

    net = Network([1, 2, 3], seed=55)
    follower = net.nodes[2]
    with pytest.raises(InvariantViolation, match="follower -> leader"):
        follower._become_leader()
    net.elect(1)
    leader = net.nodes[1]
    with pytest.raises(InvariantViolation, match="leader -> candidate"):
        leader._become_candidate()
    with pytest.raises(InvariantViolation, match="leader -> pre-candidate"):
        leader._become_pre_candidate()


def test_commit_waits_for_an_entry_of_the_current_term() -> None:
    """Raft paper figure 8: an old-term entry on a majority is not committed by counting."""
    net = Network([1, 2, 3], seed=56, check_quorum=False)
    net.elect(1)
    net.isolate(1)
    net.nodes[1].propose(b"old")  # index 3, term 2: only node 1 has it
    net.deliver()
    net.crash(1)
    net.restart(1)
    net.heal()
    net.nodes[1].campaign()
    net.handle_ready(1)
    # Win the election but lose every APP: then acknowledge only the old entry.
    while net.queue:
        m = net.queue.popleft()
        if m.type in (MT.PRE_VOTE, MT.VOTE, MT.PRE_VOTE_RESP, MT.VOTE_RESP):
            net.deliver_one(m)
        for node_id in (1, 2, 3):
            net.handle_ready(node_id)
    net.queue.clear()
    leader = net.nodes[1]
    assert leader.role == Role.LEADER and leader.term == 3 and leader.last_index == 4
    leader.step(Message(type=MT.APP_RESP, to=1, from_=2, term=3, index=3))
    assert leader.commit_index == 2  # index 3 is on a majority, but of term 2
    leader.step(Message(type=MT.APP_RESP, to=1, from_=2, term=3, index=4))
    assert leader.commit_index == 4  # the new term's entry commits, and 3 with it


def test_proposals_tell_the_position_they_were_appended_at() -> None:
    # The driver matches results to proposals by (term, index), as etcd's
    # applications do; the core says where each proposal went.
    net = Network([1, 2, 3], seed=45)
    net.elect(1)
    leader = net.nodes[1]
    term, index = leader.propose(b"a")
    assert (term, index) == (leader.term, leader.last_index)
    assert leader.propose_batch([b"b", b"c", b"d"]) == (term, index + 1)
    assert leader.last_index == index + 3
    change = ConfChange(changes=(ConfChangeSingle(type=ConfChangeType.ADD_LEARNER, node_id=4),))
    assert leader.propose_conf_change(change) == (term, index + 4)
    net.deliver()
    entries = net.storages[2].entries(index, index + 5, 1 << 20)
    assert [(e.term, e.index, e.type, e.data) for e in entries[:4]] == [
        (term, index + i, EntryType.NORMAL, data) for i, data in enumerate([b"a", b"b", b"c", b"d"])
    ]
    assert (entries[4].term, entries[4].index, entries[4].type) == (
        term, index + 4, EntryType.CONF_CHANGE)


def test_a_vote_request_of_an_older_term_is_rejected_with_our_term() -> None:
    """The candidate learns the newer term from the rejection (Raft paper, 5.1). The
    table simulator (seed 1227) found a group that never elected again without it:
    its only other live voter had missed the configuration changes, campaigned among
    members that were gone, and raised its term faster than the candidate learned it."""
    net = Network([1, 2, 3], seed=43, pre_vote=False)
    net.nodes[2].step(Message(type=MT.VOTE, to=2, from_=3, term=5, log_term=1, index=1))
    net.nodes[2].advance(net.nodes[2].ready())
    net.nodes[2].step(Message(type=MT.VOTE, to=2, from_=1, term=3, log_term=1, index=1))
    answer = net.nodes[2].ready()
    assert [(m.type, m.to, m.term, m.reject) for m in answer.messages] == [
        (MT.VOTE_RESP, 1, net.nodes[2].term, True)]
    assert net.nodes[2].term >= 5


@pytest.mark.parametrize("broadcast", [True, False])
def test_followers_learn_a_commit_at_once_or_with_the_next_message(broadcast: bool) -> None:
    """``broadcast_commit``: on (etcd's bcastAppend) an acknowledgement that
    commits sends every follower an AppendEntries with the new commit index;
    off, followers learn it from the next AppendEntries or heartbeat."""
    net = Network([1, 2, 3], broadcast_commit=broadcast)
    leader = net.tick_until_leader()
    net.deliver()
    followers = [i for i in (1, 2, 3) if i != leader]
    start = len(net.transcript)
    net.nodes[leader].propose(b"x")
    net.deliver()
    index = net.nodes[leader].commit_index
    assert net.nodes[leader].applied_index == index  # the leader commits either way
    appends = [line for line in net.transcript[start:] if f"{leader}->" in line
               and " APP " in f"{line} "]
    if broadcast:
        assert len(appends) == 4, appends  # the entry, then the commit, to each follower
        assert all(net.nodes[f].commit_index == index for f in followers)
    else:
        assert len(appends) == 2, appends  # the entry only
        assert all(net.nodes[f].commit_index < index for f in followers)
        net.nodes[leader].propose(b"y")  # the next entry carries the commit
        net.deliver()
        assert all(net.nodes[f].commit_index >= index for f in followers)
        assert all(net.applied[f][-1:] == [b"x"] for f in followers)
        before = net.nodes[leader].commit_index
        net.tick_all(2)  # and a heartbeat carries the last one
        assert all(net.nodes[f].commit_index == before for f in followers)
        assert all(net.applied[f][-1:] == [b"y"] for f in followers)
