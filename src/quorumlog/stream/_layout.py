"""Stream metadata in meta: keys, records and the pure edits of a ledger list.

Keys (``<p>`` is the partition number, 4 digits; ``<seq>`` 20 digits)::

    /stream-names/<name>                          empty; lists the streams
    /streams/<name>/config                        StreamRecord (config, ledger password)
    /streams/<name>/partitions/<p>                PartitionHead (counters + the last ledgers)
    /streams/<name>/ledgers/<p>/<last seq>        LedgerRun: older closed ledgers, in order
    /streams/<name>/writers/<p>                   WriterLease, ephemeral (writer's session)
    /streams/<name>/cursors/<sub>/<p>             CursorState
    /streams/<name>/cursors/<sub>/owner           WriterLease, ephemeral: the exclusive consumer
    /streams/<name>/cursors/<sub>/failover/members/<consumer>
                                                  WriterLease, ephemeral: a failover consumer
    /streams/<name>/cursors/<sub>/failover/owners/<p>
                                                  WriterLease, ephemeral: the failover consumer
                                                  reading partition <p> now
    /streams/<name>/pending/<job>/<ledger>        a ledger a Spark task wrote, not linked yet
    /streams/<name>/trash/<p>-<first seq>         TrashRecord: ledgers trimmed, to delete
    /streams/<name>/offloaded/<ledger id>         OffloadRecord: the ledger's copy in Parquet
    /streams/<name>/offload-pending/<ledger id>   empty: its bookie copy is still to delete
    /streams/<name>/sinks/<writer id>             last micro-batch a streaming write committed

A partition is an ordered list of ledgers. Every ledger has a ``seq`` (its
place; the next ledger gets ``next_seq``); positions order by seq, see
``_position``. Only the last ledger may be open. Trimming removes ledgers from
the front only, so a position in a ledger missing from the list lies before
the first ledger kept.

The list is split so that it can grow without bound while every change
writes a bounded number of keys:

- the **head** (``partitions/<p>``) holds the counters that change together
  (next seq, first seq kept, entry and byte totals, writer epoch) and the
  *tail*: the last ledgers of the list, the open one last. Every change of
  the list is one compare-and-swap on the head's version, in one meta
  transaction with the other keys it writes;
- the **archive** holds the older closed ledgers as *runs* of consecutive
  ledgers, one key per run (``ledgers/<p>/<seq of the run's last ledger>``,
  zero-padded so keys sort in stream order). When the tail grows past
  ``TAIL_LEDGERS_MAX`` its oldest ledgers move into a new run, in the same
  transaction. A closed ledger's record never changes afterwards; trimming
  deletes whole runs and rewrites at most one (keeping its key).

A rollover writes the head, and one new run every
``TAIL_LEDGERS_MAX - TAIL_LEDGERS_KEEP`` rollovers. A Spark commit writes the
head of each partition it links into (plus runs when it links more than the
head holds). Runs rather than one key per ledger: a commit links N task
ledgers in one transaction, and meta bounds a transaction to ``txn_ops_max``
(128) operations, so with a key per ledger a job of 200 tasks could not
commit.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from typing import TypeVar

import msgspec

from quorumlog.errors import UsageError, invariant
from quorumlog.meta import MetaLimits
from quorumlog.stream._config import StreamConfig
from quorumlog.stream._errors import MessageFormatError

STREAMS_PREFIX = "/streams/"
NAMES_PREFIX = "/stream-names/"
FORMAT_VERSION = 1  # of StreamRecord
# Version 2: the ledger list is a head plus archive runs. Version 1 kept the
# whole list in the partition key (at most 10,000 ledgers; it passed meta's
# value limit at about 6,000). There is no migration: see docs/stream.md.
PARTITION_FORMAT_VERSION = 2
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")

# A ledger's record is at most about 350 bytes encoded (12 integer fields of
# at most 9 bytes plus their names; 180 bytes is typical), so 2,048 of them stay
# under 720 KiB: below meta's value limit (1 MiB) with room to spare.
LEDGER_RECORD_BYTES_MAX = 350
VALUE_BYTES_MAX = MetaLimits().value_max_bytes
# Ledgers the head keeps before its oldest move to the archive. A rollover
# rewrites the head, so this bounds the bytes a rollover writes (~6 KiB, ~10 KiB
# with the run it sometimes adds).
TAIL_LEDGERS_MAX = 32
# Ledgers left in the head when older ones move to the archive (>= 1: the last
# ledger, which may be open, always stays in the head).
TAIL_LEDGERS_KEEP = 8
# A Spark commit may leave up to this many ledgers in the head (it writes only
# the heads, to stay within meta's transaction bound; the tail is archived
# right after). Bounded by the value limit, like a run.
HEAD_LEDGERS_MAX = 2048
RUN_LEDGERS_MAX = 2048  # ledgers in one archive key

# Custom metadata on every ledger a stream writes (finds orphans, helps operators).
LEDGER_META_STREAM = "quorumlog.stream"
LEDGER_META_PARTITION = "quorumlog.partition"
LEDGER_META_JOB = "quorumlog.job"
LEDGER_META_COMPACTED = "quorumlog.compacted"  # a partition's compacted ledger (compaction)

T = TypeVar("T")

invariant(HEAD_LEDGERS_MAX * LEDGER_RECORD_BYTES_MAX < VALUE_BYTES_MAX,
          "a full head must fit in one meta value")
invariant(RUN_LEDGERS_MAX * LEDGER_RECORD_BYTES_MAX < VALUE_BYTES_MAX,
          "a full run must fit in one meta value")
invariant(1 <= TAIL_LEDGERS_KEEP < TAIL_LEDGERS_MAX <= HEAD_LEDGERS_MAX,
          "tail bounds out of order")


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
    """The partition's head (:class:`PartitionHead`)."""
    return f"{STREAMS_PREFIX}{stream}/partitions/{partition:04d}"


def archive_prefix(stream: str, partition: int) -> str:
    return f"{STREAMS_PREFIX}{stream}/ledgers/{partition:04d}/"


def run_key(stream: str, partition: int, last_seq: int) -> str:
    """Key of the archive run whose last ledger has ``last_seq`` (sorts in stream order)."""
    return f"{archive_prefix(stream, partition)}{last_seq:020d}"


def writer_key(stream: str, partition: int) -> str:
    return f"{STREAMS_PREFIX}{stream}/writers/{partition:04d}"


def cursors_prefix(stream: str) -> str:
    return f"{STREAMS_PREFIX}{stream}/cursors/"


def cursor_key(stream: str, subscription: str, partition: int) -> str:
    return f"{STREAMS_PREFIX}{stream}/cursors/{subscription}/{partition:04d}"


def cursor_owner_key(stream: str, subscription: str) -> str:
    return f"{STREAMS_PREFIX}{stream}/cursors/{subscription}/owner"


def failover_prefix(stream: str, subscription: str) -> str:
    """Keys of a failover subscription's consumers (``members/``) and of who reads
    each partition (``owners/``)."""
    return f"{STREAMS_PREFIX}{stream}/cursors/{subscription}/failover/"


def failover_members_prefix(stream: str, subscription: str) -> str:
    return f"{failover_prefix(stream, subscription)}members/"


def failover_member_key(stream: str, subscription: str, consumer: str) -> str:
    return f"{failover_members_prefix(stream, subscription)}{consumer}"


def failover_owner_key(stream: str, subscription: str, partition: int) -> str:
    return f"{failover_prefix(stream, subscription)}owners/{partition:04d}"


def cursor_key_kind(stream: str, key: str) -> tuple[str, str, str]:
    """What a key under ``cursors/`` is: (subscription, kind, detail).

    kind ``cursor`` (detail: the partition's digits), ``owner`` (the exclusive
    consumer's key), ``member`` (detail: a failover consumer's name),
    ``partition-owner`` (detail: the partition's digits) or ``other``.
    """
    subscription, _, tail = key[len(cursors_prefix(stream)):].partition("/")
    if tail.isdigit():
        return subscription, "cursor", tail
    if tail == "owner":
        return subscription, "owner", ""
    if tail.startswith("failover/members/"):
        return subscription, "member", tail[len("failover/members/"):]
    owners = tail.removeprefix("failover/owners/")
    if owners != tail and owners.isdigit():
        return subscription, "partition-owner", owners
    return subscription, "other", tail


def pending_prefix(stream: str, job: str = "") -> str:
    return f"{STREAMS_PREFIX}{stream}/pending/" + (f"{job}/" if job else "")


def pending_key(stream: str, job: str, ledger_id: int) -> str:
    return f"{pending_prefix(stream, job)}{ledger_id:020d}"


def jobs_prefix(stream: str) -> str:
    return f"{STREAMS_PREFIX}{stream}/jobs/"


def job_key(stream: str, job: str) -> str:
    """Written once when a write job ends (committed or aborted); fences late task attempts."""
    return f"{jobs_prefix(stream)}{job}"


def compaction_prefix(stream: str) -> str:
    return f"{STREAMS_PREFIX}{stream}/compaction/"


def compaction_key(stream: str, partition: int) -> str:
    """The partition's :class:`CompactionRecord` (topic compaction)."""
    return f"{compaction_prefix(stream)}{partition:04d}"


def offload_prefix(stream: str) -> str:
    return f"{STREAMS_PREFIX}{stream}/offloaded/"


def offload_key(stream: str, ledger_id: int) -> str:
    """The :class:`OffloadRecord` of a ledger offloaded to Parquet (by ledger id,
    zero-padded: keys sort by id, and the trash, which lists ids, finds it)."""
    return f"{offload_prefix(stream)}{ledger_id:020d}"


def offload_pending_prefix(stream: str) -> str:
    return f"{STREAMS_PREFIX}{stream}/offload-pending/"


def offload_pending_key(stream: str, ledger_id: int) -> str:
    """Present while an offloaded ledger still has its copy on the bookies (the
    trimmer deletes that copy once the record's deletion lag has passed)."""
    return f"{offload_pending_prefix(stream)}{ledger_id:020d}"


def trash_prefix(stream: str) -> str:
    return f"{STREAMS_PREFIX}{stream}/trash/"


def trash_key(stream: str, partition: int, first_seq: int) -> str:
    """The trash record of the ledgers one trim step removed (seqs are never reused)."""
    return f"{trash_prefix(stream)}{partition:04d}-{first_seq:020d}"


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
    # Entries of every earlier ledger of the partition, trimmed ones included
    # (a Kafka-like offset: entries between two positions without the list).
    entries_before: int = 0
    # Running maximum of the last publish times of this and every earlier
    # closed ledger (CLOSED only). It never decreases along the list, so the
    # first ledger that may hold a publish time is found by binary search,
    # although linked ledgers may hold older messages than the ones before them.
    publish_max_ms: int = 0

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


def _check_consecutive(ledgers: Sequence[LedgerInfo], what: str) -> None:
    for i in range(1, len(ledgers)):
        if ledgers[i].seq != ledgers[i - 1].seq + 1:
            raise MessageFormatError(f"{what}: seq numbers are not consecutive")


class PartitionHead(msgspec.Struct, frozen=True, kw_only=True):
    """The value of a partition's head key: counters and the last ledgers.

    Ledgers kept are seqs ``first_seq .. next_seq - 1``; the ``tail`` holds
    the last of them (the open one last), the archive runs the ones before
    ``tail_first_seq``. Whenever a ledger is kept the tail is not empty.
    """

    tail: tuple[LedgerInfo, ...] = ()
    first_seq: int = 0
    next_seq: int = 0
    entries_total: int = 0  # entries of every closed ledger, trimmed ones included
    trimmed_entries: int = 0
    kept_bytes: int = 0  # bytes of the closed ledgers kept
    publish_max_ms: int = 0  # latest last-publish time of any closed ledger
    writer_epoch: int = 0  # how many times a writer took the partition over
    # Largest ledger id ever added, and whether ids grew with every ledger
    # added (a writer's do; a Spark commit may link older ones). While they
    # did, a ledger is found by id with a binary search over the archive.
    ledger_id_max: int = 0
    ids_ascending: bool = True
    format_version: int = PARTITION_FORMAT_VERSION

    def __post_init__(self) -> None:
        if self.format_version != PARTITION_FORMAT_VERSION:
            raise MessageFormatError(
                f"partition metadata has layout version {self.format_version}; this quorumlog "
                f"reads version {PARTITION_FORMAT_VERSION} (a head key plus archive runs). "
                "Streams created before the change are not migrated: delete the stream "
                "(`quorumlog stream delete <name> --yes`) and create it again"
            )
        if not 0 <= self.first_seq <= self.next_seq:
            raise MessageFormatError("partition head: first_seq is not within 0..next_seq")
        _check_consecutive(self.tail, "partition head")
        for info in self.tail[:-1]:
            if info.is_open:
                raise MessageFormatError(f"partition head: ledger {info.ledger_id} is open "
                                         "but not last")
        if self.tail and (self.tail[-1].seq != self.next_seq - 1
                          or self.tail[0].seq < self.first_seq):
            raise MessageFormatError("partition head: the tail is not the end of the list")
        if not self.tail and self.first_seq != self.next_seq:
            raise MessageFormatError("partition head: ledgers are kept but the tail is empty")

    # ----- queries -------------------------------------------------------------

    @property
    def open_ledger(self) -> LedgerInfo | None:
        if self.tail and self.tail[-1].is_open:
            return self.tail[-1]
        return None

    @property
    def last_ledger(self) -> LedgerInfo | None:
        return self.tail[-1] if self.tail else None

    @property
    def tail_first_seq(self) -> int:
        """Seq of the first ledger in the head; the archive holds the kept ones before it."""
        return self.tail[0].seq if self.tail else self.next_seq

    @property
    def ledger_count(self) -> int:
        return self.next_seq - self.first_seq

    @property
    def kept_entries(self) -> int:
        """Entries of the closed ledgers kept."""
        return self.entries_total - self.trimmed_entries

    def in_tail(self, seq: int) -> LedgerInfo | None:
        index = seq - self.tail_first_seq
        if 0 <= index < len(self.tail):
            return self.tail[index]
        return None

    # ----- edits (each returns a new value) -----------------------------------------

    def with_ledger_opened(self, ledger_id: int, created_ms: int, *,
                           takeover: bool = False) -> PartitionHead:
        invariant(self.open_ledger is None, "a new ledger needs the previous one closed")
        info = LedgerInfo(seq=self.next_seq, ledger_id=ledger_id, created_ms=created_ms,
                          entries_before=self.entries_total)
        return msgspec.structs.replace(
            self, tail=(*self.tail, info), next_seq=self.next_seq + 1,
            writer_epoch=self.writer_epoch + (1 if takeover else 0),
            **self._ids_after([ledger_id]),
        )

    def _ids_after(self, ids: Sequence[int]) -> dict[str, int | bool]:
        ascending = self.ids_ascending
        last = self.ledger_id_max
        for ledger_id in ids:
            ascending = ascending and ledger_id > last
            last = max(last, ledger_id)
        return {"ledger_id_max": last, "ids_ascending": ascending}

    def with_ledger_closed(self, stats: LedgerStats, closed_ms: int) -> PartitionHead:
        current = self.open_ledger
        invariant(current is not None and current.ledger_id == stats.ledger_id,
                  f"ledger {stats.ledger_id} is not the open ledger of the list")
        assert current is not None
        closed = _closed_info(current.seq, stats, created_ms=current.created_ms or stats.created_ms,
                              closed_ms=closed_ms, entries_before=current.entries_before,
                              publish_max_before=self.publish_max_ms)
        return msgspec.structs.replace(
            self, tail=(*self.tail[:-1], closed),
            entries_total=self.entries_total + closed.entries,
            kept_bytes=self.kept_bytes + closed.size_bytes,
            publish_max_ms=closed.publish_max_ms,
        )

    def with_ledgers_linked(self, stats: Sequence[LedgerStats],
                            closed_ms: int) -> PartitionHead:
        """Append closed ledgers (a Spark write's) after the last one, in order."""
        invariant(self.open_ledger is None, "linking needs the open ledger closed first")
        known = {info.ledger_id for info in self.tail}
        added = []
        entries_total, kept_bytes, publish_max = (self.entries_total, self.kept_bytes,
                                                  self.publish_max_ms)
        for i, item in enumerate(stats):
            invariant(item.ledger_id not in known, f"ledger {item.ledger_id} is already linked")
            known.add(item.ledger_id)
            info = _closed_info(self.next_seq + i, item, created_ms=item.created_ms,
                                closed_ms=closed_ms, entries_before=entries_total,
                                publish_max_before=publish_max)
            entries_total += info.entries
            kept_bytes += info.size_bytes
            publish_max = info.publish_max_ms
            added.append(info)
        return msgspec.structs.replace(
            self, tail=(*self.tail, *added), next_seq=self.next_seq + len(added),
            entries_total=entries_total, kept_bytes=kept_bytes, publish_max_ms=publish_max,
            **self._ids_after([info.ledger_id for info in added]),
        )

    def archived(self, tail_max: int = TAIL_LEDGERS_MAX
                 ) -> tuple[PartitionHead, tuple[LedgerRun, ...]]:
        """Move the oldest ledgers of a tail longer than ``tail_max`` into runs
        (``TAIL_LEDGERS_KEEP`` stay); the list is the same, only stored apart."""
        if len(self.tail) <= tail_max:
            return self, ()
        cut = len(self.tail) - TAIL_LEDGERS_KEEP
        moving = self.tail[:cut]
        runs = tuple(LedgerRun(ledgers=moving[i:i + RUN_LEDGERS_MAX])
                     for i in range(0, cut, RUN_LEDGERS_MAX))
        return msgspec.structs.replace(self, tail=self.tail[cut:]), runs

    def without_first(self, trimmed: Sequence[LedgerInfo]) -> PartitionHead:
        """The head after removing ``trimmed`` (the first ledgers kept, in order)."""
        for i, info in enumerate(trimmed):
            invariant(info.seq == self.first_seq + i, "trimming must start at the first ledger "
                      "and go in order")
            invariant(not info.is_open, "the open ledger is never trimmed")
        first = self.first_seq + len(trimmed)
        invariant(first <= self.next_seq, "cannot trim more ledgers than the list has")
        return msgspec.structs.replace(
            self, first_seq=first, tail=tuple(i for i in self.tail if i.seq >= first),
            trimmed_entries=self.trimmed_entries + sum(i.entries for i in trimmed),
            kept_bytes=self.kept_bytes - sum(i.size_bytes for i in trimmed),
        )

    def encode(self) -> bytes:
        return _checked_size(_PARTITION_ENCODER.encode(self), "partition head")

    @classmethod
    def decode(cls, data: bytes) -> PartitionHead:
        return _decode(_PARTITION_DECODER, data, "partition head")


def _closed_info(seq: int, stats: LedgerStats, *, created_ms: int, closed_ms: int,
                 entries_before: int, publish_max_before: int) -> LedgerInfo:
    if stats.entries < 0 or (stats.entries > 0) != (stats.last_entry_messages > 0):
        raise UsageError(f"ledger {stats.ledger_id}: impossible counts {stats}")
    publish_max = (max(publish_max_before, stats.last_publish_ms) if stats.entries
                   else publish_max_before)
    return LedgerInfo(
        seq=seq, ledger_id=stats.ledger_id, status=LedgerStatus.CLOSED, entries=stats.entries,
        size_bytes=stats.size_bytes,
        first_publish_ms=stats.first_publish_ms, last_publish_ms=stats.last_publish_ms,
        last_entry_messages=stats.last_entry_messages, created_ms=created_ms,
        closed_ms=closed_ms, entries_before=entries_before, publish_max_ms=publish_max,
    )


class LedgerRun(msgspec.Struct, frozen=True, kw_only=True):
    """An archive key's value: consecutive closed ledgers of one partition."""

    ledgers: tuple[LedgerInfo, ...]

    def __post_init__(self) -> None:
        if not 1 <= len(self.ledgers) <= RUN_LEDGERS_MAX:
            raise MessageFormatError(f"ledger run: {len(self.ledgers)} ledgers, expected "
                                     f"1..{RUN_LEDGERS_MAX}")
        _check_consecutive(self.ledgers, "ledger run")
        if any(info.is_open for info in self.ledgers):
            raise MessageFormatError("ledger run: an archived ledger is open")

    @property
    def first_seq(self) -> int:
        return self.ledgers[0].seq

    @property
    def last_seq(self) -> int:
        return self.ledgers[-1].seq

    def get(self, seq: int) -> LedgerInfo | None:
        index = seq - self.first_seq
        return self.ledgers[index] if 0 <= index < len(self.ledgers) else None

    def encode(self) -> bytes:
        return _checked_size(_RUN_ENCODER.encode(self), "ledger run")

    @classmethod
    def decode(cls, data: bytes) -> LedgerRun:
        return _decode(_RUN_DECODER, data, "ledger run")


class TrashRecord(msgspec.Struct, frozen=True, kw_only=True):
    """Ledgers one trim step removed from the list; deleted, then the record."""

    ledger_ids: tuple[int, ...]

    def encode(self) -> bytes:
        return _checked_size(msgspec.msgpack.encode(self), "trash record")

    @classmethod
    def decode(cls, data: bytes) -> TrashRecord:
        return _decode(msgspec.msgpack.Decoder(TrashRecord), data, "trash record")


class OffloadRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A closed ledger's copy in Parquet (tiered storage), written once the file
    is complete and verified. Readers read the file instead of the bookies from
    then on; the bookies' copy is deleted after ``delete_after_ms``."""

    ledger_id: int
    partition: int
    seq: int
    url: str  # the Parquet file: a local path or a URL pyarrow.fs (or fsspec) opens
    entries: int
    payload_bytes: int
    payload_crc32c: int  # CRC32C chained over every payload, in entry order
    offloaded_ms: int
    delete_after_ms: int  # the bookies' copy may go from then (the deletion lag)
    bookies_deleted_ms: int = 0  # when it went (0: still there)

    def encode(self) -> bytes:
        return _checked_size(msgspec.msgpack.encode(self), "offload record")

    @classmethod
    def decode(cls, data: bytes) -> OffloadRecord:
        return _decode(msgspec.msgpack.Decoder(OffloadRecord), data, "offload record")


class CompactionRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A partition's compacted view (Pulsar's topic compaction): the ledger that
    holds the latest message of every key (and every message without a key)
    up to the horizon, the last entry compaction read, inclusive.

    ``pending_ledger_id`` names the ledger a compaction run is writing: set
    before its first entry, cleared by its commit, so the ledger of a run that
    died is found and deleted by the next run (or by the stream's delete)."""

    ledger_id: int = 0  # 0: never compacted
    horizon_seq: int = -1
    horizon_entry: int = -1
    horizon_ledger: int = 0
    # Entries of the partition up to and including the horizon, trimmed ones
    # included (LedgerInfo.entries_before counts the same way); -1: unknown.
    horizon_offset: int = -1
    entries: int = 0  # entries of the compacted ledger (a positions entry and a
    #                   messages entry per chunk)
    messages: int = 0
    keys: int = 0
    payload_bytes: int = 0
    compacted_ms: int = 0
    pending_ledger_id: int = 0

    @property
    def horizon_key(self) -> tuple[int, int]:
        """(seq, entry id) of the last entry covered; (-1, -1) when none."""
        return (self.horizon_seq, self.horizon_entry)

    def encode(self) -> bytes:
        return _checked_size(msgspec.msgpack.encode(self), "compaction record")

    @classmethod
    def decode(cls, data: bytes) -> CompactionRecord:
        return _decode(msgspec.msgpack.Decoder(CompactionRecord), data, "compaction record")


class TrimStep(msgspec.Struct, frozen=True, kw_only=True):
    """One bounded trim transaction, decided from the head and the first runs."""

    head: PartitionHead
    trimmed: tuple[LedgerInfo, ...]
    deleted_runs: tuple[int, ...]  # last seqs of the runs removed whole
    rewritten: LedgerRun | None  # what is left of a run trimmed in part (same key)


def trim_step(head: PartitionHead, runs: Sequence[LedgerRun], count: int) -> TrimStep:
    """Remove the first ``count`` ledgers: whole runs, part of one run, then
    ledgers of the tail. ``runs`` are the archive's first runs, in order,
    covering at least the ledgers to remove that are not in the tail."""
    trimmed: list[LedgerInfo] = []
    deleted: list[int] = []
    rewritten: LedgerRun | None = None
    for run in runs:
        left = count - len(trimmed)
        if left <= 0:
            break
        invariant(run.first_seq == head.first_seq + len(trimmed),
                  f"archive run {run.first_seq}..{run.last_seq} does not continue the list")
        if left >= len(run.ledgers):
            trimmed += run.ledgers
            deleted.append(run.last_seq)
        else:
            trimmed += run.ledgers[:left]
            rewritten = LedgerRun(ledgers=run.ledgers[left:])
    left = count - len(trimmed)
    if left > 0:
        start = head.first_seq + len(trimmed)
        invariant(start >= head.tail_first_seq, "trim needs every archive run it removes")
        trimmed += [info for info in head.tail if start <= info.seq < start + left]
    invariant(len(trimmed) == count, f"cannot trim {count} ledgers, the list has fewer")
    return TrimStep(head=head.without_first(trimmed), trimmed=tuple(trimmed),
                    deleted_runs=tuple(deleted), rewritten=rewritten)


class WriterLease(msgspec.Struct, frozen=True, kw_only=True):
    """Value of a partition's writer key and of a consumer's keys (ephemeral, bound
    to the writer's or consumer's session)."""

    owner: str  # host:pid:random (a failover consumer: its name), for operators
    acquired_ms: int

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> WriterLease:
        return _decode(msgspec.msgpack.Decoder(WriterLease), data, "lease")


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


def _checked_size(data: bytes, what: str) -> bytes:
    invariant(len(data) <= VALUE_BYTES_MAX,
              f"{what} encodes to {len(data)} bytes, more than a meta value holds")
    return data


_RECORD_ENCODER = msgspec.msgpack.Encoder()
_RECORD_DECODER = msgspec.msgpack.Decoder(StreamRecord)
_PARTITION_ENCODER = msgspec.msgpack.Encoder()
_PARTITION_DECODER = msgspec.msgpack.Decoder(PartitionHead)
_RUN_ENCODER = msgspec.msgpack.Encoder()
_RUN_DECODER = msgspec.msgpack.Decoder(LedgerRun)
