"""Duplication between two clusters through a real network partition (Pegasus's
cross-cluster duplication, docs/duplication.md): two one-node clusters, each in
its own network namespace, duplicate one table both ways while a writer on the
client host sets keys on each. The link between the clusters is cut while the
client still reaches both: first packets are dropped (the shipper's calls time
out; TCP would deliver their bytes after the heal), then TCP is answered with
resets (calls fail at once and nothing sent gets through: a shipper that gave
up on a block would lose it). Then the link heals.

What must hold (DESIGN.md §2, "duplicated tables converge"):
- local writes go on on both sides while the remote is unreachable;
- the cut is real: records written in it are missing on the other side until
  the heal;
- ``dup status`` shows the shipper's error, its lag and the decrees pending
  while the link is cut;
- after the heal both clusters hold the same records with the same timetags,
  every acknowledged write among them.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from .harness import NetnsCluster
from .workload import dup_shared_key

WORKLOAD = Path(__file__).with_name("workload.py")
TABLE = "dupnet"
BEFORE_S = 3.0  # both ways duplicating before the cut
CUT_S = 8.0  # several of the shipper's call timeouts
AFTER_S = 2.0
CONVERGE_DEADLINE_S = 90.0
SETUP_DEADLINE_S = 90.0
POLL_INTERVAL_S = 1.0
MARGIN_S = 1.0  # a write acked this long into the cut cannot have crossed it


def _ok(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def _until_ok(c: NetnsCluster, *args: str) -> None:
    """A CLI command retried until it succeeds (table nodes register a moment
    after their node starts)."""
    deadline = time.monotonic() + SETUP_DEADLINE_S
    while (out := c.cli(*args)).returncode != 0:
        assert time.monotonic() < deadline, f"{args}: {out.stderr[-2000:]}"
        time.sleep(0.5)


def _stop_writers(writers: dict[str, subprocess.Popen[str]],
                  stop_file: Path) -> dict[str, dict[str, Any]]:
    """Stop the dup-writers; each one's result line."""
    stop_file.touch()
    outcomes = {}
    for tag, proc in writers.items():
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr[-3000:]
        outcomes[tag] = json.loads(stdout.splitlines()[-1])
    return outcomes


def _kill_writers(writers: dict[str, subprocess.Popen[str]]) -> None:
    for proc in writers.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _dump(c: NetnsCluster, members: str) -> dict[tuple[str, str], tuple[str, int]]:
    proc = c.client_process([str(WORKLOAD), "table-dump", members, TABLE])
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr[-3000:]
    records = json.loads(stdout.splitlines()[-1])["records"]
    return {(h, s): (v, t) for h, s, v, t in records}


@pytest.mark.timeout(600)
def test_duplication_converges_after_a_partition_between_the_clusters(
        netns_dup_clusters: NetnsCluster) -> None:
    c = netns_dup_clusters
    one, two = c.cluster_members(1), c.cluster_members(2)
    for members in (one, two):
        _until_ok(c, "table", "create", TABLE, "--partitions", "2", "--replicas", "1",
                  "--members", members)
    added = _ok(c.cli("dup", "add", TABLE, "--remote", "c2", "--members", one))
    dup_id = added.split("added duplication ", 1)[1].split()[0]  # "added duplication N of ..."
    _ok(c.cli("dup", "add", TABLE, "--remote", "c1", "--members", two))

    stop_file = c.directory / "dup-writers.stop"
    writers = {tag: c.client_process([str(WORKLOAD), "dup-writer", members, TABLE, tag,
                                      str(stop_file)])
               for tag, members in (("a", one), ("b", two))}
    try:
        time.sleep(BEFORE_S)
        cut_at = time.monotonic()
        c.partition(c.clusters[0], c.clusters[1])  # the client still reaches both
        time.sleep(CUT_S / 2)  # dropped: the shipper's calls time out, their bytes wait
        c.partition(c.clusters[0], c.clusters[1], reset=True)
        time.sleep(CUT_S / 2)  # rejected: calls fail at once and nothing gets through
        in_the_cut = {"one": _dump(c, one), "two": _dump(c, two)}
        # What an operator sees meanwhile: the shipper names its error and the lag.
        stuck = json.loads(_ok(c.cli("dup", "status", TABLE, dup_id, "-o", "json",
                                     "--members", one)))
        healed_at = time.monotonic()
        c.heal()
        time.sleep(AFTER_S)
        outcomes = _stop_writers(writers, stop_file)
    finally:
        _kill_writers(writers)

    assert any(p["error"] and p["lag_ms"] > MARGIN_S * 1000 and p["pending_decrees"] > 0
               for p in stuck.values()), f"dup status in the cut shows no stuck shipper: {stuck}"
    acked = {tag: {f"{tag}{i}": at for i, at in out["acked"]} for tag, out in outcomes.items()}
    for tag, keys in acked.items():
        during = [k for k, at in keys.items() if cut_at < at < healed_at]
        assert len(during) > 20, f"writer {tag}: {len(during)} writes acked in the cut"
    # The cut held: what one side acked well inside it had not reached the other.
    for tag, local, remote in (("a", "one", "two"), ("b", "two", "one")):
        crossed_late = [k for k, at in acked[tag].items()
                        if cut_at + MARGIN_S < at < healed_at - MARGIN_S
                        and any(key[1] == k for key in in_the_cut[remote])]
        held_local = [k for k, at in acked[tag].items() if at < healed_at - MARGIN_S
                      if any(key[1] == k for key in in_the_cut[local])]
        assert not crossed_late, f"{tag}'s writes crossed the cut: {crossed_late[:5]}"
        assert held_local, f"cluster {local} held none of its own writes in the cut"

    deadline = time.monotonic() + CONVERGE_DEADLINE_S
    while True:
        left, right = _dump(c, one), _dump(c, two)
        if left == right and all(len(left) >= len(keys) for keys in acked.values()):
            break
        assert time.monotonic() < deadline, (
            f"not converged {CONVERGE_DEADLINE_S:.0f} s after the heal: {len(left)} vs "
            f"{len(right)} records, e.g. {sorted(set(left) ^ set(right))[:5]}")
        time.sleep(POLL_INTERVAL_S)
    held = {sort_key: value for (_, sort_key), (value, _) in left.items()}
    for tag, keys in acked.items():
        lost = [k for k in keys if held.get(k) != k]
        assert not lost, f"{len(lost)} acknowledged writes of {tag} missing: {lost[:5]}"
    sources = {timetag >> 1 & 0x7F for _, timetag in left.values()}
    assert sources == {1, 2}, sources
    print(f"netns dup: {len(left)} records converged; acked a={len(acked['a'])} "
          f"b={len(acked['b'])}, unknown a={len(outcomes['a']['unknown'])} "
          f"b={len(outcomes['b']['unknown'])}")


# -- two three-node clusters: leaders fail on both sides while the link is cut ---

FAULTED_CONVERGE_DEADLINE_S = 120.0


def _busiest_leader(c: NetnsCluster, members: str) -> int:
    """The node leading the most of TABLE's partitions on the cluster of ``members``."""
    out = c.cli("table", "info", TABLE, "--members", members, "-o", "json")
    assert out.returncode == 0, out.stderr[-2000:]
    leaders = [int(g["leader"]) for g in json.loads(out.stdout)["partition_groups"]
               if g.get("leader")]
    assert leaders, f"no partition leader on {members}"
    return max(set(leaders), key=leaders.count)


def _status(c: NetnsCluster, dup_id: str, members: str) -> dict[str, dict[str, object]]:
    out = c.cli("dup", "status", TABLE, dup_id, "-o", "json", "--members", members)
    assert out.returncode == 0, out.stderr[-2000:]
    status: dict[str, dict[str, object]] = json.loads(out.stdout)
    return status


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_duplication_between_three_node_clusters_through_leader_faults(
        netns_dup_clusters3: NetnsCluster) -> None:
    """Two clusters of three nodes, a table of 2 partitions x 3 replicas on each,
    duplicated both ways; the writers on both sides also overwrite a few shared
    keys (conflicts for last-writer-wins). The link between the clusters is
    cut; once both sides have a backlog they could not ship, the node leading
    the most partitions of cluster 1 is isolated from everyone (its partitions
    fail over, and the new leaders' shippers must start from the confirmed
    decree, not from what they hold), the one of cluster 2 is SIGKILLed, and
    the cut turns to resets.
    After the heal and the restart both clusters must hold the same records and
    timetags, every acknowledged write among them, every shared key at one
    value that was written to it, and every shipper caught up without error."""
    c = netns_dup_clusters3
    one, two = c.cluster_members(1), c.cluster_members(2)
    for members in (one, two):
        _until_ok(c, "table", "create", TABLE, "--partitions", "2", "--replicas", "3",
                  "--members", members)
    ids = {}
    for members, remote in ((one, "c2"), (two, "c1")):
        added = _ok(c.cli("dup", "add", TABLE, "--remote", remote, "--members", members))
        ids[members] = added.split("added duplication ", 1)[1].split()[0]

    stop_file = c.directory / "dup-writers.stop"
    writers = {tag: c.client_process([str(WORKLOAD), "dup-writer", members, TABLE, tag,
                                      str(stop_file), "shared"])
               for tag, members in (("a", one), ("b", two))}
    killed = None
    try:
        time.sleep(BEFORE_S)
        cut_at = time.monotonic()
        c.partition(c.clusters[0], c.clusters[1])
        time.sleep(CUT_S / 2)  # each side's leaders build a backlog they cannot ship
        shipper, receiver = _busiest_leader(c, one), _busiest_leader(c, two)
        c.isolate(shipper)  # its backlog is the new leaders' to ship
        c.partition(c.clusters[0], c.clusters[1], reset=True)
        c.kill(receiver)
        killed = receiver
        time.sleep(CUT_S / 2)
        healed_at = time.monotonic()
        c.heal()
        c.start_node(receiver)
        killed = None
        time.sleep(AFTER_S)
        outcomes = _stop_writers(writers, stop_file)
    finally:
        _kill_writers(writers)
        if killed is not None:
            c.start_node(killed)

    acked = {tag: {i: at for i, at in out["acked"]} for tag, out in outcomes.items()}
    for tag, writes in acked.items():
        during = [i for i, at in writes.items() if cut_at < at < healed_at]
        assert len(during) > 20, f"writer {tag}: {len(during)} writes acked in the cut"
    written: dict[str, set[str]] = {}  # shared sort key -> every value sent to it
    unique: dict[str, list[str]] = {}  # writer -> its acknowledged own keys
    for tag, out in outcomes.items():
        for i in [*acked[tag], *out["unknown"]]:
            sort_key = dup_shared_key(int(i))
            if sort_key is not None:
                written.setdefault(sort_key.decode(), set()).add(f"{tag}{i}")
        unique[tag] = [f"{tag}{i}" for i in acked[tag] if dup_shared_key(int(i)) is None]

    deadline = time.monotonic() + FAULTED_CONVERGE_DEADLINE_S
    while True:
        left, right = _dump(c, one), _dump(c, two)
        held = {sort_key: value for (_, sort_key), (value, _) in left.items()}
        if left == right and all(held.get(k) == k for keys in unique.values() for k in keys):
            break
        missing = [k for keys in unique.values() for k in keys if held.get(k) != k]
        assert time.monotonic() < deadline, (
            f"not converged {FAULTED_CONVERGE_DEADLINE_S:.0f} s after the heal: {len(left)} vs "
            f"{len(right)} records, differing e.g. {sorted(set(left) ^ set(right))[:5]}, "
            f"{len(missing)} acknowledged writes missing on cluster 1, e.g. {missing[:5]}")
        time.sleep(POLL_INTERVAL_S)
    for shared_key, values in written.items():
        assert held.get(shared_key) in values, (
            f"shared key {shared_key} holds {held.get(shared_key)!r}, never written to it")
    assert {timetag >> 1 & 0x7F for _, timetag in left.values()} == {1, 2}
    # Every shipper, on whichever node leads its partition now, has caught up.
    deadline = time.monotonic() + FAULTED_CONVERGE_DEADLINE_S
    while not all(p["pending_decrees"] == 0 and not p["error"]
                  for members in (one, two) for p in _status(c, ids[members], members).values()):
        assert time.monotonic() < deadline, (
            f"shippers not caught up: {_status(c, ids[one], one)} "
            f"{_status(c, ids[two], two)}")
        time.sleep(POLL_INTERVAL_S)
    print(f"netns dup 3+3: node {shipper} (shipping) isolated, node {receiver} (receiving) "
          f"killed; {len(left)} records converged, {len(written)} shared keys; acked "
          f"a={len(acked['a'])} b={len(acked['b'])}, unknown a={len(outcomes['a']['unknown'])} "
          f"b={len(outcomes['b']['unknown'])}")
