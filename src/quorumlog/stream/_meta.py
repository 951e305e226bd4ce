"""Reading and changing stream metadata in meta (compare-and-swap helpers)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence

from quorumlog.errors import DeadlineExceededError
from quorumlog.meta import Compare, CompareOp, CompareTarget, KeyValue, PutOp
from quorumlog.meta._client import MetaClient
from quorumlog.meta._commands import Op
from quorumlog.stream._errors import StreamNotFoundError
from quorumlog.stream._layout import (
    PartitionLedgers,
    StreamRecord,
    StreamState,
    check_name,
    config_key,
    partition_key,
)

CAS_ATTEMPTS_MAX = 64  # conflicting writers of one list (writer, trimmer, Spark commit)
CAS_BACKOFF_MAX_S = 0.2


def now_ms() -> int:
    return time.time_ns() // 1_000_000


async def load_record(meta: MetaClient, stream: str) -> StreamRecord:
    check_name("stream", stream)
    kv = await meta.get(config_key(stream))
    if kv is None:
        raise StreamNotFoundError(
            f"stream {stream!r} does not exist; create it with `quorumlog stream create {stream}`"
        )
    record = StreamRecord.decode(kv.value)
    if record.state is not StreamState.ACTIVE:
        raise StreamNotFoundError(f"stream {stream!r} is being deleted")
    return record


async def load_partition(meta: MetaClient, stream: str, partition: int
                         ) -> tuple[PartitionLedgers, KeyValue]:
    kv = await meta.get(partition_key(stream, partition))
    if kv is None:
        raise StreamNotFoundError(f"stream {stream!r} has no partition {partition}")
    return PartitionLedgers.decode(kv.value), kv


def version_is(key: str, version: int) -> Compare:
    return Compare(key=key, target=CompareTarget.VERSION, op=CompareOp.EQUAL, version=version)


def created_at(key: str, revision: int) -> Compare:
    return Compare(key=key, target=CompareTarget.CREATE_REVISION, op=CompareOp.EQUAL,
                   revision=revision)


async def update_partition(
    meta: MetaClient, stream: str, partition: int,
    edit: Callable[[PartitionLedgers], PartitionLedgers | None],
    *, compares: Sequence[Compare] = (), ops: Sequence[Op] = (),
    on_conflict: Callable[[], object] | None = None,
) -> PartitionLedgers | None:
    """Read-edit-CAS the partition's ledger list until it applies.

    ``edit`` returns the new list, or None to stop without writing (returns
    None then). ``compares`` and ``ops`` ride in the same transaction;
    ``on_conflict`` runs after a failed attempt (it may raise to give up, e.g.
    when the caller lost its writer lease).
    """
    key = partition_key(stream, partition)
    rng = random.Random()
    for attempt in range(CAS_ATTEMPTS_MAX):
        current, kv = await load_partition(meta, stream, partition)
        new = edit(current)
        if new is None:
            return None
        result = await meta.txn(
            compares=[version_is(key, kv.version), *compares],
            success=[PutOp(key=key, value=new.encode()), *ops],
        )
        if result.succeeded:
            return new
        if on_conflict is not None:
            check = on_conflict()
            if asyncio.iscoroutine(check):
                await check
        await asyncio.sleep(min(CAS_BACKOFF_MAX_S, 0.002 * 2**min(attempt, 7)) * rng.random())
    raise DeadlineExceededError(
        f"stream {stream!r} partition {partition}: the ledger list kept changing; "
        f"gave up after {CAS_ATTEMPTS_MAX} attempts"
    )
