"""File snapshots through the real driver (``raft.FileSnapshotMachine``): the
snapshot record holds a small manifest, the checkpoint files stay on disk and
are streamed chunk by chunk to a lagging follower, which installs them from
the directory they arrived in; a crash mid-install or mid-transfer leaves a
member that restarts cleanly. Real hosts over rpc on 127.0.0.1, real WALs."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path

from quorumlog import rpc
from quorumlog.node._cluster import free_ports
from quorumlog.raft import LOG_TAIL_FILE_NAME, FileSnapshotMachine
from quorumlog.raft._driver import INCOMING_SNAPSHOTS_DIR_NAME, RaftHost
from quorumlog.raft._file_snapshot import CHECKPOINTS_DIR_NAME

from .driver_support import GROUP, Member, wait_leader, wait_until
from .test_driver_snapshots import (
    FRAME_LIMIT_BYTES,
    config,
    sent,
    write_state,
)

MANIFEST_BYTES_MAX = 64 * 1024  # a manifest names files; it never holds them


class InjectedCrashError(Exception):
    """Stands for the process dying at the point it is raised."""


class FileMachine:
    """Each applied entry is an immutable file named by its index; a snapshot
    hard-links them all (no copy), as a RocksDB checkpoint links its SSTs."""

    def __init__(self, directory: Path, *, crash_mid_restore: bool = False) -> None:
        self.directory = directory
        self.crash_mid_restore = crash_mid_restore
        directory.mkdir(parents=True, exist_ok=True)

    def apply(self, index: int, data: bytes) -> bytes:
        (self.directory / f"{index:016x}").write_bytes(data)
        return data

    def snapshot_files(self, directory: Path) -> bytes:
        directory.mkdir()
        for path in self.directory.iterdir():
            os.link(path, directory / path.name)
        return b"%d" % len(list(directory.iterdir()))

    def restore_files(self, directory: Path, metadata: bytes) -> None:
        # The driver's log tail (a group with a compaction floor) is not ours.
        mine = [p for p in sorted(directory.iterdir()) if p.name != LOG_TAIL_FILE_NAME]
        assert int(metadata) == len(mine)
        shutil.rmtree(self.directory)
        self.directory.mkdir()
        for number, path in enumerate(mine):
            if self.crash_mid_restore and number == 3:
                raise InjectedCrashError("crashed half-way through installing a snapshot")
            os.link(path, self.directory / path.name)

    @property
    def items(self) -> list[bytes]:
        return [p.read_bytes() for p in sorted(self.directory.iterdir())]


class FileMember(Member):
    """A driver_support Member whose state machine is a FileMachine in its directory."""

    crash_mid_restore = False

    async def start(self, voters: set[int] | None, on_role_change: object = None) -> None:
        self.machine = FileMachine(  # type: ignore[assignment]
            self.root / f"machine-{self.node_id}", crash_mid_restore=self.crash_mid_restore)
        host = RaftHost(self.node_id, self.addresses, self.root / f"n{self.node_id}",
                        config=self.config)
        await self.start_server(host)
        await host.start()
        host.add_group(GROUP, voters, self.machine)  # type: ignore[arg-type]
        self.host = host

    @property
    def files(self) -> FileMachine:
        assert isinstance(self.machine, FileMachine)
        return self.machine


def group_dir(member: Member) -> Path:
    return member.root / f"n{member.node_id}" / f"group-{GROUP:016x}"


def checkpoints(member: Member) -> list[str]:
    directory = group_dir(member) / CHECKPOINTS_DIR_NAME
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


def run_file_cluster(tmp_path: Path, body: Callable[[list[Member]], Awaitable[None]],
                     deadline_s: float = 120.0) -> None:
    """driver_support.run_cluster with FileMembers: three founding voters."""

    async def main() -> None:
        addresses = {i: f"127.0.0.1:{port}"
                     for i, port in zip((1, 2, 3), free_ports(3), strict=True)}
        members: list[Member] = [FileMember(i, addresses, tmp_path, config()) for i in addresses]
        try:
            for member in members:
                await member.start({1, 2, 3})
            async with asyncio.timeout(deadline_s):
                await body(members)
        finally:
            for member in members:
                await member.stop()

    rpc.run(main())


async def lagging_follower(members: list[Member], mib: int) -> tuple[Member, Member]:
    """Stop a follower, write ``mib`` MiB, let the leader snapshot and compact
    past the follower's log; return (leader, stopped follower)."""
    leader = await wait_leader(members)
    follower = next(m for m in members if m is not leader)
    await follower.stop()
    up = [m for m in members if m is not follower]
    await write_state(up, mib)
    leader = await wait_leader(up)
    assert leader.host is not None
    group = leader.host.group(GROUP)
    await wait_until(lambda: group.storage.first_index() > 3, timeout_s=30,
                     what="the leader compacted its log")
    return leader, follower


async def files_caught_up(follower: Member, leader: Member) -> None:
    assert isinstance(follower, FileMember) and isinstance(leader, FileMember)
    await wait_until(lambda: follower.files.items == leader.files.items, timeout_s=60,
                     what="the follower caught up")


def test_a_lagging_follower_gets_the_checkpoint_files_streamed_and_keeps_the_epoch(
        tmp_path: Path) -> None:
    async def body(members: list[Member]) -> None:
        leader, follower = await lagging_follower(members, 40)
        assert leader.host is not None
        assert isinstance(leader.machine, FileSnapshotMachine)
        storage = leader.host.group(GROUP).storage
        # Writes stopped: the last snapshot's checkpoint is the only one left.
        await wait_until(
            lambda: checkpoints(leader) == [f"{storage.snapshot().meta.index:016x}"],
            what="one checkpoint, the last snapshot's")
        # The snapshot record holds a manifest; the files stay in the checkpoint.
        assert 0 < len(storage.snapshot().data) < MANIFEST_BYTES_MAX
        await follower.start(None)
        await files_caught_up(follower, leader)
        assert follower.host is not None
        stats = follower.host.snapshot_receive_stats
        assert stats.transfers_completed >= 1 and stats.bytes_received > FRAME_LIMIT_BYTES
        await wait_until(lambda: sent(members, "transfers_completed") >= 1,
                         what="the sender saw the transfer complete")
        installed = follower.host.group(GROUP).storage.snapshot()
        assert installed.meta.index > 3 and installed.meta.epoch >= 1
        await wait_until(lambda: checkpoints(follower) == [f"{installed.meta.index:016x}"],
                         what="the follower keeps the installed checkpoint only")
        incoming = follower.root / f"n{follower.node_id}" / INCOMING_SNAPSHOTS_DIR_NAME
        assert list(incoming.iterdir()) == []
        # Restarted from the snapshot, the member has the snapshot's epoch.
        await follower.stop()
        await follower.start(None)
        assert follower.host is not None
        group = follower.host.group(GROUP)
        assert group.storage.snapshot().meta == installed.meta
        assert group.applied_index == installed.meta.index
        assert group.node.epoch == installed.meta.epoch
        # Replication goes on from there, and newer snapshots replace old checkpoints.
        await write_state(members, 30)
        await files_caught_up(follower, await wait_leader(members))
        await wait_until(lambda: group.snapshot_index > installed.meta.index, timeout_s=30,
                         what="the follower took a newer snapshot")
        await wait_until(lambda: checkpoints(follower) == [f"{group.snapshot_index:016x}"],
                         what="newer snapshots replace older checkpoints")

    run_file_cluster(tmp_path, body)


def test_a_crash_mid_install_or_mid_transfer_restarts_cleanly(tmp_path: Path) -> None:
    async def body(members: list[Member]) -> None:
        leader, follower = await lagging_follower(members, 40)
        assert isinstance(follower, FileMember)
        follower.crash_mid_restore = True
        await follower.start(None)
        assert follower.host is not None
        failed = follower.host.failed
        await wait_until(failed.done, timeout_s=60, what="the install crashed")
        assert isinstance(failed.exception(), InjectedCrashError)
        await follower.stop()
        # What a kill mid-transfer and mid-checkpoint leaves behind.
        incoming = follower.root / f"n{follower.node_id}" / INCOMING_SNAPSHOTS_DIR_NAME
        (incoming / "g0000000000000007-n1-t0000000000000001" / "files").mkdir(parents=True)
        (group_dir(follower) / CHECKPOINTS_DIR_NAME / f"{10**6:016x}.tmp").mkdir()
        follower.crash_mid_restore = False
        await follower.start(None)  # installs from the checkpoint its snapshot record names
        await files_caught_up(follower, leader)
        assert list(incoming.iterdir()) == []
        assert follower.host is not None
        assert checkpoints(follower) == [
            f"{follower.host.group(GROUP).storage.snapshot().meta.index:016x}"]

    run_file_cluster(tmp_path, body)
