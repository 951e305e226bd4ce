"""Structured logging for every quorumlog process (structlog over stdlib).

``configure()`` once at process start; then ``get_logger(__name__)`` and log
events with key/value context: ``log.info("segment_cut", seq=3, index=1200)``.
Output is human-readable on a terminal and JSON lines otherwise (or when
``json=True``), so node logs can be shipped and grepped.
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


def get_logger(name: str, **context: Any) -> Any:
    """A bound structlog logger named ``name`` with optional fixed context."""
    return structlog.get_logger(name).bind(**context) if context else structlog.get_logger(name)
