"""Deterministic simulation and history checking: ``quorumlog.sim``.

- A linearizability checker for key-value histories (put / get / CAS, with
  unknown outcomes), independent of the simulator: :func:`check_history`.
- Simulator parts, each seeded and replayable: a virtual clock and timer
  queue, a faulty network (delay, drop, duplicate, reorder, symmetric and
  one-way partitions), disks that lose or tear unsynced writes on a crash.
- A Raft cluster simulator of the metadata state machine built on them: :func:`run_seed` runs one
  seed of a :class:`FaultMix` and returns a :class:`SimResult` (which
  invariant, if any, was violated; whether the client history was
  linearizable); :func:`run_many` runs many seeds, in several processes.
- A ledger protocol simulator: the real ``quorumlog.ledger`` client code on a
  virtual-time event loop (:class:`VirtualTimeLoop`) against simulated
  bookies and meta (:class:`LedgerWorld`); :func:`run_ledger_seed` /
  :func:`run_ledger_many` check the ledger guarantees under crashes,
  partitions, slow bookies and lost messages.
- An auto-recovery simulator: the production auditor and replication
  workers (``quorumlog.recovery``) on three nodes against simulated bookies
  and a meta store with sessions, with node crashes mid-copy, expiring
  sessions, bookie outages and disks lost for good:
  :func:`run_recovery_seed` / :func:`run_recovery_many`.
- A table simulator: the production table scheduler and the partitions' Raft
  groups on 5-7 nodes, with crashes (one for good), partitions and scheduler
  failovers: :func:`run_table_seed` / :func:`run_table_many`; its ``dup`` mix
  (``table_config_for_mix``) runs table replicas duplicating to a remote
  cluster (the log floor, snapshot tails, tombstone GC, remote outages).

See docs/sim.md for the invariants, the fault mixes and how to replay a seed.
"""

from quorumlog.sim._batch import BatchSummary, MixSummary, SeedSpec, run_many, run_spec
from quorumlog.sim._client import ClientOp, ClientRequest, ClientResponse, SimClient
from quorumlog.sim._clock import TimerQueue, VirtualClock
from quorumlog.sim._config import MIX_ROTATION, MIXES, FaultMix, SimConfig, mix_for_seed
from quorumlog.sim._disk import CrashOutcome, SimDisk
from quorumlog.sim._invariants import RaftInvariants, SimInvariantViolation
from quorumlog.sim._ledger_loop import SimDeadlockError, VirtualTimeLoop, run_virtual
from quorumlog.sim._ledger_runner import (
    LEDGER_MIXES,
    LedgerFaultMix,
    LedgerSimResult,
    LedgerSimulation,
    ledger_mix_for_seed,
    run_ledger_many,
    run_ledger_seed,
)
from quorumlog.sim._ledger_world import LedgerViolation, LedgerWorld, SimBookie
from quorumlog.sim._linearizability import (
    KeyResult,
    LinearizabilityResult,
    Operation,
    OpKind,
    Verdict,
    check_history,
    partition_by_key,
)
from quorumlog.sim._network import Envelope, NetworkStats, SimNetwork
from quorumlog.sim._recovery_runner import (
    RecoverySimResult,
    RecoverySimulation,
    run_recovery_many,
    run_recovery_seed,
)
from quorumlog.sim._runner import RaftSimulation, SimResult, run_seed
from quorumlog.sim._table_config import TABLE_MIXES, TableSimConfig, table_config_for_mix
from quorumlog.sim._table_runner import (
    TableSimResult,
    TableSimulation,
    run_table_many,
    run_table_seed,
)
from quorumlog.sim._trace import Tracer

__all__ = [
    "LEDGER_MIXES",
    "MIXES",
    "MIX_ROTATION",
    "TABLE_MIXES",
    "BatchSummary",
    "ClientOp",
    "ClientRequest",
    "ClientResponse",
    "CrashOutcome",
    "Envelope",
    "FaultMix",
    "KeyResult",
    "LedgerFaultMix",
    "LedgerSimResult",
    "LedgerSimulation",
    "LedgerViolation",
    "LedgerWorld",
    "LinearizabilityResult",
    "MixSummary",
    "NetworkStats",
    "OpKind",
    "Operation",
    "RaftInvariants",
    "RaftSimulation",
    "RecoverySimResult",
    "RecoverySimulation",
    "SeedSpec",
    "SimBookie",
    "SimClient",
    "SimConfig",
    "SimDeadlockError",
    "SimDisk",
    "SimInvariantViolation",
    "SimNetwork",
    "SimResult",
    "TableSimConfig",
    "TableSimResult",
    "TableSimulation",
    "TimerQueue",
    "Tracer",
    "Verdict",
    "VirtualClock",
    "VirtualTimeLoop",
    "check_history",
    "ledger_mix_for_seed",
    "mix_for_seed",
    "partition_by_key",
    "run_ledger_many",
    "run_ledger_seed",
    "run_many",
    "run_recovery_many",
    "run_recovery_seed",
    "run_seed",
    "run_spec",
    "run_table_many",
    "run_table_seed",
    "run_virtual",
    "table_config_for_mix",
]
