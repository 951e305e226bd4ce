"""What the JVM reader's test modules share: the skips, and rows of a frame
in a comparable form."""

from __future__ import annotations

import shutil
from typing import Any

import pytest

from quorumlog import rpc
from quorumlog.stream import StreamClient

COLUMNS = ("stream", "partition", "ledger_id", "entry_id", "batch_index", "publish_time",
           "key", "value", "properties")


def skip_without_the_reader() -> None:
    """Skip the calling module when Spark, Java or the reader's jar is missing."""
    pytest.importorskip("pyspark", reason="pyspark is not installed (the spark extra)")
    if shutil.which("java") is None:
        pytest.skip("no java on PATH: Spark needs Java 17+", allow_module_level=True)
    from quorumlog.spark import jar_path

    if jar_path() is None:
        pytest.skip("the JVM reader is not built (jvm/build.sh; scripts/setup.sh runs it "
                    "when javac is on PATH)", allow_module_level=True)


def run(meta: list[str], body: Any) -> Any:
    """``body(client)`` with a StreamClient of the cluster, to completion."""
    async def main() -> Any:
        async with await StreamClient.connect(meta) as client:
            return await body(client)

    return rpc.run(main())


def rows(frame: Any) -> list[tuple[Any, ...]]:
    """Every column of every row, bytes and maps made comparable, sorted."""
    def cell(value: Any) -> Any:
        if isinstance(value, bytearray):
            return bytes(value)
        if isinstance(value, dict):
            return tuple(sorted(value.items()))
        return value

    return sorted(tuple(cell(row[name]) for name in COLUMNS) for row in frame.collect())
