"""Stream statistics after Pulsar's ``topics stats``: rates, backlog, storage.

Rates come from two samples of what meta and the bookies expose, taken
``interval_s`` apart:

- **in** — the partition's end (entries of closed ledgers plus the open
  ledger's LAC + 1, as bookies report it) moves by some entries; the entries
  added between the samples are then read (at most
  ``STATS_READ_ENTRIES_MAX`` per partition) to count their messages (a batch
  entry holds many) and bytes. Past that cap the message and byte rates are
  lower bounds (``in_exact`` false); the entry rate is always exact.
- **out** — per subscription, how far the mark-delete position moved, in
  entries (acknowledged entries per second; reading them again to count
  messages would double the read load of every consumer).
- **backlog** — entries after the mark-delete up to the end, as
  ``stream subscriptions`` counts it.
- **storage** — bytes of the closed ledgers kept. The open ledger's size is
  not known without reading it, so while it holds entries the figure is a
  lower bound (``storage_exact`` false), never a guess.
- **producers / consumers** — a partition has one writer at most (its lease
  key); an exclusive subscription has one consumer at most (its owner key), a
  failover one a consumer per member key.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from quorumlog.errors import UsageError
from quorumlog.ledger import LedgerClient
from quorumlog.stream._cursor import CursorState
from quorumlog.stream._entry import decode_entry
from quorumlog.stream._layout import (
    PartitionHead,
    StreamRecord,
    cursor_key_kind,
    cursors_prefix,
    writer_key,
)
from quorumlog.stream._ledgers import LedgerList
from quorumlog.stream._meta import load_record
from quorumlog.stream._position import SeqPosition
from quorumlog.stream._reader import LedgerHandles, end_position
from quorumlog.stream._subscriptions import _entry_offset

STATS_READ_ENTRIES_MAX = 5000  # entries read per partition per sample to count msgs and bytes
STATS_INTERVAL_S_MAX = 300.0  # a longer sampling interval is a typo, not a wish
READ_CHUNK_ENTRIES = 500  # entries per read request while counting


@dataclass
class _PartitionSample:
    end: SeqPosition  # after the last readable entry
    end_offset: int  # entries of the partition before ``end`` (trimmed ones included)
    head: PartitionHead
    open_entries: bool  # the open ledger holds confirmed entries
    producer: bool
    consumed: dict[str, int] = field(default_factory=dict)  # subscription -> first unacked offset


@dataclass
class _Sample:
    at_s: float
    partitions: list[_PartitionSample]
    owners: dict[str, int]  # subscription -> its consumers (exclusive: 1)


async def _first_unconsumed(ledgers: LedgerList, head: PartitionHead, state: CursorState,
                            end_offset: int) -> int:
    """Offset of the first entry the cursor has not acknowledged (as backlog counts it)."""
    if state.mark_delete is not None:
        consumed = await _entry_offset(ledgers, state.mark_delete)
        first = None if consumed is None else consumed + 1
    else:
        first = None if state.start is None else await _entry_offset(ledgers, state.start)
    if first is None:  # before everything kept: from the first kept entry
        info = await ledgers.get(head.first_seq)
        first = info.entries_before if info is not None else end_offset
    return min(first, end_offset)


async def _sample(client: LedgerClient, record: StreamRecord, handles: LedgerHandles,
                  lists: list[LedgerList]) -> _Sample:
    prefix = cursors_prefix(record.name)
    cursors: dict[str, dict[int, CursorState]] = {}
    owners: dict[str, int] = {}
    for kv in await client.meta.list_keys(prefix):
        subscription, kind, detail = cursor_key_kind(record.name, kv.key)
        if kind in ("owner", "member"):
            owners[subscription] = owners.get(subscription, 0) + 1
        elif kind == "cursor":
            cursors.setdefault(subscription, {})[int(detail)] = CursorState.decode(kv.value)
    partitions = []
    for partition, ledgers in enumerate(lists):
        head = await ledgers.refresh()
        end = await end_position(handles, head)
        offset = await _entry_offset(ledgers, end)
        end_offset = head.entries_total if offset is None else offset
        last = head.last_ledger
        sample = _PartitionSample(
            end=end, end_offset=end_offset, head=head,
            open_entries=last is not None and last.is_open and end.entry_id > 0,
            producer=await client.meta.get(writer_key(record.name, partition)) is not None)
        for subscription, per in cursors.items():
            if partition in per:
                sample.consumed[subscription] = await _first_unconsumed(
                    ledgers, head, per[partition], end_offset)
        partitions.append(sample)
    return _Sample(time.monotonic(), partitions, owners)


async def _count_added(ledgers: LedgerList, handles: LedgerHandles, before: SeqPosition,
                       after: SeqPosition) -> tuple[int, int, bool]:
    """Messages and bytes of the entries from ``before`` up to ``after`` (exclusive),
    reading at most STATS_READ_ENTRIES_MAX; the flag says whether all were read."""
    messages = size = 0
    budget = STATS_READ_ENTRIES_MAX
    for seq in range(before.seq, after.seq + 1):
        info = await ledgers.get(seq)
        if info is None:
            return messages, size, False  # trimmed meanwhile
        first = before.entry_id if seq == before.seq else 0
        stop = after.entry_id if seq == after.seq else info.entries
        handle = None
        while first < stop:
            if budget <= 0:
                return messages, size, False
            last = min(stop, first + min(READ_CHUNK_ENTRIES, budget)) - 1
            handle = handle or await handles.get(info)
            for entry in await handle.read_batch(first, last):
                payload = bytes(entry.payload)
                messages += len(decode_entry(payload))
                size += len(payload)
            budget -= last - first + 1
            first = last + 1
    return messages, size, True


def _rate(amount: float, elapsed_s: float) -> float:
    return round(amount / elapsed_s, 3)


async def stream_stats(client: LedgerClient, name: str, *, interval_s: float = 1.0
                       ) -> dict[str, Any]:
    """Rates, backlog and storage of a stream per partition and in total, from two
    samples ``interval_s`` apart (see the module doc for what each number means)."""
    if not 0 < interval_s <= STATS_INTERVAL_S_MAX:
        raise UsageError(f"the sampling interval must be within 0..{STATS_INTERVAL_S_MAX:g} s, "
                         f"got {interval_s:g}")
    record = await load_record(client.meta, name)
    handles = LedgerHandles(client, record)
    lists = [LedgerList(client.meta, name, p) for p in range(record.config.partitions)]
    first = await _sample(client, record, handles, lists)
    await asyncio.sleep(interval_s)
    second = await _sample(client, record, handles, lists)
    elapsed_s = max(second.at_s - first.at_s, 1e-6)
    partitions = []
    for p, (a, b) in enumerate(zip(first.partitions, second.partitions, strict=True)):
        messages, size, exact = await _count_added(lists[p], handles, a.end, b.end)
        subscriptions = {
            sub: {"backlog_entries": b.end_offset - consumed,
                  "out_entries_per_s": _rate(max(0, consumed - a.consumed.get(sub, consumed)),
                                             elapsed_s),
                  "consumers": second.owners.get(sub, 0)}
            for sub, consumed in sorted(b.consumed.items())}
        partitions.append({
            "partition": p,
            "in_entries_per_s": _rate(max(0, b.end_offset - a.end_offset), elapsed_s),
            "in_msgs_per_s": _rate(messages, elapsed_s),
            "in_bytes_per_s": _rate(size, elapsed_s),
            "in_exact": exact,
            "entries": b.end_offset - b.head.trimmed_entries,
            "storage_bytes": b.head.kept_bytes,
            "storage_exact": not b.open_entries,
            "ledgers": b.head.ledger_count,
            "producers": int(b.producer),
            "subscriptions": subscriptions,
        })
    return {"name": name, "interval_s": round(elapsed_s, 3), "partitions": partitions,
            "total": _totals(partitions)}


def _totals(partitions: list[dict[str, Any]]) -> dict[str, Any]:
    def total(key: str) -> Any:
        return sum(p[key] for p in partitions)

    subscriptions: dict[str, dict[str, Any]] = {}
    for part in partitions:
        for sub, stats in part["subscriptions"].items():
            into = subscriptions.setdefault(sub, {"backlog_entries": 0, "out_entries_per_s": 0.0,
                                                  "consumers": 0})
            into["backlog_entries"] += stats["backlog_entries"]
            into["out_entries_per_s"] = round(into["out_entries_per_s"]
                                              + stats["out_entries_per_s"], 3)
            into["consumers"] = max(into["consumers"], stats["consumers"])
    return {
        "in_entries_per_s": round(total("in_entries_per_s"), 3),
        "in_msgs_per_s": round(total("in_msgs_per_s"), 3),
        "in_bytes_per_s": round(total("in_bytes_per_s"), 3),
        "in_exact": all(p["in_exact"] for p in partitions),
        "entries": total("entries"), "storage_bytes": total("storage_bytes"),
        "storage_exact": all(p["storage_exact"] for p in partitions),
        "ledgers": total("ledgers"), "producers": total("producers"),
        "subscriptions": dict(sorted(subscriptions.items())),
    }
