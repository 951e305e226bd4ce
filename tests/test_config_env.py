"""Environment overrides: an error caused by a ``QUORUMLOG_*`` value names the
variable and its value (not the TOML file), a one-underscore variable is
rejected with the name it meant, and the variables quorumlog reads directly
are left alone."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from quorumlog import config
from quorumlog.errors import ConfigError
from quorumlog.node import NodeConfig
from quorumlog.rpc import RpcSecurityConfig

SRC = Path(__file__).parent.parent / "src" / "quorumlog"
CLI_TIMEOUT_S = 60.0
NODE_TOML = """\
[node]
id = 1
data_dir = "{data}"
listen = "127.0.0.1:7101"
roles = ["meta"]

[meta]
members = ["1=127.0.0.1:7101"]
"""


@pytest.fixture
def node_toml(tmp_path: Path) -> Path:
    path = tmp_path / "node.toml"
    path.write_text(NODE_TOML.format(data=tmp_path / "data"))
    return path


def load_error(path: Path, env: dict[str, str]) -> str:
    with pytest.raises(ConfigError) as caught:
        config.load(NodeConfig, path, environ=env)
    return caught.value.message


@pytest.mark.parametrize(("name", "value", "needle"), [
    ("QUORUMLOG_NODE__ID", "abc", "Expected `int`"),          # type error (msgspec)
    ("QUORUMLOG_NODE__ID", "0", "node id must be >= 1"),       # validate() error
    ("QUORUMLOG_NODE__LISTEN", "nope", "must look like host:port"),
    ("QUORUMLOG_META__READ_MODE", "fast", "Invalid enum value"),
    ("QUORUMLOG_NODE__IDD", "3", "unknown field `idd`"),       # unknown field
])
def test_a_bad_env_value_names_the_variable_and_not_the_file(
        node_toml: Path, name: str, value: str, needle: str) -> None:
    message = load_error(node_toml, {name: value, "QUORUMLOG_NODE__LOG_LEVEL": "INFO"})
    assert message.startswith(f"environment variable {name}={value!r}: "), message
    assert needle in message, message
    assert str(node_toml) not in message, message
    assert "QUORUMLOG_NODE__LOG_LEVEL" not in message, message  # only the guilty one


@pytest.mark.parametrize(("name", "meant"), [
    ("QUORUMLOG_NODE_ID", "QUORUMLOG_NODE__ID"),
    ("QUORUMLOG_META_READ_MODE", "QUORUMLOG_META__READ_MODE"),
    ("QUORUMLOG_BOOKIE_STORAGE_WRITE_CACHE_MAX_BYTES",
     "QUORUMLOG_BOOKIE__STORAGE__WRITE_CACHE_MAX_BYTES"),
])
def test_a_one_underscore_override_is_rejected_with_the_name_it_meant(
        node_toml: Path, name: str, meant: str) -> None:
    message = load_error(node_toml, {name: "2"})
    assert f"environment variable {name}='2'" in message, message
    assert f"did you mean {meant}?" in message, message


def test_an_override_of_a_section_the_config_lacks_is_rejected(node_toml: Path) -> None:
    message = load_error(node_toml, {"QUORUMLOG_NOD__ID": "2"})
    assert "QUORUMLOG_NOD__ID='2'" in message and "[nod]" in message, message


def test_a_client_reading_security_rejects_a_one_underscore_security_variable() -> None:
    with pytest.raises(ConfigError, match="did you mean QUORUMLOG_SECURITY__TOKEN"):
        config.load(RpcSecurityConfig, section="security",
                    environ={"QUORUMLOG_SECURITY_TOKEN": "secret"})
    # another section's override is not the client's business
    loaded = config.load(RpcSecurityConfig, section="security",
                         environ={"QUORUMLOG_NODE__ID": "x", "QUORUMLOG_SECURITY__TOKEN": "t"})
    assert loaded.token == "t"


def test_variables_read_directly_are_not_overrides(node_toml: Path) -> None:
    env = {name: "1" for name in config.DIRECT_ENV_VARIABLES}
    loaded = config.load(NodeConfig, node_toml, environ={**env, "QUORUMLOG_NODE__ID": "1"})
    assert loaded.node.id == 1


def test_every_variable_the_code_reads_directly_is_allow_listed() -> None:
    """A new ``os.environ.get("QUORUMLOG_X")`` or ``envvar="QUORUMLOG_X"`` must be
    added to DIRECT_ENV_VARIABLES, or every node and client would reject it."""
    read = re.compile(
        r"""(?:environ\.get\(|environ\[|envvar=|getenv\()\s*["'](QUORUMLOG_[A-Z0-9_]+)""")
    scripts = re.compile(r"\$\{?(QUORUMLOG_[A-Z0-9_]+)")
    found: set[str] = set()
    for path in [*SRC.rglob("*.py"), *(SRC.parent.parent / "tests").rglob("*.py")]:
        if path == Path(__file__):
            continue
        found |= set(read.findall(path.read_text()))
    for path in (SRC.parent.parent / "scripts").glob("*.sh"):
        found |= set(scripts.findall(path.read_text()))
    direct = {name for name in found if "__" not in name.removeprefix("QUORUMLOG_")}
    assert direct, "the scan found nothing: the pattern is broken"
    assert direct <= config.DIRECT_ENV_VARIABLES, direct - config.DIRECT_ENV_VARIABLES


def test_node_command_with_a_one_underscore_variable_is_one_error_line(node_toml: Path) -> None:
    env = {**os.environ, "QUORUMLOG_NODE_ID": "2"}
    out = subprocess.run([sys.executable, "-m", "quorumlog", "node", "--config", str(node_toml)],
                         capture_output=True, text=True, timeout=CLI_TIMEOUT_S, env=env,
                         stdin=subprocess.DEVNULL)
    stderr = " ".join(out.stderr.split())
    assert out.returncode == 1, stderr
    assert "Traceback" not in stderr, stderr
    assert "QUORUMLOG_NODE_ID='2'" in stderr and "did you mean QUORUMLOG_NODE__ID?" in stderr, \
        stderr
