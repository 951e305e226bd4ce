"""Where bookies and ledgers live in meta: the key layout both sides read.

A live, registered bookie has the ephemeral key
``/bookies/available/<bookie id>`` (bound to its session) whose value is a
msgpack ``BookieRegistration``; its ``instance_id`` tells a bookie that was
wiped and re-added (a new instance) from the one that wrote earlier
ledgers. Every bookie that ever started has the persistent key
``/bookies/cookies/<bookie id>``: its cookie (sealed JSON), the identity its
directories must match. Ledger metadata lives under
``/ledgers/<id, 20 digits>`` (``ledger_key``); ledger ids come from
``next_id(LEDGER_ID_COUNTER)``. A ledger a bookie stores whose key is gone
from meta was deleted and is garbage-collected.
"""

from __future__ import annotations

import msgspec

BOOKIE_REGISTRY_PREFIX = "/bookies/available/"
# Persistent (not ephemeral) keys: each bookie's identity, its cookie (see
# the bookie's ``Cookie``). Deleted only by `quorumlog bookie format`.
BOOKIE_COOKIE_PREFIX = "/bookies/cookies/"
BOOKIE_LIMBO_PREFIX = "/bookies/limbo/"  # re-added bookies: ledgers they may have lost
# Persistent: bookies being decommissioned (`quorumlog bookie decommission`). A
# draining bookie still serves reads, but no new ensemble or replacement names
# it, and auto-recovery copies everything it holds elsewhere.
BOOKIE_DRAINING_PREFIX = "/bookies/draining/"
# Persistent: a bookie rewrites /bookies/registrations/<id> each time it
# registers (before the ephemeral key), so the key's version counts its
# registrations. Auto-recovery's auditor compares it between rounds: a bookie
# back and gone again in between restarts its lost-bookie delay.
BOOKIE_REGISTRATIONS_PREFIX = "/bookies/registrations/"
LEDGER_KEY_PREFIX = "/ledgers/"
LEDGER_ID_COUNTER = "ledger"


def ledger_key(ledger_id: int) -> str:
    return f"{LEDGER_KEY_PREFIX}{ledger_id:020d}"


def ledger_id_of_key(key: str) -> int | None:
    """The ledger id of a ``/ledgers/...`` key, None for any other key."""
    if not key.startswith(LEDGER_KEY_PREFIX):
        return None
    tail = key[len(LEDGER_KEY_PREFIX):]
    return int(tail) if tail.isdigit() else None


class BookieRegistration(msgspec.Struct, frozen=True, kw_only=True):
    """What a bookie publishes about itself in meta."""

    id: str  # the bookie id: its rpc address "host:port"
    address: str
    labels: dict[str, str] = msgspec.field(default_factory=dict)  # rack, zone, ...
    read_only: bool = False
    # The instance (cookie) serving under this id; "" from bookies before cookies.
    instance_id: str = ""

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> BookieRegistration:
        return msgspec.msgpack.decode(data, type=cls)
