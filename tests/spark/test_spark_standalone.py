"""The data source on a Spark standalone cluster, not only ``local[n]``.

A master and a worker process, started with pyspark's own ``bin/spark-class``
on 127.0.0.1, run the executors in processes of their own: the batch read,
the batch write and a streaming query all run their tasks there, so the
source's pickling, its per-executor clients and its commit protocol are what
a real cluster sees. A session built the way a user builds one (no pushdown
setting) is used. Slow (three JVMs): ``make test-slow`` or
``pytest -m slow tests/spark/test_spark_standalone.py``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from quorumlog import node as cluster
from quorumlog import rpc
from quorumlog.stream import RolloverPolicy, StreamClient, StreamConfig

pytestmark = pytest.mark.slow

START_DEADLINE_S = 90.0
MESSAGES = 3_000


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _wait_port(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_DEADLINE_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"spark process exited: {log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"port {port} not open within {START_DEADLINE_S} s")


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A master and one worker (2 cores) on 127.0.0.1; yields the master URL."""
    import pyspark

    spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
    work = tmp_path_factory.mktemp("standalone")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
           "SPARK_HOME": str(spark_class.parent.parent)}
    master_port, worker_port = _free_port(), _free_port()
    processes: list[subprocess.Popen[bytes]] = []
    try:
        master_log = work / "master.log"
        processes.append(subprocess.Popen(
            [str(spark_class), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(master_port), "--webui-port", str(_free_port())],
            env=env, stdout=master_log.open("wb"), stderr=subprocess.STDOUT))
        _wait_port(master_port, processes[0], master_log)
        url = f"spark://127.0.0.1:{master_port}"
        worker_log = work / "worker.log"
        processes.append(subprocess.Popen(
            [str(spark_class), "org.apache.spark.deploy.worker.Worker", url,
             "--host", "127.0.0.1", "--port", str(worker_port), "--cores", "2",
             "--memory", "1g", "--webui-port", str(_free_port()),
             "--work-dir", str(work / "worker")],
            env=env, stdout=worker_log.open("wb"), stderr=subprocess.STDOUT))
        _wait_port(worker_port, processes[1], worker_log)
        yield url
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()


@pytest.fixture(scope="module")
def spark(standalone: str) -> Iterator[Any]:
    """A session as a user builds one: Spark's defaults plus the master URL."""
    from pyspark.sql import SparkSession

    from quorumlog.spark import register

    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (SparkSession.builder.master(standalone).appName("quorumlog-standalone")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.executor.memory", "512m")
               .config("spark.executor.cores", "2")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    deadline = time.monotonic() + START_DEADLINE_S
    # The driver counts as one block manager: wait for the worker's executor.
    while session._jsc.sc().getExecutorMemoryStatus().size() < 2:
        assert time.monotonic() < deadline, "no executor registered with the master"
        time.sleep(0.5)
    register(session)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="module")
def meta(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    with cluster.running(tmp_path_factory.mktemp("sa") / "cluster", 3) as addresses:
        yield addresses


def _run(meta: list[str], body: Any) -> Any:
    async def main() -> Any:
        async with await StreamClient.connect(meta) as client:
            return await body(client)

    return rpc.run(main())


async def _values(client: StreamClient, stream: str) -> list[bytes]:
    out = []
    async with await client.reader(stream, "earliest") as reader:
        while (message := await reader.read_next(1000)) is not None:
            out.append(message.value)
    return out


def test_read_write_and_stream_on_a_standalone_cluster(spark: Any, meta: list[str],
                                                        tmp_path: Path) -> None:
    config = StreamConfig(partitions=2, rollover=RolloverPolicy(max_entries=500, min_time_ms=0))

    async def fill(client: StreamClient) -> None:
        for name in ("sa-in", "sa-out", "sa-streamed"):
            await client.create_stream(name, config)
        producer = await client.producer("sa-in")
        sends = [await producer.send_async(b"m%d" % i, key=b"k%d" % (i % 7))
                 for i in range(MESSAGES)]
        for send in sends:
            await send
        await producer.close()

    _run(meta, fill)
    members = ",".join(meta)
    frame = (spark.read.format("quorumlog").option("meta", members).option("stream", "sa-in")
             .option("maxRowsPerPartition", "1000").load())
    assert frame.rdd.getNumPartitions() >= 2
    rows = frame.select("value").collect()
    assert sorted(bytes(r["value"]) for r in rows) == sorted(b"m%d" % i for i in range(MESSAGES))

    # Batch write from executor tasks: every row once.
    (frame.select("key", "value").repartition(2).write.format("quorumlog")
     .option("meta", members).option("stream", "sa-out").mode("append").save())
    written = _run(meta, lambda c: _values(c, "sa-out"))
    assert sorted(written) == sorted(b"m%d" % i for i in range(MESSAGES))

    # A streaming query: stream to stream, every entry exactly once.
    query = (spark.readStream.format("quorumlog").option("meta", members)
             .option("stream", "sa-in").option("startingPositions", "earliest")
             .option("maxEntriesPerTrigger", "1000").load()
             .select("key", "value").writeStream.format("quorumlog")
             .option("meta", members).option("stream", "sa-streamed")
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
    query.awaitTermination(240)
    assert query.exception() is None
    streamed = _run(meta, lambda c: _values(c, "sa-streamed"))
    assert sorted(streamed) == sorted(b"m%d" % i for i in range(MESSAGES))
