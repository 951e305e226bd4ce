"""Planning reads: which entry ranges of which ledgers each Spark task reads.

Positions here are :class:`SeqPosition` (ordered by the ledger's place in its
partition). A read covers ``[start, end)``: ``start`` inclusive (may point
into an entry's batch), ``end`` exclusive. The end of an open ledger is its
LAC + 1 at planning time, so no task reads past the LAC. The functions take
the consecutive ledgers of the stretch they plan (the driver reads only
those from meta, see ``quorumlog.stream._ledgers``).

Streaming offsets are JSON objects ``{"<partition>": {"seq": s, "ledger": l,
"entry": e, "batch": b}}`` meaning "the next message to read".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from quorumlog.chunks import by_size
from quorumlog.errors import UsageError
from quorumlog.stream import (
    BadPositionError,
    CompactionRecord,
    DataLossError,
    LedgerInfo,
    OffloadRecord,
    PartitionHead,
    SeqPosition,
)


@dataclass(frozen=True, slots=True)
class ReadTask:
    """Entries ``first_entry..last_entry`` of one ledger; a Spark partition
    reads one or more of them (``group_tasks``)."""

    stream: str
    partition: int
    seq: int
    ledger_id: int
    first_entry: int
    last_entry: int
    first_batch: int = 0  # skip messages before this batch index in first_entry
    end_batch: int = -1  # in last_entry, read batch indexes < end_batch (-1: all)
    publish_min_ms: int | None = None  # rows outside are filtered in the task
    publish_max_ms: int | None = None
    offload: OffloadRecord | None = None  # read the ledger's Parquet copy (tiered storage)
    # readCompacted: this task reads the partition's compacted view (``ledger_id``
    # is its compacted ledger), the messages at (seq, entry, batch) keys in
    # [view_from, view_to): the view's own horizon, or the read's end before it.
    view: CompactionRecord | None = None
    view_from: tuple[int, int, int] = (0, 0, 0)
    view_to: tuple[int, int, int] = (0, 0, 0)

    @property
    def entries(self) -> int:
        return self.last_entry - self.first_entry + 1


@dataclass(slots=True)
class Pruning:
    """What pushed-down filters allow to skip (bounds inclusive; Spark re-checks)."""

    partitions: set[int] | None = None
    ledgers: set[int] | None = None
    entry_min: int | None = None
    entry_max: int | None = None
    publish_min_ms: int | None = None
    publish_max_ms: int | None = None
    notes: list[str] = field(default_factory=list)

    def narrow_publish(self, low: int | None, high: int | None) -> None:
        if low is not None:
            self.publish_min_ms = low if self.publish_min_ms is None else max(
                self.publish_min_ms, low)
        if high is not None:
            self.publish_max_ms = high if self.publish_max_ms is None else min(
                self.publish_max_ms, high)


def ledger_end(info: LedgerInfo, lac: int | None) -> int:
    """Entries readable in a ledger: all of a closed one, LAC + 1 of the open one."""
    if info.is_open:
        return 0 if lac is None else lac + 1
    return info.entries


def plan_partition(stream: str, partition: int, ledgers: Sequence[LedgerInfo],
                   start: SeqPosition, end: SeqPosition, *, open_lac: int | None,
                   max_entries: int, pruning: Pruning | None = None) -> list[ReadTask]:
    """Tasks covering ``[start, end)`` of one partition, each at most ``max_entries``
    (``ledgers``: consecutive, covering the seqs of the range)."""
    if max_entries < 1:
        raise UsageError("max entries per task must be >= 1")
    pruning = pruning or Pruning()
    if pruning.partitions is not None and partition not in pruning.partitions:
        return []
    tasks: list[ReadTask] = []
    for info in ledgers:
        if info.seq < start.seq or info.seq > end.seq:
            continue
        if pruning.ledgers is not None and info.ledger_id not in pruning.ledgers:
            continue
        if not _publish_overlaps(info, pruning):
            continue
        first = start.entry_id if info.seq == start.seq else 0
        first_batch = start.batch_index if info.seq == start.seq else 0
        stop = ledger_end(info, open_lac if info.is_open else None)  # exclusive
        end_batch = -1
        if info.seq == end.seq:
            if end.batch_index > 0:
                stop = min(stop, end.entry_id + 1)
                end_batch = end.batch_index if end.entry_id < stop else -1
            else:
                stop = min(stop, end.entry_id)
        if pruning.entry_min is not None and pruning.entry_min > first:
            first, first_batch = pruning.entry_min, 0
        if pruning.entry_max is not None and pruning.entry_max + 1 < stop:
            stop, end_batch = pruning.entry_max + 1, -1
        chunk_first = first
        while chunk_first < stop:
            chunk_last = min(stop - 1, chunk_first + max_entries - 1)
            tasks.append(ReadTask(
                stream=stream, partition=partition, seq=info.seq, ledger_id=info.ledger_id,
                first_entry=chunk_first, last_entry=chunk_last,
                first_batch=first_batch if chunk_first == first else 0,
                end_batch=end_batch if chunk_last == stop - 1 else -1,
                publish_min_ms=pruning.publish_min_ms, publish_max_ms=pruning.publish_max_ms,
            ))
            chunk_first = chunk_last + 1
    return tasks


def group_tasks(tasks: Sequence[ReadTask], max_entries: int) -> list[tuple[ReadTask, ...]]:
    """The Spark partitions of a plan: runs of consecutive tasks of one stream
    partition holding at most ``max_entries`` entries together (a task is
    never larger: ``plan_partition`` cuts at that size), in plan order.

    A Spark task costs about 0.1 s of CPU before it reads a row (JVM and
    Python worker together, measured on Spark 4.3 in local mode), as much as
    reading ~100,000 one-message entries; so a task reads on across ledger
    boundaries instead of stopping at each (docs/spark.md, "Tasks")."""
    groups: list[tuple[ReadTask, ...]] = []
    start = 0
    for index in range(1, len(tasks) + 1):
        if index == len(tasks) or tasks[index].partition != tasks[start].partition:
            groups += [tuple(run) for run in by_size(tasks[start:index],
                                                     lambda task: task.entries, max_entries)]
            start = index
    return groups


def plan_view(stream: str, partition: int, view: CompactionRecord, start: SeqPosition,
              end: SeqPosition, *, pruning: Pruning | None = None
              ) -> tuple[ReadTask | None, SeqPosition]:
    """readCompacted: the task that reads the compacted view's part of ``[start,
    end)`` (None if none), and where the ledgers' part starts (after the horizon).
    The view's messages keep their original positions; filters on them are
    left to Spark (its ledger is not theirs)."""
    pruning = pruning or Pruning()
    after = SeqPosition(view.horizon_seq, view.horizon_entry + 1, 0, view.horizon_ledger)
    if not view.ledger_id or (start.seq, start.entry_id) > view.horizon_key:
        return None, start
    if pruning.partitions is not None and partition not in pruning.partitions:
        return None, max(start, after)
    upto = min(end.key, after.key)
    if start.key >= upto or view.entries == 0:
        return None, max(start, after)
    task = ReadTask(stream=stream, partition=partition, seq=view.horizon_seq,
                    ledger_id=view.ledger_id, first_entry=0, last_entry=view.entries - 1,
                    publish_min_ms=pruning.publish_min_ms, publish_max_ms=pruning.publish_max_ms,
                    view=view, view_from=start.key, view_to=upto)
    return task, max(start, after)


def _publish_overlaps(info: LedgerInfo, pruning: Pruning) -> bool:
    if info.is_open or info.entries == 0:
        return info.is_open  # unknown range; an empty closed ledger has nothing
    if pruning.publish_min_ms is not None and info.last_publish_ms < pruning.publish_min_ms:
        return False
    return not (pruning.publish_max_ms is not None
                and info.first_publish_ms > pruning.publish_max_ms)


def check_start(stream: str, partition: int, first: SeqPosition, start: SeqPosition,
                *, fail_on_data_loss: bool) -> tuple[SeqPosition, str | None]:
    """A start in a trimmed ledger (before ``first``, the partition's first
    message kept): DataLossError, or ``first`` and a warning when
    ``fail_on_data_loss`` is off."""
    if start.seq >= first.seq:
        return start, None
    message = (f"stream {stream!r} partition {partition}: ledgers from seq {start.seq} "
               f"(ledger {start.ledger_id}) up to seq {first.seq} were trimmed "
               "(retention) before they were read")
    if fail_on_data_loss:
        raise DataLossError(message + "; set failOnDataLoss=false to skip the lost data")
    return first, message


def advance(ledgers: Sequence[LedgerInfo], start: SeqPosition, end: SeqPosition,
            open_lac: int | None, entries: int) -> SeqPosition:
    """The position ``entries`` entries after ``start``, not past ``end``."""
    if entries <= 0:
        return start
    seq, entry = start.seq, start.entry_id
    left = entries
    for info in ledgers:
        if info.seq < seq:
            continue
        if (info.seq, 0) > (end.seq, end.entry_id):
            break
        stop = ledger_end(info, open_lac if info.is_open else None)
        if info.seq == end.seq:
            stop = min(stop, end.entry_id)
        first = entry if info.seq == seq else 0
        available = max(0, stop - first)
        if available >= left:
            return SeqPosition(info.seq, first + left, 0, info.ledger_id)
        left -= available
    return end


def position_offset(info: LedgerInfo | None, head: PartitionHead, position: SeqPosition,
                    open_lac: int | None) -> int:
    """Entries of the partition before ``position`` (trimmed ones included):
    ``info`` is the ledger at ``position.seq``, None if the list does not
    keep it. The entries between two positions are the difference."""
    if info is None:
        return head.entries_total if position.seq >= head.next_seq else head.trimmed_entries
    stop = ledger_end(info, open_lac if info.is_open else None)
    return info.entries_before + min(position.entry_id, stop)


def split_limit(lags: Mapping[int, int], limit: int) -> dict[int, int]:
    """Share ``limit`` entries among partitions in proportion to their lag (like
    Kafka's maxOffsetsPerTrigger); every partition with lag gets at least 1."""
    total = sum(lags.values())
    if total <= limit:
        return dict(lags)
    out = {}
    for partition, lag in lags.items():
        out[partition] = min(lag, max(1 if lag else 0, lag * limit // total))
    return out


# ----- offsets JSON ---------------------------------------------------------------------


def offset_json(positions: Mapping[int, SeqPosition]) -> dict[str, Any]:
    return {str(p): {"seq": pos.seq, "ledger": pos.ledger_id, "entry": pos.entry_id,
                     "batch": pos.batch_index} for p, pos in sorted(positions.items())}


def parse_offset(data: Any, partitions: int) -> dict[int, SeqPosition]:
    if not isinstance(data, dict):
        raise BadPositionError(f"a quorumlog offset is a JSON object, got {data!r}")
    out = {}
    for key, value in data.items():
        try:
            partition = int(key)
            seq, ledger, entry = value["seq"], value["ledger"], value["entry"]
            batch = value.get("batch", 0)
        except (ValueError, KeyError, TypeError, AttributeError):
            raise BadPositionError(f"malformed quorumlog offset entry {key!r}: {value!r}") \
                from None
        if not 0 <= partition < partitions:
            raise BadPositionError(f"offset names partition {partition}; the stream has "
                                   f"{partitions}")
        if not all(isinstance(v, int) and v >= 0 for v in (seq, ledger, entry, batch)):
            raise BadPositionError(f"malformed quorumlog offset entry {key!r}: {value!r}")
        out[partition] = SeqPosition(seq, entry, batch, ledger)
    return out
