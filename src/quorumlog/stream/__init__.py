"""Streams made of ledgers, after Pulsar's managed ledger. See docs/stream.md.

A stream has P partitions; each partition is an ordered list of ledgers kept
in meta (only the last one open; a head key plus archive runs, so the list
grows without bound), written by one writer at a time that holds
a meta lease and fences the previous writer's ledger when it takes over.
Entries carry a small header (key, publish time, properties) and may pack a
batch of messages. Named cursors (subscriptions) persist acknowledgements;
retention and TTL trim ledgers every cursor has passed.

Entry points::

    from quorumlog.stream import StreamClient, BlockingStreamClient, StreamConfig
    client = StreamClient(ledger_client)            # or await StreamClient.connect(meta)
    await client.create_stream("events", StreamConfig(partitions=2))
    producer = await client.producer("events")      # Producer.send / send_async / flush
    consumer = await client.subscribe("events", "my-sub")   # receive / ack / async for
    reader = await client.reader("events", "earliest")      # Position / "latest" / time ms
"""

from quorumlog.stream._admin import TrimReport
from quorumlog.stream._client import (
    BlockingConsumer,
    BlockingProducer,
    BlockingReader,
    BlockingStreamClient,
    BlockingTableView,
    StreamClient,
)
from quorumlog.stream._compaction import CompactionConflictError, CompactionOutcome
from quorumlog.stream._config import OffloadPolicy, RetentionPolicy, RolloverPolicy, StreamConfig
from quorumlog.stream._consumer import Consumer, ConsumerConfig
from quorumlog.stream._dead_letter import (
    ORIGIN_MESSAGE_ID,
    REAL_TOPIC,
    dead_letter_stream_name,
)
from quorumlog.stream._entry import (
    BATCH_MESSAGES_MAX,
    ENTRY_HEADER_BYTES,
    ENTRY_PREFIX_WORD,
    MESSAGE_HEADER_BYTES,
    ColumnSink,
    DecodedMessage,
    OutgoingMessage,
    decode_entry,
    decode_entry_columns,
    decode_properties,
    encode_entry,
)
from quorumlog.stream._errors import (
    BadPositionError,
    DataLossError,
    JobEndedError,
    MessageFormatError,
    MessageTooLargeError,
    OffloadError,
    ProducerFencedError,
    StreamError,
    StreamExistsError,
    StreamInUseError,
    StreamNotFoundError,
    SubscriptionBusyError,
    SubscriptionNotFoundError,
    WriterBusyError,
    WriterStuckError,
)
from quorumlog.stream._layout import (
    CompactionRecord,
    LedgerInfo,
    LedgerRun,
    LedgerStats,
    OffloadRecord,
    PartitionHead,
    StreamRecord,
    check_name,
)
from quorumlog.stream._ledgers import LedgerList
from quorumlog.stream._link import JobLedgerWriter, abort_job_ledgers, link_job_ledgers, new_job_id
from quorumlog.stream._meta import load_record
from quorumlog.stream._offload import (
    DELETION_LAG_MS_DEFAULT,
    OffloadedLedger,
    OffloadOutcome,
    load_offloads,
    normalize_target,
    offload_candidates,
    offload_ledger,
    offloaded_records,
    sweep_orphans,
)
from quorumlog.stream._position import EARLIEST, LATEST, Position, SeqPosition, parse_positions
from quorumlog.stream._producer import MessageId, Producer, ProducerConfig
from quorumlog.stream._reader import (
    VIEW_START,
    LedgerHandles,
    Message,
    Reader,
    StartSpec,
    compacted_view,
    end_position,
    first_position,
    load_compaction,
    past_view,
    resolve_start,
)
from quorumlog.stream._retention import RoundRobin, partition_for_key
from quorumlog.stream._subscriptions import PartitionCursor, SubscriptionInfo
from quorumlog.stream._table_view import TableView
from quorumlog.stream._trimmer import (
    TRIMMER_KEY,
    StreamTrimmer,
    TrimmerConfig,
    TrimRound,
    trimmer_holder,
)

__all__ = [
    "BATCH_MESSAGES_MAX",
    "DELETION_LAG_MS_DEFAULT",
    "EARLIEST",
    "ENTRY_HEADER_BYTES",
    "ENTRY_PREFIX_WORD",
    "LATEST",
    "MESSAGE_HEADER_BYTES",
    "ORIGIN_MESSAGE_ID",
    "REAL_TOPIC",
    "TRIMMER_KEY",
    "VIEW_START",
    "BadPositionError",
    "BlockingConsumer",
    "BlockingProducer",
    "BlockingReader",
    "BlockingStreamClient",
    "BlockingTableView",
    "ColumnSink",
    "CompactionConflictError",
    "CompactionOutcome",
    "CompactionRecord",
    "Consumer",
    "ConsumerConfig",
    "DataLossError",
    "DecodedMessage",
    "JobEndedError",
    "JobLedgerWriter",
    "LedgerHandles",
    "LedgerInfo",
    "LedgerList",
    "LedgerRun",
    "LedgerStats",
    "Message",
    "MessageFormatError",
    "MessageId",
    "MessageTooLargeError",
    "OffloadError",
    "OffloadOutcome",
    "OffloadPolicy",
    "OffloadRecord",
    "OffloadedLedger",
    "OutgoingMessage",
    "PartitionCursor",
    "PartitionHead",
    "Position",
    "Producer",
    "ProducerConfig",
    "ProducerFencedError",
    "Reader",
    "RetentionPolicy",
    "RolloverPolicy",
    "RoundRobin",
    "SeqPosition",
    "StartSpec",
    "StreamClient",
    "StreamConfig",
    "StreamError",
    "StreamExistsError",
    "StreamInUseError",
    "StreamNotFoundError",
    "StreamRecord",
    "StreamTrimmer",
    "SubscriptionBusyError",
    "SubscriptionInfo",
    "SubscriptionNotFoundError",
    "TableView",
    "TrimReport",
    "TrimRound",
    "TrimmerConfig",
    "WriterBusyError",
    "WriterStuckError",
    "abort_job_ledgers",
    "check_name",
    "compacted_view",
    "dead_letter_stream_name",
    "decode_entry",
    "decode_entry_columns",
    "decode_properties",
    "encode_entry",
    "end_position",
    "first_position",
    "link_job_ledgers",
    "load_compaction",
    "load_offloads",
    "load_record",
    "new_job_id",
    "normalize_target",
    "offload_candidates",
    "offload_ledger",
    "offloaded_records",
    "parse_positions",
    "partition_for_key",
    "past_view",
    "resolve_start",
    "sweep_orphans",
    "trimmer_holder",
]
