"""Pure parts of streams: entry format, positions, rollover, cursors, retention,
routing and publish-time search. No network."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quorumlog.errors import ConfigError, InvariantViolation, UsageError
from quorumlog.stream._config import RetentionPolicy, RolloverPolicy, StreamConfig
from quorumlog.stream._cursor import AckTracker, CursorState
from quorumlog.stream._entry import (
    ColumnSink,
    OutgoingMessage,
    decode_entry,
    decode_entry_columns,
    encode_entry,
    entry_message_count,
    first_publish_time_ms,
)
from quorumlog.stream._errors import BadPositionError, MessageFormatError
from quorumlog.stream._layout import (
    HEAD_LEDGERS_MAX,
    LEDGER_RECORD_BYTES_MAX,
    RUN_LEDGERS_MAX,
    TAIL_LEDGERS_KEEP,
    TAIL_LEDGERS_MAX,
    VALUE_BYTES_MAX,
    LedgerInfo,
    LedgerRun,
    LedgerStats,
    PartitionHead,
    StreamRecord,
    check_name,
    trim_step,
)
from quorumlog.stream._link import LINK_LEDGERS_MAX, commit_ops
from quorumlog.stream._position import Position, SeqPosition, parse_positions
from quorumlog.stream._retention import (
    EntrySearch,
    SeqSearch,
    consumed_by,
    holds_publish_at,
    ledgers_to_trim,
    partition_for_key,
    publish_reached,
    ttl_mark_delete,
)

# ----- entry format -----------------------------------------------------------------------


def test_entry_roundtrip_single_and_batch() -> None:
    one = encode_entry([OutgoingMessage(b"v", key=b"k", properties={"a": "b"},
                                        publish_time_ms=7)])
    [msg] = decode_entry(one)
    assert (msg.batch_index, msg.publish_time_ms, msg.key, msg.properties, msg.value) == (
        0, 7, b"k", {"a": "b"}, b"v")
    batch = [OutgoingMessage(bytes([i]) * i, key=None if i % 2 else b"k%d" % i,
                             publish_time_ms=100 + i) for i in range(50)]
    decoded = decode_entry(encode_entry(batch))
    assert [m.batch_index for m in decoded] == list(range(50))
    assert [m.value for m in decoded] == [m.value for m in batch]
    assert [m.key for m in decoded] == [m.key for m in batch]
    assert entry_message_count(encode_entry(batch)) == 50
    assert first_publish_time_ms(encode_entry(batch)) == 100


def test_entry_empty_key_differs_from_no_key() -> None:
    decoded = decode_entry(encode_entry([OutgoingMessage(b"", key=b""), OutgoingMessage(b"")]))
    assert [m.key for m in decoded] == [b"", None]


def test_entry_column_decode_with_batch_window() -> None:
    payload = encode_entry([OutgoingMessage(b"%d" % i, publish_time_ms=i) for i in range(10)])
    sink = ColumnSink()
    assert decode_entry_columns(payload, sink, entry_index=3, first_batch_index=2,
                                last_batch_index=4) == 3
    assert sink.value == [b"2", b"3", b"4"] and sink.batch_index == [2, 3, 4]
    assert sink.entry_index == [3, 3, 3] and sink.properties == [[], [], []]


@pytest.mark.parametrize("mutate", [
    lambda p: b"XX" + p[2:],  # magic
    lambda p: p[:2] + b"\x09" + p[3:],  # version
    lambda p: p[:-1],  # truncated value
    lambda p: p + b"\x00",  # trailing byte
    lambda p: p[:4] + (0).to_bytes(4, "little") + p[8:],  # zero messages
    lambda p: p[:5],  # shorter than header
])
def test_entry_malformed_is_a_clear_error(mutate: object) -> None:
    payload = encode_entry([OutgoingMessage(b"value", key=b"key", properties={"x": "y"})])
    assert callable(mutate)
    with pytest.raises(MessageFormatError):
        decode_entry(mutate(payload))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=40), st.none() | st.binary(max_size=8),
                          st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=3),
                          st.integers(0, 2**40)), min_size=1, max_size=20))
def test_entry_roundtrip_property(messages: list[tuple[bytes, bytes | None, dict[str, str], int]],
                                  ) -> None:
    out = [OutgoingMessage(v, key=k, properties=p, publish_time_ms=t) for v, k, p, t in messages]
    decoded = decode_entry(encode_entry(out))
    assert [(m.value, m.key, m.properties, m.publish_time_ms) for m in decoded] == messages


def test_entry_rejects_bad_input() -> None:
    with pytest.raises(UsageError):
        encode_entry([])
    with pytest.raises(UsageError):
        encode_entry([OutgoingMessage(b"", properties={"a": 1})])  # type: ignore[dict-item]


# ----- positions --------------------------------------------------------------------------


def test_position_json_and_order() -> None:
    p = Position(5, 3, 1)
    assert Position.from_json(json.loads(json.dumps(p.to_json()))) == p
    assert Position.from_json({"ledger": 5, "entry": 3}) == Position(5, 3, 0)
    a, b = SeqPosition(1, 9, 0, 900), SeqPosition(2, 0, 0, 100)
    assert a < b  # seq orders, not ledger id
    assert sorted([b, a]) == [a, b]


@pytest.mark.parametrize("text", [
    "{", "[1]", '{"x": "earliest"}', '{"9": "earliest"}', '{"0": "soon"}',
    '{"0": {"ledger": 1}}', '{"0": {"ledger": "1", "entry": 0}}',
    '{"0": {"ledger": 1, "entry": 0, "bogus": 1}}', '{"0": {"ledger": -1, "entry": 0}}',
])
def test_parse_positions_rejects_malformed(text: str) -> None:
    with pytest.raises(BadPositionError):
        parse_positions(text, partitions=2)


def test_parse_positions() -> None:
    assert parse_positions("earliest", 2) == {0: "earliest", 1: "earliest"}
    assert parse_positions('{"1": {"ledger": 4, "entry": 2}, "0": "latest"}', 2) == {
        1: Position(4, 2), 0: "latest"}


# ----- rollover and config -----------------------------------------------------------------


def test_rollover_policy_follows_pulsar() -> None:
    policy = RolloverPolicy(max_entries=10, max_bytes=1000, min_time_ms=100, max_time_ms=1000)
    assert not policy.should_roll(0, 0, 10_000)  # empty never rolls
    assert not policy.should_roll(10, 0, 50)  # full but younger than min time
    assert policy.should_roll(10, 0, 101)
    assert policy.should_roll(1, 1000, 101)  # bytes
    assert not policy.should_roll(5, 10, 999)
    assert policy.should_roll(5, 10, 1000)  # max time
    assert RolloverPolicy(max_entries=3, min_time_ms=0).should_roll(3, 0, 0)
    defaults = RolloverPolicy()
    assert (defaults.max_entries, defaults.min_time_ms, defaults.max_time_ms) == (
        50_000, 600_000, 14_400_000)


def test_config_validation() -> None:
    with pytest.raises(ConfigError):
        StreamConfig(partitions=0).validate()
    with pytest.raises(ConfigError):
        StreamConfig(ensemble_size=2, write_quorum=3, ack_quorum=2).validate()
    with pytest.raises(ConfigError):
        RolloverPolicy(min_time_ms=10, max_time_ms=5).validate()
    record = StreamRecord(name="s", config=StreamConfig(partitions=3), password=b"p",
                          created_ms=1)
    assert StreamRecord.decode(record.encode()) == record
    with pytest.raises(UsageError):
        check_name("stream", "bad/name")


# ----- ledger list ------------------------------------------------------------------------


def _stats(ledger_id: int, entries: int, size: int = 100, first: int = 0, last: int = 0,
           last_messages: int = 1) -> LedgerStats:
    last_messages = last_messages if entries else 0
    return LedgerStats(ledger_id=ledger_id, entries=entries, size_bytes=size,
                       first_publish_ms=first, last_publish_ms=last,
                       last_entry_messages=last_messages)


def test_partition_head_edits() -> None:
    head = PartitionHead().with_ledger_opened(30, 1)
    with pytest.raises(InvariantViolation):
        head.with_ledger_opened(31, 2)  # previous still open
    head = head.with_ledger_closed(_stats(30, 5, last=50), 3).with_ledgers_linked(
        [_stats(10, 2, last=20), _stats(11, 0)], 4)
    head = head.with_ledger_opened(40, 5, takeover=True)
    assert [i.seq for i in head.tail] == [0, 1, 2, 3] and head.writer_epoch == 1
    # Offsets and the running maximum of publish times, kept as ledgers close.
    assert [i.entries_before for i in head.tail] == [0, 5, 7, 7]
    assert [i.publish_max_ms for i in head.tail[:3]] == [50, 50, 50]  # linked ledger is older
    assert (head.entries_total, head.kept_bytes, head.kept_entries) == (7, 300, 7)
    # Linked ledger 10 is older than ledger 30 before it: ids no longer ascend,
    # so finding a ledger by id may need a walk (see LedgerList.find).
    assert not head.ids_ascending and head.ledger_id_max == 40
    ascending = PartitionHead().with_ledger_opened(5, 0).with_ledger_closed(_stats(5, 1), 0)
    assert ascending.with_ledgers_linked([_stats(6, 1)], 0).ids_ascending
    assert PartitionHead.decode(head.encode()) == head
    trimmed = trim_step(head, [], 2)
    assert trimmed.head.first_seq == 2 and trimmed.head.trimmed_entries == 7
    assert [i.ledger_id for i in trimmed.trimmed] == [30, 10]
    assert trimmed.head.kept_bytes == 100 and trimmed.head.kept_entries == 0
    with pytest.raises(InvariantViolation):
        trim_step(head, [], 4)  # would trim the open ledger


def test_old_layout_is_refused_with_what_to_do() -> None:
    """A version-1 partition value (the whole list in one value) is not read as
    an empty list: it fails, saying how to get going again."""
    import msgspec

    old = msgspec.msgpack.encode({"ledgers": [{"seq": 0, "ledger_id": 5}], "next_seq": 1,
                                  "trimmed_entries": 0, "writer_epoch": 0,
                                  "format_version": 1})
    with pytest.raises(MessageFormatError, match=r"layout version 1.*stream delete"):
        PartitionHead.decode(old)


def _big_info(seq: int) -> LedgerInfo:
    """A ledger record with every field at its widest (9-byte msgpack integers)."""
    big = 2**62
    return LedgerInfo(seq=seq, ledger_id=big, status="closed", entries=big,  # type: ignore[arg-type]
                      size_bytes=big, first_publish_ms=big, last_publish_ms=big,
                      last_entry_messages=big, created_ms=big, closed_ms=big,
                      entries_before=big, publish_max_ms=big)


def test_worst_case_records_fit_meta_values() -> None:
    import msgspec

    assert len(msgspec.msgpack.encode(_big_info(2**62))) <= LEDGER_RECORD_BYTES_MAX
    run = LedgerRun(ledgers=tuple(_big_info(i) for i in range(RUN_LEDGERS_MAX)))
    assert len(run.encode()) <= VALUE_BYTES_MAX
    head = PartitionHead(tail=tuple(_big_info(i) for i in range(HEAD_LEDGERS_MAX)),
                         next_seq=HEAD_LEDGERS_MAX)
    assert len(head.encode()) <= VALUE_BYTES_MAX


def _linked(count: int, start_id: int = 1000) -> list[LedgerStats]:
    return [_stats(start_id + i, 1 + i % 3, last=i) for i in range(count)]


def test_head_archives_its_tail_in_runs() -> None:
    """A rollover adds one ledger to the head; past TAIL_LEDGERS_MAX the oldest
    move to a run in the same change, so the head stays small however long the
    list grows. A big link splits into runs of at most RUN_LEDGERS_MAX."""
    head = PartitionHead()
    runs: list[LedgerRun] = []
    for i in range(100):
        head = head.with_ledger_opened(i, 0).with_ledger_closed(_stats(i, 1), 0)
        head, new_runs = head.archived()
        runs += new_runs
        assert len(head.tail) <= TAIL_LEDGERS_MAX
    assert len(head.tail) >= TAIL_LEDGERS_KEEP and head.tail[-1].seq == 99
    listed = [info for run in runs for info in run.ledgers] + list(head.tail)
    assert [i.ledger_id for i in listed] == list(range(100))
    assert [i.entries_before for i in listed] == list(range(100))
    big, big_runs = head.with_ledgers_linked(_linked(5000), 1).archived(HEAD_LEDGERS_MAX)
    assert [len(r.ledgers) for r in big_runs] == [2048, 2048, len(head.tail) + 5000 - 4096 - 8]
    assert len(big.tail) == TAIL_LEDGERS_KEEP and big.next_seq == 5100
    assert big_runs[0].first_seq == head.tail[0].seq
    assert big_runs[-1].last_seq + 1 == big.tail[0].seq


def test_trim_step_across_runs_and_the_tail() -> None:
    head = PartitionHead()
    runs: list[LedgerRun] = []
    for i in range(60):  # runs of 25, 25 and a tail of 10
        head, new_runs = head.with_ledger_opened(i, 0).with_ledger_closed(
            _stats(i, 2, size=10), 0).archived()
        runs += new_runs
    assert [len(r.ledgers) for r in runs] == [25, 25] and len(head.tail) == 10
    step = trim_step(head, runs, 30)  # one whole run, part of the next
    assert step.deleted_runs == (24,) and step.rewritten is not None
    assert step.rewritten.first_seq == 30 and step.rewritten.last_seq == 49
    assert step.head.first_seq == 30 and step.head.trimmed_entries == 60
    assert step.head.kept_bytes == 300
    rest = trim_step(step.head, [step.rewritten], 25)  # the rest of the run and 5 of the tail
    assert rest.deleted_runs == (49,) and rest.rewritten is None
    assert rest.head.first_seq == 55 and [i.seq for i in rest.head.tail] == list(range(55, 60))
    with pytest.raises(InvariantViolation):
        trim_step(head, runs[1:], 5)  # the runs must start at the first ledger


def test_commit_ops_stays_within_one_meta_transaction() -> None:
    """A Spark commit writes each partition's head (and runs only past what a
    head holds): 61 partitions fit in meta's 128 operations; past the bounds
    the commit fails with the bound in the message, before sending anything."""
    heads = {p: (PartitionHead(), 1) for p in range(61)}
    ledgers = {p: _linked(3, 10 * p) for p in range(61)}
    compares, ops = commit_ops("s", "job", heads, ledgers, 0)
    assert 5 + len(compares) + len(ops) == 127
    ledgers[0] = _linked(HEAD_LEDGERS_MAX + 10)  # one partition needs a run too
    with pytest.raises(UsageError, match=r"txn_ops_max 128.*at most 61 partitions"):
        commit_ops("s", "job", heads, ledgers, 0)
    too_many = {0: _linked(LINK_LEDGERS_MAX + 1)}
    with pytest.raises(UsageError, match=f"links at most {LINK_LEDGERS_MAX}"):
        commit_ops("s", "job", {0: (PartitionHead(), 1)}, too_many, 0)


# ----- cursors ----------------------------------------------------------------------------


def _sp(seq: int, entry: int, batch: int = 0) -> SeqPosition:
    return SeqPosition(seq, entry, batch, 100 + seq)


def test_ack_tracker_moves_mark_delete_and_keeps_ranges() -> None:
    t = AckTracker(CursorState(), ranges_max=10, pending_max=100)
    for e in range(6):
        t.delivered(_sp(0, e))
    t.ack(_sp(0, 1))
    t.ack(_sp(0, 2))
    t.ack(_sp(0, 4))
    state = t.state(1)
    assert state.mark_delete is None
    assert [(a.entry_id, b.entry_id) for a, b in state.ranges] == [(1, 2), (4, 4)]
    t.ack(_sp(0, 0))
    assert t.mark_delete == _sp(0, 2)
    assert [(a.entry_id, b.entry_id) for a, b in t.state(2).ranges] == [(4, 4)]
    assert not t.ack(_sp(0, 99))  # never delivered
    assert [p.entry_id for p in t.unacked()] == [3, 5]


def test_ack_tracker_resume_skips_persisted_ranges() -> None:
    state = CursorState(mark_delete=_sp(0, 1), ranges=((_sp(0, 3), _sp(0, 4)),))
    t = AckTracker(state, ranges_max=10, pending_max=100)
    delivered = []
    for e in range(0, 7):
        if t.should_skip(_sp(0, e).key):
            if e > 1:
                t.delivered(_sp(0, e), acked=True)
            continue
        t.delivered(_sp(0, e))
        delivered.append(e)
    assert delivered == [2, 5, 6]
    t.ack(_sp(0, 2))
    assert t.mark_delete == _sp(0, 4)  # moved over the restored range


def test_ack_tracker_bounds_ranges_and_pending() -> None:
    t = AckTracker(CursorState(), ranges_max=2, pending_max=5)
    for e in range(5):
        t.delivered(_sp(0, e))
    assert t.full
    for e in (1, 3):
        t.ack(_sp(0, e))
    t.delivered  # noqa: B018 - state below must stay bounded
    assert len(t.state(0).ranges) == 2
    with pytest.raises(InvariantViolation):
        t.delivered(_sp(0, 2))  # out of order


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_ack_tracker_never_marks_unacked(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 40))
    t = AckTracker(CursorState(), ranges_max=3, pending_max=100)
    positions = [_sp(e // 7, e % 7) for e in range(n)]
    for p in positions:
        t.delivered(p)
    acked = set(data.draw(st.sets(st.integers(0, n - 1))))
    order = list(acked)
    random.Random(data.draw(st.integers(0, 1000))).shuffle(order)
    for i in order:
        t.ack(positions[i])
    state = CursorState.decode(t.state(0).encode())
    for i, p in enumerate(positions):
        if state.is_acked(p.key):
            assert i in acked
    prefix = 0
    while prefix < n and prefix in acked:
        prefix += 1
    if prefix:
        assert state.mark_delete == positions[prefix - 1]


# ----- retention ---------------------------------------------------------------------------


def _closed_list(sizes: list[int], closed_ms: list[int]) -> PartitionHead:
    head = PartitionHead()
    for i, (size, closed) in enumerate(zip(sizes, closed_ms, strict=True)):
        head = head.with_ledger_opened(100 + i, closed).with_ledger_closed(
            _stats(100 + i, 10, size=size, first=closed, last=closed, last_messages=2), closed)
    return head


def test_retention_time_and_size() -> None:
    pl = _closed_list([100] * 5, [0, 10, 20, 30, 40]).with_ledger_opened(200, 50)
    never = RetentionPolicy(time_ms=-1, size_bytes=-1)
    assert ledgers_to_trim(pl, pl.tail, [], never, now_ms=10**9) == 0
    assert ledgers_to_trim(pl, pl.tail, [], RetentionPolicy(time_ms=25, size_bytes=-1),
                           now_ms=50) == 3
    assert ledgers_to_trim(pl, pl.tail, [], RetentionPolicy(time_ms=-1, size_bytes=250),
                           now_ms=50) == 3
    assert ledgers_to_trim(pl, pl.tail, [], RetentionPolicy(time_ms=0, size_bytes=-1),
                           now_ms=50) == 5
    closed_only = _closed_list([100] * 3, [0, 1, 2])
    # the last ledger is never deleted
    assert ledgers_to_trim(closed_only, closed_only.tail, [], RetentionPolicy(time_ms=0),
                           now_ms=50) == 2
    # only the ledgers given are walked (the trimmer loads a bounded stretch)
    assert ledgers_to_trim(pl, pl.tail[:2], [], RetentionPolicy(time_ms=0), now_ms=50) == 2


def test_retention_never_deletes_what_a_cursor_needs() -> None:
    pl = _closed_list([100] * 4, [0, 1, 2, 3]).with_ledger_opened(200, 5)
    policy = RetentionPolicy(time_ms=0)
    at = pl.tail
    slow = CursorState(mark_delete=SeqPosition(1, 9, 0, at[1].ledger_id))  # mid last entry
    assert not consumed_by(at[1], slow) and consumed_by(at[0], slow)
    assert ledgers_to_trim(pl, at, [slow], policy, now_ms=100) == 1
    done = CursorState(mark_delete=SeqPosition(1, 9, 1, at[1].ledger_id))
    assert ledgers_to_trim(pl, at, [done], policy, now_ms=100) == 2
    fresh = CursorState()  # a cursor at "earliest" that has acked nothing
    assert ledgers_to_trim(pl, at, [done, fresh], policy, now_ms=100) == 0
    latest = CursorState(start=SeqPosition(4, 0, 0, 200))
    assert ledgers_to_trim(pl, at, [latest], policy, now_ms=100) == 4


def test_ttl_expires_whole_ledgers() -> None:
    pl = _closed_list([100] * 3, [10, 20, 30]).with_ledger_opened(200, 40)
    target = ttl_mark_delete(pl.tail, CursorState(), ttl_ms=15, now_ms=40)  # cutoff 25
    assert target == SeqPosition(1, 9, 1, pl.tail[1].ledger_id)
    assert ttl_mark_delete(pl.tail, CursorState(mark_delete=target), 15, 40) is None
    assert ttl_mark_delete(pl.tail, CursorState(), 0, 40) is None


# ----- routing and search ---------------------------------------------------------------------


def test_partition_for_key_is_stable_and_spread() -> None:
    assert partition_for_key(b"user-1", 8) == partition_for_key(b"user-1", 8)
    seen = {partition_for_key(b"k%d" % i, 8) for i in range(200)}
    assert seen == set(range(8))
    assert [partition_for_key(None, 3, i) for i in range(4)] == [0, 1, 2, 0]


def first_ledger_at(ledgers: Sequence[LedgerInfo], publish_ms: int) -> int:
    """Where a reader at ``publish_ms`` starts: the search over the running
    maximum, then the first ledger from there that may hold the time."""
    reached = next((i for i, info in enumerate(ledgers) if publish_reached(publish_ms)(info)),
                   len(ledgers))
    return next((i for i in range(reached, len(ledgers))
                 if holds_publish_at(ledgers[i], publish_ms)), len(ledgers))


def test_first_ledger_at_handles_unordered_linked_ledgers() -> None:
    pl = PartitionHead()
    for lid, first, last in [(1, 0, 10), (2, 11, 20), (3, 5, 8), (4, 21, 30)]:
        pl = pl.with_ledger_opened(lid, 0).with_ledger_closed(_stats(lid, 3, first=first,
                                                                     last=last), 0)
    assert [i.publish_max_ms for i in pl.tail] == [10, 20, 20, 30]
    assert first_ledger_at(pl.tail, 0) == 0
    assert first_ledger_at(pl.tail, 15) == 1
    assert first_ledger_at(pl.tail, 20) == 1
    assert first_ledger_at(pl.tail, 21) == 3
    assert first_ledger_at(pl.tail, 31) == 4
    opened = pl.with_ledger_opened(9, 0)
    assert first_ledger_at(opened.tail, 10**12) == 4  # the open ledger may hold it
    reached = publish_reached(21)
    assert [reached(i) for i in opened.tail] == [False, False, False, True, True]
    # A trimmed ledger with a late time raised the running maximum: the first
    # ledger kept "reached" 15 already, but only ledger 4 may hold 25.
    trimmed = trim_step(pl, [], 2).head.tail
    assert [publish_reached(15)(i) for i in trimmed] == [True, True]
    assert first_ledger_at(trimmed, 15) == 1 and first_ledger_at(trimmed, 25) == 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 100)), min_size=1, max_size=80),
       st.lists(st.integers(1, 9), min_size=1, max_size=80), st.integers(-5, 110))
def test_seq_search_over_runs_finds_first_ledger_at_time(
        ledgers: list[tuple[int, int]], run_sizes: list[int], target: int) -> None:
    """Binary search over runs of any sizes agrees with a walk over the list,
    in about log2(runs) run reads."""
    head = PartitionHead()
    for i, (entries, last) in enumerate(ledgers):
        head = head.with_ledger_opened(i, 0).with_ledger_closed(
            _stats(i, entries, first=last, last=last), 0)
    infos = head.tail
    runs, start = [], 0
    for size in run_sizes:
        if start >= len(infos):
            break
        runs.append(infos[start:start + size])
        start += size
    if start < len(infos):
        runs.append(infos[start:])
    predicate = publish_reached(target)
    search = SeqSearch(0, len(infos), predicate)
    while (probe := search.probe()) is not None:
        search.feed(next(run for run in runs if run[0].seq <= probe <= run[-1].seq))
    expected = next((i.seq for i in infos if predicate(i)), len(infos))
    assert search.result == expected
    assert search.probes <= len(runs).bit_length() + 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=60), st.integers(-5, 60))
def test_entry_search_finds_first_entry(times: list[int], target: int) -> None:
    times = sorted(times)
    search = EntrySearch(0, len(times) - 1, target)
    while (probe := search.probe()) is not None:
        search.feed(probe, times[probe])
    assert search.probes <= len(times).bit_length() + 1
    first_at = next((i for i, t in enumerate(times) if t >= target), len(times))
    assert search.result == max(0, first_at - 1)
