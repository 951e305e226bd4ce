"""The ``quorumlog.table`` PySpark data source against a real local cluster and
real Spark in local mode: upsert write, full read (one Spark partition per
table partition), hash_key / sort_key pushdown, clear errors.

Behind ``slow``: the Spark session and the cluster take over a minute on two
cores. The pushdown and option rules run in the default test run
(test_table_spark_plan.py).
"""

from __future__ import annotations

import shutil
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (the spark extra)")
pytest.importorskip("pyarrow", reason="pyarrow is not installed (the spark extra)")
if shutil.which("java") is None:
    pytest.skip("no java on PATH: Spark needs Java 17+", allow_module_level=True)

from quorumlog import node as cluster
from quorumlog.table import BlockingTableClient

from .sessions import running_cluster, spark_session

pytestmark = pytest.mark.slow

PARTITIONS = 4
HASH_KEYS = 12
SORT_KEYS = 5


@pytest.fixture(scope="module")
def cluster_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from running_cluster(tmp_path_factory, "spark-table")


@pytest.fixture(scope="module")
def meta(cluster_dir: Path) -> list[str]:
    return cluster.meta_addresses(cluster_dir)


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    yield from spark_session("local[2,2]", "quorumlog-table-tests")


def _rows() -> list[tuple[bytes, bytes, bytes, int]]:
    return [(b"h%02d" % h, b"s%d" % s, b"v%d-%d" % (h, s), 3600 if h % 3 == 0 else 0)
            for h in range(HASH_KEYS) for s in range(SORT_KEYS)]


def _reader(spark: Any, meta: list[str], table: str, **options: str) -> Any:
    reader = (spark.read.format("quorumlog.table").option("meta", ",".join(meta))
              .option("table", table).option("pageRecords", "7"))
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


@pytest.mark.parametrize("copysets", [None, 2], ids=["group-per-partition", "copysets"])
def test_write_then_read_back_with_pushdown(spark: Any, meta: list[str],
                                            copysets: int | None) -> None:
    """Also with the partitions in fewer Raft groups (copysets): still one Spark
    partition per table partition, each reading its own records only."""
    table = "sparkt" if copysets is None else "sparkt-copysets"
    with BlockingTableClient(meta) as tables:
        tables.create_table(table, partitions=PARTITIONS, replicas=3, copysets=copysets)
    frame = spark.createDataFrame(_rows(), "hash_key binary, sort_key binary, value binary, "
                                           "ttl_s int")
    for _ in range(2):  # an upsert by key: writing the same rows again changes nothing
        (frame.repartition(3).write.format("quorumlog.table").option("meta", ",".join(meta))
         .option("table", table).mode("append").save())
    with BlockingTableClient(meta) as tables:
        assert tables.get(table, b"h03", b"s2") == b"v3-2"
        assert 3500 < tables.ttl(table, b"h03", b"s2") <= 3600
        assert tables.ttl(table, b"h04", b"s2") == -1

    df = _reader(spark, meta, table)
    assert df.rdd.getNumPartitions() == PARTITIONS
    rows = df.collect()
    assert sorted((r.hash_key, r.sort_key, r.value) for r in rows) == sorted(
        (h, s, v) for h, s, v, _ in _rows())
    assert all(r.timetag > 0 for r in rows)
    assert {r.hash_key for r in rows if r.expire_ts > 0} == {
        b"h%02d" % h for h in range(HASH_KEYS) if h % 3 == 0}

    one = df.filter((df.hash_key == b"h05") & (df.sort_key >= b"s1") & (df.sort_key < b"s4"))
    assert one.rdd.getNumPartitions() == 1  # one table partition, a hash_key scan
    assert sorted(r.sort_key for r in one.collect()) == [b"s1", b"s2", b"s3"]
    two = df.filter(df.hash_key.isin(b"h01", b"h07"))
    assert two.count() == 2 * SORT_KEYS


def test_bad_options_and_columns_are_clear_errors(spark: Any, meta: list[str]) -> None:
    with pytest.raises(Exception, match="option table is required"):
        spark.read.format("quorumlog.table").option("meta", ",".join(meta)).load().collect()
    with pytest.raises(Exception, match="no table"):
        _reader(spark, meta, "no_such_table").collect()
    frame = spark.createDataFrame([(b"h", b"s", b"v", 1)],
                                  "hash_key binary, sort_key binary, value binary, extra int")
    with pytest.raises(Exception, match="cannot write columns"):
        (frame.write.format("quorumlog.table").option("meta", ",".join(meta))
         .option("table", "sparkt").mode("append").save())
    with pytest.raises(Exception, match="overwrite is not supported"):
        (frame.drop("extra").write.format("quorumlog.table").option("meta", ",".join(meta))
         .option("table", "sparkt").mode("overwrite").save())


def _scans(cluster_dir: Path) -> dict[int, float]:
    """Each node's count of scan requests it answered (its /metrics)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for node in cluster.load(cluster_dir):
        with urllib.request.urlopen(f"http://{node.metrics}/metrics", timeout=5) as reply:
            text = reply.read().decode()
        out[node.id] = sum(
            sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "quorumlog_table_requests_total"
            and sample.labels.get("op") == "scan" and sample.labels.get("result") == "ok")
    return out


def test_stale_ok_reads_each_partition_from_a_follower(spark: Any, meta: list[str],
                                                       cluster_dir: Path) -> None:
    """``staleOk``: the driver picks a follower of each partition (from the
    scheduler's view); the partition's leader serves none of the read's scans."""
    rows = [(b"h%d" % h, b"s", b"v%d" % h) for h in range(20)]
    with BlockingTableClient(meta) as tables:
        tables.create_table("sparkstale", partitions=1, replicas=3)
        for h, s, v in rows:
            tables.set("sparkstale", h, s, v)
        layout = tables.table_info("sparkstale")
        deadline = time.monotonic() + 15
        while tables.stale_read_nodes("sparkstale") == (0,):  # the view learns the leader
            assert time.monotonic() < deadline, "the scheduler view named no follower"
            time.sleep(0.2)
        (follower,) = tables.stale_read_nodes("sparkstale")
    assert follower in layout.partitions[0].members
    before = _scans(cluster_dir)
    df = _reader(spark, meta, "sparkstale", staleOk="true")
    read = sorted((r.hash_key, r.sort_key, r.value) for r in df.collect())
    assert read == sorted(rows)
    served = {n: c - before[n] for n, c in _scans(cluster_dir).items() if c != before[n]}
    assert set(served) == {follower}, served


LARGE_ROWS = 60
LARGE_VALUE_BYTES = 500_000  # 30 MB under one hash key


def test_large_values_under_one_hash_key_are_written_and_read_back(
        spark: Any, meta: list[str]) -> None:
    """60 values of 500 KB under one hash key. Before: the writer put up to 500
    items in one multi_set (30 MB: "a proposal of ... bytes exceeds
    max_entry_data_bytes", the job failed), and a read's scan page of 1,000
    records did not fit an rpc frame. Now calls and pages end at 4 MiB."""
    with BlockingTableClient(meta) as tables:
        tables.create_table("sparkbig", partitions=2, replicas=3)
    rows = [(b"one", b"s%02d" % i, bytes([i]) * LARGE_VALUE_BYTES) for i in range(LARGE_ROWS)]
    frame = spark.createDataFrame(rows, "hash_key binary, sort_key binary, value binary")
    (frame.coalesce(1).write.format("quorumlog.table").option("meta", ",".join(meta))
     .option("table", "sparkbig").mode("append").save())
    read = (spark.read.format("quorumlog.table").option("meta", ",".join(meta))
            .option("table", "sparkbig").load())
    got = sorted((r.sort_key, len(r.value), r.value[:1]) for r in read.collect())
    assert got == [(b"s%02d" % i, LARGE_VALUE_BYTES, bytes([i])) for i in range(LARGE_ROWS)]
