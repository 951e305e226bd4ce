"""Helpers of the bookie server tests: small configs, entry envelopes, a client."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quorumlog import rpc
from quorumlog.bookie import BookieConfig, local_config
from quorumlog.ledger import DigestType
from quorumlog.proto import (
    FLAG_NO_SYNC,
    FLAG_RECOVERY,
    AddEntriesRequest,
    AddEntriesResponse,
    AddEntryRequest,
    AddEntryResponse,
    ReadEntryRequest,
    decode_entry,
    encode_entry,
)

KEY = b"server-test-master-key"
KIB = 1024
MIB = 1024 * KIB
ENTRY_SIZE_MAX_BYTES = 3000


def small_bookie_config(directory: Path, **changes: Any) -> BookieConfig:
    """Small bounds so flushes, checkpoints, journal segment release and log rolls happen."""
    base = local_config(directory).replace(
        journal_segment_size_bytes=256 * KIB,
        journal_max_wait_us=200,
        flush_interval_ms=200,
        disk_check_interval_ms=200,
        session_ttl_ms=2000,
        registration_retry_ms=100,
    )
    storage = base.storage.replace(
        write_cache_max_bytes=2 * MIB,
        entry_max_bytes=64 * KIB,
        entry_log_max_bytes=256 * KIB,
        read_cache_max_bytes=512 * KIB,
        read_cache_segment_count=4,
        compaction_read_bytes=128 * KIB,
        compaction_batch_bytes=64 * KIB,
        index_write_buffer_bytes=MIB,
        index_block_cache_bytes=MIB,
    )
    return base.replace(storage=storage, **changes)


def payload(ledger_id: int, entry_id: int) -> bytes:
    size = 1 + (ledger_id * 7919 + entry_id * 104729) % ENTRY_SIZE_MAX_BYTES
    seed = f"<{ledger_id}:{entry_id}>".encode()
    return (seed * (size // len(seed) + 1))[:size]


def envelope(ledger_id: int, entry_id: int, lac: int | None = None,
             data: bytes | None = None) -> bytes:
    return encode_entry(ledger_id, entry_id, entry_id - 1 if lac is None else lac,
                        payload(ledger_id, entry_id) if data is None else data,
                        digest=DigestType.CRC32C)


def check_entry(data: memoryview | bytes, ledger_id: int, entry_id: int) -> None:
    """The envelope read back is the one written: digest, ids and payload."""
    got = decode_entry(data, ledger_id=ledger_id, entry_id=entry_id, digest=DigestType.CRC32C)
    assert bytes(got.payload) == payload(ledger_id, entry_id), f"{ledger_id}:{entry_id} differs"


async def connect(address: str) -> rpc.Connection:
    host, port = address.rsplit(":", 1)
    return await rpc.connect(host, int(port))


async def add(conn: rpc.Connection, ledger_id: int, entry_id: int, *, key: bytes = KEY,
              recovery: bool = False, no_sync: bool = False,
              data: bytes | None = None) -> AddEntryResponse:
    flags = (FLAG_RECOVERY if recovery else 0) | (FLAG_NO_SYNC if no_sync else 0)
    return await conn.call(
        AddEntryRequest(ledger_id=ledger_id, entry_id=entry_id, master_key=key, flags=flags),
        payload=envelope(ledger_id, entry_id) if data is None else data, timeout_s=10)


async def read(conn: rpc.Connection, ledger_id: int, entry_id: int) -> memoryview:
    _, data = await conn.call_with_payload(
        ReadEntryRequest(ledger_id=ledger_id, entry_id=entry_id), timeout_s=10)
    return data


async def add_batch(conn: rpc.Connection, ledger_id: int, envelopes: list[tuple[int, bytes]],
                    *, key: bytes = KEY, recovery: bool = False,
                    no_sync: bool = False) -> AddEntriesResponse:
    """One ``AddEntriesRequest`` of (entry id, envelope) pairs."""
    flags = (FLAG_RECOVERY if recovery else 0) | (FLAG_NO_SYNC if no_sync else 0)
    request = AddEntriesRequest(
        ledger_id=ledger_id, entry_ids=[e for e, _ in envelopes],
        sizes=[len(data) for _, data in envelopes], master_key=key, flags=flags)
    return await conn.call(request, payload=b"".join(data for _, data in envelopes),
                           timeout_s=10)
