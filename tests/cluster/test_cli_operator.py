"""Operator commands on a real cluster (issue 18): binary-safe meta output,
`meta del`, and `ledger read` ranges that say what is wrong instead of
printing nothing."""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Iterator

import pytest

from inprocess_cli import run_cli, run_cli_process
from quorumlog import node as cluster
from quorumlog import rpc
from quorumlog.ledger import LedgerClient
from quorumlog.meta import MetaClient

CLI_TIMEOUT_S = 60.0
BINARY = b"\xff\x00\xfe binary"


@pytest.fixture(scope="module")
def meta(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with cluster.running(tmp_path_factory.mktemp("ops") / "cluster", 3) as addresses:
        yield ",".join(addresses)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args)  # in this process: about a second less a command


def test_binary_meta_values_are_printed_without_loss(meta: str) -> None:
    async def put() -> None:
        async with MetaClient(meta.split(",")) as client:
            await client.put("/ops/bin", BINARY)
            await client.put("/ops/text", "héllo".encode())

    rpc.run(put())
    got = json.loads(cli("meta", "get", "/ops/bin", "--members", meta).stdout)
    assert base64.b64decode(got["value_base64"]) == BINARY and "value" not in got
    got = json.loads(cli("meta", "get", "/ops/bin", "-e", "hex", "--members", meta).stdout)
    assert bytes.fromhex(got["value_hex"]) == BINARY
    got = json.loads(cli("meta", "get", "/ops/text", "--members", meta).stdout)
    assert got["value"] == "héllo"
    listed = cli("meta", "list", "/ops/", "-e", "hex", "--members", meta)
    assert listed.returncode == 0 and BINARY[:3].hex() in listed.stdout
    bad = cli("meta", "get", "/ops/bin", "-e", "rot13", "--members", meta)
    assert bad.returncode == 2 and "expected one of" in bad.stderr


def test_meta_del_of_a_key_and_a_prefix(meta: str) -> None:
    for i in range(3):
        assert cli("meta", "put", f"/ops/del/{i}", "v", "--members", meta).returncode == 0
    one = cli("meta", "del", "/ops/del/0", "--members", meta)
    assert (one.returncode, one.stdout.strip()) == (0, "1")
    again = cli("meta", "del", "/ops/del/0", "--members", meta)
    assert (again.returncode, again.stdout.strip()) == (1, "0")
    rest = cli("meta", "del", "/ops/del/", "--prefix", "--yes", "--members", meta)
    assert (rest.returncode, rest.stdout.strip()) == (0, "2")
    assert "not found" in cli("meta", "get", "/ops/del/1", "--members", meta).stdout


def test_ledger_read_ranges_that_cannot_be_read_say_why(meta: str) -> None:
    async def write() -> int:
        async with LedgerClient.connect(meta.split(",")) as client:
            handle = await client.create_ledger(3, 2, 2, password=b"pw")
            for i in range(4):
                await handle.append(b"e%d" % i)
            await handle.close()
            return int(handle.id)

    ledger_id = str(rpc.run(write()))
    common = ("--password", "pw", "--meta", meta)
    ok = cli("ledger", "read", ledger_id, "--from", "1", "--to", "2", *common)
    assert (ok.returncode, ok.stdout) == (0, "e1\ne2\n")
    backwards = cli("ledger", "read", ledger_id, "--from", "2", "--to", "1", *common)
    assert backwards.returncode == 2 and "before --from" in backwards.stderr
    past = run_cli_process("ledger", "read", ledger_id, "--to", str(2**64 - 1), *common)
    assert past.returncode == 2 and "last confirmed entry" in past.stderr
    assert "(3;" in past.stderr and "Traceback" not in past.stderr
    after = cli("ledger", "read", ledger_id, "--from", "9", *common)
    assert after.returncode == 2 and "--from 9" in after.stderr


def test_meta_member_list_shows_every_member_with_its_state(meta: str) -> None:
    result = cli("meta", "member", "list", "--json", "--members", meta)
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert sorted(r["address"] for r in rows) == sorted(meta.split(","))
    assert {r["kind"] for r in rows} == {"voter"}
    assert sum(1 for r in rows if r["leader"]) == 1
    assert len({r["term"] for r in rows}) == 1
    table = cli("meta", "member", "list", "--members", meta)
    assert table.returncode == 0 and "leader *" in table.stdout


def test_one_address_flag_for_every_command(meta: str) -> None:
    """--members everywhere, --meta as its alias everywhere, $QUORUMLOG_MEMBERS
    when neither is given (issue 18: ledger took --meta, all others --members)."""

    assert cli("meta", "put", "/ops/flag", "v", "--meta", meta).returncode == 0
    created = cli("ledger", "create", "-e", "1", "-w", "1", "-a", "1", "--members", meta)
    assert created.returncode == 0, created.stderr
    ledger_id = created.stdout.split()[-1]
    env = {"QUORUMLOG_MEMBERS": meta, "QUORUMLOG_CLUSTER_DIR": "/nonexistent"}
    for args in (("meta", "get", "/ops/flag"), ("ledger", "info", ledger_id),
                 ("stream", "list"), ("bookie", "list")):
        done = run_cli(*args, env=env)
        assert done.returncode == 0, (args, done.stderr)
    got = json.loads(cli("meta", "get", "/ops/flag", "--meta", meta).stdout)
    assert got["value"] == "v"


def test_ledger_info_and_list_show_an_open_ledgers_progress(meta: str) -> None:
    """Issue 18: an open ledger with 4 entries showed last entry -1 and 0 bytes,
    and a recovered one -1 bytes. Now info asks the bookies for the LAC, and
    the tables say open / unknown instead of printing sentinels."""
    created = cli("ledger", "create", "-e", "3", "-w", "2", "-a", "2", "--members", meta)
    ledger_id = created.stdout.split()[-1]
    appended = run_cli("ledger", "append", ledger_id, "--members", meta,
                       stdin="a\nbb\nccc\ndddd\n")
    assert appended.returncode == 0, appended.stderr
    info = json.loads(cli("ledger", "info", ledger_id, "--json", "--members", meta).stdout)
    assert info["state"] == "OPEN" and info["last_add_confirmed"] >= 2  # LAC trails by one
    table = cli("ledger", "info", ledger_id, "--members", meta).stdout
    assert "last_add_confirmed" in table and "OPEN" in table and "-1" not in table
    listed = cli("ledger", "list", "-o", "yaml", "--members", meta)
    assert listed.returncode == 0 and f"id: {ledger_id}" in listed.stdout
    row = [line for line in cli("ledger", "list", "--members", meta).stdout.splitlines()
           if line.startswith(f"│ {ledger_id} ")]
    assert row and "open" in row[0] and "-1" not in row[0]
    assert cli("ledger", "recover", ledger_id, "--members", meta).stdout.strip() == "3"
    closed = cli("ledger", "info", ledger_id, "--members", meta).stdout
    assert "unknown (closed by recovery)" in closed and "-1" not in closed


def test_meta_txn_reads_etcdctl_syntax_from_stdin(meta: str) -> None:
    def txn(text: str, *extra: str) -> subprocess.CompletedProcess[str]:
        return run_cli("meta", "txn", "--members", meta, *extra, stdin=text)

    lock = 'version("/ops/txn/lock") = "0"\n\nput /ops/txn/lock me\nget /ops/txn/lock\n\n' \
           'get /ops/txn/lock\n'
    first = txn(lock)
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == ["SUCCESS", "OK", "/ops/txn/lock", "me"]
    second = txn(lock, "--json")  # the lock is taken: the failure branch runs
    assert second.returncode == 1
    out = json.loads(second.stdout)
    assert out["succeeded"] is False and out["results"][0]["get"][0]["value"] == "me"
    swapped = txn('value("/ops/txn/lock") = "me"\nmod("/ops/txn/lock") > "0"\n\n'
                  'put /ops/txn/lock "you and me"\ndel /ops/txn/nothing\n')
    assert swapped.returncode == 0 and swapped.stdout.splitlines() == ["SUCCESS", "OK", "0"]
    got = json.loads(cli("meta", "get", "/ops/txn/lock", "--members", meta).stdout)
    assert got["value"] == "you and me"
    bad = run_cli_process("meta", "txn", "--members", meta,
                          stdin='value(/ops/txn/lock) = me\n\nput /k v\n')
    assert bad.returncode != 0 and "line 1" in bad.stderr and "Traceback" not in bad.stderr
    worse = txn('\n\nfrobnicate /k\n')
    assert worse.returncode != 0 and "not a request" in worse.stderr
