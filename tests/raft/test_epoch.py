"""The group epoch: rule, agreement across members, snapshots and restarts."""

from __future__ import annotations

from quorumlog.raft import (
    ConfChange,
    ConfChangeSingle,
    ConfChangeType,
    Entry,
    EntryType,
    fold_epoch,
)

from .network import Network

CC = EntryType.CONF_CHANGE


def test_fold_epoch_rule() -> None:
    assert fold_epoch(0, 1, []) == (0, 1)
    assert fold_epoch(0, 1, [Entry(2, 2), Entry(2, 3)]) == (1, 2)  # new leader's entry
    assert fold_epoch(1, 2, [Entry(2, 4), Entry(2, 5, CC)]) == (2, 2)  # conf change
    assert fold_epoch(2, 2, [Entry(3, 6), Entry(3, 7, CC), Entry(5, 8), Entry(5, 9)]) == (5, 5)
    # the same entries folded in pieces give the same result
    entries = [Entry(3, 6), Entry(3, 7, CC), Entry(5, 8), Entry(5, 9), Entry(5, 10, CC)]
    whole = fold_epoch(2, 2, entries)
    epoch, term = 2, 2
    for entry in entries:
        epoch, term = fold_epoch(epoch, term, [entry])
    assert (epoch, term) == whole


def add(node_id: int) -> ConfChange:
    return ConfChange(changes=(ConfChangeSingle(ConfChangeType.ADD_NODE, node_id),))


def busy_history(net: Network) -> None:
    net.elect(1)
    net.propose(1, b"a")
    net.start(4)
    net.change(1, add(4))
    net.nodes[1].transfer_leader(2)
    net.deliver()
    net.propose(2, b"b")
    net.isolate(3)
    net.propose(2, b"c")
    net.heal()
    net.tick(2)
    net.deliver()


def test_members_agree_on_the_epoch_at_every_applied_index() -> None:
    net = Network([1, 2, 3], seed=31)
    busy_history(net)
    seen: dict[int, int] = {}
    for node_id, history in net.epochs.items():
        for index, epoch in history:
            assert seen.setdefault(index, epoch) == epoch, (node_id, index)
    # leader 1, add 4, leader 2
    assert {n.epoch for n in net.nodes.values()} == {3}


def test_epoch_survives_snapshot_and_restart() -> None:
    net = Network([1, 2, 3], seed=32)
    busy_history(net)
    node, storage = net.nodes[3], net.storages[3]
    storage.create_snapshot(node.applied_index, node.conf_state, b"s", node.epoch)
    storage.compact(node.applied_index)
    net.propose(2, b"d")
    net.nodes[2].transfer_leader(1)
    net.deliver()
    net.propose(1, b"e")
    epoch_before = net.nodes[3].epoch
    assert epoch_before == 4
    net.crash(3)
    restarted = net.restart(3)
    assert restarted.epoch == 3  # the snapshot's epoch, before re-applying the log
    net.deliver()
    assert restarted.epoch == epoch_before
    assert net.applied[3] == [b"d", b"e"]


def test_restart_with_applied_index_replays_the_epoch() -> None:
    net = Network([1, 2, 3], seed=33)
    busy_history(net)
    applied, epoch, conf = net.nodes[2].applied_index, net.nodes[2].epoch, net.nodes[2].conf_state
    net.crash(2)
    restarted = net.restart(2, applied=applied)
    assert restarted.epoch == epoch and restarted.conf_state == conf
    assert not restarted.has_ready() or not restarted.ready().committed_entries


def test_follower_takes_the_epoch_from_an_installed_snapshot() -> None:
    net = Network([1, 2, 3], seed=34)
    net.elect(1)
    net.isolate(3)
    net.start(4)
    net.change(1, add(4))
    leader, storage = net.nodes[1], net.storages[1]
    storage.create_snapshot(leader.applied_index, leader.conf_state, b"snap", leader.epoch)
    storage.compact(leader.applied_index)
    net.heal()
    net.tick(1)
    net.deliver()
    assert net.nodes[3].epoch == leader.epoch == 2
    assert net.nodes[3].conf_state.voters == {1, 2, 3, 4}
