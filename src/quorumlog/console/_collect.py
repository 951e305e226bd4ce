"""What the console shows, read from the cluster through the public clients.

One :class:`Collector` keeps its clients open between samples (a meta client,
a ledger client through the stream client, a table client, an rpc pool for the
bookies' and meta members' own status) and turns one round of reads into a
:class:`Snapshot`: plain JSON-able dicts, the same fields the CLI prints with
``--json`` (``meta member list``, ``status``, ``stream info``, ``ledger info``,
``table info``, ``recovery status``, ``dup status``).

A section that fails to read (no meta leader during an election, a table node
down) keeps its error text in ``errors`` and the page says so; the other
sections still show.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from quorumlog import rpc
from quorumlog.errors import QuorumlogError
from quorumlog.proto import BOOKIE_REGISTRY_PREFIX, BookieRegistration, BookieStatusRequest
from quorumlog.recovery import recovery_status, underreplicated
from quorumlog.stream import StreamClient
from quorumlog.table import TableClient, fetch_schedule, group_id_of

STATUS_TIMEOUT_S = 2.0  # one member's or bookie's status answer; an unreachable one says so
LEDGERS_SHOWN_MAX = 200  # ledgers listed with their ensembles (the newest ids)
SECTIONS = ("members", "bookies", "streams", "ledgers", "tables", "recovery")


@dataclass
class Snapshot:
    """One round of reads. ``taken_ms`` is wall time; ``errors`` maps a section
    to why it could not be read this round."""

    taken_ms: int
    members: list[dict[str, Any]] = field(default_factory=list)
    bookies: list[dict[str, Any]] = field(default_factory=list)
    streams: list[dict[str, Any]] = field(default_factory=list)
    ledgers: list[dict[str, Any]] = field(default_factory=list)
    tables: list[dict[str, Any]] = field(default_factory=list)
    recovery: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"taken_ms": self.taken_ms, **{s: getattr(self, s) for s in SECTIONS},
                "errors": dict(self.errors)}


def bookie_state(status: Any) -> str:
    """The state ``quorumlog status`` shows for a bookie's status answer."""
    if status.read_only:
        return "read-only"
    return "writable" if status.registered else "unregistered"


class Collector:
    """Reads the cluster at ``members`` (meta addresses); :meth:`close` when done."""

    def __init__(self, members: list[str]) -> None:
        self._members = members
        self._streams: StreamClient | None = None
        self._tables: TableClient | None = None
        self._pool = rpc.Pool()

    async def _stream_client(self) -> StreamClient:
        if self._streams is None:
            self._streams = await StreamClient.connect(self._members)
        return self._streams

    async def close(self) -> None:
        if self._streams is not None:
            await self._streams.close()
        if self._tables is not None:
            await self._tables.close()
        await self._pool.close()

    async def snapshot(self) -> Snapshot:
        snap = Snapshot(taken_ms=int(time.time() * 1000))

        async def section(name: str, read: Callable[[], Awaitable[Any]]) -> None:
            try:
                setattr(snap, name, await read())
            except QuorumlogError as exc:
                snap.errors[name] = exc.message
            except (OSError, TimeoutError) as exc:
                snap.errors[name] = f"{type(exc).__name__}: {exc}"

        await asyncio.gather(
            section("members", self._read_members), section("bookies", self._read_bookies),
            section("streams", self._read_streams), section("ledgers", self._read_ledgers),
            section("tables", self._read_tables), section("recovery", self._read_recovery))
        return snap

    async def _status(self, address: str, request: Any) -> Any:
        return await self._pool.call(address, request, timeout_s=STATUS_TIMEOUT_S)

    async def _read_members(self) -> list[dict[str, Any]]:
        """As ``meta member list --json``: the configuration from the first member
        that answers, then each member's own role, term and indexes."""
        meta = (await self._stream_client()).ledger_client.meta
        config = None
        errors = []
        for address in self._members:
            try:
                config = await meta.status(address)
                break
            except QuorumlogError as exc:
                errors.append(f"{address}: {exc.message}")
        if config is None:
            raise QuorumlogError("no meta member answered (" + "; ".join(errors) + ")")
        known = dict(config.addresses)

        async def one(node_id: int) -> dict[str, Any]:
            row: dict[str, Any] = {"id": node_id, "address": known.get(node_id, "?"),
                                   "kind": "voter" if node_id in config.voters else "learner"}
            try:
                st = await meta.status(str(row["address"]))
            except QuorumlogError as exc:
                row.update(role="unreachable", error=exc.message)
                return row
            row.update(role=st.role, term=st.term, leader=st.leader == node_id,
                       commit_index=st.commit_index, applied_index=st.applied_index,
                       revision=st.revision)
            return row

        ids = sorted({*config.voters, *config.learners})
        return list(await asyncio.gather(*(one(i) for i in ids)))

    async def _read_bookies(self) -> list[dict[str, Any]]:
        """The bookies registered in meta, each with its own status answer (the
        state and disk use ``quorumlog status`` shows)."""
        meta = (await self._stream_client()).ledger_client.meta
        kvs = await meta.list_keys(BOOKIE_REGISTRY_PREFIX)
        registrations = [BookieRegistration.decode(kv.value) for kv in kvs]

        async def one(reg: BookieRegistration) -> dict[str, Any]:
            row: dict[str, Any] = {"id": reg.id, "address": reg.address, "labels": reg.labels}
            try:
                st = await self._status(reg.address, BookieStatusRequest())
            except QuorumlogError as exc:
                row.update(state="unreachable", error=exc.message)
                return row
            row.update(state=bookie_state(st), read_only=st.read_only,
                       registered=st.registered, ledgers=st.ledgers,
                       disk_usage=round(st.disk_usage, 4))
            return row

        return sorted(await asyncio.gather(*(one(r) for r in registrations)),
                      key=lambda r: str(r["address"]))

    async def _read_streams(self) -> list[dict[str, Any]]:
        client = await self._stream_client()
        rows = []
        for name in sorted(await client.list_streams()):
            info = await client.stream_info(name)
            subs = await client.subscriptions(name)
            partitions = []
            for part in info["partitions"]:
                ledgers = part["ledgers"]
                open_entries = 0
                if ledgers and ledgers[-1].get("status", "open") == "open":
                    # The open ledger's entries are in no counter yet: its LAC says.
                    lac = await client.ledger_client.last_add_confirmed(ledgers[-1]["ledger_id"])
                    open_entries = lac + 1
                published = part["entries"] + part["trimmed_entries"] + open_entries
                partitions.append({
                    "partition": part["partition"], "ledger_count": part["ledger_count"],
                    "ledgers": [lg["ledger_id"] for lg in ledgers],
                    "entries": part["entries"] + open_entries, "size_bytes": part["size_bytes"],
                    "published_entries": published, "writer": part["writer"]})
            rows.append({
                "name": name, "config": info["config"], "partitions": partitions,
                "published_entries": sum(p["published_entries"] for p in partitions),
                "backlog_entries": sum(s.backlog_entries for s in subs),
                "subscriptions": [{"name": s.name, "connected": s.connected,
                                   "type": s.type or None,
                                   "consumers": (len(s.consumers) if s.type == "failover"
                                                 else int(s.connected)),
                                   "backlog_entries": s.backlog_entries} for s in subs]})
        return rows

    async def _read_ledgers(self) -> list[dict[str, Any]]:
        """As ``ledger info --json`` for the newest LEDGERS_SHOWN_MAX ledgers."""
        client = (await self._stream_client()).ledger_client
        ids = sorted(await client.list_ledgers())[-LEDGERS_SHOWN_MAX:]
        rows = []
        for ledger_id in ids:
            md = await client.ledger_metadata(ledger_id)
            row: dict[str, Any] = {
                "id": md.ledger_id, "state": md.state.value, "ensemble": md.ensemble_size,
                "write_quorum": md.write_quorum, "ack_quorum": md.ack_quorum,
                "digest": md.digest.value, "last_entry_id": md.last_entry_id,
                "length_bytes": md.length_bytes, "created_ms": md.created_ms,
                "fragments": [{"first_entry_id": f.first_entry_id, "bookies": list(f.bookies)}
                              for f in md.ensembles]}
            if row["state"] != "CLOSED":
                try:
                    row["last_add_confirmed"] = await client.last_add_confirmed(ledger_id)
                except QuorumlogError as exc:
                    row["last_add_confirmed_error"] = exc.message
            rows.append(row)
        return rows

    async def _read_tables(self) -> list[dict[str, Any]]:
        """As ``table info -o json`` per table, plus each duplication's progress
        (``dup status -o json``) and its largest lag."""
        if self._tables is None:
            self._tables = TableClient(self._members)
        layouts = await self._tables.list_tables()
        if not layouts:
            return []
        groups = {g.group_id: g for g in (await fetch_schedule(self._members, self._pool)).groups}
        rows = []
        for layout in layouts:
            r = layout.record
            parts = []
            for p, part in enumerate(layout.partitions):
                group = groups.get(group_id_of(r.table_id, p))
                parts.append({"partition": p, "copyset": p, "leader": group.leader if group else 0,
                              "members": list(part.members), "learners": list(part.learners),
                              "epoch": part.epoch, "group_epoch": group.epoch if group else None,
                              "applied_index": group.applied_index if group else None,
                              "size_bytes": group.size_bytes if group else None})
            dups = []
            for dup in await self._tables.list_dups(layout.name):
                progress = await self._tables.dup_progress(layout.name, dup.dup_id)
                dups.append({
                    "dup_id": dup.dup_id, "remote": dup.remote, "state": dup.state.value,
                    "fail_mode": dup.fail_mode.value,
                    "lag_ms_max": max((p.lag_ms for p in progress.values()), default=0),
                    "pending_decrees": sum(p.pending_decrees for p in progress.values()),
                    "progress": {str(k): msgspec.to_builtins(v)
                                 for k, v in sorted(progress.items())}})
            rows.append({"name": layout.name, "table_id": r.table_id,
                         "partitions": r.partitions, "replicas": r.replicas,
                         "partition_groups": parts, "duplications": dups})
        return rows

    async def _read_recovery(self) -> dict[str, Any]:
        """As ``recovery status --json`` and ``recovery list-underreplicated --json``."""
        meta = (await self._stream_client()).ledger_client.meta
        state = await recovery_status(meta)
        tasks = await underreplicated(meta)
        return {"enabled": state.enabled, "auditor": state.auditor, "missing": state.missing,
                "draining": state.draining, "tasks": state.tasks,
                "underreplicated": [{"ledger": t.ledger_id, "bookies": list(t.bookies),
                                     "state": t.state.value, "attempts": t.attempts,
                                     "error": t.error} for t in tasks]}
