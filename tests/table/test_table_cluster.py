"""Tables on a real local cluster: 3 node processes (meta, bookie, table) on 127.0.0.1.

One cluster for the module; each test uses its own table. The leader-kill
test runs last (it restarts the killed node at the end).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inprocess_cli import run_cli, run_cli_process
from quorumlog import node as cluster
from quorumlog import rpc
from quorumlog.errors import NotLeaderError, UsageError
from quorumlog.table import (
    VALUE_BYTES_MAX,
    BadTableRequestError,
    BlockingTableClient,
    CheckType,
    IncrCommand,
    KeyTooLargeError,
    Mutation,
    NotAnIntegerError,
    TableClient,
    TableExistsError,
    UnknownTableError,
    ValueTooLargeError,
    partition_of,
)
from quorumlog.table._messages import TableWriteBatchRequest, TableWriteItem

from .kill_writer import write_through_kill

PARTITIONS = 8
REPLICAS = 3

DROP_DEADLINE_S = 30.0


@pytest.fixture(scope="module")
def cluster_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    directory = tmp_path_factory.mktemp("table-cluster")
    with cluster.running(directory, 3):
        yield directory


@pytest.fixture
def tables(cluster_dir: Path) -> Iterator[BlockingTableClient]:
    with BlockingTableClient(cluster.meta_addresses(cluster_dir)) as client:
        yield client


def test_every_operation_through_the_client(tables: BlockingTableClient) -> None:
    layout = tables.create_table("ops", partitions=PARTITIONS, replicas=REPLICAS)
    assert len(layout.partitions) == PARTITIONS
    assert all(len(set(p.members)) == REPLICAS for p in layout.partitions)
    with pytest.raises(TableExistsError):
        tables.create_table("ops", partitions=PARTITIONS, replicas=REPLICAS)
    for i in range(40):  # every partition gets some hash keys
        tables.set("ops", b"h%d" % i, b"s", b"v%d" % i)
    assert all(tables.get("ops", b"h%d" % i, b"s") == b"v%d" % i for i in range(40))
    assert len({partition_of(b"h%d" % i, PARTITIONS) for i in range(40)}) == PARTITIONS
    tables.multi_set("ops", b"user", {b"a": b"1", b"b": b"2", b"c": b"3"}, ttl_s=3600)
    assert tables.multi_get("ops", b"user", [b"a", b"c", b"zz"]) == {b"a": b"1", b"c": b"3"}
    assert tables.sort_key_count("ops", b"user") == 3
    assert 3500 < tables.ttl("ops", b"user", b"a") <= 3600
    assert tables.ttl("ops", b"h1", b"s") == -1
    assert tables.ttl("ops", b"user", b"zz") is None
    assert tables.scan("ops", b"user", start=b"b") == [(b"b", b"2"), (b"c", b"3")]
    assert tables.scan("ops", b"user", page_records=1) == [(b"a", b"1"), (b"b", b"2"),
                                                           (b"c", b"3")]
    tables.delete("ops", b"user", b"a")
    tables.multi_delete("ops", b"user", [b"b"])
    assert tables.scan("ops", b"user") == [(b"c", b"3")]
    assert tables.incr("ops", b"n", b"count", 5) == 5
    assert tables.incr("ops", b"n", b"count", -2) == 3
    with pytest.raises(NotAnIntegerError):
        tables.incr("ops", b"h1", b"s", 1)
    result = tables.check_and_set("ops", b"n", check_sort_key=b"count",
                                  check_type=CheckType.INT_EQUAL, operand=b"3",
                                  set_sort_key=b"flag", value=b"yes")
    assert result.succeeded and tables.get("ops", b"n", b"flag") == b"yes"
    result = tables.check_and_mutate("ops", b"n", check_sort_key=b"count",
                                     check_type=CheckType.VALUE_NOT_EXIST, operand=b"",
                                     mutations=[Mutation(b"flag", None)],
                                     return_check_value=True)
    assert not result.succeeded and result.check_value == b"3"
    rows = tables.full_scan("ops", page_records=7)
    assert len(rows) == 40 + 1 + 2  # h0..h39, user/c, n/count + n/flag
    assert tables.table_info("ops").record.partitions == PARTITIONS
    assert "ops" in [t.name for t in tables.list_tables()]


def test_unknown_table_and_oversize_input_are_clear_errors(tables: BlockingTableClient) -> None:
    with pytest.raises(UnknownTableError, match="quorumlog table list"):
        tables.get("no-such-table", b"h", b"s")
    tables.create_table("limits", partitions=2, replicas=REPLICAS)
    with pytest.raises(KeyTooLargeError):
        tables.set("limits", b"h" * 70_000, b"s", b"v")
    with pytest.raises(KeyTooLargeError):
        tables.get("limits", b"h", b"s" * 70_000)
    with pytest.raises(ValueTooLargeError):
        tables.set("limits", b"h", b"s", b"v" * (1024 * 1024 + 1))
    tables.drop_table("limits")
    with pytest.raises(UnknownTableError):
        tables.set("limits", b"h", b"s", b"v")


def _leader_call(cluster_dir: Path, request: Any) -> Any:
    """``request`` sent to the nodes in turn, following NotLeaderError hints."""
    async def main() -> Any:
        pool = rpc.Pool()
        try:
            addresses = list(cluster.meta_addresses(cluster_dir))
            for _ in range(10):
                for address in addresses:
                    try:
                        return await pool.call(address, request, timeout_s=5.0)
                    except NotLeaderError as exc:
                        if exc.leader_hint:
                            addresses = [exc.leader_hint]
                            break
                await asyncio.sleep(0.2)
            raise AssertionError("no leader answered")
        finally:
            await pool.close()
    return rpc.run(main())


def test_concurrent_writes_travel_in_batches_each_applied_once(
        cluster_dir: Path, tables: BlockingTableClient) -> None:
    """200 sets from concurrent tasks of one client (sent in batches) all land;
    a raw batch holding the same proposal id twice applies it once and answers
    both with the first result; an empty batch is a clear error and the node
    keeps serving."""
    layout = tables.create_table("batches", partitions=2, replicas=REPLICAS, copysets=1)

    async def writes() -> int:
        async with TableClient(cluster.meta_addresses(cluster_dir)) as client:
            await client.set("batches", b"warm", b"s", b"v")  # learns the layout and leader
            before = client._batcher.batches_sent
            await asyncio.gather(*(client.set("batches", b"k%d" % i, b"s", b"v%d" % i)
                                   for i in range(200)))
            return client._batcher.batches_sent - before

    batches = rpc.run(writes())
    assert 0 < batches < 50, batches  # started in one loop turn: they shared requests
    assert all(tables.get("batches", b"k%d" % i, b"s") == b"v%d" % i for i in range(200))
    incr = TableWriteItem(commands=[IncrCommand(b"n", b"c", 5)], client_id=77, seq=1,
                          first_outstanding_seq=1)
    other = TableWriteItem(commands=[IncrCommand(b"n", b"d", 1)], client_id=77, seq=2,
                           first_outstanding_seq=1)
    answer = _leader_call(cluster_dir, TableWriteBatchRequest(
        table_id=layout.record.table_id, partition=0, writes=[incr, other, incr]))
    assert answer.errors == [None, None, None]
    assert [r[0].value for r in answer.results] == [5, 1, 5]  # the duplicate: first result
    assert tables.get("batches", b"n", b"c") == b"5"
    with pytest.raises(BadTableRequestError, match=r"holds 1\.\.256 writes, got 0"):
        _leader_call(cluster_dir, TableWriteBatchRequest(
            table_id=layout.record.table_id, partition=0, writes=[]))
    tables.set("batches", b"after", b"s", b"v")
    assert tables.get("batches", b"after", b"s") == b"v"
    tables.drop_table("batches")


def test_partitions_in_copysets_route_scan_and_count_like_partitions(
        cluster_dir: Path, tables: BlockingTableClient) -> None:
    """8 partitions in 3 copysets: 3 Raft groups on every node, each holding the
    partitions p with p % 3 == its index. Every operation finds its record, and a
    scan of one partition gives exactly that partition's records (a copyset's
    RocksDB holds its other partitions too)."""
    before = _replica_dirs(cluster_dir)
    layout = tables.create_table("copysets", partitions=PARTITIONS, replicas=REPLICAS,
                                 copysets=3)
    assert (layout.record.partitions, layout.record.groups, len(layout.partitions)) == (
        PARTITIONS, 3, 3)
    assert [layout.record.copyset_of(p) for p in range(PARTITIONS)] == [0, 1, 2, 0, 1, 2, 0, 1]
    written = {b"h%03d" % i: b"v%d" % i for i in range(120)}
    for hash_key, value in written.items():
        tables.set("copysets", hash_key, b"s", value)
    assert len(_replica_dirs(cluster_dir) - before) == 3  # one group per copyset
    assert {partition_of(h, PARTITIONS) for h in written} == set(range(PARTITIONS))
    assert all(tables.get("copysets", h, b"s") == v for h, v in written.items())
    tables.multi_set("copysets", b"h000", {b"a": b"1", b"b": b"2"})
    assert tables.sort_key_count("copysets", b"h000") == 3
    assert tables.incr("copysets", b"h001", b"n", 2) == 2
    for h in (b"h000", b"h001"):
        written.pop(h)
    tables.delete("copysets", b"h002", b"s")
    written.pop(b"h002")
    seen: dict[bytes, bytes] = {}
    for partition in range(PARTITIONS):
        for page_records in (1000, 7):  # one page, and many pages
            items = list(tables.scan_records("copysets", partition, page_records=page_records))
            assert {partition_of(i.hash_key, PARTITIONS) for i in items} <= {partition}
            ours = {i.hash_key: i.value for i in items if i.hash_key in written}
            assert ours == {h: v for h, v in written.items()
                            if partition_of(h, PARTITIONS) == partition}
            seen.update(ours)
    assert seen == written
    full = [(h, v) for h, s, v in tables.full_scan("copysets", page_records=5)
            if h in written]
    assert dict(full) == written and len(full) == len(written)  # each record once
    info = json.loads(_cli(cluster_dir, "info", "copysets", "-o", "json").stdout)
    assert (info["partitions"], info["copysets"]) == (PARTITIONS, 3)
    assert [g["partitions"] for g in info["partition_groups"]] == [[0, 3, 6], [1, 4, 7],
                                                                   [2, 5]]
    with pytest.raises(UsageError, match=r"copysets must be in 1\.\.8"):
        tables.create_table("copysets-9", partitions=PARTITIONS, replicas=REPLICAS,
                            copysets=9)
    tables.drop_table("copysets")
    created = _cli(cluster_dir, "create", "copysets-cli", "--partitions", "4", "--copysets", "2")
    assert "4 partition(s) in 2 copyset(s)" in created.stdout.replace("\n", " ")
    shown = _cli(cluster_dir, "info", "copysets-cli").stdout
    assert "copyset: parts" in shown and "0: 0,2" in shown and "1: 1,3" in shown
    listed = json.loads(_cli(cluster_dir, "list", "-o", "json").stdout)["tables"]
    assert [(t["partitions"], t["copysets"]) for t in listed
            if t["name"] == "copysets-cli"] == [(4, 2)]
    refused = _cli_process(cluster_dir, "create", "copysets-0", "--copysets", "0")
    assert refused.returncode != 0 and "copysets must be in 1..8" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert _cli(cluster_dir, "drop", "copysets-cli", "--yes").returncode == 0


def _replica_dirs(cluster_dir: Path) -> set[str]:
    """Every table replica's RocksDB and Raft group directory on every node (the
    nodes delete them meanwhile: names only, from the two parent directories)."""
    names: set[str] = set()
    for node_dir in cluster_dir.glob("node-*"):
        table_dir = node_dir / "data" / "table"
        for parent, prefix in ((table_dir / "replicas", ""), (table_dir / "raft", "group-")):
            try:
                entries = os.listdir(parent)
            except FileNotFoundError:
                continue
            names.update(n.removeprefix(prefix) for n in entries if n.startswith(prefix))
    return names


def test_drop_removes_every_replica_group_and_its_files(cluster_dir: Path,
                                                       tables: BlockingTableClient) -> None:
    before = _replica_dirs(cluster_dir)
    tables.create_table("dropped", partitions=2, replicas=REPLICAS)
    tables.set("dropped", b"h", b"s", b"v")
    created = _replica_dirs(cluster_dir) - before
    assert len(created) == 2  # one group id per partition, on every node
    tables.drop_table("dropped")
    deadline = time.monotonic() + DROP_DEADLINE_S
    while _replica_dirs(cluster_dir) & created:
        assert time.monotonic() < deadline, f"still on disk: {_replica_dirs(cluster_dir) & created}"
        time.sleep(0.2)
    tables.create_table("after-drop", partitions=1, replicas=REPLICAS)  # the nodes still serve
    tables.set("after-drop", b"h", b"s", b"v")
    assert tables.get("after-drop", b"h", b"s") == b"v"


def test_local_nodes_preallocate_small_raft_segments(cluster_dir: Path,
                                                     tables: BlockingTableClient) -> None:
    """Every replica's WAL preallocates a segment: the local cluster's [table] and
    [meta] sizes, not etcd's 64 MiB (a 3-node cluster with one 8-partition table
    once took 2.3 GiB)."""
    tables.create_table("segments", partitions=2, replicas=REPLICAS)
    tables.set("segments", b"h", b"s", b"v")
    sizes: dict[str, set[int]] = {"group": set(), "journal": set(), "meta": set()}
    for node_dir in cluster_dir.glob("node-*"):
        data = node_dir / "data"
        for wal in (data / "table" / "raft").glob("group-*/wal/*.wal"):
            sizes["group"].add(wal.stat().st_size)
        sizes["journal"].update(w.stat().st_size
                                for w in (data / "table" / "raft" / "journal").glob("*.wal"))
        sizes["meta"].update(w.stat().st_size for w in (data / "raft").glob("group-*/wal/*.wal"))
    assert sizes == {"group": {1 << 20}, "journal": {8 << 20}, "meta": {8 << 20}}, sizes


def _cli(cluster_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``quorumlog table ARGS`` in this process (tests/inprocess_cli.py)."""
    return run_cli("table", *args, "--dir", str(cluster_dir))


def _cli_process(cluster_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The same as a user runs it: the entry point turns errors into one line."""
    return run_cli_process("table", *args, "--dir", str(cluster_dir))


def test_cli_commands(cluster_dir: Path) -> None:
    assert _cli(cluster_dir, "create", "cli", "--partitions", "4").returncode == 0
    assert "cli" in _cli(cluster_dir, "list").stdout
    assert "members" in _cli(cluster_dir, "info", "cli").stdout
    assert _cli(cluster_dir, "set", "cli", "h", "s1", "one").returncode == 0
    assert _cli(cluster_dir, "set", "cli", "h", "s2", "two").returncode == 0
    assert _cli(cluster_dir, "get", "cli", "h", "s1").stdout == "one\n"
    assert _cli(cluster_dir, "scan", "cli", "h").stdout == "s1\tone\ns2\ttwo\n"
    assert _cli(cluster_dir, "del", "cli", "h", "s1").returncode == 0
    assert _cli(cluster_dir, "get", "cli", "h", "s1").returncode == 1
    assert _cli(cluster_dir, "incr", "cli", "h", "n", "--by", "7").stdout == "7\n"
    missing = _cli_process(cluster_dir, "get", "nope", "h", "s")
    assert missing.returncode == 1 and "no table 'nope'" in missing.stderr
    assert "Traceback" not in missing.stderr
    refused = _cli(cluster_dir, "drop", "cli")  # no --yes and no answer on stdin
    assert refused.returncode == 1 and "cli" in _cli(cluster_dir, "list").stdout
    assert _cli(cluster_dir, "drop", "cli", "--yes").returncode == 0
    assert "cli" not in _cli(cluster_dir, "list").stdout.split()


def test_cli_multi_record_ttl_count_and_check_commands(cluster_dir: Path) -> None:
    """Pegasus shell's multi_set/multi_get/multi_del, ttl, count, check_and_set and
    check_and_mutate, each checked against what the store then holds (in this
    process: test_cli_commands runs the CLI as a process)."""
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return _cli(cluster_dir, *args)

    def ok(*args: str) -> str:
        result = run(*args)
        assert result.returncode == 0, result.stderr
        return result.stdout

    ok("create", "shell", "--partitions", "2")
    ok("multi-set", "shell", "h", "a", "1", "b", "2", "c", "3", "--ttl-s", "3600")
    assert ok("multi-get", "shell", "h", "c", "a", "zz") == "a\t1\nc\t3\n"
    assert ok("multi-get", "shell", "h") == "a\t1\nb\t2\nc\t3\n"
    assert run("multi-get", "shell", "h", "zz").returncode == 1
    assert ok("count", "shell", "h") == "3\n"
    assert 3500 <= int(ok("ttl", "shell", "h", "a")) <= 3600
    ok("set", "shell", "h", "forever", "x")
    assert ok("ttl", "shell", "h", "forever") == "none\n"
    assert run("ttl", "shell", "h", "gone").returncode == 1
    assert ok("scan", "shell", "h", "--reverse", "--limit", "2") == "forever\tx\nc\t3\n"
    ok("multi-del", "shell", "h", "a", "b", "never-there")
    assert ok("multi-get", "shell", "h") == "c\t3\nforever\tx\n"

    # check-and-set: applied only when the check passes; a failed check exits 1.
    done = json.loads(ok("check-and-set", "shell", "h", "lock", "--check-type",
                         "value-not-exist", "--value", "me"))
    assert done == {"succeeded": True, "check_value_exist": False}
    refused = run("check-and-set", "shell", "h", "lock", "--check-type",
                   "value-not-exist", "--value", "you", "--return-check-value")
    assert refused.returncode == 1
    assert json.loads(refused.stdout) == {"succeeded": False, "check_value_exist": True,
                                          "check_value": "me"}
    assert ok("get", "shell", "h", "lock") == "me\n"
    ok("check-and-set", "shell", "h", "c", "--check-type", "int-less", "--operand", "5",
       "--set-sort-key", "c-small", "--value", "yes")
    assert ok("get", "shell", "h", "c-small") == "yes\n"
    # check-and-mutate: sets and deletes in order, atomically.
    ok("check-and-mutate", "shell", "h", "lock", "--check-type", "bytes-equal",
       "--operand", "me", "--mutations",
       '[["del", "lock"], ["set", "owner", "me", 60], ["set", "c", "4"], ["del", "forever"]]')
    assert ok("multi-get", "shell", "h") == "c\t4\nc-small\tyes\nowner\tme\n"
    assert 0 < int(ok("ttl", "shell", "h", "owner")) <= 60

    # Bad input: one clear error, nothing written.
    for args, needle, code in (
            (("multi-set", "shell", "h", "a"), "in pairs", 2),
            (("multi-set", "shell", "h", "a", "1", "a", "2"), "given twice", 2),
            (("check-and-set", "shell", "h", "c", "--check-type", "bogus", "--value", "v"),
             "--check-type 'bogus'", 2),
            (("check-and-mutate", "shell", "h", "c", "--check-type", "no-check",
              "--mutations", '[["put", "x"]]'), "--mutations is a JSON list", 2),
            (("check-and-mutate", "shell", "h", "c", "--check-type", "no-check",
              "--mutations", "not json"), "not JSON", 2),
            (("multi-set", "nope", "h", "a", "1"), "no table 'nope'", 1)):
        result = run(*args)
        assert result.returncode == code, (args, result.stderr)
        assert needle in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert ok("count", "shell", "h") == "3\n"
    ok("drop", "shell", "--yes")


LARGEST_AT_ONCE = 30  # a leader's pass of up to 30 MiB for one group
LARGEST_WHILE_DOWN = 40  # a follower comes back 40 MiB behind
LARGEST_DEADLINE_S = 60.0


def test_many_largest_values_written_at_once_caught_up_on_and_read_back(
        cluster_dir: Path, tables: BlockingTableClient) -> None:
    """Values of the largest size, many at once, to one partition: a leader's
    pass holds up to 30 MiB of one group, and a follower that was down catches
    up on 40 MiB at once. Before, each was one record of the node's Raft journal, over
    the WAL's 16 MiB record limit: the leader's node failed ("WalEntry has
    27252010 bytes of data; the limit is 16777200"), the retried writes failed
    the next leader too, and a node that fell behind failed at every restart.

    The follower's catch-up is checked by a write it must acknowledge: the other
    follower is down by then, so the leader commits only with it."""
    tables.create_table("largest", partitions=1, replicas=REPLICAS)
    value = b"v" * VALUE_BYTES_MAX
    meta = cluster.meta_addresses(cluster_dir)

    async def set_all(keys: range) -> None:
        async with TableClient(meta, deadline_s=LARGEST_DEADLINE_S) as client:
            await asyncio.gather(*(client.set("largest", b"h%d" % i, b"s", value)
                                   for i in keys))

    rpc.run(set_all(range(LARGEST_AT_ONCE)))
    tables.set("largest", b"warm", b"s", b"1")  # the client learns the leader
    leader_address = tables._client._leaders[(tables.table_info("largest").record.table_id, 0)]
    behind, other = [n for n in cluster.load(cluster_dir) if n.address != leader_address]
    os.kill(behind.pid, signal.SIGKILL)
    rpc.run(set_all(range(LARGEST_AT_ONCE, LARGEST_AT_ONCE + LARGEST_WHILE_DOWN)))
    os.kill(other.pid, signal.SIGKILL)
    try:
        # Meta has a majority again once `behind` is back (the leader's node and it).
        cluster.restart_node(cluster_dir, behind.id, serving_timeout_s=LARGEST_DEADLINE_S)
        tables.set("largest", b"after", b"s", b"acknowledged by the caught-up follower")
    finally:
        cluster.restart_node(cluster_dir, other.id, serving_timeout_s=LARGEST_DEADLINE_S)
    for node in cluster.load(cluster_dir):
        assert b'"node_failed"' not in Path(node.log).read_bytes(), node
    total = LARGEST_AT_ONCE + LARGEST_WHILE_DOWN
    assert all(tables.get("largest", b"h%d" % i, b"s") == value for i in range(total))

    # Reading them back at once: scan pages end at 4 MiB (before, a page of 100
    # records answered "response of 104857... bytes > max_frame_bytes" and no
    # scan of these values could finish); a multi_get larger than a frame is a
    # clear error, one that fits is answered.
    scanned = tables.full_scan("largest")
    assert len(scanned) == total + 2 and sum(v == value for _, _, v in scanned) == total
    rpc.run(_set_row(meta, value, ROW_SORT_KEYS))
    assert [k for k, _ in tables.scan("largest", b"row")] == [b"s%02d" % i
                                                               for i in range(ROW_SORT_KEYS)]
    with pytest.raises(rpc.ResponseTooLargeError, match="TableMultiGetRequest would be"):
        tables.multi_get("largest", b"row", [b"s%02d" % i for i in range(ROW_SORT_KEYS)])
    assert len(tables.multi_get("largest", b"row", [b"s%02d" % i for i in range(10)])) == 10
    tables.drop_table("largest")


ROW_SORT_KEYS = 18  # 18 MiB under one hash key


async def _set_row(meta: list[str], value: bytes, count: int) -> None:
    async with TableClient(meta, deadline_s=LARGEST_DEADLINE_S) as client:
        await asyncio.gather(*(client.set("largest", b"row", b"s%02d" % i, value)
                               for i in range(count)))


def test_leader_killed_while_writing_loses_no_acknowledged_write(
        cluster_dir: Path, tables: BlockingTableClient) -> None:
    tables.create_table("kill", partitions=1, replicas=REPLICAS)
    tables.set("kill", b"k", b"0", b"0")
    leader_address = tables._client._leaders[(tables.table_info("kill").record.table_id, 0)]
    victim = next(n for n in cluster.load(cluster_dir) if n.address == leader_address)
    acknowledged = write_through_kill(
        lambda i: tables.set("kill", b"k", b"%d" % i, b"%d" % i), victim.pid,
        before=20, after=20, deadline_s=20)
    stored = dict(tables.scan("kill", b"k"))
    missing = [i for i in acknowledged if stored.get(b"%d" % i) != b"%d" % i]
    assert not missing
    cluster.restart_node(cluster_dir, victim.id, serving_timeout_s=60)
