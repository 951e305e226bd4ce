"""The simulator catches planted Raft bugs (slow: ``make test-slow``).

Each mutant copies the package to a temporary directory, plants one bug in the
*copy* of ``quorumlog.raft`` (the real code is never touched: the core, or the
ready pass ``RaftHost`` and the simulator share) and runs a few
dozen seeds of the fault mixes that expose it, in a subprocess whose
``PYTHONPATH`` puts the copy first. The run must report one of the expected
invariants. If the Raft code changed so that a mutant's target text is gone,
the test fails and says so: update the mutant, do not delete it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import quorumlog

pytestmark = [pytest.mark.slow, pytest.mark.sim]


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # inside the quorumlog package
    old: str
    new: str
    mixes: tuple[str, ...]
    seeds: int
    expected: frozenset[str]


_MUST_SYNC = (
    "must_sync=bool(entries) or hard_state.term != prev.term or hard_state.vote != prev.vote,"
)

MUTANTS = [
    Mutant(
        "commit earlier-term entries by counting replicas (Figure 8)",
        "raft/_log.py",
        "if index > self.committed and self.term_or_zero(index) == term:",
        "if index > self.committed and self.term_or_zero(index) > 0:",
        ("figure8",), 40,
        frozenset({"leader-commits-current-term", "committed-entry-lost",
                   "leader-completeness", "state-machine-safety"}),
    ),
    Mutant(
        "vote not restored after a restart",
        "raft/_node.py",
        "        self._vote = hard_state.vote",
        "        self._vote = 0",
        ("crashes",), 20,
        frozenset({"vote-durable", "election-safety"}),
    ),
    Mutant(
        "vote change not fsynced",
        "raft/_node.py",
        _MUST_SYNC,
        "must_sync=bool(entries) or hard_state.term != prev.term,",
        ("churn", "figure8", "everything"), 40,
        frozenset({"vote-durable", "election-safety"}),
    ),
    Mutant(
        "append acknowledged before it is persisted (entries not fsynced)",
        "raft/_node.py",
        _MUST_SYNC,
        "must_sync=hard_state.term != prev.term or hard_state.vote != prev.vote,",
        ("calm",), 5,
        frozenset({"acknowledged-entries-durable"}),
    ),
    Mutant(
        "vote granted without the up-to-date log check",
        "raft/_node.py",
        "if can_vote and self._log.is_up_to_date(m.index, m.log_term):",
        "if can_vote:",
        ("figure8",), 20,
        frozenset({"leader-completeness", "committed-entry-lost", "state-machine-safety"}),
    ),
    Mutant(
        "ready pass sends every message before persisting (not only a leader's)",
        "raft/_ready_pass.py",
        "if node.role is not Role.LEADER:",
        "if False:  # mutant: every group's messages go with the leaders'",
        ("calm",), 5,
        frozenset({"acknowledged-entries-durable", "vote-durable", "term-durable"}),
    ),
    Mutant(
        "a quiesced follower never wakes (only a new term ends its quiescence)",
        "raft/_node.py",
        "            return\n        self._quiesced = False\n",
        "            return\n        if self._role != Role.LEADER:\n            return  # mutant\n"
        "        self._quiesced = False\n",
        ("idle",), 30,
        frozenset({"liveness-election", "liveness-commit", "liveness-clients"}),
    ),
]

_RUNNER = """
import json, sys
from quorumlog.sim import MIXES, SimConfig, run_seed
import quorumlog
mixes, seeds = sys.argv[1].split(","), int(sys.argv[2])
found = {}
for mix in mixes:
    for seed in range(seeds):
        result = run_seed(seed, MIXES[mix], SimConfig())
        if not result.passed:
            found.setdefault(result.violation, f"{mix} seed {seed}: {result.detail[:200]}")
print(json.dumps({"package": quorumlog.__file__, "found": found}))
"""


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_planted_bug_is_caught(mutant: Mutant, tmp_path: Path) -> None:
    package = Path(quorumlog.__file__).parent
    copy = tmp_path / "src" / "quorumlog"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / mutant.path
    text = target.read_text()
    if text.count(mutant.old) != 1:
        pytest.fail(f"mutation target of {mutant.name!r} not found once in {mutant.path}; "
                    "the Raft code changed: update the mutant")
    target.write_text(text.replace(mutant.old, mutant.new))
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "src")}
    out = subprocess.run(
        [sys.executable, "-c", _RUNNER, ",".join(mutant.mixes), str(mutant.seeds)],
        capture_output=True, text=True, env=env, timeout=600, check=True,
    )
    report = json.loads(out.stdout)
    assert report["package"].startswith(str(tmp_path)), "the mutant copy was not imported"
    found = report["found"]
    assert set(found) & mutant.expected, f"{mutant.name} not caught; saw {found}"
