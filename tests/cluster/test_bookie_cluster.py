"""Bookies in a local cluster: `up --nodes 3`, the bookie CLI, GC against meta,
and registration lost and regained when the bookie's meta session goes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# The bookie tests' helpers (tests/bookie is not a package).
sys.path.insert(0, str(Path(__file__).parent.parent / "bookie"))
from server_helpers import KEY, add, check_entry, connect, read, small_bookie_config

from inprocess_cli import run_cli, run_cli_process
from quorumlog import node as cluster
from quorumlog import rpc
from quorumlog.bookie import run_bookie
from quorumlog.errors import DeadlineExceededError, TransientError
from quorumlog.meta import MetaClient
from quorumlog.proto import (
    BOOKIE_REGISTRY_PREFIX,
    AddEntryRequest,
    BookieRegistration,
    GcRequest,
    NoSuchLedgerError,
    ReadOnlyError,
    ledger_key,
)

DEADLINE_S = 30.0


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args)  # in this process: about a second less a command


@pytest.fixture(scope="module")
def three_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    directory = tmp_path_factory.mktemp("bookies") / "cluster"
    out = run_cli_process("up", "--nodes", "3", "--dir", str(directory), timeout_s=120)
    assert out.returncode == 0, out.stderr
    try:
        yield directory
    finally:
        cluster.down(directory)


def test_up_three_nodes_lists_three_writable_bookies(three_nodes: Path) -> None:
    out = _cli("bookie", "list", "--json", "--dir", str(three_nodes))
    assert out.returncode == 0, out.stderr
    bookies = json.loads(out.stdout)["bookies"]
    addresses = sorted(n.address for n in cluster.load(three_nodes))
    assert sorted(b["address"] for b in bookies) == addresses
    for b in bookies:
        assert b["id"] == b["address"] and b["read_only"] is False
        assert b["labels"]["rack"].startswith("rack-") and b["labels"]["zone"] == "zone-1"
    status = json.loads(_cli("status", "--json", "--dir", str(three_nodes)).stdout)["nodes"]
    assert [n["roles"] for n in status] == [["meta", "bookie", "table"]] * 3
    assert all(n["bookie"]["state"] == "writable" for n in status)
    assert sum(1 for n in status if n["meta_role"] == "leader") == 1


def test_bookie_cli_info_ledger_gc_scrub(three_nodes: Path) -> None:
    address = cluster.load(three_nodes)[0].address

    async def write() -> None:
        async with MetaClient(cluster.meta_addresses(three_nodes)) as meta:
            await meta.put(ledger_key(424242), b"cli test ledger")
        conn = await connect(address)
        await asyncio.gather(*(add(conn, 424242, e) for e in range(20)))
        await conn.close()

    rpc.run(write())
    info = _cli("bookie", "info", "--bookie", address, "--json")
    assert info.returncode == 0, info.stderr
    data = json.loads(info.stdout)
    assert data["registered"] and not data["read_only"] and data["bookie_id"] == address
    ledger = json.loads(_cli("bookie", "ledger", "424242", "--bookie", address, "--json").stdout)
    assert ledger == {"ledger_id": 424242, "exists": True, "fenced": False, "lac": 18,
                      "last_entry_id": 19}
    assert _cli("bookie", "ledger", "1", "--bookie", address).returncode == 1
    gc = _cli("bookie", "gc", "--bookie", address, "--json")
    assert gc.returncode == 0, gc.stderr
    assert json.loads(gc.stdout)["deleted_ledgers"] == 0  # its key is in meta
    scrub = _cli("bookie", "scrub", "--bookie", address, "--json")
    assert scrub.returncode == 0, scrub.stderr
    assert json.loads(scrub.stdout)["ok"] is True
    for command in ("list", "info", "ledger", "gc", "scrub", "sanity"):
        assert _cli("bookie", command, "--help").returncode == 0


def test_bookie_sanity_writes_reads_and_deletes_a_ledger_on_each_bookie(
        three_nodes: Path) -> None:
    from quorumlog.errors import UsageError
    from quorumlog.ledger import LedgerClient

    addresses = sorted(n.address for n in cluster.load(three_nodes))
    meta = cluster.meta_addresses(three_nodes)

    async def ledger_ids() -> list[int]:
        client = await LedgerClient.connect(meta)
        try:
            return sorted(await client.list_ledgers())
        finally:
            await client.close()

    before = rpc.run(ledger_ids())
    checked = _cli("bookie", "sanity", "--entries", "20", "-o", "json", "--dir", str(three_nodes))
    assert checked.returncode == 0, checked.stderr
    rows = json.loads(checked.stdout)["bookies"]
    assert sorted(r["bookie"] for r in rows) == addresses
    assert all(r["ok"] and r["error"] is None and r["write_ms"] > 0 for r in rows), rows
    assert rpc.run(ledger_ids()) == before  # each sanity ledger was deleted again
    refused = _cli("bookie", "sanity", "127.0.0.1:1", addresses[0], "-o", "json",
                   "--dir", str(three_nodes))
    assert refused.returncode == 1  # one bookie failed it: the rows say which and why
    bad, good = json.loads(refused.stdout)["bookies"]
    assert (bad["bookie"], bad["ok"], good["ok"]) == ("127.0.0.1:1", False, True)
    assert "not registered" in bad["error"]
    table = _cli("bookie", "sanity", "127.0.0.1:1", "--dir", str(three_nodes))
    assert table.returncode == 1 and "FAILED" in table.stdout, table.stdout

    async def pinned() -> None:  # the API under it: an ensemble given, not placed
        client = await LedgerClient.connect(meta)
        try:
            handle = await client.create_ledger(2, 2, 2, bookies=addresses[1:])
            assert handle.metadata.ensembles[0].bookies == tuple(addresses[1:])
            await handle.close()
            await client.delete_ledger(handle.id)
            for bad in ([addresses[0]], [addresses[0]] * 2, ["127.0.0.1:1", addresses[0]]):
                with pytest.raises(UsageError):
                    await client.create_ledger(2, 2, 2, bookies=bad)
        finally:
            await client.close()

    rpc.run(pinned())


def _log_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in (directory / "ledgers").glob("*.log"))


def test_gc_deletes_ledgers_gone_from_meta_and_disk_usage_drops(
        three_nodes: Path, tmp_path: Path) -> None:
    meta_addresses = cluster.meta_addresses(three_nodes)
    config = small_bookie_config(tmp_path / "gc-bookie")
    ledgers = [9001, 9002, 9003, 9004]
    entries = 150

    async def main() -> None:
        async with MetaClient(meta_addresses) as meta, run_bookie(
                config, meta_addresses) as bookie:
            for lid in ledgers:
                await meta.put(ledger_key(lid), b"gc test ledger")
            conn = await connect(bookie.address)
            for lid in ledgers:  # one ledger after the other: whole entry logs per ledger
                await asyncio.gather(*(add(conn, lid, e) for e in range(entries)))
                await bookie.service.flush()
            before = _log_bytes(tmp_path / "gc-bookie")
            # A GC now deletes nothing: every ledger has its key.
            assert (await conn.call(GcRequest())).deleted_ledgers == 0
            for lid in ledgers[:2]:
                await meta.delete(ledger_key(lid))
            result = await conn.call(GcRequest(), timeout_s=60)
            assert result.deleted_ledgers == 2
            assert result.compacted_logs >= 1 and result.reclaimed_bytes > 0
            after = _log_bytes(tmp_path / "gc-bookie")
            assert after < before * 0.75, (before, after)
            for lid in ledgers[:2]:
                with pytest.raises(NoSuchLedgerError):
                    await read(conn, lid, 0)
            for lid in ledgers[2:]:
                datas = await asyncio.gather(*(read(conn, lid, e) for e in range(entries)))
                for e, data in enumerate(datas):
                    check_entry(data, lid, e)
            assert bookie.service.counters.gc_reclaimed_bytes >= result.reclaimed_bytes
            await conn.close()

    rpc.run(main())


@pytest.fixture
def one_node(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "single"
    cluster.up(directory, 1)
    try:
        yield directory
    finally:
        node = cluster.load(directory)[0]
        os.kill(node.pid, signal.SIGCONT)  # in case the test stopped it
        cluster.down(directory)


async def _wait(condition: Callable[[], bool], what: str,
                state: Callable[[], str] = lambda: "") -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while not condition():
        assert loop.time() < deadline, f"timed out waiting for {what} {state()}"
        await asyncio.sleep(0.02)


def test_registration_lost_refuses_adds_until_registered_again(
        one_node: Path, tmp_path: Path) -> None:
    meta_addresses = cluster.meta_addresses(one_node)
    meta_pid = cluster.load(one_node)[0].pid
    config = small_bookie_config(tmp_path / "reg-bookie", labels={"rack": "r9"})

    async def main() -> None:
        async with MetaClient(meta_addresses) as meta, run_bookie(
                config, meta_addresses) as bookie:
            service = bookie.service

            def state() -> str:
                reg = service._registration
                return (f"(registered={service.registered}, session={service.session_id}, "
                        f"registrations={reg.registrations if reg else None})")

            key = BOOKIE_REGISTRY_PREFIX + bookie.address
            kv = await meta.get(key)
            assert kv is not None and kv.session_id == service.session_id
            reg = BookieRegistration.decode(kv.value)
            assert reg.labels == {"rack": "r9"} and not reg.read_only
            conn = await connect(bookie.address)
            await add(conn, 77, 0)
            # 1. The session is revoked in meta: the bookie notices and registers again.
            first = service.session_id
            await meta.revoke_session(first)
            await _wait(lambda: service.registered and service.session_id != first,
                        "a new registration after the session was revoked", state)
            kv = await meta.get(key)
            assert kv is not None and kv.session_id == service.session_id
            await add(conn, 77, 1)
            # 2. Meta unreachable (stopped) for more than a TTL: adds are refused.
            os.kill(meta_pid, signal.SIGSTOP)
            try:
                await _wait(lambda: not service.registered, "the bookie to unregister", state)
                with pytest.raises(ReadOnlyError, match="not registered") as refused:
                    await add(conn, 77, 2)
                assert refused.value.retriable
                check_entry(await read(conn, 77, 1), 77, 1)  # reads are still served
            finally:
                os.kill(meta_pid, signal.SIGCONT)
            # Once meta is back the bookie is registered again: under the same
            # session if a keep-alive reached meta before meta expired it, or
            # under a new one; either way the key names the session it holds.
            await _wait(lambda: service.registered, "registration once meta is back", state)
            await add(conn, 77, 2)
            kv = await meta.get(key)
            assert kv is not None and kv.session_id == service.session_id
            await conn.close()
        # Closing the bookie revokes its session: the key is gone at once.
        async with MetaClient(meta_addresses) as meta:
            assert await meta.get(key) is None

    rpc.run(main())


def test_bookie_whose_meta_never_answers_never_serves(tmp_path: Path) -> None:
    """Without meta's answer a bookie cannot check its identity (cookie): it serves
    nothing (retriable errors), and start fails, retriable, after
    identity_check_timeout_ms, naming meta."""
    config = small_bookie_config(tmp_path / "lonely", identity_check_timeout_ms=1500)

    async def main() -> None:
        from quorumlog.bookie import BookieService

        service = BookieService(config, meta_addresses=["127.0.0.1:1"])
        server = rpc.Server(service.handlers())
        await server.start("127.0.0.1", 0)
        address = f"127.0.0.1:{server.port}"
        starting = asyncio.get_running_loop().create_task(service.start(address))
        try:
            conn = await connect(address)
            with pytest.raises(TransientError, match="starting") as refused:
                await conn.call(AddEntryRequest(ledger_id=1, entry_id=0, master_key=KEY),
                                payload=b"x", timeout_s=5)
            assert refused.value.retriable
            with pytest.raises(TransientError, match="starting"):
                await read(conn, 1, 0)  # not "no such entry": it does not know yet
            await conn.close()
            with pytest.raises(DeadlineExceededError,
                               match=r"could not check its identity .* 127\.0\.0\.1:1"):
                await starting
        finally:
            await server.close()
            await service.close()

    rpc.run(main())


def test_listings_fit_80_columns_and_speak_json_and_yaml(three_nodes: Path) -> None:
    """Issue 18: at 80 columns every column of `status` ended in "…". The
    default table now fits (cells wrap, nothing is cut), -o wide adds columns,
    -o json and -o yaml carry the raw values."""
    import yaml

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, "--dir", str(three_nodes))

    addresses = [n.address for n in cluster.load(three_nodes)]
    for command in (("status",), ("bookie", "list")):
        table = run(*command)
        assert table.returncode == 0, table.stderr
        lines = table.stdout.splitlines()
        assert max(len(line) for line in lines) <= 80 and "…" not in table.stdout
        assert all(address in table.stdout for address in addresses)  # never broken
        wide = run(*command, "-o", "wide")
        assert wide.returncode == 0 and "…" not in wide.stdout
        assert len(wide.stdout.splitlines()[1]) > len(lines[1])  # more columns
        as_json = json.loads(run(*command, "-o", "json").stdout)
        as_yaml = yaml.safe_load(run(*command, "-o", "yaml").stdout)
        # Same rows and fields (a live cluster's indexes move between the calls).
        assert as_yaml.keys() == as_json.keys()
        (key,) = as_json
        assert [sorted(row) for row in as_yaml[key]] == [sorted(row) for row in as_json[key]]
        assert [row["address"] for row in as_yaml[key]] == [
            row["address"] for row in as_json[key]]
    nodes = json.loads(run("status", "-o", "json").stdout)["nodes"]
    assert {n["address"] for n in nodes} == set(addresses)
    assert all(isinstance(n["bookie"]["disk_usage"], float) for n in nodes)  # raw, not "12%"
    assert "%" in run("status").stdout  # human in the table
    bad = run("status", "-o", "xml")
    assert bad.returncode != 0 and "expected one of" in bad.stderr and "Traceback" not in bad.stderr
