"""The auto-recovery simulator: the production auditor and replication workers
on three nodes, with node crashes mid-copy, expiring sessions, bookie outages
shorter and longer than the recovery delay, and disks lost for good.

The default run takes 120 seeds (about 0.1 s each); ``-m slow`` runs 3,000
more at a random far offset (printed; replay with QUORUMLOG_SIM_OFFSET). The
planted bugs show that each invariant can fail. FOUND_BUG_SEEDS failed before
the fixes they found (docs/recovery.md, "Simulator")."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from quorumlog.recovery import ReplicationWorker, _auditor
from quorumlog.sim import run_recovery_seed
from quorumlog.sim._recovery_runner import summarize

pytestmark = pytest.mark.sim

DEFAULT_SEEDS = range(0, 120)
FOUND_BUG_SEEDS = (1, 2, 47, 55, 157, 158, 73000000002)
"""1, 2: a ledger marked lost while a replica's bookie was only gone past the
delay (it came back with the data; the task stayed lost); 73000000002: the
same when that bookie went away again during the attempt. 47, 55, 157, 158: a
bookie back for less than an audit interval and gone again was declared lost
from the start of its first outage."""
SLOW_SEEDS = 3_000
PLANTED_SEEDS = range(0, 60)


def _random_offset() -> int:
    fixed = os.environ.get("QUORUMLOG_SIM_OFFSET")
    if fixed:
        return int(fixed)
    return random.SystemRandom().randrange(10**8, 10**11, 1000)


def _failures(seeds: range | tuple[int, ...]) -> list[str]:
    return list(summarize(r for r in (run_recovery_seed(s) for s in seeds) if not r.passed))


@pytest.mark.parametrize("chunk", range(4))
def test_recovery_seeds_pass(chunk: int) -> None:
    per_chunk = len(DEFAULT_SEEDS) // 4
    seeds = range(DEFAULT_SEEDS.start + chunk * per_chunk,
                  DEFAULT_SEEDS.start + (chunk + 1) * per_chunk)
    failures = _failures(seeds)
    assert not failures, "\n".join(failures) + "\nreplay: quorumlog sim recovery --seed S --trace"


def test_found_bug_seeds_pass() -> None:
    failures = _failures(FOUND_BUG_SEEDS)
    assert not failures, "\n".join(failures)


def test_runs_exercise_the_faults() -> None:
    stats = [run_recovery_seed(s).stats for s in range(0, 20)]
    for name in ("node_crashes", "disks_lost", "swaps", "tasks_filed", "keepalive_stalls"):
        assert sum(s[name] for s in stats) > 0, name


def test_same_seed_same_run_with_or_without_trace() -> None:
    first = run_recovery_seed(7)
    again = run_recovery_seed(7, keep_trace=True)
    assert (first.passed, first.stats) == (again.passed, again.stats)
    assert again.trace and not first.trace
    assert run_recovery_seed(7, keep_trace=True).trace_hash == again.trace_hash


@contextmanager
def _planted(monkeypatch: pytest.MonkeyPatch, target: object, name: str,
             value: object) -> Iterator[None]:
    with monkeypatch.context() as patch:
        patch.setattr(target, name, value)
        yield


def _caught(*names: str) -> str:
    """The first planted-bug seed's violation among ``names`` ("" if none)."""
    seen = []
    for seed in PLANTED_SEEDS:
        result = run_recovery_seed(seed)
        if result.violation in names:
            return result.violation
        seen.append(result.violation)
    return f"not caught (saw {sorted(set(seen))})"


def test_planted_swap_without_copy_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """No copy, and no flush request either (its check of the copied entries
    would fail the attempt before the swap: tests/recovery/test_copy_durability.py
    plants a missing flush alone)."""
    async def no_copy(*args: object, **kwargs: object) -> int:
        return 0

    async def no_flush(*args: object, **kwargs: object) -> None:
        return None

    with (_planted(monkeypatch, ReplicationWorker, "_copy", no_copy),
          _planted(monkeypatch, ReplicationWorker, "_flush", no_flush)):
        assert _caught("swap-before-copy") == "swap-before-copy"


def test_planted_no_delay_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def lost_at_once(missing: dict[str, int], now_ms: int, delay_ms: int,
                     draining: object = ()) -> set[str]:
        return set(missing)

    with _planted(monkeypatch, _auditor, "lost_bookies", lost_at_once):
        assert _caught("task-for-returned-bookie") == "task-for-returned-bookie"


def test_planted_second_swap_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    original = ReplicationWorker._swap

    async def swap_twice(self: ReplicationWorker, ledger_id: int, slot: object,
                         target: str) -> None:
        await original(self, ledger_id, slot, target)  # type: ignore[arg-type]
        metadata, version = await self._client.context.load_metadata(ledger_id)
        other = [b for b in ("b0", "b1", "b2", "b3", "b4", "b5", "b6", "b7")
                 if b not in metadata.ensembles[slot.fragment_index].bookies]  # type: ignore[attr-defined]
        updated = metadata.with_bookie_replaced(slot.fragment_index,  # type: ignore[attr-defined]
                                                slot.position, other[0])  # type: ignore[attr-defined]
        from quorumlog import proto

        await self._meta.cas(proto.ledger_key(ledger_id), version, updated.encode())

    with _planted(monkeypatch, ReplicationWorker, "_swap", swap_twice):
        assert _caught("slot-swapped-twice") == "slot-swapped-twice"


def test_planted_lost_never_reopened_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    async def never(*args: object, **kwargs: object) -> bool:
        return False

    with _planted(monkeypatch, _auditor, "reopen_if_back", never):
        assert _caught("lost-wrongly") == "lost-wrongly"


@pytest.mark.slow
@pytest.mark.parametrize("chunk", range(4))
def test_recovery_seeds_at_a_random_offset(chunk: int) -> None:
    offset = _random_offset()
    per_chunk = SLOW_SEEDS // 4
    first = offset + chunk * per_chunk
    failures = _failures(range(first, first + per_chunk))
    assert not failures, (f"offset {offset} (QUORUMLOG_SIM_OFFSET={offset}):\n"
                          + "\n".join(failures))
