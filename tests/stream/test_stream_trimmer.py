"""The background trimmer against real node processes: retention applies with
no one calling ``trim``, only to ledgers every cursor has passed, and a
SIGKILLed trimmer is replaced by another node."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from quorumlog import node as cluster
from quorumlog import rpc
from quorumlog.errors import ConfigError, UsageError
from quorumlog.proto import ledger_key
from quorumlog.stream import (
    TRIMMER_KEY,
    ConsumerConfig,
    OffloadPolicy,
    RetentionPolicy,
    RolloverPolicy,
    StreamClient,
    StreamConfig,
    StreamNotFoundError,
    TrimmerConfig,
)

DEADLINE_S = 30.0
TRIMMER_ENV = {"QUORUMLOG_TRIMMER__CHECK_INTERVAL_MS": "300",
               "QUORUMLOG_TRIMMER__LEASE_TTL_MS": "1000"}


@pytest.fixture
def directory(tmp_path: Path) -> Iterator[Path]:
    with contextlib.ExitStack() as stack:
        with mock.patch.dict(os.environ, TRIMMER_ENV):  # the node processes inherit it
            stack.enter_context(cluster.running(tmp_path / "cluster", 3))
        yield tmp_path / "cluster"


def config(**retention: int) -> StreamConfig:
    return StreamConfig(writer_lease_ttl_ms=1000,
                        rollover=RolloverPolicy(max_entries=4, min_time_ms=0),
                        retention=RetentionPolicy(**retention))


async def ledger_ids(client: StreamClient, stream: str) -> list[int]:
    info = await client.stream_info(stream)
    return [ledger["ledger_id"] for ledger in info["partitions"][0]["ledgers"]]


async def wait_for(what: str, check: object) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if await check():  # type: ignore[operator]
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"not within {DEADLINE_S} s: {what}")


async def trimmer_holder(client: StreamClient) -> str:
    """The address of the node holding the trimmer's lease, once one holds it
    (a node takes it in the background after the cluster starts)."""
    holder: list[str] = []

    async def held() -> bool:
        record = await client.ledger_client.meta.get(TRIMMER_KEY)
        if record is not None:
            holder.append(record.value.decode())
        return bool(holder)

    await wait_for("a node holding the trimmer's lease", held)
    return holder[-1]


def scrape(address: str, name: str) -> float:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} is not in the metrics of {address}")


def test_background_trimmer_applies_retention_and_fails_over(directory: Path) -> None:
    nodes = cluster.load(directory)
    meta = cluster.meta_addresses(directory)

    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("retained", config(time_ms=0))
            await client.create_stream("subscribed", config(time_ms=0))
            await client.create_stream("kept", config())  # 7 days: nothing goes
            consumer = await client.subscribe("subscribed", "s", config=ConsumerConfig(
                initial_position="earliest", ack_flush_ms=0))
            producers = {name: await client.producer(name)
                         for name in ("retained", "subscribed", "kept")}
            written: dict[str, list[int]] = {}  # the ledgers each stream's messages went to

            async def produce(name: str, values: range) -> None:
                for i in values:
                    message_id = await producers[name].send(b"%d" % i)
                    ledgers = written.setdefault(name, [])
                    if message_id.position.ledger_id not in ledgers:
                        ledgers.append(message_id.position.ledger_id)

            for name in producers:  # 5 ledgers of 4 entries (the last one still open)
                await produce(name, range(20))
            assert all(len(ids) == 5 for ids in written.values()), written
            # The cursor is at the start: nothing of "subscribed" can have gone.
            assert await ledger_ids(client, "subscribed") == written["subscribed"]
            for _ in range(10):  # the cursor passes ledgers 0 and 1, and half of 2
                message = await consumer.receive(wait_ms=5000)
                assert message is not None
                await consumer.ack(message)

            # Nobody calls trim: the elected trimmer does, within a few rounds. (A
            # writer whose ledger is full may roll over to an empty one meanwhile:
            # then the last ledger kept is that one, and the full one goes too.)
            async def trimmed() -> bool:
                retained = await ledger_ids(client, "retained")
                subscribed = await ledger_ids(client, "subscribed")
                return (len(retained) == 1 and retained[0] >= written["retained"][-1]
                        and subscribed[:3] == written["subscribed"][2:])

            await wait_for("retention applied by the background trimmer", trimmed)
            assert (await ledger_ids(client, "kept"))[:5] == written["kept"]
            kept = await ledger_ids(client, "retained")
            gone = [i for i in written["retained"] if i not in kept] + written["subscribed"][:2]
            assert len(gone) >= 6
            for ledger_id in gone:
                assert await client.ledger_client.meta.get(ledger_key(ledger_id)) is None
            holder = await client.ledger_client.meta.get(TRIMMER_KEY)
            assert holder is not None
            victim = next(n for n in nodes if n.address == holder.value.decode())
            shown = await asyncio.to_thread(  # off the loop: the leases keep beating
                subprocess.run,
                [sys.executable, "-m", "quorumlog", "stream", "trimmer", "--dir", str(directory)],
                capture_output=True, text=True, timeout=60)
            assert shown.returncode == 0 and f"trimmer: {victim.address}" in shown.stdout, shown
            assert scrape(victim.metrics,
                          "quorumlog_stream_trimmer_deleted_ledgers_total") >= len(gone)
            assert scrape(victim.metrics, "quorumlog_stream_trimmer_rounds_total") >= 1

            # SIGKILL the trimmer's node: another node takes the lease and trims on.
            os.kill(victim.pid, signal.SIGKILL)
            written["retained"] = []
            await produce("retained", range(20, 32))  # 3 or more new ledgers
            after = written["retained"]
            assert len(after) >= 3, after

            async def taken_over() -> bool:
                current = await client.ledger_client.meta.get(TRIMMER_KEY)
                return (current is not None and current.value != holder.value
                        and len(await ledger_ids(client, "retained")) == 1)

            # (The writer may have rolled over to a new ledger when its bookie died:
            # the one ledger kept is the last one, which may hold no message yet.)
            await wait_for("a new trimmer after the SIGKILL", taken_over)
            kept = await ledger_ids(client, "retained")
            assert kept[0] >= after[-1]
            for ledger_id in after:
                if ledger_id not in kept:
                    assert await client.ledger_client.meta.get(ledger_key(ledger_id)) is None
            # Every message from the cursor's position on is still there.
            rest = []
            while (message := await consumer.receive(wait_ms=2000)) is not None:
                rest.append(int(message.value))
                await consumer.ack(message)
            assert rest == list(range(10, 20))
            await consumer.close()
            for producer in producers.values():
                await producer.close()

    rpc.run(main())


def test_trimmer_config_refuses_bad_values() -> None:
    with pytest.raises(ConfigError, match="check_interval_ms"):
        TrimmerConfig(check_interval_ms=0).validate()
    with pytest.raises(ConfigError, match="lease_ttl_ms"):
        TrimmerConfig(lease_ttl_ms=10).validate()
    with pytest.raises(ConfigError, match="streams_in_flight_max"):
        TrimmerConfig(streams_in_flight_max=0).validate()
    with pytest.raises(ConfigError, match="offload_ledgers_per_round_max"):
        TrimmerConfig(offload_ledgers_per_round_max=-1).validate()


def quorumlog(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "quorumlog", *args], capture_output=True,
                          text=True, timeout=120, check=False)


def test_an_offload_policy_offloads_in_the_background(directory: Path, tmp_path: Path) -> None:
    nodes = cluster.load(directory)
    meta = cluster.meta_addresses(directory)
    tier = tmp_path / "tier"

    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("auto", StreamConfig(
                partitions=2, writer_lease_ttl_ms=1000,
                rollover=RolloverPolicy(max_entries=4, min_time_ms=0),
                retention=RetentionPolicy(time_ms=-1)))
            producer = await client.producer("auto")
            for i in range(40):
                await producer.send(b"m%d" % i, key=f"k{i}")

            async def closed_ledgers() -> set[int]:
                info = await client.stream_info("auto")
                return {ledger["ledger_id"] for part in info["partitions"]
                        for ledger in part["ledgers"]
                        if ledger.get("status") == "closed" and ledger["entries"] > 0}

            before = sorted([(m.partition, m.position.to_json(), m.value) for m in
                             await read_all(client, "auto")], key=repr)
            assert len(before) == 40
            # No policy: a few rounds offload nothing.
            address = await trimmer_holder(client)
            trimmer = next(n for n in nodes if n.address == address)
            rounds = scrape(trimmer.metrics, "quorumlog_stream_trimmer_rounds_total")
            await wait_for("two trimmer rounds", lambda: asyncio.to_thread(
                lambda: scrape(trimmer.metrics, "quorumlog_stream_trimmer_rounds_total")
                >= rounds + 2))
            assert await client.offloaded("auto") == []

            # Bad updates change nothing.
            with pytest.raises(UsageError, match="needs an offload target"):
                await client.update_stream("auto", offload=OffloadPolicy(threshold_bytes=0))
            with pytest.raises(UsageError, match="offload target"):
                await client.update_stream("auto", offload=OffloadPolicy(
                    target="nosuchscheme://x", threshold_bytes=0))
            with pytest.raises(StreamNotFoundError):
                await client.update_stream("nosuch", retention=RetentionPolicy())
            assert (await client.get_stream("auto")).config.offload == OffloadPolicy()

            # Every closed ledger is offloaded, and with no deletion lag the
            # bookies' copy goes at a next round; the stream reads the same.
            record = await client.update_stream("auto", offload=OffloadPolicy(
                target=str(tier), threshold_bytes=0, deletion_lag_ms=0))
            assert record.config.offload.enabled
            closed = await closed_ledgers()
            assert len(closed) >= 6

            async def offloaded_and_gone() -> bool:
                records = {r.ledger_id: r for r in await client.offloaded("auto")}
                return closed <= set(records) and all(
                    records[i].bookies_deleted_ms for i in closed)

            await wait_for("the closed ledgers offloaded, their bookie copies deleted",
                           offloaded_and_gone)
            for ledger_id in closed:
                assert await client.ledger_client.meta.get(ledger_key(ledger_id)) is None
            after = sorted([(m.partition, m.position.to_json(), m.value) for m in
                            await read_all(client, "auto")], key=repr)
            assert after == before
            assert scrape(trimmer.metrics,
                          "quorumlog_stream_trimmer_offloaded_ledgers_total") >= len(closed)

            # Turned off from the CLI: new closed ledgers stay on the bookies only.
            shown = await asyncio.to_thread(quorumlog, "stream", "update", "auto",
                                            "--offload-threshold-bytes", "-1",
                                            "--dir", str(directory))
            assert shown.returncode == 0, shown
            assert "no automatic offload" in " ".join(shown.stdout.split())  # wrapped at 80
            done = {r.ledger_id for r in await client.offloaded("auto")}
            for i in range(40, 64):
                await producer.send(b"m%d" % i, key=f"k{i}")
            await producer.close()
            rounds = scrape(trimmer.metrics, "quorumlog_stream_trimmer_rounds_total")
            await wait_for("two more trimmer rounds", lambda: asyncio.to_thread(
                lambda: scrape(trimmer.metrics, "quorumlog_stream_trimmer_rounds_total")
                >= rounds + 2))
            assert {r.ledger_id for r in await client.offloaded("auto")} == done
            assert len(await closed_ledgers()) > len(closed)

    rpc.run(main())
    cli_update_refuses_bad_input(directory)


def cli_update_refuses_bad_input(directory: Path) -> None:
    """``stream update`` in this process (typer's runner; the exit codes and the
    one error line are main()'s, as the CLI process prints them)."""
    from typer.testing import CliRunner

    from quorumlog.cli import app
    from quorumlog.errors import QuorumlogError

    runner = CliRunner()

    def run(*args: str) -> tuple[int, str]:
        result = runner.invoke(app, ["stream", *args, "--dir", str(directory)])
        if isinstance(result.exception, QuorumlogError):
            return 1, f"error: {result.exception.message}"
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception
        return result.exit_code, " ".join(result.output.split())

    assert run("create", "upd")[0] == 0
    code, output = run("update", "upd")
    assert code == 2 and "nothing to change" in output, output
    for args, needle in ((("--offload-to", "nosuchscheme://bucket",
                           "--offload-threshold-bytes", "0"), "offload target"),
                         (("--offload-threshold-bytes", "0"), "needs an offload target"),
                         (("--retention-time-ms", "-5"), "retention time_ms")):
        code, output = run("update", "upd", *args)
        assert code == 1 and needle in output, (args, output)
    code, output = run("update", "nosuch", "--ttl-ms", "1")
    assert code == 1 and "does not exist" in output, output
    code, output = run("update", "upd", "--ttl-ms", "600000")
    assert code == 0 and "ttl 10 min" in output, output
    code, output = run("list", "-o", "json")
    [row] = [r for r in json.loads(output)["streams"] if r["name"] == "upd"]
    assert (row["message_ttl_ms"], row["offload_threshold_bytes"]) == (600000, -1)


async def read_all(client: StreamClient, stream: str) -> list[Any]:
    out = []
    async with await client.reader(stream, "earliest") as reader:
        while (message := await reader.read_next(1500)) is not None:
            out.append(message)
    return out


def test_a_compaction_threshold_compacts_in_the_background(directory: Path) -> None:
    """Pulsar's compaction-threshold: the trimmer compacts a partition once its
    closed ledgers after the horizon hold more than the threshold, again as
    more close, and not once it is turned off (-1)."""
    from .test_stream_compaction import oracle, view
    from .test_stream_compaction import read_all as read_sorted

    nodes = cluster.load(directory)
    meta = cluster.meta_addresses(directory)

    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("changelog", StreamConfig(
                writer_lease_ttl_ms=1000, rollover=RolloverPolicy(max_entries=4, min_time_ms=0),
                retention=RetentionPolicy(time_ms=-1)))
            producer = await client.producer("changelog")
            for i in range(30):
                await producer.send(b"v%d" % i, key=f"k{i % 5}")
            address = await trimmer_holder(client)
            trimmer = next(n for n in nodes if n.address == address)

            def rounds() -> float:
                return scrape(trimmer.metrics, "quorumlog_stream_trimmer_rounds_total")

            start = await asyncio.to_thread(rounds)
            await wait_for("two trimmer rounds", lambda: asyncio.to_thread(
                lambda: rounds() >= start + 2))
            assert await client.compaction_status("changelog") == {}  # off by default

            with pytest.raises(UsageError, match="compaction_threshold_bytes"):
                await client.update_stream("changelog", compaction_threshold_bytes=-2)
            record = await client.update_stream("changelog", compaction_threshold_bytes=0)
            assert record.config.compaction_threshold_bytes == 0

            async def compacted(than: int) -> bool:
                status = await client.compaction_status("changelog")
                return 0 in status and status[0].ledger_id not in (0, than)

            await wait_for("a compaction by the trimmer", lambda: compacted(0))
            first = (await client.compaction_status("changelog"))[0]
            everything = await read_sorted(client, "changelog")
            horizon = (first.horizon_seq, first.horizon_entry)
            assert view(await read_sorted(client, "changelog", compacted=True)) == sorted(
                oracle([m for m in everything if (m.seq, m.position.entry_id) <= horizon])
                + view([m for m in everything if (m.seq, m.position.entry_id) > horizon]))
            assert scrape(trimmer.metrics,
                          "quorumlog_stream_trimmer_compacted_partitions_total") >= 1

            for i in range(30, 50):  # closes more ledgers after the horizon
                await producer.send(b"v%d" % i, key=f"k{i % 5}")
            await producer.close()
            await wait_for("a second compaction", lambda: compacted(first.ledger_id))
            await wait_for("a compaction up to the end", lambda: _up_to_end(client))
            assert view(await read_sorted(client, "changelog", compacted=True)) == oracle(
                await read_sorted(client, "changelog"))

            shown = await asyncio.to_thread(quorumlog, "stream", "update", "changelog",
                                            "--compaction-threshold-bytes", "-1",
                                            "--dir", str(directory))
            assert shown.returncode == 0, shown
            assert "no automatic compaction" in " ".join(shown.stdout.split())

    async def _up_to_end(client: StreamClient) -> bool:
        status = (await client.compaction_status("changelog"))[0]
        messages = await read_sorted(client, "changelog")
        last = messages[-1]
        return (status.horizon_seq, status.horizon_entry) == (last.seq, last.position.entry_id)

    rpc.run(main())
