"""Batched adds in the ledger client, over simulated bookies on virtual time:
the adds one loop pass makes for a bookie travel as one request, and every
per-entry outcome (acks, fencing, ensemble change) still lands on its entry.

A counting transport wraps the simulated network (which runs the bookie's own
rules, ``quorumlog.bookie.add_entries``) and records every add request."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from quorumlog import proto as wire
from quorumlog.errors import QuorumlogError
from quorumlog.ledger import LedgerClient, LedgerState
from quorumlog.proto import LedgerFencedError
from quorumlog.sim import LedgerWorld

from .support import FAST, in_world, wait_until

PW = b"secret"


@dataclass
class Sent:
    bookie: str
    entry_ids: list[int]
    flags: int


@dataclass
class CountingTransport:
    """A ``BookieTransport`` that records each add request, then forwards it."""

    inner: Any
    adds: list[Sent] = field(default_factory=list)

    def add_entry(self, bookie: str, ledger_id: int, entry_id: int, master_key: bytes,
                  envelope: bytes, *, flags: int, timeout_s: float) -> asyncio.Future[Any]:
        self.adds.append(Sent(bookie, [entry_id], flags))
        future: asyncio.Future[Any] = self.inner.add_entry(
            bookie, ledger_id, entry_id, master_key, envelope, flags=flags, timeout_s=timeout_s)
        return future

    def add_entries(self, bookie: str, ledger_id: int, master_key: bytes,
                    entries: Sequence[tuple[int, bytes]], *, flags: int,
                    timeout_s: float) -> asyncio.Future[list[QuorumlogError | None]]:
        self.adds.append(Sent(bookie, [e for e, _ in entries], flags))
        future: asyncio.Future[list[QuorumlogError | None]] = self.inner.add_entries(
            bookie, ledger_id, master_key, entries, flags=flags, timeout_s=timeout_s)
        return future

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def counting_client(world: LedgerWorld, name: str = "c") -> tuple[LedgerClient, CountingTransport]:
    transport = CountingTransport(world.transport(name))
    return world.client(name, FAST, transport=transport), transport


def test_the_adds_of_one_pass_go_to_each_bookie_in_one_request() -> None:
    async def test(world: LedgerWorld) -> None:
        c, sent = counting_client(world)
        lh = await c.create_ledger(3, 2, 2, password=PW)
        futures = [lh.append_async(b"e%d" % i) for i in range(40)]
        assert sent.adds == []  # nothing leaves before the end of the pass
        assert await asyncio.gather(*futures) == list(range(40))
        ensemble = lh.metadata.current_ensemble
        schedule = lh.metadata.schedule
        assert len(sent.adds) == 3, sent.adds  # one request per bookie, not 80
        for request in sent.adds:
            index = ensemble.index(request.bookie)
            assert request.entry_ids == [i for i in range(40) if schedule.stores(i, index)]
        assert lh.add_batches_sent == 3
        # An awaited append is alone in its pass: it travels as a plain add.
        sent.adds.clear()
        assert await lh.append(b"alone") == 40
        assert [len(r.entry_ids) for r in sent.adds] == [1, 1]
        await lh.close()
        rh = await c.open_ledger(lh.id, password=PW)
        assert [e.payload for e in await rh.read_batch(0, 39)] == [b"e%d" % i
                                                                  for i in range(40)]

    in_world(test)


def test_a_batch_is_split_at_the_entry_bound() -> None:
    async def test(world: LedgerWorld) -> None:
        c, sent = counting_client(world)
        lh = await c.create_ledger(1, 1, 1, password=PW)
        count = wire.ADD_BATCH_ENTRIES_MAX + 10
        futures = [lh.append_async(b"x") for _ in range(count)]
        assert await asyncio.gather(*futures) == list(range(count))
        assert [len(r.entry_ids) for r in sent.adds] == [wire.ADD_BATCH_ENTRIES_MAX, 10]

    in_world(test, bookies=3)


def test_a_failed_batch_replaces_the_bookie_and_resends_in_order() -> None:
    async def test(world: LedgerWorld) -> None:
        c, sent = counting_client(world)
        lh = await c.create_ledger(3, 3, 2, password=PW)
        victim = lh.metadata.current_ensemble[1]
        world.bookies[victim].crash()
        futures = [lh.append_async(b"e%d" % i) for i in range(30)]
        assert await asyncio.gather(*futures) == list(range(30))
        assert lh.ensemble_changes >= 1 and victim not in lh.metadata.current_ensemble
        newcomer = lh.metadata.current_ensemble[1]
        resent = [r.entry_ids for r in sent.adds if r.bookie == newcomer]
        assert resent and all(ids == sorted(ids) for ids in resent)
        # Every entry from the new fragment's first one reaches the newcomer
        # (Qa = 2 confirmed them already; its own answers may still be on the way).
        first = lh.metadata.ensembles[-1].first_entry_id
        await wait_until(lambda: set(world.bookies[newcomer].entries(lh.id))
                         >= set(range(first, 30)))

    in_world(test)


def test_recovery_rewrites_travel_in_batches() -> None:
    async def test(world: LedgerWorld) -> None:
        writer = world.client("writer", FAST)
        lh = await writer.create_ledger(3, 3, 2, password=PW)
        count = 200
        futures = [lh.append_async(b"r%d" % i) for i in range(count)]
        await asyncio.gather(*futures)
        await lh.abort()  # the bookies know no LAC past what the envelopes carried
        c, sent = counting_client(world, "recoverer")
        recovered = await c.open_ledger(lh.id, password=PW)
        assert recovered.metadata.state is LedgerState.CLOSED
        assert recovered.metadata.last_entry_id == count - 1
        rewrites = [r for r in sent.adds if r.flags & wire.FLAG_RECOVERY]
        rewritten = sum(len(r.entry_ids) for r in rewrites)
        assert rewritten >= 3  # the entries past the last piggybacked LAC, to 3 bookies
        assert len(rewrites) < rewritten, (len(rewrites), rewritten)
        assert max(len(r.entry_ids) for r in rewrites) > 1

    in_world(test)


def test_a_fence_between_batches_fails_the_writer() -> None:
    async def test(world: LedgerWorld) -> None:
        c, _ = counting_client(world)
        lh = await c.create_ledger(3, 2, 2, password=PW)
        assert await asyncio.gather(*(lh.append_async(b"a") for _ in range(10))) == list(
            range(10))
        other = world.client("other", FAST)
        recovered = await other.open_ledger(lh.id, password=PW)
        assert recovered.metadata.last_entry_id == 9
        futures = [lh.append_async(b"b") for _ in range(10)]
        for future in futures:
            with pytest.raises(LedgerFencedError):
                await future

    in_world(test)


def test_a_batch_is_split_at_the_byte_bound() -> None:
    async def test(world: LedgerWorld) -> None:
        c, sent = counting_client(world)
        lh = await c.create_ledger(1, 1, 1, password=PW)
        big = b"x" * (wire.ADD_BATCH_BYTES_MAX * 2 // 5)  # two fit in a batch, three do not
        futures = [lh.append_async(big) for _ in range(5)]
        assert await asyncio.gather(*futures) == list(range(5))
        assert [r.entry_ids for r in sent.adds] == [[0, 1], [2, 3], [4]]

    in_world(test, bookies=3)


def test_one_refused_entry_of_a_batch_replaces_only_for_that_entry() -> None:
    """A bookie that refuses one entry of a batch (too large for it) acks the
    others; the refused entry alone triggers the ensemble change."""

    async def test(world: LedgerWorld) -> None:
        c, sent = counting_client(world)
        lh = await c.create_ledger(3, 3, 3, password=PW)
        picky = lh.metadata.current_ensemble[2]
        bookie = world.bookies[picky]
        bookie.config = bookie.config.replace(
            storage=bookie.config.storage.replace(entry_max_bytes=4096))
        payloads = [b"s0", b"s1", b"L" * 8192, b"s3"]
        futures = [lh.append_async(p) for p in payloads]
        assert await asyncio.gather(*futures) == [0, 1, 2, 3]
        assert lh.ensemble_changes == 1 and picky not in lh.metadata.current_ensemble
        assert [r.entry_ids for r in sent.adds if r.bookie == picky] == [[0, 1, 2, 3]]
        # The entries before the refused one stay on the picky bookie (its
        # per-entry acks counted); the new fragment starts at the refused one.
        assert set(bookie.entries(lh.id)) == {0, 1, 3}
        assert lh.metadata.ensembles[-1].first_entry_id == 2

    in_world(test)


def test_batches_order_resends_and_drop_repeats() -> None:
    """``_batches``: a pass's appends (ascending) keep their order without a
    sort; a resend queued behind newer entries is put in its place, and a
    later queueing of the same entry replaces the earlier one."""
    from quorumlog.ledger._write import _batches

    @dataclass
    class Add:
        entry_id: int

    adds = {i: Add(i) for i in range(6)}

    def queued(entry_id: int, tag: bytes) -> Any:
        return (adds[entry_id], 0, tag)

    ascending = [queued(i, b"x") for i in range(4)]
    assert _batches(ascending) == [ascending]
    mixed = [queued(3, b"a"), queued(4, b"a"), queued(1, b"old"), queued(2, b"a"),
             queued(1, b"new")]
    assert [(q[0].entry_id, q[2]) for q in _batches(mixed)[0]] == [
        (1, b"new"), (2, b"a"), (3, b"a"), (4, b"a")]
    many = [(Add(i), 0, b"z") for i in range(wire.ADD_BATCH_ENTRIES_MAX + 1)]
    split = _batches(many)
    assert [len(b) for b in split] == [wire.ADD_BATCH_ENTRIES_MAX, 1]
