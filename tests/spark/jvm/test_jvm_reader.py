"""The JVM reader (``read_stream``, ``jvm/``) against a real local cluster.

Its rows are compared with the Python source's for the same options: every
column, across ledgers, producer batches, keys and properties, positions
inside batches and publish times. Then what it must refuse: a digest that
does not match (a wrong HMAC key in the plan, a digest type the ledger does
not have), a range past what the bookies hold, a malformed plan; and a read
while a bookie of the ensemble is down goes to the other replica. Striped
ledgers (ensemble 3, write quorum 2) are read entry by entry, with a bookie
down too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
import threading
from pathlib import Path
from typing import Any

import pytest

from .support import rows, run, skip_without_the_reader

skip_without_the_reader()

from quorumlog import node as cluster  # noqa: E402
from quorumlog.errors import UsageError  # noqa: E402
from quorumlog.proto import DigestType, ReadBatchResponse  # noqa: E402
from quorumlog.spark._jvm import jvm_available, jvm_plan, read_stream  # noqa: E402
from quorumlog.stream import (  # noqa: E402
    ProducerConfig,
    RolloverPolicy,
    StreamClient,
    StreamConfig,
)

HEADER = struct.Struct("<IBBHQI")  # the rpc frame's header (rpc/_frame.py)
READ_BATCH_RESPONSE = ReadBatchResponse.type_id


def both(spark: Any, meta: list[str], **options: str) -> tuple[list[Any], list[Any]]:
    options = {"meta": ",".join(meta), **options}
    jvm = read_stream(spark, jvm=True, **options)
    python = read_stream(spark, jvm=False, **options)
    return rows(jvm), rows(python)

def fill(meta: list[str], stream: str, *, digest: DigestType = DigestType.CRC32C,
         config: StreamConfig | None = None) -> list[Any]:
    async def body(client: StreamClient) -> list[Any]:
        await client.create_stream(stream, config or StreamConfig(
            partitions=2, digest=digest, rollover=RolloverPolicy(max_entries=7, min_time_ms=0)))
        single = await client.producer(stream)
        for i in range(60):
            await single.send(b"v%d" % i + b"x" * (i * 37 % 300),
                              key=None if i % 4 == 0 else b"k%d" % (i % 9),
                              properties={"n": str(i), "even": str(i % 2 == 0)} if i % 3 == 0
                              else None)
        await single.close()
        batched = await client.producer(stream, config=ProducerConfig(batching=True))
        await asyncio.gather(*[await batched.send_async(b"b%d" % i, key=b"k%d" % (i % 5))
                               for i in range(400)])
        await batched.close()
        out = []
        async with await client.reader(stream, "earliest") as reader:
            while (message := await reader.read_next(1000)) is not None:
                out.append(message)
        return out

    produced: list[Any] = run(meta, body)
    return produced


@pytest.fixture(scope="module")
def events(meta: list[str]) -> list[Any]:
    """The stream ``jvm-events`` and its messages."""
    produced = fill(meta, "jvm-events")
    assert len(produced) == 460
    return produced


def reads_like_the_python_source(spark: Any, meta: list[str], stream: str,
                                 produced: list[Any]) -> list[Any]:
    """The JVM reader's rows of ``stream`` equal the Python source's: all of
    them, with small tasks and batches, and between positions inside producer
    batches. Returns the JVM reader's rows."""
    jvm, python = both(spark, meta, stream=stream)
    assert len(jvm) == len(produced) and jvm == python
    assert max(row[4] for row in jvm) > 0  # batched entries: batch indexes
    small, _ = both(spark, meta, stream=stream, maxRowsPerPartition="3", arrowBatchRows="5")
    assert small == python
    batched = sorted((m for m in produced if m.partition == 0 and m.position.batch_index > 0),
                     key=lambda m: m.seq_position)
    start, end = batched[3].position, batched[-5].position
    inside, inside_python = both(
        spark, meta, stream=stream,
        startingPositions=json.dumps({"0": start.to_json(), "1": "latest"}),
        endingPositions=json.dumps({"0": end.to_json()}))
    assert inside == inside_python and len(inside) == len(batched) - 8
    return jvm


def test_the_jvm_reader_reads_the_rows_the_python_source_reads(
        spark: Any, meta: list[str], events: list[Any]) -> None:
    assert jvm_available(spark)
    produced = events
    jvm = reads_like_the_python_source(spark, meta, "jvm-events", produced)
    assert len({row[2] for row in jvm}) >= 8  # many ledgers
    assert any(row[6] is None for row in jvm) and any(row[8] for row in jvm)
    cut = sorted(m.publish_time_ms for m in produced)[200]
    jvm, python = both(spark, meta, stream="jvm-events", startingTime=str(cut),
                       endingTime=str(cut + 5))
    assert jvm == python


def test_the_jvm_reader_checks_every_digest(spark: Any, meta: list[str],
                                            events: list[Any]) -> None:
    fill(meta, "jvm-mac", digest=DigestType.HMAC_SHA256)
    options = {"meta": ",".join(meta), "stream": "jvm-mac"}
    jvm, python = both(spark, meta, stream="jvm-mac")
    assert jvm == python and len(jvm) == 460
    plan, _ = jvm_plan(options)
    assert plan is not None
    wrong_key = json.loads(plan)
    for partition in wrong_key["partitions"]:
        for part in partition["ranges"]:
            part["mac_key_hex"] = "00" * 32
    with pytest.raises(Exception, match="digest"):
        spark.read.format("quorumlog.jvm").option("plan", json.dumps(wrong_key)).load().count()

    plan, _ = jvm_plan({**options, "stream": "jvm-events"})
    assert plan is not None
    wrong_type = json.loads(plan)
    wrong_type["partitions"][0]["ranges"][0]["digest"] = "hmac-sha256"
    wrong_type["partitions"][0]["ranges"][0]["mac_key_hex"] = "00" * 32
    with pytest.raises(Exception, match="digest"):
        spark.read.format("quorumlog.jvm").option("plan", json.dumps(wrong_type)).load().count()


def test_the_jvm_reader_refuses_what_it_cannot_read(spark: Any, meta: list[str],
                                                    events: list[Any]) -> None:
    plan, _ = jvm_plan({"meta": ",".join(meta), "stream": "jvm-events"})
    assert plan is not None
    past = json.loads(plan)
    last = past["partitions"][-1]["ranges"][-1]
    last["last_entry"] += 50  # past what the ledger holds
    with pytest.raises(Exception, match=f"ledger {last['ledger_id']}"):
        spark.read.format("quorumlog.jvm").option("plan", json.dumps(past)).load().count()
    for bad in ("not json", json.dumps({"version": 99, "partitions": []}),
                json.dumps({"version": 1})):
        with pytest.raises(Exception, match="plan"):
            spark.read.format("quorumlog.jvm").option("plan", bad).load().count()
    # A read the JVM reader does not cover goes to the Python source, or is
    # refused with the reason when the caller asked for the JVM reader.
    options: dict[str, Any] = {"meta": ",".join(meta), "stream": "jvm-events",
                               "readCompacted": "true"}
    with pytest.raises(UsageError, match="readCompacted"):
        read_stream(spark, jvm=True, **options)
    assert read_stream(spark, **options).count() == 460


def test_the_jvm_reader_reads_from_the_other_replica_while_a_bookie_is_down(
        spark: Any, meta: list[str], cluster_dir: Path, events: list[Any]) -> None:
    options = {"meta": ",".join(meta), "stream": "jvm-events"}
    _, python = both(spark, meta, stream="jvm-events")
    plan, _ = jvm_plan(options)  # planned with every node up: ranges name all bookies
    assert plan is not None
    ensembles = {tuple(f["bookies"]) for p in json.loads(plan)["partitions"]
                 for r in p["ranges"] for f in r["fragments"]}
    victim = 3
    address = next(info.address for info in cluster.load(cluster_dir) if info.id == victim)
    assert any(address in bookies for bookies in ensembles)
    reads_with_a_node_stopped(spark, cluster_dir, plan, python, victim)


def reads_with_a_node_stopped(spark: Any, cluster_dir: Path, plan: str,
                              expected: list[Any], victim: int) -> None:
    """The JVM reader reads ``plan`` as ``expected`` with node ``victim`` stopped
    (restarted afterwards, for the module's next tests)."""
    cluster.stop_node(cluster_dir, victim)
    try:
        frame = spark.read.format("quorumlog.jvm").option("plan", plan).load()
        assert rows(frame) == expected
    finally:
        with contextlib.suppress(Exception):
            cluster.restart_node(cluster_dir, victim, serving_timeout_s=60)


def test_the_jvm_reader_reads_striped_ledgers_entry_by_entry(
        spark: Any, meta: list[str], cluster_dir: Path) -> None:
    produced = fill(meta, "jvm-striped", config=StreamConfig(
        partitions=2, ensemble_size=3, write_quorum=2, ack_quorum=2,
        rollover=RolloverPolicy(max_entries=7, min_time_ms=0)))
    assert len(produced) == 460
    options = {"meta": ",".join(meta), "stream": "jvm-striped"}
    plan, why = jvm_plan(options)
    assert plan is not None, why
    ranges = [r for p in json.loads(plan)["partitions"] for r in p["ranges"]]
    assert len({r["ledger_id"] for r in ranges}) >= 8
    assert all(r["write_quorum"] == 2 for r in ranges)
    assert all(len(f["bookies"]) == 3 for r in ranges for f in r["fragments"])
    python = rows(read_stream(spark, jvm=False, **options))
    reads_like_the_python_source(spark, meta, "jvm-striped", produced)

    # A write quorum wider than the ensemble is a malformed plan.
    too_wide = json.loads(plan)
    too_wide["partitions"][0]["ranges"][0]["write_quorum"] = 4
    with pytest.raises(Exception, match="write_quorum"):
        spark.read.format("quorumlog.jvm").option("plan", json.dumps(too_wide)).load().count()

    # Every entry is on 2 of the 3 bookies: with one down, each is read from
    # the other member of its write set.
    victim = 3
    address = next(info.address for info in cluster.load(cluster_dir) if info.id == victim)
    assert all(address in f["bookies"] for r in ranges for f in r["fragments"])
    reads_with_a_node_stopped(spark, cluster_dir, plan, python, victim)


class _FlippingProxy:
    """A TCP relay in front of a real bookie that flips the last byte of every
    batch-read answer's payload (a bad disk or link the bookie cannot see):
    the entry's digest no longer matches. Frames: rpc/_frame.py."""

    def __init__(self, bookie: str) -> None:
        self.bookie = bookie
        self.flipped = 0
        self.address = ""
        self._ready = threading.Event()
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),), daemon=True)
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __enter__(self) -> _FlippingProxy:
        self._thread.start()
        assert self._ready.wait(10), "the proxy did not start"
        return self

    def __exit__(self, *_: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        self._ready.set()
        async with server:
            await self._stop.wait()

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter
                     ) -> None:
        host, port = self.bookie.rsplit(":", 1)
        bookie_r, bookie_w = await asyncio.open_connection(host, int(port))

        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       flip: bool) -> None:
            with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
                while True:
                    header = await reader.readexactly(HEADER.size)
                    length, _, _, type_id, _, body = HEADER.unpack(header)
                    rest = bytearray(await reader.readexactly(length + 4 - HEADER.size))
                    if flip and type_id == READ_BATCH_RESPONSE and len(rest) > body:
                        rest[-1] ^= 0x01
                        self.flipped += 1
                    writer.write(header + rest)
                    await writer.drain()
            writer.close()

        await asyncio.gather(pipe(client_r, bookie_w, False), pipe(bookie_r, client_w, True))


def test_the_jvm_reader_detects_a_corrupt_answer_and_reads_the_other_replica(
        spark: Any, meta: list[str], events: list[Any]) -> None:
    plan, _ = jvm_plan({"meta": ",".join(meta), "stream": "jvm-events"})
    assert plan is not None
    _, python = both(spark, meta, stream="jvm-events")
    first = json.loads(plan)["partitions"][0]["ranges"][0]["fragments"][0]["bookies"][0]
    with _FlippingProxy(first) as proxy:
        def through_proxy(only: bool) -> str:
            changed = json.loads(plan)
            for partition in changed["partitions"]:
                for part in partition["ranges"]:
                    for fragment in part["fragments"]:
                        if first in fragment["bookies"]:
                            others = [b for b in fragment["bookies"] if b != first]
                            fragment["bookies"] = [proxy.address] + ([] if only else others)
                    # No more than the narrowest fragment's bookies (1 with only the relay).
                    part["write_quorum"] = min(len(f["bookies"]) for f in part["fragments"])
            return json.dumps(changed)

        frame = spark.read.format("quorumlog.jvm").option("plan", through_proxy(False)).load()
        assert rows(frame) == python
        assert proxy.flipped > 0
        with pytest.raises(Exception, match="CRC32C digest mismatch"):
            spark.read.format("quorumlog.jvm").option("plan", through_proxy(True)).load().count()
