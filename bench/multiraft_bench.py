"""Many Raft groups per process: idle CPU and Raft bytes/s of 1,000 groups per node.

Three real processes on 127.0.0.1, each a ``RaftHost`` (WAL storage on disk,
rpc between them) hosting the same N groups (N=1,000 by default), every group
with one member on each process. Once every group has a leader and the
groups had time to settle, nothing is proposed: the window measures what idle
groups cost, per process:

* CPU: user + system time from ``/proc/<pid>/stat`` over the window, as a
  share of one core;
* Raft bytes/s: ``wchar`` from ``/proc/<pid>/io`` over the window (bytes the
  process handed to write/send calls: idle groups write nothing to disk and
  the processes log nothing at WARNING, so this is the Raft traffic on the
  wire, framing included).

Three modes run in the same invocation, on the same machine, one after the
other with fresh processes:

* ``per-group`` (the baseline): the host before issue 15, every heartbeat and
  answer its own encoded message, every group ticked every tick
  (``coalesce_heartbeats=False, quiesce_idle_groups=False``);
* ``coalesced``: heartbeats between two processes as compact rows of one
  request (``coalesce_heartbeats=True``), groups still ticking;
* ``quiesced``: coalesced, and idle groups quiesce (the default host).

The ratio of each mode is against ``per-group``, measured in the same run, so
the machine's load affects both sides alike (lower is better).

    .venv/bin/python bench/multiraft_bench.py [--groups 1000] [--window-s 10] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script

NODE_IDS = (1, 2, 3)
WAL_SEGMENT_BYTES = 64 * 1024  # 3,000 groups x 64 KiB preallocated = 192 MiB of disk
READY_TIMEOUT_S = 300.0  # creating and electing 1,000 groups x 3 on a busy 2-core VM
SETTLE_S = 3.0  # after every group has a leader: leaders quiesce within a few ticks
STATUS_POLL_S = 0.5
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
MODES: dict[str, dict[str, bool]] = {
    "per-group": {"coalesce_heartbeats": False, "quiesce_idle_groups": False},
    "coalesced": {"coalesce_heartbeats": True, "quiesce_idle_groups": False},
    "quiesced": {"coalesce_heartbeats": True, "quiesce_idle_groups": True},
}
BASELINE_MODE = "per-group"


class _NullMachine:
    """A state machine for idle groups: nothing is ever proposed."""

    def apply(self, index: int, data: bytes) -> Any:
        return None

    def snapshot(self) -> bytes:
        return b""

    def restore(self, data: bytes) -> None:
        return None


async def _serve(node_id: int, ports: list[int], groups: int, mode: str, data_dir: str) -> None:
    """Child process: one host with ``groups`` groups; prints READY, then idles."""
    from quorumlog import rpc
    from quorumlog.log import configure
    from quorumlog.raft import HostConfig, RaftHost
    from quorumlog.wal import WalConfig

    configure("WARNING")
    addresses = {nid: f"127.0.0.1:{port}" for nid, port in zip(NODE_IDS, ports, strict=True)}
    config = HostConfig(wal=WalConfig(segment_size_bytes=WAL_SEGMENT_BYTES), **MODES[mode])
    host = RaftHost(node_id, addresses, data_dir, config=config)
    server = rpc.Server(host.handlers())
    await server.start("127.0.0.1", ports[node_id - 1])
    for group_id in range(1, groups + 1):
        host.add_group(group_id, set(NODE_IDS), _NullMachine())
    await host.start()
    while True:
        status = host.status()
        if all(s["leader"] for s in status):
            leading = sum(1 for s in status if s["role"] == "leader")
            print(f"READY {leading}", flush=True)
            break
        await asyncio.sleep(STATUS_POLL_S)
    await asyncio.Event().wait()  # the parent kills us


@dataclass(frozen=True, slots=True)
class Usage:
    cpu_s: float
    written_bytes: int


def _usage(pid: int) -> Usage:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    io = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return Usage((utime + stime) / CLOCK_TICKS_PER_S, int(io["wchar"]))


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@dataclass(frozen=True, slots=True)
class ModeResult:
    mode: str
    cpu_share: float  # of one core, per process (mean of the three)
    bytes_per_s: float  # per process (mean of the three)
    ready_s: float
    leaders: list[int]


def _run_mode(mode: str, groups: int, window_s: float) -> ModeResult:
    ports = _free_ports(len(NODE_IDS))
    with tempfile.TemporaryDirectory(prefix="multiraft-bench-") as root:
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--serve", str(node_id), "--ports",
                 ",".join(map(str, ports)), "--groups", str(groups), "--mode", mode,
                 "--data-dir", str(Path(root) / f"node{node_id}")],
                stdout=subprocess.PIPE)
            for node_id in NODE_IDS
        ]
        try:
            started = time.monotonic()
            leaders = []
            for proc in procs:
                line = _read_ready(proc, started + READY_TIMEOUT_S)
                leaders.append(int(line.split()[1]))
            ready_s = time.monotonic() - started
            time.sleep(SETTLE_S)
            before = [_usage(p.pid) for p in procs]
            time.sleep(window_s)
            after = [_usage(p.pid) for p in procs]
        finally:
            for proc in procs:
                proc.kill()
            for proc in procs:
                proc.wait()
    cpu = [(a.cpu_s - b.cpu_s) / window_s for a, b in zip(after, before, strict=True)]
    written = [(a.written_bytes - b.written_bytes) / window_s
               for a, b in zip(after, before, strict=True)]
    return ModeResult(mode, sum(cpu) / len(cpu), sum(written) / len(written), ready_s, leaders)


def _read_ready(proc: subprocess.Popen[bytes], deadline: float) -> str:
    """The child's READY line (bounded: a child that dies or hangs fails the run)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    buffer = b""
    while time.monotonic() < deadline:
        readable, _, _ = select.select([fd], [], [], STATUS_POLL_S)
        if readable:
            chunk = os.read(fd, 4096)
            if not chunk:
                raise SystemExit(f"bench host {proc.pid} exited with {proc.wait()}")
            buffer += chunk
            for line in buffer.decode().splitlines():
                if line.startswith("READY"):
                    return line
    raise SystemExit(f"bench host {proc.pid}: groups had no leaders after {READY_TIMEOUT_S} s")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--window-s", type=float, default=10.0)
    parser.add_argument("--quick", action="store_true", help="100 groups, 3 s window")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ports", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--data-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        from quorumlog import rpc

        ports = [int(p) for p in args.ports.split(",")]
        rpc.run(_serve(args.serve, ports, args.groups, args.mode, args.data_dir))
        return
    groups, window_s = (100, 3.0) if args.quick else (args.groups, args.window_s)
    modes = args.modes.split(",")
    if BASELINE_MODE not in modes or any(m not in MODES for m in modes):
        raise SystemExit(f"--modes must list modes of {list(MODES)}, {BASELINE_MODE} included")
    results = [_run_mode(mode, groups, window_s) for mode in modes]
    base = next(r for r in results if r.mode == BASELINE_MODE)
    print(f"\n{groups} idle groups per process, 3 processes, {window_s:.0f} s window "
          f"(per process, mean of 3; ratio against {BASELINE_MODE} in this run)")
    print(f"{'mode':<10} {'CPU % of a core':>16} {'ratio':>7} {'Raft bytes/s':>14} "
          f"{'ratio':>7} {'ready s':>8}  leaders per process")
    for r in results:
        print(f"{r.mode:<10} {r.cpu_share * 100:>16.1f} {r.cpu_share / base.cpu_share:>7.3f} "
              f"{r.bytes_per_s:>14,.0f} {r.bytes_per_s / base.bytes_per_s:>7.3f} "
              f"{r.ready_s:>8.1f}  {r.leaders}")
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in results], indent=2))


if __name__ == "__main__":
    main()
