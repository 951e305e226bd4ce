"""Illegal inputs raise a clear QuorumlogError and leave the node exactly as it was."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable

import pytest

from quorumlog.errors import ProtocolError, QuorumlogError, UsageError
from quorumlog.raft import (
    ConfChange,
    ConfChangeError,
    ConfChangePendingError,
    ConfChangeSingle,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    MemoryStorage,
    Message,
    MessageType,
    ProposalDroppedError,
    RaftConfig,
    RaftNode,
    Snapshot,
    SnapshotMeta,
)

from .network import Network
from .state_dump import deep_state

MT = MessageType


def leader_network() -> Network:
    net = Network([1, 2, 3], seed=21)
    net.elect(1)
    net.propose(1, b"a")
    return net


def assert_rejected(
    node: RaftNode, action: Callable[[], object], error: type[QuorumlogError]
) -> QuorumlogError:
    before = deep_state(node)
    with pytest.raises(error) as info:
        action()
    assert deep_state(node) == before, "a rejected input changed the node"
    assert info.value.message
    return info.value


def app(**fields: object) -> Message:
    base: dict[str, object] = {"type": MT.APP, "to": 2, "from_": 1, "term": 2, "index": 3,
                               "log_term": 2, "commit": 3}
    base.update(fields)
    return Message(**base)  # type: ignore[arg-type]


GARBAGE_TO_FOLLOWER = {
    "to another node": app(to=3),
    "from node 0": app(from_=0),
    "from itself": app(from_=2),
    "negative term": app(term=-1),
    "local type HUP": Message(type=MT.HUP, to=2, from_=1, term=2),
    "local type CHECK_QUORUM": Message(type=MT.CHECK_QUORUM, to=2, from_=1, term=2),
    "local type SNAP_STATUS": Message(type=MT.SNAP_STATUS, to=2, from_=1, term=2),
    "APP without term": app(term=0),
    "APP entries with a gap": app(entries=(Entry(2, 4), Entry(2, 6))),
    "APP entries not after index": app(entries=(Entry(2, 5),)),
    "APP entry term above message term": app(entries=(Entry(9, 4),)),
    "APP entry terms decreasing": app(term=3, entries=(Entry(3, 4), Entry(2, 5))),
    "SNAP without snapshot": Message(type=MT.SNAP, to=2, from_=1, term=2),
    "snapshot on a HEARTBEAT": Message(
        type=MT.HEARTBEAT, to=2, from_=1, term=2,
        snapshot=Snapshot(meta=SnapshotMeta(index=5, term=2, conf_state=ConfState(frozenset()),
                                            epoch=0)),
    ),
    "SNAP at index 0": Message(
        type=MT.SNAP, to=2, from_=1, term=2,
        snapshot=Snapshot(meta=SnapshotMeta(index=0, term=2, conf_state=ConfState(frozenset()),
                                            epoch=0)),
    ),
    "entries on a VOTE": Message(type=MT.VOTE, to=2, from_=1, term=3, entries=(Entry(2, 4),)),
    "heartbeat commit past our log": Message(type=MT.HEARTBEAT, to=2, from_=1, term=2,
                                             commit=99),
    "PROP with a conf change entry": Message(
        type=MT.PROP, to=2, from_=1, entries=(Entry(0, 0, EntryType.CONF_CHANGE, b""),)
    ),
}


@pytest.mark.parametrize("name", sorted(GARBAGE_TO_FOLLOWER))
def test_garbage_message_to_follower(name: str) -> None:
    net = leader_network()
    assert_rejected(net.nodes[2], lambda: net.nodes[2].step(GARBAGE_TO_FOLLOWER[name]),
                    ProtocolError)


def test_responses_from_unknown_node_to_leader() -> None:
    net = leader_network()
    leader = net.nodes[1]
    for m in (
        Message(type=MT.APP_RESP, to=1, from_=9, term=2, index=3),
        Message(type=MT.HEARTBEAT_RESP, to=1, from_=9, term=2),
    ):
        error = assert_rejected(leader, functools.partial(leader.step, m), ProtocolError)
        assert "never in the configuration" in error.message
    # Requests a removed member may still forward in good faith are dropped quietly.
    before = deep_state(leader)
    leader.step(Message(type=MT.READ_INDEX, to=1, from_=9, context=b"r"))
    leader.step(Message(type=MT.TRANSFER_LEADER, to=1, from_=9, term=2))
    assert deep_state(leader) == before


def test_vote_response_from_unknown_node_to_candidate() -> None:
    net = Network([1, 2, 3], seed=22, pre_vote=False)
    node = net.nodes[1]
    node.campaign()
    m = Message(type=MT.VOTE_RESP, to=1, from_=7, term=node.term)
    assert_rejected(node, lambda: node.step(m), ProtocolError)


def test_stale_term_messages_are_ignored_not_errors() -> None:
    net = leader_network()
    follower = net.nodes[2]
    before = deep_state(follower)
    follower.step(Message(type=MT.VOTE_RESP, to=2, from_=3, term=1))
    follower.step(Message(type=MT.APP_RESP, to=2, from_=3, term=1, index=9))
    assert deep_state(follower) == before


def test_proposals_on_a_follower() -> None:
    net = leader_network()
    follower = net.nodes[2]
    error = assert_rejected(follower, lambda: follower.propose(b"x"), ProposalDroppedError)
    assert isinstance(error, ProposalDroppedError) and error.leader_hint == 1
    assert error.retriable
    change = ConfChange(changes=(ConfChangeSingle(ConfChangeType.ADD_NODE, 4),))
    assert_rejected(follower, lambda: follower.propose_conf_change(change), ProposalDroppedError)


def test_bad_proposals_on_the_leader() -> None:
    net = leader_network()
    leader = net.nodes[1]
    assert_rejected(leader, lambda: leader.propose("text"), UsageError)  # type: ignore[arg-type]
    assert_rejected(leader, lambda: leader.propose_batch([b"ok", 5]), UsageError)  # type: ignore[list-item]
    too_big = b"x" * (net.make_config(1).max_entry_data_bytes + 1)
    assert_rejected(leader, lambda: leader.propose(too_big), UsageError)


def test_second_conf_change_while_one_is_pending() -> None:
    net = leader_network()
    leader = net.nodes[1]
    net.start(4)
    leader.propose_conf_change(ConfChange(changes=(ConfChangeSingle(ConfChangeType.ADD_NODE, 4),)))
    second = ConfChange(changes=(ConfChangeSingle(ConfChangeType.ADD_NODE, 5),))
    error = assert_rejected(leader, lambda: leader.propose_conf_change(second),
                            ConfChangePendingError)
    assert isinstance(error, UsageError)
    net.deliver()
    leader.propose_conf_change(second)  # accepted once the first is applied


@pytest.mark.parametrize(
    "change",
    [
        ConfChange(),  # leave joint while not joint
        ConfChange(changes=(ConfChangeSingle(ConfChangeType.REMOVE_NODE, 1),
                            ConfChangeSingle(ConfChangeType.REMOVE_NODE, 2),
                            ConfChangeSingle(ConfChangeType.REMOVE_NODE, 3))),
        ConfChange(changes=(ConfChangeSingle(ConfChangeType.ADD_NODE, 4),
                            ConfChangeSingle(ConfChangeType.ADD_NODE, 5)),
                   transition="joint_explicit"),
    ],
)
def test_conf_changes_that_do_not_apply(change: ConfChange) -> None:
    net = leader_network()
    leader = net.nodes[1]
    if change.changes and change.transition == "joint_explicit":
        leader.propose_conf_change(change)  # enter joint: fine
        net.deliver()
        change = ConfChange(changes=(ConfChangeSingle(ConfChangeType.ADD_NODE, 6),))
    assert_rejected(leader, lambda: leader.propose_conf_change(change), ConfChangeError)


def test_misuse_of_ready_and_advance() -> None:
    net = leader_network()
    leader = net.nodes[1]
    leader.propose(b"x")
    rd = leader.ready()
    assert not leader.has_ready()
    assert_rejected(leader, leader.ready, UsageError)
    assert_rejected(leader, lambda: leader.advance(Network([1], seed=1).nodes[1].ready()),
                    UsageError)
    leader.advance(rd)


def test_misuse_of_reads_transfers_and_campaign() -> None:
    net = leader_network()
    leader = net.nodes[1]
    assert_rejected(leader, lambda: leader.read_index(b""), UsageError)
    leader.read_index(b"r1")
    assert_rejected(leader, lambda: leader.read_index(b"r1"), UsageError)
    assert_rejected(leader, lambda: leader.transfer_leader(0), UsageError)
    assert_rejected(leader, lambda: leader.transfer_leader(9), UsageError)
    assert_rejected(leader, lambda: leader.report_unreachable(0), UsageError)
    learner_net = Network([1, 2, 3], seed=3, voters=[1, 2], learners=[3])
    learner = learner_net.nodes[3]
    assert_rejected(learner, learner.campaign, UsageError)
    learner_net.elect(1)
    assert_rejected(learner_net.nodes[1], lambda: learner_net.nodes[1].transfer_leader(3),
                    UsageError)


def test_no_leader_known() -> None:
    node = Network([1, 2, 3], seed=4).nodes[2]
    assert_rejected(node, lambda: node.read_index(b"r"), ProposalDroppedError)
    assert_rejected(node, lambda: node.transfer_leader(3), ProposalDroppedError)
    assert_rejected(node, lambda: node.propose(b"x"), ProposalDroppedError)


def test_bad_restart_arguments() -> None:
    storage = MemoryStorage(ConfState(voters=frozenset({1})))
    with pytest.raises(UsageError, match="applied index 5 is past the commit index"):
        RaftNode(RaftConfig(node_id=1), storage, random.Random(1), applied=5)
