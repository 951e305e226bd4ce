"""Table metadata in meta: table records, partition assignments, table nodes.

Key layout (values are msgpack):

- ``/table-nodes/<node id>``: :class:`TableNodeRecord` (address, zone), an
  ephemeral key bound to the node's meta session (like a bookie's
  registration): a node whose session expires is not a placement candidate;
- ``/tables/<name>/config``: :class:`TableRecord` (table id, partitions P,
  replicas R, created_ms, copysets G);
- ``/tables/<name>/partitions/<g>``: :class:`PartitionRecord` (members,
  learners, epoch) of the table's Raft group g, rewritten by the scheduler
  (CAS) after each committed configuration change (docs/table.md,
  "Scheduler").

Partitions and Raft groups, in Curve's words: the partition of a hash_key is
``crc32c(hash_key) % P``; partition p lives in the table's **copyset**
``p % G`` (:func:`copyset_of`), one Raft group with one RocksDB that holds all
of its partitions' records. A table created without a copyset count has
G = P: each Raft group is one partition, as in Pegasus. Fewer copysets than
partitions share the per-group costs of Raft (a log entry, its messages, a
RocksDB write batch) between partitions; docs/table.md, "Partitions and copysets", has the
numbers. Group records are indexed by copyset; with G = P the copyset of
partition p is p. The Raft group id of copyset g of table t is
:func:`group_id_of` (t, g).

:func:`create_table` places every copyset with ``place_replicas`` over the
registered table nodes and writes all records in one meta transaction that
also checks the table does not exist.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import crc32c
import msgspec

from quorumlog.errors import UsageError, invariant
from quorumlog.meta import Compare, CompareOp, CompareTarget, DeleteOp, MetaClient, PutOp
from quorumlog.table._errors import TableError
from quorumlog.table._placement import ClusterLoad, NodeCandidate, place_replicas

TABLES_PREFIX = "/tables/"
TABLE_NODES_PREFIX = "/table-nodes/"
# Duplication progress per table (table/_dup_layout.py), dropped with the table.
DUP_PROGRESS_PREFIX = "/dup-progress/"
# Table nodes an operator drains (``quorumlog table drain``): one key per node.
TABLE_DRAIN_PREFIX = "/table-drain/"
TABLE_ID_SEQUENCE = "table"
PARTITIONS_MAX = 4096  # partitions of one table (Pegasus tables use 8..1024)
PARTITION_BITS = 20  # group id layout: table id above these bits, partition below
REPLICAS_MAX = 7
TABLE_NAME_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,128}")
# Table group ids start above this bit, so they never meet the meta group's (1).
TABLE_GROUP_BASE = 1 << 48


class UnknownTableError(TableError, UsageError):
    """No table of this name (or it was dropped): ``quorumlog table list``."""


class TableExistsError(TableError, UsageError):
    """A table of this name exists already."""


class TableNodeRecord(msgspec.Struct, frozen=True):
    node_id: int
    address: str
    zone: str = "default"


class TableRecord(msgspec.Struct, frozen=True):
    table_id: int
    partitions: int
    replicas: int
    created_ms: int
    # Raft groups (copysets) the partitions live in; 0: one per partition (records
    # written before copysets existed read as that).
    copysets: int = 0

    @property
    def groups(self) -> int:
        """The table's Raft groups: its copysets (G), P when each is one partition."""
        return self.copysets or self.partitions

    def copyset_of(self, partition: int) -> int:
        """The copyset (index of the Raft group) that holds ``partition``."""
        return partition % self.groups


class PartitionRecord(msgspec.Struct, frozen=True):
    """A partition's Raft group as the scheduler last recorded it.

    ``members`` are the voters, ``learners`` the replicas catching up before
    a promotion; ``epoch`` is the group's epoch when the scheduler wrote the
    record (0: never changed since create, so the members bootstrap the group).
    """

    members: tuple[int, ...]
    epoch: int = 0
    learners: tuple[int, ...] = ()

    @property
    def replicas(self) -> tuple[int, ...]:
        """Every node that hosts a replica: voters, then learners."""
        return self.members + tuple(n for n in self.learners if n not in self.members)


def keeps_replica(node_id: int, record: PartitionRecord, *, group_epoch: int,
                  group_members: frozenset[int]) -> bool:
    """Whether ``node_id`` keeps its replica of a partition given its record and
    the replica's own view of the group (its epoch and members).

    The record names the node, or the replica's group has moved past the
    record's epoch and still has the node: the scheduler writes records from
    heartbeats, a round behind the group, so a record can still lack a learner
    the scheduler added a moment ago. Dropping on such a record deleted a
    replica the group still counted on (found by the table simulator: the
    learner was wiped, then promoted with no data, or stuck as a learner the
    leader could never catch up).
    """
    return node_id in record.replicas or (group_epoch > record.epoch
                                          and node_id in group_members)


def voter_of(node_id: int, records: Mapping[int, PartitionRecord]) -> list[int]:
    """The groups whose records count ``node_id`` as a voter. At a node's first
    reconcile with nothing on disk (no table data, no marker), any such group
    means its data was lost with the disk: a node registers only after that
    reconcile, and nothing is placed on a node never registered."""
    return sorted(gid for gid, record in records.items() if node_id in record.members)


def lost_replicas(node_id: int, records: Mapping[int, PartitionRecord],
                  lost: Mapping[int, int] | None, hosted: Collection[int]) -> dict[int, int]:
    """The partition groups a node whose table Raft data is gone must not host,
    each with the record epoch at which it was found lost.

    Such a node (a wiped disk, restarted under its old id) that opened its old
    replicas would start them empty, as a founding member's bootstrap or a
    joiner's empty log, and its vote could elect a replica lacking writes it had
    acknowledged (a real run lost an acknowledged set this way). At its first
    reconcile (``lost`` None) every group whose record names it and that it does
    not host is lost; a group stays lost while the node is one of its voters or
    its record has not moved past the epoch it was lost at (a record lags its
    group by a heartbeat: a "learner" there may be a voter already). The
    scheduler replaces the lost voters (``NodeReport.lost_groups``); once a
    later record no longer counts the node as a voter, a new assignment (a
    learner) opens as a new replica that catches up from the leader.
    """
    if lost is None:
        return {gid: record.epoch for gid, record in records.items()
                if node_id in record.replicas and gid not in hosted}
    return {gid: epoch for gid, epoch in lost.items()
            if gid in records and (node_id in records[gid].members
                                   or records[gid].epoch <= epoch)}


@dataclass(slots=True)
class LostReplicas:
    """What a table node decides about its old replicas after a data loss, look by
    look at the records (``TableService`` and the table simulator run this one).

    ``data_lost``: its marker is there and its table Raft data is gone.
    ``nothing_on_disk``: no marker and no data, a first start or a whole data
    directory lost; the first look decides (``voter_of``)."""

    node_id: int
    data_lost: bool
    nothing_on_disk: bool
    groups: dict[int, int] | None = None  # lost_replicas: group id -> epoch when lost

    def update(self, records: Mapping[int, PartitionRecord],
               hosted: Collection[int]) -> dict[int, int]:
        """The groups not to host now; the first call may find the data lost."""
        if self.nothing_on_disk:
            self.nothing_on_disk = False
            self.data_lost = bool(voter_of(self.node_id, records))
        if not self.data_lost:
            return {}
        self.groups = lost_replicas(self.node_id, records, self.groups, hosted)
        return self.groups


@dataclass(frozen=True, slots=True)
class TableLayout:
    """A table's record and the members of each Raft group (index = copyset; the
    partition's own index when each group is one partition)."""

    name: str
    record: TableRecord
    partitions: tuple[PartitionRecord, ...]

    def group_of(self, partition: int) -> PartitionRecord:
        """The record of the Raft group (copyset) that holds ``partition``."""
        return self.partitions[self.record.copyset_of(partition)]


def check_table_name(name: str) -> str:
    if not TABLE_NAME_PATTERN.fullmatch(name):
        raise UsageError(f"table name {name!r} must be 1..128 characters of A-Z a-z 0-9 _ . -")
    return name


def config_key(name: str) -> str:
    return f"{TABLES_PREFIX}{name}/config"


def partition_key(name: str, partition: int) -> str:
    return f"{TABLES_PREFIX}{name}/partitions/{partition}"


def table_node_key(node_id: int) -> str:
    return f"{TABLE_NODES_PREFIX}{node_id}"


def partition_of(hash_key: bytes, partitions: int) -> int:
    """The partition of ``hash_key`` in a table of ``partitions`` partitions."""
    return crc32c.crc32c(hash_key) % partitions


def group_id_of(table_id: int, partition: int) -> int:
    """The Raft group id of a table's group ``partition`` (its copyset index; the
    partition's own index when each group is one partition); never the meta
    group's."""
    invariant(0 <= partition < (1 << PARTITION_BITS), f"partition {partition} out of range")
    invariant(0 < table_id < (1 << (48 - PARTITION_BITS)), f"table id {table_id} out of range")
    return TABLE_GROUP_BASE | table_id << PARTITION_BITS | partition


def is_table_group(group_id: int) -> bool:
    """Whether a Raft group id is a table partition's (not meta's)."""
    return group_id >= TABLE_GROUP_BASE


_ENCODER = msgspec.msgpack.Encoder()
_DECODE_TABLE = msgspec.msgpack.Decoder(TableRecord)
_DECODE_PARTITION = msgspec.msgpack.Decoder(PartitionRecord)
_DECODE_NODE = msgspec.msgpack.Decoder(TableNodeRecord)


def encode(record: TableRecord | PartitionRecord | TableNodeRecord) -> bytes:
    return _ENCODER.encode(record)


def decode_node(raw: bytes) -> TableNodeRecord:
    return _DECODE_NODE.decode(raw)


async def table_nodes(meta: MetaClient) -> dict[int, TableNodeRecord]:
    """The registered (live) table nodes by id."""
    nodes = [decode_node(kv.value) for kv in await meta.list_keys(TABLE_NODES_PREFIX)]
    return {node.node_id: node for node in nodes}


def drain_key(node_id: int) -> str:
    return f"{TABLE_DRAIN_PREFIX}{node_id}"


async def draining_nodes(meta: MetaClient) -> frozenset[int]:
    """The table nodes being drained."""
    return frozenset(int(kv.key[len(TABLE_DRAIN_PREFIX):])
                     for kv in await meta.list_keys(TABLE_DRAIN_PREFIX)
                     if kv.key[len(TABLE_DRAIN_PREFIX):].isdigit())


async def set_draining(meta: MetaClient, node_id: int, draining: bool) -> None:
    """Start (or stop) draining a table node: the scheduler moves its replicas to
    the other nodes and places nothing new on it. A node neither registered nor
    holding a replica is refused (a typo would otherwise drain nothing)."""
    if draining:
        known = set(await table_nodes(meta))
        for layout in (await all_layouts(meta)).values():
            for record in layout.partitions:
                known.update(record.members, record.learners)
        if node_id not in known:
            raise UsageError(f"no table node {node_id}: it is not registered and holds no "
                             f"replica (table nodes: {sorted(known)})")
        await meta.put(drain_key(node_id), b"")
    else:
        await meta.delete(drain_key(node_id))


def parse_layouts(kvs: list[tuple[str, bytes]]) -> dict[str, TableLayout]:
    """Every complete table in a listing of ``/tables/``."""
    records: dict[str, TableRecord] = {}
    parts: dict[str, dict[int, PartitionRecord]] = {}
    for key, value in kvs:
        name, _, rest = key[len(TABLES_PREFIX):].partition("/")
        if rest == "config":
            records[name] = _DECODE_TABLE.decode(value)
        elif rest.startswith("partitions/"):
            parts.setdefault(name, {})[int(rest.split("/", 1)[1])] = (
                _DECODE_PARTITION.decode(value))
    out = {}
    for name, record in records.items():
        found = parts.get(name, {})
        if sorted(found) == list(range(record.groups)):
            out[name] = TableLayout(name, record, tuple(found[p] for p in sorted(found)))
    return out


async def all_layouts(meta: MetaClient) -> dict[str, TableLayout]:
    kvs = await meta.list_keys(TABLES_PREFIX)
    return parse_layouts([(kv.key, kv.value) for kv in kvs])


async def create_table(meta: MetaClient, name: str, *, partitions: int, replicas: int,
                       copysets: int | None = None, seed: int | None = None) -> TableLayout:
    """Place and record a new table of ``partitions`` partitions in ``copysets``
    Raft groups (None: one per partition); raises TableExistsError or
    NotEnoughTableNodesError."""
    check_table_name(name)
    if not 1 <= partitions <= PARTITIONS_MAX:
        raise UsageError(f"partitions must be in 1..{PARTITIONS_MAX}, got {partitions}")
    if copysets is not None and not 1 <= copysets <= partitions:
        raise UsageError(f"copysets must be in 1..{partitions} (the partitions), "
                         f"got {copysets}")
    groups = partitions if copysets is None else copysets
    if not 1 <= replicas <= REPLICAS_MAX:
        raise UsageError(f"replicas must be in 1..{REPLICAS_MAX}, got {replicas}")
    if await meta.get(config_key(name)) is not None:
        raise TableExistsError(f"table {name!r} exists; drop it first or pick another name")
    nodes = await table_nodes(meta)
    draining = await draining_nodes(meta)
    candidates = [NodeCandidate(n.node_id, n.zone) for n in nodes.values()
                  if n.node_id not in draining]
    existing = await all_layouts(meta)
    load = ClusterLoad.of(p.members for t in existing.values() for p in t.partitions)
    rng = random.Random(seed)
    placed = []
    for _ in range(groups):
        members = place_replicas(candidates, replicas, load, rng=rng)
        load.add(members)
        placed.append(PartitionRecord(members=tuple(sorted(members))))
    table_id = await meta.next_id(TABLE_ID_SEQUENCE)
    record = TableRecord(table_id=table_id, partitions=partitions, replicas=replicas,
                         created_ms=int(time.time() * 1000),
                         copysets=0 if groups == partitions else groups)
    puts = [PutOp(key=config_key(name), value=encode(record))]
    puts += [PutOp(key=partition_key(name, p), value=encode(part))
             for p, part in enumerate(placed)]
    result = await meta.txn(
        compares=[Compare(key=config_key(name), target=CompareTarget.VERSION,
                          op=CompareOp.EQUAL, version=0)],
        success=puts)
    if not result.succeeded:
        raise TableExistsError(f"table {name!r} was created meanwhile by another client")
    return TableLayout(name, record, tuple(placed))


async def table_info(meta: MetaClient, name: str) -> TableLayout:
    check_table_name(name)
    kvs = await meta.list_keys(f"{TABLES_PREFIX}{name}/")
    layout = parse_layouts([(kv.key, kv.value) for kv in kvs]).get(name)
    if layout is None:
        raise UnknownTableError(f"no table {name!r}; `quorumlog table list` shows the tables")
    return layout


async def list_tables(meta: MetaClient) -> list[TableLayout]:
    return [layout for _, layout in sorted((await all_layouts(meta)).items())]


async def drop_table(meta: MetaClient, name: str) -> None:
    """Remove a table's records; its replicas stop serving it at once and table
    nodes delete its data (docs/table.md)."""
    await table_info(meta, name)  # UnknownTableError when absent
    await meta.txn(success=[DeleteOp(key=f"{TABLES_PREFIX}{name}/", prefix=True),
                            DeleteOp(key=f"{DUP_PROGRESS_PREFIX}{name}/", prefix=True)])
