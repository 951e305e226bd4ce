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


# Modules a command loads when it runs, never for --version or --help (issue 18:
# every command took 0.9-1.3 s, --version 0.5 s, most of it these imports).
HEAVY_MODULES = ("structlog", "msgspec", "rocksdict", "pyspark", "uvloop", "asyncio",
                 "prometheus_client", "quorumlog.log", "quorumlog.wal",
                 "quorumlog.rpc", "quorumlog.meta", "quorumlog.ledger", "quorumlog.stream",
                 "quorumlog.table", "quorumlog.node", "quorumlog.bookie", "quorumlog.raft")
CLI_FRAMEWORK = ("typer", "rich", "click")


def imported_modules(*args: str) -> set[str]:
    """Every module ``python -X importtime -m quorumlog ARGS`` imports (not a timing:
    the names only)."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "quorumlog", *args],
                          capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=True)
    return module_names(done.stderr)


def module_names(importtime_stderr: str) -> set[str]:
    """The module names of ``-X importtime`` lines."""
    return {line.rsplit("|", 1)[1].strip() for line in importtime_stderr.splitlines()
            if line.startswith("import time:") and line.count("|") == 2} - {"package"}


def loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


def test_version_and_help_load_no_component_or_heavy_library() -> None:
    version = imported_modules("--version")
    assert "quorumlog.cli" in version  # the parse found the module lines
    # (importlib.metadata is not in the list: --version reads the version from it,
    # and typer 0.29's pydantic adapter loads it for a subcommand's --help.)
    assert loaded(version, HEAVY_MODULES + CLI_FRAMEWORK) == []
    for args in (("--help",), ("status", "--help"), ("stream", "list", "--help"),
                 ("wal", "inspect", "--help")):
        modules = imported_modules(*args)
        assert "typer" in modules, args
        assert loaded(modules, HEAVY_MODULES) == [], args


def test_a_node_process_starts_without_the_cli_framework(tmp_path: Path) -> None:
    """``quorumlog node --config FILE`` (how ``up`` and ``restart`` start every
    node) loads neither typer nor rich: about 1 s of CPU a node start on 2
    cores. A config it refuses still gives one ``error:`` line and exit code 1."""
    config = tmp_path / "node.toml"
    config.write_text('[node]\nid = "one"\n')
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "quorumlog", "node",
                           "--config", str(config)],
                          capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False)
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert errors and "node.id" in errors[0], done.stderr
    modules = module_names(done.stderr)
    assert "quorumlog.node" in modules  # the node's own code was loaded
    # structlog's "import rich" is attempted and refused (a 0-µs line named
    # "rich"), so nothing below it loads: rich.console, rich.traceback ...
    assert loaded(modules - {"rich"}, CLI_FRAMEWORK) == []
