"""Settings of auto-recovery (``[recovery]`` in a node's TOML file).

Every bound has its unit in its name and a comment saying why it exists.
"""

from __future__ import annotations

from quorumlog.config import Config, require

MIB = 1024 * 1024


class RecoveryConfig(Config, frozen=True):
    """The auditor and the replication worker of one bookie node."""

    # Run the auditor candidate and the replication worker on this node.
    enabled: bool = True
    # A bookie gone (unregistered) for less than this is thought to be
    # restarting: no task is filed. BookKeeper's lostBookieRecoveryDelay.
    lost_bookie_recovery_delay_ms: int = 60_000
    # How often the elected auditor compares registrations with ledgers, and
    # how often an idle worker looks for tasks.
    audit_interval_ms: int = 1_000
    worker_poll_interval_ms: int = 1_000
    # The auditor lease and task locks live in a meta session of this TTL: a
    # SIGKILLed auditor or worker loses them after at most this long.
    lease_ttl_ms: int = 4_000
    # An OPEN ledger whose task is younger than this is left to its writer
    # (which replaces failed bookies itself); after it, the worker fences and
    # recovers the ledger (closing it) and replicates it.
    open_ledger_grace_ms: int = 30_000
    # Attempts at one task before it is marked failed (reported, not retried),
    # and the pause after a failed attempt (doubled each time).
    task_attempts_max: int = 8
    retry_backoff_ms: int = 500
    # Copy speed bound of one worker, so re-replication does not starve
    # clients of disk and network.
    throttle_bytes_per_s: int = 64 * MIB
    # Entries per recovery add batch (the bookie's AddEntriesRequest bound
    # applies too) and in-flight reads from survivors.
    copy_batch_entries_max: int = 64
    # Ledgers one worker copies at once: while one waits for its replacement's
    # journal fsync, another reads from its survivors. Each holds a batch of
    # envelopes in memory (up to copy_batch_entries_max entries), and each
    # holds its task lock for the copy, so other workers take the rest.
    copy_ledgers_in_flight_max: int = 4
    # Copies skip the replacement's journal (FLAG_NO_JOURNAL): each copied
    # byte is written once, to its entry log, instead of twice, and the worker
    # flushes the replacement's write cache before the metadata names it.
    # False: journaled copies (bookies older than FlushLedgerRequest).
    copy_without_journal: bool = True
    # One bookie request (read or add batch) made by a worker.
    request_timeout_ms: int = 10_000
    # Ledgers the auditor reads per meta range call.
    audit_ledgers_per_page: int = 1_000
    # The periodic replica check (silent loss on live bookies): how often the
    # auditor reads the entries every registered bookie of every closed
    # ledger's fragments should hold (0: never; the first check runs one
    # interval after the node starts), the share of each replica's entries it
    # reads (100: all; less: a random sample plus the last entry), and the
    # reads in flight (bounds the load on bookies).
    check_interval_ms: int = 86_400_000
    check_sample_percent: int = 100
    check_reads_in_flight_max: int = 32

    def validate(self) -> None:
        for name in ("lost_bookie_recovery_delay_ms", "open_ledger_grace_ms",
                     "retry_backoff_ms", "check_interval_ms"):
            require(getattr(self, name) >= 0, f"[recovery] {name} must be >= 0")
        for name in ("audit_interval_ms", "worker_poll_interval_ms", "lease_ttl_ms",
                     "task_attempts_max", "throttle_bytes_per_s", "copy_batch_entries_max",
                     "copy_ledgers_in_flight_max",
                     "request_timeout_ms", "audit_ledgers_per_page",
                     "check_reads_in_flight_max"):
            require(getattr(self, name) > 0, f"[recovery] {name} must be positive")
        require(0 < self.check_sample_percent <= 100,
                "[recovery] check_sample_percent must be in 1..100")
        require(self.lease_ttl_ms >= 500, "[recovery] lease_ttl_ms must be >= 500")
