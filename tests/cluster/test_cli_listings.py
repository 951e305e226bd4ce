"""Listings and stream views as an operator runs them (issue 18), at 80 columns:
``-o table|wide|json|yaml`` on stream, subscription, table and meta listings;
human units and times in tables, raw values in json."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest
import yaml  # type: ignore[import-untyped]

from inprocess_cli import TERMINAL_COLUMNS, run_cli, run_cli_process
from quorumlog import node as cluster
from quorumlog.stream import BlockingStreamClient, ConsumerConfig, StreamConfig
from quorumlog.table import BlockingTableClient

CLI_TIMEOUT_S = 60.0
MESSAGES = 20
ACKED = 12
VALUE = b"x" * 100


@pytest.fixture(scope="module")
def meta(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with cluster.running(tmp_path_factory.mktemp("listings") / "cluster", 3) as addresses:
        members = list(addresses)
        with BlockingStreamClient(members) as client:
            client.create_stream("orders", StreamConfig(partitions=1, ensemble_size=2,
                                                        write_quorum=2, ack_quorum=2))
            with client.producer("orders") as producer:
                for _ in range(MESSAGES):  # one entry each (send_many batches)
                    producer.send(VALUE)
            config = ConsumerConfig(initial_position="earliest")
            with client.subscribe("orders", "billing", config=config) as consumer:
                for _ in range(ACKED):
                    message = consumer.receive(10_000)
                    assert message is not None
                    consumer.ack(message)
        with BlockingTableClient(members) as tables:
            tables.create_table("users", partitions=2, replicas=3)
        yield ",".join(members)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args)  # in this process: about a second less a command


def ok(*args: str) -> str:
    done = cli(*args)
    assert done.returncode == 0, (args, done.stderr)
    return done.stdout


def fits(text: str) -> None:
    widths = [len(line) for line in text.splitlines()]
    assert max(widths) <= TERMINAL_COLUMNS, text
    assert "…" not in text, text


LISTINGS = [
    (("stream", "list"), "streams", "orders"),
    (("stream", "subscriptions", "orders"), "subscriptions", "billing"),
    (("table", "list"), "tables", "users"),
    (("meta", "list", "/streams/"), "kvs", "/streams/"),
    (("meta", "member", "list"), "members", "voter"),
]


@pytest.mark.parametrize(("args", "key", "needle"), LISTINGS,
                         ids=[" ".join(a) for a, _, _ in LISTINGS])
def test_every_listing_has_the_four_outputs(meta: str, args: tuple[str, ...], key: str,
                                            needle: str) -> None:
    table = ok(*args, "--members", meta)
    fits(table)
    assert needle in table
    wide = ok(*args, "-o", "wide", "--members", meta)
    assert needle in wide and max(map(len, wide.splitlines())) >= max(
        map(len, table.splitlines()))
    rows = json.loads(ok(*args, "-o", "json", "--members", meta))[key]
    assert rows and needle in json.dumps(rows)
    again = yaml.safe_load(ok(*args, "-o", "yaml", "--members", meta))[key]
    # The same rows (indexes and revisions may have moved on between the calls).
    assert [sorted(row) for row in again] == [sorted(row) for row in rows]
    bad = cli(*args, "-o", "xml", "--members", meta)
    assert bad.returncode == 2 and "expected one of" in bad.stderr


def test_listings_show_human_units_and_keep_raw_values_in_json(meta: str) -> None:
    streams = json.loads(ok("stream", "list", "-o", "json", "--members", meta))["streams"]
    (orders,) = (row for row in streams if row["name"] == "orders")
    assert orders["retention_time_ms"] == 7 * 86_400_000 and orders["partitions"] == 1
    assert "7 d" in ok("stream", "list", "--members", meta)
    assert json.loads(ok("stream", "list", "--json", "--members", meta)) == ["orders"]
    tables = json.loads(ok("table", "list", "-o", "json", "--members", meta))["tables"]
    assert tables[0]["created_ms"] > 0 and "ago" in ok("table", "list", "--members", meta)


LARGE_KEYS = 20  # of 1,000,000 bytes: 20 MB under one prefix, past a 16 MiB frame


def test_meta_list_of_large_values_comes_in_pages(meta: str) -> None:
    """Before, `meta list` of a prefix whose values add up past the rpc frame
    limit failed ("the answer to MetaRangeRequest would be 20,00... bytes");
    now it is fetched in pages that fit."""
    from quorumlog.meta import BlockingMetaClient
    from quorumlog.rpc import ResponseTooLargeError

    with BlockingMetaClient(meta.split(",")) as client:
        for i in range(LARGE_KEYS):
            client.put(f"/large/{i:02d}", b"v" * 1_000_000)
        with pytest.raises(ResponseTooLargeError):
            client.list_keys("/large/")
        assert len(client.list_pages("/large/", limit=15)) == 15
    rows = json.loads(ok("meta", "list", "/large/", "-o", "json", "--members", meta))["kvs"]
    assert [row["key"] for row in rows] == [f"/large/{i:02d}" for i in range(LARGE_KEYS)]
    assert "976.6 KiB" in ok("meta", "list", "/large/", "--limit", "3", "--members", meta)
    with BlockingMetaClient(meta.split(",")) as client:
        client.delete("/large/", prefix=True)


def test_subscriptions_show_mark_delete_as_ledger_entry(meta: str) -> None:
    (sub,) = json.loads(ok("stream", "subscriptions", "orders", "-o", "json",
                           "--members", meta))["subscriptions"]
    assert sub["backlog_entries"] == MESSAGES - ACKED and sub["updated_ms"] > 0
    mark = sub["partitions"][0]["mark_delete"]
    assert mark["entry"] == ACKED - 1
    table = ok("stream", "subscriptions", "orders", "--members", meta)
    assert f"p0 {mark['ledger']}:{ACKED - 1}" in table and "ago" in table
    assert f"{MESSAGES - ACKED}" in table


def test_stream_info_is_human_in_tables_and_raw_in_json(meta: str) -> None:
    text = ok("stream", "info", "orders", "--members", meta)
    fits(text)
    assert "7 d" in text and "2.0 GiB" in text  # retention and rollover size
    data = json.loads(ok("stream", "info", "orders", "-o", "json", "--members", meta))
    state = data["subscriptions"]["billing"]["0"]
    mark = state["mark_delete"]
    assert mark["entry"] == ACKED - 1 and isinstance(state["updated_ms"], int)
    assert f"p0 mark-delete {mark['ledger']}:{ACKED - 1}" in text
    assert "[" not in text.split("subscription")[-1]  # no raw position arrays
    assert yaml.safe_load(ok("stream", "info", "orders", "-o", "yaml",
                             "--members", meta)) == data


def test_ledger_delete_asks_unless_yes(meta: str) -> None:
    created = ok("ledger", "create", "-e", "1", "-w", "1", "-a", "1", "--members", meta)
    ledger_id = created.split()[-1]
    refused = run_cli_process("ledger", "delete", ledger_id, "--members", meta, stdin="n\n",
                              timeout_s=CLI_TIMEOUT_S)
    assert refused.returncode == 1 and "delete ledger" in refused.stdout, refused
    assert '"state"' in ok("ledger", "info", ledger_id, "--json", "--members", meta)
    assert "deleted" in ok("ledger", "delete", ledger_id, "--yes", "--members", meta)
    gone = run_cli_process("ledger", "info", ledger_id, "--members", meta)
    assert gone.returncode == 1 and "Traceback" not in gone.stderr


def test_endpoint_health_and_status_name_each_member_and_fail_on_a_dead_one(meta: str) -> None:
    """etcdctl's `endpoint health` / `endpoint status` (issue 18): every member of
    a running cluster is healthy (a linearizable read through it) and reports its
    role; an endpoint that does not answer is named, and the command exits 1."""
    from quorumlog.node._cluster import free_port

    members = meta.split(",")
    health = json.loads(ok("meta", "endpoint", "health", "--members", meta, "-o", "json"))
    assert [r["endpoint"] for r in health["endpoints"]] == members
    assert all(r["healthy"] for r in health["endpoints"]), health
    status = json.loads(ok("meta", "endpoint", "status", "--members", meta, "-o", "json"))
    rows = status["endpoints"]
    assert sorted(r["id"] for r in rows) == [1, 2, 3]
    assert sum(r["is_leader"] for r in rows) == 1
    assert len({r["leader"] for r in rows}) == 1 and len({r["term"] for r in rows}) == 1
    fits(ok("meta", "endpoint", "status", "--members", meta))

    dead = f"127.0.0.1:{free_port()}"
    mixed = f"{members[0]},{dead}"
    done = cli("meta", "endpoint", "health", "--members", mixed, "--timeout", "1")
    assert done.returncode == 1, done.stderr
    assert "UNHEALTHY" in done.stdout and "healthy" in done.stdout
    fits(done.stdout)
    done = cli("meta", "endpoint", "status", "--members", mixed, "-o", "json")
    assert done.returncode == 1, done.stderr
    roles = {r["endpoint"]: r["role"] for r in json.loads(done.stdout)["endpoints"]}
    assert roles[dead] == "unreachable" and roles[members[0]] in ("leader", "follower")
