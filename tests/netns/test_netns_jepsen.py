"""Jepsen-style meta runs: concurrent put/get/CAS clients on the client host while
the meta leader is repeatedly cut off from everyone and healed (three hosts),
or while four hosts are split 2|2 and the leader goes deaf or mute (one-way
loss); the history must be linearizable (quorumlog.sim.check_history). Slow:
``pytest -m slow tests/netns``; docs/jepsen.md."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from quorumlog.sim import Operation, OpKind, Verdict, check_history

from .harness import CLIENT, NetnsCluster

PARTITION_ROUNDS = 4
PARTITION_HOLD_S = 6.0  # several election timeouts (1 s) inside a partition
HEALED_HOLD_S = 4.0
CLIENTS = 5
CHECK_TIME_LIMIT_S = 120.0
WORKLOAD = Path(__file__).with_name("workload.py")


def to_operation(op: dict[str, object]) -> Operation:
    value = op["input"]
    return Operation(int(str(op["client"])), OpKind(str(op["kind"])), str(op["key"]),
                     tuple(value) if isinstance(value, list) else value, op["output"],
                     float(str(op["call"])), None if op["ret"] is None else float(str(op["ret"])))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_meta_linearizable_through_leader_partitions(netns_cluster: NetnsCluster) -> None:
    c = netns_cluster
    seconds = PARTITION_ROUNDS * (PARTITION_HOLD_S + HEALED_HOLD_S) + HEALED_HOLD_S
    proc = c.client_process([str(WORKLOAD), "meta", c.meta_members, str(seconds), str(CLIENTS)])
    faults = 0
    try:
        time.sleep(HEALED_HOLD_S)  # the workload's own schedule: clients run unfaulted first
        for _ in range(PARTITION_ROUNDS):
            leader = c.leader()
            if leader is not None:
                c.isolate(leader)
                faults += 1
            time.sleep(PARTITION_HOLD_S)
            c.heal()
            time.sleep(HEALED_HOLD_S)
        stdout, stderr = proc.communicate(timeout=seconds + 120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr[-3000:]
    history = [to_operation(op) for op in json.loads(stdout.splitlines()[-1])["history"]]
    known = [op for op in history if op.outcome_known]
    print(f"netns jepsen meta: {len(history)} operations ({len(known)} with a known outcome), "
          f"{faults} leader partitions")
    assert faults >= PARTITION_ROUNDS - 1
    assert len(known) > 100, f"too few operations completed: {len(known)}"
    result = check_history(history, time_limit_s=CHECK_TIME_LIMIT_S)
    assert result.verdict is Verdict.OK, result.explanation


# -- 2|2 split and one-way loss on four hosts ----------------------------------

SPLIT_HOLD_S = 8.0
ONE_WAY_HOLD_S = 10.0
# After a fault starts, a leader may still serve lease reads (its lease is shorter
# than an election timeout) and requests already sent may still be answered.
FAULT_GRACE_S = 3.0
SPLIT_ROUNDS = 2


@dataclass
class Window:
    """A fault in force from ``start`` to ``end`` (time.monotonic, shared with the
    client host: namespaces do not change the monotonic clock)."""

    name: str
    start: float
    end: float = 0.0

    def completed_inside(self, history: list[Operation]) -> list[Operation]:
        """Operations sent after the grace and answered while the fault held (a get
        is recorded only when answered; a put or CAS has ``ret`` None when not)."""
        return [op for op in history
                if op.ret is not None and op.call >= self.start + FAULT_GRACE_S
                and op.ret <= self.end]


def deaf(c: NetnsCluster, node: int) -> None:
    """``node`` sends to everyone but receives from no one."""
    for other in [*c.node_ids, CLIENT]:
        if other != node:
            c.one_way_loss(other, node)


def mute(c: NetnsCluster, node: int) -> None:
    """``node`` receives from everyone but nothing it sends arrives."""
    for other in [*c.node_ids, CLIENT]:
        if other != node:
            c.one_way_loss(node, other)


def hold(c: NetnsCluster, windows: list[Window], name: str, seconds: float,
         inject: Callable[[], None]) -> None:
    window = Window(name, time.monotonic())
    inject()
    time.sleep(seconds)  # the fault's duration is the run's schedule, not a wait for state
    c.heal()
    window.end = time.monotonic()
    windows.append(window)
    time.sleep(HEALED_HOLD_S)


def leader_of(c: NetnsCluster) -> int:
    leader = c.leader()
    assert leader is not None, "no meta leader between faults"
    return leader


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_meta_through_two_two_split_and_one_way_loss(netns_cluster4: NetnsCluster) -> None:
    """Four members: a 2|2 split (the client with one half) leaves no side a
    majority, so nothing succeeds there and nothing is lost; a deaf leader
    (sends heartbeats, hears nothing) and a mute one (hears, cannot send) are
    replaced and the group stays available. The history is linearizable."""
    c = netns_cluster4
    per_round = (SPLIT_HOLD_S + 2 * ONE_WAY_HOLD_S + 3 * HEALED_HOLD_S) * 1.5
    seconds = SPLIT_ROUNDS * per_round + HEALED_HOLD_S
    proc = c.client_process([str(WORKLOAD), "meta", c.meta_members, str(seconds), str(CLIENTS)])
    windows: list[Window] = []
    try:
        time.sleep(HEALED_HOLD_S)
        for _ in range(SPLIT_ROUNDS):
            hold(c, windows, "2|2 split", SPLIT_HOLD_S,
                 lambda: c.partition([1, 2, CLIENT], [3, 4]))
            hold(c, windows, "deaf leader", ONE_WAY_HOLD_S, partial(deaf, c, leader_of(c)))
            hold(c, windows, "mute leader", ONE_WAY_HOLD_S, partial(mute, c, leader_of(c)))
        stdout, stderr = proc.communicate(timeout=seconds + 120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr[-3000:]
    history = [to_operation(op) for op in json.loads(stdout.splitlines()[-1])["history"]]
    known = [op for op in history if op.outcome_known]
    counts = {f"{w.name} #{i}": len(w.completed_inside(history)) for i, w in enumerate(windows)}
    print(f"netns jepsen meta 4 hosts: {len(history)} operations ({len(known)} with a known "
          f"outcome), {len(windows)} faults; operations completed inside each: {counts}")
    for i, window in enumerate(windows):
        done = window.completed_inside(history)
        if window.name == "2|2 split":
            assert done == [], f"{window.name} #{i}: the minority side answered {done[:3]}"
        else:
            assert done, f"{window.name} #{i}: meta unavailable while the fault held"
    result = check_history(history, time_limit_s=CHECK_TIME_LIMIT_S)
    assert result.verdict is Verdict.OK, result.explanation


# -- tables: the partition leader isolated, or cut from its peers only -----------

TABLE = "jepsen"  # workload.py's
TABLE_ROUNDS = 3
TABLE_SETUP_DEADLINE_S = 90.0


def table_leader(c: NetnsCluster) -> int | None:
    """The node leading the most of the table's partitions (with one partition:
    its leader), as the scheduler last heard."""
    out = c.cli("table", "info", TABLE, "--members", c.meta_members, "-o", "json")
    if out.returncode != 0:
        return None
    leaders = [int(g["leader"]) for g in json.loads(out.stdout)["partition_groups"]
               if g.get("leader")]
    return max(set(leaders), key=leaders.count) if leaders else None


def make_table(c: NetnsCluster, partitions: int = 1) -> None:
    """Table ``jepsen`` of 3 replicas a partition, its keys set to 0 (one partition:
    every fault at its leader hits every key); the table nodes register a moment
    after start."""
    deadline = time.monotonic() + TABLE_SETUP_DEADLINE_S
    steps = [("create", TABLE, "--partitions", str(partitions), "--replicas", "3"),
             *[("set", TABLE, key, "v", "0") for key in ("k0", "k1", "k2")]]
    for step in steps:
        while (out := c.cli("table", *step, "--members", c.meta_members)).returncode != 0:
            assert time.monotonic() < deadline, f"table {step}: {out.stderr[-2000:]}"
            time.sleep(0.5)


@pytest.mark.timeout(600)
def test_table_linearizable_through_one_round_of_leader_partitions(
        netns_table_cluster: NetnsCluster) -> None:
    """The quick variant (default run): the leader cut from its peers, once."""
    _table_run(netns_table_cluster, 1, isolate=False)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_table_linearizable_through_partition_leader_partitions(
        netns_table_cluster: NetnsCluster) -> None:
    """get/set/check_and_set/incr clients while the leader of the table's partition
    is isolated from everyone, then cut from its peers only (the client still
    reaches it: a leader that went on answering reads, or acknowledged writes,
    on its own would show as a non-linearizable history; with follower reads
    in the workload this fails), TABLE_ROUNDS times each. The history is
    linearizable."""
    _table_run(netns_table_cluster, TABLE_ROUNDS)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_table_of_three_partitions_linearizable_through_leader_partitions(
        netns_table_cluster: NetnsCluster) -> None:
    """The same with 3 partitions (the keys spread over them, leaders on different
    nodes): each fault hits the node leading the most of them while the others
    go on; clients route each key to its own partition's leader."""
    _table_run(netns_table_cluster, 2, partitions=3)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_table_of_three_partitions_linearizable_through_deaf_and_mute_leaders(
        netns_table_cluster: NetnsCluster) -> None:
    """The node leading the most partitions goes deaf (sends, hears nothing:
    its followers keep getting heartbeats, so only its check-quorum ends its
    leadership) or mute (hears, cannot send), twice each."""
    _table_run(netns_table_cluster, 2, partitions=3, isolate=False, one_way=True)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_table_rows_linearizable_through_leader_partitions(
        netns_table_cluster: NetnsCluster) -> None:
    """Operations on several sort keys of one hash key at once (multi_set,
    multi_delete, multi_get, a one-page scan, check_and_mutate, and one-key set
    and get) on 3 rows of a 2-partition table, while the node leading the most
    partitions is isolated, then cut from its peers only, twice each. Each row
    is one register of fields in the checker's model: a write seen half
    applied, a scan or multi_get missing an acknowledged write, or a
    check_and_mutate that applied part of its mutations shows as a
    non-linearizable history."""
    _table_run(netns_table_cluster, 2, partitions=2, workload="table-rows")


REPLACED_DEADLINE_S = 45.0


def _stop_table_workload(proc: subprocess.Popen[str], stop_file: Path
                         ) -> tuple[list[Operation], dict[str, Any]]:
    """Stop the ``table`` workload; its history and its result line."""
    stop_file.touch()
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr[-3000:]
    result_line: dict[str, Any] = json.loads(stdout.splitlines()[-1])
    return [to_operation(op) for op in result_line["history"]], result_line


def _kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def partition_members(c: NetnsCluster) -> list[list[int]] | None:
    out = c.cli("table", "info", TABLE, "--members", c.meta_members, "-o", "json")
    if out.returncode != 0:
        return None
    return [sorted(g["members"]) for g in json.loads(out.stdout)["partition_groups"]]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_table_replicas_of_a_cut_off_node_are_replaced_while_it_lives(
        netns_table_cluster4: NetnsCluster) -> None:
    """Four table hosts, 4 partitions x 3 replicas; the node leading the most
    partitions is isolated, alive, until the scheduler has replaced every
    replica it held (a node silent 4 s counts as dead), then healed: it comes
    back as a zombie holding old replicas, which must neither answer nor take
    writes. Clients run throughout; the history is linearizable, operations
    complete while the node is cut off, and every partition ends on 3 voters."""
    c = netns_table_cluster4
    make_table(c, partitions=4)
    stop_file = c.directory / "table-workload.stop"
    proc = c.client_process([str(WORKLOAD), "table", c.meta_members, str(stop_file),
                             str(CLIENTS)])
    try:
        time.sleep(HEALED_HOLD_S)
        victim = table_leader(c)
        assert victim is not None, "no partition leader"
        held = [m for m in partition_members(c) or [] if victim in m]
        window = Window("leader's node cut off until replaced", time.monotonic())
        c.isolate(victim)
        deadline = time.monotonic() + REPLACED_DEADLINE_S
        while (members := partition_members(c)) is None or any(
                victim in m or len(m) != 3 for m in members):
            assert time.monotonic() < deadline, (
                f"node {victim}'s replicas not replaced within {REPLACED_DEADLINE_S:.0f} s: "
                f"{members}")
            time.sleep(0.5)
        c.heal()
        window.end = time.monotonic()
        time.sleep(HEALED_HOLD_S)
        history, _ = _stop_table_workload(proc, stop_file)
    finally:
        _kill(proc)
    inside = window.completed_inside(history)
    print(f"netns jepsen table replace: node {victim} held {len(held)} replicas, cut off "
          f"{window.end - window.start:.1f} s; {len(history)} operations, {len(inside)} "
          f"completed while it was cut off")
    assert held, f"node {victim} held no replica"
    assert inside, "no operation completed while the node was cut off"
    result = check_history(history, time_limit_s=CHECK_TIME_LIMIT_S)
    assert result.verdict is Verdict.OK, result.explanation
    # The healed node gets replicas back by balancing: a move is a learner, then a
    # joint change, so a partition has 3 voters again once the move settles.
    deadline = time.monotonic() + REPLACED_DEADLINE_S
    while (members := partition_members(c)) is None or any(len(m) != 3 for m in members):
        assert time.monotonic() < deadline, f"partitions not back on 3 voters: {members}"
        time.sleep(0.5)


def _table_run(c: NetnsCluster, rounds: int, *, isolate: bool = True,
               partitions: int = 1, one_way: bool = False, workload: str = "table") -> None:
    make_table(c, partitions)
    stop_file = c.directory / "table-workload.stop"
    proc = c.client_process([str(WORKLOAD), workload, c.meta_members, str(stop_file),
                             str(CLIENTS)])
    windows: list[Window] = []
    try:
        time.sleep(HEALED_HOLD_S)
        for _ in range(rounds):
            if isolate:
                leader = table_leader(c)
                assert leader is not None, "no partition leader between faults"
                hold(c, windows, "leader isolated", PARTITION_HOLD_S,
                     partial(c.isolate, leader))
            if one_way:
                for name, fault in (("deaf leader", deaf), ("mute leader", mute)):
                    leader = table_leader(c)
                    assert leader is not None, "no partition leader between faults"
                    hold(c, windows, name, PARTITION_HOLD_S, partial(fault, c, leader))
                continue
            leader = table_leader(c)
            assert leader is not None, "no partition leader between faults"
            others = [n for n in c.node_ids if n != leader]
            hold(c, windows, "leader cut from its peers", PARTITION_HOLD_S,
                 partial(c.partition, [leader], others))
        # the clients ran from before the first fault to after the last
        history, result_line = _stop_table_workload(proc, stop_file)
    finally:
        _kill(proc)
    known = [op for op in history if op.outcome_known]
    counts = {f"{w.name} #{i}": len(w.completed_inside(history)) for i, w in enumerate(windows)}
    print(f"netns jepsen table: {len(history)} operations ({len(known)} with a known "
          f"outcome, {result_line['incr_unknown']} incr without an answer), {len(windows)} "
          f"faults; operations completed inside each: {counts}")
    assert len(known) > 100, f"too few operations completed: {len(known)}"
    result = check_history(history, time_limit_s=CHECK_TIME_LIMIT_S)
    assert result.verdict is Verdict.OK, result.explanation
    for i, window in enumerate(windows):  # a new leader took over within the fault
        spans = sorted((round(op.call - window.start, 2),
                        None if op.ret is None else round(op.ret - window.start, 2),
                        op.client_id, op.kind.name)
                       for op in history if op.ret is None or op.ret >= window.start
                       if op.call <= window.end and op.client_id >= 0)
        assert window.completed_inside(history), (
            f"{window.name} #{i}: no operation completed; operations (call, return) in "
            f"s from its start: {[x for x in spans if x[1] is None or x[1] > 0.5][:12]}")
