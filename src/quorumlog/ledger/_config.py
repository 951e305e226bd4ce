"""Settings of the ledger client (``[ledger]`` in a TOML file).

Every bound has its unit in its name and a comment saying why it exists.
"""

from __future__ import annotations

from quorumlog.config import Config, require

KIB = 1024
MIB = 1024 * KIB


class LedgerClientConfig(Config, frozen=True):
    """Limits and timeouts of :class:`quorumlog.ledger.LedgerClient`."""

    # One add to one bookie: past this the bookie counts as failed for that
    # entry (ensemble change before Qa, remembered after Qa).
    add_timeout_ms: int = 5_000
    # One read / LAC read / fence / explicit-LAC request to one bookie.
    read_timeout_ms: int = 5_000
    # A read not answered within this delay is also sent to the next replica.
    speculative_read_delay_ms: int = 100
    # Appended but not yet confirmed adds per write handle: beyond either bound
    # append() waits and append_async() raises BackpressureError.
    outstanding_adds_max: int = 10_000
    outstanding_bytes_max: int = 64 * MIB
    # Largest entry payload accepted (the bookie's default entry_max_bytes
    # minus the envelope header and digest).
    entry_max_bytes: int = 5 * MIB - 64
    # Ensemble changes one write handle may make before it fails: a writer
    # that keeps losing bookies should close and let an operator look.
    ensemble_changes_max: int = 32
    # Attempts to find replacement bookies (with backoff) for one change.
    replacement_attempts_max: int = 8
    replacement_backoff_ms: int = 100
    # Compare-and-swap attempts on ledger metadata before giving up.
    metadata_cas_attempts_max: int = 16
    # An idle writer sends its LAC explicitly after this long, so tailing
    # readers see the last entries (0 disables).
    explicit_lac_interval_ms: int = 20
    # Recovery reads ahead this many entries (each read goes to the whole
    # write set); the window starts small and doubles while entries are found.
    recovery_reads_in_flight_max: int = 256
    # A reader keeps this many entries in flight when reading a range.
    read_entries_in_flight_max: int = 64
    # A tailing reader that is behind (wait_for_entry below the LAC) reads
    # ahead this many entries at once instead of one round trip per entry.
    tail_read_ahead_entries: int = 256
    # One batch read (E == Qw) asks for at most this many entries / bytes.
    batch_read_entries_max: int = 256
    batch_read_bytes_max: int = 4 * MIB
    # Batch reads of a range kept in flight at once, spread over the
    # fragment's replicas (each holds every entry when E == Qw).
    batch_reads_in_flight_max: int = 4
    # Failure domains a rack/zone-aware write set should span.
    placement_min_racks: int = 2

    def validate(self) -> None:
        for name in (
            "add_timeout_ms", "read_timeout_ms", "outstanding_adds_max",
            "outstanding_bytes_max", "entry_max_bytes", "replacement_attempts_max",
            "metadata_cas_attempts_max", "recovery_reads_in_flight_max",
            "read_entries_in_flight_max", "batch_read_entries_max", "batch_read_bytes_max",
            "batch_reads_in_flight_max",
            "tail_read_ahead_entries",
            "placement_min_racks",
        ):
            require(getattr(self, name) > 0, f"{name} must be positive")
        for name in ("speculative_read_delay_ms", "ensemble_changes_max",
                     "replacement_backoff_ms", "explicit_lac_interval_ms"):
            require(getattr(self, name) >= 0, f"{name} must be >= 0")
        require(self.entry_max_bytes <= self.outstanding_bytes_max,
                "entry_max_bytes must fit in outstanding_bytes_max")
