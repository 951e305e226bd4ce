"""A TableClient's concurrent writes to one group go to its leader in one
request (``TableWriteBatchRequest``), each with its own proposal id, answer
and error: a write that fails in a batch is retried on its own with the same
proposal id, the others are answered. Against a scripted pool here; the
cluster tests (tests/table/test_table_cluster.py) run them on real nodes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from quorumlog import rpc
from quorumlog.errors import NotLeaderError
from quorumlog.table import DiskInsufficientError, Done, TableClient
from quorumlog.table._layout import PartitionRecord, TableLayout, TableRecord
from quorumlog.table._messages import (
    WRITE_BATCH_WRITES_MAX,
    WRITE_BATCHED_BYTES_MAX,
    TableWriteBatchRequest,
    TableWriteBatchResponse,
    TableWriteRequest,
    TableWriteResponse,
)
from rpc.support import run

LEADER = "127.0.0.1:2"


class ScriptedPool:
    """Answers every write with Done; ``fail`` maps a seq to the error its write
    gets the first time it is sent (in a batch, as that write's error)."""

    def __init__(self, fail: dict[int, Exception] | None = None,
                 batch_error: Exception | None = None) -> None:
        self.sent: list[TableWriteRequest | TableWriteBatchRequest] = []
        self.fail = dict(fail or {})
        self.batch_error = batch_error

    async def call(self, address: str, request: Any, timeout_s: float) -> Any:
        assert address == LEADER
        self.sent.append(request)
        await asyncio.sleep(0)
        if isinstance(request, TableWriteRequest):
            error = self.fail.pop(request.seq, None)
            if error is not None:
                raise error
            return TableWriteResponse(results=[Done()] * len(request.commands))
        if self.batch_error is not None:
            error, self.batch_error = self.batch_error, None
            raise error
        results, errors = [], []
        for item in request.writes:
            error = self.fail.pop(item.seq, None)
            results.append([] if error else [Done()] * len(item.commands))
            errors.append(rpc.error_to_wire(error) if error else None)
        return TableWriteBatchResponse(results=results, errors=errors)

    async def close(self) -> None:
        return None


def _client(pool: ScriptedPool) -> TableClient:
    tables = TableClient(["127.0.0.1:1"], deadline_s=5.0)
    tables._pool = pool  # type: ignore[assignment]
    tables._layouts["t"] = TableLayout("t", TableRecord(9, 1, 1, 0), (PartitionRecord((1,)),))
    tables._addresses[1] = LEADER
    tables._leaders[(9, 0)] = LEADER  # known: a transient failure retries the members at once
    return tables


def _writes(pool: ScriptedPool) -> list[tuple[int, int]]:
    """(client id, seq) of every write sent, in order, batched or not."""
    out = []
    for request in pool.sent:
        if isinstance(request, TableWriteRequest):
            out.append((request.client_id, request.seq))
        else:
            out += [(item.client_id, item.seq) for item in request.writes]
    return out


def test_concurrent_writes_share_one_request_and_each_gets_its_answer() -> None:
    pool = ScriptedPool()

    async def main() -> None:
        async with _client(pool) as tables:
            await tables.set("t", b"h", b"s", b"first")  # alone: a plain request
            await asyncio.gather(*(tables.set("t", b"h%d" % i, b"s", b"v") for i in range(40)))
            await asyncio.gather(tables.delete("t", b"h", b"s"), tables.set("t", b"h", b"s", b"x"))

    run(main())
    kinds = [type(r).__name__ for r in pool.sent]
    assert kinds == ["TableWriteRequest", "TableWriteBatchRequest", "TableWriteBatchRequest"]
    batch = pool.sent[1]
    assert isinstance(batch, TableWriteBatchRequest) and len(batch.writes) == 40
    client_ids = {client_id for client_id, _ in _writes(pool)}
    assert len(client_ids) == 1  # one session per partition, batched or not
    assert [seq for _, seq in _writes(pool)] == list(range(1, 44))


def test_a_write_that_fails_in_a_batch_is_retried_alone_with_its_proposal_id() -> None:
    """Write 3 meets a leader change (retried: same client id and seq), write 5 a
    full disk (its caller gets the error), every other write is answered once."""
    pool = ScriptedPool(fail={3: NotLeaderError("moved", leader_hint=LEADER),
                              5: DiskInsufficientError("disk full")})

    async def main() -> list[object]:
        async with _client(pool) as tables:
            return await asyncio.gather(
                *(tables.set("t", b"h%d" % i, b"s", b"v") for i in range(8)),
                return_exceptions=True)

    outcomes = run(main())
    assert [type(o).__name__ for o in outcomes] == (
        ["NoneType"] * 4 + ["DiskInsufficientError"] + ["NoneType"] * 3)
    assert "disk full" in str(outcomes[4])
    writes = _writes(pool)
    assert [seq for _, seq in writes] == [1, 2, 3, 4, 5, 6, 7, 8, 3]  # 3 again, alone
    assert isinstance(pool.sent[-1], TableWriteRequest)
    assert len({client_id for client_id, _ in writes}) == 1


def test_a_batch_that_fails_as_a_whole_retries_each_write() -> None:
    pool = ScriptedPool(batch_error=rpc.ConnectionClosedError("reset by peer"))

    async def main() -> None:
        async with _client(pool) as tables:
            await asyncio.gather(*(tables.set("t", b"h%d" % i, b"s", b"v") for i in range(5)))

    run(main())
    seqs = [seq for _, seq in _writes(pool)]
    assert seqs[:5] == [1, 2, 3, 4, 5] and sorted(seqs[5:]) == [1, 2, 3, 4, 5]


def test_large_and_other_writes_go_alone_and_a_batch_is_bounded() -> None:
    pool = ScriptedPool()
    big = b"v" * (WRITE_BATCHED_BYTES_MAX + 1)

    async def main() -> None:
        async with _client(pool) as tables:
            await asyncio.gather(tables.set("t", b"a", b"s", big),
                                 tables.multi_set("t", b"n", {b"s": b"1"}),
                                 tables.set("t", b"b", b"s", b"small"))
            await asyncio.gather(*(tables.set("t", b"h%d" % i, b"s", b"v")
                                   for i in range(WRITE_BATCH_WRITES_MAX + 3)))

    run(main())
    first = [r for r in pool.sent[:3]]
    assert all(isinstance(r, TableWriteRequest) for r in first)  # nothing to batch with
    sizes = [len(r.writes) if isinstance(r, TableWriteBatchRequest) else 1
             for r in pool.sent[3:]]
    assert sizes == [WRITE_BATCH_WRITES_MAX, 3]


@pytest.mark.parametrize("answer", ["results", "errors"])
def test_a_batch_answer_of_the_wrong_length_fails_every_write(answer: str) -> None:
    class ShortPool(ScriptedPool):
        async def call(self, address: str, request: Any, timeout_s: float) -> Any:
            response = await super().call(address, request, timeout_s)
            if isinstance(response, TableWriteBatchResponse):
                if answer == "results":
                    return TableWriteBatchResponse(results=response.results[1:],
                                                   errors=response.errors)
                return TableWriteBatchResponse(results=response.results,
                                               errors=response.errors[1:])
            return response

    pool = ShortPool()

    async def main() -> list[object]:
        async with _client(pool) as tables:
            return await asyncio.gather(*(tables.set("t", b"h%d" % i, b"s", b"v")
                                          for i in range(3)), return_exceptions=True)

    outcomes = run(main())
    assert all("a write batch of 3 got" in str(o) for o in outcomes), outcomes


def test_the_leader_answers_each_write_of_a_batch_as_it_came_out() -> None:
    """``_batch_response`` (the leader's answer once the batch's last write is
    done): results, refusals and errors per write; a write still waiting (not
    expected: writes apply in log order) or cancelled is a retriable drop."""
    from quorumlog.errors import TransientError, UsageError
    from quorumlog.table._service import _batch_response

    async def main() -> TableWriteBatchResponse:
        loop = asyncio.get_running_loop()
        done, failed, waiting, cancelled, broken = (loop.create_future() for _ in range(5))
        done.set_result([Done()])
        failed.set_exception(NotLeaderError("moved", leader_hint="127.0.0.1:9"))
        cancelled.cancel()
        broken.set_exception(ZeroDivisionError("bug"))
        response = _batch_response([done, [Done(), Done()], DiskInsufficientError("full"),
                                    failed, waiting, cancelled, broken])
        waiting.cancel()
        return response

    response = run(main())
    assert response.results == [[Done()], [Done(), Done()], [], [], [], [], []]
    errors = [None if e is None else rpc.error_from_wire(e) for e in response.errors]
    assert errors[:2] == [None, None]
    assert isinstance(errors[2], DiskInsufficientError)
    assert isinstance(errors[3], NotLeaderError) and errors[3].leader_hint == "127.0.0.1:9"
    # a drop travels as its registered ancestor: retriable, so the client sends it again
    assert isinstance(errors[4], TransientError) and "not applied" in str(errors[4])
    assert isinstance(errors[5], TransientError) and "cancelled" in str(errors[5])
    assert "ZeroDivisionError" in str(errors[6]) and not isinstance(errors[6], UsageError)
