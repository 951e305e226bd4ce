"""Ledger metadata values and placement policies."""

from __future__ import annotations

import random

import pytest

from quorumlog.errors import InvariantViolation, UsageError
from quorumlog.ledger import (
    BookieCandidate,
    DigestType,
    Fragment,
    LedgerMetadata,
    LedgerState,
    NotEnoughBookiesError,
    choose_rack_aware,
    choose_random,
    choose_replacement,
    master_key,
    password_digest,
)


def _meta(**kw: object) -> LedgerMetadata:
    base: dict[str, object] = dict(
        ledger_id=7, ensemble_size=3, write_quorum=2, ack_quorum=2,
        digest=DigestType.CRC32C, password_sha256=password_digest(b"pw"),
        ensembles=(Fragment(0, ("a", "b", "c")),),
    )
    base.update(kw)
    return LedgerMetadata(**base)  # type: ignore[arg-type]


def test_metadata_round_trip_and_lookup() -> None:
    m = _meta(custom={"app": b"x"})
    m2 = m.with_replaced_bookies({1: "d"}, lac=9)
    assert m2.ensembles == (Fragment(0, ("a", "b", "c")), Fragment(10, ("a", "d", "c")))
    assert m2.ensemble_for(9) == ("a", "b", "c")
    assert m2.ensemble_for(10) == ("a", "d", "c")
    assert m2.write_set_bookies(10) == ("d", "c")
    assert m2.write_set_bookies(11) == ("c", "a")
    assert LedgerMetadata.decode(m2.encode()) == m2
    closed = m2.in_recovery().closed(last_entry_id=12, length_bytes=100)
    assert closed.state is LedgerState.CLOSED and closed.is_closed
    with pytest.raises(InvariantViolation):
        closed.with_replaced_bookies({0: "e"}, lac=12)


def test_second_change_at_same_lac_replaces_the_empty_fragment() -> None:
    m = _meta().with_replaced_bookies({1: "d"}, lac=4).with_replaced_bookies({2: "e"}, lac=4)
    assert m.ensembles == (Fragment(0, ("a", "b", "c")), Fragment(5, ("a", "d", "e")))


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"ensemble_size": 1}, "ensemble >= write_quorum"),
        ({"ensembles": (Fragment(1, ("a", "b", "c")),)}, "must start at entry 0"),
        ({"ensembles": (Fragment(0, ("a", "a", "c")),)}, "duplicate bookie"),
        ({"ensembles": (Fragment(0, ("a", "b")),)}, "expected 3"),
    ],
)
def test_metadata_rejects_bad_values(kw: dict[str, object], needle: str) -> None:
    with pytest.raises(UsageError, match=needle):
        _meta(**kw)


def test_metadata_decode_garbage_is_clear() -> None:
    with pytest.raises(UsageError, match="malformed"):
        LedgerMetadata.decode(b"\x01garbage")


def test_keys_differ_and_hide_password() -> None:
    assert master_key(b"pw") != master_key(b"other")
    assert password_digest(b"pw") != master_key(b"pw")
    assert b"pw" not in password_digest(b"pw")


def test_random_placement_is_seeded_and_distinct() -> None:
    cands = [BookieCandidate(f"b{i}") for i in range(6)] + [BookieCandidate("ro", writable=False)]
    p1 = choose_random(cands, 4, random.Random(1))
    p2 = choose_random(cands, 4, random.Random(1))
    assert p1 == p2
    assert len(set(p1.bookies)) == 4 and "ro" not in p1.bookies
    with pytest.raises(NotEnoughBookiesError, match="need 7 writable bookies, 6 available"):
        choose_random(cands, 7, random.Random(1))


def test_rack_aware_spreads_every_write_set() -> None:
    cands = [BookieCandidate(f"b{i}", rack=f"r{i % 3}") for i in range(9)]
    for seed in range(50):
        p = choose_rack_aware(cands, 6, write_quorum=3, min_racks=3, rng=random.Random(seed))
        racks = {c.address: c.rack for c in cands}
        assert p.spread_ok
        for first in range(6):
            assert len({racks[p.bookies[(first + k) % 6]] for k in range(3)}) == 3
    one_rack = [BookieCandidate(f"b{i}", rack="r") for i in range(3)]
    flat = choose_rack_aware(one_rack, 3, write_quorum=2, min_racks=2, rng=random.Random(0))
    assert not flat.spread_ok


def test_replacement_keeps_spread_and_avoids_members() -> None:
    cands = [BookieCandidate(f"b{i}", rack=f"r{i % 2}") for i in range(6)]
    ensemble = ["b0", "b1", "b2", "b3"]  # racks r0 r1 r0 r1
    new = choose_replacement(cands, ensemble, 1, random.Random(3), write_quorum=2, min_racks=2)
    assert new in {"b5"}  # the only r1 bookie outside the ensemble
    with pytest.raises(NotEnoughBookiesError):
        choose_replacement(cands[:4], ensemble, 0, random.Random(0))
