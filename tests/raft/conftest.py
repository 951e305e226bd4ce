"""Golden transcripts: compare with tests/raft/golden/*.txt, or rewrite them.

``pytest tests/raft --rewrite-golden`` regenerates every transcript; review
the change with ``git diff tests/raft/golden``. (The option exists when pytest
starts in or below tests/raft; from the repository root without a path, set
QUORUMLOG_REWRITE_GOLDEN=1 instead.)
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

GOLDEN_DIR = Path(__file__).parent / "golden"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--rewrite-golden",
        action="store_true",
        default=False,
        help="rewrite tests/raft/golden/*.txt from the current transcripts",
    )


class Golden:
    def __init__(self, rewrite: bool) -> None:
        self.rewrite = rewrite

    def check(self, name: str, text: str) -> None:
        path = GOLDEN_DIR / f"{name}.txt"
        if self.rewrite:
            GOLDEN_DIR.mkdir(exist_ok=True)
            path.write_text(text)
            return
        if not path.exists():
            pytest.fail(f"{path} is missing; run pytest tests/raft --rewrite-golden")
        expected = path.read_text()
        if text != expected:
            diff = "".join(
                difflib.unified_diff(
                    expected.splitlines(keepends=True),
                    text.splitlines(keepends=True),
                    fromfile=f"golden/{name}.txt",
                    tofile="actual",
                )
            )
            pytest.fail(f"transcript {name} differs (rewrite with --rewrite-golden):\n{diff}")


@pytest.fixture
def golden(request: pytest.FixtureRequest) -> Golden:
    # The option only exists when this conftest is loaded at start-up (pytest
    # tests/raft ...); a plain ``pytest`` run compares unless the env var is set.
    rewrite = bool(request.config.getoption("--rewrite-golden", default=False))
    return Golden(rewrite or os.environ.get("QUORUMLOG_REWRITE_GOLDEN") == "1")
