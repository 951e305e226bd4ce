"""Client workloads run on the harness's client host (``ip netns exec``), one JSON
object per line on stdout.

``ledger MEMBERS STOP_FILE``: create a ledger (E=2, Qw=2, Qa=2), print
``{"ledger": id, "ensemble": [...]}``, then append entries and print
``{"acked": entry_id}`` for each acknowledged one until STOP_FILE exists;
close and print ``{"closed": last_entry_id, "ensembles": [[first, [bookies]]...]}``.

``meta MEMBERS SECONDS CLIENTS``: concurrent put/get/CAS clients for SECONDS;
print ``{"history": [...]}`` (quorumlog.sim.Operation fields).

The Jepsen-style ledger and stream runs (test_netns_logs.py, checked by
checker.py) use:

``ledger-writer MEMBERS STOP_FILE``: like ``ledger``, but prints the content of
each acknowledged entry (``{"acked": id, "value": ...}``); a failed append
prints ``{"failed": error class, "message": ...}`` and ends the writing (a
handle whose append failed takes no more appends), without closing.

``ledger-reader MEMBERS LEDGER STOP_FILE``: tail the open ledger (never with
recovery) and print ``{"seen": id, "value": ...}`` for every entry, in order,
until the ledger is closed and read to its end or STOP_FILE exists; an error
prints ``{"reader_error": ...}`` and the reader opens the ledger again and goes
on after the last entry it saw.

``ledger-recover MEMBERS LEDGER``: open with recovery (fence, settle, close),
retrying until it succeeds; print ``{"recovered": last_entry_id}``.

``ledger-final MEMBERS LEDGER``: open with recovery and print
``{"final": [values...]}``: the whole ledger.

``stream-producer MEMBERS STREAM NAME STOP_FILE [steal]``: (with ``steal``, take
the stream over from a live producer at once) send ``NAME-SEQ`` messages
one at a time, printing ``{"acked": seq}`` or ``{"unknown": seq, "error": ...}``
(never resent); after an error it opens a new producer (``steal=True``),
except after ProducerFencedError (another producer took the stream over): it
prints ``{"fenced": seq}`` and sends no more.

``stream-reader MEMBERS STREAM STOP_FILE``: tail from the earliest message,
printing ``{"seen": value, "reader": n}``; after an error, reader n + 1 starts
again from the earliest (each reader's view is checked on its own).

``stream-final MEMBERS STREAM``: read everything from the earliest message
until the stream is quiet; print ``{"consumed": [values...]}``.

``table-rows MEMBERS STOP_FILE CLIENTS``: on the same table, concurrent clients
writing and reading rows (hash keys ROW_KEYS, sort keys ROW_FIELDS) several
fields at a time: multi_set, multi_delete, multi_get, a one-page scan,
check_and_mutate (checks field ``a`` against the value the client last saw,
writes two fields), and one-field set and get; the history's operations are
the checker's row kinds (mput, mget, mcas).

``dup-writer MEMBERS TABLE TAG STOP_FILE [shared]``: sets ``TAG<i>`` one at a
time until STOP_FILE exists; print the acknowledged ones with their
``time.monotonic()`` (one clock for every namespace) and the ones without an
answer (test_netns_dup.py). With ``shared``, every SHARED_EVERY-th write goes
to one of SHARED_KEYS sort keys of hash key ``shared`` that the writer on the
other cluster writes too (value ``TAG<i>``): conflicts that last-writer-wins
must settle the same way on both clusters.

``table-dump MEMBERS TABLE``: print every live record of TABLE with its timetag.

``table MEMBERS STOP_FILE CLIENTS``: on table ``jepsen`` (made by the test: one
partition, its keys set to 0), concurrent get/set/check_and_set/incr clients
until STOP_FILE exists (at most TABLE_RUN_MAX_S); print ``{"history": [...]}``
as ``meta`` does (an incr by 1 that returned r is a CAS r-1 -> r; one without
an answer is counted in ``incr_unknown``, which the register model cannot
express).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

from quorumlog import rpc
from quorumlog.errors import QuorumlogError
from quorumlog.ledger import BlockingLedgerClient, BlockingReadHandle
from quorumlog.meta import Compare, CompareTarget, MetaClient, PutOp
from quorumlog.stream import BlockingProducer, BlockingStreamClient, ProducerFencedError
from quorumlog.table import CheckType, Mutation, TableClient

ENTRIES_MAX = 20_000
APPEND_INTERVAL_S = 0.01  # pacing of the writer, so a run stays small
META_KEYS = ("k0", "k1", "k2")
META_DEADLINE_S = 8.0
RETRY_INTERVAL_S = 0.2  # between attempts of a reader or recovery that failed
RECOVER_DEADLINE_S = 60.0
TAIL_WAIT_MS = 500
QUIET_WAIT_MS = 3000  # the final stream read ends after this long without a message


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


def _recorder(client_id: int, history: list[dict[str, object]]
              ) -> Callable[[str, str, object, object, float, float | None], None]:
    """Appends one operation of ``client_id`` to ``history`` (quorumlog.sim.Operation fields)."""
    def record(kind: str, key: str, value: object, output: object, call: float,
               ret: float | None) -> None:
        history.append({"client": client_id, "kind": kind, "key": key, "input": value,
                        "output": output, "call": call, "ret": ret})

    return record


async def _meta_client(client_id: int, members: list[str], end: float,
                       history: list[dict[str, object]]) -> None:
    rng = random.Random(client_id)
    now = time.monotonic
    record = _recorder(client_id, history)

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


TABLE = "jepsen"
TABLE_SORT_KEY = b"v"
TABLE_REQUEST_TIMEOUT_S = 1.0  # one attempt: an unreachable leader costs this much
TABLE_DEADLINE_S = 8.0  # covers an election; longer outages leave the outcome unknown
TABLE_RUN_MAX_S = 600.0


async def _table_client(client_id: int, tables: TableClient, end: float,
                        history: list[dict[str, object]], unknown_incrs: list[int],
                        stop_file: Path) -> None:
    rng = random.Random(client_id)
    now = time.monotonic
    record = _recorder(client_id, history)

    while now() < end and not stop_file.exists():
        key = rng.choice(META_KEYS)
        kind = rng.choice(["get", "set", "cas", "incr"])
        value, expected = rng.randrange(1000), rng.randrange(1000)
        call = now()
        try:
            if kind == "get":
                raw = await tables.get(TABLE, key.encode(), TABLE_SORT_KEY)
                record("get", key, None, None if raw is None else int(raw), call, now())
            elif kind == "set":
                await tables.set(TABLE, key.encode(), TABLE_SORT_KEY, b"%d" % value)
                record("put", key, value, None, call, now())
            elif kind == "cas":
                result = await tables.check_and_set(
                    TABLE, key.encode(), check_sort_key=TABLE_SORT_KEY,
                    check_type=CheckType.BYTES_EQUAL, operand=b"%d" % expected,
                    set_sort_key=TABLE_SORT_KEY, value=b"%d" % value)
                record("cas", key, [expected, value], result.succeeded, call, now())
            else:
                counter = await tables.incr(TABLE, key.encode(), TABLE_SORT_KEY, 1)
                record("cas", key, [counter - 1, counter], True, call, now())
        except QuorumlogError:
            if kind == "incr":
                unknown_incrs.append(1)
            elif kind == "set":
                record("put", key, value, None, call, None)
            elif kind == "cas":
                record("cas", key, [expected, value], None, call, None)
            # a get without an answer observed nothing


def table_workload(members: list[str], stop_file: Path, clients: int) -> None:
    history: list[dict[str, object]] = [
        {"client": -1, "kind": "put", "key": key, "input": 0, "output": None, "call": 0.0,
         "ret": 0.0} for key in META_KEYS]
    unknown_incrs: list[int] = []

    async def main() -> None:
        end = time.monotonic() + TABLE_RUN_MAX_S
        workers = [TableClient(members, request_timeout_s=TABLE_REQUEST_TIMEOUT_S,
                               deadline_s=TABLE_DEADLINE_S) for _ in range(clients)]
        try:
            await asyncio.gather(*(_table_client(i, w, end, history, unknown_incrs,
                                                 stop_file)
                                   for i, w in enumerate(workers)))
        finally:
            for worker in workers:
                await worker.close()

    rpc.run(main())
    emit({"history": history, "incr_unknown": len(unknown_incrs)})


ROW_KEYS = ("r0", "r1", "r2")
ROW_FIELDS = ("a", "b", "c")
ROW_KINDS = ("mset", "mdel", "mget", "scan", "cam", "set", "get")


def _text(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode()


async def _row_client(client_id: int, tables: TableClient, end: float,
                      history: list[dict[str, object]], stop_file: Path) -> None:
    rng = random.Random(client_id)
    now = time.monotonic
    record = _recorder(client_id, history)
    seen_a: dict[str, str | None] = {}  # per row, field a as this client last saw it
    n = 0
    while now() < end and not stop_file.exists():
        key, kind = rng.choice(ROW_KEYS), rng.choice(ROW_KINDS)
        hash_key = key.encode()
        n += 1
        value = f"{client_id}.{n}"
        fields = rng.sample(ROW_FIELDS, 2)
        writes: list[list[str | None]] = []
        call = now()
        try:
            if kind == "mset":
                writes = [[f, value] for f in fields]
                await tables.multi_set(TABLE, hash_key, {f.encode(): value.encode()
                                                         for f in fields})
                record("mput", key, writes, None, call, now())
            elif kind == "mdel":
                writes = [[f, None] for f in fields]
                await tables.multi_delete(TABLE, hash_key, [f.encode() for f in fields])
                record("mput", key, writes, None, call, now())
            elif kind == "set":
                writes = [[fields[0], value]]
                await tables.set(TABLE, hash_key, fields[0].encode(), value.encode())
                record("mput", key, writes, None, call, now())
            elif kind == "get":
                raw = await tables.get(TABLE, hash_key, fields[0].encode())
                record("mget", key, [fields[0]], [_text(raw)], call, now())
            elif kind == "mget":
                got = await tables.multi_get(TABLE, hash_key, [f.encode() for f in ROW_FIELDS])
                values = [_text(got.get(f.encode())) for f in ROW_FIELDS]
                seen_a[key] = values[0]
                record("mget", key, list(ROW_FIELDS), values, call, now())
            elif kind == "scan":
                items = [[sort_key.decode(), raw.decode()]
                         async for sort_key, raw in tables.scan(TABLE, hash_key)]
                record("mget", key, None, items, call, now())
            else:  # check_and_mutate: a as last seen -> two fields
                expected = seen_a.get(key)
                writes = [[f, value] for f in fields]
                result = await tables.check_and_mutate(
                    TABLE, hash_key, check_sort_key=b"a",
                    check_type=(CheckType.VALUE_NOT_EXIST if expected is None
                                else CheckType.BYTES_EQUAL),
                    operand=b"" if expected is None else expected.encode(),
                    mutations=[Mutation(f.encode(), value.encode()) for f in fields])
                record("mcas", key, ["a", expected, writes], result.succeeded, call, now())
                if result.succeeded and "a" in fields:
                    seen_a[key] = value
        except QuorumlogError:
            if kind == "cam":
                record("mcas", key, ["a", seen_a.get(key), writes], None, call, None)
            elif writes:
                record("mput", key, writes, None, call, None)
            # a read without an answer observed nothing


def table_rows_workload(members: list[str], stop_file: Path, clients: int) -> None:
    history: list[dict[str, object]] = []

    async def main() -> None:
        end = time.monotonic() + TABLE_RUN_MAX_S
        workers = [TableClient(members, request_timeout_s=TABLE_REQUEST_TIMEOUT_S,
                               deadline_s=TABLE_DEADLINE_S) for _ in range(clients)]
        try:
            await asyncio.gather(*(_row_client(i, w, end, history, stop_file)
                                   for i, w in enumerate(workers)))
        finally:
            for worker in workers:
                await worker.close()

    rpc.run(main())
    emit({"history": history, "incr_unknown": 0})


DUP_WRITE_INTERVAL_S = 0.005  # pacing of a duplication writer, so a run stays small


SHARED_EVERY = 4
SHARED_KEYS = 5


def dup_shared_key(i: int) -> bytes | None:
    """The shared sort key write ``i`` of a ``shared`` dup-writer goes to, if any."""
    return b"s%d" % (i // SHARED_EVERY % SHARED_KEYS) if i % SHARED_EVERY == 3 else None


def dup_writer(members: list[str], table: str, tag: str, stop_file: Path,
               shared: bool = False) -> None:
    """Sets ``TAG<i>`` (value: the same) on 13 hash keys until STOP_FILE exists
    (with ``shared``, some on the shared keys instead: ``dup_shared_key``);
    print ``{"acked": [[i, monotonic time], ...], "unknown": [i, ...]}``."""
    acked: list[list[float]] = []
    unknown: list[int] = []

    async def main() -> None:
        end = time.monotonic() + TABLE_RUN_MAX_S
        async with TableClient(members, request_timeout_s=TABLE_REQUEST_TIMEOUT_S,
                               deadline_s=TABLE_DEADLINE_S) as tables:
            i = 0
            while time.monotonic() < end and not stop_file.exists():
                key = f"{tag}{i}".encode()
                sort_key = dup_shared_key(i) if shared else None
                try:
                    if sort_key is None:
                        await tables.set(table, b"h%d" % (i % 13), key, key)
                    else:
                        await tables.set(table, b"shared", sort_key, key)
                    acked.append([i, time.monotonic()])
                except QuorumlogError:
                    unknown.append(i)
                i += 1
                await asyncio.sleep(DUP_WRITE_INTERVAL_S)

    rpc.run(main())
    emit({"acked": acked, "unknown": unknown})


def table_dump(members: list[str], table: str) -> None:
    """Print ``{"records": [[hash_key, sort_key, value, timetag], ...]}`` (bytes as
    latin-1 text): every live record of every partition, read from the leaders."""

    async def main() -> list[list[object]]:
        async with TableClient(members) as tables:
            partitions = (await tables.table_info(table)).record.partitions
            return [[item.hash_key.decode("latin-1"), item.sort_key.decode("latin-1"),
                     item.value.decode("latin-1"), item.timetag]
                    for partition in range(partitions)
                    async for item in tables.scan_records(table, partition)]

    emit({"records": sorted(rpc.run(main()))})  # type: ignore[type-var]


def failure(error: QuorumlogError) -> dict[str, str]:
    return {"error": type(error).__name__, "message": str(error)[:300]}


def ledger_writer(members: list[str], stop_file: Path) -> None:
    with BlockingLedgerClient(members) as client:
        writer = client.create_ledger(2, 2, 2)
        emit({"ledger": writer.id, "ensemble": list(writer.metadata.ensembles[-1].bookies)})
        for i in range(ENTRIES_MAX):
            if stop_file.exists():
                break
            value = f"entry-{i}"
            try:
                entry_id = writer.append(value.encode())
            except QuorumlogError as e:
                emit({"failed": i, **failure(e)})
                return
            emit({"acked": entry_id, "value": value})
            time.sleep(APPEND_INTERVAL_S)
        writer.close()
        emit({"closed": writer.last_add_confirmed,
              "ensembles": [[f.first_entry_id, list(f.bookies)]
                            for f in writer.metadata.ensembles]})


def ledger_reader(members: list[str], ledger_id: int, stop_file: Path) -> None:
    last = -1
    with BlockingLedgerClient(members) as client:
        while not stop_file.exists():
            try:
                reader = client.open_ledger(ledger_id, recovery=False)
                last = _tail(reader, last, stop_file)
                if reader.is_closed and last >= reader.last_add_confirmed:
                    emit({"reader_done": last})
                    return
            except QuorumlogError as e:
                emit({"reader_error": failure(e)})
                time.sleep(RETRY_INTERVAL_S)


def _tail(reader: BlockingReadHandle, last: int, stop_file: Path) -> int:
    """Entries after ``last`` until the ledger is closed and read or STOP_FILE."""
    while not stop_file.exists():
        entry = reader.wait_for_entry(last, TAIL_WAIT_MS)
        if entry is None:
            if reader.is_closed and last >= reader.last_add_confirmed:
                break
            continue
        last = entry.entry_id
        emit({"seen": last, "value": entry.payload.decode()})
    return last


def ledger_recover(members: list[str], ledger_id: int) -> None:
    deadline = time.monotonic() + RECOVER_DEADLINE_S
    with BlockingLedgerClient(members) as client:
        while True:
            try:
                handle = client.open_ledger(ledger_id, recovery=True)
            except QuorumlogError as e:
                if time.monotonic() > deadline:
                    raise
                emit({"recover_error": failure(e)})
                time.sleep(RETRY_INTERVAL_S)
                continue
            emit({"recovered": handle.last_add_confirmed})
            return


def ledger_final(members: list[str], ledger_id: int) -> None:
    with BlockingLedgerClient(members) as client:
        handle = client.open_ledger(ledger_id, recovery=True)
        values = [e.payload.decode() for e in handle.read(0, handle.last_add_confirmed)]
        emit({"final": values})


def stream_producer(members: list[str], stream: str, name: str, stop_file: Path,
                    steal: bool) -> None:
    with BlockingStreamClient(members) as client:
        producer: BlockingProducer | None = None
        seq = 0
        while not stop_file.exists():
            try:
                if producer is None:
                    producer = client.producer(stream, steal=steal or seq > 0)
                    emit({"producer": seq})
                producer.send(f"{name}-{seq}".encode())
                emit({"acked": seq})
            except ProducerFencedError as e:
                emit({"unknown": seq, **failure(e)})
                emit({"fenced": seq})
                break
            except QuorumlogError as e:
                emit({"unknown": seq, **failure(e)})
                if producer is not None:
                    with contextlib.suppress(QuorumlogError):
                        producer.close()
                    producer = None
                time.sleep(RETRY_INTERVAL_S)
            seq += 1
            time.sleep(APPEND_INTERVAL_S)
        if producer is not None:
            with contextlib.suppress(QuorumlogError):
                producer.close()


def stream_reader(members: list[str], stream: str, stop_file: Path) -> None:
    with BlockingStreamClient(members) as client:
        incarnation = 0
        while not stop_file.exists():
            try:
                with client.reader(stream, "earliest") as reader:
                    while not stop_file.exists():
                        message = reader.read_next(TAIL_WAIT_MS)
                        if message is not None:
                            emit({"seen": message.value.decode(), "reader": incarnation})
            except QuorumlogError as e:
                emit({"reader_error": failure(e)})
                incarnation += 1
                time.sleep(RETRY_INTERVAL_S)


def stream_final(members: list[str], stream: str) -> None:
    with BlockingStreamClient(members) as client, client.reader(stream, "earliest") as reader:
        values = []
        while (message := reader.read_next(QUIET_WAIT_MS)) is not None:
            values.append(message.value.decode())
        emit({"consumed": values})


def main(argv: list[str]) -> None:
    mode, members = argv[0], argv[1].split(",")
    if mode == "ledger":
        ledger_workload(members, Path(argv[2]))
    elif mode == "meta":
        meta_workload(members, float(argv[2]), int(argv[3]))
    elif mode == "ledger-writer":
        ledger_writer(members, Path(argv[2]))
    elif mode == "ledger-reader":
        ledger_reader(members, int(argv[2]), Path(argv[3]))
    elif mode == "ledger-recover":
        ledger_recover(members, int(argv[2]))
    elif mode == "ledger-final":
        ledger_final(members, int(argv[2]))
    elif mode == "stream-producer":
        stream_producer(members, argv[2], argv[3], Path(argv[4]), argv[5:] == ["steal"])
    elif mode == "stream-reader":
        stream_reader(members, argv[2], Path(argv[3]))
    elif mode == "stream-final":
        stream_final(members, argv[2])
    elif mode == "table":
        table_workload(members, Path(argv[2]), int(argv[3]))
    elif mode == "table-rows":
        table_rows_workload(members, Path(argv[2]), int(argv[3]))
    elif mode == "dup-writer":
        dup_writer(members, argv[2], argv[3], Path(argv[4]), argv[5:] == ["shared"])
    elif mode == "table-dump":
        table_dump(members, argv[2])
    else:
        raise SystemExit(f"unknown workload {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
