"""The PySpark 4 data source ``quorumlog`` (Python Data Source API). See docs/spark.md.

    from quorumlog.spark import register
    register(spark)                       # spark.dataSource.register(QuorumlogDataSource)
    df = (spark.read.format("quorumlog").option("meta", "127.0.0.1:7101,...")
          .option("stream", "events").load())

Batch and streaming reads (Arrow record batches straight from the bookies,
never past the LAC), all-or-nothing batch writes and per-micro-batch atomic
streaming writes. Needs the ``spark`` extra (``pip install quorumlog[spark]``)
and Java 17+; on a cluster the package must be installed where the Python
workers run.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ARROW_SCHEMA", "PUSHDOWN_SETTING", "SCHEMA_DDL", "AuditResult", "OffloadResult",
           "QuorumlogDataSource", "audit", "jar_path", "local_session", "offload",
           "read_stream", "register"]


def __getattr__(name: str) -> Any:
    # pyspark and pyarrow are imported on first use, so the pure planning and
    # option modules of this package work without the spark extra.
    if name == "QuorumlogDataSource":
        from quorumlog.spark._source import QuorumlogDataSource

        return QuorumlogDataSource
    if name in ("audit", "AuditResult"):
        from quorumlog.spark import _audit

        return getattr(_audit, name)
    if name in ("read_stream", "jar_path"):
        from quorumlog.spark import _jvm

        return getattr(_jvm, name)
    if name in ("offload", "OffloadResult"):
        from quorumlog.spark import _offload

        return getattr(_offload, name)
    if name in ("ARROW_SCHEMA", "SCHEMA_DDL"):
        from quorumlog.spark import _arrow

        return getattr(_arrow, name)
    raise AttributeError(f"module 'quorumlog.spark' has no attribute {name!r}")


PUSHDOWN_SETTING = "spark.sql.python.filterPushdown.enabled"


def register(spark: Any) -> None:
    """Make ``format("quorumlog")`` and ``format("quorumlog.table")`` available in
    this Spark session.

    Works with Spark's default settings: when the session has Python filter
    pushdown on (``spark.sql.python.filterPushdown.enabled=true``, as
    :func:`local_session` sets), batch reads skip ledgers, entries and table
    partitions by the query's filters; when it is off, they scan (Spark
    filters every row either way). Call ``register`` again after changing the
    setting.
    """
    from quorumlog.spark._source import QuorumlogDataSource, QuorumlogScanDataSource
    from quorumlog.spark._table_source import (
        QuorumlogTableDataSource,
        QuorumlogTableScanDataSource,
    )

    pushdown = str(spark.conf.get(PUSHDOWN_SETTING, "false")).strip().lower() == "true"
    spark.dataSource.register(QuorumlogDataSource if pushdown else QuorumlogScanDataSource)
    spark.dataSource.register(QuorumlogTableDataSource if pushdown
                              else QuorumlogTableScanDataSource)


def local_session(master: str = "local[2]", app_name: str = "quorumlog", **conf: str) -> Any:
    """A local SparkSession on 127.0.0.1 whose Python workers use this
    interpreter, with the data source registered and filter pushdown on.
    ``conf`` adds Spark settings (dots as in Spark: pass a dict with ``**``)."""
    import os
    import sys

    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # a local session stays on loopback
    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "4")
               .config(PUSHDOWN_SETTING, "true")
               .config("spark.sql.session.timeZone", "UTC"))
    jar = _jvm_jar()
    if jar is not None:  # the JVM reader (read_stream), beside the caller's jars
        jars = conf.get("spark.jars")
        conf = {**conf, "spark.jars": f"{jars},{jar}" if jars else str(jar)}
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def _jvm_jar() -> Any:
    from quorumlog.spark._jvm import jar_path

    return jar_path()
