"""Subscriptions as an operator sees them: list with backlog, unsubscribe, reset.

After Pulsar's ``topics subscriptions``, ``unsubscribe``, ``reset-cursor``
and the backlog of ``topics stats``:

- **backlog** is counted in entries: the entries of the partition after the
  cursor's mark-delete (or from where an empty cursor starts) up to the last
  readable one. An entry of a batch counts once however many messages it
  holds, and messages acknowledged individually past the mark-delete are
  still counted (Pulsar counts entries the same way).
- **unsubscribe** deletes the subscription's cursors; **reset** rewrites them
  so that consumption starts at a position, a publish time, ``earliest`` or
  ``latest``. Both refuse while a consumer holds the subscription
  (:class:`StreamInUseError`) unless forced; forced, they also delete the
  consumers' ownership keys (the exclusive owner, or every failover member
  and partition owner) in the same transaction, so their next
  acknowledgement fails (``SubscriptionBusyError``) instead of overwriting
  the change.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from quorumlog.errors import UsageError
from quorumlog.ledger import LedgerClient
from quorumlog.meta import DeleteOp, PutOp
from quorumlog.stream._cursor import CursorState
from quorumlog.stream._errors import StreamInUseError, SubscriptionNotFoundError
from quorumlog.stream._layout import (
    StreamRecord,
    WriterLease,
    check_name,
    cursor_key,
    cursor_key_kind,
    cursor_owner_key,
    cursors_prefix,
    failover_members_prefix,
    failover_prefix,
)
from quorumlog.stream._ledgers import LedgerList
from quorumlog.stream._meta import load_record, version_is
from quorumlog.stream._position import Position, SeqPosition
from quorumlog.stream._reader import LedgerHandles, StartSpec, end_position, resolve_start


@dataclass
class PartitionCursor:
    partition: int
    mark_delete: SeqPosition | None
    start: SeqPosition | None
    backlog_entries: int
    updated_ms: int
    consumer: str = ""  # failover: the consumer reading this partition now


@dataclass
class SubscriptionInfo:
    name: str
    connected: bool  # a consumer holds it now
    partitions: list[PartitionCursor] = field(default_factory=list)
    type: str = ""  # "exclusive" or "failover" while connected
    consumers: list[str] = field(default_factory=list)  # failover members, by name

    @property
    def backlog_entries(self) -> int:
        return sum(p.backlog_entries for p in self.partitions)


async def _entry_offset(ledgers: LedgerList, position: SeqPosition) -> int | None:
    """Entries of the partition before ``position`` (None: its ledger is gone)."""
    info = await ledgers.get(position.seq)
    if info is None:
        return None
    return info.entries_before + position.entry_id


async def _backlog(client: LedgerClient, record: StreamRecord, partition: int,
                   state: CursorState, handles: LedgerHandles) -> int:
    ledgers = LedgerList(client.meta, record.name, partition)
    head = await ledgers.refresh()
    end = await end_position(handles, head)
    end_offset = await _entry_offset(ledgers, end)
    if end_offset is None:  # an empty partition: nothing to read
        return 0
    if state.mark_delete is not None:
        consumed = await _entry_offset(ledgers, state.mark_delete)
        first_offset = None if consumed is None else consumed + 1
    else:
        start = state.start
        first_offset = None if start is None else await _entry_offset(ledgers, start)
    if first_offset is None:  # before everything kept: the whole partition
        first = await ledgers.get(head.first_seq)
        first_offset = first.entries_before if first is not None else end_offset
    return max(0, end_offset - first_offset)


async def list_subscriptions(client: LedgerClient, name: str) -> list[SubscriptionInfo]:
    """Every subscription of the stream with its cursors and backlog."""
    record = await load_record(client.meta, name)
    handles = LedgerHandles(client, record)
    found: dict[str, SubscriptionInfo] = {}
    readers: dict[tuple[str, int], str] = {}
    for kv in await client.meta.list_keys(cursors_prefix(name)):
        subscription, kind, detail = cursor_key_kind(name, kv.key)
        info = found.setdefault(subscription, SubscriptionInfo(subscription, connected=False))
        if kind == "owner":
            info.connected, info.type = True, "exclusive"
        elif kind == "member":
            info.connected, info.type = True, "failover"
            info.consumers.append(detail)
        elif kind == "partition-owner":
            readers[subscription, int(detail)] = WriterLease.decode(kv.value).owner
        elif kind == "cursor":
            state = CursorState.decode(kv.value)
            partition = int(detail)
            info.partitions.append(PartitionCursor(
                partition=partition, mark_delete=state.mark_delete, start=state.start,
                backlog_entries=await _backlog(client, record, partition, state, handles),
                updated_ms=state.updated_ms))
    for info in found.values():
        info.partitions.sort(key=lambda p: p.partition)
        for part in info.partitions:
            part.consumer = readers.get((info.name, part.partition), "")
    return [found[s] for s in sorted(found)]


async def _checked(client: LedgerClient, name: str, subscription: str, *, force: bool,
                   action: str) -> tuple[StreamRecord, list[str], int]:
    """The stream, the subscription's cursor keys, and the owner key's version (0: none)."""
    check_name("subscription", subscription)
    record = await load_record(client.meta, name)
    keys = [cursor_key(name, subscription, p) for p in range(record.config.partitions)]
    present = [k for k in keys if await client.meta.get(k) is not None]
    owner = await client.meta.get(cursor_owner_key(name, subscription))
    members = await client.meta.list_keys(failover_members_prefix(name, subscription))
    if not present and owner is None and not members:
        raise SubscriptionNotFoundError(
            f"stream {name!r} has no subscription {subscription!r} "
            "(quorumlog stream subscriptions lists them)")
    if (owner is not None or members) and not force:
        live = "a live consumer" if owner is not None else f"{len(members)} live consumer(s)"
        raise StreamInUseError(
            f"subscription {subscription!r} of stream {name!r} has {live}; nothing "
            f"was changed. Close them first (or wait for their leases to expire), or {action} "
            "with --force / force=True: their next acknowledgement then fails")
    return record, present, 0 if owner is None else owner.version


async def unsubscribe(client: LedgerClient, name: str, subscription: str, *,
                      force: bool = False) -> None:
    """Delete the subscription's cursors (retention no longer waits for it)."""
    _, present, owner_version = await _checked(client, name, subscription, force=force,
                                               action="unsubscribe")
    owner = cursor_owner_key(name, subscription)
    result = await client.meta.txn(
        compares=[version_is(owner, owner_version)],
        success=[*(DeleteOp(key=k) for k in present), DeleteOp(key=owner),
                 DeleteOp(key=failover_prefix(name, subscription), prefix=True)])
    if not result.succeeded:
        raise StreamInUseError(f"subscription {subscription!r} of stream {name!r} changed "
                               "owner meanwhile; nothing was changed, try again")


async def reset_cursor(client: LedgerClient, name: str, subscription: str, to: StartSpec, *,
                       force: bool = False) -> list[SeqPosition]:
    """Make the subscription start at ``to`` on every partition ('earliest',
    'latest', a publish time in ms, or a Position); returns the positions."""
    if isinstance(to, str) and to not in ("earliest", "latest"):
        raise UsageError(f"reset to 'earliest', 'latest', a publish time in ms or a position, "
                         f"got {to!r}")
    record, _, owner_version = await _checked(client, name, subscription, force=force,
                                              action="reset it")
    if isinstance(to, Position | SeqPosition) and record.config.partitions > 1:
        raise UsageError(f"stream {name!r} has {record.config.partitions} partitions: a "
                         "position names one ledger of one partition; reset to 'earliest', "
                         "'latest' or a publish time instead")
    handles = LedgerHandles(client, record)
    now = client.clock.wall_ms()
    starts: list[SeqPosition] = []
    puts = []
    for partition in range(record.config.partitions):
        start, _ = await resolve_start(client, handles, record, partition, to)
        starts.append(start)
        puts.append(PutOp(key=cursor_key(name, subscription, partition),
                          value=CursorState(start=start, updated_ms=now).encode()))
    owner = cursor_owner_key(name, subscription)
    result = await client.meta.txn(compares=[version_is(owner, owner_version)],
                                   success=[*puts, DeleteOp(key=owner),
                                            DeleteOp(key=failover_prefix(name, subscription),
                                                     prefix=True)])
    if not result.succeeded:
        raise StreamInUseError(f"subscription {subscription!r} of stream {name!r} changed "
                               "owner meanwhile; nothing was changed, try again")
    return starts
