"""The ``quorumlog`` command line.

Kept tiny: ``quorumlog --version`` answers without importing the CLI
framework or any component (issue 18: it took 0.7 s); everything else loads
the typer app in ``_app``.
"""

from __future__ import annotations

import sys
from typing import Any


def main() -> None:
    """Entry point: a QuorumlogError becomes a one-line message and exit code 1."""
    if sys.argv[1:] == ["--version"]:
        from quorumlog import __version__

        print(f"quorumlog {__version__}")
        return
    from quorumlog.cli._app import main as run

    run()


def __getattr__(name: str) -> Any:
    """``from quorumlog.cli import app`` (tests, embedding) loads the typer app."""
    if name in ("app", "err_console"):
        from quorumlog.cli import _app

        return getattr(_app, name)
    raise AttributeError(f"module 'quorumlog.cli' has no attribute {name!r}")
