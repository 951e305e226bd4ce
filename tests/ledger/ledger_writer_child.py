"""A writer process for the ledger crash tests.

Usage: ledger_writer_child.py META_ADDRESSES ENSEMBLE QW QA ENTRIES PACE_MS

Creates a ledger (password ``PASSWORD``), prints ``ledger ID``, then appends
``ENTRIES`` entries (``payload(i)``), up to 32 in flight, one every
``PACE_MS`` ms, printing ``ack N`` for every confirmed entry. When an append
fails it prints ``error CLASS MESSAGE`` and exits with code 3. The parent
kills it (SIGKILL) or stops it (SIGSTOP/SIGCONT) somewhere along the way.
"""

from __future__ import annotations

import asyncio
import sys

from quorumlog import rpc
from quorumlog.errors import QuorumlogError
from quorumlog.ledger import LedgerClient
from quorumlog.log import configure

PASSWORD = b"child-password"
IN_FLIGHT_MAX = 32


def payload(i: int) -> bytes:
    return f"entry-{i:08d}-".encode() * 8


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def main(addresses: list[str], shape: tuple[int, int, int], entries: int,
               pace_ms: float) -> int:
    async with LedgerClient.connect(addresses) as client:
        handle = await client.create_ledger(*shape, password=PASSWORD)
        say(f"ledger {handle.id}")
        in_flight: list[asyncio.Future[int]] = []

        def report(future: asyncio.Future[int]) -> None:
            if not future.cancelled() and future.exception() is None:
                say(f"ack {future.result()}")

        try:
            for i in range(entries):
                future = handle.append_async(payload(i))
                future.add_done_callback(report)
                in_flight.append(future)
                if len(in_flight) >= IN_FLIGHT_MAX:
                    await in_flight.pop(0)
                if pace_ms:
                    await asyncio.sleep(pace_ms / 1000)
            for future in in_flight:
                await future
        except QuorumlogError as exc:
            say(f"error {type(exc).__name__} {exc.message}")
            return 3
        say("done")
        return 0


if __name__ == "__main__":
    configure("WARNING")  # logs to stderr; stdout carries the protocol lines
    meta = sys.argv[1].split(",")
    e, w, a, n = (int(x) for x in sys.argv[2:6])
    sys.exit(rpc.run(main(meta, (e, w, a), n, float(sys.argv[6]))))
