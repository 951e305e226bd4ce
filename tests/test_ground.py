"""The ground every component stands on: errors, invariant, config, CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from quorumlog import config
from quorumlog.errors import (
    ConfigError,
    InvariantViolation,
    NotLeaderError,
    QuorumlogError,
    StorageError,
    invariant,
)


class _Sample(config.Config, frozen=True):
    size_bytes: int = 1024
    timeout_ms: int = 100
    name: str = "x"
    fast: bool = False

    def validate(self) -> None:
        config.require(self.size_bytes > 0, "size_bytes must be positive")


def test_error_tree_retriable_flags() -> None:
    assert NotLeaderError("x", leader_hint="127.0.0.1:1").retriable
    assert not StorageError("x").retriable
    assert StorageError("x", retriable=True).retriable
    assert issubclass(InvariantViolation, QuorumlogError)


def test_invariant_survives_python_O() -> None:
    code = "from quorumlog.errors import invariant\ninvariant(False, 'boom')"
    proc = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "invariant violated: boom" in proc.stderr
    invariant(True, "fine")
    with pytest.raises(InvariantViolation):
        invariant(0, "zero is false")


def test_config_toml_and_env(tmp_path: Path) -> None:
    f = tmp_path / "n.toml"
    f.write_text('[s]\nsize_bytes = 2048\nname = "a"\n')
    env = {"QUORUMLOG_S__TIMEOUT_MS": "250", "QUORUMLOG_S__FAST": "true", "OTHER": "1"}
    cfg = config.load(_Sample, f, section="s", environ=env)
    assert cfg == _Sample(size_bytes=2048, timeout_ms=250, name="a", fast=True)
    assert config.load(_Sample, environ={}).size_bytes == 1024


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[s]\nsize_bytes = 0\n", "size_bytes must be positive"),
        ("[s]\nsize_byte = 3\n", "size_byte"),
        ("[s]\nsize_bytes = 'big'\n", "Expected `int`"),
        ("[s\n", "not valid TOML"),
    ],
)
def test_config_rejects_bad_input(tmp_path: Path, text: str, needle: str) -> None:
    f = tmp_path / "n.toml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        config.load(_Sample, f, section="s", environ={})


def test_config_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        config.load(_Sample, tmp_path / "nope.toml", environ={})


def test_config_replace_validates() -> None:
    with pytest.raises(ConfigError):
        _Sample().replace(size_bytes=-1)
    assert _Sample().replace(size_bytes=5).size_bytes == 5
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"size_bytes": "x"}, _Sample)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "quorumlog", *args], capture_output=True, text=True, timeout=60
    )


def test_cli_version_and_help() -> None:
    out = _cli("--version")
    assert out.returncode == 0
    assert out.stdout.startswith("quorumlog ")
    helped = _cli("--help")
    assert helped.returncode == 0
    assert "Usage" in helped.stdout


def test_logging_survives_a_swapped_and_closed_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    """An in-process CLI call configures logging while sys.stderr is a stand-in."""
    import io

    import structlog

    from quorumlog.log import configure, get_logger

    saved_config, saved_stderr = structlog.get_config(), sys.stderr
    stand_in = io.StringIO()
    try:
        sys.stderr = stand_in
        configure("INFO", json=True)
        get_logger("t").info("while_swapped")
        sys.stderr = saved_stderr
        stand_in.close()
        get_logger("t").error("after_restore", n=1)  # raised ValueError when bound to stand_in
    finally:
        sys.stderr = saved_stderr
        structlog.configure(**saved_config)
    assert '"event": "after_restore"' in capsys.readouterr().err
