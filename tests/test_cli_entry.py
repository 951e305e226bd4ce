"""The CLI's entry point: `--version` loads nothing heavy, and error lines keep
text that looks like markup (config sections such as ``[security]``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CLI_TIMEOUT_S = 60.0


def test_version_answers_without_loading_the_cli_framework() -> None:
    code = ("import sys; sys.argv = ['quorumlog', '--version']\n"
            "from quorumlog.cli import main; main()\n"
            "print(sorted(m for m in ('typer', 'rich', 'structlog', 'msgspec') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=CLI_TIMEOUT_S, check=True).stdout.splitlines()
    assert out[0].startswith("quorumlog ") and out[1] == "[]"


def test_error_lines_keep_bracketed_config_sections(tmp_path: Path) -> None:
    security = tmp_path / "security.toml"
    security.write_text("[security]\nbogus = 1\n")
    result = subprocess.run(
        [sys.executable, "-m", "quorumlog", "--security", str(security), "meta", "get", "/x",
         "--members", "127.0.0.1:1"],
        capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False)
    assert result.returncode == 1
    assert "[security]" in result.stderr and "bogus" in result.stderr, result.stderr
