"""The linearizability checker on hand-built histories.

Each history is a table of ``Operation(client, kind, key, input, output, call,
ret)``; ``ret=None`` means the client never heard back (unknown outcome).
"""

from __future__ import annotations

import math
import random

import pytest

from quorumlog.errors import UsageError
from quorumlog.sim import Operation, OpKind, Verdict, check_history

Op = Operation
INF = math.inf


def _verdict(history: list[Operation]) -> Verdict:
    return check_history(history).verdict


# -- linearizable histories ----------------------------------------------------


def test_empty_history_is_linearizable() -> None:
    result = check_history([])
    assert result.verdict is Verdict.OK
    assert result.ok


def test_sequential_put_get() -> None:
    history = [
        Op(1, "put", "x", "a", None, 0, 1),
        Op(2, "get", "x", None, "a", 2, 3),
        Op(1, "put", "x", "b", None, 4, 5),
        Op(2, "get", "x", None, "b", 6, 7),
    ]
    assert _verdict(history) is Verdict.OK


def test_get_of_absent_key_reads_none() -> None:
    assert _verdict([Op(1, "get", "x", None, None, 0, 1)]) is Verdict.OK
    assert _verdict([Op(1, "get", "x", None, "a", 0, 1)]) is Verdict.ILLEGAL


def test_concurrent_overlapping_ops_may_take_either_order() -> None:
    # put a and put b overlap; two readers see them in opposite orders, but
    # each reader's view is consistent with one total order only if they
    # overlap the writes too.
    history = [
        Op(1, "put", "x", "a", None, 0, 10),
        Op(2, "put", "x", "b", None, 1, 9),
        Op(3, "get", "x", None, "b", 2, 3),
        Op(4, "get", "x", None, "a", 5, 11),
    ]
    assert _verdict(history) is Verdict.OK


def test_read_concurrent_with_write_may_see_old_or_new() -> None:
    base = [Op(1, "put", "x", "a", None, 0, 1), Op(1, "put", "x", "b", None, 2, 6)]
    assert _verdict([*base, Op(2, "get", "x", None, "a", 3, 4)]) is Verdict.OK
    assert _verdict([*base, Op(2, "get", "x", None, "b", 3, 4)]) is Verdict.OK


def test_touching_intervals_count_as_concurrent() -> None:
    history = [
        Op(1, "put", "x", "a", None, 0, 5),
        Op(2, "get", "x", None, None, 5, 6),
    ]
    assert _verdict(history) is Verdict.OK


def test_cas_success_and_failure() -> None:
    history = [
        Op(1, "put", "x", "a", None, 0, 1),
        Op(2, "cas", "x", ("a", "b"), True, 2, 3),
        Op(3, "cas", "x", ("a", "c"), False, 4, 5),
        Op(3, "get", "x", None, "b", 6, 7),
    ]
    assert _verdict(history) is Verdict.OK


def test_concurrent_cas_one_wins() -> None:
    history = [
        Op(1, "put", "x", 0, None, 0, 1),
        Op(1, "cas", "x", (0, 1), True, 2, 10),
        Op(2, "cas", "x", (0, 2), False, 3, 9),
        Op(3, "get", "x", None, 1, 11, 12),
    ]
    assert _verdict(history) is Verdict.OK


def test_keys_are_independent() -> None:
    history = [
        Op(1, "put", "x", "a", None, 0, 1),
        Op(1, "put", "y", "b", None, 2, 3),
        Op(2, "get", "x", None, "a", 4, 5),
        Op(2, "get", "y", None, "b", 4, 5),
    ]
    result = check_history(history)
    assert result.verdict is Verdict.OK
    assert [k.key for k in result.keys] == ["x", "y"]


# -- non-linearizable histories ------------------------------------------------


def test_stale_read_is_illegal_with_explanation() -> None:
    history = [
        Op(1, "put", "x", "a", None, 0, 1),
        Op(1, "put", "x", "b", None, 2, 3),
        Op(2, "get", "x", None, "a", 4, 5),
    ]
    result = check_history(history)
    assert result.verdict is Verdict.ILLEGAL
    assert result.key == "x"
    assert "stuck: client 2 get x -> 'a' [4, 5]" in result.explanation
    assert "holds 'b'" in result.explanation


def test_lost_write_is_illegal() -> None:
    # An acknowledged write that a later read does not see, though nothing
    # else wrote in between: the write was lost.
    history = [
        Op(1, "put", "x", "a", None, 0, 1),
        Op(2, "put", "x", "b", None, 2, 3),
        Op(3, "get", "x", None, "b", 4, 5),
        Op(3, "get", "x", None, "a", 6, 7),
    ]
    assert _verdict(history) is Verdict.ILLEGAL


def test_read_of_value_never_written_is_illegal() -> None:
    history = [Op(1, "put", "x", "a", None, 0, 1), Op(2, "get", "x", None, "zzz", 2, 3)]
    assert _verdict(history) is Verdict.ILLEGAL


def test_two_cas_from_same_expected_both_succeed_is_illegal() -> None:
    history = [
        Op(1, "put", "x", 0, None, 0, 1),
        Op(1, "cas", "x", (0, 1), True, 2, 10),
        Op(2, "cas", "x", (0, 2), True, 3, 9),
    ]
    assert _verdict(history) is Verdict.ILLEGAL


def test_cas_that_fails_on_matching_value_is_illegal() -> None:
    history = [
        Op(1, "put", "x", "a", None, 0, 1),
        Op(2, "cas", "x", ("a", "b"), False, 2, 3),
    ]
    assert _verdict(history) is Verdict.ILLEGAL


def test_cas_success_on_stale_value_is_illegal() -> None:
    history = [
        Op(1, "put", "x", "a", None, 0, 1),
        Op(1, "put", "x", "b", None, 2, 3),
        Op(2, "cas", "x", ("a", "c"), True, 4, 5),
    ]
    assert _verdict(history) is Verdict.ILLEGAL


def test_real_time_order_matters_reads_going_backwards() -> None:
    # Two reads concurrent with one write: the first sees the new value, the
    # second (called after the first returned) sees the old one.
    history = [
        Op(1, "put", "x", "a", None, 0, 1),
        Op(1, "put", "x", "b", None, 2, 20),
        Op(2, "get", "x", None, "b", 3, 4),
        Op(3, "get", "x", None, "a", 5, 6),
    ]
    assert _verdict(history) is Verdict.ILLEGAL


def test_illegal_key_is_reported_among_good_keys() -> None:
    history = [
        Op(1, "put", "a", 1, None, 0, 1),
        Op(1, "get", "a", None, 1, 2, 3),
        Op(1, "put", "b", 1, None, 0, 1),
        Op(1, "get", "b", None, 2, 2, 3),
    ]
    result = check_history(history)
    assert result.verdict is Verdict.ILLEGAL
    assert result.key == "b"


# -- unknown outcomes ----------------------------------------------------------


@pytest.mark.parametrize("ret", [None, INF])
def test_unknown_write_may_have_taken_effect(ret: float | None) -> None:
    history = [
        Op(1, "put", "x", "a", None, 0, ret),
        Op(2, "get", "x", None, "a", 5, 6),
    ]
    assert _verdict(history) is Verdict.OK


def test_unknown_write_may_not_have_taken_effect() -> None:
    history = [
        Op(1, "put", "x", "a", None, 0, None),
        Op(2, "get", "x", None, None, 5, 6),
        Op(2, "get", "x", None, None, 7, 8),
    ]
    assert _verdict(history) is Verdict.OK


def test_unknown_write_takes_effect_at_most_once_and_not_before_its_call() -> None:
    # Seen, then unseen, then seen again: it cannot flicker.
    history = [
        Op(1, "put", "x", "a", None, 0, None),
        Op(2, "get", "x", None, "a", 1, 2),
        Op(2, "put", "x", "b", None, 3, 4),
        Op(2, "get", "x", None, "a", 5, 6),
    ]
    assert _verdict(history) is Verdict.ILLEGAL
    # Not visible before the write was even called.
    early = [
        Op(2, "get", "x", None, "a", 0, 1),
        Op(1, "put", "x", "a", None, 2, None),
    ]
    assert _verdict(early) is Verdict.ILLEGAL


def test_unknown_cas_takes_effect_only_if_expected_matches() -> None:
    ok = [
        Op(1, "put", "x", "a", None, 0, 1),
        Op(2, "cas", "x", ("a", "b"), None, 2, None),
        Op(3, "get", "x", None, "b", 10, 11),
    ]
    assert _verdict(ok) is Verdict.OK
    bad = [
        Op(1, "put", "x", "z", None, 0, 1),
        Op(2, "cas", "x", ("a", "b"), None, 2, None),
        Op(3, "get", "x", None, "b", 10, 11),
    ]
    assert _verdict(bad) is Verdict.ILLEGAL


def test_unknown_get_is_ignored() -> None:
    history = [
        Op(1, "put", "x", "a", None, 0, 1),
        Op(2, "get", "x", None, "nonsense", 2, None),
    ]
    result = check_history(history)
    assert result.verdict is Verdict.OK
    assert result.keys[0].operations == 1


# -- bounds and input checks ---------------------------------------------------


def _concurrent_writers_history(writers: int) -> list[Operation]:
    """Many fully concurrent writes then a read nobody wrote: a hard ILLEGAL."""
    history = [Op(c, "put", "x", c, None, 0, 100) for c in range(writers)]
    history.append(Op(99, "get", "x", None, -1, 200, 201))
    return history


def test_tiny_step_limit_gives_unknown_never_a_pass() -> None:
    history = _concurrent_writers_history(12)
    result = check_history(history, step_limit=50)
    assert result.verdict is Verdict.UNKNOWN
    assert result.key == "x"
    assert "could not decide" in result.explanation
    assert check_history(history).verdict is Verdict.ILLEGAL


def test_time_limit_gives_unknown() -> None:
    ticks = iter(range(1_000_000))
    result = check_history(
        _concurrent_writers_history(14), time_limit_s=3, clock=lambda: float(next(ticks))
    )
    assert result.verdict is Verdict.UNKNOWN
    assert "time limit" in result.explanation


def test_budget_large_enough_decides() -> None:
    history = [Op(1, "put", "x", "a", None, 0, 1), Op(1, "get", "x", None, "a", 2, 3)]
    assert check_history(history, step_limit=10).verdict is Verdict.OK


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"call": 5, "ret": 4}, "returns before it is called"),
        ({"call": INF, "ret": None}, "must be finite"),
        ({"kind": "cas", "input": "a"}, "cas input"),
        ({"kind": "cas", "input": ("a", "b"), "output": "yes"}, "cas output"),
    ],
)
def test_bad_operations_are_rejected(kwargs: dict[str, object], needle: str) -> None:
    fields: dict[str, object] = {
        "client_id": 1, "kind": "put", "key": "x", "input": "a", "output": None,
        "call": 0, "ret": 1,
    }
    fields.update(kwargs)
    with pytest.raises(UsageError, match=needle):
        Operation(**fields)  # type: ignore[arg-type]


def test_kind_is_normalized_and_described() -> None:
    op = Op(3, "cas", "k", ("a", "b"), True, 10, 14)
    assert op.kind is OpKind.CAS
    assert op.describe() == "client 3 cas k ('a' -> 'b') = True [10, 14]"
    assert Op(1, "put", "k", "v", None, 0, None).describe() == "client 1 put k='v' [0, ?]"


def _random_register_history(seed: int, ops: int) -> list[Operation]:
    """A linearizable history: each op takes effect at a random point inside its interval."""
    rng = random.Random(seed)
    client_free = [0.0] * 6
    planned = []
    for _ in range(ops):
        client = rng.randrange(len(client_free))
        call = client_free[client] + rng.random()
        point = call + rng.random()
        ret = point + rng.random() * 3
        client_free[client] = ret
        planned.append((point, client, f"k{rng.randrange(3)}", call, ret))
    planned.sort()
    state: dict[str, int] = {}
    history = []
    for counter, (_, client, key, call, ret) in enumerate(planned):
        roll = rng.random()
        unknown = rng.random() < 0.1
        if roll < 0.4:
            state[key] = counter
            history.append(Op(client, "put", key, counter, None, call, None if unknown else ret))
        elif roll < 0.8:
            history.append(Op(client, "get", key, None, state.get(key), call, ret))
        else:
            expected = state.get(key) if rng.random() < 0.5 else rng.randrange(counter + 1)
            swapped = state.get(key) == expected
            if swapped:
                state[key] = counter
            history.append(
                Op(client, "cas", key, (expected, counter), swapped, call, None if unknown else ret)
            )
    return history


@pytest.mark.parametrize("seed", range(5))
def test_random_linearizable_histories_pass_and_mutants_fail(seed: int) -> None:
    history = _random_register_history(seed, 600)
    assert check_history(history).verdict is Verdict.OK
    # Corrupt one known read to a value that was never written.
    reads = [i for i, op in enumerate(history) if op.kind is OpKind.GET]
    victim = history[reads[len(reads) // 2]]
    history[reads[len(reads) // 2]] = Op(
        victim.client_id, "get", victim.key, None, -7, victim.call, victim.ret
    )
    result = check_history(history)
    assert result.verdict is Verdict.ILLEGAL
    assert result.key == victim.key


# -- rows: several fields of one key written and read together -----------------


def test_row_multi_put_then_multi_get_and_scan_read_every_field() -> None:
    history = [
        Op(1, "mput", "r", (("a", "1"), ("b", "1")), None, 0, 1),
        Op(2, "mget", "r", ("a", "b", "c"), ("1", "1", None), 2, 3),
        Op(2, "mget", "r", None, (("a", "1"), ("b", "1")), 4, 5),  # a scan
        Op(1, "mput", "r", (("a", None),), None, 6, 7),  # a multi_delete
        Op(2, "mget", "r", None, [["b", "1"]], 8, 9),  # JSON's lists work too
    ]
    assert _verdict(history) is Verdict.OK


def test_row_read_of_half_a_multi_put_is_illegal() -> None:
    """A multi_set that became visible one field at a time: a reader concurrent
    with it saw the new a and the old b."""
    history = [
        Op(1, "mput", "r", (("a", "0"), ("b", "0")), None, 0, 1),
        Op(1, "mput", "r", (("a", "1"), ("b", "1")), None, 2, 10),
        Op(2, "mget", "r", ("a", "b"), ("1", "0"), 3, 4),
    ]
    result = check_history(history)
    assert result.verdict is Verdict.ILLEGAL
    assert "mget r [a,b] -> ('1', '0')" in result.explanation
    # Either whole state is fine while the write is in flight.
    for seen in (("0", "0"), ("1", "1")):
        assert _verdict([*history[:2], Op(2, "mget", "r", ("a", "b"), seen, 3, 4)]) is Verdict.OK


def test_row_scan_that_misses_a_field_written_before_it_is_illegal() -> None:
    history = [
        Op(1, "mput", "r", (("a", "1"), ("b", "1")), None, 0, 1),
        Op(2, "mget", "r", None, (("a", "1"),), 2, 3),
    ]
    assert _verdict(history) is Verdict.ILLEGAL


def test_row_check_and_mutate_applies_all_or_nothing() -> None:
    base = [Op(1, "mput", "r", (("a", "0"),), None, 0, 1)]
    cam_ok = Op(2, "mcas", "r", ("a", "0", (("a", "1"), ("b", "1"))), True, 2, 3)
    cam_fail = Op(3, "mcas", "r", ("a", "0", (("a", "2"), ("b", "2"))), False, 4, 5)
    after = Op(1, "mget", "r", ("a", "b"), ("1", "1"), 6, 7)
    assert _verdict([*base, cam_ok, cam_fail, after]) is Verdict.OK
    # A check of an absent field (expected None) succeeds only while it is absent.
    absent = Op(2, "mcas", "r", ("c", None, (("c", "x"),)), True, 8, 9)
    assert _verdict([*base, cam_ok, cam_fail, after, absent]) is Verdict.OK
    # The failed one left b alone; a success that left b alone is not one.
    assert _verdict([*base, cam_ok, cam_fail,
                     Op(1, "mget", "r", ("a", "b"), ("1", "2"), 6, 7)]) is Verdict.ILLEGAL
    assert _verdict([*base, cam_ok,
                     Op(1, "mget", "r", ("a", "b"), ("1", None), 6, 7)]) is Verdict.ILLEGAL
    # A success whose check could not hold is illegal.
    assert _verdict([*base, Op(2, "mcas", "r", ("a", "9", (("b", "1"),)), True, 2, 3)]
                    ) is Verdict.ILLEGAL


def test_row_unknown_outcomes_may_take_effect_later_or_never() -> None:
    base = [Op(1, "mput", "r", (("a", "0"),), None, 0, 1),
            Op(2, "mput", "r", (("a", "1"), ("b", "1")), None, 2, None),
            Op(3, "mcas", "r", ("a", "0", (("b", "2"),)), None, 2, INF),
            Op(4, "mget", "r", ("a", "b"), ("9", "9"), 2, None)]  # read, no answer: dropped
    for seen in (("0", None), ("0", "2"), ("1", "1")):
        assert _verdict([*base, Op(1, "mget", "r", ("a", "b"), seen, 5, 6)]) is Verdict.OK
    assert _verdict([*base, Op(1, "mget", "r", ("a", "b"), ("1", "2"), 5, 6),
                     Op(1, "mget", "r", ("a", "b"), ("1", "1"), 7, 8)]) is Verdict.ILLEGAL


def test_row_and_register_operations_on_one_key_are_refused() -> None:
    with pytest.raises(UsageError, match="both register and row"):
        check_history([Op(1, "put", "r", "a", None, 0, 1),
                       Op(1, "mget", "r", ("a",), (None,), 2, 3)])
    with pytest.raises(UsageError, match="mcas input"):
        Op(1, "mcas", "r", ("a", "0"), True, 0, 1)
    with pytest.raises(UsageError, match="mcas output"):
        Op(1, "mcas", "r", ("a", "0", ()), "yes", 0, 1)
    with pytest.raises(UsageError, match="at least one"):
        Op(1, "mput", "r", (), None, 0, 1)
