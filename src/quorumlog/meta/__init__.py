"""The metadata service: a replicated KV state machine (etcd v3 semantics).

This package holds the deterministic state machine and its command types;
the service that runs it on a Raft group (driver, server, clients) is built on
``quorumlog.raft`` and ``quorumlog.rpc``.
"""

from quorumlog.meta._backup import (
    BUMP_IDS_DEFAULT,
    BUMP_REVISION_DEFAULT,
    MetaSnapshotInfo,
    RestoredMember,
    read_snapshot_file,
    restore_snapshot,
    save_snapshot,
)
from quorumlog.meta._client import CLOSE_REVOKE_DEADLINE_S, BlockingMetaClient, MetaClient
from quorumlog.meta._commands import (
    Compact,
    CompactResult,
    Compare,
    CompareOp,
    CompareTarget,
    CreateSession,
    DeleteOp,
    DeleteResult,
    ErrorResult,
    Event,
    EventType,
    IdResult,
    KeyValue,
    NextId,
    Op,
    PutOp,
    PutResult,
    RangeOp,
    RangeResult,
    Request,
    Result,
    RevokeSession,
    SessionResult,
    Txn,
    TxnResult,
)
from quorumlog.meta._leases import LeaseKeeper
from quorumlog.meta._member_guard import (
    MEMBER_RECORD_PREFIX,
    MetaDataLostError,
    check_member_data,
    publish_member_record,
)
from quorumlog.meta._member_marker import MARKER_NAME as MEMBER_MARKER_NAME
from quorumlog.meta._member_marker import write_marker
from quorumlog.meta._owned_session import OwnedSession, SessionMeta
from quorumlog.meta._service import (
    LEASE_CLOCK_DRIFT_PERCENT,
    META_GROUP_ID,
    READ_MODES,
    MetaRequestFailedError,
    MetaService,
    MetaSnapshotGoneError,
    MetaStatusRequest,
    ReadMode,
)
from quorumlog.meta._state import CompactedError, MetaLimits, MetaStateMachine

__all__ = [
    "BUMP_IDS_DEFAULT",
    "BUMP_REVISION_DEFAULT",
    "CLOSE_REVOKE_DEADLINE_S",
    "LEASE_CLOCK_DRIFT_PERCENT",
    "MEMBER_MARKER_NAME",
    "MEMBER_RECORD_PREFIX",
    "META_GROUP_ID",
    "READ_MODES",
    "BlockingMetaClient",
    "Compact",
    "CompactResult",
    "CompactedError",
    "Compare",
    "CompareOp",
    "CompareTarget",
    "CreateSession",
    "DeleteOp",
    "DeleteResult",
    "ErrorResult",
    "Event",
    "EventType",
    "IdResult",
    "KeyValue",
    "LeaseKeeper",
    "MetaClient",
    "MetaDataLostError",
    "MetaLimits",
    "MetaRequestFailedError",
    "MetaService",
    "MetaSnapshotGoneError",
    "MetaSnapshotInfo",
    "MetaStateMachine",
    "MetaStatusRequest",
    "NextId",
    "Op",
    "OwnedSession",
    "PutOp",
    "PutResult",
    "RangeOp",
    "RangeResult",
    "ReadMode",
    "Request",
    "RestoredMember",
    "Result",
    "RevokeSession",
    "SessionMeta",
    "SessionResult",
    "Txn",
    "TxnResult",
    "check_member_data",
    "publish_member_record",
    "read_snapshot_file",
    "restore_snapshot",
    "save_snapshot",
    "write_marker",
]
