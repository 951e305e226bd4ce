"""The asyncio side of Spark's synchronous data source calls.

Spark calls the data source from plain Python functions (``read`` is a
generator, ``write``/``commit`` are functions), in driver and executor worker
processes that Spark reuses across tasks. Each process keeps one event loop
on a daemon thread and one :class:`LedgerClient` per meta address list, so a
task does not reconnect and ``read`` can run one bounded read per yielded
batch (the loop thread keeps the connections serviced in between).
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from quorumlog import rpc
from quorumlog.ledger import LedgerClient, LedgerClientConfig
from quorumlog.stream import StreamRecord, load_record

T = TypeVar("T")

CALL_TIMEOUT_S = 600.0  # one bounded call (a batch of reads, a commit)
# A Spark task reads whole ledger ranges: batch reads of up to this many
# entries (the ledger client's default, 256, is sized for tailing readers)
# cost the reader and the bookie one request per 2,048 small entries instead
# of per 256. The bookie caps it (read_batch_entries_max, 10,000), and
# batch_read_bytes_max (4 MiB) still bounds one answer.
SPARK_BATCH_READ_ENTRIES_MAX = 2048
LOOP_THREAD_NAME = "quorumlog-spark-io"

_lock = threading.Lock()
_state: dict[str, Any] = {}


def _loop() -> rpc.LoopThread:
    """This process's loop thread. A process forked from one that had it (Spark
    forks its Python workers) has the object but not the thread: start anew."""
    with _lock:
        loop: rpc.LoopThread | None = _state.get("loop")
        if loop is None or _state.get("pid") != os.getpid():
            _configure_logging()
            loop = rpc.LoopThread(LOOP_THREAD_NAME, call_timeout_s=CALL_TIMEOUT_S)
            _state.clear()
            _state.update(loop=loop, pid=os.getpid(), clients={})
        return loop


def _configure_logging() -> None:
    """Spark's Python workers never configure logging: default to warnings on
    stderr (QUORUMLOG_LOG_LEVEL overrides), unless the process did it already."""
    import structlog

    if not structlog.is_configured():
        from quorumlog.log import configure

        configure(os.environ.get("QUORUMLOG_LOG_LEVEL", "WARNING"))


def run(coro: Coroutine[Any, Any, T], timeout_s: float = CALL_TIMEOUT_S) -> T:
    """Run ``coro`` on this process's quorumlog loop and wait for it; past
    ``timeout_s`` it is cancelled (``rpc.LoopCallTimeoutError``)."""
    return _loop().call(coro, timeout_s=timeout_s)


def submit(coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """Start ``coro`` on this process's quorumlog loop; the caller goes on (a
    reader decodes one chunk while the next one is read)."""
    return _loop().submit(coro)


async def _client(addresses: tuple[str, ...]) -> LedgerClient:
    clients: dict[tuple[str, ...], LedgerClient] = _state["clients"]
    client = clients.get(addresses)
    if client is None:
        client = await LedgerClient.connect(list(addresses), config=LedgerClientConfig(
            batch_read_entries_max=SPARK_BATCH_READ_ENTRIES_MAX))
        clients[addresses] = client
    return client


def ledger_client(addresses: Sequence[str]) -> LedgerClient:
    """This process's client for the cluster at ``addresses`` (kept open)."""
    _loop()
    return run(_client(tuple(addresses)))


def stream_record(addresses: Sequence[str], stream: str) -> StreamRecord:
    client = ledger_client(addresses)
    return run(load_record(client.meta, stream))
