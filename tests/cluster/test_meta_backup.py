"""Meta backups on real processes (etcdctl ``snapshot save``, etcdutl ``snapshot
status`` and ``snapshot restore``): a 3-node cluster loses every meta member's
data (SIGKILL, then each ``<data_dir>/raft`` moved away) and comes back from a
backup file, with the records written before the backup, the ledger recovered
from the bookies, and no id or revision handed out after the backup reused."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from inprocess_cli import run_cli
from quorumlog import node as cluster
from quorumlog.ledger import BlockingLedgerClient
from quorumlog.meta import BlockingMetaClient, CompactedError
from quorumlog.node import load_node_config

CLI_TIMEOUT_S = 120.0
DEATH_TIMEOUT_S = 30.0


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the CLI; stderr with whitespace runs as single spaces (rich wraps long
    lines, such as an error naming a deep temporary path)."""
    out = run_cli(*args)  # in this process: about a second less a command
    return subprocess.CompletedProcess(out.args, out.returncode, out.stdout,
                                       " ".join(out.stderr.split()))


def kill_all(infos: list[cluster.NodeInfo]) -> None:
    for info in infos:
        os.kill(info.pid, signal.SIGKILL)
    deadline = time.monotonic() + DEATH_TIMEOUT_S
    for info in infos:
        while True:
            try:
                if os.waitpid(info.pid, os.WNOHANG)[0] == info.pid:
                    break
            except ChildProcessError:
                break
            assert time.monotonic() < deadline, f"node {info.id} still alive after SIGKILL"
            time.sleep(0.05)


def payload(index: int) -> bytes:
    return f"entry-{index:04d}".encode() * 8


def test_a_lost_meta_group_is_restored_from_a_backup(tmp_path: Path) -> None:
    directory = tmp_path / "cluster"
    backup = tmp_path / "backups" / "meta.snap"
    backup.parent.mkdir()
    infos = cluster.up(directory, 3)
    try:
        addresses = cluster.meta_addresses(directory)
        with BlockingLedgerClient(addresses) as ledgers:
            handle = ledgers.create_ledger(3, 2, 2)
            for index in range(10):
                handle.append(payload(index))
            with BlockingMetaClient(addresses) as meta:
                meta.put("/app/before", b"1")

                saved = cli("meta", "snapshot", "save", str(backup), "--dir", str(directory),
                            "-o", "json")
                assert saved.returncode == 0, saved.stderr
                saved_row = json.loads(saved.stdout)["snapshot"][0]
                status = cli("meta", "snapshot", "status", str(backup), "-o", "json")
                assert status.returncode == 0, status.stderr
                status_row = json.loads(status.stdout)["snapshot"][0]
                assert status_row == saved_row
                assert status_row["keys"] > 2 and status_row["state_bytes"] > 0

                # After the backup: a write, and ledgers that meta will forget.
                meta.put("/app/after", b"2")
                later = meta.put("/app/after", b"3")
            for index in range(10, 20):
                handle.append(payload(index))
            handle.close()
            forgotten = ledgers.create_ledger(3, 2, 2)
            forgotten.append(b"x")
            forgotten_id = forgotten.id
        assert later > saved_row["revision"]

        # Every meta member loses its data.
        kill_all(infos)
        data_dirs = [load_node_config(info.config).data_path for info in infos]
        for data_dir in data_dirs:
            shutil.move(data_dir / "raft", data_dir / "raft.lost")

        # A damaged copy and a file that is no backup are refused, naming why.
        damaged = tmp_path / "damaged.snap"
        data = bytearray(backup.read_bytes())
        data[len(data) // 2] ^= 0x40
        damaged.write_bytes(bytes(data))
        refused = cli("meta", "snapshot", "restore", str(damaged), "--config", infos[0].config)
        assert refused.returncode == 1 and "SHA-256 mismatch" in refused.stderr, refused.stderr
        assert not (data_dirs[0] / "raft").exists()
        bad_status = cli("meta", "snapshot", "status", str(infos[0].config))
        assert bad_status.returncode == 1 and "not a quorumlog meta snapshot" in bad_status.stderr

        for info in infos:
            restored = cli("meta", "snapshot", "restore", str(backup), "--config", info.config,
                           "-o", "json")
            assert restored.returncode == 0, restored.stderr
            row = json.loads(restored.stdout)["restored"][0]
            assert row["voters"] == "1,2,3" and row["node"] == info.id
            assert row["revision"] > later  # bumped past what was handed out since
        again = cli("meta", "snapshot", "restore", str(backup), "--config", infos[0].config)
        assert again.returncode == 1 and "already has data" in again.stderr, again.stderr

        infos = cluster.up(directory, 3)  # the restored members elect a leader
        with BlockingMetaClient(addresses) as meta:
            before = meta.get("/app/before")
            assert before is not None and before.value == b"1"
            assert meta.get("/app/after") is None  # written after the backup
            with pytest.raises(CompactedError):  # a watcher resuming from before the restore
                meta.watch_once("/app/", prefix=True, start_revision=later, wait_ms=0)
        with BlockingLedgerClient(addresses) as ledgers:
            # Open at the backup; recovery finds the 20 entries on the bookies.
            reader = ledgers.open_ledger(handle.id)
            assert reader.last_add_confirmed == 19
            assert [e.payload for e in reader.read(0, 19)] == [payload(i) for i in range(20)]
            reader.close()
            fresh = ledgers.create_ledger(3, 2, 2)
            assert fresh.id > forgotten_id  # never an id the lost ledger holds on the bookies
            fresh.append(b"y")
            fresh.close()
    finally:
        cluster.down(directory)
