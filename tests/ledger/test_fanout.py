"""The write-set fan-out: answers as they arrive, outcomes, early stop cancels the rest."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from quorumlog.errors import DeadlineExceededError, InvariantViolation
from quorumlog.ledger import BookieOutcome
from quorumlog.ledger._fanout import BookieAnswer, fan_out
from quorumlog.proto import NoSuchEntryError

TARGETS = [(0, "b0:1"), (1, "b1:1"), (2, "b2:1")]


def test_answers_come_as_they_arrive_with_their_outcomes() -> None:
    async def main() -> list[BookieAnswer[str]]:
        gates = {bookie: asyncio.Event() for _, bookie in TARGETS}

        async def request(bookie: str) -> str:
            await gates[bookie].wait()
            if bookie == "b0:1":
                raise DeadlineExceededError("read timed out after 1.0 s")
            if bookie == "b2:1":
                raise NoSuchEntryError("no entry 7")
            return f"reply from {bookie}"

        seen = []
        async with contextlib.aclosing(fan_out(TARGETS, request)) as answers:
            for bookie in ("b1:1", "b2:1", "b0:1"):
                gates[bookie].set()
                seen.append(await anext(answers))
        return seen

    seen = asyncio.run(main())
    assert [(a.index, a.bookie) for a in seen] == [(1, "b1:1"), (2, "b2:1"), (0, "b0:1")]
    assert [a.outcome for a in seen] == [BookieOutcome.OK, BookieOutcome.NO_SUCH_ENTRY,
                                         BookieOutcome.UNKNOWN]
    assert seen[0].result() == "reply from b1:1"
    with pytest.raises(InvariantViolation):
        seen[2].result()  # a timeout has no reply; it is UNKNOWN, never "no such entry"


def test_answers_completing_together_come_in_sending_order() -> None:
    async def main() -> list[int]:
        async def request(bookie: str) -> str:
            return bookie

        async with contextlib.aclosing(fan_out(reversed(TARGETS), request)) as answers:
            return [answer.index async for answer in answers]

    assert asyncio.run(main()) == [2, 1, 0]


def test_stopping_early_cancels_the_requests_still_out() -> None:
    async def main() -> tuple[int, set[str]]:
        cancelled: set[str] = set()

        async def request(bookie: str) -> str:
            if bookie != "b0:1":
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    cancelled.add(bookie)
                    raise
            return bookie

        async with contextlib.aclosing(fan_out(TARGETS, request)) as answers:
            async for answer in answers:
                decided = answer.index
                break
        for _ in range(3):  # let the cancellations run
            await asyncio.sleep(0)
        return decided, cancelled

    decided, cancelled = asyncio.run(main())
    assert decided == 0
    assert cancelled == {"b1:1", "b2:1"}
