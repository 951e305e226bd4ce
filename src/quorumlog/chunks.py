"""Splitting an ordered run of items into requests that fit a byte budget.

Every batched request has a frame or entry limit: the ledger client's add
batches, recovery's copies, the Raft host journal's records, duplication's
calls to the remote cluster, the Spark table writer's multi_sets. They all
cut the same way, which lives here once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


def by_size(items: Iterable[T], size: Callable[[T], int], bytes_max: int,
            items_max: int | None = None) -> list[list[T]]:
    """``items`` in order, as runs of at most ``bytes_max`` bytes (``size`` of
    each item) and at most ``items_max`` items; an item larger than
    ``bytes_max`` goes alone. Always at least one run (``[[]]`` for no items)."""
    runs: list[list[T]] = [[]]
    run = runs[0]
    run_bytes = 0
    for item in items:
        item_bytes = size(item)
        if run and (run_bytes + item_bytes > bytes_max
                    or (items_max is not None and len(run) >= items_max)):
            run = []
            runs.append(run)
            run_bytes = 0
        run.append(item)
        run_bytes += item_bytes
    return runs
