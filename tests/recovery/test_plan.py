"""The pure decisions of auto-recovery: lost bookies, slots, entries, sources."""

from __future__ import annotations

import random

import msgspec
import pytest

from quorumlog.errors import ConfigError
from quorumlog.ledger import (
    BookieCandidate,
    Fragment,
    LedgerMetadata,
    LedgerState,
    password_digest,
)
from quorumlog.proto import DigestType
from quorumlog.recovery import (
    RecoveryConfig,
    entries_of_slot,
    lost_bookies,
    placement_label,
    replacement_for,
    sample_entries,
    slots_to_replace,
)
from quorumlog.recovery._plan import bookies_to_replace, sources_for


def _ledger(e: int, qw: int, ensembles: tuple[Fragment, ...], last: int) -> LedgerMetadata:
    return LedgerMetadata(ledger_id=7, ensemble_size=e, write_quorum=qw, ack_quorum=1,
                          digest=DigestType.CRC32C, password_sha256=password_digest(b""),
                          state=LedgerState.CLOSED, ensembles=ensembles, last_entry_id=last)


def test_lost_after_the_delay_or_draining() -> None:
    missing = {"a": 1_000, "b": 4_000}
    assert lost_bookies(missing, now_ms=5_000, delay_ms=3_000) == {"a"}
    assert lost_bookies(missing, now_ms=5_000, delay_ms=3_000, draining=["c"]) == {"a", "c"}
    assert lost_bookies({}, now_ms=5_000, delay_ms=0) == set()


def test_slots_cover_each_fragment_up_to_the_next() -> None:
    md = _ledger(3, 2, (Fragment(0, ("a", "b", "c")), Fragment(10, ("a", "d", "c"))), 14)
    assert bookies_to_replace(md, {"c", "x"}) == ("c",)
    slots = slots_to_replace(md, ["c"])
    assert [(s.fragment_index, s.position, s.first_entry_id, s.last_entry_id)
            for s in slots] == [(0, 2, 0, 9), (1, 2, 10, 14)]
    # position 2 of E=3, Qw=2 stores entries whose write set {e%3, e%3+1} holds 2
    assert entries_of_slot(md, slots[0]) == [1, 2, 4, 5, 7, 8]
    assert sources_for(md, slots[0], 1, avoid=set()) == ["b"]
    assert sources_for(md, slots[0], 2, avoid={"a"}) == ["a"]  # avoided go last


def test_empty_fragment_has_no_entries() -> None:
    md = _ledger(2, 2, (Fragment(0, ("a", "b")), Fragment(5, ("a", "c"))), 4)
    slot = slots_to_replace(md, ["c"])[0]
    assert slot.last_entry_id < slot.first_entry_id
    assert entries_of_slot(md, slot) == []


def test_write_quorum_one_has_no_other_source() -> None:
    md = _ledger(2, 1, (Fragment(0, ("a", "b")),), 3)
    slot = slots_to_replace(md, ["b"])[0]
    assert entries_of_slot(md, slot) == [1, 3]
    assert sources_for(md, slot, 1, avoid={"b"}) == []  # the worker reports the ledger lost


def test_metadata_swap_and_known_password() -> None:
    md = _ledger(3, 2, (Fragment(0, ("a", "b", "c")),), 3)
    assert md.known_password() == b""
    swapped = md.with_bookie_replaced(0, 1, "d")
    assert swapped.ensembles[0].bookies == ("a", "d", "c")
    other = LedgerMetadata.decode(md.encode())
    assert other == md


RACKS = {"a": "r1", "b": "r2", "c": "r1", "d": "r2", "e": "r1", "f": "r2"}
SEEDS = 64


def _candidates() -> list[BookieCandidate]:
    return [BookieCandidate(bookie, rack) for bookie, rack in sorted(RACKS.items())]


def test_replacement_follows_a_rack_aware_ledgers_policy() -> None:
    # E=4, Qw=2 over racks r1 r2 r1 r2: every write set spans both racks. Only
    # f (r2) keeps that when b (r2) is replaced; e (r1) would not.
    md = msgspec.structs.replace(
        _ledger(4, 2, (Fragment(0, ("a", "b", "c", "d")),), 9), placement="rack_aware")
    assert placement_label(md) == "rack"
    slot = slots_to_replace(md, ["b"])[0]
    chosen = {replacement_for(md, slot, _candidates(), random.Random(seed), min_racks=2)
              for seed in range(SEEDS)}
    assert chosen == {"f"}
    zone = msgspec.structs.replace(md, placement="zone_aware")
    assert placement_label(zone) == "zone"


def test_replacement_of_a_random_ledger_ignores_racks() -> None:
    md = _ledger(4, 2, (Fragment(0, ("a", "b", "c", "d")),), 9)
    assert md.placement == "random" and placement_label(md) is None
    slot = slots_to_replace(md, ["b"])[0]
    chosen = {replacement_for(md, slot, _candidates(), random.Random(seed), min_racks=2)
              for seed in range(SEEDS)}
    assert chosen == {"e", "f"}
    # a policy this code does not know is treated as random, not an error
    odd = msgspec.structs.replace(md, placement="moon_aware")
    assert placement_label(odd) is None


def test_a_ledger_without_recorded_placement_decodes_as_random() -> None:
    md = msgspec.structs.replace(
        _ledger(3, 2, (Fragment(0, ("a", "b", "c")),), 4), placement="rack_aware")
    assert LedgerMetadata.decode(md.encode()).placement == "rack_aware"
    raw = msgspec.msgpack.decode(md.encode())
    del raw["placement"]  # written before the field existed
    assert LedgerMetadata.decode(msgspec.msgpack.encode(raw)).placement == "random"


def test_check_samples_a_share_and_always_the_last_entry() -> None:
    entries = list(range(0, 300, 3))
    assert sample_entries(entries, 100, random.Random(1)) == entries
    for seed in range(SEEDS):
        got = sample_entries(entries, 10, random.Random(seed))
        assert len(got) == 10 and got[-1] == entries[-1] and set(got) <= set(entries)
        assert got == sorted(got)
    assert sample_entries([5], 1, random.Random(0)) == [5]
    assert sample_entries([], 50, random.Random(0)) == []


def test_check_settings_are_validated() -> None:
    RecoveryConfig(check_interval_ms=0, check_sample_percent=1).validate()  # 0: no check
    for bad in ({"check_sample_percent": 0}, {"check_sample_percent": 101},
                {"check_interval_ms": -1}, {"check_reads_in_flight_max": 0}):
        with pytest.raises(ConfigError):
            RecoveryConfig(**bad).validate()  # type: ignore[arg-type]
