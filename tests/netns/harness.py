"""Nodes in their own Linux network namespaces, like separate hosts, with real
network faults between them.

Topology (every name starts with ``PREFIX`` and this process's pid):

    qlt<pid>-br   a namespace holding only the bridge ``br0``
    qlt<pid>-n1   node 1, eth0 = 10.77.0.11/24, its veth peer on br0
    qlt<pid>-n2   node 2, eth0 = 10.77.0.12/24
    ...
    qlt<pid>-c    the client "host", eth0 = 10.77.0.100/24 (CLI and workloads)

The subnet exists only inside these namespaces: nothing is added to the root
namespace, and there is no route out. Each node runs ``python -m quorumlog node``
inside its namespace with a config written here (listen on 0.0.0.0, advertise
its 10.77.0.x address; meta on every node, a bookie on every node), and a
``cluster.json`` in the cluster directory lists the advertised addresses, so
``quorumlog status --dir DIR`` run on the client host works as on a real
deployment.

Faults are nftables rules in a table ``qlfault`` inside the namespaces
(``isolate``, ``partition``, ``one_way_loss``; ``heal`` removes them); packets
are dropped silently, as on a cut cable. SIGKILL/SIGSTOP of a node process as
in the local-cluster tests.

``close()`` kills the nodes and deletes the namespaces (the veth pairs go with
them); ``sweep_stale()`` removes namespaces left by a harness whose process
died (its pid no longer runs), so a crashed run leaves nothing behind for long.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from quorumlog.node import LOCAL_BOOKIE_TOML, NodeInfo

PREFIX = "qlt"
SUBNET_PREFIX = "10.77.0."
SUBNET_BITS = 24
NODE_ADDRESS_BASE = 10  # node N is 10.77.0.(10 + N)
CLIENT = 0  # host id of the client namespace
CLIENT_ADDRESS = SUBNET_PREFIX + "100"
RPC_PORT = 7100
METRICS_PORT = 9100
NODES_MAX = 9
COMMAND_TIMEOUT_S = 30.0
CLI_TIMEOUT_S = 60.0
UP_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 10.0
POLL_INTERVAL_S = 0.2
DEADLINE_S = 60.0  # a test's wait for one state or one workload line
FAULT_TABLE = "qlfault"
RESET_ENV = "QL_NETNS_RESET"  # "1": every fault answers TCP with resets (docs/jepsen.md)
# Small bookies and a short session TTL: the local cluster's settings.
BOOKIE_TOML = LOCAL_BOOKIE_TOML


def availability() -> str | None:
    """None when the harness can run, else why not (a pytest skip reason)."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "creating network namespaces needs root (ip netns add)"
    for tool, package in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            return (f"no '{tool}' on PATH: install the Debian package {package} "
                    "(scripts/setup.sh does when run as root)")
    probe = f"{PREFIX}{os.getpid()}-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    try:
        nft = subprocess.run(["ip", "netns", "exec", probe, "nft", "list", "tables"],
                             capture_output=True, text=True)
        if nft.returncode != 0:
            return f"nft does not work inside a namespace: {nft.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def run(argv: Sequence[str], *, timeout_s: float = COMMAND_TIMEOUT_S,
        stdin: str | None = None) -> str:
    """Run a setup command; raise with its stderr when it fails."""
    out = subprocess.run(list(argv), input=stdin, capture_output=True, text=True,
                         timeout=timeout_s)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({out.returncode}): {out.stderr.strip()}")
    return out.stdout


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_namespace(namespace: str) -> None:
    """SIGKILL every process in ``namespace`` and delete it."""
    pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True)
    for pid in pids.stdout.split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


def sweep_stale() -> list[str]:
    """Delete namespaces named ``PREFIX<pid>-...`` whose creating process is gone."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    removed = []
    for line in listed.splitlines():
        name = line.split()[0] if line.split() else ""
        owner = name[len(PREFIX):].split("-", 1)[0]
        if not name.startswith(PREFIX) or not owner.isdigit():
            continue
        if int(owner) != os.getpid() and not _pid_alive(int(owner)):
            _kill_namespace(name)
            removed.append(name)
    return removed


def node_address(node_id: int) -> str:
    return SUBNET_PREFIX + str(NODE_ADDRESS_BASE + node_id)


def node_toml(node_id: int, data_dir: Path, members: str, bootstrap: bool = True, *,
              roles: Sequence[str] = ("meta", "bookie"), extra: str = "") -> str:
    """A node's TOML; ``extra`` is appended (sections of its own)."""
    host = node_address(node_id)
    role_list = ", ".join(f'"{role}"' for role in roles)
    return (
        f"[node]\nid = {node_id}\ndata_dir = \"{data_dir}\"\n"
        f"listen = \"0.0.0.0:{RPC_PORT}\"\nadvertise = \"{host}:{RPC_PORT}\"\n"
        f"metrics_listen = \"0.0.0.0:{METRICS_PORT}\"\n"
        f"metrics_advertise = \"{host}:{METRICS_PORT}\"\n"
        f"roles = [{role_list}]\n\n"
        f"[meta]\nmembers = [{members}]\nbootstrap = {str(bootstrap).lower()}\n\n"
        f"[bookie]\nlabels = {{ rack = \"rack-{node_id}\", zone = \"zone-1\" }}\n"
        + BOOKIE_TOML + extra
    )


class NetnsCluster:
    """``nodes`` quorumlog nodes, each in its own namespace, and a client namespace.

    With ``clusters`` (lists of node ids, e.g. ``[[1], [2]]``) the nodes form that
    many quorumlog clusters on the one network: each has its own meta group,
    ``[table] cluster_id`` = its place in the list + 1, and names every other as
    ``[clusters] c<id>`` (their meta addresses), ready for duplication
    (docs/duplication.md)."""

    def __init__(self, directory: Path, nodes: int = 3, *,
                 roles: Sequence[str] = ("meta", "bookie"),
                 clusters: Sequence[Sequence[int]] | None = None,
                 extra_toml: str = "") -> None:
        if not 1 <= nodes <= NODES_MAX:
            raise ValueError(f"nodes must be in 1..{NODES_MAX}")
        self.directory = directory.resolve()
        self.roles = tuple(roles)
        self.node_ids = list(range(1, nodes + 1))
        self.clusters = [list(group) for group in clusters or [self.node_ids]]
        self.extra_toml = extra_toml  # appended to every node's TOML (one cluster only)
        if extra_toml and len(self.clusters) > 1:
            raise ValueError("extra_toml is for a single cluster")
        if sorted(i for group in self.clusters for i in group) != self.node_ids:
            raise ValueError(f"clusters {self.clusters} must split nodes 1..{nodes}")
        self.tag = f"{PREFIX}{os.getpid()}"
        self.bridge = f"{self.tag}-br"
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self._namespaces: list[str] = []
        # (namespace host, direction, peer address) drop rules now in force
        self._drops: set[tuple[int, str, str]] = set()
        self._reset = False  # TCP answered with a reset instead of dropped (partition)

    # -- names and addresses ------------------------------------------------

    def namespace(self, host: int) -> str:
        return f"{self.tag}-c" if host == CLIENT else f"{self.tag}-n{host}"

    @staticmethod
    def address_of(host: int) -> str:
        return CLIENT_ADDRESS if host == CLIENT else node_address(host)

    def rpc_address(self, node_id: int) -> str:
        return f"{node_address(node_id)}:{RPC_PORT}"

    @property
    def meta_members(self) -> str:
        """Comma-separated advertised meta addresses (the CLI's --members/--meta)."""
        return ",".join(self.rpc_address(i) for i in self.node_ids)

    def cluster_members(self, cluster: int) -> str:
        """``meta_members`` of cluster ``cluster`` (1-based, as its cluster id)."""
        return ",".join(self.rpc_address(i) for i in self.clusters[cluster - 1])

    def cluster_of(self, node_id: int) -> int:
        return next(n for n, group in enumerate(self.clusters, 1) if node_id in group)

    def _clusters_toml(self, node_id: int) -> str:
        if len(self.clusters) == 1:
            return ""
        own = self.cluster_of(node_id)
        lines = [f"\n[table]\ncluster_id = {own}\ndup_refresh_interval_ms = 200\n"
                 "dup_remote_deadline_s = 2.0\n",  # calls fail inside a cut, and retry
                 "\n[clusters]\n"]
        for n, group in enumerate(self.clusters, 1):
            if n != own:
                addresses = ", ".join(f'"{self.rpc_address(i)}"' for i in group)
                lines.append(f"c{n} = [{addresses}]\n")
        return "".join(lines)

    def config_path(self, node_id: int) -> Path:
        return self.directory / f"node-{node_id}" / "node.toml"

    def log_path(self, node_id: int) -> Path:
        return self.directory / f"node-{node_id}" / "node.log"

    # -- life cycle -----------------------------------------------------------

    def start(self) -> None:
        """Namespaces, links, configs, node processes; returns when healthy."""
        sweep_stale()
        self._add_namespace(self.bridge)
        br = ["ip", "-n", self.bridge]
        run([*br, "link", "add", "br0", "type", "bridge"])
        run([*br, "link", "set", "br0", "up"])
        for host in [*self.node_ids, CLIENT]:
            self._add_host(host)
        for node_id in self.node_ids:
            self.write_config(node_id)
            self.start_node(node_id)
        self.wait_healthy(UP_TIMEOUT_S)

    def write_config(self, node_id: int, *, bootstrap: bool = True) -> None:
        """Node ``node_id``'s TOML, listing every node of its cluster as a meta member."""
        group = self.clusters[self.cluster_of(node_id) - 1]
        members = ", ".join(f'"{i}={self.rpc_address(i)}"' for i in group)
        node_dir = self.config_path(node_id).parent
        node_dir.mkdir(parents=True, exist_ok=True)
        self.config_path(node_id).write_text(
            node_toml(node_id, node_dir / "data", members, bootstrap, roles=self.roles,
                      extra=self._clusters_toml(node_id) + self.extra_toml))

    def add_node(self, node_id: int) -> None:
        """A new host joining a running cluster (docs/deploy.md, "Adding and removing
        meta members"): its TOML lists the members plus itself, ``bootstrap = false``;
        started, it waits to be added to the meta group."""
        if node_id in self.node_ids or not 1 <= node_id <= NODES_MAX:
            raise ValueError(f"node {node_id} exists or is out of 1..{NODES_MAX}")
        self.node_ids.append(node_id)
        self.clusters[0].append(node_id)
        self._add_host(node_id)
        self.write_config(node_id, bootstrap=False)
        self.start_node(node_id)

    def remove_node(self, node_id: int) -> None:
        """Stop node ``node_id`` and forget it (its namespace stays until close)."""
        self.kill(node_id, signal.SIGTERM)
        self.node_ids.remove(node_id)
        self.clusters[self.cluster_of(node_id) - 1].remove(node_id)
        del self.procs[node_id]
        self._write_cluster_file()

    def _add_namespace(self, name: str) -> None:
        run(["ip", "netns", "add", name])
        self._namespaces.append(name)
        run(["ip", "-n", name, "link", "set", "lo", "up"])

    def _add_host(self, host: int) -> None:
        ns = self.namespace(host)
        self._add_namespace(ns)
        peer = f"v{host}"
        run(["ip", "link", "add", "eth0", "netns", ns, "type", "veth",
             "peer", "name", peer, "netns", self.bridge])
        run(["ip", "-n", self.bridge, "link", "set", peer, "master", "br0"])
        run(["ip", "-n", self.bridge, "link", "set", peer, "up"])
        run(["ip", "-n", ns, "addr", "add", f"{self.address_of(host)}/{SUBNET_BITS}",
             "dev", "eth0"])
        run(["ip", "-n", ns, "link", "set", "eth0", "up"])

    def start_node(self, node_id: int) -> None:
        with self.log_path(node_id).open("ab") as log:
            self.procs[node_id] = subprocess.Popen(
                ["ip", "netns", "exec", self.namespace(node_id), sys.executable, "-m",
                 "quorumlog", "node", "--config", str(self.config_path(node_id))],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        self._write_cluster_file()

    def _write_cluster_file(self) -> None:
        infos = [NodeInfo(i, self.procs[i].pid, self.rpc_address(i),
                          f"{node_address(i)}:{METRICS_PORT}", ["meta", "bookie"],
                          str(self.config_path(i)), str(self.log_path(i)))
                 for i in self.node_ids if i in self.procs]
        path = self.directory / "cluster.json"
        path.write_text(json.dumps({"nodes": [asdict(i) for i in infos]}, indent=2))

    def kill(self, node_id: int, sig: signal.Signals = signal.SIGKILL) -> None:
        self.procs[node_id].send_signal(sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            self.procs[node_id].wait(timeout=STOP_TIMEOUT_S)

    def close(self) -> None:
        """Stop every node and delete every namespace (also after a failure)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for name in reversed(self._namespaces):
            _kill_namespace(name)
        self._namespaces.clear()

    # -- the client host ----------------------------------------------------

    def cli(self, *args: str, stdin: str | None = None,
            timeout_s: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        """``quorumlog ARGS`` run on the client host."""
        return subprocess.run(
            ["ip", "netns", "exec", self.namespace(CLIENT), sys.executable, "-m", "quorumlog",
             *args], input=stdin, capture_output=True, text=True, timeout=timeout_s)

    def client_process(self, argv: Sequence[str]) -> subprocess.Popen[str]:
        """A Python program (``argv`` after the interpreter) started on the client host."""
        return self.process_on(CLIENT, argv)

    def process_on(self, host: int, argv: Sequence[str]) -> subprocess.Popen[str]:
        """A Python program started on ``host`` (a node's namespace: a client beside
        that node, on its side of a partition)."""
        return subprocess.Popen(
            ["ip", "netns", "exec", self.namespace(host), sys.executable, *argv],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def status(self) -> list[dict[str, Any]]:
        out = self.cli("status", "--dir", str(self.directory), "--json")
        if out.returncode != 0:
            raise RuntimeError(f"quorumlog status failed: {out.stderr[-2000:]}")
        rows: list[dict[str, Any]] = json.loads(out.stdout)["nodes"]
        return rows

    def leader(self, among: Iterable[int] | None = None) -> int | None:
        """The node that is meta leader (and believed so by itself), among ``among``."""
        wanted = set(self.node_ids if among is None else among)
        for row in self.status():
            if row["id"] in wanted and row.get("meta_role") == "leader":
                return int(row["id"])
        return None

    def wait_healthy(self, timeout_s: float) -> None:
        """Until one leader is known to every node and every bookie is writable."""
        deadline = time.monotonic() + timeout_s
        rows: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            for node_id, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"node {node_id} exited ({proc.returncode}): "
                                       f"{self.log_path(node_id).read_text()[-3000:]}")
            rows = self.status()
            leaders = [{r.get("leader") for r in rows if r["id"] in group}
                       for group in self.clusters]
            if (all(len(known) == 1 and None not in known for known in leaders)
                    and all(r.get("bookie", {}).get("state") == "writable" for r in rows)):
                return
            time.sleep(POLL_INTERVAL_S)
        raise TimeoutError(f"cluster not healthy within {timeout_s:.0f} s: {rows}")

    # -- faults ---------------------------------------------------------------

    def isolate(self, node_id: int) -> None:
        """Cut ``node_id`` from every other host, the client included."""
        others = [h for h in [*self.node_ids, CLIENT] if h != node_id]
        self.partition([node_id], others)

    def partition(self, side_a: Iterable[int], side_b: Iterable[int], *,
                  reset: bool = False) -> None:
        """No packet between a host of ``side_a`` and a host of ``side_b`` (either
        way); hosts in neither side (the client, unless named) reach everyone.
        With ``reset`` a TCP segment is answered with a reset instead (a firewall
        that rejects: connections fail at once, nothing sent gets through later);
        it applies to every rule in force until ``heal``."""
        self._reset = self._reset or reset or os.environ.get(RESET_ENV) == "1"
        a, b = list(side_a), list(side_b)
        for x in a:
            for y in b:
                self._drops.update({(x, "input", self.address_of(y)),
                                    (x, "output", self.address_of(y)),
                                    (y, "input", self.address_of(x)),
                                    (y, "output", self.address_of(x))})
        self._apply(set(a) | set(b))

    def one_way_loss(self, src: int, dst: int) -> None:
        """Packets from ``src`` to ``dst`` are dropped; ``dst`` to ``src`` still flow."""
        self._drops.add((dst, "input", self.address_of(src)))
        self._apply({dst})

    def heal(self) -> None:
        """Remove every fault rule."""
        hosts = {host for host, _, _ in self._drops}
        self._drops.clear()
        self._reset = False
        self._apply(hosts)

    def _apply(self, hosts: Iterable[int]) -> None:
        for host in hosts:
            chains = []
            for direction, field in (("input", "saddr"), ("output", "daddr")):
                peers = sorted(p for h, d, p in self._drops if h == host and d == direction)
                match = f"ip {field} {{ {', '.join(peers)} }}"
                # With resets: a segment either way is answered with a RST (the
                # RSTs themselves pass, or no socket would hear of them).
                rule = "" if not peers else (
                    f"{match} tcp flags & rst == rst accept\n"
                    f"    {match} meta l4proto tcp reject with tcp reset\n    {match} drop"
                    if self._reset else f"{match} drop")
                chains.append(f"  chain {direction} {{\n    type filter hook {direction} "
                              f"priority 0; policy accept;\n    {rule}\n  }}\n")
            script = (f"table inet {FAULT_TABLE}\ndelete table inet {FAULT_TABLE}\n"
                      f"table inet {FAULT_TABLE} {{\n{''.join(chains)}}}\n")
            run(["ip", "netns", "exec", self.namespace(host), "nft", "-f", "-"], stdin=script)


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(POLL_INTERVAL_S)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


class LineReader:
    """JSON lines of a workload's stdout, each awaited with a deadline."""

    def __init__(self, proc: subprocess.Popen[str], cluster: NetnsCluster) -> None:
        self.proc = proc
        self.cluster = cluster
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def next(self, timeout_s: float = DEADLINE_S) -> dict[str, Any]:
        line = self.lines.get(timeout=timeout_s)
        if line is None:
            stderr = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"workload ended early: {stderr[-3000:]}\n"
                                 f"{self.cluster_events()}")
        record: dict[str, Any] = json.loads(line)
        return record

    def rest(self, timeout_s: float = DEADLINE_S) -> list[dict[str, Any]]:
        """The lines up to the workload's end; it must exit 0 within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        records = []
        while (line := self.lines.get(timeout=max(0.0, deadline - time.monotonic()))):
            records.append(json.loads(line))
        returncode = self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        if returncode != 0:
            stderr = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"workload exited {returncode}: {stderr[-3000:]}")
        return records

    def cluster_events(self) -> str:
        """The nodes' warnings and leadership/registration events, for a failure."""
        keep = ("warning", "error", "raft_leader_changed", "bookie_registered",
                "bookie_session")
        out = []
        for node_id in self.cluster.node_ids:
            lines = [line[:300] for line in
                     self.cluster.log_path(node_id).read_text(errors="replace").splitlines()
                     if any(k in line for k in keep)]
            out.append(f"node {node_id}:\n" + "\n".join(lines[-30:]))
        return "\n".join(out)
