"""The periodic check moves a replica that breaks its ledger's placement policy.

The real ``ReplicaChecker`` and ``ReplicationWorker`` run against the
simulator's bookies (the bookie's own rules) and meta on virtual time; the
bookies sit in racks ``rack-<i % 3>``, so b0 and b3 share rack-0, and the
fourth bookie, outside such an ensemble, is the only one that can spread it.
"""

from __future__ import annotations

import random

import msgspec

from quorumlog import proto
from quorumlog.ledger import BookieCandidate, LedgerMetadata, master_key, write_sets_spread
from quorumlog.recovery import (
    RecoveryConfig,
    RecoverySession,
    ReplicaChecker,
    ReplicationWorker,
    misplaced_bookies,
)
from quorumlog.sim import LedgerWorld, run_virtual
from quorumlog.sim._recovery_world import SimRecoveryMeta

PASSWORD = b"pw"
ENTRIES = 10
RACKS = {"b0": "rack-0", "b1": "rack-1", "b2": "rack-2", "b3": "rack-0"}


async def _ledger_on_b0_and_b3(world: LedgerWorld, placement: str) -> int:
    """A closed E=3, Qw=2 ledger whose ensemble holds b0 and b3 (one rack, twice:
    with E=3 every pair is a write set),
    recorded as created with ``placement``."""
    client = world.client("writer")
    while True:
        handle = await client.create_ledger(3, 2, 2, password=PASSWORD)
        for e in range(ENTRIES):
            await handle.append(f"{handle.id}/{e}".encode())
        await handle.close()
        if {"b0", "b3"} <= set(handle.metadata.ensembles[0].bookies):
            break
    key = proto.ledger_key(handle.id)
    kv = await world.meta.get(key)
    assert kv is not None
    metadata = LedgerMetadata.decode(kv.value)
    assert await world.meta.cas(key, kv.version, msgspec.structs.replace(
        metadata, placement=placement).encode())
    return handle.id


def test_check_moves_a_misplaced_replica_and_leaves_random_ledgers() -> None:
    async def scenario() -> None:
        world = LedgerWorld(bookies=4, seed=3)
        world.meta = meta = SimRecoveryMeta(random.Random(1), world.tracer, world.network)
        aware = await _ledger_on_b0_and_b3(world, "rack_aware")
        plain = await _ledger_on_b0_and_b3(world, "random")
        config = RecoveryConfig(check_interval_ms=1000)
        client = world.client("auditor")
        checker = ReplicaChecker(client, meta, config, clock=world, rng=random.Random(2))

        found = await checker.check_once()
        assert set(found.misplaced) == {aware}  # the random ledger does not care
        (moved,) = found.misplaced[aware]
        assert moved in {"b0", "b3"} and not found.missing

        # The other replicas of the moved bookie's share are gone: the move must
        # read the share from the misplaced bookie itself.
        metadata = meta.peek(aware)
        assert metadata is not None
        (outside,) = set(RACKS) - set(metadata.ensembles[0].bookies)  # not rack-0
        for other in set(metadata.ensembles[0].bookies) - {moved}:
            world.bookies[other].delete_ledger(aware, master_key(PASSWORD))
        worker = ReplicationWorker("w", world.client("worker"), meta,
                                   RecoverySession(meta, config.lease_ttl_ms), config,
                                   clock=world, rng=random.Random(4))
        assert await worker.work_once() == [aware]
        after = meta.peek(aware)
        assert after is not None
        ensemble = after.ensembles[0].bookies
        assert moved not in ensemble and outside in ensemble  # the only bookie that helps
        assert write_sets_spread([RACKS[b] for b in ensemble], 2, 2)
        held = world.bookies[outside].durable_entries(aware)
        assert sorted(held) == [e for e in range(ENTRIES)
                                if outside in after.write_set_bookies(e)]
        assert held  # copied from the misplaced bookie, the only one left holding them
        unmoved = meta.peek(plain)
        assert unmoved is not None and {"b0", "b3"} <= set(unmoved.ensembles[0].bookies)

        again = await checker.check_once()  # placed well now: nothing more to move
        assert not again.misplaced
        emptied = set(metadata.ensembles[0].bookies) - {moved}
        assert again.missing == {aware: emptied}  # what the test dropped, found as missing

    run_virtual(scenario())


def test_no_move_when_no_single_move_spreads_the_write_sets() -> None:
    async def scenario() -> None:
        world = LedgerWorld(bookies=4, seed=3)
        world.meta = SimRecoveryMeta(random.Random(1), world.tracer, world.network)
        aware = await _ledger_on_b0_and_b3(world, "rack_aware")
        metadata = world.meta.peek(aware)
        assert metadata is not None
        ensemble = metadata.ensembles[0].bookies
        # Only the bookie outside the ensemble (not rack-0) can spread the write
        # sets: not writable, nothing is moved; writable, one replica moves.
        (outside,) = set(RACKS) - set(ensemble)
        candidates = [BookieCandidate(b, RACKS[b], b != outside) for b in sorted(RACKS)]
        assert misplaced_bookies(metadata, candidates, min_racks=2) == set()
        writable = [BookieCandidate(b, RACKS[b], True) for b in sorted(RACKS)]
        assert len(misplaced_bookies(metadata, writable, min_racks=2) & {"b0", "b3"}) == 1
        random_policy = msgspec.structs.replace(metadata, placement="random")
        assert misplaced_bookies(random_policy, writable, min_racks=2) == set()

    run_virtual(scenario())
