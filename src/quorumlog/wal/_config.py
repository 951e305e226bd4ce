"""Settings of the write-ahead log (section ``[wal]`` of a node's TOML file)."""

from __future__ import annotations

from quorumlog.config import Config, require

MIB = 1024 * 1024

SEGMENT_SIZE_DEFAULT_BYTES = 64 * MIB
# Smallest segment accepted: one sector. Tests use tiny segments to force many
# cuts; production keeps the 64 MiB default (fewer files, fewer cuts).
SEGMENT_SIZE_MIN_BYTES = 512
# The length field keeps 56 bits for the record length (the top byte holds the
# pad flag), so no record can be larger than this.
RECORD_SIZE_LIMIT_BYTES = (1 << 56) - 1


class WalConfig(Config, frozen=True):
    """Limits of one WAL. Every field is a bound with its unit in its name."""

    # A segment is cut (a new file started) once a write leaves the current one
    # at or past this size; new segments are preallocated to this size.
    segment_size_bytes: int = SEGMENT_SIZE_DEFAULT_BYTES
    # Largest single record (header + entry index + data). Bounds what a
    # corrupt length field can make the reader believe, and what one caller
    # can push into one write.
    record_size_max_bytes: int = 16 * MIB
    # Most bytes one group-commit write carries when it merges queued saves
    # (a single larger save still goes out alone, as one write).
    batch_size_max_bytes: int = 64 * MIB
    # Encoded-but-unwritten bytes queued by save_async() before new callers
    # wait for the writer thread (backpressure instead of unbounded memory).
    pending_size_max_bytes: int = 256 * MIB

    def validate(self) -> None:
        require(
            self.segment_size_bytes >= SEGMENT_SIZE_MIN_BYTES,
            f"wal.segment_size_bytes must be >= {SEGMENT_SIZE_MIN_BYTES}",
        )
        require(
            0 < self.record_size_max_bytes <= RECORD_SIZE_LIMIT_BYTES,
            f"wal.record_size_max_bytes must be in 1..{RECORD_SIZE_LIMIT_BYTES}",
        )
        require(self.batch_size_max_bytes > 0, "wal.batch_size_max_bytes must be positive")
        require(
            self.pending_size_max_bytes >= self.batch_size_max_bytes,
            "wal.pending_size_max_bytes must be >= wal.batch_size_max_bytes",
        )
