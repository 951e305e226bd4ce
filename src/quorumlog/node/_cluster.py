"""A local development cluster of node processes on 127.0.0.1.

``up`` writes one TOML config per node into ``DIR/node-N/``, starts each node
as a detached ``python -m quorumlog node`` process (logs in ``node.log``),
records pids and addresses in ``DIR/cluster.json``, and waits until a meta
leader is elected and every node answers. ``down`` stops them (SIGTERM, then
SIGKILL after a deadline). ``status`` asks every node for its Raft state.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from quorumlog import rpc
from quorumlog.errors import DeadlineExceededError, QuorumlogError, UsageError
from quorumlog.meta._service import MetaStatusRequest

DEFAULT_DIR = Path(os.environ.get("QUORUMLOG_CLUSTER_DIR", ".quorumlog/cluster"))
CLUSTER_FILE = "cluster.json"
UP_TIMEOUT_S = 30.0
DOWN_TIMEOUT_S = 10.0
STATUS_TIMEOUT_S = 2.0
POLL_INTERVAL_S = 0.1


@dataclass(slots=True)
class NodeInfo:
    id: int
    pid: int
    address: str
    metrics: str
    roles: list[str]
    config: str
    log: str


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def write_configs(directory: Path, nodes: int) -> list[tuple[int, Path, str, str]]:
    meta_ids = list(range(1, min(nodes, 3) + 1)) if nodes >= 3 else [1]
    addresses = {i: f"127.0.0.1:{free_port()}" for i in range(1, nodes + 1)}
    members = ", ".join(f'"{i}={addresses[i]}"' for i in meta_ids)
    out = []
    for i in range(1, nodes + 1):
        node_dir = directory / f"node-{i}"
        node_dir.mkdir(parents=True, exist_ok=True)
        metrics = f"127.0.0.1:{free_port()}"
        text = (
            f"[node]\nid = {i}\ndata_dir = \"{node_dir / 'data'}\"\n"
            f"listen = \"{addresses[i]}\"\nmetrics_listen = \"{metrics}\"\n"
            f"roles = [\"meta\"]\n\n[meta]\nmembers = [{members}]\nbootstrap = true\n"
        )
        if i not in meta_ids:
            raise UsageError("nodes beyond the meta group need the bookie role (not built yet)")
        path = node_dir / "node.toml"
        path.write_text(text)
        out.append((i, path, addresses[i], metrics))
    return out


def start_node(config_path: Path) -> subprocess.Popen[bytes]:
    log = (config_path.parent / "node.log").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "quorumlog", "node", "--config", str(config_path)],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


def up(directory: Path, nodes: int) -> list[NodeInfo]:
    if nodes < 1 or nodes > 3:
        raise UsageError("--nodes must be 1..3 until bookies join the node process")
    directory = directory.resolve()
    if (directory / CLUSTER_FILE).exists() and any(_alive(n.pid) for n in load(directory)):
        raise UsageError(f"a cluster is already running in {directory}; run `quorumlog down` first")
    directory.mkdir(parents=True, exist_ok=True)
    infos = []
    for node_id, path, address, metrics in write_configs(directory, nodes):
        proc = start_node(path)
        infos.append(NodeInfo(node_id, proc.pid, address, metrics, ["meta"], str(path),
                              str(path.parent / "node.log")))
    save(directory, infos)
    wait_healthy(infos, UP_TIMEOUT_S)
    return infos


def restart_node(directory: Path, node_id: int) -> NodeInfo:
    """Start a stopped (or killed) node again with its existing config and data."""
    infos = load(directory)
    for info in infos:
        if info.id == node_id:
            # A node killed a moment ago may still be exiting: give it a moment.
            deadline = time.monotonic() + DOWN_TIMEOUT_S
            while _alive(info.pid) and time.monotonic() < deadline:
                time.sleep(POLL_INTERVAL_S)
            if _alive(info.pid):
                raise UsageError(f"node {node_id} is still running (pid {info.pid})")
            info.pid = start_node(Path(info.config)).pid
            save(directory, infos)
            return info
    raise UsageError(f"no node {node_id} in {directory}")


def add_node(directory: Path) -> NodeInfo:
    """Start one more node that joins the meta group (``bootstrap = false``).

    It is not a member until a ``quorumlog meta member add`` commits; until then
    it waits for the leader to contact it.
    """
    directory = directory.resolve()
    infos = load(directory)
    node_id = max(i.id for i in infos) + 1
    address, metrics = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    members = [f'"{i.id}={i.address}"' for i in infos if "meta" in i.roles]
    members.append(f'"{node_id}={address}"')
    node_dir = directory / f"node-{node_id}"
    node_dir.mkdir(parents=True, exist_ok=True)
    path = node_dir / "node.toml"
    path.write_text(
        f"[node]\nid = {node_id}\ndata_dir = \"{node_dir / 'data'}\"\n"
        f"listen = \"{address}\"\nmetrics_listen = \"{metrics}\"\nroles = [\"meta\"]\n\n"
        f"[meta]\nmembers = [{', '.join(members)}]\nbootstrap = false\n"
    )
    info = NodeInfo(node_id, start_node(path).pid, address, metrics, ["meta"], str(path),
                    str(node_dir / "node.log"))
    save(directory, [*infos, info])
    return info


def stop_node(directory: Path, node_id: int) -> None:
    """SIGTERM one node of the local cluster and wait for it to exit."""
    for info in load(directory):
        if info.id == node_id and _alive(info.pid):
            os.kill(info.pid, signal.SIGTERM)
            deadline = time.monotonic() + DOWN_TIMEOUT_S
            while _alive(info.pid) and time.monotonic() < deadline:
                time.sleep(POLL_INTERVAL_S)
            if _alive(info.pid):
                os.kill(info.pid, signal.SIGKILL)


def save(directory: Path, infos: list[NodeInfo]) -> None:
    tmp = directory / (CLUSTER_FILE + ".tmp")
    tmp.write_text(json.dumps({"nodes": [asdict(i) for i in infos]}, indent=2))
    tmp.replace(directory / CLUSTER_FILE)


def load(directory: Path) -> list[NodeInfo]:
    path = directory.resolve() / CLUSTER_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(
            f"no local cluster in {directory} (no {CLUSTER_FILE}); start one with `quorumlog up`"
        ) from None
    return [NodeInfo(**n) for n in data["nodes"]]


def down(directory: Path) -> list[int]:
    infos = load(directory)
    stopped = []
    for info in infos:
        if _alive(info.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(info.pid, signal.SIGTERM)
            stopped.append(info.pid)
    deadline = time.monotonic() + DOWN_TIMEOUT_S
    while any(_alive(p) for p in stopped) and time.monotonic() < deadline:
        time.sleep(POLL_INTERVAL_S)
    for pid in stopped:
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    return stopped


def _alive(pid: int) -> bool:
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
        if waited == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def _status_async(infos: list[NodeInfo]) -> list[dict[str, Any]]:
    pool = rpc.Pool()
    try:
        async def one(info: NodeInfo) -> dict[str, Any]:
            row: dict[str, Any] = {**asdict(info), "alive": _alive(info.pid)}
            try:
                st = await pool.call(info.address, MetaStatusRequest(), timeout_s=STATUS_TIMEOUT_S)
            except QuorumlogError as exc:
                row.update(meta_role="unreachable", error=exc.message)
                return row
            row.update(meta_role=st.role, term=st.term, leader=st.leader,
                       commit_index=st.commit_index, applied_index=st.applied_index,
                       revision=st.revision, voters=st.voters)
            return row

        return list(await asyncio.gather(*(one(i) for i in infos)))
    finally:
        await pool.close()


def status(directory: Path) -> list[dict[str, Any]]:
    return rpc.run(_status_async(load(directory)))


def wait_healthy(infos: list[NodeInfo], timeout_s: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    rows: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        rows = rpc.run(_status_async(infos))
        dead = [r for r in rows if not r["alive"]]
        if dead:
            raise QuorumlogError(
                f"node {dead[0]['id']} exited during start-up; see {dead[0]['log']}"
            )
        leaders = {r.get("leader") for r in rows}
        if all(r["meta_role"] != "unreachable" for r in rows) and len(leaders) == 1 and (
            any(r["meta_role"] == "leader" for r in rows)
        ):
            return rows
        time.sleep(POLL_INTERVAL_S)
    raise DeadlineExceededError(
        f"the cluster did not become healthy within {timeout_s:.0f} s: "
        + "; ".join(f"node {r['id']}: {r.get('meta_role')}" for r in rows)
    )


def meta_addresses(directory: Path) -> list[str]:
    return [n.address for n in load(directory) if "meta" in n.roles]
