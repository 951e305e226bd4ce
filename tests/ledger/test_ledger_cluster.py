"""The ledger client against real node processes on 127.0.0.1.

Four nodes (meta on the first three, a bookie on each): a bookie killed with
SIGKILL mid-stream is replaced by an ensemble change and no acknowledged
entry is lost; a writer process killed mid-stream is recovered by another
process with every acknowledged entry; a writer stopped with SIGSTOP and
resumed after a recovery gets LedgerFencedError; bad input gets clear errors;
the ``quorumlog ledger`` commands work end to end.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from quorumlog import node as cluster
from quorumlog import proto as wire
from quorumlog import rpc
from quorumlog.errors import QuorumlogError, UsageError
from quorumlog.ledger import LedgerClient, LedgerClosedError, ReadPastLacError
from quorumlog.node import _cluster
from quorumlog.proto import BadEnvelopeError, NoSuchLedgerError, UnauthorizedError

from .ledger_writer_child import PASSWORD, payload

CHILD = Path(__file__).parent / "ledger_writer_child.py"
DEADLINE_S = 30.0


@pytest.fixture(scope="module")
def four_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    directory = tmp_path_factory.mktemp("ledger") / "cluster"
    cluster.up(directory, 4)
    try:
        yield directory
    finally:
        cluster.down(directory)


def _meta(directory: Path) -> list[str]:
    return cluster.meta_addresses(directory)


def _wait(condition: Callable[[], bool], what: str, timeout_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


class Child:
    """A writer process whose stdout lines are collected by a thread."""

    def __init__(self, directory: Path, shape: tuple[int, int, int], entries: int,
                 pace_ms: float) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), ",".join(_meta(directory)), *map(str, shape),
             str(entries), str(pace_ms)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.strip())

    @property
    def ledger_id(self) -> int:
        return next(int(x.split()[1]) for x in self.lines if x.startswith("ledger "))

    @property
    def acks(self) -> list[int]:
        return [int(x.split()[1]) for x in list(self.lines) if x.startswith("ack ")]

    def finish(self) -> tuple[int, str]:
        code = self.proc.wait(timeout=DEADLINE_S)
        self._reader.join(timeout=5)
        assert self.proc.stderr is not None
        return code, self.proc.stderr.read()


def _node_of(directory: Path, address: str) -> cluster.NodeInfo:
    return next(n for n in cluster.load(directory) if n.address == address)


async def _read_all(client: LedgerClient, ledger_id: int, password: bytes) -> list[bytes]:
    handle = await client.open_ledger(ledger_id, password=password)
    if handle.last_add_confirmed < 0:
        return []
    return [e.payload for e in await handle.read_batch(0, handle.last_add_confirmed)]


async def _until_dead(pid: int, deadline_s: float = 30.0) -> None:
    """Until the SIGKILLed child ``pid`` has exited (the cluster's own check reaps it)."""
    deadline = time.monotonic() + deadline_s
    while _cluster._alive(pid):
        assert time.monotonic() < deadline, f"process {pid} alive {deadline_s} s after SIGKILL"
        await asyncio.sleep(0.01)


def test_sigkill_bookie_mid_stream_changes_ensemble(four_nodes: Path) -> None:
    killed: list[cluster.NodeInfo] = []

    async def main() -> None:
        async with LedgerClient.connect(_meta(four_nodes)) as client:
            handle = await client.create_ledger(3, 3, 2, password=PASSWORD)
            # Kill a bookie-only node if it is in the ensemble (meta keeps 3 members).
            ensemble = handle.metadata.current_ensemble
            nodes = [_node_of(four_nodes, b) for b in ensemble]
            victim = max(nodes, key=lambda n: n.id)
            acked: dict[int, bytes] = {}
            futures = []
            for i in range(3000):
                data = payload(i)
                future = handle.append_async(data)
                future.add_done_callback(_record(acked, data))
                futures.append(future)
                if i == 1000:
                    await asyncio.gather(*futures[-200:])
                    os.kill(victim.pid, signal.SIGKILL)
                    killed.append(victim)
                    # The client notices the bookie when it is gone, and Qa = 2
                    # confirms entries without it: keep writing past its death
                    # (a process in fdatasync on a loaded machine dies late).
                    await _until_dead(victim.pid)
                if len(futures) - len(acked) > 256:
                    await futures[len(acked)]
            await asyncio.gather(*futures)
            assert len(acked) == 3000
            # A bookie failure seen after its entry already reached Qa is acted
            # on at the next append (a delayed ensemble change, as BookKeeper's
            # delayEnsembleChange): on a loaded machine the victim's failures
            # can all surface after the 3,000th append was issued. Write on
            # until the change shows, bounded: a client that never notices the
            # dead bookie still fails here.
            deadline = time.monotonic() + 30.0
            while handle.ensemble_changes < 1:
                assert time.monotonic() < deadline, "no ensemble change 30 s after the kill"
                data = payload(len(acked))
                acked[await handle.append(data)] = data
            fragments = handle.metadata.ensembles
            assert len(fragments) >= 2, fragments
            assert victim.address not in fragments[-1].bookies
            assert handle.ensemble_changes >= 1
            await handle.close()
            read_back = await _read_all(client, handle.id, PASSWORD)
            assert read_back == [acked[i] for i in range(len(acked))]

    try:
        rpc.run(main())
    finally:
        for node in killed:
            cluster.restart_node(four_nodes, node.id)
        _wait_bookies(four_nodes, 4)


def _record(acked: dict[int, bytes], data: bytes) -> Callable[[asyncio.Future[int]], None]:
    def done(future: asyncio.Future[int]) -> None:
        if not future.cancelled() and future.exception() is None:
            acked[future.result()] = data

    return done


def _wait_bookies(directory: Path, count: int) -> None:
    """Until ``count`` bookies are registered and every node's bookie answers."""

    async def ready() -> bool:
        from quorumlog.meta import MetaClient

        async with MetaClient(_meta(directory)) as meta:
            if len(await meta.list_keys(wire.BOOKIE_REGISTRY_PREFIX)) < count:
                return False
        pool = rpc.Pool()
        try:
            for node in cluster.load(directory):
                status = await pool.call(node.address, wire.BookieStatusRequest(), timeout_s=2)
                if not status.registered or status.read_only:
                    return False
        except QuorumlogError as exc:
            if not exc.retriable:
                raise
            return False  # not up yet, or starting
        finally:
            await pool.close()
        return True

    _wait(lambda: rpc.run(ready()), f"{count} registered, answering bookies")


def test_writer_process_killed_then_recovered_by_another(four_nodes: Path) -> None:
    child = Child(four_nodes, (3, 3, 2), 1_000_000, 0)
    try:
        _wait(lambda: len(child.acks) >= 2000, "2000 acknowledged entries")
        child.proc.send_signal(signal.SIGKILL)
        child.finish()
    finally:
        if child.proc.poll() is None:
            child.proc.kill()
    acks = child.acks
    ledger_id = child.ledger_id

    async def main() -> None:
        async with LedgerClient.connect(_meta(four_nodes)) as client:
            start = time.monotonic()
            handle = await client.open_ledger(ledger_id, password=PASSWORD)
            took = time.monotonic() - start
            assert handle.is_closed
            last = handle.last_add_confirmed
            assert last >= max(acks), (last, max(acks))
            read_back = [e.payload for e in await handle.read_batch(0, last)]
            assert read_back == [payload(i) for i in range(last + 1)]
            assert took < 10, took
            # A second recovery agrees.
            again = await client.open_ledger(ledger_id, password=PASSWORD)
            assert again.last_add_confirmed == last

    rpc.run(main())


def test_stopped_writer_is_fenced_after_recovery(four_nodes: Path) -> None:
    child = Child(four_nodes, (3, 2, 2), 1_000_000, 2)
    try:
        _wait(lambda: len(child.acks) >= 100, "100 acknowledged entries")
        child.proc.send_signal(signal.SIGSTOP)
        acked_before_stop = len(child.acks)
        ledger_id = child.ledger_id

        async def recover() -> int:
            async with LedgerClient.connect(_meta(four_nodes)) as client:
                handle = await client.open_ledger(ledger_id, password=PASSWORD)
                return handle.last_add_confirmed

        last = rpc.run(recover())
        child.proc.send_signal(signal.SIGCONT)
        code, stderr = child.finish()
    finally:
        if child.proc.poll() is None:
            child.proc.kill()
    errors = [x for x in child.lines if x.startswith("error ")]
    assert code == 3, (code, child.lines[-5:], stderr[-2000:])
    assert errors and errors[0].startswith("error LedgerFencedError"), errors
    acks = child.acks
    assert len(acks) >= acked_before_stop
    assert max(acks) <= last, "the old writer committed past the recovered end"
    assert last >= acks[acked_before_stop - 1]


def test_bad_input_gets_clear_errors(four_nodes: Path) -> None:
    async def main() -> None:
        async with LedgerClient.connect(_meta(four_nodes)) as client:
            with pytest.raises(UsageError, match="ensemble >= write_quorum"):
                await client.create_ledger(2, 3, 2, password=b"p")
            handle = await client.create_ledger(3, 2, 2, password=b"right")
            for i in range(5):
                await handle.append(b"e%d" % i)
            with pytest.raises(UsageError, match="entry_max_bytes"):
                await handle.append(b"x" * (6 * 1024 * 1024))
            with pytest.raises(UnauthorizedError, match="wrong password"):
                await client.open_ledger(handle.id, password=b"wrong")
            with pytest.raises(NoSuchLedgerError, match="does not exist"):
                await client.open_ledger(10**12, password=b"right")
            reader = await client.open_ledger(handle.id, password=b"right", recovery=False)
            with pytest.raises(ReadPastLacError, match="past the last add confirmed"):
                await reader.read_batch(0, 10)
            # A bookie answers garbage with a clear error and keeps serving.
            bookie = handle.metadata.current_ensemble[0]
            pool = rpc.Pool()
            try:
                with pytest.raises(BadEnvelopeError):
                    await pool.call(bookie, wire.AddEntryRequest(
                        ledger_id=handle.id, entry_id=99, master_key=b"k" * 32),
                        payload=b"not an envelope", timeout_s=5)
                with pytest.raises(UnauthorizedError):
                    await pool.call(bookie, wire.FenceRequest(
                        ledger_id=handle.id, master_key=b"wrong-key"), timeout_s=5)
            finally:
                await pool.close()
            assert await handle.append(b"still works") == 5
            await handle.close()
            reopened = await client.open_ledger(handle.id, password=b"right")
            assert reopened.last_add_confirmed == 5
            await client.delete_ledger(handle.id)
            with pytest.raises(NoSuchLedgerError):
                await client.open_ledger(handle.id, password=b"right")
            with pytest.raises(LedgerClosedError, match="closed"):
                await handle.append(b"closed")

    rpc.run(main())


def test_tailing_reader_sees_entries_in_order(four_nodes: Path) -> None:
    async def main() -> None:
        async with LedgerClient.connect(_meta(four_nodes)) as client:
            writer = await client.create_ledger(3, 2, 2, password=b"t")
            reader = await client.open_ledger(writer.id, password=b"t", recovery=False)
            seen: list[bytes] = []

            async def tail() -> None:
                after = -1
                while len(seen) < 200:
                    entry = await reader.wait_for_entry(after=after, timeout_ms=1000)
                    if entry is None:
                        continue
                    assert entry.entry_id == after + 1
                    seen.append(entry.payload)
                    after = entry.entry_id

            tailing = asyncio.ensure_future(tail())
            for i in range(200):
                await writer.append(b"t%d" % i)
                if i % 20 == 0:
                    await asyncio.sleep(0.01)
            await asyncio.wait_for(tailing, timeout=DEADLINE_S)
            assert seen == [b"t%d" % i for i in range(200)]
            await writer.close()

    rpc.run(main())


def _cli(directory: Path, *args: str, stdin: str = "") -> Result:
    """Run ``quorumlog ledger ARGS`` in this process (the real CLI code)."""
    from quorumlog.cli import app

    return CliRunner().invoke(app, ["ledger", *args, "--meta", ",".join(_meta(directory))],
                              input=stdin)


def test_ledger_cli(four_nodes: Path) -> None:
    # One run through the installed entry point; the rest in-process (faster).
    out = subprocess.run(
        [sys.executable, "-m", "quorumlog", "ledger", "create", "--ensemble", "3",
         "--write-quorum", "3", "--ack-quorum", "2", "--password", "P", "--meta",
         ",".join(_meta(four_nodes))], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    ledger_id = out.stdout.strip()
    assert ledger_id.isdigit()
    result = _cli(four_nodes, "append", ledger_id, "--password", "P", stdin="one\ntwo\n")
    assert result.exit_code == 0, result.output
    result = _cli(four_nodes, "append", ledger_id, "--password", "P", stdin="three\n")
    assert "entries 2..2" in result.output, result.output
    result = _cli(four_nodes, "read", ledger_id, "--password", "P")
    assert result.stdout == "one\ntwo\nthree\n", result.output
    result = _cli(four_nodes, "read", ledger_id, "--password", "nope")
    assert isinstance(result.exception, UnauthorizedError)
    result = _cli(four_nodes, "recover", ledger_id, "--password", "P")
    assert result.stdout.strip() == "2", result.output
    result = _cli(four_nodes, "info", ledger_id, "--json")
    assert '"state": "CLOSED"' in result.stdout and '"last_entry_id": 2' in result.stdout
    result = _cli(four_nodes, "list", "--json")
    assert f'"id": {ledger_id},' in result.stdout
    assert _cli(four_nodes, "delete", ledger_id).exit_code == 1  # asks; no answer: aborted
    assert _cli(four_nodes, "delete", ledger_id, stdin="y\n").exit_code == 0
    result = _cli(four_nodes, "info", ledger_id)
    assert isinstance(result.exception, NoSuchLedgerError)
