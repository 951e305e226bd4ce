"""chunks.by_size: the one way batched requests are cut to a byte budget."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from quorumlog import chunks


@given(sizes=st.lists(st.integers(0, 50), max_size=60), bytes_max=st.integers(1, 120),
       items_max=st.one_of(st.none(), st.integers(1, 8)))
def test_runs_keep_order_fit_the_budget_and_are_greedy(sizes: list[int], bytes_max: int,
                                                       items_max: int | None) -> None:
    items = list(enumerate(sizes))
    runs = chunks.by_size(items, lambda item: item[1], bytes_max, items_max)
    assert [item for run in runs for item in run] == items
    assert runs == [[]] if not items else all(runs)
    for k, run in enumerate(runs):
        run_bytes = sum(size for _, size in run)
        assert run_bytes <= bytes_max or len(run) == 1  # an oversize item goes alone
        assert items_max is None or len(run) <= items_max
        if k + 1 < len(runs):  # greedy: the next item did not fit this run
            following = runs[k + 1][0][1]
            assert (run_bytes + following > bytes_max
                    or (items_max is not None and len(run) == items_max))


def test_an_item_over_the_budget_goes_alone() -> None:
    runs = chunks.by_size([b"a", b"x" * 10, b"b", b"c"], len, 3)
    assert runs == [[b"a"], [b"x" * 10], [b"b", b"c"]]


def test_a_duplicate_call_over_the_budget_is_cut_by_record_bytes() -> None:
    from quorumlog.table._commands import DuplicateCommand
    from quorumlog.table._dup_shipper import split_duplicate

    records = tuple((b"s%d" % i, b"v" * 40, 0, 1000 + i) for i in range(10))
    command = DuplicateCommand(b"h", records)
    assert split_duplicate(command, bytes_max=10_000) == [command]
    pieces = split_duplicate(command, bytes_max=100)  # 42 bytes a record: two a piece
    assert [len(p.records) for p in pieces] == [2] * 5
    assert all(p.hash_key == b"h" for p in pieces)
    assert tuple(r for p in pieces for r in p.records) == records
