"""[node] listen vs advertise: a node bound to a wildcard address registers and
serves under its advertised address; advertising a wildcard is refused with an
error naming the field. Real node processes on 127.0.0.1."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorumlog.errors import ConfigError
from quorumlog.node import load_node_config
from quorumlog.node._cluster import free_port

DEADLINE_S = 60.0
POLL_INTERVAL_S = 0.2
CLI_TIMEOUT_S = 60.0


def write_config(directory: Path, node: str, *, member: str) -> Path:
    path = directory / "node.toml"
    path.write_text(
        f'[node]\nid = 1\ndata_dir = "{directory / "data"}"\n{node}\n'
        'roles = ["meta", "bookie"]\n\n'
        f'[meta]\nmembers = ["1={member}"]\n\n[bookie]\nsession_ttl_ms = 4000\n')
    return path


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "quorumlog", *args], input=stdin,
                          capture_output=True, text=True, timeout=CLI_TIMEOUT_S)


@pytest.mark.parametrize(("node", "field"), [
    ('listen = "0.0.0.0:7101"', "node.listen"),
    ('listen = "0.0.0.0:7101"\nadvertise = "0.0.0.0:7101"', "node.advertise"),
    ('listen = "[::]:7101"\nadvertise = "[::]:7101"', "node.advertise"),
    ('listen = "127.0.0.1:7101"\nmetrics_listen = "0.0.0.0:9101"', "node.metrics_listen"),
    ('listen = "127.0.0.1:7101"\nmetrics_listen = "0.0.0.0:9101"\n'
     'metrics_advertise = "0.0.0.0:9101"', "node.metrics_advertise"),
])
def test_advertising_a_wildcard_is_refused_naming_the_field(
        tmp_path: Path, node: str, field: str) -> None:
    path = write_config(tmp_path, node, member="127.0.0.1:7101")
    with pytest.raises(ConfigError) as caught:
        load_node_config(path)
    assert field in caught.value.message and "wildcard" in caught.value.message


def test_meta_member_entry_must_be_the_advertised_address(tmp_path: Path) -> None:
    path = write_config(tmp_path, 'listen = "0.0.0.0:7101"\nadvertise = "127.0.0.1:7101"',
                        member="127.0.0.2:7101")
    with pytest.raises(ConfigError) as caught:
        load_node_config(path)
    assert "127.0.0.2:7101" in caught.value.message and "advertise" in caught.value.message


def test_node_refuses_a_wildcard_advertise_with_one_error_line(tmp_path: Path) -> None:
    path = write_config(tmp_path, 'listen = "0.0.0.0:7101"\nadvertise = "0.0.0.0:7101"',
                        member="127.0.0.1:7101")
    out = cli("node", "--config", str(path))
    assert out.returncode != 0
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert "node.advertise" in out.stderr, out.stderr[-3000:]
    assert not (tmp_path / "data").exists(), "a role started with a refused config"


@pytest.fixture
def wildcard_node(tmp_path: Path) -> Iterator[str]:
    """A meta+bookie node listening on 0.0.0.0 and advertising 127.0.0.1; yields the
    advertised address."""
    port, metrics = free_port(), free_port()
    advertised = f"127.0.0.1:{port}"
    path = write_config(
        tmp_path, f'listen = "0.0.0.0:{port}"\nadvertise = "{advertised}"\n'
        f'metrics_listen = "0.0.0.0:{metrics}"\nmetrics_advertise = "127.0.0.1:{metrics}"',
        member=advertised)
    with (tmp_path / "node.log").open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "quorumlog", "node", "--config", str(path)],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        yield advertised
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_node_on_wildcard_registers_and_serves_under_its_advertised_address(
        wildcard_node: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    bookies: list[dict[str, object]] = []
    while time.monotonic() < deadline:
        out = cli("bookie", "list", "--members", wildcard_node, "--json")
        if out.returncode == 0:
            bookies = json.loads(out.stdout)["bookies"]
            if bookies:
                break
        time.sleep(POLL_INTERVAL_S)
    assert [b["address"] for b in bookies] == [wildcard_node], bookies
    created = cli("ledger", "create", "-e", "1", "-w", "1", "-a", "1", "--meta", wildcard_node)
    assert created.returncode == 0, created.stderr[-3000:]
    ledger_id = created.stdout.strip().split()[-1]
    appended = cli("ledger", "append", ledger_id, "--meta", wildcard_node, stdin="a\nb\n")
    assert appended.returncode == 0, appended.stderr[-3000:]
    read = cli("ledger", "read", ledger_id, "--meta", wildcard_node)
    assert read.returncode == 0, read.stderr[-3000:]
    assert read.stdout.splitlines() == ["a", "b"]


def test_deploy_guide_node_toml_is_a_valid_config(tmp_path: Path) -> None:
    """docs/deploy.md's per-host TOML loads as written (listen 0.0.0.0, advertise)."""
    guide = (Path(__file__).resolve().parents[2] / "docs" / "deploy.md").read_text()
    block = guide.split("## One TOML per host", 1)[1].split("```toml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "node.toml"
    path.write_text(block.replace("/var/lib/quorumlog", str(tmp_path / "data")))
    cfg = load_node_config(path)
    assert cfg.node.advertise_address == "10.0.0.1:7100"
    assert cfg.node.metrics_advertise_address == "10.0.0.1:9100"
