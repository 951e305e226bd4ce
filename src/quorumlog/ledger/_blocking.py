"""The blocking ledger client: the asyncio client on its own loop thread."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar

from quorumlog import rpc
from quorumlog.ledger._batch import LedgerEntry
from quorumlog.ledger._client import LedgerClient, _connect
from quorumlog.ledger._config import LedgerClientConfig
from quorumlog.ledger._metadata import LedgerMetadata
from quorumlog.ledger._read import ReadHandle
from quorumlog.ledger._write import WriteHandle
from quorumlog.proto import DigestType

T = TypeVar("T")
H = TypeVar("H", WriteHandle, ReadHandle)

READ_CHUNK_ENTRIES = 1000
"""Entries a blocking ``read`` fetches per round trip to the loop thread."""
LOOP_THREAD_NAME = "quorumlog-ledger-client"


class BlockingLedgerClient:
    """``LedgerClient`` with blocking calls (its own event loop thread)."""

    def __init__(
        self, addresses: Sequence[str], *, config: LedgerClientConfig | None = None,
        security: rpc.RpcSecurityConfig | None = None,
    ) -> None:
        self._loop = rpc.LoopThread(LOOP_THREAD_NAME)
        try:
            self._client: LedgerClient = self._loop.call(_connect(addresses, config, security))
        except BaseException:
            self._loop.close()
            raise

    @property
    def client(self) -> LedgerClient:
        """The asyncio client underneath (use it only on its loop)."""
        return self._client

    @property
    def meta(self) -> Any:
        return self._client.meta

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the client's loop and wait for it."""
        return self._loop.call(coro)

    def __enter__(self) -> BlockingLedgerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._loop.closed:
            return
        try:
            self._loop.call(self._client.close())
        finally:
            self._loop.close()

    def create_ledger(
        self, ensemble: int = 3, write_quorum: int = 2, ack_quorum: int = 2, *,
        digest: str | DigestType = "crc32c", password: bytes = b"",
        placement: str = "random", metadata: Mapping[str, bytes] | None = None,
        bookies: Sequence[str] | None = None,
    ) -> BlockingWriteHandle:
        handle = self._loop.call(self._client.create_ledger(
            ensemble, write_quorum, ack_quorum, digest=digest, password=password,
            placement=placement, metadata=metadata, bookies=bookies))
        return BlockingWriteHandle(self._loop, handle)

    def open_ledger(self, ledger_id: int, *, password: bytes = b"",
                    recovery: bool = True) -> BlockingReadHandle:
        handle = self._loop.call(self._client.open_ledger(
            ledger_id, password=password, recovery=recovery))
        return BlockingReadHandle(self._loop, handle)

    def open_for_append(self, ledger_id: int, *, password: bytes = b"") -> BlockingWriteHandle:
        handle = self._loop.call(self._client.open_for_append(ledger_id, password=password))
        return BlockingWriteHandle(self._loop, handle)

    def delete_ledger(self, ledger_id: int, *, force: bool = False) -> None:
        self._loop.call(self._client.delete_ledger(ledger_id, force=force))

    def list_ledgers(self, *, limit: int = 10_000) -> list[int]:
        return self._loop.call(self._client.list_ledgers(limit=limit))

    def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        return self._loop.call(self._client.ledger_metadata(ledger_id))

    def last_add_confirmed(self, ledger_id: int) -> int:
        return self._loop.call(self._client.last_add_confirmed(ledger_id))


class _BlockingHandle(Generic[H]):
    """What a blocking write handle and a blocking read handle share."""

    def __init__(self, loop: rpc.LoopThread, handle: H) -> None:
        self._loop = loop
        self._handle: H = handle

    @property
    def handle(self) -> H:
        return self._handle

    @property
    def id(self) -> int:
        return self._handle.id

    @property
    def last_add_confirmed(self) -> int:
        return self._handle.last_add_confirmed

    @property
    def metadata(self) -> LedgerMetadata:
        return self._handle.metadata

    @property
    def is_closed(self) -> bool:
        return self._handle.is_closed


class BlockingWriteHandle(_BlockingHandle[WriteHandle]):
    def append(self, payload: bytes) -> int:
        return self._loop.call(self._handle.append(payload))

    def append_async(self, payload: bytes) -> concurrent.futures.Future[int]:
        """Queue an append (in call order); waits for room on the loop, not here."""
        return self._loop.submit(self._handle.append(payload))

    def close(self) -> None:
        self._loop.call(self._handle.close())

    def detach(self) -> None:
        self._loop.call(self._handle.detach())


class BlockingReadHandle(_BlockingHandle[ReadHandle]):
    def read(self, first: int, last: int) -> Iterator[LedgerEntry]:
        """Entries ``first..last`` in order, fetched in chunks."""
        start = first
        while start <= last:
            end = min(last, start + READ_CHUNK_ENTRIES - 1)
            yield from self._loop.call(self._handle.read_batch(start, end))
            start = end + 1

    def read_batch(self, first: int, last: int) -> list[LedgerEntry]:
        return self._loop.call(self._handle.read_batch(first, last))

    def read_last_add_confirmed(self) -> int:
        return self._loop.call(self._handle.read_last_add_confirmed())

    def wait_for_entry(self, after: int, timeout_ms: int = 1000) -> LedgerEntry | None:
        return self._loop.call(self._handle.wait_for_entry(after, timeout_ms))

    def close(self) -> None:
        self._loop.call(self._handle.close())
