"""Tiered storage against real node processes: closed ledgers offloaded to
Parquet read back exactly as from the bookies (reader, seek, consumer), also
after the bookies' copy is deleted; retention and delete remove the files; a
damaged, swapped or missing file and a bad target are clear errors."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from quorumlog import node as cluster
from quorumlog import rpc
from quorumlog.errors import UsageError
from quorumlog.proto import GcRequest, NoSuchLedgerError, ledger_key
from quorumlog.stream import (
    ConsumerConfig,
    OffloadError,
    ProducerConfig,
    RetentionPolicy,
    RolloverPolicy,
    StreamClient,
    StreamConfig,
    StreamNotFoundError,
    offload_candidates,
    offload_ledger,
)


@pytest.fixture(scope="module")
def meta(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    # Trims are called by hand and checked: no background trimmer.
    with contextlib.ExitStack() as stack:
        with mock.patch.dict(os.environ, {"QUORUMLOG_TRIMMER__ENABLED": "false"}):
            addresses = stack.enter_context(
                cluster.running(tmp_path_factory.mktemp("offload") / "cluster", 3))
        yield addresses


def small(partitions: int = 2, entries: int = 4) -> StreamConfig:
    return StreamConfig(partitions=partitions, writer_lease_ttl_ms=1000,
                        rollover=RolloverPolicy(max_entries=entries, min_time_ms=0))


def key_of(message: Any) -> tuple[Any, ...]:
    p = message.position
    return (message.partition, p.ledger_id, p.entry_id, p.batch_index, message.key,
            message.value, tuple(sorted(message.properties.items())), message.publish_time_ms)


async def read_all(client: StreamClient, stream: str, start: Any = "earliest") -> list[Any]:
    out = []
    async with await client.reader(stream, start) as reader:
        while (message := await reader.read_next(1500)) is not None:
            out.append(key_of(message))
    return sorted(out, key=lambda row: row[:4])


async def fill(client: StreamClient, stream: str, count: int = 60) -> None:
    """Single messages and batches (several messages an entry) over many ledgers."""
    producer = await client.producer(stream, config=ProducerConfig(batching=False))
    for i in range(count):
        await producer.send(b"single-%d" % i, key=f"k{i % 7}", properties={"i": str(i)})
    await producer.close()
    batched = await client.producer(stream, config=ProducerConfig(batch_delay_ms=5))
    await asyncio.gather(*[await batched.send_async(b"batched-%d" % i, key=f"b{i % 3}")
                           for i in range(count)])
    await batched.close()


def files_under(root: Path) -> list[Path]:
    return sorted(root.rglob("*.parquet")) if root.exists() else []


def test_offloaded_ledgers_read_back_the_same_before_and_after_the_bookies_lose_them(
        meta: list[str], tmp_path: Path) -> None:
    tier = tmp_path / "tier"

    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("tiered", small())
            await fill(client, "tiered")
            before = await read_all(client, "tiered")
            assert len(before) == 120
            info = await client.stream_info("tiered")
            closed = [ledger["ledger_id"] for part in info["partitions"]
                      for ledger in part["ledgers"] if ledger["status"] == "closed"
                      and ledger["entries"] > 0]
            assert len(closed) >= 10

            outcomes = await client.offload("tiered", str(tier), deletion_lag_ms=0)
            assert sorted(o.ledger_id for o in outcomes) == sorted(closed)
            assert {o.status for o in outcomes} == {"offloaded"}
            records = await client.offloaded("tiered")
            assert sorted(r.ledger_id for r in records) == sorted(closed)
            assert [Path(r.url) for r in sorted(records, key=lambda r: r.url)] == files_under(tier)
            assert all(r.bookies_deleted_ms == 0 for r in records)

            # Read from the files (the bookies still hold a copy): the same messages.
            assert await read_all(client, "tiered") == before
            # A second run has nothing to do.
            assert await client.offload("tiered", str(tier)) == []

            # The lag (0) has passed: trim deletes the bookies' copies.
            report = await client.trim("tiered")
            assert sorted(report.offloaded_copies_deleted) == sorted(closed)
            for ledger_id in closed:
                assert await client.ledger_client.meta.get(ledger_key(ledger_id)) is None
                with pytest.raises(NoSuchLedgerError):
                    await client.ledger_client.open_ledger(ledger_id, recovery=False)
            assert all(r.bookies_deleted_ms > 0 for r in await client.offloaded("tiered"))
            info = await client.stream_info("tiered")
            tiers = {ledger["ledger_id"]: ledger["tier"] for part in info["partitions"]
                     for ledger in part["ledgers"]}
            assert {tiers[ledger_id] for ledger_id in closed} == {"offloaded-only"}
            assert sum(part["offloaded_ledgers"] for part in info["partitions"]) == len(closed)

            # Every reader path now reads the files only.
            assert await read_all(client, "tiered") == before
            middle = sorted(before, key=lambda row: row[7])[len(before) // 2]
            since = await read_all(client, "tiered", middle[7])  # seek by publish time
            assert since and {row for row in since} <= set(before)
            assert min(row[7] for row in since) >= middle[7]
            assert {row for row in before if row[7] >= middle[7]} <= set(since)
            consumer = await client.subscribe("tiered", "sub", config=ConsumerConfig(
                initial_position="earliest"))
            received = []
            while (message := await consumer.receive(wait_ms=1500)) is not None:
                received.append(key_of(message))
                await consumer.ack(message)
            await consumer.close()
            assert sorted(received, key=lambda row: row[:4]) == before

            # New writes after the offload go on, on the bookies.
            producer = await client.producer("tiered")
            await producer.send(b"after", key="z")
            await producer.close()
            after = await read_all(client, "tiered")
            assert len(after) == 121 and [row for row in after if row[5] == b"after"]

    rpc.run(main())


def test_retention_and_delete_remove_the_offloaded_files(meta: list[str],
                                                         tmp_path: Path) -> None:
    tier = tmp_path / "tier"

    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("expiring", small(partitions=1))
            await fill(client, "expiring", count=20)
            done = await client.offload("expiring", str(tier))  # lag 4 h: bookies keep theirs
            assert len(done) >= 4
            assert len(files_under(tier)) == len(done)
            report = await client.trim("expiring", retention=RetentionPolicy(time_ms=0,
                                                                             size_bytes=0))
            gone = set(report.deleted_ledgers)
            assert gone and report.offloaded_copies_deleted == []
            left = await client.offloaded("expiring")
            assert not gone & {r.ledger_id for r in left}
            assert files_under(tier) == sorted(Path(r.url) for r in left)
            for ledger_id in gone:
                assert await client.ledger_client.meta.get(ledger_key(ledger_id)) is None

            await client.create_stream("dropped", small(partitions=1))
            await fill(client, "dropped", count=12)
            assert await client.offload("dropped", str(tier / "d"))
            assert files_under(tier / "d")
            await client.delete_stream("dropped")
            assert files_under(tier / "d") == []
            assert await client.ledger_client.meta.list_keys("/streams/dropped/") == []

    rpc.run(main())


def test_keep_bytes_leaves_the_newest_ledgers_on_the_bookies(meta: list[str],
                                                             tmp_path: Path) -> None:
    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("threshold", small(partitions=1))
            await fill(client, "threshold", count=20)
            info = await client.stream_info("threshold")
            closed = [ledger for ledger in info["partitions"][0]["ledgers"]
                      if ledger["status"] == "closed" and ledger["entries"] > 0]
            newest_two = closed[-1]["size_bytes"] + closed[-2]["size_bytes"]
            done = await client.offload("threshold", str(tmp_path / "t"), keep_bytes=newest_two)
            assert sorted(o.ledger_id for o in done) == [c["ledger_id"] for c in closed[:-2]]

    rpc.run(main())


def test_a_damaged_file_is_read_around_then_a_clear_error(meta: list[str],
                                                          tmp_path: Path) -> None:
    tier = tmp_path / "tier"

    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("damaged", small(partitions=1, entries=50))
            producer = await client.producer("damaged", config=ProducerConfig(batching=False))
            for i in range(120):  # 50-entry ledgers: sizeable pages to damage
                await producer.send(os.urandom(200) + b"%d" % i)
            await producer.close()
            done = sorted(await client.offload("damaged", str(tier)), key=lambda o: o.seq)
            assert len(done) >= 2
            first, second = Path(done[0].url), Path(done[1].url)
            good = first.read_bytes()
            before = await read_all(client, "damaged")
            assert len(before) == 120

            data = bytearray(good)
            data[len(data) // 3] ^= 0xFF  # inside the first column chunk's pages
            first.write_bytes(bytes(data))
            # Within the deletion lag the bookies still hold the ledger: read from them.
            assert await read_all(client, "damaged") == before
            report = await client.trim("damaged", at_ms=client.ledger_client.clock.wall_ms()
                                       + 5 * 3600 * 1000)  # past the 4 h lag: copies go
            assert {o.ledger_id for o in done} <= set(report.offloaded_copies_deleted)
            # Now the file is the only copy: a clear error naming ledger and file.
            with pytest.raises(OffloadError) as bad:
                await read_all(client, "damaged")
            assert str(done[0].ledger_id) in bad.value.message
            assert str(first) in bad.value.message
            assert "the bookies no longer hold it either" in bad.value.message

            shutil.copyfile(second, first)  # another ledger's (intact) file in its place
            with pytest.raises(OffloadError, match="is not this ledger's file"):
                await read_all(client, "damaged")

            import pyarrow.parquet as pq  # a well-formed file, rows out of order

            table = pq.read_table(io.BytesIO(good))
            swapped = [0, 2, 1, *range(3, table.num_rows)]  # first and last rows in place
            pq.write_table(table.take(swapped), first)
            with pytest.raises(OffloadError, match="out of order"):
                await read_all(client, "damaged")

            first.unlink()
            with pytest.raises(OffloadError, match="is missing"):
                await read_all(client, "damaged")

            first.write_bytes(good)  # put back: the stream reads whole again
            assert await read_all(client, "damaged") == before

    rpc.run(main())


def test_bad_input_gets_a_clear_error_and_loses_nothing(meta: list[str],
                                                        tmp_path: Path) -> None:
    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("refused", small(partitions=1))
            await fill(client, "refused", count=12)
            before = await read_all(client, "refused")
            with pytest.raises(StreamNotFoundError):
                await client.offload("no-such-stream", str(tmp_path))
            with pytest.raises(UsageError, match="cannot open it"):
                await client.offload("refused", "nope://bucket/x")
            with pytest.raises(UsageError, match="empty"):
                await client.offload("refused", "  ")
            with pytest.raises(UsageError, match="keep_bytes"):
                await client.offload("refused", str(tmp_path), keep_bytes=-1)
            with pytest.raises(UsageError, match="no partition 3"):
                await client.offload("refused", str(tmp_path), partitions=[3])
            a_file = tmp_path / "a-file"
            a_file.write_bytes(b"")
            with pytest.raises(OffloadError, match="cannot write the offload file"):
                await client.offload("refused", str(a_file))
            assert await client.offloaded("refused") == []
            assert files_under(tmp_path) == []
            assert await read_all(client, "refused") == before

    rpc.run(main())


def test_cli_offloads_and_lists(meta: list[str], tmp_path: Path) -> None:
    async def setup() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("cli-tiered", small(partitions=1))
            await fill(client, "cli-tiered", count=12)

    rpc.run(setup())
    members = ",".join(meta)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "quorumlog", "stream", *args,
                               "--members", members], capture_output=True, text=True,
                              timeout=120)

    done = cli("offload", "cli-tiered", "--to", str(tmp_path / "t"), "--no-spark",
               "-o", "json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["offloaded"] >= 3 and summary["failed"] == 0
    listed = cli("offloaded", "cli-tiered", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)["offloaded"]
    assert len(rows) == summary["offloaded"]
    assert all(Path(row["url"]).is_file() for row in rows)
    for args in (("cli-tiered", "--to", "s4://x", "--no-spark"),
                 ("cli-tiered", "--to", "s4://x"),       # checked before Spark starts
                 ("no-such-stream", "--to", str(tmp_path / "t"))):
        typo = cli("offload", *args)
        assert typo.returncode == 1, typo
        assert typo.stderr.startswith("error:") and "Traceback" not in typo.stderr
        assert "log4j" not in typo.stderr  # no JVM was started


def test_a_dead_runs_file_is_swept_once_old_and_named_files_never(meta: list[str],
                                                                  tmp_path: Path) -> None:
    tier = tmp_path / "tier"

    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("swept", small(partitions=1))
            await fill(client, "swept", count=12)
            done = await client.offload("swept", str(tier))
            named = sorted(Path(o.url) for o in done)
            # What a run that died between its file and its record leaves: a file
            # no record names. One is two hours old, one was just written.
            old = named[0].with_name(f"{named[0].name.split('-')[0]}-deadbeef0000.parquet")
            young = old.with_name(f"{named[0].name.split('-')[0]}-0123456789ab.parquet")
            shutil.copyfile(named[0], old)
            shutil.copyfile(named[0], young)
            two_hours_ago = os.path.getmtime(old) - 7200
            os.utime(old, (two_hours_ago, two_hours_ago))
            for path in named:  # named files are kept however old they are
                os.utime(path, (two_hours_ago, two_hours_ago))
            # Other data in the target (a shared lake directory) is never touched,
            # whatever its age: only files named as an offload names them go.
            foreign = [tier / "swept" / "2024" / "part-0.parquet",
                       named[0].with_name("notes.parquet"),
                       named[0].with_name("0" + named[0].name)]  # 21 digits
            for path in foreign:
                path.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(named[0], path)
                os.utime(path, (two_hours_ago, two_hours_ago))
            swept = await client.sweep_offload_orphans("swept", str(tier))
            assert swept == [str(old)]
            assert files_under(tier) == sorted([*named, young, *foreign])
            assert len(await read_all(client, "swept")) == 24

    rpc.run(main())


def test_a_reader_mid_ledger_goes_on_from_the_file_when_the_bookies_drop_it(
        meta: list[str], tmp_path: Path) -> None:
    """A reader that opened a ledger on the bookies, then saw it offloaded and
    its bookie copy deleted and garbage-collected (a deletion lag shorter than
    the read), reads the rest of the ledger from the Parquet file."""
    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("midway", small(partitions=1, entries=600))
            producer = await client.producer("midway", config=ProducerConfig(batching=False))
            await asyncio.gather(*[await producer.send_async(b"v%d" % i) for i in range(700)])
            await producer.close()
            reader = await client.reader("midway", "earliest")
            part = reader.partition_readers[0]
            first = await part.next_batch(1000)  # 256 entries, the bookie handle cached
            assert 0 < len(first) < 600
            ledger_id = first[0].position.ledger_id
            password = (await client.get_stream("midway")).password
            handle = await client.ledger_client.open_ledger(ledger_id, password=password,
                                                            recovery=False)
            bookies = sorted({b for ensemble in handle.metadata.ensembles
                              for b in ensemble.bookies})
            done = await client.offload("midway", str(tmp_path / "m"), deletion_lag_ms=0)
            assert ledger_id in {o.ledger_id for o in done}  # and the second, 100-entry one
            assert ledger_id in (await client.trim("midway")).offloaded_copies_deleted
            pool = rpc.Pool()
            try:
                for bookie in bookies:  # the entries leave the bookies' disks now
                    await pool.call(bookie, GcRequest(), timeout_s=60)
                with pytest.raises(Exception):  # noqa: B017 - any error: the copy is gone
                    await handle.read_batch(first[-1].position.entry_id + 1,
                                            first[-1].position.entry_id + 1)
            finally:
                await pool.close()
            rest = []
            while batch := await part.next_batch(1000):
                rest += batch
            values = [m.value for m in first + rest]
            assert values == [b"v%d" % i for i in range(700)]
            await reader.close()

    rpc.run(main())


def test_two_runs_racing_on_a_ledger_commit_one_file(meta: list[str], tmp_path: Path) -> None:
    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("raced", small(partitions=1))
            await fill(client, "raced", count=8)
            record = await client.get_stream("raced")
            [(partition, info), *_] = await offload_candidates(client.ledger_client, record)
            outcomes = await asyncio.gather(*(
                offload_ledger(client.ledger_client, record, partition, info, str(tmp_path / t))
                for t in ("a", "b", "c")))
            assert sorted(o.status for o in outcomes) == ["already", "already", "offloaded"]
            [committed] = await client.offloaded("raced")
            assert files_under(tmp_path) == [Path(committed.url)]
            assert len(await read_all(client, "raced")) == 16

    rpc.run(main())


def test_an_offload_run_killed_midway_leaves_only_checked_files_behind_records(
        meta: list[str], tmp_path: Path) -> None:
    """SIGKILL the offload process while it works: every committed record names
    a whole, checked file (the stream reads back identical), the files of the
    killed run's uncommitted ledgers are swept, and a rerun finishes the job."""
    tier = tmp_path / "tier"

    async def fill_many() -> list[Any]:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("killed", small(partitions=1, entries=10))
            producer = await client.producer("killed", config=ProducerConfig(batching=False))
            for _ in range(1200):  # one at a time: a rollover every 10 entries
                await producer.send(os.urandom(4096))
            await producer.close()
            return await read_all(client, "killed")

    before = rpc.run(fill_many())
    assert len(before) == 1200

    async def records() -> int:
        async with await StreamClient.connect(meta) as client:
            return len(await client.offloaded("killed"))

    proc = subprocess.Popen([sys.executable, "-m", "quorumlog", "stream", "offload", "killed",
                             "--to", str(tier), "--no-spark", "--members", ",".join(meta)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and rpc.run(records()) == 0:
            time.sleep(0.02)
        proc.kill()  # SIGKILL
    finally:
        proc.wait(30)
    committed = rpc.run(records())
    assert 0 < committed < 120, committed  # killed mid-run

    async def after_kill() -> None:
        async with await StreamClient.connect(meta) as client:
            named = {Path(r.url) for r in await client.offloaded("killed")}
            assert named <= set(files_under(tier))  # no record without its file
            assert await read_all(client, "killed") == before
            swept = await client.sweep_offload_orphans("killed", str(tier), older_than_ms=0)
            assert set(files_under(tier)) == named
            assert all(Path(url) not in named for url in swept)
            outcomes = await client.offload("killed", str(tier))
            assert {o.status for o in outcomes} == {"offloaded"}
            assert len(await client.offloaded("killed")) == 120
            assert len(files_under(tier)) == 120
            assert await read_all(client, "killed") == before

    rpc.run(after_kill())
