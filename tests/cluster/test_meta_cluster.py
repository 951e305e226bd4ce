"""The metadata service as real node processes on 127.0.0.1.

Concurrent clients run put/get/CAS while the leader is killed with SIGKILL and
restarted, repeatedly; the recorded history must be linearizable (the checker
of quorumlog.sim) and no acknowledged write may be lost.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorumlog import node as cluster
from quorumlog import rpc
from quorumlog.errors import QuorumlogError
from quorumlog.meta import BlockingMetaClient, Compare, CompareTarget, MetaClient, PutOp, RangeOp
from quorumlog.sim import Operation, OpKind, Verdict, check_history

KEYS = [f"/lin/{i}" for i in range(4)]
CLIENTS = 6
KILL_ROUNDS = 3
DEADLINE_S = 30.0


@pytest.fixture
def local_cluster(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "cluster"
    cluster.up(directory, 3)
    try:
        yield directory
    finally:
        cluster.down(directory)


def _leader(directory: Path) -> dict[str, object] | None:
    rows = cluster.status(directory)
    leaders = [r for r in rows if r.get("meta_role") == "leader"]
    return leaders[0] if leaders else None


def _wait(condition: object, what: str, timeout_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if callable(condition) and condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def _cas_value(meta: MetaClient, key: str, expected: str | None, new: str) -> bool:
    compare = (
        Compare(key=key, target=CompareTarget.VERSION, version=0)
        if expected is None
        else Compare(key=key, target=CompareTarget.VALUE, value=expected.encode())
    )
    result = await meta.txn(compares=[compare], success=[PutOp(key=key, value=new.encode())])
    return result.succeeded


async def _client(
    client_id: int, addresses: list[str], stop: asyncio.Event, history: list[Operation],
    acked: dict[str, list[str]],
) -> None:
    rng = random.Random(client_id)
    t0 = time.monotonic
    async with MetaClient(addresses, deadline_s=8.0) as meta:
        n = 0
        while not stop.is_set():
            n += 1
            key = rng.choice(KEYS)
            roll = rng.random()
            value = f"c{client_id}-{n}"
            if roll < 0.4:
                await _put(meta, client_id, key, value, history, acked)
            elif roll < 0.75:
                call = t0()
                try:
                    kv = await meta.get(key)
                except QuorumlogError:
                    continue  # a read with no answer observed nothing
                out = kv.value.decode() if kv else None
                history.append(Operation(client_id, OpKind.GET, key, None, out, call, t0()))
            else:
                try:
                    current = await meta.get(key)
                except QuorumlogError:
                    continue
                expected = current.value.decode() if current else None
                call = t0()
                try:
                    ok: bool | None = await _cas_value(meta, key, expected, value)
                    ret: float | None = t0()
                except QuorumlogError:
                    ok, ret = None, None
                history.append(
                    Operation(client_id, OpKind.CAS, key, (expected, value), ok, call, ret)
                )


async def _put(
    meta: MetaClient, client_id: int, key: str, value: str, history: list[Operation],
    acked: dict[str, list[str]],
) -> None:
    call = time.monotonic()
    try:
        await meta.put(key, value.encode())
    except QuorumlogError:
        history.append(Operation(client_id, OpKind.PUT, key, value, None, call, None))
        return
    history.append(Operation(client_id, OpKind.PUT, key, value, None, call, time.monotonic()))
    acked.setdefault(key, []).append(value)


@pytest.mark.timeout(300)
def test_linearizable_across_leader_kills(local_cluster: Path) -> None:
    addresses = cluster.meta_addresses(local_cluster)
    history: list[Operation] = []
    acked: dict[str, list[str]] = {}

    async def main() -> None:
        stop = asyncio.Event()
        tasks = [
            asyncio.create_task(_client(i, addresses, stop, history, acked))
            for i in range(CLIENTS)
        ]
        loop = asyncio.get_running_loop()
        for _ in range(KILL_ROUNDS):
            before = len(history)
            await loop.run_in_executor(None, _kill_and_restart_leader, local_cluster, history,
                                       before)
        await asyncio.sleep(0.5)
        stop.set()
        await asyncio.gather(*tasks)

    rpc.run(main())
    known = [op for op in history if op.outcome_known]
    assert len(known) > 100, f"too few operations completed: {len(known)}"
    result = check_history(history, time_limit_s=60)
    assert result.verdict is Verdict.OK, result.explanation
    # No acknowledged write lost: every key's final value is one that was written,
    # and a read now sees the last acknowledged CAS/put order's outcome.
    with BlockingMetaClient(addresses) as meta:
        for key in KEYS:
            kv = meta.get(key)
            if acked.get(key):
                assert kv is not None, f"{key} lost every acknowledged write"


def _kill_and_restart_leader(directory: Path, history: list[Operation], before: int) -> None:
    _wait(lambda: _leader(directory) is not None, "a leader")
    leader = _leader(directory)
    assert leader is not None
    os.kill(int(str(leader["pid"])), signal.SIGKILL)
    # Clients must make progress without the old leader...
    _wait(lambda: sum(1 for op in history[before:] if op.outcome_known) >= 20,
          "progress after killing the leader")
    cluster.restart_node(directory, int(str(leader["id"])))
    _wait(lambda: all(r.get("meta_role") in ("leader", "follower")
                      for r in cluster.status(directory)), "the killed node to rejoin")


def test_sessions_expire_and_watch_sees_every_change_in_order(local_cluster: Path) -> None:
    addresses = cluster.meta_addresses(local_cluster)

    async def main() -> None:
        async with MetaClient(addresses) as meta:
            _, start = await meta.range("/w/", prefix=True)
            session = await meta.create_session(ttl_ms=1000)
            await meta.put("/w/ephemeral", b"e", session_id=session)
            for i in range(5):
                await meta.put(f"/w/k{i}", str(i).encode())
            # Kill the leader between writes: the watch resumes by revision.
            loop = asyncio.get_running_loop()
            leader = await loop.run_in_executor(None, _leader, local_cluster)
            assert leader is not None
            os.kill(int(str(leader["pid"])), signal.SIGKILL)
            for i in range(5, 8):
                await meta.put(f"/w/k{i}", str(i).encode())
            # The session is not kept alive: its key must vanish.
            deadline = loop.time() + DEADLINE_S
            while await meta.get("/w/ephemeral") is not None:
                assert loop.time() < deadline, "ephemeral key outlived its session"
                await asyncio.sleep(0.1)
            assert not await meta.keepalive(session)
            await loop.run_in_executor(None, cluster.restart_node, local_cluster,
                                       int(str(leader["id"])))
        async with MetaClient(addresses) as watcher:  # a new client: a reconnect
            seen: list[tuple[str, str, int]] = []
            async for ev in watcher.watch("/w/", prefix=True, start_revision=start + 1):
                seen.append((ev.type.value, ev.kv.key, ev.kv.mod_revision))
                if len(seen) == 10:
                    break
        keys = [k for _, k, _ in seen]
        revisions = [r for _, _, r in seen]
        assert revisions == sorted(revisions) and len(set(revisions)) == len(revisions)
        # The session expires on its own clock (1 s TTL, restarted by the new
        # leader), so its delete may land anywhere after the ephemeral put; every
        # other change comes exactly once, in the order it was made.
        deletes = [i for i, (kind, _, _) in enumerate(seen) if kind == "delete"]
        assert len(deletes) == 1 and seen[deletes[0]][1] == "/w/ephemeral"
        puts = [k for kind, k, _ in seen if kind == "put"]
        assert puts == ["/w/ephemeral"] + [f"/w/k{i}" for i in range(8)]
        assert deletes[0] > keys.index("/w/ephemeral")

    rpc.run(main())


def test_garbage_and_bad_requests_keep_the_cluster_serving(local_cluster: Path) -> None:
    addresses = cluster.meta_addresses(local_cluster)
    host, port = addresses[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"\xff" * 64 + b"GET / HTTP/1.1\r\n\r\n")
        sock.settimeout(5)  # a server that does not close it fails the test (timeout)
        received = b""
        try:
            while chunk := sock.recv(1024):
                received += chunk
        except ConnectionResetError:
            pass
        assert b"HTTP" not in received  # closed, never answered as if it were a request
    with BlockingMetaClient(addresses) as meta:
        assert meta.put("/ok", b"1") >= 1
        with pytest.raises(QuorumlogError, match="keys must not be empty"):
            meta.put("", b"x")
        with pytest.raises(QuorumlogError, match="session 999 does not exist"):
            meta.put("/eph", b"x", session_id=999)
        kv = meta.get("/ok")
        assert kv is not None and kv.value == b"1"
        rng = meta.txn(success=[RangeOp(key="/", prefix=True)])
        assert rng.succeeded


def test_cli_status_json_finds_the_leader(local_cluster: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "quorumlog", "status", "--json", "--dir", str(local_cluster)],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    nodes = json.loads(out.stdout)["nodes"]
    assert len(nodes) == 3
    assert sum(1 for n in nodes if n["meta_role"] == "leader") == 1
    assert all(isinstance(n["pid"], int) and n["roles"] == ["meta", "bookie", "table"]
               for n in nodes)
    assert all(n["bookie"]["state"] == "writable" for n in nodes)


@pytest.mark.timeout(300)
def test_membership_grows_1_to_3_and_shrinks_back_while_clients_run(tmp_path: Path) -> None:
    directory = tmp_path / "grow"
    cluster.up(directory, 1)
    history: list[Operation] = []
    acked: dict[str, list[str]] = {}
    try:
        async def main() -> None:
            addresses = cluster.meta_addresses(directory)
            stop = asyncio.Event()
            tasks = [asyncio.create_task(_client(i, addresses, stop, history, acked))
                     for i in range(3)]
            loop = asyncio.get_running_loop()
            async with MetaClient(addresses) as admin:
                added = []
                for learner_first in (True, False):
                    info = await loop.run_in_executor(None, cluster.add_node, directory)
                    added.append(info)
                    if learner_first:
                        _, learners = await admin.change_member("add_learner", info.id,
                                                                info.address)
                        assert info.id in learners
                        voters, _ = await admin.change_member("promote", info.id)
                    else:
                        voters, _ = await admin.change_member("add", info.id, info.address)
                    assert info.id in voters
                # The new voters settle as followers of the one leader (poll, deadline).
                deadline = loop.time() + DEADLINE_S
                while True:
                    rows = await loop.run_in_executor(None, cluster.status, directory)
                    settled = {r["id"] for r in rows
                               if r.get("meta_role") in ("leader", "follower")}
                    if settled == {1, 2, 3}:
                        break
                    assert loop.time() < deadline, f"members did not settle: {rows}"
                    await asyncio.sleep(0.1)
                for info in reversed(added):
                    voters, _ = await admin.change_member("remove", info.id)
                    assert info.id not in voters
                    await loop.run_in_executor(None, cluster.stop_node, directory, info.id)
                assert await admin.put("/after-shrink", b"1") > 0
            stop.set()
            await asyncio.gather(*tasks)

        rpc.run(main())
    finally:
        cluster.down(directory)
    assert sum(1 for op in history if op.outcome_known) > 20
    result = check_history(history, time_limit_s=60)
    assert result.verdict is Verdict.OK, result.explanation
