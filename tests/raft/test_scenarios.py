"""Scenario transcripts (golden files) with their key outcomes asserted."""

from __future__ import annotations

from quorumlog.raft import (
    ConfChange,
    ConfChangeSingle,
    ConfChangeType,
    ProposalDroppedError,
    Role,
)

from .conftest import Golden
from .network import Network

ADD = ConfChangeType.ADD_NODE
REMOVE = ConfChangeType.REMOVE_NODE
LEARNER = ConfChangeType.ADD_LEARNER


def change(*pairs: tuple[ConfChangeType, int], transition: str = "auto") -> ConfChange:
    return ConfChange(
        changes=tuple(ConfChangeSingle(t, node_id) for t, node_id in pairs),
        transition=transition,  # type: ignore[arg-type]
    )


def test_election(golden: Golden) -> None:
    net = Network([1, 2, 3], seed=1)
    net.note("tick until the first randomized election timeout fires")
    leader = net.tick_until_leader()
    net.show()
    golden.check("election", net.text())
    assert net.leaders() == [leader]
    terms = {n.term for n in net.nodes.values()}
    assert terms == {2}
    for node in net.nodes.values():
        assert node.leader_id == leader
        assert node.commit_index == 2  # the new leader's empty entry
        assert node.epoch == 1


def test_split_vote(golden: Golden) -> None:
    net = Network([1, 2, 3, 4], seed=2, pre_vote=False)
    net.note("1 and 2 campaign at once; 1 cannot reach 4 and 2 cannot reach 3")
    net.cut(1, 4)
    net.cut(2, 3)
    net.nodes[1].campaign()
    net.nodes[2].campaign()
    net.deliver()
    net.show()
    assert net.leaders() == []
    assert net.nodes[1].role == Role.CANDIDATE and net.nodes[2].role == Role.CANDIDATE
    assert net.nodes[3].vote == 1 and net.nodes[4].vote == 2
    net.heal()
    net.note("the randomized timeouts break the tie")
    leader = net.tick_until_leader()
    net.show()
    golden.check("split_vote", net.text())
    assert net.nodes[leader].term == 3


def test_pre_vote_blocks_disruptive_node(golden: Golden) -> None:
    net = Network([1, 2, 3], seed=3)
    net.elect(1)
    net.isolate(3)
    net.note("3 times out again and again but cannot win a pre-vote: its term stays")
    for _ in range(3):
        net.tick(3, 2 * net.make_config(3).election_timeout_ticks)
        net.deliver()
    net.show(3)
    assert net.nodes[3].term == 2
    assert net.nodes[3].role == Role.PRE_CANDIDATE
    net.heal()
    net.note("3 asks again; 1 and 2 hear from their leader and ignore it")
    net.tick(3, 2 * net.make_config(3).election_timeout_ticks)
    net.deliver()
    net.note("the leader's heartbeat brings 3 back")
    net.tick(1)
    net.deliver()
    net.show()
    golden.check("pre_vote", net.text())
    assert net.leaders() == [1]
    assert {n.term for n in net.nodes.values()} == {2}
    back = net.nodes[3]
    assert back.role == Role.FOLLOWER and back.leader_id == 1


def test_check_quorum_step_down(golden: Golden) -> None:
    net = Network([1, 2, 3], seed=4)
    net.elect(1)
    net.isolate(1)
    timeout = net.make_config(1).election_timeout_ticks
    net.note(f"1 hears nobody for {timeout} ticks, twice")
    for _ in range(2 * timeout):
        net.tick(1)
        net.deliver()
    net.show(1)
    assert net.nodes[1].role == Role.FOLLOWER
    assert net.nodes[1].term == 2
    net.note("2 and 3 elect a new leader")
    for _ in range(100):
        net.tick(2)
        net.tick(3)
        net.deliver()
        if net.leaders():
            break
    leader = net.leaders()[0]
    net.heal()
    net.tick(leader)
    net.deliver()
    net.show()
    golden.check("check_quorum", net.text())
    assert leader in (2, 3)
    assert net.nodes[1].leader_id == leader and net.nodes[1].term == 3


def test_log_conflict_repair(golden: Golden) -> None:
    net = Network([1, 2, 3], seed=5)
    net.elect(1)
    net.propose(1, b"a")
    net.isolate(1)
    net.note("the old leader takes proposals it cannot commit")
    net.propose(1, b"lost1", b"lost2", b"lost3")
    net.note("2 and 3 time out; the winner leads term 3 and commits more")
    first = net.tick_until_leader(2, 3)
    net.propose(first, b"b", b"c")
    other = 5 - first
    net.note(f"{first} hands over to {other}: term 4")
    net.nodes[first].transfer_leader(other)
    net.deliver()
    net.heal()
    net.note("1 rejects; the hint (term 2) lets the leader skip all term-3 entries at once")
    net.tick(other)
    net.deliver()
    net.show()
    golden.check("log_conflict", net.text())
    logs = {i: [(e.term, e.index, e.data) for e in net.log_of(i)] for i in (1, 2, 3)}
    assert logs[1] == logs[2] == logs[3]
    assert [t for t, _, _ in logs[1]] == [2, 2, 3, 3, 3, 4]
    assert net.applied[1] == net.applied[other] == [b"a", b"b", b"c"]
    assert net.nodes[1].role == Role.FOLLOWER and net.nodes[1].leader_id == other
    rejects = [line for line in net.transcript if "rejected hint" in line]
    assert rejects == [f"1->{other} APP_RESP term=4 index=6 rejected hint=2/6"]


def test_leader_transfer(golden: Golden) -> None:
    net = Network([1, 2, 3], seed=6)
    net.elect(1)
    net.propose(1, b"x")
    net.note("transfer to 3, which is up to date: TimeoutNow at once")
    net.nodes[1].transfer_leader(3)
    net.deliver()
    net.show()
    assert net.leaders() == [3]
    assert net.nodes[3].term == 3
    net.note("transfer to 2 while it is cut off: proposals are refused meanwhile")
    net.isolate(2)
    net.propose(3, b"y")
    net.nodes[3].transfer_leader(2)
    net.deliver()
    try:
        net.nodes[3].propose(b"z")
    except ProposalDroppedError as exc:
        net.note(f"proposal dropped, hint {exc.leader_hint}")
        assert exc.leader_hint == 2
    else:
        raise AssertionError("proposal accepted during a transfer")
    net.note("after an election timeout the transfer is aborted")
    net.tick(3, net.make_config(3).election_timeout_ticks)
    net.deliver()
    assert net.nodes[3].lead_transferee == 0
    net.heal()
    net.propose(3, b"z")
    net.show()
    golden.check("leader_transfer", net.text())
    assert net.leaders() == [3]
    assert net.applied[3] == [b"x", b"y", b"z"]


def test_joint_consensus_add_and_remove(golden: Golden) -> None:
    net = Network([1, 2, 3], seed=7)
    net.elect(1)
    net.propose(1, b"a")
    net.note("add 4 (a new node with empty storage) as a voter: one voter, simple change")
    net.start(4)
    net.change(1, change((ADD, 4)))
    net.show()
    assert net.nodes[4].conf_state.voters == {1, 2, 3, 4}
    net.note("add 5 and remove 2 together: joint consensus C_old,new ...")
    net.start(5)
    net.change(1, change((ADD, 5), (REMOVE, 2), transition="joint_explicit"))
    net.show()
    assert net.nodes[1].conf_state.voters_outgoing == {1, 2, 3, 4}
    net.note("... then C_new")
    net.change(1, ConfChange())
    net.tick(1)
    net.deliver()
    net.show()
    golden.check("joint_add_remove", net.text())
    for i in (1, 3, 4, 5):
        cs = net.nodes[i].conf_state
        assert cs.voters == {1, 3, 4, 5} and not cs.voters_outgoing
    assert net.applied[5] == [b"", b"a"]  # bootstrap snapshot data, then the log
    # epoch: leader 1 (+1), add 4 (+1), enter joint (+1), leave joint (+1)
    assert {net.nodes[i].epoch for i in (1, 3, 4, 5)} == {4}
    assert any("c" in line for line in net.transcript if "APP" in line)


def test_remove_leader(golden: Golden) -> None:
    net = Network([1, 2, 3], seed=8)
    net.elect(1)
    net.note("remove the leader itself, through a joint configuration left automatically;")
    net.note("once C_new is applied, 1 steps down and sends TimeoutNow to an up-to-date voter")
    net.change(1, change((REMOVE, 1), transition="joint_implicit"))
    net.show()
    assert net.nodes[1].role == Role.FOLLOWER
    golden.check("remove_leader", net.text())
    leader = net.leaders()[0]
    assert leader in (2, 3)
    assert net.nodes[leader].conf_state.voters == {2, 3}
    net.propose(leader, b"after")
    assert net.applied[2][-1] == net.applied[3][-1] == b"after"
    assert b"after" not in net.applied[1]


def test_learner_catch_up_and_promotion(golden: Golden) -> None:
    net = Network([1, 2, 3], seed=9)
    net.elect(1)
    net.propose(1, b"a", b"b")
    net.note("add 4 as a learner: it gets the log but does not vote")
    net.start(4)
    net.change(1, change((LEARNER, 4)))
    net.show(1, 4)
    assert net.nodes[4].conf_state.learners == {4}
    assert net.applied[4] == [b"", b"a", b"b"]  # bootstrap snapshot data, then entries
    net.note("a learner never campaigns")
    net.tick(4, 100)
    net.deliver()
    assert net.nodes[4].role == Role.FOLLOWER and net.nodes[1].role == Role.LEADER
    net.note("promote 4")
    net.change(1, change((ADD, 4)))
    net.note("4 now votes: it can even take over")
    net.nodes[1].transfer_leader(4)
    net.deliver()
    net.show()
    golden.check("learner", net.text())
    assert net.leaders() == [4]
    assert net.nodes[4].conf_state.voters == {1, 2, 3, 4}


def test_snapshot_install(golden: Golden) -> None:
    net = Network([1, 2, 3], seed=10)
    net.elect(1)
    net.isolate(3)
    net.propose(1, b"a", b"b", b"c")
    net.note("1 snapshots at its applied index and compacts its log")
    node, storage = net.nodes[1], net.storages[1]
    storage.create_snapshot(node.applied_index, node.conf_state, b"a,b,c", node.epoch)
    storage.compact(node.applied_index)
    net.propose(1, b"d")
    net.heal()
    net.tick(1)
    net.deliver()
    net.show()
    golden.check("snapshot_install", net.text())
    assert net.applied[3] == [b"a,b,c", b"d"]
    assert net.nodes[3].applied_index == net.nodes[1].applied_index
    assert net.nodes[3].epoch == net.nodes[1].epoch == 1
    assert net.storages[3].snapshot().meta.index == 5


def test_restart_from_storage(golden: Golden) -> None:
    net = Network([1, 2, 3], seed=11)
    net.elect(1)
    net.propose(1, b"a")
    net.start(4)
    net.change(1, change((ADD, 4)))
    net.propose(1, b"b")
    before = {i: (net.nodes[i].epoch, net.nodes[i].conf_state, net.nodes[i].commit_index)
              for i in (1, 2, 3, 4)}
    net.note("every node crashes and restarts from its storage")
    for i in (1, 2, 3, 4):
        net.crash(i)
    for i in (1, 2, 3, 4):
        net.restart(i)
    net.deliver()
    net.show()
    after = {i: (net.nodes[i].epoch, net.nodes[i].conf_state, net.nodes[i].commit_index)
             for i in (1, 2, 3, 4)}
    assert after == before
    assert net.applied[2] == [b"a", b"b"]  # re-applied from the log
    net.note("they elect a leader again; nothing committed is lost")
    leader = net.tick_until_leader()
    net.propose(leader, b"c")
    net.show()
    golden.check("restart", net.text())
    assert all(net.applied[i] == [b"a", b"b", b"c"] for i in (1, 2, 3, 4))
    assert {n.epoch for n in net.nodes.values()} == {before[1][0] + 1}


def test_read_index(golden: Golden) -> None:
    net = Network([1, 2, 3], seed=12)
    net.elect(1)
    net.propose(1, b"a")
    net.note("leader read: confirmed by a heartbeat quorum")
    net.nodes[1].read_index(b"r1")
    net.deliver()
    net.note("follower read: forwarded to the leader")
    net.nodes[3].read_index(b"r2")
    net.deliver()
    net.note("a leader cut off from the quorum cannot confirm")
    net.isolate(1)
    net.nodes[1].read_index(b"r3")
    net.deliver()
    golden.check("read_index", net.text())
    lines = [line for line in net.transcript if "read_state" in line]
    assert lines == ["1: read_state index=3 ctx=r1", "3: read_state index=3 ctx=r2"]
