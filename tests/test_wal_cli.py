"""``quorumlog wal inspect|verify|repair``: exit codes and messages naming file and offset."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from typer.testing import CliRunner, Result

from quorumlog.cli import app
from quorumlog.wal import Wal, WalConfig, WalEntry, inspect
from quorumlog.wal._format import length_field

CONFIG = WalConfig(segment_size_bytes=4096)


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """The CLI configures logging onto CliRunner's streams; put it back afterwards."""
    saved = structlog.get_config()
    handlers = list(logging.getLogger().handlers)
    yield
    structlog.configure(**saved)
    logging.getLogger().handlers[:] = handlers


def _run(*args: str) -> Result:
    return CliRunner().invoke(app, ["wal", *args], env={"COLUMNS": "200"})


def _make(path: Path, count: int = 60) -> Path:
    with Wal.create(path, b"cli", config=CONFIG) as wal:
        for first in range(1, count + 1, 10):
            wal.save(b"s", [WalEntry(index=i, data=b"d" * 50) for i in range(first, first + 10)])
    return path


def _segments(path: Path) -> list[Path]:
    return sorted(path.glob("*.wal"))


def test_verify_clean_wal_exits_zero(tmp_path: Path) -> None:
    _make(tmp_path)
    result = _run("verify", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "ok:" in result.stdout
    assert "entries 1..60" in result.stdout


def test_verify_corrupt_wal_names_file_and_offset(tmp_path: Path) -> None:
    _make(tmp_path)
    first = _segments(tmp_path)[0]
    record = inspect(tmp_path, records_limit=20).records[10]
    image = bytearray(first.read_bytes())
    image[record.offset + 17] ^= 0x01
    first.write_bytes(bytes(image))
    result = _run("verify", str(tmp_path))
    assert result.exit_code == 1
    assert first.name in result.stderr
    assert f"byte offset {record.offset}" in result.stderr
    assert "CRC mismatch" in result.stderr
    repaired = _run("repair", str(tmp_path))
    assert repaired.exit_code == 1
    assert "cannot repair" in repaired.stderr
    inspected = _run("inspect", str(tmp_path))
    assert inspected.exit_code == 1
    assert "corrupt" in inspected.stdout


def test_repair_cuts_a_torn_tail_and_keeps_a_broken_copy(tmp_path: Path) -> None:
    _make(tmp_path)
    last = _segments(tmp_path)[-1]
    data_end = inspect(tmp_path, config=CONFIG).segments[-1].data_bytes
    with last.open("r+b") as f:
        f.seek(data_end)
        f.write(length_field(2000)[0].to_bytes(8, "little") + b"\xab" * 100)
    torn = _run("verify", str(tmp_path))
    assert torn.exit_code == 1
    assert "torn write" in torn.stderr and last.name in torn.stderr
    assert "quorumlog wal repair" in torn.stderr
    repaired = _run("repair", str(tmp_path))
    assert repaired.exit_code == 0, repaired.output
    assert f"at byte offset {data_end}" in repaired.stdout
    assert "108 bytes" in repaired.stdout
    assert Path(str(last) + ".broken").exists()
    assert _run("verify", str(tmp_path)).exit_code == 0
    again = _run("repair", str(tmp_path))
    assert again.exit_code == 0
    assert "nothing to repair" in again.stdout


def test_repair_of_a_locked_wal_fails_clearly(tmp_path: Path) -> None:
    _make(tmp_path)
    with Wal.open(tmp_path, config=CONFIG) as wal:
        wal.read_all()
        result = _run("repair", str(tmp_path))
    assert result.exit_code == 1
    assert "locked by another process" in result.stderr


def test_inspect_shows_segments_and_records(tmp_path: Path) -> None:
    _make(tmp_path, count=100)
    result = _run("inspect", str(tmp_path))
    assert result.exit_code == 0, result.output
    for segment in _segments(tmp_path):
        assert segment.name in result.stdout
    assert "verify: ok" in result.stdout
    listed = _run("inspect", str(tmp_path), "--records", "--limit", "5")
    assert listed.exit_code == 0
    assert "records (first 5)" in listed.stdout
    assert "metadata" in listed.stdout and "entry" in listed.stdout


def test_inspect_of_an_empty_directory_fails(tmp_path: Path) -> None:
    result = _run("inspect", str(tmp_path))
    assert result.exit_code == 1
    assert "holds no WAL" in result.stderr


@pytest.mark.parametrize("command", ["inspect", "verify", "repair"])
def test_every_command_has_help(command: str) -> None:
    result = _run(command, "--help")
    assert result.exit_code == 0
    assert "Usage" in result.stdout


def test_the_installed_entry_point_runs_wal_verify(tmp_path: Path) -> None:
    _make(tmp_path)
    done = subprocess.run([sys.executable, "-m", "quorumlog", "wal", "verify", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "ok:" in done.stdout


def _damage_mid_log(path: Path) -> None:
    """Flip a byte inside a synced record of the first segment: not a torn tail."""
    first = _segments(path)[0]
    record = inspect(path, records_limit=20).records[10]
    image = bytearray(first.read_bytes())
    image[record.offset + 17] ^= 0x01
    first.write_bytes(bytes(image))


def test_mid_log_damage_advice_does_not_send_the_operator_to_repair(tmp_path: Path) -> None:
    """Finding 8 of issue 13: the error said "`wal repair` cuts a torn tail" and
    `wal repair` then refused with the same text: advice in a circle."""
    _make(tmp_path)
    _damage_mid_log(tmp_path)
    run_repair = f"`quorumlog wal repair {tmp_path}`"
    verified = _run("verify", str(tmp_path))
    repaired = _run("repair", str(tmp_path))
    assert verified.exit_code == 1 and repaired.exit_code == 1
    for text in (" ".join(verified.stderr.split()), " ".join(repaired.stderr.split())):
        assert "CRC mismatch" in text, text
        assert "not a torn tail" in text and "`quorumlog wal repair` cannot fix it" in text, text
        assert run_repair not in text, text            # never "run repair" for this damage
        assert "cuts a torn tail" not in text, text
        # ...but a way out that exists: rebuild the replica from its peers
        assert "quorumlog meta member remove" in text and "quorumlog bookie format" in text, text
    assert "cannot repair:" in repaired.stderr


def test_torn_tail_advice_names_repair_and_repair_fixes_it(tmp_path: Path) -> None:
    _make(tmp_path)
    last = _segments(tmp_path)[-1]
    data_end = inspect(tmp_path, config=CONFIG).segments[-1].data_bytes
    with last.open("r+b") as f:
        f.seek(data_end)
        f.write(length_field(2000)[0].to_bytes(8, "little") + b"\xab" * 100)
    verified = " ".join(_run("verify", str(tmp_path)).stderr.split())
    assert "torn write at the end of the log" in verified, verified
    assert f"`quorumlog wal repair {tmp_path}` cuts it" in verified, verified
    assert "cannot fix" not in verified, verified
    assert _run("repair", str(tmp_path)).exit_code == 0


# Progress bars (issue 18): drawn on stderr only when it is a terminal, never
# with --quiet; stdout is the same either way.
BAR_DESCRIPTION = "reading "


def _inspect_subprocess(path: Path, *args: str, terminal: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "NO_COLOR")}
    env.update({"COLUMNS": "200", "TERM": "xterm"})
    if terminal:  # rich's switches for "this file is a terminal" (stderr is a pipe here)
        env.update({"TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1", "NO_COLOR": "1"})
    return subprocess.run([sys.executable, "-m", "quorumlog", *args, "wal", "inspect",
                           str(path)], capture_output=True, text=True, timeout=60, check=False,
                          env=env)


def test_inspect_draws_a_progress_bar_only_on_a_terminal(tmp_path: Path) -> None:
    _make(tmp_path, count=200)
    assert len(_segments(tmp_path)) >= 3
    plain = _inspect_subprocess(tmp_path, terminal=False)
    assert plain.returncode == 0, plain.stderr
    assert plain.stderr == ""
    bar = _inspect_subprocess(tmp_path, terminal=True)
    assert bar.returncode == 0, bar.stderr
    assert BAR_DESCRIPTION + str(tmp_path) in bar.stderr and "━" in bar.stderr, bar.stderr
    quiet = _inspect_subprocess(tmp_path, "--quiet", terminal=True)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    # The table on stdout is the same with and without a bar (colour is off in both).
    assert bar.stdout == quiet.stdout
