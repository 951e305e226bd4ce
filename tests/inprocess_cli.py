"""``quorumlog ARGS`` run in the test's own process, as the entry point runs it.

A new interpreter per command costs about a second of CPU (imports), and the
modules that check listings and operator commands run dozens of them: on the
CI's two cores that was minutes of the default run. This runs the same typer
app with typer's runner and turns a ``QuorumlogError`` into the one ``error:``
line and exit code 1 that ``quorumlog.cli.main`` prints. Anything else that
escapes a command is raised, so the test fails with the traceback a user would
have seen.

What needs a real process stays one: the entry point itself
(tests/test_cli_entry.py), a terminal (rich progress), signals, and at least
one error path per module that checks no traceback reaches stderr.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping

TERMINAL_COLUMNS = 80


def run_cli(*args: str, stdin: str | None = None,
            env: Mapping[str, str | None] | None = None) -> subprocess.CompletedProcess[str]:
    """The outcome of ``quorumlog ARGS`` (returncode, stdout, stderr), with
    ``COLUMNS=80`` as a terminal of that width would give; ``env`` sets (or, with
    None, unsets) variables for the command."""
    from typer.testing import CliRunner

    from quorumlog.cli import app
    from quorumlog.errors import QuorumlogError

    runner = CliRunner(env={"COLUMNS": str(TERMINAL_COLUMNS), **(env or {})})
    result = runner.invoke(app, list(args), input=stdin)
    error = result.exception
    if error is not None and not isinstance(error, SystemExit):
        if isinstance(error, QuorumlogError):
            return subprocess.CompletedProcess(list(args), 1, result.stdout,
                                               result.stderr + f"error: {error.message}\n")
        raise error
    return subprocess.CompletedProcess(list(args), result.exit_code, result.stdout,
                                       result.stderr)


def run_cli_process(*args: str, stdin: str | None = None,
                    timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    """``python -m quorumlog ARGS`` in a new process, as a user runs it."""
    env = {**os.environ, "COLUMNS": str(TERMINAL_COLUMNS)}
    return subprocess.run([sys.executable, "-m", "quorumlog", *args], input=stdin,
                          capture_output=True, text=True, timeout=timeout_s, check=False,
                          env=env, stdin=None if stdin is not None else subprocess.DEVNULL)
