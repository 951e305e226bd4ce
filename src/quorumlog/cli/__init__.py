"""The ``quorumlog`` command line.

Kept tiny: ``quorumlog --version`` answers without importing the CLI
framework or any component (issue 18: it took 0.7 s); ``quorumlog node
--config FILE``, the command ``quorumlog up`` and ``restart`` start every node
with, runs the node without the CLI framework or rich (together about 1 s
of CPU at each node start on this project's 2-core machines);
everything else loads the typer app in ``_app``.
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
    if len(sys.argv) == 4 and sys.argv[1:3] == ["node", "--config"]:
        _run_node(sys.argv[3])
        return
    from quorumlog.cli._app import main as run

    run()


def _run_node(config_path: str) -> None:
    """``quorumlog node --config FILE`` without the typer app: the same node and
    the same one-line ``error:`` and exit code 1 for a config it refuses."""
    _import_structlog_without_rich()
    from quorumlog.errors import QuorumlogError
    from quorumlog.node import load_node_config, run_node

    try:
        cfg = load_node_config(config_path)
    except QuorumlogError as exc:
        print(f"error: {exc.message}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    run_node(cfg)


def _import_structlog_without_rich() -> None:
    """Import structlog with its optional rich support off: ``structlog.dev``
    imports rich's console and traceback modules when rich is installed (about
    0.5 s of CPU here), only for its console renderer, and a node logs JSON
    lines. ``sys.modules[name] = None`` makes that import fail as if rich were
    absent; the entry is removed after, so a later ``import rich`` works."""
    if "structlog" in sys.modules or "rich" in sys.modules:
        return
    sys.modules["rich"] = None  # type: ignore[assignment]
    try:
        import structlog  # noqa: F401
    finally:
        del sys.modules["rich"]


def __getattr__(name: str) -> Any:
    """``from quorumlog.cli import app`` (tests, embedding) loads the typer app."""
    if name in ("app", "err_console"):
        from quorumlog.cli import _app

        return getattr(_app, name)
    raise AttributeError(f"module 'quorumlog.cli' has no attribute {name!r}")
