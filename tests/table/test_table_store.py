"""The partition replica's store: Pegasus semantics on a real RocksDB, a model
check against a dict, crash consistency of data and applied decree, and
checkpoints that restore the same data."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quorumlog.table import (
    HASH_KEY_BYTES_MAX,
    VALUE_BYTES_MAX,
    CheckAndMutateCommand,
    CheckResult,
    CheckType,
    CollectGarbage,
    DeleteCommand,
    Done,
    IncrCommand,
    IncrResult,
    KeyTooLargeError,
    MultiDeleteCommand,
    MultiSetCommand,
    Mutation,
    Refused,
    SetCommand,
    TableEntry,
    TableStore,
    Timetag,
    TimetagClock,
    WriteCommand,
    check_passes,
    decode_entry,
    encode_entry,
    make_timetag,
    partition_of,
)
from quorumlog.table import _store as store_module
from quorumlog.table._errors import BadTableRequestError, NotAnIntegerError

T0_S = 1_700_000_000
US = 1_000_000


class Replica:
    """A store plus the next decree, so tests read like a log being applied."""

    def __init__(self, path: Path, cluster_id: int = 1) -> None:
        self.store = TableStore(path, cluster_id=cluster_id)
        self.decree = self.store.applied_decree

    def write(self, *commands: WriteCommand, at_s: float = T0_S) -> list[object]:
        self.decree += 1
        return list(self.store.apply(self.decree, TableEntry(int(at_s * US), commands)))

    def collect(self, at_s: float, *, delay_s: float) -> int:
        """A tombstone collection entry (no duplication): returns records removed."""
        before = self.store.collected_records
        self.decree += 1
        self.store.apply(self.decree, TableEntry(
            int(at_s * US), (), gc=CollectGarbage(mark_decree=self.store.gc_mark,
                                                  horizon_us=int((at_s - delay_s) * US),
                                                  unshipped_bound=False)))
        return self.store.collected_records - before


@pytest.fixture
def replica(tmp_path: Path) -> Replica:
    r = Replica(tmp_path / "store")
    yield r
    r.store.close()


def test_set_get_delete_and_tombstones(replica: Replica) -> None:
    assert replica.write(SetCommand(b"h", b"s", b"v")) == [Done()]
    assert replica.store.get(b"h", b"s", T0_S) == b"v"
    assert replica.write(DeleteCommand(b"h", b"s"), at_s=T0_S + 1) == [Done()]
    assert replica.store.get(b"h", b"s", T0_S + 1) is None
    assert replica.store.sort_key_count(b"h", T0_S + 1) == 0
    # The tombstone stays (with its timetag) until garbage collection after the delay.
    assert replica.collect(T0_S + 5, delay_s=10) == 0
    assert replica.collect(T0_S + 12, delay_s=10) == 1
    assert replica.store.full_scan(T0_S + 12).items == []


def test_timetags_order_writes_and_carry_cluster_and_delete_flag(tmp_path: Path) -> None:
    r = Replica(tmp_path / "s", cluster_id=5)
    r.write(SetCommand(b"h", b"s", b"v"), at_s=T0_S + 0.25)
    (item,) = r.store.full_scan(T0_S).items
    assert Timetag.parse(item.timetag) == Timetag(int((T0_S + 0.25) * US), 5, False)
    assert make_timetag(10, 2) < make_timetag(10, 3) < make_timetag(11, 1)
    assert Timetag.parse(make_timetag(7, 127, deleted=True)) == Timetag(7, 127, True)
    clock = TimetagClock()
    clock.observe(1_000)
    assert clock.next(500) == 1_001  # a new leader whose clock is behind
    assert clock.next(2_000) == 2_000
    assert clock.next(2_000) == 2_001
    r.store.close()


def test_multi_set_multi_get_multi_delete(replica: Replica) -> None:
    replica.write(MultiSetCommand(b"h", ((b"a", b"1"), (b"b", b"2"), (b"c", b"3"))))
    assert replica.store.multi_get(b"h", [b"a", b"c", b"x"], T0_S) == {b"a": b"1", b"c": b"3"}
    replica.write(MultiDeleteCommand(b"h", (b"a", b"b")))
    assert replica.store.multi_get(b"h", [b"a", b"b", b"c"], T0_S) == {b"c": b"3"}


def test_scan_bounds_reverse_and_paging(replica: Replica) -> None:
    keys = [b"k%02d" % i for i in range(20)]
    replica.write(MultiSetCommand(b"h", tuple((k, k) for k in keys)))
    replica.write(SetCommand(b"g", b"k05", b"other hash key"), SetCommand(b"hh", b"k05", b"x"))

    def sort_keys(**kw: object) -> list[bytes]:
        return [i.sort_key for i in replica.store.scan(b"h", T0_S, limit=100, **kw).items]

    assert sort_keys() == keys
    assert sort_keys(start=b"k05", stop=b"k08") == keys[5:8]
    assert sort_keys(start=b"k05", stop=b"k08", start_inclusive=False,
                     stop_inclusive=True) == keys[6:9]
    assert sort_keys(start=b"k05", stop=b"k08", reverse=True) == keys[5:8][::-1]
    got, after, pages = [], None, 0
    while True:
        page = replica.store.scan(b"h", T0_S, limit=6, after=after, reverse=True)
        got += [i.sort_key for i in page.items]
        pages += 1
        if page.next_after is None:
            break
        after = page.next_after
    assert got == keys[::-1] and pages == 4
    everything, after = [], None
    while True:
        page = replica.store.full_scan(T0_S, limit=7, after=after)
        everything += [(i.hash_key, i.sort_key) for i in page.items]
        if page.next_after is None:
            break
        after = page.next_after
    assert len(everything) == 22 and everything == sorted(everything, key=lambda x: (
        len(x[0]), x[0], x[1]))


def test_ttl_expiry_and_ttl_answer(replica: Replica) -> None:
    replica.write(SetCommand(b"h", b"short", b"v", ttl_s=10), SetCommand(b"h", b"forever", b"v"))
    assert replica.store.ttl_s(b"h", b"short", T0_S + 4) == 6
    assert replica.store.ttl_s(b"h", b"forever", T0_S + 4) == -1
    assert replica.store.get(b"h", b"short", T0_S + 9) == b"v"
    assert replica.store.get(b"h", b"short", T0_S + 10) is None
    assert replica.store.ttl_s(b"h", b"short", T0_S + 10) is None
    assert replica.store.sort_key_count(b"h", T0_S + 10) == 1
    assert [i.sort_key for i in replica.store.scan(b"h", T0_S + 10).items] == [b"forever"]
    # The expired record goes once its write is older than the delay too (a late
    # duplicate write older than it must still lose to it).
    assert replica.collect(T0_S + 10, delay_s=3600) == 0
    assert replica.collect(T0_S + 3601, delay_s=3600) == 1


def test_incr_follows_pegasus(replica: Replica) -> None:
    assert replica.write(IncrCommand(b"h", b"n", 5)) == [IncrResult(5)]
    assert replica.write(IncrCommand(b"h", b"n", -7, ttl_s=100)) == [IncrResult(-2)]
    assert replica.store.ttl_s(b"h", b"n", T0_S) == 100
    assert replica.write(IncrCommand(b"h", b"n", 1), at_s=T0_S + 50) == [IncrResult(-1)]
    assert replica.store.ttl_s(b"h", b"n", T0_S + 50) == 50  # 0 keeps the TTL
    assert replica.write(IncrCommand(b"h", b"n", 1, ttl_s=-1)) == [IncrResult(0)]
    assert replica.store.ttl_s(b"h", b"n", T0_S) == -1  # < 0 clears it
    replica.write(SetCommand(b"h", b"text", b"abc"), SetCommand(b"h", b"big", b"%d" % (2**63 - 1)))
    (refused,) = replica.write(IncrCommand(b"h", b"text", 1))
    assert isinstance(refused, Refused) and "not a decimal integer" in refused.message
    (refused,) = replica.write(IncrCommand(b"h", b"big", 1))
    assert isinstance(refused, Refused) and "overflows" in refused.message
    assert replica.store.get(b"h", b"big", T0_S) == b"%d" % (2**63 - 1)
    # An expired counter starts again from 0.
    replica.write(IncrCommand(b"h", b"e", 9, ttl_s=1))
    assert replica.write(IncrCommand(b"h", b"e", 1), at_s=T0_S + 2) == [IncrResult(1)]


CHECKS = [
    (CheckType.NO_CHECK, b"", None, True),
    (CheckType.VALUE_NOT_EXIST, b"", None, True),
    (CheckType.VALUE_NOT_EXIST, b"", b"x", False),
    (CheckType.VALUE_NOT_EXIST_OR_EMPTY, b"", b"", True),
    (CheckType.VALUE_EXIST, b"", b"", True),
    (CheckType.VALUE_EXIST, b"", None, False),
    (CheckType.VALUE_NOT_EMPTY, b"", b"", False),
    (CheckType.MATCH_ANYWHERE, b"ell", b"hello", True),
    (CheckType.MATCH_PREFIX, b"he", b"hello", True),
    (CheckType.MATCH_PREFIX, b"lo", b"hello", False),
    (CheckType.MATCH_POSTFIX, b"lo", b"hello", True),
    (CheckType.MATCH_ANYWHERE, b"", None, False),
    (CheckType.BYTES_LESS, b"b", b"a", True),
    (CheckType.BYTES_LESS_OR_EQUAL, b"a", b"a", True),
    (CheckType.BYTES_EQUAL, b"a", b"b", False),
    (CheckType.BYTES_GREATER_OR_EQUAL, b"b", b"a", False),
    (CheckType.BYTES_GREATER, b"a", b"b", True),
    (CheckType.INT_LESS, b"10", b"9", True),  # as integers, not bytes
    (CheckType.INT_LESS_OR_EQUAL, b"-1", b"-1", True),
    (CheckType.INT_EQUAL, b"7", b"07", True),
    (CheckType.INT_GREATER_OR_EQUAL, b"10", b"9", False),
    (CheckType.INT_GREATER, b"9", b"10", True),
    (CheckType.INT_GREATER, b"9", None, False),
]


@pytest.mark.parametrize(("check", "operand", "current", "expected"), CHECKS)
def test_check_types(check: CheckType, operand: bytes, current: bytes | None,
                     expected: bool) -> None:
    assert check_passes(check, operand, current) is expected


def test_int_check_of_a_non_integer_is_refused(replica: Replica) -> None:
    with pytest.raises(NotAnIntegerError):
        check_passes(CheckType.INT_LESS, b"x", b"1")
    replica.write(SetCommand(b"h", b"c", b"abc"))
    (refused,) = replica.write(CheckAndMutateCommand(
        b"h", b"c", CheckType.INT_LESS, b"5", (Mutation(b"c", b"1"),)))
    assert isinstance(refused, Refused)
    assert replica.store.get(b"h", b"c", T0_S) == b"abc"


def test_check_and_set_and_mutate(replica: Replica) -> None:
    def cas(expect: bytes | None, new: bytes) -> object:
        check = CheckType.VALUE_NOT_EXIST if expect is None else CheckType.BYTES_EQUAL
        (result,) = replica.write(CheckAndMutateCommand(
            b"h", b"lock", check, expect or b"", (Mutation(b"lock", new),),
            return_check_value=True))
        return result

    assert cas(None, b"a") == CheckResult(True, False, None)
    assert cas(None, b"b") == CheckResult(False, True, b"a")
    assert cas(b"a", b"c") == CheckResult(True, True, b"a")
    assert replica.store.get(b"h", b"lock", T0_S) == b"c"
    # Several mutations of one hash key, all or none; one checks another key.
    (result,) = replica.write(CheckAndMutateCommand(
        b"h", b"lock", CheckType.VALUE_EXIST, b"",
        (Mutation(b"x", b"1", ttl_s=5), Mutation(b"lock", None))))
    assert isinstance(result, CheckResult) and result.succeeded and result.check_value is None
    assert replica.store.get(b"h", b"lock", T0_S) is None
    assert replica.store.ttl_s(b"h", b"x", T0_S) == 5
    # A later command of the same entry sees an earlier one's write.
    results = replica.write(SetCommand(b"h", b"y", b"1"), CheckAndMutateCommand(
        b"h", b"y", CheckType.BYTES_EQUAL, b"1", (Mutation(b"z", b"2"),)))
    assert results[1] == CheckResult(True, True, None)
    assert replica.store.get(b"h", b"z", T0_S) == b"2"


def test_bad_input_is_refused_identically_and_changes_nothing(replica: Replica) -> None:
    big_key, big_value = b"k" * (HASH_KEY_BYTES_MAX + 1), b"v" * (VALUE_BYTES_MAX + 1)
    results = replica.write(SetCommand(big_key, b"s", b"v"), SetCommand(b"h", b"s", big_value),
                            SetCommand(b"", b"s", b"v"), SetCommand(b"h", b"s", b"v", ttl_s=-3),
                            MultiSetCommand(b"h", ((b"ok", b"1"), (b"bad", big_value))),
                            SetCommand(b"h", b"fine", b"1"))
    assert [type(r) for r in results] == [Refused] * 5 + [Done]
    assert "over the limit" in results[0].message  # type: ignore[attr-defined]
    assert [i.sort_key for i in replica.store.full_scan(T0_S).items] == [b"fine"]
    with pytest.raises(KeyTooLargeError):
        replica.store.get(big_key, b"", T0_S)


def test_entry_round_trip() -> None:
    entry = TableEntry(123, (SetCommand(b"h", b"s", b"v", 3), CheckAndMutateCommand(
        b"h", b"s", CheckType.INT_EQUAL, b"1", (Mutation(b"s", None),), True)))
    assert decode_entry(encode_entry(entry)) == entry


def test_replayed_entries_are_skipped_and_decree_survives_reopen(tmp_path: Path) -> None:
    r = Replica(tmp_path / "s")
    r.write(IncrCommand(b"h", b"n", 1))
    r.write(IncrCommand(b"h", b"n", 1))
    assert r.store.apply(2, TableEntry(T0_S * US, (IncrCommand(b"h", b"n", 1),))) == []
    r.store.skip(3)  # a configuration change in the log
    r.store.close()
    again = TableStore(tmp_path / "s", cluster_id=1)
    assert again.applied_decree == 3
    assert again.get(b"h", b"n", T0_S) == b"2"
    again.close()


CRASH_CHILD = """
import os, sys
from pathlib import Path
from quorumlog.table import IncrCommand, TableEntry, TableStore
store = TableStore(Path(sys.argv[1]), cluster_id=1)
decree = store.applied_decree
while True:
    decree += 1
    store.apply(decree, TableEntry(1_700_000_000_000_000, (IncrCommand(b"h", b"n", 1),)))
    if decree == 200:
        print("ready", flush=True)
"""


def test_data_and_applied_decree_agree_after_sigkill(tmp_path: Path) -> None:
    """A process applying increments is SIGKILLed mid-stream: on reopen the
    counter equals the applied decree (each entry added 1), never more or less."""
    proc = subprocess.Popen([sys.executable, "-c", CRASH_CHILD, str(tmp_path / "s")],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    os.kill(proc.pid, 9)
    proc.wait(timeout=30)
    store = TableStore(tmp_path / "s", cluster_id=1)
    assert store.applied_decree >= 200
    assert store.get(b"h", b"n", T0_S) == b"%d" % store.applied_decree
    store.close()


def test_checkpoint_restores_the_same_data_without_copying(tmp_path: Path) -> None:
    leader = Replica(tmp_path / "leader")
    for i in range(50):
        leader.write(SetCommand(b"h%d" % (i % 7), b"s%d" % i, b"v" * 100, ttl_s=i % 3))
    leader.store._db.flush()
    decree = leader.store.checkpoint(tmp_path / "ckpt")
    assert decree == 50
    leader.write(SetCommand(b"h", b"after", b"not in the checkpoint"))
    sst = [p for p in (tmp_path / "ckpt").iterdir() if p.suffix == ".sst"]
    assert sst and all(p.stat().st_nlink >= 2 for p in sst)  # hard links, not copies
    follower = Replica(tmp_path / "follower")
    follower.write(SetCommand(b"stale", b"x", b"replaced by the snapshot"))
    follower.store.restore(tmp_path / "ckpt")
    assert follower.store.applied_decree == 50
    want = [(i.hash_key, i.sort_key, i.value) for i in leader.store.full_scan(
        T0_S, limit=1000).items if i.sort_key != b"after"]
    got = [(i.hash_key, i.sort_key, i.value) for i in follower.store.full_scan(
        T0_S, limit=1000).items]
    assert got == want and len(got) == 50
    leader.store.close()
    follower.store.close()


# ----- a model check: random writes and reads against a dict -----------------------------

hash_keys = st.sampled_from([b"a", b"b", b"\xff"])
sort_keys = st.sampled_from([b"", b"1", b"2", b"\x00", b"\xff\xff"])
values = st.sampled_from([b"", b"1", b"-3", b"x", b"10"])
ttls = st.sampled_from([0, 0, 1, 3])
commands = st.one_of(
    st.builds(SetCommand, hash_keys, sort_keys, values, ttls),
    st.builds(DeleteCommand, hash_keys, sort_keys),
    st.builds(IncrCommand, hash_keys, sort_keys, st.integers(-5, 5), st.sampled_from([0, 2, -1])),
    st.builds(lambda h, c, t, o, m: CheckAndMutateCommand(h, c, t, o, m, True),
              hash_keys, sort_keys, st.sampled_from(list(CheckType)), values,
              st.lists(st.builds(Mutation, sort_keys, st.one_of(st.none(), values), ttls),
                       min_size=1, max_size=2).map(tuple)),
)


def model_apply(model: dict[tuple[bytes, bytes], tuple[bytes, int]], now_s: int,
                command: WriteCommand) -> object:
    def live(key: tuple[bytes, bytes]) -> tuple[bytes, int] | None:
        got = model.get(key)
        return got if got is not None and (got[1] == 0 or got[1] > now_s) else None

    def expire(ttl: int) -> int:
        return 0 if ttl == 0 else now_s + ttl

    if isinstance(command, SetCommand):
        model[(command.hash_key, command.sort_key)] = (command.value, expire(command.ttl_s))
        return Done()
    if isinstance(command, DeleteCommand):
        model.pop((command.hash_key, command.sort_key), None)
        return Done()
    if isinstance(command, IncrCommand):
        key = (command.hash_key, command.sort_key)
        current = live(key)
        try:
            base = 0 if current is None or not current[0] else int(current[0])
            if current is not None and current[0] and not current[0].lstrip(b"-").isdigit():
                raise ValueError
        except ValueError:
            return "refused"
        ttl = (now_s + command.ttl_s if command.ttl_s > 0 else
               0 if command.ttl_s < 0 or current is None else current[1])
        model[key] = (b"%d" % (base + command.increment), ttl)
        return IncrResult(base + command.increment)
    assert isinstance(command, CheckAndMutateCommand)
    current = live((command.hash_key, command.check_sort_key))
    try:
        passed = check_passes(command.check_type, command.check_operand,
                              None if current is None else current[0])
    except NotAnIntegerError:
        return "refused"
    if passed:
        for mutation in command.mutations:
            key = (command.hash_key, mutation.sort_key)
            if mutation.value is None:
                model.pop(key, None)
            else:
                model[key] = (mutation.value, expire(mutation.ttl_s))
    return CheckResult(passed, current is not None, None if current is None else current[0])


@settings(max_examples=int(os.environ.get("QUORUMLOG_MODEL_EXAMPLES", "60")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.integers(0, 2), commands), min_size=1, max_size=40))
def test_store_matches_a_dict_model(tmp_path_factory: pytest.TempPathFactory,
                                    steps: list[tuple[int, WriteCommand]]) -> None:
    r = Replica(tmp_path_factory.mktemp("model") / "s")
    model: dict[tuple[bytes, bytes], tuple[bytes, int]] = {}
    now = T0_S
    try:
        for advance, command in steps:
            now += advance
            (got,) = r.write(command, at_s=now)
            want = model_apply(model, now, command)
            assert (isinstance(got, Refused) if want == "refused" else got == want), (
                command, got, want)
            for h in (b"a", b"b", b"\xff"):
                live = {s: v for (hk, s), (v, e) in model.items()
                        if hk == h and (e == 0 or e > now)}
                scanned = {i.sort_key: i.value for i in r.store.scan(h, now, limit=100).items}
                assert scanned == live
                assert r.store.sort_key_count(h, now) == len(live)
    finally:
        r.store.close()


@pytest.mark.parametrize("skip_max", [1, 3, 10_000])
def test_a_copyset_store_scans_one_partition_at_a_time(
        replica: Replica, monkeypatch: pytest.MonkeyPatch, skip_max: int) -> None:
    """A copyset's store holds several partitions: a full scan of one gives its
    live records only, in key order, each once; a page that passed
    ``FILTERED_SCAN_SKIP_MAX`` other records ends early (maybe empty) with where
    to go on."""
    monkeypatch.setattr(store_module, "FILTERED_SCAN_SKIP_MAX", skip_max)
    partitions = 5
    hash_keys = [b"k%d" % i for i in range(60)]
    for h in hash_keys:
        replica.write(SetCommand(h, b"a", b"1"), SetCommand(h, b"b", b"2"))
    replica.write(DeleteCommand(hash_keys[0], b"a"))
    everything = [(i.hash_key, i.sort_key)
                  for i in replica.store.full_scan(T0_S, limit=1000).items]
    union = []
    for partition in range(partitions):
        got, after, empty_pages = [], None, 0
        while True:
            page = replica.store.full_scan(T0_S, limit=4, after=after, partitions=partitions,
                                           partition=partition)
            got += [(i.hash_key, i.sort_key) for i in page.items]
            empty_pages += not page.items and page.next_after is not None
            if page.next_after is None:
                break
            after = page.next_after
        assert got == [k for k in everything if partition_of(k[0], partitions) == partition]
        if skip_max == 1:  # a page ends at the first record of another partition
            assert empty_pages > 0
        elif skip_max == 10_000:
            assert empty_pages == 0
        union += got
    assert sorted(union) == sorted(everything) and len(everything) == 119
    with pytest.raises(BadTableRequestError, match="partition 5 out of range"):
        replica.store.full_scan(T0_S, partitions=5, partition=5)
