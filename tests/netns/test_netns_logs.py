"""Jepsen-style ledger and stream runs on three "hosts" in network namespaces.

A writer (or producer) and a tailing reader run on the client host while the
test partitions a bookie of the ensemble, the writer from one node, and the
meta leader; at the end a second client on the far side of a partition takes
the log over (ledger: opens it with recovery; stream: a producer with
``steal``), so the partitioned old writer must be fenced. After heal the log is
read back and checker.py looks for anomalies: a lost or changed acknowledged
entry, a read past the LAC, a gap, a duplicate, a reordering, a fenced writer
that got an entry acknowledged (test_checkers.py plants each one).

The quick variants (default run) do the takeover only; the long ones (``pytest
-m slow tests/netns/test_netns_logs.py``) run ``FAULT_ROUNDS`` rounds of every
fault first. docs/jepsen.md has the results.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from .checker import LedgerHistory, StreamHistory, check_ledger, check_stream
from .harness import CLIENT, LineReader, NetnsCluster

WORKLOAD = str(Path(__file__).with_name("workload.py"))
ENTRIES_BETWEEN_FAULTS = 20  # acknowledged entries the writer must make between faults
FAULT_ROUNDS = 3
PROCESS_EXIT_TIMEOUT_S = 90.0
STREAM = "jepsen"


@dataclass
class Fault:
    """One fault of a run: its name and how to inject it (heal ends it)."""

    name: str
    inject: Callable[[NetnsCluster, list[str]], None]  # (cluster, current ensemble)


def node_of(c: NetnsCluster, address: str) -> int:
    return next(i for i in c.node_ids if c.rpc_address(i) == address)


def isolate_bookie(c: NetnsCluster, ensemble: list[str]) -> None:
    c.isolate(node_of(c, ensemble[0]))


def isolate_meta_leader(c: NetnsCluster, ensemble: list[str]) -> None:
    leader = c.leader()
    assert leader is not None, "no meta leader before the fault"
    c.isolate(leader)


def cut_writer_from_node(c: NetnsCluster, ensemble: list[str]) -> None:
    c.partition([CLIENT], [takeover_node(c, ensemble)])


def cut_writer_from_meta_leader(c: NetnsCluster, ensemble: list[str]) -> None:
    leader = c.leader()
    assert leader is not None, "no meta leader before the fault"
    c.partition([CLIENT], [leader])


FAULTS = [Fault("isolate a bookie of the ensemble", isolate_bookie),
          Fault("isolate the meta leader", isolate_meta_leader),
          Fault("cut the writer from a bookie of the ensemble", cut_writer_from_node),
          Fault("cut the writer from the meta leader", cut_writer_from_meta_leader)]


def finish(proc: subprocess.Popen[str]) -> list[dict[str, Any]]:
    """Wait for a workload and return its JSON lines (all, if the pump had none)."""
    stdout, stderr = proc.communicate(timeout=PROCESS_EXIT_TIMEOUT_S)
    assert proc.returncode == 0, stderr[-3000:]
    return [json.loads(line) for line in stdout.splitlines()]


def kill(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def takeover_node(c: NetnsCluster, ensemble: list[str]) -> int:
    """The node the second client runs on: a bookie of the ensemble that is not
    the meta leader (the old writer still reaches the leader and the other
    bookies: only fencing can stop it)."""
    in_ensemble = [node_of(c, a) for a in ensemble]
    leader = c.leader()
    return next((i for i in in_ensemble if i != leader), in_ensemble[0])


# -- ledgers ------------------------------------------------------------------

@dataclass
class LedgerRun:
    acked: dict[int, bytes] = field(default_factory=dict)
    writer_failed: str | None = None
    ensemble: list[str] = field(default_factory=list)

    def take(self, record: dict[str, Any]) -> None:
        if "acked" in record:
            self.acked[record["acked"]] = record["value"].encode()
        elif "failed" in record:
            self.writer_failed = f"{record['error']}: {record['message']}"

    def wait_acks(self, out: LineReader, count: int) -> None:
        goal = len(self.acked) + count
        while len(self.acked) < goal:
            self.take(out.next())
            assert self.writer_failed is None, f"writer failed: {self.writer_failed}"


def run_ledger(c: NetnsCluster, tmp_path: Path, faults: list[Fault]) -> None:
    stop = tmp_path / "stop"
    writer = c.client_process([WORKLOAD, "ledger-writer", c.meta_members, str(stop)])
    procs = [writer]
    run = LedgerRun()
    try:
        out = LineReader(writer, c)
        first = out.next()
        ledger_id, run.ensemble = first["ledger"], first["ensemble"]
        # The reader ends by itself once the ledger is closed and read to its end.
        reader = c.client_process([WORKLOAD, "ledger-reader", c.meta_members, str(ledger_id),
                                   str(tmp_path / "reader-never-stops")])
        procs.append(reader)
        run.wait_acks(out, ENTRIES_BETWEEN_FAULTS)
        for fault in faults:
            fault.inject(c, current_ensemble(c, ledger_id, run.ensemble))
            run.wait_acks(out, ENTRIES_BETWEEN_FAULTS)
            c.heal()
            run.wait_acks(out, ENTRIES_BETWEEN_FAULTS)
        # The takeover: the writer is cut from one node of its ensemble, and a
        # client beside that node opens the ledger with recovery.
        ensemble = current_ensemble(c, ledger_id, run.ensemble)
        far = takeover_node(c, ensemble)
        c.partition([CLIENT], [far])
        recover = c.process_on(far, [WORKLOAD, "ledger-recover", c.meta_members,
                                     str(ledger_id)])
        procs.append(recover)
        recovered = next(r["recovered"] for r in finish(recover) if "recovered" in r)
        while run.writer_failed is None:
            run.take(out.next())
        c.heal()
        stop.touch()
        for line in out.rest(PROCESS_EXIT_TIMEOUT_S):
            run.take(line)
        seen_lines = finish(reader)
        final_lines = finish(c.client_process([WORKLOAD, "ledger-final", c.meta_members,
                                               str(ledger_id)]))
    finally:
        kill(procs)
    final = [v.encode() for v in final_lines[-1]["final"]]
    seen = [(r["seen"], r["value"].encode()) for r in seen_lines if "seen" in r]
    errors = [r for r in seen_lines if "reader_error" in r]
    print(f"netns ledger: {len(run.acked)} entries acknowledged, {len(final)} in the "
          f"ledger, recovered at {recovered}, reader saw {len(seen)} ({len(errors)} reader "
          f"errors), {len(faults)} faults + takeover; the old writer failed with "
          f"{run.writer_failed}")
    anomalies = check_ledger(LedgerHistory(acked=run.acked, seen=[seen], final=final,
                                           recovered_last=recovered,
                                           writer_failed=run.writer_failed is not None))
    assert anomalies == [], anomalies
    assert len(seen) > 0, "the reader saw nothing"


def current_ensemble(c: NetnsCluster, ledger_id: int, fallback: list[str]) -> list[str]:
    """The bookies of the ledger's last fragment (the writer may have replaced one)."""
    info = c.cli("ledger", "info", str(ledger_id), "--members", c.meta_members, "--json")
    if info.returncode != 0:
        return fallback
    ensembles = json.loads(info.stdout).get("fragments") or []
    return list(ensembles[-1]["bookies"]) if ensembles else fallback


def test_partitioned_ledger_writer_is_fenced_and_loses_nothing(
        netns_cluster: NetnsCluster, tmp_path: Path) -> None:
    run_ledger(netns_cluster, tmp_path, faults=[])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ledger_through_bookie_writer_and_meta_partitions(
        netns_cluster: NetnsCluster, tmp_path: Path) -> None:
    run_ledger(netns_cluster, tmp_path, faults=FAULTS * FAULT_ROUNDS)


# -- streams ------------------------------------------------------------------

@dataclass
class ProducerRun:
    """What one producer's lines said: sequence numbers acked / with unknown outcome."""

    name: str
    acked: list[int] = field(default_factory=list)
    unknown: list[int] = field(default_factory=list)
    fenced: bool = False

    def take(self, record: dict[str, Any]) -> None:
        if "acked" in record:
            self.acked.append(record["acked"])
        elif "unknown" in record:
            self.unknown.append(record["unknown"])
        if "fenced" in record:
            self.fenced = True

    def wait_acks(self, out: LineReader, count: int) -> None:
        goal = len(self.acked) + count
        while len(self.acked) < goal:
            self.take(out.next())
            assert not self.fenced, f"producer {self.name} fenced without a takeover"


def parse_message(value: str) -> tuple[str, int]:
    producer, seq = value.rsplit("-", 1)
    return producer, int(seq)


def run_stream(c: NetnsCluster, tmp_path: Path, faults: list[Fault]) -> None:
    created = c.cli("stream", "create", STREAM, "--members", c.meta_members)
    assert created.returncode == 0, created.stderr
    stop = tmp_path / "stop"
    first = c.client_process([WORKLOAD, "stream-producer", c.meta_members, STREAM, "p",
                              str(stop)])
    reader_stop = tmp_path / "reader-stop"
    reader = c.client_process([WORKLOAD, "stream-reader", c.meta_members, STREAM,
                               str(reader_stop)])
    procs = [first, reader]
    p, q = ProducerRun("p"), ProducerRun("q")
    try:
        out = LineReader(first, c)
        p.wait_acks(out, ENTRIES_BETWEEN_FAULTS)
        for fault in faults:
            fault.inject(c, stream_ensemble(c))
            p.wait_acks(out, ENTRIES_BETWEEN_FAULTS)
            c.heal()
            p.wait_acks(out, ENTRIES_BETWEEN_FAULTS)
        # The takeover: p is cut from a bookie of its ledger, and a producer
        # beside that bookie steals the stream.
        far = takeover_node(c, stream_ensemble(c))
        c.partition([CLIENT], [far])
        second = c.process_on(far, [WORKLOAD, "stream-producer", c.meta_members, STREAM, "q",
                                    str(stop), "steal"])
        procs.append(second)
        q_out = LineReader(second, c)
        q.wait_acks(q_out, ENTRIES_BETWEEN_FAULTS)
        while not p.fenced:
            p.take(out.next())
        c.heal()
        stop.touch()
        for line in q_out.rest(PROCESS_EXIT_TIMEOUT_S):
            q.take(line)
        for line in out.rest(PROCESS_EXIT_TIMEOUT_S):
            p.take(line)
        # The tailing reader catches up with everything acknowledged, then stops.
        tail = LineReader(reader, c)
        reader_lines: list[dict[str, Any]] = []
        acked = {("p", s) for s in p.acked} | {("q", s) for s in q.acked}
        seen: set[tuple[str, int]] = set()
        while not acked <= seen:
            line = tail.next()
            reader_lines.append(line)
            if "seen" in line:
                seen.add(parse_message(line["seen"]))
        reader_stop.touch()
        reader_lines += tail.rest(PROCESS_EXIT_TIMEOUT_S)
        final = finish(c.client_process([WORKLOAD, "stream-final", c.meta_members, STREAM]))
    finally:
        kill(procs)
    consumed = [parse_message(v) for v in final[-1]["consumed"]]
    views: dict[int, list[tuple[str, int]]] = {}
    for r in reader_lines:
        if "seen" in r:
            views.setdefault(r["reader"], []).append(parse_message(r["seen"]))
    print(f"netns stream: p acked {len(p.acked)} ({len(p.unknown)} unknown), q acked "
          f"{len(q.acked)} ({len(q.unknown)} unknown), {len(consumed)} consumed, readers saw "
          f"{[len(v) for v in views.values()]}, {len(faults)} faults + takeover")
    anomalies = check_stream(StreamHistory(
        acked={"p": p.acked, "q": q.acked}, unknown={"p": p.unknown, "q": q.unknown},
        consumed=consumed, seen=list(views.values())))
    assert anomalies == [], anomalies
    assert p.fenced and sum(len(v) for v in views.values()) > 0


def stream_ensemble(c: NetnsCluster) -> list[str]:
    """The bookies of the stream's last ledger (its open one)."""
    info = c.cli("stream", "info", STREAM, "--members", c.meta_members, "--json")
    assert info.returncode == 0, info.stderr
    ledgers = json.loads(info.stdout)["partitions"][0]["ledgers"]
    return current_ensemble(c, int(ledgers[-1]["ledger_id"]), [])


def test_partitioned_producer_is_fenced_and_stream_loses_nothing(
        netns_cluster: NetnsCluster, tmp_path: Path) -> None:
    run_stream(netns_cluster, tmp_path, faults=[])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_stream_through_bookie_writer_and_meta_partitions(
        netns_cluster: NetnsCluster, tmp_path: Path) -> None:
    run_stream(netns_cluster, tmp_path, faults=FAULTS * FAULT_ROUNDS)
