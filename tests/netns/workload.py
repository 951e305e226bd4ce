"""Client workloads run on the harness's client host (``ip netns exec``), one JSON
object per line on stdout.

``ledger MEMBERS STOP_FILE``: create a ledger (E=2, Qw=2, Qa=2), print
``{"ledger": id, "ensemble": [...]}``, then append entries and print
``{"acked": entry_id}`` for each acknowledged one until STOP_FILE exists;
close and print ``{"closed": last_entry_id, "ensembles": [[first, [bookies]]...]}``.

``meta MEMBERS SECONDS CLIENTS``: concurrent put/get/CAS clients for SECONDS;
print ``{"history": [...]}`` (quorumlog.sim.Operation fields).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from pathlib import Path

from quorumlog import rpc
from quorumlog.errors import QuorumlogError
from quorumlog.ledger import BlockingLedgerClient
from quorumlog.meta import Compare, CompareTarget, MetaClient, PutOp

ENTRIES_MAX = 20_000
APPEND_INTERVAL_S = 0.01  # pacing of the writer, so a run stays small
META_KEYS = ("k0", "k1", "k2")
META_DEADLINE_S = 8.0


def emit(obj: object) -> None:
    print(json.dumps(obj), flush=True)


def ledger_workload(members: list[str], stop_file: Path) -> None:
    with BlockingLedgerClient(members) as client:
        writer = client.create_ledger(2, 2, 2)
        emit({"ledger": writer.id, "ensemble": list(writer.metadata.ensembles[-1].bookies)})
        for i in range(ENTRIES_MAX):
            if stop_file.exists():
                break
            entry_id = writer.append(b"entry-%d" % i)
            emit({"acked": entry_id})
            time.sleep(APPEND_INTERVAL_S)
        writer.close()
        emit({"closed": writer.last_add_confirmed,
              "ensembles": [[f.first_entry_id, list(f.bookies)]
                            for f in writer.metadata.ensembles]})


async def _cas(meta: MetaClient, key: str, expected: str | None, new: str) -> bool:
    compare = (Compare(key=key, target=CompareTarget.VERSION, version=0) if expected is None
               else Compare(key=key, target=CompareTarget.VALUE, value=expected.encode()))
    result = await meta.txn(compares=[compare], success=[PutOp(key=key, value=new.encode())])
    return result.succeeded


async def _meta_client(client_id: int, members: list[str], end: float,
                       history: list[dict[str, object]]) -> None:
    rng = random.Random(client_id)
    now = time.monotonic

    def record(kind: str, key: str, value: object, output: object, call: float,
               ret: float | None) -> None:
        history.append({"client": client_id, "kind": kind, "key": key, "input": value,
                        "output": output, "call": call, "ret": ret})

    async with MetaClient(members, deadline_s=META_DEADLINE_S) as meta:
        n = 0
        while now() < end:
            n += 1
            cas_input: list[str | None] | None = None  # set once the CAS is sent
            key, roll, value = rng.choice(META_KEYS), rng.random(), f"c{client_id}-{n}"
            call = now()
            try:
                if roll < 0.4:
                    await meta.put(key, value.encode())
                    record("put", key, value, None, call, now())
                elif roll < 0.75:
                    kv = await meta.get(key)
                    record("get", key, None, kv.value.decode() if kv else None, call, now())
                else:
                    current = await meta.get(key)
                    expected = current.value.decode() if current else None
                    call, cas_input = now(), [expected, value]
                    ok = await _cas(meta, key, expected, value)
                    record("cas", key, cas_input, ok, call, now())
            except QuorumlogError:
                if roll < 0.4:
                    record("put", key, value, None, call, None)  # outcome unknown
                elif cas_input is not None:
                    record("cas", key, cas_input, None, call, None)
                # a get without an answer (or a CAS whose get failed) observed nothing


def meta_workload(members: list[str], seconds: float, clients: int) -> None:
    history: list[dict[str, object]] = []

    async def main() -> None:
        end = time.monotonic() + seconds
        await asyncio.gather(*(_meta_client(i, members, end, history) for i in range(clients)))

    rpc.run(main())
    emit({"history": history})


def main(argv: list[str]) -> None:
    mode, members = argv[0], argv[1].split(",")
    if mode == "ledger":
        ledger_workload(members, Path(argv[2]))
    elif mode == "meta":
        meta_workload(members, float(argv[2]), int(argv[3]))
    else:
        raise SystemExit(f"unknown workload {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
