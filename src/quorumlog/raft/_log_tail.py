"""The log tail of a file snapshot: the entries after the compaction floor up
to the snapshot's index, kept with the snapshot (Pegasus's "learn step back").

A group with a compaction floor (``RaftHost.compaction_floor``: table
duplication keeps the log its shippers have not confirmed) must keep its log
after the floor on every member, also on one rebuilt from a snapshot and on
one restarted (the WAL replays only the entries after the newest snapshot).
Raft itself never needs those entries, so they stay out of the Raft log: the
driver writes them into the snapshot's checkpoint directory as one more file,
``LOG_TAIL_FILE_NAME``, when it takes the snapshot. The file is then part of
the snapshot: it is listed in the manifest, streamed to a follower with the
checkpoint's other files, CRC-checked on arrival, and stays on disk with the
checkpoint. ``RaftHost.retained_entries`` reads the Raft log and, below its
first index, the tail of the group's current snapshot.

Format: ``MAGIC``, CRC32C of the body (4 bytes, little endian), body = the
msgpack list of the entries (consecutive indexes).
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable
from pathlib import Path

import msgspec
from crc32c import crc32c

from quorumlog.errors import CorruptionError, invariant
from quorumlog.raft._errors import CompactedError
from quorumlog.raft._size import entries_size_bytes, limit_size
from quorumlog.raft._storage import RaftStorage
from quorumlog.raft._types import Entry

LOG_TAIL_FILE_NAME = "raft-log-tail"
"""The tail's file in a checkpoint directory; a FileSnapshotMachine skips it."""

MAGIC = b"QLTAIL1\n"
_CRC = struct.Struct("<I")
_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(list[Entry])


def write_log_tail(directory: Path, entries: list[Entry]) -> None:
    """Write ``entries`` (consecutive) as the tail file of a checkpoint being taken."""
    for before, after in itertools.pairwise(entries):
        invariant(after.index == before.index + 1, "a log tail is consecutive")
    body = _ENCODER.encode(entries)
    (directory / LOG_TAIL_FILE_NAME).write_bytes(MAGIC + _CRC.pack(crc32c(body)) + body)


def read_log_tail(checkpoint: Path) -> list[Entry]:
    """The tail kept with a checkpoint; [] if it has none."""
    path = checkpoint / LOG_TAIL_FILE_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    header = len(MAGIC) + _CRC.size
    if not data.startswith(MAGIC) or len(data) < header:
        raise CorruptionError(f"{path} is not a log tail file (bad header)")
    (crc,) = _CRC.unpack_from(data, len(MAGIC))
    body = memoryview(data)[header:]
    if crc32c(body) != crc:
        raise CorruptionError(f"{path}: CRC mismatch; the log tail is damaged")
    try:
        entries = _DECODER.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise CorruptionError(f"{path}: malformed log tail: {exc}") from None
    for before, after in itertools.pairwise(entries):
        if after.index != before.index + 1:
            raise CorruptionError(f"{path}: log tail skips from {before.index} to {after.index}")
    return entries


# -- the rules, pure: RaftHost runs them on its WAL storage and checkpoint
# files, the simulator on its own (``quorumlog sim table``'s dup mix) --------


def retained_from(log: RaftStorage, tail: list[Entry], lo: int, hi: int, max_bytes: int, *,
                  group_id: int) -> list[Entry]:
    """Entries [lo, hi), at most ``max_bytes`` (at least one entry): from the
    Raft log ``log``, or below its first index from ``tail`` (the current
    snapshot's log tail). May return fewer than asked (the tail's part first);
    CompactedError if ``lo`` is in neither."""
    first = log.first_index()
    if lo >= first:
        return log.entries(lo, hi, max_bytes)
    if not tail or not tail[0].index <= lo <= tail[-1].index:
        raise CompactedError(
            f"entries from {lo} of group {group_id}: the log starts at {first} and the "
            f"snapshot's log tail holds "
            f"{f'{tail[0].index}..{tail[-1].index}' if tail else 'nothing'}")
    base = tail[0].index
    return limit_size(tail[lo - base:min(hi, tail[-1].index + 1) - base], max_bytes)


def first_retained_index(log: RaftStorage, tail: list[Entry]) -> int:
    """The first index ``retained_from`` can read from ``log`` and ``tail`` without
    a gap up to the log's end."""
    first = log.first_index()
    return tail[0].index if tail and tail[-1].index + 1 >= first else first


def snapshot_tail(read: Callable[[int, int, int], list[Entry]], floor: int | None,
                  index: int, bytes_max: int, *, first_retained: int = 0) -> list[Entry] | None:
    """The entries (floor, index] to keep with a snapshot at ``index``, read
    with ``read(lo, hi, max_bytes)`` (``retained_from``); None without a floor
    below ``index``. CompactedError if they are gone already or longer than
    ``bytes_max``.

    A floor below ``first_retained`` (``first_retained_index``: a replica that
    installed a snapshot whose tail starts above the floor it knows, its floor
    a heartbeat behind the shippers') keeps what is retained after the floor:
    raising there dropped the entries the replica still had past the true
    confirmed_decree (found by the table simulator's dup mix, seed 775620660968)."""
    if floor is None or floor >= index:
        return None
    tail: list[Entry] = []
    lo = max(floor + 1, first_retained)
    if lo > index:
        return None
    while lo <= index:
        part = read(lo, index + 1, bytes_max - entries_size_bytes(tail))
        tail.extend(part)
        lo = part[-1].index + 1
        if entries_size_bytes(tail) >= bytes_max and lo <= index:
            raise CompactedError(f"over snapshot_log_tail_bytes_max ({bytes_max} bytes)")
    return tail


def compaction_target(compact_to: int, floor: int | None) -> int:
    """Where a compaction that wants to drop the log up to ``compact_to`` may
    go: never past the compaction floor (duplication's ``confirmed_decree``)."""
    return compact_to if floor is None else min(compact_to, floor)
