"""The Python examples of the docs run, against a real local cluster, so they
cannot rot (issue 18: the stream example hung on a subscription that starts at
"latest").

An example is a ```python block preceded by ``<!-- example: async -->`` (its
body runs inside ``async def main()``) or ``<!-- example: blocking -->``. Both
get ``meta_addresses``. Each runs in its own interpreter, as a user's script
would.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorumlog import node as cluster

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = re.compile(r"<!-- example: (async|blocking) -->\n```python\n(.*?)```", re.S)
EXAMPLE_TIMEOUT_S = 120
EXAMPLES_EXPECTED_MIN = 3
# An example that starts Spark (``local_session``) takes about a minute on two
# cores: it runs behind ``slow``, with more time, and the JVM's own start-up
# lines on stderr are allowed (no Python traceback is).
SPARK_EXAMPLE_TIMEOUT_S = 600


def examples() -> list[tuple[str, str, str]]:
    found = []
    for path in sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")]):
        for number, match in enumerate(EXAMPLE.finditer(path.read_text())):
            found.append((f"{path.name}#{number}", match.group(1), match.group(2)))
    return found


EXAMPLES = examples()


def test_the_docs_have_examples() -> None:
    assert len(EXAMPLES) >= EXAMPLES_EXPECTED_MIN


@pytest.fixture(scope="module")
def meta(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    with cluster.running(tmp_path_factory.mktemp("docs") / "cluster", 3) as addresses:
        yield addresses


def script(kind: str, code: str, meta_addresses: list[str]) -> str:
    prelude = f"meta_addresses = {meta_addresses!r}\n"
    if kind == "blocking":
        return prelude + code
    return (prelude + "from quorumlog import rpc\n\n\nasync def main() -> None:\n"
            + textwrap.indent(code, "    ") + "\n\nrpc.run(main())\n")


def _uses_spark(code: str) -> bool:
    return "local_session" in code


@pytest.mark.parametrize(("name", "kind", "code"), [
    pytest.param(*e, marks=[pytest.mark.slow] if _uses_spark(e[2]) else [], id=e[0])
    for e in EXAMPLES])
def test_doc_example_runs(meta: list[str], name: str, kind: str, code: str) -> None:
    spark = _uses_spark(code)
    result = subprocess.run([sys.executable, "-c", script(kind, code, meta)],
                            capture_output=True, text=True,
                            timeout=SPARK_EXAMPLE_TIMEOUT_S if spark else EXAMPLE_TIMEOUT_S,
                            check=False)
    assert result.returncode == 0, f"{name} failed:\n{result.stderr[-3000:]}"
    if spark:
        assert result.stdout == "" and "Traceback" not in result.stderr, result.stderr[-2000:]
        return
    # A library prints nothing unless the application configures logging.
    assert result.stdout == "" and result.stderr == "", (result.stdout[-2000:],
                                                        result.stderr[-2000:])
