"""Topic compaction on real nodes (Pulsar's ``topics compact`` and ``readCompacted``):
the compacted view is checked against an oracle computed from a plain read of
every message (the latest of each key, an empty value removing its key,
messages without a key kept), through re-compaction, retention trimming the
original ledgers, a start in the middle, the ledger of a run that died, the
stream's delete and the CLI."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Iterator
from unittest import mock

import pytest
from typer.testing import CliRunner

from quorumlog import node as cluster
from quorumlog.errors import QuorumlogError
from quorumlog.stream import (
    CompactionRecord,
    Consumer,
    ConsumerConfig,
    Message,
    Position,
    RetentionPolicy,
    RolloverPolicy,
    StreamClient,
    StreamConfig,
)

IDLE_MS = 1500  # a read that gets nothing for this long has read everything

Key = tuple[int, int, int, int]  # (partition, seq, entry, batch)


@pytest.fixture(scope="module")
def meta(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    with contextlib.ExitStack() as stack:
        with mock.patch.dict(os.environ, {"QUORUMLOG_TRIMMER__ENABLED": "false"}):
            addresses = stack.enter_context(
                cluster.running(tmp_path_factory.mktemp("compaction") / "cluster", 3))
        yield addresses


def config(partitions: int = 2) -> StreamConfig:
    return StreamConfig(partitions=partitions, writer_lease_ttl_ms=1000,
                        rollover=RolloverPolicy(max_entries=4, min_time_ms=0))


def place(message: Message) -> Key:
    return (message.partition, message.seq, message.position.entry_id,
            message.position.batch_index)


async def read_all(client: StreamClient, stream: str, start: object = "earliest", *,
                   compacted: bool = False) -> list[Message]:
    reader = await client.reader(stream, start, read_compacted=compacted)  # type: ignore[arg-type]
    out: list[Message] = []
    try:
        while batch := await reader.read_batch(IDLE_MS):
            out.extend(batch)
    finally:
        await reader.close()
    return sorted(out, key=place)


def oracle(messages: list[Message]) -> list[tuple[Key, bytes | None, bytes]]:
    """The compacted view of ``messages``: per partition, the latest message of
    each key unless its value is empty, and every message without a key."""
    latest: dict[tuple[int, bytes], Key] = {}
    for message in sorted(messages, key=place):
        if message.key is not None:
            latest[(message.partition, message.key)] = place(message)
    return [(place(m), m.key, m.value) for m in sorted(messages, key=place)
            if m.key is None or (latest[(m.partition, m.key)] == place(m) and m.value)]


def view(messages: list[Message]) -> list[tuple[Key, bytes | None, bytes]]:
    return [(place(m), m.key, m.value) for m in messages]


async def produce(client: StreamClient, stream: str, round_: int, *, tombstones: tuple[str, ...]
                  ) -> None:
    producer = await client.producer(stream)
    try:
        for key in range(12):
            name = f"k{key:02d}"
            value = b"" if name in tombstones else f"{name}-round{round_}".encode()
            await producer.send(value, key=name)
        await producer.send(f"no key {round_}".encode())
        futures = [await producer.send_async(f"batched {round_}-{i}".encode(), key="kb")
                   for i in range(3)]
        await asyncio.gather(*futures)
    finally:
        await producer.close()  # closes its ledger: every entry is readable


def test_a_compacted_view_holds_the_latest_message_of_every_key(meta: list[str]) -> None:
    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("changes", config())
            await produce(client, "changes", 0, tombstones=())
            await produce(client, "changes", 1, tombstones=("k03", "k07"))
            await produce(client, "changes", 2, tombstones=("k03",))  # k07 set again
            everything = await read_all(client, "changes")
            assert len(everything) == 3 * 16

            outcomes = await client.compact("changes")
            assert [o.partition for o in outcomes] == [0, 1] and all(o.compacted for o in outcomes)
            compacted = await read_all(client, "changes", compacted=True)
            assert view(compacted) == oracle(everything)
            assert sum(o.kept for o in outcomes) == len(compacted)
            assert sum(o.tombstones for o in outcomes) == 1  # k03, on its partition
            assert b"k03" not in {m.key for m in compacted}
            assert {m.value for m in compacted if m.key == b"k07"} == {b"k07-round2"}
            assert len([m for m in compacted if m.key is None]) == 3  # left alone
            first = {o.partition: o.ledger_id for o in outcomes}
            records = await client.compaction_status("changes")
            assert {p: r.ledger_id for p, r in records.items()} == first

            # New messages: read after the horizon as they are, until compacted too.
            await produce(client, "changes", 3, tombstones=("k00",))
            everything = await read_all(client, "changes")
            horizon = {o.partition: (o.horizon.seq, o.horizon.entry_id) for o in outcomes
                       if o.horizon is not None}
            before = [m for m in everything
                      if (m.seq, m.position.entry_id) <= horizon[m.partition]]
            after = [m for m in everything
                     if (m.seq, m.position.entry_id) > horizon[m.partition]]
            assert after
            assert view(await read_all(client, "changes", compacted=True)) == sorted(
                oracle(before) + view(after))

            again = await client.compact("changes")
            assert all(o.compacted and o.previous_ledger_id == first[o.partition]
                       for o in again)
            for ledger_id in first.values():  # the previous compacted ledgers are gone
                with pytest.raises(QuorumlogError):
                    await client.ledger_client.ledger_metadata(ledger_id)
            assert view(await read_all(client, "changes", compacted=True)) == oracle(everything)
            assert not any(o.compacted for o in await client.compact("changes"))

            # Retention trims every closed ledger: the compacted view stays.
            report = await client.trim("changes", retention=RetentionPolicy(time_ms=0,
                                                                            size_bytes=0))
            assert report.deleted_ledgers
            assert len(await read_all(client, "changes")) < len(everything)
            compacted = await read_all(client, "changes", compacted=True)
            assert view(compacted) == oracle(everything)

            # A start in the middle (the message's seq_position: its ledger is
            # gone): what of the view is at or after it.
            middle = [m for m in compacted if m.partition == 0][3]
            from_middle = await client.reader("changes", {0: middle.seq_position},
                                              partitions=[0], read_compacted=True)
            got: list[Message] = []
            while batch := await from_middle.read_batch(IDLE_MS):
                got.extend(batch)
            await from_middle.close()
            assert view(got) == [v for v in oracle(everything)
                                 if v[0][0] == 0 and v[0] >= place(middle)]

            ledgers = [r.ledger_id for r in (await client.compaction_status("changes")).values()]
            await client.delete_stream("changes")
            for ledger_id in ledgers:
                with pytest.raises(QuorumlogError):
                    await client.ledger_client.ledger_metadata(ledger_id)

    asyncio.run(main())


def test_the_ledger_of_a_run_that_died_is_deleted_by_the_next(meta: list[str]) -> None:
    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("died", config(1))
            await produce(client, "died", 0, tombstones=())
            # A run that died after naming its ledger, before its commit.
            handle = await client.ledger_client.create_ledger(2, 2, 2)
            await handle.append(b"half written")
            orphan = handle.id
            await client.ledger_client.meta.put(
                "/streams/died/compaction/0000",
                CompactionRecord(pending_ledger_id=orphan).encode())
            [outcome] = await client.compact("died")
            assert outcome.compacted
            with pytest.raises(QuorumlogError):
                await client.ledger_client.ledger_metadata(orphan)
            record = (await client.compaction_status("died"))[0]
            assert record.pending_ledger_id == 0 and record.ledger_id == outcome.ledger_id
            assert view(await read_all(client, "died", compacted=True)) == oracle(
                await read_all(client, "died"))
            with pytest.raises(QuorumlogError, match="no partition 3"):
                await client.compact("died", partitions=[3])

    asyncio.run(main())


def test_the_cli_compacts_shows_and_reads_the_compacted_view(meta: list[str]) -> None:
    from quorumlog.cli import app

    members = ",".join(meta)
    runner = CliRunner()

    async def setup() -> list[tuple[Key, bytes | None, bytes]]:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("cli-changes", config(1))
            await produce(client, "cli-changes", 0, tombstones=())
            await produce(client, "cli-changes", 1, tombstones=("k05",))
            return oracle(await read_all(client, "cli-changes"))

    expected = asyncio.run(setup())
    never = runner.invoke(app, ["stream", "compaction-status", "cli-changes",
                                "--members", members])
    assert never.exit_code == 1, never.output
    done = runner.invoke(app, ["stream", "compact", "cli-changes", "--members", members,
                               "-o", "json"])
    assert done.exit_code == 0, done.output
    [row] = json.loads(done.output)["partitions"]
    assert row["compacted"] and row["kept"] == len(expected) and row["tombstones"] == 1
    assert row["horizon"]["ledger"] > 0
    status = runner.invoke(app, ["stream", "compaction-status", "cli-changes",
                                 "--members", members, "-o", "json"])
    assert status.exit_code == 0, status.output
    assert json.loads(status.output)["partitions"][0]["ledger_id"] == row["ledger_id"]
    info = runner.invoke(app, ["stream", "info", "cli-changes", "--members", members,
                               "-o", "json"])
    assert info.exit_code == 0, info.output
    assert json.loads(info.output)["partitions"][0]["compaction"]["ledger_id"] == \
        row["ledger_id"]
    shown = runner.invoke(app, ["stream", "info", "cli-changes", "--members", members])
    assert f"compacted to ledger {row['ledger_id']}" in " ".join(shown.output.split())
    tail = runner.invoke(app, ["stream", "tail", "cli-changes", "--from", "earliest",
                               "--read-compacted", "--count", str(len(expected)),
                               "--members", members])
    assert tail.exit_code == 0, tail.output
    values = [json.loads(line)["value"] for line in tail.output.splitlines()]
    assert values == [value.decode() for _, _, value in expected]
    bad = runner.invoke(app, ["stream", "compact", "no-such-stream", "--members", members])
    # In-process, the error reaches the runner (`quorumlog.cli.main` prints it).
    assert bad.exit_code == 1 and "does not exist" in str(bad.exception)


def test_positions_of_compacted_messages_are_those_of_the_originals() -> None:
    import msgspec

    from quorumlog.stream import MessageFormatError, OutgoingMessage, encode_entry
    from quorumlog.stream._reader import decode_compacted_chunk

    positions = msgspec.msgpack.encode([(3, 17, 5, 2, 4), (4, 18, 0, 0, 1)])
    messages = encode_entry([OutgoingMessage(b"a", b"k", None, 10),
                             OutgoingMessage(b"b", None, {"p": "q"}, 11)])
    first, second = decode_compacted_chunk("s", 1, positions, messages)
    assert (first.seq, first.position, first.batch_size, first.key) == (
        3, Position(17, 5, 2), 4, b"k")
    assert (second.seq, second.position, second.properties, second.publish_time_ms) == (
        4, Position(18, 0, 0), {"p": "q"}, 11)
    with pytest.raises(MessageFormatError, match="2 positions for 1 messages"):
        decode_compacted_chunk("s", 1, positions, encode_entry([OutgoingMessage(b"a")]))
    with pytest.raises(MessageFormatError, match="bad positions entry"):
        decode_compacted_chunk("s", 1, b"\xc1", messages)


def expected_table(messages: list[Message]) -> dict[bytes, bytes]:
    table: dict[bytes, bytes] = {}
    for message in sorted(messages, key=place):
        if message.key is None:
            continue
        if message.value:
            table[message.key] = message.value
        else:
            table.pop(message.key, None)
    return table


def test_a_table_view_follows_the_latest_value_of_every_key(meta: list[str]) -> None:
    from quorumlog.cli import app
    from quorumlog.stream import BlockingStreamClient

    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("profiles", config())
            await produce(client, "profiles", 0, tombstones=())
            await produce(client, "profiles", 1, tombstones=("k02", "k09"))
            view = await client.table_view("profiles")  # caught up when returned
            expected = expected_table(await read_all(client, "profiles"))
            assert view.snapshot() == expected and len(view) == len(expected) == 11
            assert view.get("k01") == b"k01-round1" and "k02" not in view
            changes: list[tuple[bytes, bytes | None]] = []
            view.listen(lambda key, value: changes.append((key, value)))

            producer = await client.producer("profiles")
            await producer.send(b"new", key="k99")
            await producer.send(b"", key="k01")  # a tombstone
            await producer.send(b"back", key="k02")
            await producer.send(b"no key is no row")
            await view.refresh()  # everything acknowledged before it is in the view
            assert view.get("k99") == b"new" and "k01" not in view and view.get("k02") == b"back"
            assert sorted(changes) == sorted([(b"k99", b"new"), (b"k01", None),
                                              (b"k02", b"back")])
            await producer.close()
            await view.close()

            # Compacted, its ledgers trimmed: a new view is the same table.
            expected = expected_table(await read_all(client, "profiles"))
            await client.compact("profiles")
            await client.trim("profiles", retention=RetentionPolicy(time_ms=0, size_bytes=0))
            async with await client.table_view("profiles") as again:
                assert again.snapshot() == expected

    asyncio.run(main())
    with BlockingStreamClient(meta) as blocking:
        view = blocking.table_view("profiles")
        assert view.get("k99") == b"new" and len(view) == 12  # 11 + k99 - k01 + k02
        blocking.producer("profiles").send(b"later", key="k98")
        view.refresh()
        assert view.get("k98") == b"later"
        view.close()
    shown = CliRunner().invoke(app, ["stream", "table-view", "profiles", "--members",
                                     ",".join(meta), "-o", "json"])
    assert shown.exit_code == 0, shown.output
    rows = json.loads(shown.output)["keys"]
    assert {row["key"]: row["value"] for row in rows}["k98"] == "later"
    assert [row["key"] for row in rows] == sorted(row["key"] for row in rows)


async def consume(consumer: Consumer, *, ack: bool = True,
                  limit: int | None = None) -> list[Message]:
    """Every message until nothing comes for IDLE_MS (at most ``limit``), in
    delivery order, each acknowledged unless ``ack`` is false."""
    out: list[Message] = []
    while limit is None or len(out) < limit:
        message = await consumer.receive(IDLE_MS)
        if message is None:
            break
        out.append(message)
        if ack:
            await consumer.ack(message)
    return out


def test_a_compacted_consumer_reads_the_view_and_its_cursor_moves_over_the_rest(
        meta: list[str]) -> None:
    """Pulsar's readCompacted on a subscription: a new one at earliest gets the view
    (messages of trimmed ledgers included), then every message after the horizon;
    acknowledging them moves the cursor over what the view left out, so a
    restarted consumer gets exactly the rest; seek to earliest starts in the view."""
    compacted = ConsumerConfig(initial_position="earliest", read_compacted=True,
                               ack_flush_ms=0)

    async def main() -> None:
        async with await StreamClient.connect(meta) as client:
            await client.create_stream("feed", config())
            await produce(client, "feed", 0, tombstones=())
            await produce(client, "feed", 1, tombstones=("k03", "k07"))
            before = await read_all(client, "feed")
            outcomes = await client.compact("feed")
            horizon = {o.partition: (o.horizon.seq, o.horizon.entry_id) for o in outcomes
                       if o.horizon is not None}
            await client.trim("feed", retention=RetentionPolicy(time_ms=0, size_bytes=0))
            await produce(client, "feed", 2, tombstones=("k05",))
            left = await read_all(client, "feed")  # what the trim left, and round 2
            assert len(left) < len(before) + 16  # trimmed: only the view has those
            after = [m for m in left if (m.seq, m.position.entry_id) > horizon[m.partition]]
            assert len(after) == 16
            expected = sorted(oracle(before) + view(after))

            consumer = await client.subscribe("feed", "views", config=compacted)
            first = await consume(consumer, limit=10)
            await consumer.close()  # acknowledged (ack_flush_ms=0: persisted at once)
            consumer = await client.subscribe("feed", "views", config=compacted)
            rest = await consume(consumer)
            assert sorted(view(first + rest)) == expected  # nothing twice, nothing lost
            for partition in (0, 1):  # each partition in stream order
                keys = [place(m) for m in first + rest if m.partition == partition]
                assert keys == sorted(keys)
            assert await consume(consumer) == []

            [*starts] = await consumer.seek("earliest")
            assert all(start.seq == 0 for start in starts)
            assert sorted(view(await consume(consumer, ack=False))) == expected
            await consumer.close()

            # The same subscription read without the view: its cursor stands after
            # the last message; a new plain one at earliest gets the untrimmed rest.
            async with await client.subscribe("feed", "plain", config=ConsumerConfig(
                    initial_position="earliest", ack_flush_ms=0)) as plain:
                assert sorted(view(await consume(plain))) == view(left)

            # Compacted again, then a new ledger, then a trim that takes the
            # ledger the horizon is in: nothing after the horizon went with it,
            # so a reader (which refuses data loss) goes on after the view.
            again = await client.compact("feed")
            assert all(o.compacted for o in again)
            for key in ("k00", "k01"):  # one entry per ledger: each partition's last
                producer = await client.producer("feed")
                await producer.send(f"{key}-last".encode(), key=key)
                await producer.close()
            untrimmed = view(await read_all(client, "feed", compacted=True))
            for subscription in ("views", "plain"):  # their cursors would keep the ledgers
                await client.unsubscribe("feed", subscription)
            report = await client.trim("feed", retention=RetentionPolicy(time_ms=0,
                                                                          size_bytes=0))
            assert {o.horizon.ledger_id for o in again if o.horizon is not None} <= set(
                report.deleted_ledgers)
            assert {m.value for m in await read_all(client, "feed")} <= {b"k00-last",
                                                                        b"k01-last"}
            assert view(await read_all(client, "feed", compacted=True)) == untrimmed

    asyncio.run(main())
