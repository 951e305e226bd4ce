"""A local development cluster of node processes on 127.0.0.1.

``up`` writes one TOML config per node into ``DIR/node-N/``, starts each node
as a detached ``python -m quorumlog node`` process (logs in ``node.log``),
records pids and addresses in ``DIR/cluster.json``, and waits until a meta
leader is elected, every node answers and every bookie is registered in meta
and writable. ``up`` on a stopped cluster starts the same nodes again with
their configs (same addresses: a bookie's id is its address, and its
directories hold a cookie naming that id). Roles: meta on the first 3 nodes
(the first 1 when fewer than 3), bookie on all. ``down`` stops them (SIGTERM,
then SIGKILL after a deadline). ``status`` asks every node for its Raft state
and bookie state. ``stop`` stops one node; ``restart`` starts it again and
waits until it serves (or reports the ``error:`` line it died with).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from quorumlog import rpc
from quorumlog.errors import DeadlineExceededError, QuorumlogError, UsageError
from quorumlog.meta import MetaStatusRequest
from quorumlog.proto import BookieStatusRequest

DEFAULT_DIR = Path(os.environ.get("QUORUMLOG_CLUSTER_DIR", ".quorumlog/cluster"))
CLUSTER_FILE = "cluster.json"
UP_TIMEOUT_S = 60.0
# free_port(): where the kernel's ephemeral range is read, the range used when it cannot be,
# the lowest port handed out (above the registered services most machines run), the
# smallest span worth picking from, and how many random ports to try before bind(0).
EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
EPHEMERAL_RANGE_DEFAULT = (32768, 60999)
FREE_PORT_MIN = 20000
FREE_PORT_SPAN_MIN = 1000
FREE_PORT_TRIES = 64
PORT_MAX = 65535
# `quorumlog restart`: how long a restarted node may take to serve every role
# (a bookie replays its journal first).
RESTART_TIMEOUT_S = 60.0
NODES_MAX = 32  # a local cluster on one machine
# Local clusters keep their bookies small: journal segments and write caches
# are allocated per node.
LOCAL_BOOKIE_TOML = (
    "journal_segment_size_bytes = 8388608\n"
    "session_ttl_ms = 4000\n"
    "\n[bookie.storage]\n"
    "write_cache_max_bytes = 33554432\n"
    "read_cache_max_bytes = 16777216\n"
    "entry_log_max_bytes = 67108864\n"
    "index_write_buffer_bytes = 4194304\n"
    "index_block_cache_bytes = 8388608\n"
)
# ... and their Raft WALs: every segment is preallocated, one per table
# partition replica (a local cluster's nodes share one disk).
LOCAL_META_WAL_SEGMENT_BYTES = 8 * 1024 * 1024
LOCAL_TABLE_TOML = (
    "wal_segment_size_bytes = 1048576\n"
    "journal_segment_size_bytes = 8388608\n"
)
RACKS = 3  # local bookies get labels rack = rack-1..rack-3, zone = zone-1
DOWN_TIMEOUT_S = 10.0
STATUS_TIMEOUT_S = 2.0
POLL_INTERVAL_S = 0.1
# A node that exits during start-up printed why as an "error: ..." line
# (node._process.run_node); up/restart read it from the end of its log.
LOG_TAIL_BYTES = 64 * 1024
ERROR_PREFIX = "error: "


@dataclass(slots=True)
class NodeInfo:
    """One node of a cluster file; ``address`` and ``metrics`` are the addresses the
    node advertises (``[node] advertise``/``metrics_advertise``): what ``status`` dials."""

    id: int
    pid: int
    address: str
    metrics: str
    roles: list[str]
    config: str
    log: str


def _ephemeral_port_range() -> tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections (and of bind(0))."""
    try:
        low, high = Path(EPHEMERAL_RANGE_FILE).read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return EPHEMERAL_RANGE_DEFAULT


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A port on 127.0.0.1 that no socket holds now, chosen outside the kernel's ephemeral
    range. A port from bind(0) is free when asked, but it comes from the range the kernel
    also gives to outgoing connections, so on a busy machine (clients, other clusters) one
    of them could take it before the node binds it, and the node failed to start."""
    low, high = _ephemeral_port_range()
    if low - FREE_PORT_MIN > FREE_PORT_SPAN_MIN:
        candidates = range(FREE_PORT_MIN, low)
    elif PORT_MAX - high > FREE_PORT_SPAN_MIN:
        candidates = range(high + 1, PORT_MAX + 1)
    else:
        candidates = range(0)
    rng = random.SystemRandom()
    for _ in range(FREE_PORT_TRIES if candidates else 0):
        port = rng.choice(candidates)
        if _bindable(port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        chosen: int = sock.getsockname()[1]
        return chosen


def free_ports(count: int, *, taken: Iterable[int] = ()) -> list[int]:
    """``count`` distinct free ports, none of ``taken`` (the ports of a cluster's
    stopped nodes, which no socket holds now). Each :func:`free_port` is free
    when asked but not reserved, so two asks can return the same port: a
    cluster of 3 nodes asks for 6, and found two of them equal about once in
    a thousand starts (a node then failed with its metrics port in use)."""
    excluded = set(taken)
    ports: list[int] = []
    for _ in range(count * FREE_PORT_TRIES):
        if len(ports) == count:
            break
        port = free_port()
        if port not in excluded:
            excluded.add(port)
            ports.append(port)
    if len(ports) < count:
        raise QuorumlogError(f"found {len(ports)} distinct free ports on 127.0.0.1, "
                             f"not {count}: free some ports and try again")
    return ports


def node_roles(node_id: int, nodes: int) -> list[str]:
    """meta on the first 3 nodes (the first 1 when fewer than 3), bookie and table on all."""
    meta_count = 3 if nodes >= 3 else 1
    return ["meta", "bookie", "table"] if node_id <= meta_count else ["bookie", "table"]


def security_toml(security: rpc.RpcSecurityConfig) -> str:
    """The ``[security]`` table of a node config (fields left at None are omitted)."""
    lines = ["[security]"]
    for name in security.__struct_fields__:
        value = getattr(security, name)
        if value is None:
            continue
        text = str(value).lower() if isinstance(value, bool) else json.dumps(value)
        lines.append(f"{name} = {text}")
    return "\n".join(lines) + "\n"


def cluster_security() -> rpc.RpcSecurityConfig | None:
    """The security this process uses (``quorumlog --security``, ``QUORUMLOG_SECURITY__*``)
    when it sets TLS or a token: local clusters started from here get it too."""
    security = rpc.default_security()
    return security if security.tls_enabled or security.token is not None else None


def node_toml(node_id: int, node_dir: Path, *, address: str, metrics: str, roles: list[str],
              members: str, bootstrap: bool) -> str:
    role_list = ", ".join(f'"{r}"' for r in roles)
    text = (
        f"[node]\nid = {node_id}\ndata_dir = \"{node_dir / 'data'}\"\n"
        f"listen = \"{address}\"\nmetrics_listen = \"{metrics}\"\n"
        f"roles = [{role_list}]\n\n[meta]\nmembers = [{members}]\n"
        f"bootstrap = {'true' if bootstrap else 'false'}\n"
        f"wal_segment_size_bytes = {LOCAL_META_WAL_SEGMENT_BYTES}\n"
    )
    if "bookie" in roles:
        rack = (node_id - 1) % RACKS + 1
        text += (f"\n[bookie]\nlabels = {{ rack = \"rack-{rack}\", zone = \"zone-1\" }}\n"
                 + LOCAL_BOOKIE_TOML)
    if "table" in roles:
        text += "\n[table]\n" + LOCAL_TABLE_TOML
    security = cluster_security()
    if security is not None:
        text += "\n" + security_toml(security)
    return text


def write_configs(directory: Path, nodes: int) -> list[tuple[int, Path, str, str, list[str]]]:
    ports = free_ports(2 * nodes)  # each node's rpc and metrics ports
    addresses = {i: f"127.0.0.1:{ports[i - 1]}" for i in range(1, nodes + 1)}
    meta_ids = [i for i in addresses if "meta" in node_roles(i, nodes)]
    members = ", ".join(f'"{i}={addresses[i]}"' for i in meta_ids)
    out = []
    for i in range(1, nodes + 1):
        node_dir = directory / f"node-{i}"
        node_dir.mkdir(parents=True, exist_ok=True)
        metrics = f"127.0.0.1:{ports[nodes + i - 1]}"
        roles = node_roles(i, nodes)
        path = node_dir / "node.toml"
        path.write_text(node_toml(i, node_dir, address=addresses[i], metrics=metrics,
                                  roles=roles, members=members, bootstrap=True))
        out.append((i, path, addresses[i], metrics, roles))
    return out


def start_node(config_path: Path) -> subprocess.Popen[bytes]:
    log = (config_path.parent / "node.log").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "quorumlog", "node", "--config", str(config_path)],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


def up(directory: Path, nodes: int = 3) -> list[NodeInfo]:
    """Start ``nodes`` node processes and wait until meta and every bookie are ready.

    Meta runs on the first 3 nodes (1 when ``nodes`` < 3), a bookie on every
    node. Returns when a meta leader is elected and every bookie is
    registered in meta and writable.
    """
    if nodes < 1 or nodes > NODES_MAX:
        raise UsageError(f"--nodes must be in 1..{NODES_MAX}")
    directory = directory.resolve()
    if (directory / CLUSTER_FILE).exists():
        existing = load(directory)
        if any(_alive(n.pid) for n in existing):
            raise UsageError(
                f"a cluster is already running in {directory}; run `quorumlog down` first")
        return _start_again(directory, existing, nodes)
    directory.mkdir(parents=True, exist_ok=True)
    infos = []
    for node_id, path, address, metrics, roles in write_configs(directory, nodes):
        proc = start_node(path)
        infos.append(NodeInfo(node_id, proc.pid, address, metrics, roles, str(path),
                              str(path.parent / "node.log")))
    save(directory, infos)
    wait_healthy(infos, UP_TIMEOUT_S)
    wait_table_nodes(infos, UP_TIMEOUT_S)
    return infos


def _start_again(directory: Path, infos: list[NodeInfo], nodes: int) -> list[NodeInfo]:
    """A stopped cluster starts with its own configs: the same addresses, so its
    bookies keep their ids (their cookies name them) and ledgers stay readable."""
    if len(infos) != nodes:
        raise UsageError(
            f"the stopped cluster in {directory} has {len(infos)} node(s): start it again with "
            f"--nodes {len(infos)}, or remove {directory} for a new cluster")
    for info in infos:
        info.pid = start_node(Path(info.config)).pid
    save(directory, infos)
    wait_healthy(infos, UP_TIMEOUT_S)
    wait_table_nodes(infos, UP_TIMEOUT_S)
    return infos


def restart_node(directory: Path, node_id: int, *,
                 serving_timeout_s: float | None = None) -> NodeInfo:
    """Start a stopped (or killed) node again with its existing config and data.

    With ``serving_timeout_s`` (``quorumlog restart`` passes RESTART_TIMEOUT_S),
    wait until every role of the node answers (``wait_serving``): a node that
    exits during start-up raises QuorumlogError with the ``error:`` line it
    printed. Without it, return once the process is started (harnesses that
    wait for a condition of their own, or restart a node of a cluster that has
    no quorum, so that its bookie cannot start).
    """
    infos = load(directory)
    for info in infos:
        if info.id == node_id:
            # A node killed a moment ago may still be exiting: give it a moment.
            deadline = time.monotonic() + DOWN_TIMEOUT_S
            while _alive(info.pid) and time.monotonic() < deadline:
                time.sleep(POLL_INTERVAL_S)
            if _alive(info.pid):
                raise UsageError(f"node {node_id} is still running (pid {info.pid}); stop it "
                                 f"first with `quorumlog stop --node {node_id}`")
            info.pid = start_node(Path(info.config)).pid
            save(directory, infos)
            if serving_timeout_s is not None:
                wait_serving(info, serving_timeout_s)
            return info
    raise UsageError(f"no node {node_id} in {directory}")


def wait_serving(info: NodeInfo, timeout_s: float) -> dict[str, Any]:
    """Until every role of the node answers its status request (meta: any Raft
    role; bookie: started, registered or not), or the process exits (raises
    QuorumlogError with its ``error:`` line), or ``timeout_s`` passes
    (DeadlineExceededError). Returns the node's status row."""
    deadline = time.monotonic() + timeout_s
    row: dict[str, Any] = {}
    while time.monotonic() < deadline:
        row = rpc.run(_status_async([info]))[0]
        if not row["alive"]:
            reason = start_error(Path(info.log))
            raise QuorumlogError(
                f"node {info.id} (pid {info.pid}) exited during start-up"
                f"{': ' + reason if reason else ''}; see {info.log}")
        if _serving(row):
            return row
        time.sleep(POLL_INTERVAL_S)
    raise DeadlineExceededError(
        f"node {info.id} (pid {info.pid}) is running but did not serve within "
        f"{timeout_s:.0f} s: meta {row.get('meta_role', '-')}, bookie "
        f"{row.get('bookie', {}).get('state', '-')}; see {info.log}")


def _serving(row: dict[str, Any]) -> bool:
    meta_ok = "meta" not in row["roles"] or row.get("meta_role") not in (None, "unreachable")
    bookie_ok = ("bookie" not in row["roles"]
                 or row.get("bookie", {}).get("state", "unreachable") != "unreachable")
    return meta_ok and bookie_ok


def add_node(directory: Path) -> NodeInfo:
    """Start one more node that joins the meta group (``bootstrap = false``).

    It is not a member until a ``quorumlog meta member add`` commits; until then
    it waits for the leader to contact it.
    """
    directory = directory.resolve()
    infos = load(directory)
    node_id = max(i.id for i in infos) + 1
    taken = [int(a.rsplit(":", 1)[1]) for i in infos for a in (i.address, i.metrics) if a]
    address, metrics = (f"127.0.0.1:{port}" for port in free_ports(2, taken=taken))
    members = [f'"{i.id}={i.address}"' for i in infos if "meta" in i.roles]
    members.append(f'"{node_id}={address}"')
    node_dir = directory / f"node-{node_id}"
    node_dir.mkdir(parents=True, exist_ok=True)
    path = node_dir / "node.toml"
    path.write_text(node_toml(node_id, node_dir, address=address, metrics=metrics,
                              roles=["meta"], members=", ".join(members), bootstrap=False))
    info = NodeInfo(node_id, start_node(path).pid, address, metrics, ["meta"], str(path),
                    str(node_dir / "node.log"))
    save(directory, [*infos, info])
    return info


def stop_node(directory: Path, node_id: int) -> bool:
    """SIGTERM one node of the local cluster and wait for it to exit (SIGKILL after
    DOWN_TIMEOUT_S). False when it was not running; UsageError for an unknown id."""
    for info in load(directory):
        if info.id != node_id:
            continue
        if not _alive(info.pid):
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(info.pid, signal.SIGTERM)
        deadline = time.monotonic() + DOWN_TIMEOUT_S
        while _alive(info.pid) and time.monotonic() < deadline:
            time.sleep(POLL_INTERVAL_S)
        if _alive(info.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(info.pid, signal.SIGKILL)
        return True
    raise UsageError(f"no node {node_id} in {directory}")


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
    killed = [pid for pid in stopped if _alive(pid)]
    for pid in killed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    # Return once they are gone: a node that did not stop in time (its shutdown
    # waits on a meta that lost its quorum, say) may still be alive right after
    # the SIGKILL, and an `up` of the same directory then found it running.
    deadline = time.monotonic() + DOWN_TIMEOUT_S
    while any(_alive(p) for p in killed) and time.monotonic() < deadline:
        time.sleep(POLL_INTERVAL_S)
    left = [pid for pid in killed if _alive(pid)]
    if left:
        raise QuorumlogError(f"node process(es) {left} still exist {DOWN_TIMEOUT_S:.0f} s after "
                             "SIGKILL (stuck in the kernel?); check them with `ps`")
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


async def _meta_status(pool: rpc.Pool, info: NodeInfo, row: dict[str, Any]) -> None:
    if "meta" not in info.roles:
        row.update(meta_role="-")
        return
    try:
        st = await pool.call(info.address, MetaStatusRequest(), timeout_s=STATUS_TIMEOUT_S)
    except QuorumlogError as exc:
        row.update(meta_role="unreachable", error=exc.message)
        return
    row.update(meta_role=st.role, term=st.term, leader=st.leader,
               commit_index=st.commit_index, applied_index=st.applied_index,
               revision=st.revision, voters=st.voters, read_mode=st.read_mode,
               lease_reads=st.lease_reads, read_index_reads=st.read_index_reads)


async def _bookie_status(pool: rpc.Pool, info: NodeInfo, row: dict[str, Any]) -> None:
    if "bookie" not in info.roles:
        return
    try:
        st = await pool.call(info.address, BookieStatusRequest(), timeout_s=STATUS_TIMEOUT_S)
    except QuorumlogError as exc:
        row.update(bookie={"state": "unreachable", "error": exc.message})
        return
    state = "read-only" if st.read_only else ("writable" if st.registered else "unregistered")
    row.update(bookie={"state": state, "registered": st.registered, "read_only": st.read_only,
                       "labels": st.labels, "ledgers": st.ledgers,
                       "disk_usage": round(st.disk_usage, 4)})


async def _status_async(infos: list[NodeInfo]) -> list[dict[str, Any]]:
    pool = rpc.Pool()
    try:
        async def one(info: NodeInfo) -> dict[str, Any]:
            row: dict[str, Any] = {**asdict(info), "alive": _alive(info.pid)}
            await asyncio.gather(_meta_status(pool, info, row), _bookie_status(pool, info, row))
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
            reason = start_error(Path(dead[0]["log"]))
            raise QuorumlogError(
                f"node {dead[0]['id']} exited during start-up"
                f"{': ' + reason if reason else ''}; see {dead[0]['log']}"
            )
        if _healthy(rows):
            return rows
        time.sleep(POLL_INTERVAL_S)
    raise DeadlineExceededError(
        f"the cluster did not become healthy within {timeout_s:.0f} s: "
        + "; ".join(f"node {r['id']}: meta {r.get('meta_role')}, "
                    f"bookie {r.get('bookie', {}).get('state', '-')}" for r in rows)
        + "; its nodes keep running for a look (`quorumlog status`, their node.log), "
        "`quorumlog down` stops them"
    )


def start_error(log: Path) -> str:
    """The last ``error:`` line a node printed (``run_node``) in the tail of its log."""
    try:
        with log.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
            tail = f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    for line in reversed(tail.splitlines()):
        if line.startswith(ERROR_PREFIX):
            return line[len(ERROR_PREFIX):]
    return ""


def wait_table_nodes(infos: list[NodeInfo], timeout_s: float) -> None:
    """Wait until every node with the table role is registered in meta (a table
    can be placed on it)."""
    from quorumlog.meta import BlockingMetaClient
    from quorumlog.table import table_node_key

    wanted = [i.id for i in infos if "table" in i.roles]
    deadline = time.monotonic() + timeout_s
    with BlockingMetaClient([i.address for i in infos if "meta" in i.roles]) as meta:
        while True:
            missing = [n for n in wanted if meta.get(table_node_key(n)) is None]
            if not missing:
                return
            if time.monotonic() > deadline:
                raise DeadlineExceededError(
                    f"table nodes {missing} did not register in meta within {timeout_s:.0f} s; "
                    "see their node.log")
            time.sleep(POLL_INTERVAL_S)


def _healthy(rows: list[dict[str, Any]]) -> bool:
    """One meta leader that every meta node knows, and every bookie writable."""
    meta_rows = [r for r in rows if "meta" in r["roles"]]
    leaders = {r.get("leader") for r in meta_rows}
    meta_ok = (all(r["meta_role"] != "unreachable" for r in meta_rows) and len(leaders) == 1
               and any(r["meta_role"] == "leader" for r in meta_rows))
    bookies_ok = all(r.get("bookie", {}).get("state") == "writable"
                     for r in rows if "bookie" in r["roles"])
    return meta_ok and bookies_ok


def meta_addresses(directory: Path) -> list[str]:
    return [n.address for n in load(directory) if "meta" in n.roles]


@contextlib.contextmanager
def running(directory: Path, nodes: int = 3) -> Iterator[list[str]]:
    """A local cluster for the span of a ``with`` block (tests, scripts): ``up``
    on entry, yielding the meta addresses, ``down`` on exit, also on errors."""
    try:
        up(directory, nodes)
    except BaseException:
        # ``up`` wrote the cluster file before waiting: stop the nodes it started
        # rather than leave them running behind the error.
        with contextlib.suppress(UsageError):
            down(directory)
        raise
    try:
        yield meta_addresses(directory)
    finally:
        down(directory)
