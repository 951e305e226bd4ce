"""Duplication records in meta (docs/duplication.md).

Key layout (values are msgpack):

- ``/tables/<name>/dups/<id>``: :class:`DupRecord` (remote cluster name,
  state, fail mode), written by ``quorumlog dup``; every table node watches
  ``/table`` and so knows every duplication of the tables it hosts;
- ``/tables/<name>/flags``: :class:`TableFlags` (whether increment and
  check-and-mutate are allowed while the table is duplicated);
- ``/dup-progress/<name>/<id>/<partition>``: :class:`DupProgress`, the
  partition's ``confirmed_decree`` (every log entry up to it reached the
  remote cluster) and the shipper's counters, written by the partition
  leader's shipper with a compare-and-swap. Kept outside ``/tables/`` so
  frequent progress writes do not wake every node's table watch; every
  replica reads them to hold its log (``compaction_floor``).
"""

from __future__ import annotations

import enum
import time

import msgspec

from quorumlog.errors import UsageError
from quorumlog.meta import Compare, CompareOp, CompareTarget, DeleteOp, MetaClient, PutOp
from quorumlog.table._errors import TableError
from quorumlog.table._layout import (
    DUP_PROGRESS_PREFIX,
    TABLES_PREFIX,
    check_table_name,
    table_info,
)

DUP_ID_SEQUENCE = "dup"
CLUSTER_NAME_BYTES_MAX = 64


class DupState(enum.Enum):
    """prepare (reserved for a checkpoint copy) -> log <-> pause -> removed."""

    PREPARE = "prepare"
    LOG = "log"
    PAUSE = "pause"
    REMOVED = "removed"


class FailMode(enum.Enum):
    SLOW = "slow"  # retry a block with backoff until the remote takes it (the default)
    SKIP = "skip"  # drop a block the remote refused, count it, go on


# state -> states a user may move it to (h11-style transition table)
DUP_TRANSITIONS: dict[DupState, frozenset[DupState]] = {
    DupState.PREPARE: frozenset({DupState.LOG, DupState.REMOVED}),
    DupState.LOG: frozenset({DupState.PAUSE, DupState.REMOVED}),
    DupState.PAUSE: frozenset({DupState.LOG, DupState.REMOVED}),
    DupState.REMOVED: frozenset(),
}


class UnknownDupError(TableError, UsageError):
    """No duplication with this id on the table: ``quorumlog dup list TABLE``."""


class DupRecord(msgspec.Struct, frozen=True):
    dup_id: int
    remote: str
    state: DupState
    fail_mode: FailMode = FailMode.SLOW
    created_ms: int = 0

    @property
    def active(self) -> bool:
        """Holds the log (everything but removed)."""
        return self.state is not DupState.REMOVED


class TableFlags(msgspec.Struct, frozen=True):
    # Increment and check_and_mutate read the value they change: under
    # last-writer-wins, concurrent ones on two clusters do not add up, so a
    # duplicated table refuses them unless this is set (as Pegasus does).
    allow_non_idempotent_writes: bool = False


class DupProgress(msgspec.Struct, frozen=True):
    confirmed_decree: int
    shipped_mutations: int = 0
    shipped_bytes: int = 0
    skipped_mutations: int = 0
    pending_decrees: int = 0
    lag_ms: int = 0
    # The log after confirmed_decree was found compacted on the leader: true
    # until the resync copy is done; resyncs counts them.
    log_lost: bool = False
    error: str = ""
    leader: int = 0
    updated_ms: int = 0
    # --checkpoint: the partition's records as of the start were copied
    # (always true for a duplication added without it).
    prepared: bool = True
    checkpoint_records: int = 0
    resyncs: int = 0


_ENCODER = msgspec.msgpack.Encoder()
_DECODE_DUP = msgspec.msgpack.Decoder(DupRecord)
_DECODE_FLAGS = msgspec.msgpack.Decoder(TableFlags)
_DECODE_PROGRESS = msgspec.msgpack.Decoder(DupProgress)


def encode_dup(value: DupRecord | TableFlags | DupProgress) -> bytes:
    return _ENCODER.encode(value)


def decode_dup(raw: bytes) -> DupRecord:
    return _DECODE_DUP.decode(raw)


def decode_flags(raw: bytes) -> TableFlags:
    return _DECODE_FLAGS.decode(raw)


def decode_progress(raw: bytes) -> DupProgress:
    return _DECODE_PROGRESS.decode(raw)


def dup_key(table: str, dup_id: int) -> str:
    return f"{TABLES_PREFIX}{table}/dups/{dup_id}"


def flags_key(table: str) -> str:
    return f"{TABLES_PREFIX}{table}/flags"


def progress_prefix(table: str, dup_id: int) -> str:
    return f"{DUP_PROGRESS_PREFIX}{table}/{dup_id}/"


def progress_key(table: str, dup_id: int, partition: int) -> str:
    return f"{progress_prefix(table, dup_id)}{partition}"


def parse_table_extras(kvs: list[tuple[str, bytes]]
                       ) -> tuple[dict[str, list[DupRecord]], dict[str, TableFlags]]:
    """The duplications and flags of every table in a listing of ``/tables/``."""
    dups: dict[str, list[DupRecord]] = {}
    flags: dict[str, TableFlags] = {}
    for key, value in kvs:
        if not key.startswith(TABLES_PREFIX):
            continue
        name, _, rest = key[len(TABLES_PREFIX):].partition("/")
        if rest.startswith("dups/"):
            dups.setdefault(name, []).append(decode_dup(value))
        elif rest == "flags":
            flags[name] = decode_flags(value)
    return dups, flags


def parse_progress(kvs: list[tuple[str, bytes]]) -> dict[tuple[str, int, int], DupProgress]:
    """(table, dup id, partition) -> progress, from a listing of ``/dup-progress/``."""
    out = {}
    for key, value in kvs:
        table, dup_id, partition = key[len(DUP_PROGRESS_PREFIX):].split("/")
        out[(table, int(dup_id), int(partition))] = decode_progress(value)
    return out


def check_cluster_name(name: str) -> str:
    if not name or len(name.encode()) > CLUSTER_NAME_BYTES_MAX or "/" in name:
        raise UsageError(f"remote cluster name {name!r} must be 1..{CLUSTER_NAME_BYTES_MAX} "
                         "bytes without '/', as named in the nodes' [clusters] config")
    return name


async def list_dups(meta: MetaClient, table: str) -> list[DupRecord]:
    check_table_name(table)
    kvs = await meta.list_keys(f"{TABLES_PREFIX}{table}/dups/")
    return sorted((decode_dup(kv.value) for kv in kvs), key=lambda d: d.dup_id)


async def add_dup(meta: MetaClient, table: str, remote: str, *,
                  checkpoint: bool = False) -> DupRecord:
    """A new duplication of ``table`` to ``remote``: in state log (only writes
    from now on ship), or with ``checkpoint`` in state prepare (every
    partition's leader first copies the records it holds; the last one done
    moves the duplication to log)."""
    check_cluster_name(remote)
    await table_info(meta, table)  # UnknownTableError
    for existing in await list_dups(meta, table):
        if existing.active and existing.remote == remote:
            raise UsageError(f"table {table!r} is already duplicated to {remote!r} "
                             f"(dup {existing.dup_id}); `quorumlog dup list {table}`")
    dup_id = await meta.next_id(DUP_ID_SEQUENCE)
    record = DupRecord(dup_id=dup_id, remote=remote,
                       state=DupState.PREPARE if checkpoint else DupState.LOG,
                       created_ms=int(time.time() * 1000))
    await meta.put(dup_key(table, dup_id), encode_dup(record))
    return record


async def get_dup(meta: MetaClient, table: str, dup_id: int) -> tuple[DupRecord, int]:
    """The record and its meta version."""
    check_table_name(table)
    kv = await meta.get(dup_key(table, dup_id))
    if kv is None:
        raise UnknownDupError(f"table {table!r} has no duplication {dup_id}; "
                              f"`quorumlog dup list {table}` shows them")
    return decode_dup(kv.value), kv.version


async def update_dup(meta: MetaClient, table: str, dup_id: int, *,
                     state: DupState | None = None,
                     fail_mode: FailMode | None = None) -> DupRecord:
    """Move a duplication to ``state`` (checked against DUP_TRANSITIONS) or set
    its fail mode; removal also deletes its progress, releasing the log floor."""
    record, version = await get_dup(meta, table, dup_id)
    if state is not None and state is not record.state:
        if state not in DUP_TRANSITIONS[record.state]:
            raise UsageError(f"duplication {dup_id} of {table!r} is {record.state.value}; "
                             f"it cannot become {state.value}")
        record = msgspec.structs.replace(record, state=state)
    if fail_mode is not None:
        if record.state is DupState.REMOVED:
            raise UsageError(f"duplication {dup_id} of {table!r} is removed")
        record = msgspec.structs.replace(record, fail_mode=fail_mode)
    ops: list[PutOp | DeleteOp] = [PutOp(key=dup_key(table, dup_id), value=encode_dup(record))]
    if record.state is DupState.REMOVED:
        ops.append(DeleteOp(key=progress_prefix(table, dup_id), prefix=True))
    result = await meta.txn(
        compares=[Compare(key=dup_key(table, dup_id), target=CompareTarget.VERSION,
                          op=CompareOp.EQUAL, version=version)],
        success=ops)
    if not result.succeeded:
        raise UsageError(f"duplication {dup_id} of {table!r} changed meanwhile; run the "
                         "command again")
    return record


async def set_flags(meta: MetaClient, table: str, flags: TableFlags) -> None:
    await table_info(meta, table)
    await meta.put(flags_key(table), encode_dup(flags))


async def read_progress(meta: MetaClient, table: str,
                        dup_id: int) -> dict[int, DupProgress]:
    kvs = await meta.list_keys(progress_prefix(table, dup_id))
    return {p: v for (_, _, p), v in parse_progress([(kv.key, kv.value) for kv in kvs]).items()}
