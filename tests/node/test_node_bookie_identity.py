"""A node whose bookie directories were wiped: the node process exits with
EXIT_CONFIG and one plain ``error:`` line on stderr (no traceback), ``quorumlog
up`` reports that line, and the operator's way back (``quorumlog bookie
format``) brings the bookie up as a new instance. Real node processes on
127.0.0.1 (``quorumlog up --nodes 1``: meta and bookie in one process).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# The bookie tests' client helpers (tests/bookie is not a package).
sys.path.insert(0, str(Path(__file__).parent.parent / "bookie"))
from server_helpers import add, connect

from quorumlog import node as cluster
from quorumlog import rpc
from quorumlog.bookie import cookie_key
from quorumlog.meta import BlockingMetaClient
from quorumlog.proto import BOOKIE_REGISTRY_PREFIX, BookieRegistration

CLI_TIMEOUT_S = 120.0
WAIT_S = 30.0
ENTRIES = 20


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the CLI; its output with whitespace runs as single spaces (rich wraps lines)."""
    out = subprocess.run([sys.executable, "-m", "quorumlog", *args], capture_output=True,
                         text=True, timeout=CLI_TIMEOUT_S, env=env)
    return subprocess.CompletedProcess(out.args, out.returncode, " ".join(out.stdout.split()),
                                       " ".join(out.stderr.split()))


@pytest.fixture
def wiped(tmp_path: Path) -> Iterator[tuple[Path, cluster.NodeInfo, str]]:
    """A one-node cluster that stored entries, stopped, its journal wiped."""
    directory = tmp_path / "cluster"
    cluster.up(directory, 1)
    try:
        node = cluster.load(directory)[0]
        instance = _registered_instance(node.address)

        async def write() -> None:
            conn = await connect(node.address)
            await asyncio.gather(*(add(conn, 5, e) for e in range(ENTRIES)))
            await conn.close()

        rpc.run(write())
        cluster.down(directory)
        shutil.rmtree(Path(node.config).parent / "data" / "journal")
        yield directory, node, instance
    finally:
        cluster.down(directory)


def _registered_instance(address: str) -> str:
    with BlockingMetaClient([address]) as meta:
        kv = meta.get(BOOKIE_REGISTRY_PREFIX + address)
    assert kv is not None
    instance = BookieRegistration.decode(kv.value).instance_id
    assert instance
    return instance


def test_node_with_a_wiped_journal_exits_with_the_message_not_a_traceback(
        wiped: tuple[Path, cluster.NodeInfo, str]) -> None:
    directory, node, instance = wiped
    out = subprocess.run([sys.executable, "-m", "quorumlog", "node", "--config", node.config],
                         capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert out.returncode == cluster.EXIT_CONFIG, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, out.stderr[-3000:]
    assert f"error: bookie {node.address} refuses to start: its journal directory" in errors[0]
    index = Path(node.config).parent / "data" / "ledgers" / "index"
    assert f"index directory {index} hold instance {instance}" in errors[0]
    assert f"quorumlog bookie format --force {node.address} --config" in errors[0]
    assert f"{cluster.META_ONLY_ENV} quorumlog node --config" in errors[0]
    # `quorumlog up` on the stopped cluster starts the same node and says why it died.
    up = cli("up", "--nodes", "1", "--dir", str(directory))
    assert up.returncode == 1
    assert f"node 1 exited during start-up: bookie {node.address} refuses to start" in up.stderr
    assert "Traceback" not in up.stderr


def test_format_on_a_one_node_cluster_brings_the_bookie_back_as_a_new_instance(
        wiped: tuple[Path, cluster.NodeInfo, str]) -> None:
    directory, node, old = wiped
    env = {**os.environ, "QUORUMLOG_NODE__ROLES": '["meta"]'}
    meta_only = subprocess.Popen(
        [sys.executable, "-m", "quorumlog", "node", "--config", node.config], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        with BlockingMetaClient([node.address]) as meta:
            # The stopped node revoked its bookie's registration before its rpc server
            # (and so its meta) stopped: gone at once, not after a session TTL.
            assert meta.get(BOOKIE_REGISTRY_PREFIX + node.address) is None
            assert meta.get(cookie_key(node.address)) is not None
        out = cli("bookie", "format", node.address, "--force", "--yes", "--config", node.config)
        assert out.returncode == 0, out.stderr
        assert f"bookie {node.address} formatted" in out.stdout
    finally:
        meta_only.send_signal(signal.SIGTERM)
        meta_only.wait(timeout=WAIT_S)
    up = cli("up", "--nodes", "1", "--dir", str(directory))
    assert up.returncode == 0, up.stderr
    new = _registered_instance(node.address)
    assert new != old
