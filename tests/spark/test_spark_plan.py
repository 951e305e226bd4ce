"""Pure parts of the Spark data source: read planning, offsets, options. No Spark."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quorumlog.errors import UsageError
from quorumlog.spark._options import parse, parse_time_ms
from quorumlog.spark._plan import (
    Pruning,
    advance,
    check_start,
    group_tasks,
    offset_json,
    parse_offset,
    plan_partition,
    position_offset,
    split_limit,
)
from quorumlog.stream import (
    BadPositionError,
    DataLossError,
    LedgerInfo,
    LedgerStats,
    PartitionHead,
    SeqPosition,
)


def head_of(entries: list[int], *, open_last: bool = False) -> PartitionHead:
    head = PartitionHead()
    for i, count in enumerate(entries):
        head = head.with_ledger_opened(100 + i, 0)
        if open_last and i == len(entries) - 1:
            break
        head = head.with_ledger_closed(LedgerStats(
            ledger_id=100 + i, entries=count, size_bytes=count, first_publish_ms=i * 10,
            last_publish_ms=i * 10 + 9, last_entry_messages=1 if count else 0), 0)
    return head


def listing(entries: list[int], *, open_last: bool = False) -> tuple[LedgerInfo, ...]:
    return head_of(entries, open_last=open_last).tail


def sp(seq: int, entry: int, batch: int = 0) -> SeqPosition:
    return SeqPosition(seq, entry, batch, 100 + seq)


def test_plan_covers_range_in_chunks_never_past_lac() -> None:
    pl = listing([10, 0, 7, 99], open_last=True)
    tasks = plan_partition("s", 0, pl, sp(0, 3), sp(3, 5), open_lac=4, max_entries=4)
    covered = [(t.seq, e) for t in tasks for e in range(t.first_entry, t.last_entry + 1)]
    expected = ([(0, e) for e in range(3, 10)] + [(2, e) for e in range(7)]
                + [(3, e) for e in range(5)])
    assert covered == expected
    assert all(t.entries <= 4 for t in tasks)
    # "latest" of the open ledger is LAC + 1: a wider end still stops at the LAC.
    wide = plan_partition("s", 0, pl, sp(3, 0), sp(3, 50), open_lac=4, max_entries=100)
    assert [(t.first_entry, t.last_entry) for t in wide] == [(0, 4)]


@given(st.lists(st.lists(st.integers(0, 30), max_size=8), max_size=4), st.integers(1, 40))
def test_tasks_group_into_spark_partitions_of_one_stream_partition_in_order(
        ledgers: list[list[int]], max_entries: int) -> None:
    """Grouping keeps every range once, in plan order; a group holds ranges of
    one stream partition, at most max_entries entries together; and adjacent
    groups of one partition could not have been one (each is as full as the
    next range allows)."""
    tasks = [task for partition, sizes in enumerate(ledgers)
             for task in plan_partition("s", partition, listing(sizes), sp(0, 0),
                                        sp(len(sizes), 0), open_lac=None,
                                        max_entries=max_entries)]
    groups = group_tasks(tasks, max_entries)
    assert [task for group in groups for task in group] == tasks
    for group in groups:
        assert group and len({task.partition for task in group}) == 1
        assert sum(task.entries for task in group) <= max_entries
    for before, after in itertools.pairwise(groups):
        if before[0].partition == after[0].partition:
            assert sum(task.entries for task in before) + after[0].entries > max_entries
    assert group_tasks([], max_entries) == []


def test_plan_batch_boundaries_and_pruning() -> None:
    pl = listing([5, 5, 5])
    tasks = plan_partition("s", 0, pl, sp(0, 2, 3), sp(2, 1, 4), open_lac=None, max_entries=100)
    assert (tasks[0].first_entry, tasks[0].first_batch) == (2, 3)
    assert (tasks[-1].last_entry, tasks[-1].end_batch) == (1, 4)
    # Publish-time pruning drops ledgers outside [min, max] (ledger i spans i*10..i*10+9).
    pruned = plan_partition("s", 0, pl, sp(0, 0), sp(2, 5), open_lac=None, max_entries=100,
                            pruning=Pruning(publish_min_ms=12, publish_max_ms=15))
    assert [t.seq for t in pruned] == [1]
    assert plan_partition("s", 0, pl, sp(0, 0), sp(2, 5), open_lac=None, max_entries=9,
                          pruning=Pruning(partitions={1})) == []
    by_ledger = plan_partition("s", 0, pl, sp(0, 0), sp(2, 5), open_lac=None, max_entries=9,
                               pruning=Pruning(ledgers={102}, entry_min=2, entry_max=3))
    assert [(t.ledger_id, t.first_entry, t.last_entry) for t in by_ledger] == [(102, 2, 3)]


def test_advance_and_limits() -> None:
    head = head_of([3, 0, 4])
    pl = head.tail
    start, end = sp(0, 1), sp(2, 4)

    def offset(position: SeqPosition) -> int:
        info = pl[position.seq] if position.seq < len(pl) else None
        return position_offset(info, head, position, None)

    assert offset(end) - offset(start) == 6  # entries between, from the ledgers' offsets
    assert offset(SeqPosition(3, 0, 0, 0)) == 7  # past the last ledger: every entry
    assert advance(pl, start, end, None, 2) == sp(0, 3)
    assert advance(pl, start, end, None, 3) == SeqPosition(2, 1, 0, 102)
    assert advance(pl, start, end, None, 100) == end
    assert split_limit({0: 10, 1: 30}, 100) == {0: 10, 1: 30}
    assert split_limit({0: 10, 1: 30, 2: 0}, 8) == {0: 2, 1: 6, 2: 0}
    assert split_limit({0: 1, 1: 1000}, 10) == {0: 1, 1: 9}


def test_offsets_json_roundtrip_and_errors() -> None:
    offsets = {0: sp(1, 2), 1: sp(0, 0)}
    assert parse_offset(offset_json(offsets), 2) == offsets
    for bad in ([], {"x": {}}, {"0": {"seq": 1}}, {"5": {"seq": 0, "ledger": 1, "entry": 0}},
                {"0": {"seq": -1, "ledger": 1, "entry": 0}}):
        with pytest.raises(BadPositionError):
            parse_offset(bad, 2)


def test_check_start_data_loss() -> None:
    first = sp(2, 0)  # ledgers 0 and 1 were trimmed
    assert check_start("s", 0, first, sp(2, 1), fail_on_data_loss=True) == (sp(2, 1), None)
    with pytest.raises(DataLossError, match="failOnDataLoss"):
        check_start("s", 0, first, sp(0, 1), fail_on_data_loss=True)
    moved, warning = check_start("s", 0, first, sp(0, 1), fail_on_data_loss=False)
    assert moved == sp(2, 0) and warning is not None


def test_options() -> None:
    base = {"meta": "127.0.0.1:1,127.0.0.1:2", "stream": "events"}
    parsed = parse(base)
    assert parsed.meta == ("127.0.0.1:1", "127.0.0.1:2") and parsed.fail_on_data_loss
    assert parse({**base, "checkpointLocation": "/x"}).writer_id == parse(
        {**base, "checkpointlocation": "/x"}).writer_id
    assert parse_time_ms("t", "1000") == 1000
    assert parse_time_ms("t", "1970-01-01T00:00:01Z") == 1000
    for bad, message in [
        ({"stream": "events", "meta": "", "clusterDir": "/nonexistent"}, "option meta"),
        ({**base, "stream": ""}, "stream is required"),
        ({**base, "startingPositions": "{oops"}, "startingPositions"),
        ({**base, "startingPositions": "earliest", "startingTime": "5"}, "not both"),
        ({**base, "maxRowsPerPartition": "0"}, "maxRowsPerPartition"),
        ({**base, "failOnDataLoss": "maybe"}, "failOnDataLoss"),
        ({**base, "startingTime": "yesterday"}, "startingTime"),
        ({**base, "stream": "a/b"}, "invalid"),
    ]:
        with pytest.raises(UsageError, match=message):
            parse(bad)


def test_plan_view_reads_the_view_up_to_its_horizon_or_the_end() -> None:
    from quorumlog.spark._plan import plan_view
    from quorumlog.stream import VIEW_START, CompactionRecord

    view = CompactionRecord(ledger_id=900, horizon_seq=3, horizon_entry=5, horizon_ledger=103,
                            entries=8)
    end = SeqPosition(6, 2, 0, 106)
    task, after = plan_view("s", 1, view, VIEW_START, end)
    assert task is not None and task.view == view and task.ledger_id == 900
    assert (task.first_entry, task.last_entry) == (0, 7)
    assert (task.view_from, task.view_to) == ((0, 0, 0), (3, 6, 0))
    assert after == SeqPosition(3, 6, 0, 103)  # the ledgers are read from after the horizon
    # An end before the horizon bounds the view's part; the ledgers then add nothing.
    task, after = plan_view("s", 1, view, VIEW_START, SeqPosition(2, 4, 1, 102))
    assert task is not None and task.view_to == (2, 4, 1) and after.key > (2, 4, 1)
    # A start past the horizon, a partition pruned away, a view never written.
    assert plan_view("s", 1, view, SeqPosition(3, 6, 0, 103), end) == (
        None, SeqPosition(3, 6, 0, 103))
    assert plan_view("s", 1, view, VIEW_START, end, pruning=Pruning(partitions={0}))[0] is None
    assert plan_view("s", 1, CompactionRecord(), VIEW_START, end) == (None, VIEW_START)


def test_read_compacted_is_a_batch_option() -> None:
    from quorumlog.spark._source import QuorumlogDataSource

    base = {"meta": "127.0.0.1:1", "stream": "s"}
    assert parse({**base, "readCompacted": "true"}).read_compacted
    assert not parse(base).read_compacted
    with pytest.raises(UsageError, match="readCompacted"):
        parse({**base, "readCompacted": "yes"})
    with pytest.raises(UsageError, match="batch reads"):
        QuorumlogDataSource({**base, "readCompacted": "true"}).streamReader(None)  # type: ignore[arg-type]
