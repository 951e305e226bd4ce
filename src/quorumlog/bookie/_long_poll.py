"""Long-poll LAC waiters: reads of the LAC parked until it passes a value.

A ``ReadLacRequest`` with a timeout whose ledger's LAC is not past
``previous_lac`` (or whose ledger the bookie does not know yet) parks a
future here; every change that can move a LAC (an add, an explicit LAC, a
fence, a deletion) calls :meth:`LacWaiters.wake` with the ledger's LAC now,
which settles the futures it passed (``_rules.lac_passed``). The registry is
bounded (``parked_max``): at the bound a long poll is answered at once.
Used by the bookie server and by the simulated bookie.
"""

from __future__ import annotations

import asyncio

from quorumlog.bookie._rules import lac_passed


class LacWaiters:
    """Parked long polls by ledger (see the module docstring)."""

    def __init__(self, parked_max: int) -> None:
        self.parked_max = parked_max
        self._waiters: dict[int, dict[asyncio.Future[None], int]] = {}
        self.parked = 0

    def __bool__(self) -> bool:
        return bool(self._waiters)

    @property
    def full(self) -> bool:
        return self.parked >= self.parked_max

    def park(self, ledger_id: int, previous_lac: int) -> asyncio.Future[None]:
        """A future settled once the ledger's LAC passes ``previous_lac`` (or
        :meth:`release_all`); the caller bounds the wait and calls :meth:`unpark`."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(ledger_id, {})[waiter] = previous_lac
        self.parked += 1
        return waiter

    def unpark(self, ledger_id: int, waiter: asyncio.Future[None]) -> None:
        """The wait of ``waiter`` ended (settled, timed out or cancelled)."""
        self.parked -= 1
        waiters = self._waiters.get(ledger_id)
        if waiters is not None:
            waiters.pop(waiter, None)
            if not waiters:
                del self._waiters[ledger_id]

    def wake(self, ledger_id: int, lac: int | None) -> None:
        """The ledger's LAC is now ``lac`` (None: unknown ledger): settle the waiters
        it passed."""
        waiters = self._waiters.get(ledger_id)
        if not waiters or lac is None:
            return
        for waiter, previous in list(waiters.items()):
            if lac_passed(lac, previous):
                del waiters[waiter]
                if not waiter.done():
                    waiter.set_result(None)
        if not waiters:
            del self._waiters[ledger_id]

    def release_all(self) -> None:
        """Settle every waiter now (the bookie is closing: answer what is known)."""
        for waiter in self._take_all():
            if not waiter.done():
                waiter.set_result(None)

    def cancel_all(self) -> None:
        """Cancel every waiter (a simulated crash: nobody answers)."""
        for waiter in self._take_all():
            waiter.cancel()

    def _take_all(self) -> list[asyncio.Future[None]]:
        waiters, self._waiters = self._waiters, {}
        return [waiter for parked in waiters.values() for waiter in parked]
