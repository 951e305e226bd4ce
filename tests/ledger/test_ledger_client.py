"""The ledger client against simulated bookies, on virtual time.

Each test builds a small world (bookies, meta, network) with
``support.in_world`` and drives the real ``LedgerClient`` through it: every
protocol path (striping, ack quorums, in-order LAC, ensemble changes,
fencing, recovery, reads, long polls) runs deterministically and instantly.
"""

from __future__ import annotations

import asyncio

import pytest

from quorumlog import proto as wire
from quorumlog import rpc
from quorumlog.errors import UsageError
from quorumlog.ledger import (
    DigestType,
    LedgerClosedError,
    LedgerMetadata,
    LedgerRecoveryError,
    LedgerState,
    LedgerWriteError,
    NotEnoughBookiesError,
    ReadPastLacError,
    WriteHandle,
    password_digest,
)
from quorumlog.proto import (
    DigestMismatchError,
    LedgerFencedError,
    NoSuchLedgerError,
    UnauthorizedError,
    parse_envelope,
)
from quorumlog.sim import LedgerWorld

from .support import client, in_world, wait_until

PW = b"secret"


def _entries_on(world: LedgerWorld, bookie: str, ledger_id: int) -> set[int]:
    return set(world.bookies[bookie].entries(ledger_id))


def _fragments(handle: WriteHandle) -> int:
    return len(handle.metadata.ensembles)


# ----- create ------------------------------------------------------------------------


def test_create_checks_shape_and_contacts_no_bookie() -> None:
    async def test(world: LedgerWorld) -> None:
        c = client(world)
        with pytest.raises(UsageError, match="ensemble >= write_quorum >= ack_quorum"):
            await c.create_ledger(2, 3, 2, password=PW)
        with pytest.raises(UsageError, match="unknown digest"):
            await c.create_ledger(3, 2, 2, digest="md5", password=PW)
        with pytest.raises(UsageError, match="unknown placement"):
            await c.create_ledger(3, 2, 2, placement="closest", password=PW)
        with pytest.raises(NotEnoughBookiesError, match="need 6 writable bookies, 5"):
            await c.create_ledger(6, 2, 2, password=PW)
        lh = await c.create_ledger(3, 2, 2, digest="hmac-sha256", password=PW,
                                   metadata={"app": b"x"})
        assert world.network.requests == 0
        stored = world.meta.peek(lh.id)
        assert stored == lh.metadata
        assert stored is not None and stored.state is LedgerState.OPEN
        assert stored.digest is DigestType.HMAC_SHA256
        assert stored.password_sha256 == password_digest(PW)
        assert stored.custom == {"app": b"x"}
        assert len(set(stored.ensembles[0].bookies)) == 3
        assert stored.ensembles[0].first_entry_id == 0
        second = await c.create_ledger(3, 3, 3, password=PW)
        assert second.id > lh.id
        assert await c.list_ledgers() == [lh.id, second.id]

    in_world(test)


def test_rack_aware_placement_spreads_write_sets() -> None:
    async def test(world: LedgerWorld) -> None:
        c = client(world)
        for _ in range(20):
            lh = await c.create_ledger(3, 2, 2, placement="rack_aware", password=PW)
            racks = {f"b{i}": f"rack-{i % 3}" for i in range(6)}
            assert lh.metadata.placement == "rack_aware"  # replacements follow it
            ensemble = lh.metadata.current_ensemble
            for first in range(3):
                pair = {racks[ensemble[first]], racks[ensemble[(first + 1) % 3]]}
                assert len(pair) == 2, ensemble

    in_world(test, bookies=6)


# ----- write path ------------------------------------------------------------------------


@pytest.mark.parametrize("digest", ["crc32c", "hmac-sha256"])
@pytest.mark.parametrize("shape", [(3, 2, 2), (3, 3, 2), (5, 3, 2), (1, 1, 1)])
def test_append_close_read_back(shape: tuple[int, int, int], digest: str) -> None:
    async def test(world: LedgerWorld) -> None:
        c = client(world)
        lh = await c.create_ledger(*shape, digest=digest, password=PW)
        first = [await lh.append(b"e%d" % i) for i in range(5)]
        futures = [lh.append_async(b"f%d" % i) for i in range(40)]
        assert first == list(range(5))
        assert await asyncio.gather(*futures) == list(range(5, 45))
        assert lh.last_add_confirmed == 44
        await lh.close()
        assert lh.is_closed and lh.metadata.state is LedgerState.CLOSED
        assert lh.metadata.last_entry_id == 44
        assert lh.metadata.length_bytes == 5 * 2 + 10 * 2 + 30 * 3
        # Striping: every bookie holds exactly its write sets' entries.
        e, qw, _ = shape
        schedule = lh.metadata.schedule
        for index, bookie in enumerate(lh.metadata.current_ensemble):
            expected = {i for i in range(45) if schedule.stores(i, index)}
            assert _entries_on(world, bookie, lh.id) == expected
        rh = await c.open_ledger(lh.id, password=PW)
        entries = await rh.read_batch(0, 44)
        assert [x.payload for x in entries[:5]] == [b"e%d" % i for i in range(5)]
        assert [x.entry_id for x in entries] == list(range(45))
        assert [x.entry_id async for x in rh.read(40, 44)] == [40, 41, 42, 43, 44]
        if e == qw:
            assert world.network.request_counts.get("ReadBatchRequest", 0) > 0
        else:
            assert world.network.request_counts.get("ReadBatchRequest", 0) == 0

    in_world(test)


def test_lac_advances_in_order_only() -> None:
    async def test(world: LedgerWorld) -> None:
        c = client(world, add_timeout_ms=5_000)
        lh = await c.create_ledger(3, 2, 2, password=PW)
        slow = lh.metadata.current_ensemble[0]  # in the write sets of entries 0 and 2
        world.bookies[slow].slow_ms = 100
        futures = [lh.append_async(b"x") for _ in range(3)]
        await asyncio.sleep(0.05)  # entry 1 (bookies 1, 2) is durable by now ...
        write_set = lh.metadata.write_set_bookies(1)
        assert all(1 in _entries_on(world, b, lh.id) for b in write_set)
        assert not any(f.done() for f in futures)  # ... but waits for entry 0
        assert lh.last_add_confirmed == -1
        assert await asyncio.gather(*futures) == [0, 1, 2]

    in_world(test)


def test_backpressure_bounds_outstanding_adds() -> None:
    async def test(world: LedgerWorld) -> None:
        c = client(world, outstanding_adds_max=4, outstanding_bytes_max=1000,
                   entry_max_bytes=600)
        lh = await c.create_ledger(3, 2, 2, password=PW)
        futures = [lh.append_async(b"x") for _ in range(4)]
        with pytest.raises(rpc.BackpressureError, match="outstanding"):
            lh.append_async(b"x")
        assert lh.outstanding_adds == 4
        assert await lh.append(b"waits for room") == 4  # append() waits instead
        await asyncio.gather(*futures)
        big = lh.append_async(b"y" * 600)
        with pytest.raises(rpc.BackpressureError):
            lh.append_async(b"y" * 500)  # 1100 bytes outstanding > 1000
        await big
        with pytest.raises(UsageError, match="exceeds entry_max_bytes"):
            lh.append_async(b"z" * 601)
        await lh.close()
        with pytest.raises(LedgerClosedError, match="closed"):
            await lh.append(b"late")

    in_world(test)


# ----- ensemble changes ---------------------------------------------------------------------


def test_crashed_bookie_is_replaced_from_lac_plus_one() -> None:
    async def test(world: LedgerWorld) -> None:
        c = client(world)
        lh = await c.create_ledger(3, 2, 2, password=PW)
        for i in range(10):
            await lh.append(b"a%d" % i)
        victim = lh.metadata.current_ensemble[1]
        world.bookies[victim].crash()
        futures = [lh.append_async(b"b%d" % i) for i in range(20)]
        assert await asyncio.gather(*futures) == list(range(10, 30))
        fragments = lh.metadata.ensembles
        assert len(fragments) == 2 and fragments[1].first_entry_id == 10
        assert victim not in fragments[1].bookies
        assert lh.ensemble_changes == 1
        assert world.meta.peek(lh.id) == lh.metadata
        await lh.close()
        rh = await c.open_ledger(lh.id, password=PW)
        assert [e.payload for e in await rh.read_batch(0, 29)] == (
            [b"a%d" % i for i in range(10)] + [b"b%d" % i for i in range(20)])

    in_world(test)


def test_failure_after_ack_quorum_changes_ensemble_on_next_append() -> None:
    async def test(world: LedgerWorld) -> None:
        c = client(world, add_timeout_ms=100)
        lh = await c.create_ledger(3, 3, 2, password=PW)
        victim = lh.metadata.current_ensemble[2]
        world.network.blocked.add(("c", victim))  # silent: adds time out after Qa
        assert await lh.append(b"one") == 0  # two acks: confirmed, third pending
        await asyncio.sleep(0.2)  # the third add times out: remembered
        assert _fragments(lh) == 1
        assert await lh.append(b"two") == 1  # triggers the change first
        assert _fragments(lh) == 2
        assert lh.metadata.ensembles[1].first_entry_id == 1
        assert victim not in lh.metadata.current_ensemble

    in_world(test)


def test_no_replacement_fails_the_handle_clearly() -> None:
    async def test(world: LedgerWorld) -> None:
        c = client(world, replacement_attempts_max=3)
        lh = await c.create_ledger(3, 2, 2, password=PW)
        await lh.append(b"ok")
        world.bookies[lh.metadata.current_ensemble[0]].crash()
        with pytest.raises(LedgerWriteError, match="cannot replace failed bookies"):
            await asyncio.gather(*(lh.append_async(b"x") for _ in range(3)))
        with pytest.raises(LedgerWriteError):
            await lh.append(b"after")
        await lh.close()  # closes at what was confirmed
        assert lh.metadata.last_entry_id == 0

    in_world(test, bookies=3)


def test_ensemble_changes_are_bounded() -> None:
    async def test(world: LedgerWorld) -> None:
        c = client(world, ensemble_changes_max=2)
        lh = await c.create_ledger(2, 2, 2, password=PW)
        with pytest.raises(LedgerWriteError, match="more than 2 ensemble changes"):
            for _ in range(10):
                world.bookies[lh.metadata.current_ensemble[0]].crash()
                await lh.append(b"x")

    in_world(test, bookies=8)


# ----- close ---------------------------------------------------------------------------------


def test_close_conflicts() -> None:
    async def test(world: LedgerWorld) -> None:
        c = client(world)
        lh = await c.create_ledger(3, 2, 2, password=PW)
        for _ in range(3):
            await lh.append(b"x")
        # Someone else closed it with the same last entry: fine.
        other = client(world, "other")
        rh = await other.open_ledger(lh.id, password=PW)
        assert rh.last_add_confirmed == 2
        await lh.close()
        assert lh.metadata.last_entry_id == 2
        # ... with another last entry: an error.
        lh2 = await c.create_ledger(3, 2, 2, password=PW)
        for _ in range(3):
            await lh2.append(b"x")
        stored = world.meta.peek(lh2.id)
        assert stored is not None
        kv = await world.meta.get(wire.ledger_key(lh2.id))
        assert kv is not None
        assert await world.meta.cas(kv.key, kv.version, stored.closed(0, 1).encode())
        with pytest.raises(LedgerFencedError, match="closed by another client at entry 0"):
            await lh2.close()

    in_world(test)


# ----- recovery ----------------------------------------------------------------------------


def test_recovery_rewrites_partial_entries_and_fences_the_writer() -> None:
    async def test(world: LedgerWorld) -> None:
        writer = client(world, "writer", add_timeout_ms=10_000)
        lh = await writer.create_ledger(3, 3, 2, password=PW)
        for i in range(5):
            await lh.append(b"a%d" % i)
        # Entry 5 reaches one bookie only; the writer never sees it confirmed.
        b0, b1, b2 = lh.metadata.current_ensemble
        world.network.blocked.update({("writer", b1), ("writer", b2)})
        pending = lh.append_async(b"partial")
        await wait_until(lambda: 5 in _entries_on(world, b0, lh.id))
        # Found on any bookie -> recoverable. (Were b1 and b2 faster, their two
        # "no such entry" answers (Qf = 2) would end the ledger at 4: also safe,
        # entry 5 never had Qa acks.)
        world.bookies[b1].slow_ms = world.bookies[b2].slow_ms = 20
        recoverer = client(world, "recoverer")
        rh = await recoverer.open_ledger(lh.id, password=PW)
        assert rh.is_closed and rh.last_add_confirmed == 5
        assert rh.metadata.length_bytes == -1  # unknown after recovery
        for bookie in (b0, b1, b2):  # rewritten to the whole write set
            assert 5 in _entries_on(world, bookie, lh.id)
        assert (await rh.read_entry(5)).payload == b"partial"
        world.network.blocked.clear()
        with pytest.raises(LedgerFencedError):
            await pending  # its late acks cannot reach Qa: fenced
        with pytest.raises(LedgerFencedError):
            await lh.append(b"zombie")
        with pytest.raises(LedgerFencedError, match="closed by another client at entry 5"):
            await lh.close()

    in_world(test)


def test_first_writer_cannot_commit_after_second_closes() -> None:
    async def test(world: LedgerWorld) -> None:
        writer = client(world, "writer")
        lh = await writer.create_ledger(5, 3, 2, password=PW)
        for _ in range(7):
            await lh.append(b"x")
        rh = await client(world, "recoverer").open_ledger(lh.id, password=PW)
        last = rh.last_add_confirmed
        assert last == 6
        late = [lh.append_async(b"late") for _ in range(5)]
        results = await asyncio.gather(*late, return_exceptions=True)
        assert all(isinstance(r, LedgerFencedError) for r in results), results
        assert (world.meta.peek(lh.id) or rh.metadata).last_entry_id == last

    in_world(test)


def test_concurrent_recoveries_agree() -> None:
    async def test(world: LedgerWorld) -> None:
        writer = client(world, "writer")
        lh = await writer.create_ledger(3, 3, 2, password=PW)
        futures = [lh.append_async(b"x%d" % i) for i in range(30)]
        await asyncio.sleep(0.002)  # some in flight
        await lh.abort()
        await asyncio.gather(*futures, return_exceptions=True)
        handles = await asyncio.gather(*(
            client(world, f"r{i}").open_ledger(lh.id, password=PW) for i in range(3)))
        lasts = {h.last_add_confirmed for h in handles}
        assert len(lasts) == 1
        assert handles[0].metadata.is_closed

    in_world(test)


def test_recovery_with_unknown_answers_fails_without_closing() -> None:
    async def test(world: LedgerWorld) -> None:
        writer = client(world, "writer")
        lh = await writer.create_ledger(3, 3, 2, password=PW)
        for _ in range(3):
            await lh.append(b"x")
        await lh.abort()
        b0, b1, _ = lh.metadata.current_ensemble
        recoverer = client(world, "r")
        world.network.blocked.update({("r", b0), ("r", b1)})  # only one answers: Qf = 2
        with pytest.raises(LedgerRecoveryError, match="could not fence"):
            await recoverer.open_ledger(lh.id, password=PW)
        stored = world.meta.peek(lh.id)
        assert stored is not None and stored.state is LedgerState.IN_RECOVERY
        world.network.blocked.clear()
        rh = await recoverer.open_ledger(lh.id, password=PW)
        assert rh.is_closed and rh.last_add_confirmed == 2

    in_world(test)


def test_recovery_of_an_empty_ledger() -> None:
    async def test(world: LedgerWorld) -> None:
        lh = await client(world, "w").create_ledger(5, 2, 2, password=PW)
        rh = await client(world, "r").open_ledger(lh.id, password=PW)
        assert rh.is_closed and rh.last_add_confirmed == -1
        with pytest.raises(ReadPastLacError):
            await rh.read_batch(0, 0)

    in_world(test)


# ----- reads --------------------------------------------------------------------------------


def test_reads_never_pass_the_lac() -> None:
    async def test(world: LedgerWorld) -> None:
        c = client(world, explicit_lac_interval_ms=0)
        lh = await c.create_ledger(3, 2, 2, password=PW)
        for _ in range(5):
            await lh.append(b"x")
        rh = await client(world, "reader").open_ledger(lh.id, password=PW, recovery=False)
        # Bookies know LAC 3 (piggybacked on entry 4); entry 4 is not visible yet.
        assert rh.last_add_confirmed == 3
        with pytest.raises(ReadPastLacError, match="past the last add confirmed"):
            await rh.read_batch(0, 4)
        assert len(await rh.read_batch(0, 3)) == 4
        with pytest.raises(UsageError):
            await rh.read_batch(3, 1)

    in_world(test)


def test_explicit_lac_from_an_idle_writer() -> None:
    async def test(world: LedgerWorld) -> None:
        c = client(world, explicit_lac_interval_ms=10)
        lh = await c.create_ledger(3, 2, 2, password=PW)
        await lh.append(b"only")
        rh = await client(world, "reader").open_ledger(lh.id, password=PW, recovery=False)
        await wait_until(lambda: world.network.request_counts.get("WriteLacRequest", 0) > 0)
        assert await rh.read_last_add_confirmed() == 0
        assert (await rh.read_entry(0)).payload == b"only"

    in_world(test)


def test_long_poll_returns_the_next_entry_or_none() -> None:
    async def test(world: LedgerWorld) -> None:
        loop = asyncio.get_running_loop()
        c = client(world)
        lh = await c.create_ledger(3, 2, 2, password=PW)
        rh = await client(world, "reader").open_ledger(lh.id, password=PW, recovery=False)
        start = loop.time()
        assert await rh.wait_for_entry(after=-1, timeout_ms=300) is None
        assert loop.time() - start >= 0.3
        waiting = asyncio.ensure_future(rh.wait_for_entry(after=-1, timeout_ms=5_000))
        await asyncio.sleep(0.05)
        start = loop.time()
        await lh.append(b"tail")
        entry = await waiting
        assert entry is not None and entry.payload == b"tail" and entry.entry_id == 0
        assert loop.time() - start < 0.1  # answered by the explicit LAC, not the timeout
        await lh.append(b"more")
        await lh.close()
        entry = await rh.wait_for_entry(after=0, timeout_ms=1_000)
        assert entry is not None and entry.payload == b"more"
        assert await rh.wait_for_entry(after=1, timeout_ms=1_000) is None
        assert rh.is_closed

    in_world(test)


def test_speculative_read_beats_a_slow_replica() -> None:
    async def test(world: LedgerWorld) -> None:
        loop = asyncio.get_running_loop()
        c = client(world, read_timeout_ms=2_000, speculative_read_delay_ms=20)
        lh = await c.create_ledger(3, 3, 2, password=PW)
        await lh.append(b"x")
        await lh.close()
        rh = await c.open_ledger(lh.id, password=PW)
        world.bookies[lh.metadata.current_ensemble[0]].slow_ms = 1_000
        start = loop.time()
        assert (await rh.read_entry(0)).payload == b"x"
        assert loop.time() - start < 0.1

    in_world(test)


def test_next_replica_on_error_and_digest_mismatch_names_the_bookie() -> None:
    async def test(world: LedgerWorld) -> None:
        c = client(world)
        lh = await c.create_ledger(3, 2, 2, password=PW)
        await lh.append(b"payload")
        await lh.close()
        first, second = lh.metadata.write_set_bookies(0)
        envelope = world.bookies[first].entries(lh.id)[0]
        corrupt = envelope[:-1] + bytes([envelope[-1] ^ 1])
        world.bookies[first].damage_entry(lh.id, 0, corrupt)
        rh = await c.open_ledger(lh.id, password=PW)
        assert (await rh.read_entry(0)).payload == b"payload"  # from the other replica
        world.bookies[second].damage_entry(lh.id, 0, corrupt)
        with pytest.raises(DigestMismatchError, match=first) as info:
            await rh.read_entry(0)
        assert second in str(info.value)
        parse_envelope(envelope)  # the original was fine

    in_world(test)


def test_pipelined_batch_reads_survive_a_corrupt_and_a_crashed_replica() -> None:
    """E == Qw: batch reads go to both replicas at once; a segment whose batch
    fails (a corrupt entry, a crashed bookie) is finished from the other one."""

    async def test(world: LedgerWorld) -> None:
        c = client(world, batch_read_entries_max=16, batch_reads_in_flight_max=4)
        lh = await c.create_ledger(2, 2, 2, password=PW)
        for i in range(200):
            lh.append_async(b"e%d" % i)
        await lh.close()
        first, second = lh.metadata.current_ensemble
        envelope = world.bookies[first].entries(lh.id)[37]
        world.bookies[first].damage_entry(lh.id, 37, envelope[:-1] + bytes([envelope[-1] ^ 1]))
        rh = await c.open_ledger(lh.id, password=PW)
        entries = await rh.read_batch(0, 199)
        assert [e.payload for e in entries] == [b"e%d" % i for i in range(200)]
        world.bookies[second].crash()
        got = []
        with pytest.raises(DigestMismatchError, match=first):  # no valid copy of entry 37
            async for entry in rh.read(0, 199):
                got.append(entry.payload)
        assert got == [b"e%d" % i for i in range(37)]  # everything before it, in order

    in_world(test)


@pytest.mark.parametrize("digest", ["crc32c", "hmac-sha256"])
@pytest.mark.parametrize("shape", [(2, 2, 2), (3, 2, 2)])
def test_raw_batches_cover_the_range_with_buffers_and_bounds(
        digest: str, shape: tuple[int, int, int]) -> None:
    """read_raw hands out EntryBatch values (one buffer, payload bounds) that
    cover the range exactly, in order: empty payloads, one entry, batches cut
    by the byte bound, a corrupt copy on one replica (read from the other)."""

    async def test(world: LedgerWorld) -> None:
        c = client(world, batch_read_entries_max=16, batch_read_bytes_max=400)
        lh = await c.create_ledger(*shape, password=PW, digest=DigestType(digest))
        payloads = [b"" if i % 5 == 0 else b"p%d-" % i * (i % 7) for i in range(60)]
        for payload in payloads:
            lh.append_async(payload)
        await lh.close()
        owner = lh.metadata.write_set_bookies(23)[0]
        envelope = world.bookies[owner].entries(lh.id)[23]
        world.bookies[owner].damage_entry(lh.id, 23, envelope[:-1] + bytes([envelope[-1] ^ 1]))
        rh = await c.open_ledger(lh.id, password=PW)
        batches = await rh.read_batch_raw(0, 59)
        assert all(len(b) > 0 for b in batches)
        assert [b.first_entry_id for b in batches] == [
            0, *(b.last_entry_id + 1 for b in batches[:-1])]
        assert batches[-1].last_entry_id == 59
        assert [p for b in batches for p in b.payloads()] == payloads
        if shape[0] == shape[1]:
            assert len(batches) < 60  # batch reads, many entries per buffer
            assert any(len(b) < 16 for b in batches[:-1])  # some cut by the byte bound
        assert [e.payload for e in await rh.read_batch(0, 59)] == payloads
        (one,) = await rh.read_batch_raw(7, 7)
        assert (one.first_entry_id, len(one), one.payload(0)) == (7, 1, payloads[7])
        assert [(e.entry_id, e.payload) for e in one.entries()] == [(7, payloads[7])]
        with pytest.raises(ReadPastLacError):
            await rh.read_batch_raw(59, 60)

    in_world(test)


# ----- bad input ------------------------------------------------------------------------------


def test_wrong_password_unknown_ledger_and_delete() -> None:
    async def test(world: LedgerWorld) -> None:
        c = client(world)
        lh = await c.create_ledger(3, 2, 2, password=PW)
        await lh.append(b"x")
        with pytest.raises(UnauthorizedError, match="wrong password for ledger"):
            await c.open_ledger(lh.id, password=b"guess")
        with pytest.raises(NoSuchLedgerError, match="ledger 999 does not exist"):
            await c.open_ledger(999, password=PW)
        with pytest.raises(NoSuchLedgerError):
            await c.delete_ledger(999)
        await lh.close()
        await c.delete_ledger(lh.id)
        assert await c.list_ledgers() == []
        with pytest.raises(NoSuchLedgerError):
            await c.open_ledger(lh.id, password=PW)

    in_world(test)


def test_bookie_refuses_another_master_key() -> None:
    async def test(world: LedgerWorld) -> None:
        c = client(world)
        lh = await c.create_ledger(3, 2, 2, password=PW)
        await lh.append(b"x")
        # A second writer claiming the same ledger id with another password.
        stored = world.meta.peek(lh.id)
        assert stored is not None
        impostor = WriteHandle(c.context, stored, 1, b"other-password")
        impostor._next_entry_id = 1
        with pytest.raises(UnauthorizedError, match="master key"):
            await impostor.append(b"y")

    in_world(test)


def test_metadata_decode_of_stored_value() -> None:
    async def test(world: LedgerWorld) -> None:
        lh = await client(world).create_ledger(3, 2, 2, password=PW)
        kv = await world.meta.get(wire.ledger_key(lh.id))
        assert kv is not None
        assert LedgerMetadata.decode(kv.value) == lh.metadata

    in_world(test)


def test_crc32c_batch_fast_path_agrees_with_decode_entry() -> None:
    """The batch read's one-pass checks accept exactly what decode_entry accepts,
    and stop at the first envelope decode_entry refuses."""
    from quorumlog.proto import crc32c_batch_bounds, decode_entry, encode_entry

    crc = DigestType.CRC32C

    def payloads(batch: list[bytes], skip: int = 0) -> list[bytes]:
        buffer = b"x" * skip + b"".join(batch)
        starts, ends, _ = crc32c_batch_bounds(memoryview(buffer)[skip:],
                                              [len(e) for e in batch], 5, 10)
        return [buffer[skip + s:skip + e] for s, e in zip(starts, ends, strict=True)]

    good = [encode_entry(5, 10 + i, 9 + i, b"payload-%d" % i, digest=crc) for i in range(20)]
    assert payloads(good) == [b"payload-%d" % i for i in range(20)]
    assert payloads(good, skip=7) == payloads(good)
    assert payloads([]) == []
    empty = [encode_entry(5, 10 + i, 9, b"", digest=crc) for i in range(3)]
    assert payloads(empty) == [b"", b"", b""]
    flipped = bytearray(good[3])
    flipped[-1] ^= 1
    hmac_entry = encode_entry(5, 10, 9, b"x", digest=DigestType.HMAC_SHA256, key=b"k" * 32)
    bad_batches = {
        "payload bit flip": [*good[:3], bytes(flipped)],
        "wrong ledger": [encode_entry(6, 10, 9, b"x", digest=crc)],
        "entry gap": [good[0], good[2]],
        "other digest type": [hmac_entry],
        "truncated": [good[0][:-1]],
        "short header": [good[0][:10]],
        "LAC below -1": [encode_entry(5, 10, -2, b"x", digest=crc)],
    }
    for name, batch in bad_batches.items():
        assert payloads(batch) == [b"payload-%d" % i for i in range(len(batch) - 1)], name
        with pytest.raises(DigestMismatchError):  # the careful path names the problem
            for k, envelope in enumerate(batch):
                decode_entry(envelope, ledger_id=5, entry_id=10 + k, digest=crc, source="b1")
