"""Ledger metadata (what BookKeeper keeps in ZooKeeper), as a pure value.

Ensembles are a list of fragments ``(first_entry_id, bookies)``: the first
fragment starts at entry 0; an ensemble change appends a fragment starting at
LAC + 1 with one bookie replaced. Metadata changes are new values; the client
writes them to the meta service with compare-and-swap on the version it read.
"""

from __future__ import annotations

import enum
import hashlib

import msgspec

from quorumlog.errors import UsageError, invariant
from quorumlog.ledger._quorum import Schedule
from quorumlog.proto import DigestType

METADATA_FORMAT_VERSION = 1


class LedgerState(enum.StrEnum):
    OPEN = "OPEN"
    IN_RECOVERY = "IN_RECOVERY"
    CLOSED = "CLOSED"


class Fragment(msgspec.Struct, frozen=True, array_like=True):
    first_entry_id: int
    bookies: tuple[str, ...]


class LedgerMetadata(msgspec.Struct, frozen=True, kw_only=True):
    ledger_id: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    digest: DigestType
    password_sha256: bytes
    state: LedgerState = LedgerState.OPEN
    ensembles: tuple[Fragment, ...]
    last_entry_id: int = -1
    length_bytes: int = 0
    custom: dict[str, bytes] = msgspec.field(default_factory=dict)
    created_ms: int = 0
    format_version: int = METADATA_FORMAT_VERSION
    # The ledger password itself, as BookKeeper's metadata keeps it: the
    # re-replication workers (quorumlog.recovery) copy a lost bookie's entries
    # with it (recovery adds carry the master key; HMAC digests need the MAC
    # key). Empty in ledgers created before it was stored; whoever can read
    # meta can write such ledgers, so meta access is as sensitive as bookies'.
    password: bytes = b""
    # The placement policy the ensemble was chosen by ("random", "rack_aware",
    # "zone_aware"): ensemble changes and re-replication choose replacements by
    # the same rules. "random" in ledgers created before it was stored.
    placement: str = "random"

    def __post_init__(self) -> None:
        Schedule(self.ensemble_size, self.write_quorum, self.ack_quorum)  # validates
        if not self.ensembles or self.ensembles[0].first_entry_id != 0:
            raise UsageError(f"ledger {self.ledger_id}: the first fragment must start at entry 0")
        previous = -1
        for fragment in self.ensembles:
            if len(fragment.bookies) != self.ensemble_size:
                raise UsageError(
                    f"ledger {self.ledger_id}: fragment at {fragment.first_entry_id} has "
                    f"{len(fragment.bookies)} bookies, expected {self.ensemble_size}"
                )
            if len(set(fragment.bookies)) != len(fragment.bookies):
                raise UsageError(f"ledger {self.ledger_id}: duplicate bookie in a fragment")
            if fragment.first_entry_id < previous:
                raise UsageError(f"ledger {self.ledger_id}: fragments out of order")
            previous = fragment.first_entry_id

    @property
    def schedule(self) -> Schedule:
        return Schedule(self.ensemble_size, self.write_quorum, self.ack_quorum)

    @property
    def is_closed(self) -> bool:
        return self.state is LedgerState.CLOSED

    def fragment_index(self, entry_id: int) -> int:
        """Index of the fragment holding ``entry_id`` (the last one starting <= it)."""
        invariant(entry_id >= 0, "entry ids start at 0")
        index = 0
        for i, fragment in enumerate(self.ensembles):
            if fragment.first_entry_id <= entry_id:
                index = i
            else:
                break
        return index

    def ensemble_for(self, entry_id: int) -> tuple[str, ...]:
        return self.ensembles[self.fragment_index(entry_id)].bookies

    def write_set_bookies(self, entry_id: int) -> tuple[str, ...]:
        ensemble = self.ensemble_for(entry_id)
        return tuple(ensemble[i] for i in self.schedule.write_set(entry_id))

    @property
    def current_ensemble(self) -> tuple[str, ...]:
        return self.ensembles[-1].bookies

    def with_replaced_bookies(self, replacements: dict[int, str], lac: int) -> LedgerMetadata:
        """A new fragment from LAC + 1 with ensemble indexes replaced."""
        invariant(not self.is_closed, "cannot change the ensemble of a closed ledger")
        current = list(self.current_ensemble)
        for index, bookie in replacements.items():
            invariant(0 <= index < self.ensemble_size, f"ensemble index {index} out of range")
            current[index] = bookie
        if len(set(current)) != len(current):
            raise UsageError("an ensemble change must not put one bookie in the ensemble twice")
        first = lac + 1
        fragments = list(self.ensembles)
        if fragments[-1].first_entry_id == first:
            fragments[-1] = Fragment(first, tuple(current))  # nothing written yet: replace
        else:
            invariant(fragments[-1].first_entry_id < first, "new fragment must start later")
            fragments.append(Fragment(first, tuple(current)))
        return msgspec.structs.replace(self, ensembles=tuple(fragments))

    def known_password(self) -> bytes | None:
        """The ledger password if metadata knows it (stored, or the empty
        password of a ledger created before passwords were stored), else None."""
        if self.password and password_digest(self.password) == self.password_sha256:
            return self.password
        if password_digest(b"") == self.password_sha256:
            return b""
        return None

    def with_bookie_replaced(self, fragment_index: int, position: int,
                             bookie: str) -> LedgerMetadata:
        """The same ledger with ``bookie`` at ``position`` of one fragment
        (re-replication: the entries were copied there first)."""
        invariant(0 <= fragment_index < len(self.ensembles), "fragment index out of range")
        invariant(0 <= position < self.ensemble_size, f"ensemble index {position} out of range")
        fragment = self.ensembles[fragment_index]
        bookies = list(fragment.bookies)
        bookies[position] = bookie
        if len(set(bookies)) != len(bookies):
            raise UsageError(f"ledger {self.ledger_id}: {bookie} is already in the fragment "
                             f"at entry {fragment.first_entry_id}")
        fragments = list(self.ensembles)
        fragments[fragment_index] = Fragment(fragment.first_entry_id, tuple(bookies))
        return msgspec.structs.replace(self, ensembles=tuple(fragments))

    def in_recovery(self) -> LedgerMetadata:
        invariant(not self.is_closed, "a closed ledger needs no recovery")
        return msgspec.structs.replace(self, state=LedgerState.IN_RECOVERY)

    def closed(self, last_entry_id: int, length_bytes: int) -> LedgerMetadata:
        return msgspec.structs.replace(
            self, state=LedgerState.CLOSED, last_entry_id=last_entry_id, length_bytes=length_bytes
        )

    def encode(self) -> bytes:
        return _ENCODER.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> LedgerMetadata:
        try:
            return _DECODER.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise UsageError(f"ledger metadata is malformed: {exc}") from None


def password_digest(password: bytes) -> bytes:
    """What metadata stores of the password (never the password itself)."""
    return hashlib.sha256(b"quorumlog-ledger-password\x00" + password).digest()


def master_key(password: bytes) -> bytes:
    """The key sent with each add; bookies refuse a ledger's adds with another key."""
    return hashlib.sha256(b"quorumlog-master-key\x00" + password).digest()


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(LedgerMetadata)
