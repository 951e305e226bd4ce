"""Stream metadata in meta: keys, records and the pure edits of a ledger list.

Keys (``<p>`` is the partition number, 4 digits)::

    /stream-names/<name>                          empty; lists the streams
    /streams/<name>/config                        StreamRecord (config, ledger password)
    /streams/<name>/partitions/<p>                PartitionLedgers (the ledger list)
    /streams/<name>/writers/<p>                   WriterLease, ephemeral (writer's session)
    /streams/<name>/cursors/<sub>/<p>             CursorState
    /streams/<name>/cursors/<sub>/owner           ConsumerLease, ephemeral
    /streams/<name>/pending/<job>/<ledger>        a ledger a Spark task wrote, not linked yet
    /streams/<name>/trash/<ledger>                a ledger removed from its list, to delete
    /streams/<name>/sinks/<writer id>             last micro-batch a streaming write committed

A partition's ledger list is one key, like Pulsar's managed-ledger znode: a
change to it is one compare-and-swap on its version, and its size is bounded
(``LEDGERS_PER_PARTITION_MAX``). Every ledger in the list has a ``seq`` (its
place; the next ledger gets ``next_seq``); positions order by seq, see
``_position``. Only the last ledger may be open. Trimming removes ledgers from
the head only, so a position in a ledger missing from the list lies before the
first ledger kept.
"""

from __future__ import annotations

import enum
import re
from typing import TypeVar

import msgspec

from quorumlog.errors import UsageError, invariant
from quorumlog.stream._config import StreamConfig
from quorumlog.stream._errors import MessageFormatError
from quorumlog.stream._position import Position, SeqPosition

STREAMS_PREFIX = "/streams/"
NAMES_PREFIX = "/stream-names/"
LEDGERS_PER_PARTITION_MAX = 10_000  # one list stays far below meta's 1 MiB value limit
FORMAT_VERSION = 1
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")

# Custom metadata on every ledger a stream writes (finds orphans, helps operators).
LEDGER_META_STREAM = "quorumlog.stream"
LEDGER_META_PARTITION = "quorumlog.partition"
LEDGER_META_JOB = "quorumlog.job"

T = TypeVar("T")


def check_name(kind: str, name: str) -> str:
    if not NAME_PATTERN.match(name):
        raise UsageError(f"{kind} name {name!r} is invalid: use 1-200 characters "
                         "[A-Za-z0-9._-], starting with a letter or digit")
    return name


def name_key(stream: str) -> str:
    return f"{NAMES_PREFIX}{stream}"


def stream_prefix(stream: str) -> str:
    return f"{STREAMS_PREFIX}{stream}/"


def config_key(stream: str) -> str:
    return f"{STREAMS_PREFIX}{stream}/config"


def partition_key(stream: str, partition: int) -> str:
    return f"{STREAMS_PREFIX}{stream}/partitions/{partition:04d}"


def writer_key(stream: str, partition: int) -> str:
    return f"{STREAMS_PREFIX}{stream}/writers/{partition:04d}"


def cursors_prefix(stream: str) -> str:
    return f"{STREAMS_PREFIX}{stream}/cursors/"


def cursor_key(stream: str, subscription: str, partition: int) -> str:
    return f"{STREAMS_PREFIX}{stream}/cursors/{subscription}/{partition:04d}"


def cursor_owner_key(stream: str, subscription: str) -> str:
    return f"{STREAMS_PREFIX}{stream}/cursors/{subscription}/owner"


def pending_prefix(stream: str, job: str = "") -> str:
    return f"{STREAMS_PREFIX}{stream}/pending/" + (f"{job}/" if job else "")


def pending_key(stream: str, job: str, ledger_id: int) -> str:
    return f"{pending_prefix(stream, job)}{ledger_id:020d}"


def jobs_prefix(stream: str) -> str:
    return f"{STREAMS_PREFIX}{stream}/jobs/"


def job_key(stream: str, job: str) -> str:
    """Written once when a write job ends (committed or aborted); fences late task attempts."""
    return f"{jobs_prefix(stream)}{job}"


def trash_prefix(stream: str) -> str:
    return f"{STREAMS_PREFIX}{stream}/trash/"


def trash_key(stream: str, ledger_id: int) -> str:
    return f"{trash_prefix(stream)}{ledger_id:020d}"


def sink_key(stream: str, writer_id: str) -> str:
    return f"{STREAMS_PREFIX}{stream}/sinks/{writer_id}"


class StreamState(enum.StrEnum):
    ACTIVE = "active"
    DELETING = "deleting"


class StreamRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What ``/streams/<name>/config`` holds."""

    name: str
    config: StreamConfig
    # The password of every ledger of the stream. Readers (Spark executors)
    # need it to read bookies directly, so it is kept where every client with
    # meta access can read it, as Pulsar keeps it in the broker config.
    password: bytes
    created_ms: int
    state: StreamState = StreamState.ACTIVE
    format_version: int = FORMAT_VERSION

    def encode(self) -> bytes:
        return _RECORD_ENCODER.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> StreamRecord:
        return _decode(_RECORD_DECODER, data, "stream record")


class LedgerStatus(enum.StrEnum):
    OPEN = "open"
    CLOSED = "closed"


class LedgerInfo(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One ledger of a partition. Counts are final once CLOSED (0 while OPEN)."""

    seq: int
    ledger_id: int
    status: LedgerStatus = LedgerStatus.OPEN
    entries: int = 0
    size_bytes: int = 0
    first_publish_ms: int = 0
    last_publish_ms: int = 0
    last_entry_messages: int = 0  # messages in the last entry (to tell a fully acked ledger)
    created_ms: int = 0
    closed_ms: int = 0

    @property
    def is_open(self) -> bool:
        return self.status is LedgerStatus.OPEN

    @property
    def end_key(self) -> tuple[int, int, int]:
        """Key of the last message (closed ledgers with entries only)."""
        return (self.seq, self.entries - 1, self.last_entry_messages - 1)


class LedgerStats(msgspec.Struct, frozen=True, kw_only=True):
    """The final numbers of a ledger being closed or linked."""

    ledger_id: int
    entries: int
    size_bytes: int
    first_publish_ms: int
    last_publish_ms: int
    last_entry_messages: int
    created_ms: int = 0


class PartitionLedgers(msgspec.Struct, frozen=True, kw_only=True):
    """The ordered ledger list of one partition (value of its partition key)."""

    ledgers: tuple[LedgerInfo, ...] = ()
    next_seq: int = 0
    trimmed_entries: int = 0
    writer_epoch: int = 0  # how many times a writer took the partition over
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        for i, info in enumerate(self.ledgers):
            if info.is_open and i != len(self.ledgers) - 1:
                raise MessageFormatError(f"ledger list: ledger {info.ledger_id} is open but "
                                         "not last")
            if i and info.seq != self.ledgers[i - 1].seq + 1:
                raise MessageFormatError("ledger list: seq numbers are not consecutive")
        if self.ledgers and self.ledgers[-1].seq >= self.next_seq:
            raise MessageFormatError("ledger list: next_seq is not past the last ledger")

    # ----- queries -------------------------------------------------------------

    @property
    def open_ledger(self) -> LedgerInfo | None:
        if self.ledgers and self.ledgers[-1].is_open:
            return self.ledgers[-1]
        return None

    @property
    def first_seq(self) -> int:
        """Seq of the first ledger kept (``next_seq`` when the list is empty)."""
        return self.ledgers[0].seq if self.ledgers else self.next_seq

    def by_seq(self, seq: int) -> LedgerInfo | None:
        index = seq - self.first_seq
        if 0 <= index < len(self.ledgers):
            return self.ledgers[index]
        return None

    def find(self, ledger_id: int) -> LedgerInfo | None:
        for info in reversed(self.ledgers):
            if info.ledger_id == ledger_id:
                return info
        return None

    def key_of(self, position: Position) -> SeqPosition | None:
        """The ordered form of ``position``; None if its ledger is not in the list."""
        info = self.find(position.ledger_id)
        if info is None:
            return None
        return SeqPosition(info.seq, position.entry_id, position.batch_index, info.ledger_id)

    def closed_entries(self) -> int:
        return sum(info.entries for info in self.ledgers)

    def size_bytes(self) -> int:
        return sum(info.size_bytes for info in self.ledgers)

    # ----- edits (each returns a new value) -----------------------------------------

    def with_ledger_opened(self, ledger_id: int, created_ms: int, *,
                           takeover: bool = False) -> PartitionLedgers:
        invariant(self.open_ledger is None, "a new ledger needs the previous one closed")
        if len(self.ledgers) >= LEDGERS_PER_PARTITION_MAX:
            raise UsageError(
                f"the partition has {len(self.ledgers)} ledgers, the most one list holds; "
                "lower retention or raise the rollover limits"
            )
        info = LedgerInfo(seq=self.next_seq, ledger_id=ledger_id, created_ms=created_ms)
        return msgspec.structs.replace(
            self, ledgers=(*self.ledgers, info), next_seq=self.next_seq + 1,
            writer_epoch=self.writer_epoch + (1 if takeover else 0),
        )

    def with_ledger_closed(self, stats: LedgerStats, closed_ms: int) -> PartitionLedgers:
        current = self.open_ledger
        invariant(current is not None and current.ledger_id == stats.ledger_id,
                  f"ledger {stats.ledger_id} is not the open ledger of the list")
        assert current is not None
        closed = _closed_info(current.seq, stats, current.created_ms or stats.created_ms,
                              closed_ms)
        return msgspec.structs.replace(self, ledgers=(*self.ledgers[:-1], closed))

    def with_ledgers_linked(self, stats: list[LedgerStats], closed_ms: int) -> PartitionLedgers:
        """Append closed ledgers (a Spark write's) after the last one, in order."""
        invariant(self.open_ledger is None, "linking needs the open ledger closed first")
        if len(self.ledgers) + len(stats) > LEDGERS_PER_PARTITION_MAX:
            raise UsageError(f"linking {len(stats)} ledgers would pass "
                             f"{LEDGERS_PER_PARTITION_MAX} ledgers in the partition")
        known = {info.ledger_id for info in self.ledgers}
        added = []
        for i, item in enumerate(stats):
            invariant(item.ledger_id not in known, f"ledger {item.ledger_id} is already linked")
            added.append(_closed_info(self.next_seq + i, item, item.created_ms, closed_ms))
        return msgspec.structs.replace(self, ledgers=(*self.ledgers, *added),
                                       next_seq=self.next_seq + len(stats))

    def without_head(self, count: int) -> PartitionLedgers:
        invariant(0 <= count <= len(self.ledgers), "cannot trim more ledgers than the list has")
        gone = self.ledgers[:count]
        invariant(all(not info.is_open for info in gone), "the open ledger is never trimmed")
        return msgspec.structs.replace(
            self, ledgers=self.ledgers[count:],
            trimmed_entries=self.trimmed_entries + sum(i.entries for i in gone),
        )

    def encode(self) -> bytes:
        return _PARTITION_ENCODER.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> PartitionLedgers:
        return _decode(_PARTITION_DECODER, data, "partition ledger list")


def _closed_info(seq: int, stats: LedgerStats, created_ms: int, closed_ms: int) -> LedgerInfo:
    if stats.entries < 0 or (stats.entries > 0) != (stats.last_entry_messages > 0):
        raise UsageError(f"ledger {stats.ledger_id}: impossible counts {stats}")
    return LedgerInfo(
        seq=seq, ledger_id=stats.ledger_id, status=LedgerStatus.CLOSED, entries=stats.entries,
        size_bytes=stats.size_bytes,
        first_publish_ms=stats.first_publish_ms, last_publish_ms=stats.last_publish_ms,
        last_entry_messages=stats.last_entry_messages, created_ms=created_ms,
        closed_ms=closed_ms,
    )


class WriterLease(msgspec.Struct, frozen=True, kw_only=True):
    """Value of a partition's writer key (ephemeral, bound to the writer's session)."""

    owner: str  # host:pid:random, for operators
    acquired_ms: int

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(self)


class PendingLedger(msgspec.Struct, frozen=True, kw_only=True):
    """A ledger written by a Spark task and not linked yet (deleted if never linked)."""

    partition: int
    created_ms: int

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> PendingLedger:
        return _decode(msgspec.msgpack.Decoder(PendingLedger), data, "pending ledger marker")


class JobState(enum.Enum):
    COMMITTED = "committed"
    ABORTED = "aborted"


class JobMark(msgspec.Struct, frozen=True, kw_only=True):
    """How a write job ended. A task attempt that starts (or is still running)
    after it cannot put a pending marker and deletes its own ledger."""

    state: JobState
    ended_ms: int

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> JobMark:
        return _decode(msgspec.msgpack.Decoder(JobMark), data, "job mark")


class SinkMark(msgspec.Struct, frozen=True, kw_only=True):
    """The last micro-batch id a streaming write committed into the stream."""

    batch_id: int
    committed_ms: int

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> SinkMark:
        return _decode(msgspec.msgpack.Decoder(SinkMark), data, "sink mark")


def _decode(decoder: msgspec.msgpack.Decoder[T], data: bytes, what: str) -> T:
    try:
        return decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise MessageFormatError(f"{what} in meta is malformed: {exc}") from None


_RECORD_ENCODER = msgspec.msgpack.Encoder()
_RECORD_DECODER = msgspec.msgpack.Decoder(StreamRecord)
_PARTITION_ENCODER = msgspec.msgpack.Encoder()
_PARTITION_DECODER = msgspec.msgpack.Decoder(PartitionLedgers)
