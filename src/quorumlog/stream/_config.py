"""Stream configuration: partitions, ledger parameters, rollover, retention, offload.

Defaults follow Pulsar's managed ledger (broker.conf) where one exists, and
say so; where we differ, the comment says why.
"""

from __future__ import annotations

import msgspec

from quorumlog.config import Config, require
from quorumlog.ledger import DigestType
from quorumlog.meta import MetaLimits

MINUTE_MS = 60_000
DAY_MS = 24 * 60 * MINUTE_MS
MIB = 1024 * 1024
TXN_OPS_MAX = MetaLimits().txn_ops_max  # meta's bound on one transaction (compares + ops)
# A Spark commit links into every partition it wrote in one meta transaction:
# a compare and a put of each partition's head, plus the job's keys (job mark
# compare + put, the pending markers' prefix delete, a streaming write's sink
# mark compare + put).
LINK_FIXED_OPS = 5
LINK_OPS_PER_PARTITION = 2
# So a commit that writes to every partition fits in one transaction: 61.
PARTITIONS_MAX = (TXN_OPS_MAX - LINK_FIXED_OPS) // LINK_OPS_PER_PARTITION


class RolloverPolicy(Config, frozen=True):
    """When the writer closes its ledger and starts a new one.

    Pulsar's rule (ManagedLedgerImpl.currentLedgerIsFull): the ledger is full
    when it reached ``max_entries`` or ``max_bytes``, or is older than
    ``max_time_ms``; but a full ledger younger than ``min_time_ms`` is kept
    (so a burst does not make a storm of tiny ledgers). An empty ledger never
    rolls over.
    """

    max_entries: int = 50_000  # managedLedgerMaxEntriesPerLedger
    max_bytes: int = 2048 * MIB  # managedLedgerMaxSizePerLedgerMbytes = 2048
    min_time_ms: int = 10 * MINUTE_MS  # managedLedgerMinLedgerRolloverTimeMinutes = 10
    max_time_ms: int = 240 * MINUTE_MS  # managedLedgerMaxLedgerRolloverTimeMinutes = 240

    def validate(self) -> None:
        require(self.max_entries >= 1, "rollover max_entries must be >= 1")
        require(self.max_bytes >= 1, "rollover max_bytes must be >= 1")
        require(self.min_time_ms >= 0, "rollover min_time_ms must be >= 0")
        require(self.max_time_ms >= 1, "rollover max_time_ms must be >= 1")
        require(self.min_time_ms <= self.max_time_ms,
                "rollover min_time_ms must not exceed max_time_ms")

    def should_roll(self, entries: int, size_bytes: int, age_ms: int) -> bool:
        if entries == 0:
            return False
        full = entries >= self.max_entries or size_bytes >= self.max_bytes
        if not (full or age_ms >= self.max_time_ms):
            return False
        return self.min_time_ms == 0 or age_ms > self.min_time_ms


class RetentionPolicy(Config, frozen=True):
    """How long ledgers that every cursor has passed are kept, and message TTL.

    A closed ledger is deleted when every cursor has acknowledged all of it and
    retention no longer needs it: it ended longer than ``time_ms`` ago, or the
    consumed ledgers after it already hold ``size_bytes`` (either limit; -1 =
    no limit of that kind; both -1 = keep forever). The open ledger is never
    deleted.

    Pulsar's defaults are 0 and 0 (consumed data is deleted at once, and a topic
    without subscriptions keeps nothing). Here a stream is also read by Spark
    jobs that hold no cursor, so the default keeps data 7 days, like Kafka's
    log.retention.hours = 168.

    ``message_ttl_ms`` (Pulsar: ttlDurationDefaultInSeconds = 0, off): messages
    older than this are acknowledged on every cursor by the trimmer.
    """

    time_ms: int = 7 * DAY_MS
    size_bytes: int = -1
    message_ttl_ms: int = 0

    def validate(self) -> None:
        require(self.time_ms >= -1, "retention time_ms must be >= 0, or -1 for no limit")
        require(self.size_bytes >= -1, "retention size_bytes must be >= 0, or -1 for no limit")
        require(self.message_ttl_ms >= 0, "message_ttl_ms must be >= 0 (0: off)")


OFFLOAD_DELETION_LAG_MS_DEFAULT = 4 * 3600 * 1000
"""Pulsar's ``managedLedgerOffloadDeletionLagMs`` default: the bookies keep an
offloaded ledger this long after its record is written."""


class OffloadPolicy(Config, frozen=True):
    """Automatic offload to tiered storage, run by the nodes' stream trimmer.

    After Pulsar's namespace offload policies: when a partition's closed
    ledgers hold more than ``threshold_bytes`` on the bookies, the trimmer
    offloads the oldest ones to ``target`` until the newest closed ledgers
    within ``threshold_bytes`` are left (Pulsar's
    ``managedLedgerOffloadAutoTriggerSizeThresholdBytes``; 0 offloads every
    closed ledger, -1 is off, Pulsar's default). The bookies' copy goes
    ``deletion_lag_ms`` after each offload.
    """

    target: str = ""  # a directory or a URL pyarrow.fs opens; "" with threshold -1
    threshold_bytes: int = -1
    deletion_lag_ms: int = OFFLOAD_DELETION_LAG_MS_DEFAULT

    @property
    def enabled(self) -> bool:
        return self.threshold_bytes >= 0 and bool(self.target)

    def validate(self) -> None:
        require(self.threshold_bytes >= -1,
                "offload threshold_bytes must be >= 0, or -1 for no automatic offload")
        require(self.threshold_bytes == -1 or bool(self.target.strip()),
                "an offload threshold needs an offload target (a directory or a URL)")
        require(self.deletion_lag_ms >= 0, "offload deletion_lag_ms must be >= 0")


class StreamConfig(Config, frozen=True):
    """Everything a stream is created with (kept in meta, shown by ``stream info``)."""

    partitions: int = 1
    # Ledger parameters: Pulsar's managedLedgerDefaultEnsembleSize / WriteQuorum /
    # AckQuorum are 2/2/2; a 3-bookie cluster tolerates one bookie loss with them.
    ensemble_size: int = 2
    write_quorum: int = 2
    ack_quorum: int = 2
    digest: DigestType = DigestType.CRC32C
    rollover: RolloverPolicy = msgspec.field(default_factory=RolloverPolicy)
    retention: RetentionPolicy = msgspec.field(default_factory=RetentionPolicy)
    offload: OffloadPolicy = msgspec.field(default_factory=OffloadPolicy)
    # Bound of the individually acknowledged ranges a cursor persists
    # (managedLedgerMaxUnackedRangesToPersist = 10000); ranges past it are
    # redelivered after a restart.
    cursor_ranges_max: int = 10_000
    # Writer lease (a meta session): a crashed writer's partition is taken over
    # after this long at the latest (Pulsar: the ZooKeeper session, 30 s).
    writer_lease_ttl_ms: int = 10_000
    # Automatic topic compaction (Pulsar's compaction-threshold): the nodes'
    # trimmer compacts a partition once its closed ledgers after the compaction
    # horizon hold more than this many bytes (0: any; -1: off, the default).
    compaction_threshold_bytes: int = -1

    def validate(self) -> None:
        require(1 <= self.partitions <= PARTITIONS_MAX,
                f"partitions must be 1..{PARTITIONS_MAX}")
        require(self.ensemble_size >= self.write_quorum >= self.ack_quorum >= 1,
                "need ensemble_size >= write_quorum >= ack_quorum >= 1")
        require(self.cursor_ranges_max >= 1, "cursor_ranges_max must be >= 1")
        require(self.writer_lease_ttl_ms >= 500, "writer_lease_ttl_ms must be >= 500")
        require(self.compaction_threshold_bytes >= -1,
                "compaction_threshold_bytes must be >= 0, or -1 for no automatic compaction")
        self.rollover.validate()
        self.retention.validate()
        self.offload.validate()


_CONFIG_ENCODER = msgspec.msgpack.Encoder()
_CONFIG_DECODER = msgspec.msgpack.Decoder(StreamConfig)
