"""Structured logging for every quorumlog process (structlog over stdlib).

``configure()`` once at process start; then ``get_logger(__name__)`` and log
events with key/value context: ``log.info("segment_cut", seq=3, index=1200)``.
Output is human-readable on a terminal and JSON lines otherwise (or when
``json=True``), so node logs can be shipped and grepped. The CLI and the node
processes call ``configure()``.

Used as a library (nothing called ``configure()``), quorumlog follows the
``logging`` convention: its events go to the standard ``logging`` loggers
named after its modules (``quorumlog.stream._writer`` ...), which have a
``NullHandler``, so nothing is printed until the application configures
``logging`` (``logging.basicConfig(level=logging.INFO)`` shows INFO and up).
Before, an unconfigured structlog printed every DEBUG line to stdout.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import Any

import structlog


class _CurrentStderrLogger:
    """Writes each line to the ``sys.stderr`` of the moment, not the one at configure time.

    A CLI command run in-process (``typer.testing.CliRunner``, a notebook) swaps
    ``sys.stderr`` and closes its stand-in afterwards; a logger bound to the
    stand-in would then fail every later log call with "I/O operation on closed
    file" and turn logging into a crash.
    """

    def msg(self, message: str) -> None:
        # A closed stand-in that was never put back: drop the line.
        with contextlib.suppress(ValueError):
            print(message, file=sys.stderr, flush=True)

    log = debug = info = warn = warning = error = critical = exception = fatal = msg


def _logger_factory(*_args: Any) -> _CurrentStderrLogger:
    return _CurrentStderrLogger()


def configure(level: str = "INFO", *, json: bool | None = None) -> None:
    as_json = (not sys.stderr.isatty()) if json is None else json
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if as_json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    logging.basicConfig(level=level.upper(), stream=sys.stderr, format="%(message)s")
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=_logger_factory,
        cache_logger_on_first_use=True,
    )


def _library_defaults() -> None:
    """Route events to stdlib ``logging`` unless someone configured structlog already."""
    logging.getLogger("quorumlog").addHandler(logging.NullHandler())
    if structlog.is_configured():
        return
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            structlog.contextvars.merge_contextvars,
            structlog.processors.format_exc_info,
            structlog.processors.KeyValueRenderer(key_order=["event"], sort_keys=True),
        ],
        wrapper_class=structlog.stdlib.BoundLogger,
        logger_factory=structlog.stdlib.LoggerFactory(),
        # Not cached: a later configure() (the CLI, a node) must reach loggers
        # that were already used.
        cache_logger_on_first_use=False,
    )


_library_defaults()


def get_logger(name: str, **context: Any) -> Any:
    """A bound structlog logger named ``name`` with optional fixed context."""
    return structlog.get_logger(name).bind(**context) if context else structlog.get_logger(name)
