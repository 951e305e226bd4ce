"""Ask every bookie of a set at once; hand back their answers as they arrive.

Fencing, recovery reads, LAC reads and long polls all send one request to
each bookie of a write set (or of an ensemble) and stop as soon as the
operation's pure decision object (``CoverageSet``, ``RecoveryRead``, ...)
says the outcome is decided. This module is that loop, once::

    async with contextlib.aclosing(fan_out(targets, request)) as answers:
        async for answer in answers:
            if decision.record(answer.index, ...) is DECIDED:
                return ...                 # the requests still out are cancelled

``request(bookie)`` carries its own timeout: a bookie that does not answer
in time comes back as an answer with an error whose ``outcome`` is
``UNKNOWN`` (never "no such entry"). Answers that complete together come
in the order the requests were sent, so a seeded simulator run repeats.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar, cast

from quorumlog.errors import invariant
from quorumlog.ledger._bookie_client import BookieOutcome, cancel_quietly, in_order, outcome_of

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class BookieAnswer(Generic[R]):
    """One bookie's answer: its reply, or the error its request ended with."""

    index: int  # the caller's key for the bookie (its ensemble index)
    bookie: str
    reply: R | None
    error: BaseException | None

    @property
    def outcome(self) -> BookieOutcome:
        return outcome_of(self.error)

    def result(self) -> R:
        invariant(self.error is None, f"bookie {self.bookie} answered with an error")
        return cast(R, self.reply)


async def fan_out(
    targets: Iterable[tuple[int, str]], request: Callable[[str], Awaitable[R]],
) -> AsyncGenerator[BookieAnswer[R], None]:
    """Send ``request(bookie)`` to every ``(index, bookie)`` of ``targets`` at
    once; yield each answer as it arrives. Closing the generator (leaving the
    ``aclosing`` block) cancels the requests still out."""
    tasks = {asyncio.ensure_future(request(bookie)): (index, bookie)
             for index, bookie in targets}
    try:
        while tasks:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in in_order(done, tasks):
                index, bookie = tasks.pop(task)
                error = task.exception()
                reply = task.result() if error is None else None
                yield BookieAnswer(index, bookie, reply, error)
    finally:
        cancel_quietly(tasks)
