"""Raft consensus, sans-IO (after etcd's raft): ``quorumlog.raft``.

A :class:`RaftNode` is one member of one group. It changes memory only; the
caller feeds it ``tick()``, ``step(message)`` and proposals, and carries out
each :class:`Ready` (persist, send, apply — in that order) before
``advance(ready)``. See docs/raft.md for the API, the guarantees and the
driver loop.
"""

from quorumlog.raft._confchange import ConfChangeError
from quorumlog.raft._config import RaftConfig, ReadOnlyMode
from quorumlog.raft._driver import (
    COMBINED_MSGPACK_MAX,
    HostConfig,
    RaftHost,
    combine_msgpack,
    group_directory,
)
from quorumlog.raft._errors import (
    CompactedError,
    ConfChangePendingError,
    ProposalDroppedError,
    SnapshotOutOfDateError,
    SnapshotTemporarilyUnavailableError,
    UnavailableError,
)
from quorumlog.raft._file_snapshot import FileSnapshotMachine, StateMachine
from quorumlog.raft._liveness import PeerLiveness
from quorumlog.raft._log_tail import (
    LOG_TAIL_FILE_NAME,
    compaction_target,
    first_retained_index,
    retained_from,
    snapshot_tail,
)
from quorumlog.raft._node import QUIESCE_CONTEXT, RaftNode, fold_epoch
from quorumlog.raft._ready_pass import (
    MemoryReadyStorage,
    PendingPass,
    ReadyGroup,
    ReadyPass,
    ReadyStorage,
    ReadyTransport,
)
from quorumlog.raft._storage import (
    BOOTSTRAP_INDEX,
    BOOTSTRAP_TERM,
    MemoryStorage,
    RaftStorage,
)
from quorumlog.raft._types import (
    NO_NODE,
    ConfChange,
    ConfChangeSingle,
    ConfChangeTransition,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Message,
    MessageType,
    ReadState,
    Ready,
    Role,
    Snapshot,
    SnapshotMeta,
    SoftState,
    decode_message,
    encode_message,
    format_entries,
    format_message,
)
from quorumlog.raft._wal_storage import SNAPSHOT_FILES_KEPT, WalRaftStorage

__all__ = [
    "BOOTSTRAP_INDEX",
    "BOOTSTRAP_TERM",
    "COMBINED_MSGPACK_MAX",
    "LOG_TAIL_FILE_NAME",
    "NO_NODE",
    "QUIESCE_CONTEXT",
    "SNAPSHOT_FILES_KEPT",
    "CompactedError",
    "ConfChange",
    "ConfChangeError",
    "ConfChangePendingError",
    "ConfChangeSingle",
    "ConfChangeTransition",
    "ConfChangeType",
    "ConfState",
    "Entry",
    "EntryType",
    "FileSnapshotMachine",
    "HardState",
    "HostConfig",
    "MemoryReadyStorage",
    "MemoryStorage",
    "Message",
    "MessageType",
    "PeerLiveness",
    "PendingPass",
    "ProposalDroppedError",
    "RaftConfig",
    "RaftHost",
    "RaftNode",
    "RaftStorage",
    "ReadOnlyMode",
    "ReadState",
    "Ready",
    "ReadyGroup",
    "ReadyPass",
    "ReadyStorage",
    "ReadyTransport",
    "Role",
    "Snapshot",
    "SnapshotMeta",
    "SnapshotOutOfDateError",
    "SnapshotTemporarilyUnavailableError",
    "SoftState",
    "StateMachine",
    "UnavailableError",
    "WalRaftStorage",
    "combine_msgpack",
    "compaction_target",
    "decode_message",
    "encode_message",
    "first_retained_index",
    "fold_epoch",
    "format_entries",
    "format_message",
    "group_directory",
    "retained_from",
    "snapshot_tail",
]
