"""The BookKeeper ledger protocol: quorum math, metadata and placement.

The decisions (write sets, ack sets, Qf coverage, recovery verdicts, LAC
advancement, ensemble changes, placement) are pure code in this package,
testable without a network. The client that drives them against bookies comes
with the bookie server.
"""

from quorumlog.ledger._metadata import (
    DigestType,
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

__all__ = [
    "AckSet",
    "BookieCandidate",
    "CoverageSet",
    "DigestType",
    "Fragment",
    "LacTracker",
    "LedgerMetadata",
    "LedgerState",
    "NotEnoughBookiesError",
    "Placement",
    "ReadAnswer",
    "RecoveryRead",
    "RecoveryVerdict",
    "Schedule",
    "choose_rack_aware",
    "choose_random",
    "choose_replacement",
    "master_key",
    "password_digest",
]
