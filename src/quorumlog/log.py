"""Structured logging for every quorumlog process (structlog over stdlib).

``configure()`` once at process start; then ``get_logger(__name__)`` and log
events with key/value context: ``log.info("segment_cut", seq=3, index=1200)``.
Output is human-readable on a terminal and JSON lines otherwise (or when
``json=True``), so node logs can be shipped and grepped.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


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
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


def get_logger(name: str, **context: Any) -> Any:
    """A bound structlog logger named ``name`` with optional fixed context."""
    return structlog.get_logger(name).bind(**context) if context else structlog.get_logger(name)
