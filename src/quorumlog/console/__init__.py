"""The web console (``quorumlog console``): cluster and meta members, bookies,
streams, ledgers, tables, recovery and duplication lag, as pages with charts
and as JSON (``/api/...``). See docs/console.md.

A separate process reading the cluster through the public clients (meta,
ledger, stream, table, recovery), like any other client: it sits above
``node`` and beside ``spark`` and ``sim``, and needs nothing from the nodes
but the rpc they already serve.
"""

from quorumlog.console._collect import LEDGERS_SHOWN_MAX, Collector, Snapshot, bookie_state
from quorumlog.console._history import SAMPLES_MAX, History, Point
from quorumlog.console._render import line_chart
from quorumlog.console._server import (
    INTERVAL_S_DEFAULT,
    INTERVAL_S_MIN,
    Console,
    ConsoleConfig,
    serve,
)

__all__ = [
    "INTERVAL_S_DEFAULT",
    "INTERVAL_S_MIN",
    "LEDGERS_SHOWN_MAX",
    "SAMPLES_MAX",
    "Collector",
    "Console",
    "ConsoleConfig",
    "History",
    "Point",
    "Snapshot",
    "bookie_state",
    "line_chart",
    "serve",
]
