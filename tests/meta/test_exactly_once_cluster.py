"""Exactly-once writes with many requests in flight, on real node processes.

32 callers share one MetaClient (as a bookie's or a stream's tasks do) while
the meta leader is killed with SIGKILL and restarted. Every caller's effects
can be counted exactly:

* each caller CAS-appends to its own key (expected version = its own count):
  a retry applied twice would fail the compare and the caller would see
  ``False``; a retry answered with another request's result would too;
* each caller takes ids from one shared sequence: every id must be handed out
  once, to one caller, with no gap (a gap is an increment applied for nobody).

So every call must return its own result exactly once, with no error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorumlog import node as cluster
from quorumlog import rpc
from quorumlog.meta import MetaClient

from .support import kill_and_restart_leader, running_cluster

CALLERS = 32
KILL_ROUNDS = 2
OPERATIONS_AFTER_KILL = 150  # calls completed without the killed leader, per round
CLIENT_DEADLINE_S = 30.0  # far beyond one election: no call may give up


@pytest.fixture
def local_cluster(tmp_path: Path) -> Iterator[Path]:
    with running_cluster(tmp_path / "cluster") as directory:
        yield directory


async def _caller(
    meta: MetaClient, caller: int, stop: asyncio.Event, ids: list[int], appends: list[int]
) -> None:
    key = f"/exactly-once/{caller}"
    while not stop.is_set():
        count = appends[caller]
        ok = await meta.cas(key, expected_version=count, value=str(count + 1).encode())
        assert ok, f"caller {caller}: CAS at version {count} of its own key answered False"
        appends[caller] = count + 1
        ids.append(await meta.next_id("exactly-once"))


@pytest.mark.timeout(400)
def test_32_callers_on_one_client_get_their_own_results_exactly_once_through_leader_kills(
    local_cluster: Path,
) -> None:
    addresses = cluster.meta_addresses(local_cluster)
    ids: list[int] = []
    appends = [0] * CALLERS

    async def main() -> None:
        async with MetaClient(addresses, deadline_s=CLIENT_DEADLINE_S) as meta:
            stop = asyncio.Event()
            callers = [asyncio.create_task(_caller(meta, i, stop, ids, appends))
                       for i in range(CALLERS)]
            fault_error: AssertionError | None = None
            try:
                for _ in range(KILL_ROUNDS):
                    await kill_and_restart_leader(local_cluster, lambda: len(ids),
                                                  OPERATIONS_AFTER_KILL)
            except AssertionError as exc:  # no progress: the callers' errors say why
                fault_error = exc
            stop.set()
            outcomes = await asyncio.gather(*callers, return_exceptions=True)
            errors = [f"caller {i}: {o!r}" for i, o in enumerate(outcomes) if o is not None]
            assert not errors, "calls failed:\n" + "\n".join(errors)
            if fault_error is not None:
                raise fault_error
            # Every id once, to one caller, and no increment applied for nobody.
            next_id = await meta.next_id("exactly-once")
            assert len(set(ids)) == len(ids), "an id was returned to two calls"
            assert sorted(ids) == list(range(1, next_id)), (
                f"ids 1..{next_id - 1} were applied but {len(ids)} were acknowledged")
            for caller, count in enumerate(appends):
                kv = await meta.get(f"/exactly-once/{caller}")
                assert kv is not None and kv.version == count and kv.value == str(count).encode()

    rpc.run(main())
    assert len(ids) >= KILL_ROUNDS * OPERATIONS_AFTER_KILL
