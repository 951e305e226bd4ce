"""Where auto-recovery keeps its state in meta.

::

    /recovery/auditor                 ephemeral: the elected auditor's id
    /recovery/disabled                present: auditor and workers pause
    /recovery/missing/<bookie>        MissingBookie: since when it is unregistered
    /bookies/draining/<bookie>        present: decommission, replicate it away now
                                      (proto's BOOKIE_DRAINING_PREFIX: ledger placement
                                      skips it too)
    /underreplicated/<ledger, 20 d>   ReplicationTask (one per ledger)
    /underreplicated-locks/<ledger>   ephemeral: the worker copying that ledger
"""

from __future__ import annotations

import enum

import msgspec

from quorumlog import proto as wire
from quorumlog.errors import UsageError

AUDITOR_KEY = "/recovery/auditor"
DISABLED_KEY = "/recovery/disabled"
MISSING_PREFIX = "/recovery/missing/"
DRAINING_PREFIX = wire.BOOKIE_DRAINING_PREFIX
TASK_PREFIX = "/underreplicated/"
LOCK_PREFIX = "/underreplicated-locks/"


def task_key(ledger_id: int) -> str:
    return f"{TASK_PREFIX}{ledger_id:020d}"


def lock_key(ledger_id: int) -> str:
    return f"{LOCK_PREFIX}{ledger_id:020d}"


def missing_key(bookie: str) -> str:
    return f"{MISSING_PREFIX}{bookie}"


def draining_key(bookie: str) -> str:
    return f"{DRAINING_PREFIX}{bookie}"


class TaskState(enum.StrEnum):
    PENDING = "pending"  # workers pick it up
    LOST = "lost"        # some entry has no surviving copy: reported, never retried
    FAILED = "failed"    # task_attempts_max attempts failed: reported, an operator retries


class ReplicationTask(msgspec.Struct, frozen=True, kw_only=True):
    """One under-replicated ledger: which bookies to replace, and progress."""

    ledger_id: int
    bookies: tuple[str, ...]          # the lost (or draining) bookies to replace
    created_ms: int
    state: TaskState = TaskState.PENDING
    attempts: int = 0
    retry_after_ms: int = 0
    error: str = ""
    # "<fragment first entry>/<position>" -> replacement bookie chosen, so a
    # worker that takes over after a crash copies to the same bookie again.
    replacements: dict[str, str] = msgspec.field(default_factory=dict)
    # LOST: the bookies of the lost entry's write set that never said they lack
    # it -> the version of their /bookies/registrations/ key when the attempt
    # began. One registered again since (another version): the auditor sets
    # the task PENDING again, as a bookie gone past the delay may come back.
    unreachable: dict[str, int] = msgspec.field(default_factory=dict)
    # Bookies of ``bookies`` that hold their data but break the ledger's
    # placement policy (the periodic check): moved even though they answer.
    misplaced: tuple[str, ...] = ()

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> ReplicationTask:
        try:
            return msgspec.msgpack.decode(data, type=cls)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise UsageError(f"replication task is malformed: {exc}") from None


class MissingBookie(msgspec.Struct, frozen=True, kw_only=True):
    bookie: str
    since_ms: int  # wall clock of the auditor that first saw it unregistered
    # The version of its /bookies/registrations/ key then (-1: not recorded).
    # Another version later: it registered in between, and the delay restarts.
    registrations: int = -1

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> MissingBookie:
        return msgspec.msgpack.decode(data, type=cls)


def replacement_slot(first_entry_id: int, position: int) -> str:
    return f"{first_entry_id}/{position}"
