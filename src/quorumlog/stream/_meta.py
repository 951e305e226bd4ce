"""Reading and changing stream metadata in meta (compare-and-swap helpers)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence

from quorumlog.errors import DeadlineExceededError
from quorumlog.meta import (
    CompactedError,
    Compare,
    CompareOp,
    CompareTarget,
    KeyValue,
    MetaClient,
    Op,
    PutOp,
)
from quorumlog.stream._errors import StreamNotFoundError
from quorumlog.stream._layout import (
    TAIL_LEDGERS_MAX,
    PartitionHead,
    StreamRecord,
    StreamState,
    check_name,
    config_key,
    partition_key,
    run_key,
)

CAS_ATTEMPTS_MAX = 64  # conflicting writers of one list (writer, trimmer, Spark commit)
CAS_BACKOFF_MAX_S = 0.2


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


async def load_head(meta: MetaClient, stream: str, partition: int
                    ) -> tuple[PartitionHead, KeyValue]:
    """The partition's head (counters and last ledgers) and its key-value."""
    kv = await meta.get(partition_key(stream, partition))
    if kv is None:
        raise StreamNotFoundError(f"stream {stream!r} has no partition {partition}")
    return PartitionHead.decode(kv.value), kv


async def watch_key_once(meta: MetaClient, key: str, *, start_revision: int,
                         wait_ms: int) -> None:
    """Wait up to ``wait_ms`` for a change of ``key`` at ``start_revision`` or later.

    Returns early on a change; the caller then re-reads what it watches. Meta
    keeps a bounded watch history, so on a busy cluster an idle watcher's
    ``start_revision`` may be compacted away (CompactedError). Then the key is
    re-read: if it changed since ``start_revision`` this returns at once (the
    caller re-reads it), otherwise nothing was missed and the watch resumes
    from the current revision.
    """
    try:
        await meta.watch_once(key, start_revision=start_revision, wait_ms=wait_ms)
        return
    except CompactedError:
        result, revision = await meta.range(key)
    if not result.kvs or any(kv.mod_revision >= start_revision for kv in result.kvs):
        return  # changed or deleted in the compacted part: the caller re-reads it
    try:
        await meta.watch_once(key, start_revision=revision + 1, wait_ms=wait_ms)
    except CompactedError:
        return  # compacted again meanwhile: the caller re-reads and watches again


def version_is(key: str, version: int) -> Compare:
    return Compare(key=key, target=CompareTarget.VERSION, op=CompareOp.EQUAL, version=version)


def created_at(key: str, revision: int) -> Compare:
    return Compare(key=key, target=CompareTarget.CREATE_REVISION, op=CompareOp.EQUAL,
                   revision=revision)


async def update_partition(
    meta: MetaClient, stream: str, partition: int,
    edit: Callable[[PartitionHead], PartitionHead | None],
    *, compares: Sequence[Compare] = (), ops: Sequence[Op] = (),
    on_conflict: Callable[[], object] | None = None,
) -> PartitionHead | None:
    """Read-edit-CAS the partition's head until it applies.

    ``edit`` returns the new head, or None to stop without writing (returns
    None then). A tail longer than ``TAIL_LEDGERS_MAX`` moves to a new archive
    run in the same transaction (one more key). ``compares`` and ``ops`` ride
    in the same transaction; ``on_conflict`` runs after a failed attempt (it
    may raise to give up, e.g. when the caller lost its writer lease).
    """
    key = partition_key(stream, partition)
    rng = random.Random()
    for attempt in range(CAS_ATTEMPTS_MAX):
        current, kv = await load_head(meta, stream, partition)
        new = edit(current)
        if new is None:
            return None
        new, runs = new.archived(TAIL_LEDGERS_MAX)
        result = await meta.txn(
            compares=[version_is(key, kv.version), *compares],
            success=[PutOp(key=key, value=new.encode()),
                     *(PutOp(key=run_key(stream, partition, run.last_seq), value=run.encode())
                       for run in runs),
                     *ops],
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


async def tidy_partition(meta: MetaClient, stream: str, partition: int) -> None:
    """Archive a tail longer than ``TAIL_LEDGERS_MAX`` (a Spark commit leaves
    one: it writes only heads, to stay within meta's transaction bound)."""
    await update_partition(meta, stream, partition,
                           lambda head: head if len(head.tail) > TAIL_LEDGERS_MAX else None)
