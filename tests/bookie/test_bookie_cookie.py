"""Bookie identity (cookies): a bookie whose directories were wiped, swapped or
restored from an old copy refuses to start as its old self.

Real bookies (``run_bookie``: rpc server + BookieService, real RocksDB) on
127.0.0.1 against a real meta node process (``quorumlog up --nodes 1``);
``decide`` is also checked alone, as a table. Before cookies, every refused
start here started and answered "no such entry" for acknowledged entries (or,
with only the journal gone, failed with advice that led to the same place).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from server_helpers import add, check_entry, connect, read, small_bookie_config

from quorumlog import node as cluster
from quorumlog import rpc
from quorumlog.bookie import (
    BookieConfig,
    BookieService,
    Cookie,
    InvalidCookieError,
    LimboRecord,
    cookie_key,
    limbo_key,
    plan_format,
    run_bookie,
    run_format,
)
from quorumlog.bookie._cookie import (
    COOKIE_FILE,
    DirectoryCookie,
    DirectoryRole,
    DirectoryState,
    Verdict,
    decide,
    read_directory,
)
from quorumlog.errors import ConfigError, StorageError
from quorumlog.meta import BlockingMetaClient, MetaClient
from quorumlog.node._cluster import free_port
from quorumlog.proto import (
    BOOKIE_REGISTRY_PREFIX,
    LEDGER_ID_COUNTER,
    BookieRegistration,
    BookieStatusRequest,
    EntryInLimboError,
    NoSuchEntryError,
    NoSuchLedgerError,
)

T = TypeVar("T")
LEDGER = 31
ENTRIES = 40
TEST_DEADLINE_S = 60.0
CLI_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def meta(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    with cluster.running(tmp_path_factory.mktemp("cookie-meta") / "cluster", 1) as addresses:
        yield addresses


def run(coro: Coroutine[Any, Any, T]) -> T:
    async def bounded() -> T:
        async with asyncio.timeout(TEST_DEADLINE_S):
            return await coro

    return rpc.run(bounded())


async def write(config: BookieConfig, meta: list[str], port: int) -> str:
    """Start, add ENTRIES entries to LEDGER, stop (flushed); the instance id."""
    async with run_bookie(config, meta, port=port) as bookie:
        conn = await connect(bookie.address)
        await asyncio.gather(*(add(conn, LEDGER, e) for e in range(ENTRIES)))
        await conn.close()
        return bookie.service.instance_id


async def read_back(config: BookieConfig, meta: list[str], port: int) -> str:
    """Start, check every entry of LEDGER reads back, stop; the instance id."""
    async with run_bookie(config, meta, port=port) as bookie:
        conn = await connect(bookie.address)
        for e in range(ENTRIES):
            check_entry(await read(conn, LEDGER, e), LEDGER, e)
        await conn.close()
        return bookie.service.instance_id


async def refused(config: BookieConfig, meta: list[str], port: int) -> str:
    """Start must fail with InvalidCookieError; its message."""
    with pytest.raises(InvalidCookieError) as error:
        async with run_bookie(config, meta, port=port):
            pass
    return error.value.message


def meta_cookie(meta: list[str], bookie_id: str) -> Cookie | None:
    with BlockingMetaClient(meta) as client:
        kv = client.get(cookie_key(bookie_id))
    return None if kv is None else Cookie.decode(kv.value, source="meta")


def address(port: int) -> str:
    return f"127.0.0.1:{port}"


# ---------------------------------------------------------------------- restarts


def test_first_start_stamps_directories_and_meta_and_restart_keeps_the_instance(
        meta: list[str], tmp_path: Path) -> None:
    config, port = small_bookie_config(tmp_path / "b"), free_port()

    async def main() -> None:
        first = await write(config, meta, port)
        async with run_bookie(config, meta, port=port) as bookie:
            assert bookie.service.instance_id == first
            async with MetaClient(meta) as client:
                kv = await client.get(BOOKIE_REGISTRY_PREFIX + bookie.address)
                assert kv is not None
                assert BookieRegistration.decode(kv.value).instance_id == first
            conn = await connect(bookie.address)
            status = await conn.call(BookieStatusRequest())
            assert status.instance_id == first
            for e in range(ENTRIES):
                check_entry(await read(conn, LEDGER, e), LEDGER, e)
            await conn.close()

    run(main())
    stored = meta_cookie(meta, address(port))
    assert stored is not None and stored.bookie_id == address(port)
    copies = {role: read_directory(role, path) for role, path in (
        (DirectoryRole.JOURNAL, Path(config.journal_dir)),
        (DirectoryRole.LEDGER, Path(config.ledger_dir)),
        (DirectoryRole.INDEX, Path(config.ledger_dir) / "index"))}
    for role, state in copies.items():
        assert state.copy is not None and state.copy.role == role
        assert state.copy.cookie == stored
        assert not state.blank


def test_wiped_journal_refuses_and_the_message_names_the_fix(
        meta: list[str], tmp_path: Path) -> None:
    config, port = small_bookie_config(tmp_path / "b"), free_port()
    run(write(config, meta, port))
    shutil.rmtree(config.journal_dir)
    message = run(refused(config, meta, port))
    bookie_id = address(port)
    assert f"bookie {bookie_id} refuses to start" in message
    assert f"journal directory {config.journal_dir} (empty) has no cookie" in message
    assert "wiped or replaced" in message and '"no such entry"' in message
    assert f"quorumlog bookie format --force {bookie_id} --config" in message
    # It did not register, and meta still knows the old instance.
    with BlockingMetaClient(meta) as client:
        assert client.get(BOOKIE_REGISTRY_PREFIX + bookie_id) is None
    assert meta_cookie(meta, bookie_id) is not None


def test_wiped_journal_and_index_refuses(meta: list[str], tmp_path: Path) -> None:
    """Entry logs kept, index and journal gone: before cookies the bookie started
    empty (checkpoint 0, logs without index records dropped)."""
    config, port = small_bookie_config(tmp_path / "b"), free_port()
    run(write(config, meta, port))
    shutil.rmtree(config.journal_dir)
    shutil.rmtree(Path(config.ledger_dir) / "index")
    message = run(refused(config, meta, port))
    assert "journal directory" in message and "index directory" in message
    assert "have no cookie" in message


def test_wiped_disks_refuse(meta: list[str], tmp_path: Path) -> None:
    config, port = small_bookie_config(tmp_path / "b"), free_port()
    instance = run(write(config, meta, port))
    shutil.rmtree(config.journal_dir)
    shutil.rmtree(config.ledger_dir)
    message = run(refused(config, meta, port))
    assert "all its directories are empty" in message
    assert f"meta records instance {instance}" in message
    assert f"quorumlog bookie format --force {address(port)}" in message


def test_swapped_directories_of_two_bookies_refuse(meta: list[str], tmp_path: Path) -> None:
    a, b = small_bookie_config(tmp_path / "a"), small_bookie_config(tmp_path / "b")
    port_a, port_b = free_port(), free_port()
    run(write(a, meta, port_a))
    run(write(b, meta, port_b))
    message = run(refused(b, meta, port_a))  # bookie A on B's directories
    assert f"holds the cookie of bookie {address(port_b)}" in message
    assert "swapped" in message
    # Half swapped: A's journal with B's ledgers.
    mixed = a.replace(ledger_dir=b.ledger_dir)
    message = run(refused(mixed, meta, port_a))
    assert f"holds the cookie of bookie {address(port_b)}" in message
    # Each bookie on its own directories is fine.
    run(read_back(a, meta, port_a))
    run(read_back(b, meta, port_b))


def test_journal_and_ledger_directories_swapped_in_the_config_refuse(
        meta: list[str], tmp_path: Path) -> None:
    config, port = small_bookie_config(tmp_path / "b"), free_port()
    run(write(config, meta, port))
    swapped = config.replace(journal_dir=config.ledger_dir, ledger_dir=config.journal_dir)
    message = run(refused(swapped, meta, port))
    assert "holds the cookie written for its ledger directory" in message
    run(read_back(config, meta, port))


def test_old_copy_of_the_disks_refuses(meta: list[str], tmp_path: Path) -> None:
    """Formatted and re-added (instance 2); then instance 1's disks come back."""
    config, port = small_bookie_config(tmp_path / "b"), free_port()
    first = run(write(config, meta, port))
    backup = tmp_path / "backup"
    shutil.copytree(tmp_path / "b", backup)
    with BlockingMetaClient(meta) as client:
        run_format(client, plan_format(client, address(port), config))
    second = run(write(config, meta, port))
    assert second != first
    shutil.rmtree(tmp_path / "b")
    shutil.copytree(backup, tmp_path / "b")
    message = run(refused(config, meta, port))
    assert f"hold instance {first}" in message and f"meta records instance {second}" in message


def test_data_whose_cookie_was_deleted_in_meta_refuses(meta: list[str], tmp_path: Path) -> None:
    config, port = small_bookie_config(tmp_path / "b"), free_port()
    run(write(config, meta, port))
    with BlockingMetaClient(meta) as client:
        assert client.delete(cookie_key(address(port))) == 1
    message = run(refused(config, meta, port))
    assert "meta has no cookie" in message and "without wiping these directories" in message


def test_data_from_before_cookies_is_adopted(meta: list[str], tmp_path: Path) -> None:
    """Directories with data and no cookie anywhere (written by a version without
    cookies): the bookie stamps a new instance and keeps serving its data."""
    config, port = small_bookie_config(tmp_path / "b"), free_port()
    first = run(write(config, meta, port))
    for directory in (config.journal_dir, config.ledger_dir, f"{config.ledger_dir}/index"):
        (Path(directory) / COOKIE_FILE).unlink()
    with BlockingMetaClient(meta) as client:
        client.delete(cookie_key(address(port)))
    adopted = run(read_back(config, meta, port))
    assert adopted and adopted != first
    stored = meta_cookie(meta, address(port))
    assert stored is not None and stored.instance_id == adopted


def test_two_processes_claiming_one_bookie_id_only_one_starts(
        meta: list[str], tmp_path: Path) -> None:
    bookie_id = address(free_port())
    configs = [small_bookie_config(tmp_path / name) for name in ("x", "y")]

    async def main() -> None:
        services = [BookieService(c, meta_addresses=meta) for c in configs]
        try:
            results = await asyncio.gather(*(s.start(bookie_id) for s in services),
                                           return_exceptions=True)
            errors = [r for r in results if isinstance(r, BaseException)]
            assert len(errors) == 1 and isinstance(errors[0], InvalidCookieError), results
            winner = services[results.index(None)]
            stored = meta_cookie(meta, bookie_id)
            assert stored is not None and stored.instance_id == winner.instance_id
        finally:
            for service in services:
                await service.close()

    run(main())


# ---------------------------------------------------------------------- format


def node_toml(path: Path, config: BookieConfig, port: int, meta: list[str]) -> Path:
    """A node config for an in-process bookie, as its operator would have."""
    members = ", ".join(f'"{i}={a}"' for i, a in enumerate(meta, start=1))
    path.write_text(
        f'[node]\nid = 9\ndata_dir = "{path.parent}"\nlisten = "{address(port)}"\n'
        f'roles = ["bookie"]\n\n[meta]\nmembers = [{members}]\nbootstrap = false\n\n'
        f'[bookie]\njournal_dir = "{config.journal_dir}"\nledger_dir = "{config.ledger_dir}"\n')
    return path


def cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """Run the CLI; its output with whitespace runs as single spaces (rich wraps lines)."""
    out = subprocess.run([sys.executable, "-m", "quorumlog", *args], capture_output=True,
                         text=True, input=stdin, timeout=CLI_TIMEOUT_S)
    return subprocess.CompletedProcess(out.args, out.returncode, " ".join(out.stdout.split()),
                                       " ".join(out.stderr.split()))


def test_format_then_start_comes_up_as_a_new_instance_and_serves(
        meta: list[str], tmp_path: Path) -> None:
    config, port = small_bookie_config(tmp_path / "b"), free_port()
    old = run(write(config, meta, port))
    shutil.rmtree(config.journal_dir)
    run(refused(config, meta, port))
    toml = node_toml(tmp_path / "node.toml", config, port, meta)
    with BlockingMetaClient(meta) as client:  # ledger ids up to past LEDGER were handed out
        client.next_id(LEDGER_ID_COUNTER, LEDGER + 10)
    out = cli("bookie", "format", address(port), "--force", "--yes", "--config", str(toml))
    assert out.returncode == 0, out.stderr
    assert f"bookie {address(port)} formatted" in out.stdout
    assert meta_cookie(meta, address(port)) is None
    assert list(Path(config.ledger_dir).iterdir()) == []
    with BlockingMetaClient(meta) as client:
        kv = client.get(limbo_key(address(port)))
    assert kv is not None
    limbo = LimboRecord.decode(kv.value)
    assert limbo.ledger_id_floor > LEDGER + 1 and limbo.previous_instance_id == old
    young = limbo.ledger_id_floor + 5  # created after the format: never named the old one

    async def main() -> None:
        async with run_bookie(config, meta, port=port) as bookie:
            new = bookie.service.instance_id
            assert new and new != old
            async with MetaClient(meta) as client:
                kv = await client.get(BOOKIE_REGISTRY_PREFIX + bookie.address)
                assert kv is not None and BookieRegistration.decode(kv.value).instance_id == new
            conn = await connect(bookie.address)
            # Empty: the old entries are not claimed, and never denied either
            # (limbo): recovery must not count this bookie's answer as "no such entry".
            with pytest.raises(EntryInLimboError, match="may have been lost"):
                await read(conn, LEDGER, 0)
            await add(conn, LEDGER + 1, 0)
            check_entry(await read(conn, LEDGER + 1, 0), LEDGER + 1, 0)
            with pytest.raises(EntryInLimboError):
                await read(conn, LEDGER + 1, 1)  # an old ledger: maybe lost
            await add(conn, young, 0)
            with pytest.raises(NoSuchEntryError):
                await read(conn, young, 1)  # a young ledger: a plain negative
            with pytest.raises(NoSuchLedgerError):
                await read(conn, young + 1, 0)
            await conn.close()

    run(main())
    stored = meta_cookie(meta, address(port))
    assert stored is not None and stored.instance_id != old


def test_format_needs_force_asks_first_and_refuses_a_running_bookie(
        meta: list[str], tmp_path: Path) -> None:
    config, port = small_bookie_config(tmp_path / "b"), free_port()
    bookie_id = address(port)
    instance = run(write(config, meta, port))
    toml = node_toml(tmp_path / "node.toml", config, port, meta)
    help_text = cli("bookie", "format", "--help")
    assert help_text.returncode == 0
    assert "--force" in help_text.stdout and "--yes" in help_text.stdout
    no_force = cli("bookie", "format", bookie_id, "--config", str(toml))
    assert no_force.returncode == 1 and "pass --force" in no_force.stderr
    declined = cli("bookie", "format", bookie_id, "--force", "--config", str(toml), stdin="n\n")
    assert declined.returncode == 1, declined.stdout
    assert f"delete its cookie in meta: instance {instance}" in declined.stdout
    assert "Aborted" in declined.stdout + declined.stderr
    stored = meta_cookie(meta, bookie_id)
    assert stored is not None and stored.instance_id == instance  # nothing done
    assert (Path(config.journal_dir) / COOKIE_FILE).exists()
    other = cli("bookie", "format", address(free_port()), "--force", "--config", str(toml))
    assert other.returncode == 1 and "is not the config of bookie" in other.stderr

    async def while_running() -> None:
        async with run_bookie(config, meta, port=port):
            running = await asyncio.to_thread(
                cli, "bookie", "format", bookie_id, "--force", "--yes", "--config", str(toml))
            assert running.returncode == 1
            assert "is registered in meta, so it is running" in running.stderr

    run(while_running())
    run(read_back(config, meta, port))


# ---------------------------------------------------------------------- decide, alone


def _cookie(instance: str = "i1", bookie_id: str = "b:1") -> Cookie:
    return Cookie(bookie_id=bookie_id, instance_id=instance, journal_dir="/j",
                  ledger_dir="/l", created_at_ms=0)


def _dirs(*copies: Cookie | None, blank: bool = False,
          roles: tuple[DirectoryRole, ...] = tuple(DirectoryRole)) -> list[DirectoryState]:
    return [DirectoryState(role, Path(f"/{role}"), None if c is None else
                           DirectoryCookie(role=role, cookie=c), blank=blank)
            for role, c in zip(roles, copies, strict=True)]


C1, C2 = _cookie("i1"), _cookie("i2")
DECISIONS: list[tuple[str, list[DirectoryState], Cookie | None, bool, Verdict | str]] = [
    ("new bookie", _dirs(None, None, None, blank=True), None, True, Verdict.NEW),
    ("stamped, claim lost in a crash", _dirs(C1, C1, None, blank=True), None, True,
     Verdict.NEW),
    ("restart", _dirs(C1, C1, C1), C1, True, Verdict.KEEP),
    ("stamped and claimed, nothing written", _dirs(C1, C1, C1, blank=True), C1, True,
     Verdict.KEEP),
    ("before cookies", _dirs(None, None, None), None, True, Verdict.ADOPT),
    ("disks wiped", _dirs(None, None, None, blank=True), C1, True,
     "all its directories are empty"),
    ("other data, no cookie", _dirs(None, None, None), C1, True, "hold data but no cookie"),
    ("journal wiped", [*_dirs(None, blank=True, roles=(DirectoryRole.JOURNAL,)),
                       *_dirs(C1, C1, roles=(DirectoryRole.LEDGER, DirectoryRole.INDEX))],
     C1, True, "journal directory /journal (empty) has no cookie"),
    ("mixed instances", _dirs(C1, C2, C1), C1, True, "cookies of different instances"),
    ("old copy", _dirs(C1, C1, C1), C2, True, "meta records instance i2"),
    ("meta cookie deleted", _dirs(C1, C1, C1), None, True, "meta has no cookie"),
    ("another bookie's", _dirs(*[_cookie(bookie_id="b:2")] * 3), None, True,
     "holds the cookie of bookie b:2"),
    ("role swapped", [DirectoryState(role, Path(f"/{role}"),
                                     DirectoryCookie(role=written, cookie=C1), blank=False)
                      for role, written in zip(DirectoryRole, (DirectoryRole.LEDGER,
                                                               DirectoryRole.JOURNAL,
                                                               DirectoryRole.INDEX), strict=True)],
     C1, True, "journal directory /journal holds the cookie written for its ledger directory"),
    ("no meta: restart on another port", _dirs(*[_cookie(bookie_id="b:2")] * 3), None, False,
     Verdict.KEEP),
    ("no meta: journal wiped", [*_dirs(None, blank=True, roles=(DirectoryRole.JOURNAL,)),
                                *_dirs(C1, C1, roles=(DirectoryRole.LEDGER,
                                                      DirectoryRole.INDEX))],
     None, False, "has no cookie"),
    ("no meta: new", _dirs(None, None, None, blank=True), None, False, Verdict.NEW),
]


@pytest.mark.parametrize(("case", "directories", "meta_cookie", "with_meta", "expected"),
                         DECISIONS, ids=[d[0] for d in DECISIONS])
def test_decide(case: str, directories: list[DirectoryState], meta_cookie: Cookie | None,
                with_meta: bool, expected: Verdict | str) -> None:
    if isinstance(expected, Verdict):
        verdict, _ = decide("b:1", directories, meta_cookie, with_meta=with_meta)
        assert verdict is expected
    else:
        with pytest.raises(InvalidCookieError, match="bookie b:1 refuses to start") as error:
            decide("b:1", directories, meta_cookie, with_meta=with_meta)
        assert expected in error.value.message
        assert "quorumlog bookie format --force b:1" in error.value.message or (
            "Swap them back" in error.value.message)


def test_damaged_cookie_file_refuses(meta: list[str], tmp_path: Path) -> None:
    config, port = small_bookie_config(tmp_path / "b"), free_port()
    run(write(config, meta, port))
    path = Path(config.ledger_dir) / COOKIE_FILE
    data = bytearray(path.read_bytes())
    data[data.index(b"instance_id") + 20] ^= 0x01  # one flipped bit inside the body
    path.write_bytes(bytes(data))
    message = run(refused(config, meta, port))
    assert f"cookie in {path} is damaged" in message and "CRC32C" in message


def test_bad_directories_get_clear_errors_not_tracebacks(tmp_path: Path) -> None:
    config = small_bookie_config(tmp_path / "b")
    with pytest.raises(ConfigError, match="must be different directories"):
        BookieService(config.replace(journal_dir=config.ledger_dir), meta_addresses=None)
    with pytest.raises(ConfigError, match="its index directory"):
        BookieService(config.replace(journal_dir=f"{config.ledger_dir}/index"),
                      meta_addresses=None)
    Path(config.journal_dir).parent.mkdir(parents=True)
    Path(config.journal_dir).write_text("a file, not a directory")

    async def main() -> None:
        with pytest.raises(StorageError, match="cannot read the bookie's journal directory"):
            async with run_bookie(config):
                pass

    run(main())
