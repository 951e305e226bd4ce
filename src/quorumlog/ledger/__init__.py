"""The BookKeeper ledger protocol: quorum math, metadata, placement and the client.

The decisions (write sets, ack sets, Qf coverage, recovery verdicts, LAC
advancement, placement) are pure code in this package, testable without a
network. :class:`LedgerClient` (asyncio) and :class:`BlockingLedgerClient`
drive them against bookies through :class:`BookieTransport` (rpc in
production, simulated bookies in ``quorumlog.sim``). See docs/ledger.md.
"""

from quorumlog.ledger._batch import EntryBatch, LedgerEntry
from quorumlog.ledger._blocking import (
    BlockingLedgerClient,
    BlockingReadHandle,
    BlockingWriteHandle,
)
from quorumlog.ledger._bookie_client import (
    BatchReply,
    BookieOutcome,
    BookieTransport,
    EntryReply,
    LacReply,
    RpcBookieTransport,
    outcome_of,
)
from quorumlog.ledger._client import LedgerClient
from quorumlog.ledger._config import LedgerClientConfig
from quorumlog.ledger._context import MetaStore
from quorumlog.ledger._errors import (
    EntryUnavailableError,
    LedgerClosedError,
    LedgerRecoveryError,
    LedgerWriteError,
    MetadataConflictError,
    ReadPastLacError,
)
from quorumlog.ledger._metadata import (
    Fragment,
    LedgerMetadata,
    LedgerState,
    master_key,
    password_digest,
)
from quorumlog.ledger._placement import (
    BookieCandidate,
    NotEnoughBookiesError,
    Placement,
    choose_rack_aware,
    choose_random,
    choose_replacement,
    write_sets_spread,
)
from quorumlog.ledger._quorum import (
    AckSet,
    CoverageSet,
    LacTracker,
    ReadAnswer,
    RecoveryRead,
    RecoveryVerdict,
    Schedule,
)
from quorumlog.ledger._read import ReadHandle
from quorumlog.ledger._recovery import answer_of
from quorumlog.ledger._write import RACK_LABELS, WriteHandle, known_placement
from quorumlog.proto import DigestType

__all__ = [
    "RACK_LABELS",
    "AckSet",
    "BatchReply",
    "BlockingLedgerClient",
    "BlockingReadHandle",
    "BlockingWriteHandle",
    "BookieCandidate",
    "BookieOutcome",
    "BookieTransport",
    "CoverageSet",
    "DigestType",
    "EntryBatch",
    "EntryReply",
    "EntryUnavailableError",
    "Fragment",
    "LacReply",
    "LacTracker",
    "LedgerClient",
    "LedgerClientConfig",
    "LedgerClosedError",
    "LedgerEntry",
    "LedgerMetadata",
    "LedgerRecoveryError",
    "LedgerState",
    "LedgerWriteError",
    "MetaStore",
    "MetadataConflictError",
    "NotEnoughBookiesError",
    "Placement",
    "ReadAnswer",
    "ReadHandle",
    "ReadPastLacError",
    "RecoveryRead",
    "RecoveryVerdict",
    "RpcBookieTransport",
    "Schedule",
    "WriteHandle",
    "answer_of",
    "choose_rack_aware",
    "choose_random",
    "choose_replacement",
    "known_placement",
    "master_key",
    "outcome_of",
    "password_digest",
    "write_sets_spread",
]
