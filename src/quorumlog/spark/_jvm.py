"""The JVM reader: a batch read of a stream whose rows the executor's JVM
builds from the bookies' answers, with no Python worker on the way.

Spark takes rows from a Python data source through its Arrow hand-off, which
costs the JVM about 0.65 µs a row whatever the source does (docs/spark.md,
"The JVM reader"). ``io.quorumlog.spark.StreamSource`` (``jvm/``, built by
``scripts/setup.sh`` into ``jvm/build/quorumlog-spark.jar``) is a Spark
DataSource V2 in Java that reads planned entry ranges straight from the
bookies (batch reads, envelope digests checked, entries decoded into column
vectors). Planning stays here: :func:`jvm_plan` runs the Python source's own
planner (positions, times, LAC of open ledgers) and hands the JVM the ranges
with each ledger's fragments, write quorum and digest as a JSON option.
Ledgers whose ensemble is wider than their write quorum (striped) are read
entry by entry from each entry's write set, as the Python reader does.

A read the JVM reader does not cover goes to the Python source
(``read_stream`` logs why): offloaded ledgers (Parquet copies) and compacted
views.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from quorumlog import rpc
from quorumlog.errors import UsageError
from quorumlog.ledger import LedgerClientConfig, LedgerMetadata
from quorumlog.log import get_logger
from quorumlog.proto import DigestType, mac_key
from quorumlog.spark import _io
from quorumlog.spark._options import parse
from quorumlog.spark._plan import ReadTask
from quorumlog.spark._source import QuorumlogInputPartition, QuorumlogReader

JVM_FORMAT = "quorumlog.jvm"
JVM_CLASS = "io.quorumlog.spark.StreamSource"
JAR_ENV = "QUORUMLOG_SPARK_JAR"  # the jar's path, when not the repository's build
PLAN_VERSION = 1
JVM_READ_TIMEOUT_MS = 30_000  # connect and one batch read, per bookie

log = get_logger("quorumlog.spark")


def jar_path() -> Path | None:
    """The JVM reader's jar: ``$QUORUMLOG_SPARK_JAR``, else the checkout's
    ``jvm/build/quorumlog-spark.jar``; None when there is none."""
    raw = os.environ.get(JAR_ENV)
    if raw:
        path = Path(raw)
        if not path.is_file():
            raise UsageError(f"{JAR_ENV}={raw}: no such file (build it with jvm/build.sh)")
        return path
    built = Path(__file__).resolve().parents[3] / "jvm" / "build" / "quorumlog-spark.jar"
    return built if built.is_file() else None


def jvm_available(spark: Any) -> bool:
    """Whether the session's JVM has the reader (its jar on ``spark.jars``;
    never in a Spark Connect session, which has no JVM here)."""
    try:
        jvm = spark.sparkContext._jvm
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName(JVM_CLASS, False, loader)
    except Exception:  # no JVM gateway, or the class is not on its classpath
        return False
    return True


def jvm_plan(options: Mapping[str, str]) -> tuple[str | None, str]:
    """The JVM reader's plan (JSON) for a batch read with these options, and
    an empty reason; or None and why the JVM reader cannot do this read."""
    parsed = parse(options)
    if parsed.read_compacted:
        return None, "readCompacted reads the compacted view through the stream package"
    record = _io.stream_record(parsed.meta, parsed.stream)
    planned = QuorumlogReader(parsed, record).partitions()
    client = _io.ledger_client(parsed.meta)
    ledgers: dict[int, LedgerMetadata] = {}
    partitions = []
    for partition in planned:
        assert isinstance(partition, QuorumlogInputPartition)
        ranges = []
        for task in partition.tasks:
            if task.view is not None or task.offload is not None:
                return None, f"ledger {task.ledger_id} is read from its Parquet copy"
            metadata = ledgers.get(task.ledger_id)
            if metadata is None:
                handle = _io.run(client.open_ledger(task.ledger_id, password=record.password,
                                                    recovery=False))
                metadata = ledgers[task.ledger_id] = handle.metadata
            ranges.append(_range(task, metadata, record.password))
        partitions.append({"ranges": ranges})
    config = LedgerClientConfig()
    return json.dumps({
        "version": PLAN_VERSION,
        "token": None,  # the Python source's clients connect without one too
        "max_frame_bytes": rpc.RpcConfig().max_frame_bytes,
        "timeout_ms": JVM_READ_TIMEOUT_MS,
        "batch_read_entries_max": _io.SPARK_BATCH_READ_ENTRIES_MAX,
        "batch_read_bytes_max": config.batch_read_bytes_max,
        "batch_rows": parsed.arrow_batch_rows,
        "partitions": partitions,
    }), ""


def _range(task: ReadTask, metadata: LedgerMetadata, password: bytes) -> dict[str, Any]:
    hmac = metadata.digest is DigestType.HMAC_SHA256
    return {
        "stream": task.stream, "partition": task.partition, "ledger_id": task.ledger_id,
        "first_entry": task.first_entry, "last_entry": task.last_entry,
        "first_batch": task.first_batch, "end_batch": task.end_batch,
        "publish_min_ms": task.publish_min_ms, "publish_max_ms": task.publish_max_ms,
        "digest": metadata.digest.value,
        "mac_key_hex": mac_key(password).hex() if hmac else "",
        "write_quorum": metadata.write_quorum,
        "fragments": [{"first_entry": fragment.first_entry_id,
                       "bookies": list(fragment.bookies)}
                      for fragment in metadata.ensembles],
    }


def read_stream(spark: Any, *, jvm: bool | None = None, **options: str) -> Any:
    """A batch read of a stream as a DataFrame, the rows of
    ``spark.read.format("quorumlog")`` with the same ``options``, read by the
    JVM reader when the session has it and the read is one it covers.

    ``jvm=None`` (default) picks the JVM reader when it can and says why not
    in the log; ``True`` requires it (UsageError naming why it cannot);
    ``False`` always reads through the Python source. Filters on partition,
    ledger_id, entry_id and publish_time narrow the JVM reader's ranges as
    they narrow the Python source's tasks. The JVM reader reads striped
    ledgers too (entry by entry, from each entry's write set); offloaded
    ledgers and ``readCompacted`` go to the Python source."""
    if jvm is not False:
        plan, why = (jvm_plan(options) if jvm_available(spark)
                     else (None, f"the session has no {JVM_CLASS} (spark.jars: "
                                 f"{jar_path() or 'jvm/build.sh was not run'})"))
        if plan is not None:
            return spark.read.format(JVM_FORMAT).option("plan", plan).load()
        if jvm:
            raise UsageError(f"the JVM reader cannot read this: {why}")
        log.info("spark_jvm_reader_not_used", stream=options.get("stream"), reason=why)
    reader = spark.read.format("quorumlog")
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()
