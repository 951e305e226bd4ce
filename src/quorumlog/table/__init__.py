"""Tables: Pegasus-style (hash_key, sort_key) -> value with TTL and timetags.

This package holds the partition replica's storage and write rules
(:class:`TableStore`, the partition's Raft state machine over RocksDB), the
commands that travel in a partition's Raft log, and timetags; and
duplication of tables to other clusters (``_dup_*.py``). See docs/table.md
and docs/duplication.md.
"""

from quorumlog.table._client import BlockingTableClient, TableClient
from quorumlog.table._codec import (
    HASH_KEY_BYTES_MAX,
    SORT_KEY_BYTES_MAX,
    VALUE_BYTES_MAX,
    Record,
)
from quorumlog.table._commands import (
    CheckAndMutateCommand,
    CheckResult,
    CheckType,
    DeleteCommand,
    Done,
    DuplicateCommand,
    IncrCommand,
    IncrResult,
    MultiDeleteCommand,
    MultiSetCommand,
    Mutation,
    Refused,
    SetCommand,
    TableEntry,
    WriteCommand,
    WriteResult,
    check_passes,
    decode_entry,
    encode_entry,
)
from quorumlog.table._dup_layout import (
    DUP_TRANSITIONS,
    DupProgress,
    DupRecord,
    DupState,
    FailMode,
    TableFlags,
    UnknownDupError,
)
from quorumlog.table._dup_shipper import UnknownRemoteClusterError
from quorumlog.table._errors import (
    BadTableRequestError,
    KeyTooLargeError,
    NonIdempotentWriteRefusedError,
    NotAnIntegerError,
    TableError,
    ValueTooLargeError,
    WriteOutcomeUnknownError,
)
from quorumlog.table._heartbeat import (
    ChangeExecutor,
    ChangeOutcome,
    GroupState,
    ScheduleRow,
    TableScheduleRequest,
    TableScheduleResponse,
    fetch_schedule,
)
from quorumlog.table._layout import (
    PartitionRecord,
    TableExistsError,
    TableLayout,
    TableNodeRecord,
    TableRecord,
    UnknownTableError,
    group_id_of,
    is_table_group,
    partition_of,
    table_node_key,
    table_nodes,
)
from quorumlog.table._messages import PartitionNotHostedError
from quorumlog.table._placement import NotEnoughTableNodesError
from quorumlog.table._scheduler import (
    ChangeKind,
    GroupReport,
    NodeReport,
    ScheduledChange,
    Scheduler,
    SchedulerConfig,
)
from quorumlog.table._scheduler_service import SchedulerService
from quorumlog.table._service import TableConfig, TableService
from quorumlog.table._store import SCAN_LIMIT_MAX, ScanItem, ScanPage, TableStore
from quorumlog.table._timetag import (
    CLUSTER_ID_MAX,
    CLUSTER_ID_MIN,
    Timetag,
    TimetagClock,
    make_timetag,
)

__all__ = [
    "CLUSTER_ID_MAX",
    "CLUSTER_ID_MIN",
    "DUP_TRANSITIONS",
    "HASH_KEY_BYTES_MAX",
    "SCAN_LIMIT_MAX",
    "SORT_KEY_BYTES_MAX",
    "VALUE_BYTES_MAX",
    "BadTableRequestError",
    "BlockingTableClient",
    "ChangeExecutor",
    "ChangeKind",
    "ChangeOutcome",
    "CheckAndMutateCommand",
    "CheckResult",
    "CheckType",
    "DeleteCommand",
    "Done",
    "DupProgress",
    "DupRecord",
    "DupState",
    "DuplicateCommand",
    "FailMode",
    "GroupReport",
    "GroupState",
    "IncrCommand",
    "IncrResult",
    "KeyTooLargeError",
    "MultiDeleteCommand",
    "MultiSetCommand",
    "Mutation",
    "NodeReport",
    "NonIdempotentWriteRefusedError",
    "NotAnIntegerError",
    "NotEnoughTableNodesError",
    "PartitionNotHostedError",
    "PartitionRecord",
    "Record",
    "Refused",
    "ScanItem",
    "ScanPage",
    "ScheduleRow",
    "ScheduledChange",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerService",
    "SetCommand",
    "TableClient",
    "TableConfig",
    "TableEntry",
    "TableError",
    "TableExistsError",
    "TableFlags",
    "TableLayout",
    "TableNodeRecord",
    "TableRecord",
    "TableScheduleRequest",
    "TableScheduleResponse",
    "TableService",
    "TableStore",
    "Timetag",
    "TimetagClock",
    "UnknownDupError",
    "UnknownRemoteClusterError",
    "UnknownTableError",
    "ValueTooLargeError",
    "WriteCommand",
    "WriteOutcomeUnknownError",
    "WriteResult",
    "check_passes",
    "decode_entry",
    "encode_entry",
    "fetch_schedule",
    "group_id_of",
    "is_table_group",
    "make_timetag",
    "partition_of",
    "table_node_key",
    "table_nodes",
]
