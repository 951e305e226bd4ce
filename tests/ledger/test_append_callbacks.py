"""Appends whose outcome goes to a callback, and adds sent before the end of
the loop pass (issue 17: the stream writer's path), over simulated bookies on
virtual time.

``append_with_callback`` calls its callback from the code that confirms the
entry (in entry order, after the LAC moved), not a loop pass later as a
future's done-callback; ``send_queued`` sends what was appended so far now.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from quorumlog.errors import QuorumlogError
from quorumlog.ledger import WriteHandle
from quorumlog.ledger._bookie_client import RpcBookieTransport
from quorumlog.proto import ENTRY_OK, WIRE_ERROR_CODES, AddEntriesResponse, LedgerFencedError
from quorumlog.rpc import ConnectionClosedError
from quorumlog.sim import LedgerWorld

from .support import FAST, in_world, wait_until
from .test_add_batching import PW, counting_client


def test_send_queued_sends_before_the_end_of_the_pass() -> None:
    async def test(world: LedgerWorld) -> None:
        c, sent = counting_client(world)
        lh = await c.create_ledger(3, 2, 2, password=PW)
        futures = [lh.append_async(b"e%d" % i) for i in range(6)]
        assert sent.adds == []
        lh.send_queued()
        # No await in between: the requests left in this call, one per bookie.
        assert sorted(e for r in sent.adds for e in r.entry_ids) == sorted(
            [e for e in range(6)] * 2)
        assert len(sent.adds) == 3
        later = lh.append_async(b"later")  # after send_queued: at the end of the pass
        assert len(sent.adds) == 3
        lh.send_queued()
        lh.send_queued()  # nothing queued: a no-op
        assert len(sent.adds) == 5
        assert await asyncio.gather(*futures, later) == list(range(7))
        assert len(sent.adds) == 5  # the cancelled end-of-pass send sent nothing again

    in_world(test)


def test_callbacks_run_in_order_when_confirmed_and_may_append() -> None:
    async def test(world: LedgerWorld) -> None:
        c, _ = counting_client(world)
        lh = await c.create_ledger(3, 2, 2, password=PW)
        outcomes: list[tuple[int, QuorumlogError | None, int]] = []

        def on_done(entry_id: int, error: QuorumlogError | None) -> None:
            # Called by the confirming code: the LAC has already passed the entry.
            outcomes.append((entry_id, error, lh.last_add_confirmed))
            if entry_id == 3:  # appending from inside a callback works
                lh.append_with_callback(b"from-callback", on_done)

        ids = [lh.append_with_callback(b"e%d" % i, on_done) for i in range(5)]
        assert ids == list(range(5))
        await wait_until(lambda: len(outcomes) == 6)
        assert [entry for entry, _, _ in outcomes] == list(range(6))
        assert all(error is None for _, error, _ in outcomes)
        assert all(lac >= entry for entry, _, lac in outcomes)
        await lh.close()
        assert lh.metadata.last_entry_id == 5
        reader = await c.open_ledger(lh.id, password=PW, recovery=False)
        assert [bytes(e.payload) async for e in reader.read(0, 5)] == [
            b"e0", b"e1", b"e2", b"e3", b"e4", b"from-callback"]

    in_world(test)


def test_callbacks_get_the_error_when_the_ledger_is_fenced() -> None:
    async def test(world: LedgerWorld) -> None:
        c, _ = counting_client(world)
        lh = await c.create_ledger(3, 2, 2, password=PW)
        assert await asyncio.gather(*(lh.append_async(b"a") for _ in range(4))) == list(range(4))
        other = world.client("other", FAST)
        recovered = await other.open_ledger(lh.id, password=PW)
        assert recovered.metadata.last_entry_id == 3
        outcomes: list[tuple[int, QuorumlogError | None]] = []
        for _ in range(5):
            lh.append_with_callback(b"b", lambda e, err: outcomes.append((e, err)))
        await wait_until(lambda: len(outcomes) == 5)
        assert [entry for entry, _ in outcomes] == [4, 5, 6, 7, 8]
        assert all(isinstance(error, LedgerFencedError) for _, error in outcomes)
        with pytest.raises(LedgerFencedError):
            lh.append_with_callback(b"c", lambda e, err: None)

    in_world(test)


def test_a_raising_callback_does_not_stop_the_others() -> None:
    async def test(world: LedgerWorld) -> None:
        c, _ = counting_client(world)
        lh: WriteHandle = await c.create_ledger(3, 2, 2, password=PW)
        reported: list[dict[str, Any]] = []
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: reported.append(ctx))
        seen: list[int] = []

        def on_done(entry_id: int, error: QuorumlogError | None) -> None:
            seen.append(entry_id)
            if entry_id == 1:
                raise RuntimeError("a caller's bug")

        for i in range(4):
            lh.append_with_callback(b"e%d" % i, on_done)
        await wait_until(lambda: len(seen) == 4)
        assert seen == [0, 1, 2, 3]
        assert len(reported) == 1 and isinstance(reported[0]["exception"], RuntimeError)
        assert lh.last_add_confirmed == 3

    in_world(test)


class _StubConnection:
    """An rpc connection whose answers the test sets by hand."""

    closed = False

    def __init__(self) -> None:
        self.sent: list[tuple[Any, bytes]] = []
        self.futures: list[asyncio.Future[Any]] = []

    def send_nowait(self, request: Any, *, payload: bytes, timeout_s: float
                    ) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.sent.append((request, payload))
        self.futures.append(future)
        return future


def test_rpc_transport_hands_a_batch_answer_over_from_the_request_callback() -> None:
    """``RpcBookieTransport.add_entries_then`` (what ``WriteHandle`` uses over
    the network): the per-entry outcome reaches ``then`` in the pass after the
    answer, one pass before ``add_entries``'s future does; a whole-request
    failure and an answer for other entries reach it as one error."""

    async def main() -> None:
        connection = _StubConnection()
        transport = RpcBookieTransport(pool=None)  # type: ignore[arg-type]
        transport._connections["b1"] = connection  # type: ignore[assignment]
        got: list[tuple[Any, Any]] = []
        entries = [(4, b"e4"), (5, b"e5")]
        transport.add_entries_then("b1", 7, b"k", entries, flags=0, timeout_s=1.0,
                                   then=lambda errors, error: got.append((errors, error)))
        future = transport.add_entries("b1", 7, b"k", entries, flags=0, timeout_s=1.0)
        via_future: list[Any] = []
        future.add_done_callback(via_future.append)  # what WriteHandle did before
        request, payload = connection.sent[0]
        assert (request.entry_ids, payload) == ([4, 5], b"e4e5")
        fenced = next(code for code, cls in WIRE_ERROR_CODES if cls is LedgerFencedError)
        answer = AddEntriesResponse(ledger_id=7, entry_ids=[4, 5], codes=[ENTRY_OK, fenced],
                                    messages=["", "fenced"])
        for sent in connection.futures:
            sent.set_result((answer, memoryview(b"")))
        await asyncio.sleep(0)
        assert len(got) == 1 and via_future == []  # then: one pass; the future's callback: two
        errors, error = got[0]
        assert error is None and errors[0] is None and isinstance(errors[1], LedgerFencedError)
        await asyncio.sleep(0)
        assert via_future == [future] and isinstance(future.result()[1], LedgerFencedError)

        transport.add_entries_then("b1", 7, b"k", entries, flags=0, timeout_s=1.0,
                                   then=lambda errors, error: got.append((errors, error)))
        connection.futures[-1].set_result((AddEntriesResponse(
            ledger_id=7, entry_ids=[9], codes=[ENTRY_OK], messages=[""]), memoryview(b"")))
        transport.add_entries_then("b1", 7, b"k", entries, flags=0, timeout_s=1.0,
                                   then=lambda errors, error: got.append((errors, error)))
        connection.futures[-1].set_exception(ConnectionClosedError("gone"))
        await asyncio.sleep(0)
        assert [errors for errors, _ in got[1:]] == [None, None]
        assert "outcome is unknown" in str(got[1][1]) and str(got[2][1]) == "gone"

    asyncio.run(main())
