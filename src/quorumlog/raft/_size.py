"""Byte accounting of entries for the size caps (messages, Ready, storage reads)."""

from __future__ import annotations

from collections.abc import Sequence

from quorumlog.raft._types import Entry

ENTRY_OVERHEAD_BYTES = 16
"""Charged per entry on top of its payload (term, index, type on the wire)."""


def entries_size_bytes(entries: Sequence[Entry]) -> int:
    """Payload plus per-entry overhead of ``entries``."""
    return sum([len(e.data) for e in entries]) + ENTRY_OVERHEAD_BYTES * len(entries)


def payload_size_bytes(entries: Sequence[Entry]) -> int:
    """Payload bytes only (the uncommitted budget counts these, as etcd)."""
    return sum([len(e.data) for e in entries])


def limit_size(entries: list[Entry], max_bytes: int) -> list[Entry]:
    """The longest prefix of ``entries`` within ``max_bytes``, never empty.

    At least one entry is kept so an entry larger than the cap still moves.
    Returns ``entries`` itself (no copy) when everything fits.
    """
    count = len(entries)
    if count <= 1:
        return entries
    sizes = [len(e.data) for e in entries]
    if sum(sizes) + ENTRY_OVERHEAD_BYTES * count <= max_bytes:
        return entries
    total = 0
    for kept, size in enumerate(sizes):
        total += size + ENTRY_OVERHEAD_BYTES
        if total > max_bytes:
            return entries[: max(kept, 1)]
    return entries
