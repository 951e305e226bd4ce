"""Auto-recovery of lost bookie replicas (BookKeeper's ``replication/``).

An auditor (one per cluster, elected through a meta lease) files one
under-replication task per ledger that names a bookie gone for longer than
``lost_bookie_recovery_delay_ms``; replication workers on every bookie node
lock a task, copy the affected fragments' entries from surviving replicas to
a replacement bookie and swap it into the ledger metadata by compare-and-swap.
See docs/recovery.md.
"""

from quorumlog.recovery._admin import (
    DecommissionProgress,
    DecommissionRefusedError,
    RecoveryStatus,
    cancel_decommission,
    decommission,
    decommission_progress,
    recovery_status,
    set_recovery_enabled,
    underreplicated,
)
from quorumlog.recovery._auditor import Auditor, AuditRound
from quorumlog.recovery._check import CheckRound, ReplicaChecker, sample_entries
from quorumlog.recovery._config import RecoveryConfig
from quorumlog.recovery._layout import (
    AUDITOR_KEY,
    DISABLED_KEY,
    TASK_PREFIX,
    ReplicationTask,
    TaskState,
    task_key,
)
from quorumlog.recovery._plan import (
    Slot,
    entries_of_slot,
    lost_bookies,
    misplaced_bookies,
    placement_label,
    replacement_for,
    slots_to_replace,
)
from quorumlog.recovery._scrub import (
    PROBLEMS,
    ReplicaReport,
    audit_extra,
    audit_fragment,
    delete_extra_copies,
    repair_tasks,
)
from quorumlog.recovery._service import RecoveryService
from quorumlog.recovery._session import RecoverySession
from quorumlog.recovery._store import RecoveryMeta
from quorumlog.recovery._worker import EntryLostError, ReplicationWorker

__all__ = [
    "AUDITOR_KEY",
    "DISABLED_KEY",
    "PROBLEMS",
    "TASK_PREFIX",
    "AuditRound",
    "Auditor",
    "CheckRound",
    "DecommissionProgress",
    "DecommissionRefusedError",
    "EntryLostError",
    "RecoveryConfig",
    "RecoveryMeta",
    "RecoveryService",
    "RecoverySession",
    "RecoveryStatus",
    "ReplicaChecker",
    "ReplicaReport",
    "ReplicationTask",
    "ReplicationWorker",
    "Slot",
    "TaskState",
    "audit_extra",
    "audit_fragment",
    "cancel_decommission",
    "decommission",
    "decommission_progress",
    "delete_extra_copies",
    "entries_of_slot",
    "lost_bookies",
    "misplaced_bookies",
    "placement_label",
    "recovery_status",
    "repair_tasks",
    "replacement_for",
    "sample_entries",
    "set_recovery_enabled",
    "slots_to_replace",
    "task_key",
    "underreplicated",
]
