"""Jepsen-style meta run: concurrent put/get/CAS clients on the client host while
the meta leader is repeatedly cut off from everyone and healed; the history
must be linearizable (quorumlog.sim.check_history). Slow: ``pytest -m slow
tests/netns``."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from quorumlog.sim import Operation, OpKind, Verdict, check_history

from .harness import NetnsCluster

PARTITION_ROUNDS = 4
PARTITION_HOLD_S = 6.0  # several election timeouts (1 s) inside a partition
HEALED_HOLD_S = 4.0
CLIENTS = 5
CHECK_TIME_LIMIT_S = 120.0
WORKLOAD = Path(__file__).with_name("workload.py")
KINDS = {"put": OpKind.PUT, "get": OpKind.GET, "cas": OpKind.CAS}


def to_operation(op: dict[str, object]) -> Operation:
    value = op["input"]
    return Operation(int(str(op["client"])), KINDS[str(op["kind"])], str(op["key"]),
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
