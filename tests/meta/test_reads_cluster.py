"""Read modes on real node processes on 127.0.0.1.

* serializable: a follower answers from its own state without asking the
  leader — it works while the leader and the rest are stopped (SIGSTOP), and
  may be stale (it crashed and missed a write); a linearizable read there
  fails with a retriable error;
* lease (``[meta] read_mode = "lease"``): linearizable reads stay
  linearizable through leader kills, mostly without a heartbeat round, and a
  leader resumed after a pause longer than its lease (a new leader has
  written meanwhile) answers with the new state.

The last test cannot show the stale read a lease counted in ticks would give
(a paused process counts no ticks): on resume the member reads the new
leader's buffered messages before the client's request, so it steps down
first either way. The lease's clock rules are tested exactly, with an
injected clock, in test_read_modes.py.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from quorumlog import node as cluster
from quorumlog import rpc
from quorumlog.errors import DeadlineExceededError, QuorumlogError
from quorumlog.meta import MetaClient
from quorumlog.sim import Operation, OpKind, Verdict, check_history

from .support import (
    Rows,
    all_members_settled,
    kill_and_restart_leader,
    leader_of,
    resume,
    running_cluster,
    stop,
    until_members,
    until_status,
)

KEYS = [f"/lease/{i}" for i in range(4)]
CLIENTS = 6
KILL_ROUNDS = 2
OPERATIONS_AFTER_KILL = 100
STALE_READ_DEADLINE_S = 3.0  # a linearizable read on a cut-off member gives up after this
# Clients of the tests that stop members: an attempt on a stopped member fails
# after this (the default of 5 s would only slow the tests down).
REQUEST_TIMEOUT_S = 1.0


@pytest.fixture
def local_cluster(tmp_path: Path) -> Iterator[Path]:
    with running_cluster(tmp_path / "cluster") as directory:
        yield directory


@pytest.fixture
def lease_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    # Node processes read QUORUMLOG_<SECTION>__<FIELD> overrides of their TOML.
    monkeypatch.setenv("QUORUMLOG_META__READ_MODE", "lease")
    with running_cluster(tmp_path / "cluster") as directory:
        yield directory


def _members(rows: Rows) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    leader = leader_of(rows)
    assert leader is not None
    return leader, [r for r in rows if "meta" in r["roles"] and r is not leader]


def _applied_alike(rows: Rows) -> bool:
    meta = [r for r in rows if "meta" in r["roles"]]
    return all_members_settled(rows) and len({r["applied_index"] for r in meta}) == 1


def test_a_cut_off_follower_serves_serializable_reads_which_may_be_stale(
    local_cluster: Path,
) -> None:
    async def main() -> None:
        async with MetaClient(cluster.meta_addresses(local_cluster),
                              request_timeout_s=REQUEST_TIMEOUT_S) as meta:
            await meta.put("/s", b"v1")
            rows = await until_status(local_cluster, _applied_alike, "every member to apply v1")
            leader, (follower, other) = _members(rows)
            # The follower misses v2 (crashed), then comes back cut off: the
            # leader and the other member are stopped (SIGSTOP), not answering.
            os.kill(follower["pid"], signal.SIGKILL)
            await meta.put("/s", b"v2")
            stop(leader["pid"])
            stop(other["pid"])
            try:
                await asyncio.get_running_loop().run_in_executor(
                    None, cluster.restart_node, local_cluster, follower["id"])
                async with MetaClient([follower["address"]], deadline_s=STALE_READ_DEADLINE_S,
                                      request_timeout_s=REQUEST_TIMEOUT_S) as cut_off:
                    await until_members(
                        [follower["address"]],
                        lambda st: st[0] is not None
                        and st[0].applied_index >= follower["applied_index"],
                        "the restarted follower to apply its log")
                    kv = await cut_off.get("/s", serializable=True)
                    assert kv is not None and kv.value == b"v1"  # its own, stale, state
                    listed = await cut_off.list_keys("/s", serializable=True)
                    assert [k.value for k in listed] == [b"v1"]
                    with pytest.raises(DeadlineExceededError, match="last error") as error:
                        await cut_off.get("/s")  # linearizable: needs the leader
                    assert error.value.retriable
            finally:
                resume(leader["pid"])
                resume(other["pid"])
            kv = await meta.get("/s")
            assert kv is not None and kv.value == b"v2"
            await until_status(local_cluster, _applied_alike, "the follower to catch up")
            async with MetaClient([follower["address"]]) as caught_up:
                kv = await caught_up.get("/s", serializable=True)
                assert kv is not None and kv.value == b"v2"

    rpc.run(main())


async def _client(
    client_id: int, addresses: list[str], stop_event: asyncio.Event, history: list[Operation]
) -> None:
    """Mostly reads (to exercise the lease), puts of unique values."""
    rng = random.Random(client_id)
    async with MetaClient(addresses, deadline_s=8.0) as meta:
        n = 0
        while not stop_event.is_set():
            n += 1
            key = rng.choice(KEYS)
            call = time.monotonic()
            if rng.random() < 0.3:
                value = f"c{client_id}-{n}"
                try:
                    await meta.put(key, value.encode())
                    ret: float | None = time.monotonic()
                except QuorumlogError:
                    ret = None  # unknown outcome: may or may not have applied
                history.append(Operation(client_id, OpKind.PUT, key, value, None, call, ret))
            else:
                try:
                    kv = await meta.get(key)
                except QuorumlogError:
                    continue  # a read with no answer observed nothing
                out = kv.value.decode() if kv else None
                history.append(Operation(client_id, OpKind.GET, key, None, out, call,
                                         time.monotonic()))


@pytest.mark.timeout(300)
def test_lease_reads_stay_linearizable_through_leader_kills(lease_cluster: Path) -> None:
    addresses = cluster.meta_addresses(lease_cluster)
    history: list[Operation] = []

    async def main() -> None:
        stop_event = asyncio.Event()
        tasks = [asyncio.create_task(_client(i, addresses, stop_event, history))
                 for i in range(CLIENTS)]
        try:
            for _ in range(KILL_ROUNDS):
                await kill_and_restart_leader(
                    lease_cluster, lambda: sum(op.outcome_known for op in history),
                    OPERATIONS_AFTER_KILL)
        finally:
            stop_event.set()
            await asyncio.gather(*tasks)

    rpc.run(main())
    result = check_history(history, time_limit_s=60)
    assert result.verdict is Verdict.OK, result.explanation
    rows = cluster.status(lease_cluster)
    assert {r["read_mode"] for r in rows if "meta" in r["roles"]} == {"lease"}
    lease_reads = sum(r["lease_reads"] for r in rows if "meta" in r["roles"])
    round_trips = sum(r["read_index_reads"] for r in rows if "meta" in r["roles"])
    # Since the last restart, most linearizable reads skipped the heartbeat round.
    assert lease_reads > round_trips > 0, (lease_reads, round_trips)


def test_a_leader_resumed_after_a_pause_past_its_lease_answers_with_the_new_state(
    lease_cluster: Path,
) -> None:
    async def main() -> None:
        addresses = cluster.meta_addresses(lease_cluster)
        async with MetaClient(addresses, request_timeout_s=REQUEST_TIMEOUT_S) as meta:
            await meta.put("/p", b"old")
            assert (await meta.get("/p")) is not None  # the leader now holds a lease
            rows = await until_status(lease_cluster, all_members_settled, "a settled group")
            paused, _ = _members(rows)
            stop(paused["pid"])
            try:
                others = [a for a in addresses if a != paused["address"]]
                await until_members(
                    others, lambda st: any(s is not None and s.role == "leader" for s in st),
                    "a new leader")
                await meta.put("/p", b"new")
                # The first member this client asks is the paused one; the read
                # is on its way when it wakes up with its old term and state.
                async with MetaClient([paused["address"], *others]) as reader:
                    read = asyncio.create_task(reader.get("/p"))
                    await asyncio.sleep(0)  # let the read start: it waits on the paused node
                    resume(paused["pid"])
                    kv = await read
            finally:
                resume(paused["pid"])
            assert kv is not None and kv.value == b"new"

    rpc.run(main())


def test_a_client_that_starts_at_a_follower_moves_to_the_leader_it_names(
    local_cluster: Path,
) -> None:
    """A follower passes a client's write on to the leader and names it in the
    answer: the client sends its next requests to the leader itself (before,
    it stayed on the follower, one hop and the follower's CPU more per put)."""
    async def main() -> None:
        rows = await until_status(local_cluster, all_members_settled, "a settled group")
        leader, (follower, _) = _members(rows)
        async with MetaClient([follower["address"]]) as meta:
            await meta.put("/moved", b"1")
            assert meta._leader == leader["address"]
            await meta.put("/moved", b"2")
            kv = await meta.get("/moved")
            assert kv is not None and kv.value == b"2"
            assert meta._leader == leader["address"]

    rpc.run(main())


def test_a_leader_the_client_could_not_reach_is_not_taken_from_a_hint() -> None:
    """Cut off from the leader only, a client keeps going through the members
    that pass its requests on, instead of trying the leader after every answer."""
    async def main() -> None:
        meta = MetaClient(["127.0.0.1:1", "127.0.0.1:2"])
        try:
            meta._unreachable("127.0.0.1:9")
            meta._leader_named("127.0.0.1:9")
            assert meta._leader is None
            meta._leader_named("127.0.0.1:8")
            assert meta._leader == "127.0.0.1:8"
        finally:
            await meta.close()

    rpc.run(main())
