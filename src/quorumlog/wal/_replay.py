"""Reading a WAL back: segment selection, the CRC chain, entry replay rules.

Rules (etcd's ReadAll, with the differences written down):

- segments must have consecutive seq numbers; with a snapshot marker the read
  starts at the last segment whose name index is <= the marker's index;
- every segment starts with a crc record (its seed must equal the chain value
  the previous segment ended with) and then the metadata record, which must be
  the same in every segment;
- an entry with index i replaces every entry >= i read before it (a new Raft
  leader truncating a suffix); entries <= the snapshot index are skipped; a
  gap in indexes is corruption;
- a snapshot marker beyond the last entry restarts the log after it (the
  writer saved a snapshot it installed from elsewhere);
- the last state record wins;
- damage is a CorruptionError naming file and byte offset, except a torn tail
  of the LAST segment when the caller tolerates one (read-only open, or
  open-for-append which then repairs it).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from struct import Struct

from quorumlog.errors import CorruptionError, StorageError, invariant
from quorumlog.wal._files import SegmentName, read_image
from quorumlog.wal._format import (
    CORRUPT,
    TORN,
    FrameProblem,
    RecordType,
    SegmentDecoder,
    decode_seed,
    decode_snapshot,
)
from quorumlog.wal._types import (
    SnapshotMarker,
    SnapshotMismatchError,
    SnapshotNotFoundError,
    WalContents,
    WalEntry,
)

_UNSET_BASE = -(1 << 80)  # "no entry or marker seen yet": every index looks like a gap
_ENTRY = RecordType.ENTRY.value
_INDEX = Struct("<Q")


def damage_message(path: Path, offset: int, reason: str, *, torn_tail: bool = False) -> str:
    """What is damaged where, and what to do: ``torn_tail`` (a torn write at the end
    of the last segment) is what ``quorumlog wal repair`` cuts; anything else it
    cannot fix, and the advice must not send the operator there."""
    directory = path.parent
    head = f"WAL segment {path}: {reason} at byte offset {offset}. "
    if torn_tail:
        return head + (
            f"This is a torn write at the end of the log: `quorumlog wal repair {directory}` "
            "cuts it (keeping a .broken copy); opening the WAL for writing does the same.")
    return head + (
        "This is not a torn tail at the end of the log, so `quorumlog wal repair` cannot fix "
        "it (it only cuts a torn write at the end of the last segment) and the records from "
        f"this offset on cannot be trusted. `quorumlog wal verify {directory}` reports the "
        "damage. Replace this copy of the log: restore the directory from a backup, or "
        "rebuild this replica from its peers (a meta member: remove it with `quorumlog meta "
        "member remove`, wipe its data directory, add it again, see docs/meta.md \"A member "
        "whose data is lost, damaged or older\"; a bookie journal: `quorumlog bookie format`, "
        "see docs/bookie.md \"Re-adding a wiped bookie\").")


def corruption(path: Path, offset: int, reason: str, *, torn_tail: bool = False
               ) -> CorruptionError:
    return CorruptionError(damage_message(path, offset, reason, torn_tail=torn_tail))


@dataclass(slots=True)
class Tail:
    """Where the last segment's good data ends, and what (if anything) follows it."""

    name: SegmentName
    path: Path
    end_offset: int
    crc: int
    size_bytes: int
    problem: FrameProblem | None


def select_segments(
    directory: Path, segments: list[SegmentName], snapshot: SnapshotMarker | None
) -> list[SegmentName]:
    """The suffix of ``segments`` that holds everything after ``snapshot``."""
    for before, after in itertools.pairwise(segments):
        if after.seq != before.seq + 1:
            raise corruption(
                directory / after.file_name, 0,
                f"segment seq jumps from {before.seq} to {after.seq} (a segment is missing)",
            )
    if snapshot is None:
        return list(segments)
    for i in range(len(segments) - 1, -1, -1):
        if segments[i].index <= snapshot.index:
            return segments[i:]
    raise SnapshotNotFoundError(
        f"WAL {directory} has no segment that can hold snapshot {snapshot} "
        f"(the oldest segment starts at index {segments[0].index}); load a newer snapshot"
    )


@dataclass(slots=True)
class Replay:
    """Accumulates the records of consecutive segments (see the module rules)."""

    directory: Path
    snapshot: SnapshotMarker | None
    record_size_max_bytes: int
    tolerate_torn_tail: bool
    metadata: bytes | None = None
    state: bytes | None = None
    entries: list[WalEntry] = field(default_factory=list)
    markers: list[SnapshotMarker] = field(default_factory=list)
    base: int = _UNSET_BASE
    floor: int = 0
    snapshot_found: bool = False
    chain_crc: int | None = None
    tail: Tail | None = None

    def __post_init__(self) -> None:
        if self.snapshot is not None:
            self.base = self.snapshot.index
            self.floor = self.snapshot.index

    def run(self, segments: list[SegmentName]) -> None:
        invariant(len(segments) > 0, "replay needs at least one segment")
        for i, name in enumerate(segments):
            self.feed_segment(name, is_last=i == len(segments) - 1)
        if self.base == _UNSET_BASE:
            self.base = segments[0].index - 1
        self.floor = max(self.floor, self.base)
        if self.snapshot is not None and not self.snapshot_found:
            raise SnapshotNotFoundError(
                f"WAL {self.directory} holds no snapshot marker {self.snapshot}; "
                "the snapshot does not belong to this WAL (or its marker was in a torn tail)"
            )

    @property
    def last_index(self) -> int:
        return self.base + len(self.entries)

    def contents(self) -> WalContents:
        invariant(self.metadata is not None, "contents() before a segment was read")
        return WalContents(metadata=self.metadata or b"", state=self.state, entries=self.entries)

    def feed_segment(self, name: SegmentName, *, is_last: bool) -> None:
        path = self.directory / name.file_name
        try:
            image = read_image(path)
        except OSError as exc:
            reason = exc.strerror or exc
            raise StorageError(f"WAL segment {path} cannot be read: {reason}") from None
        decoder = SegmentDecoder(image, self.record_size_max_bytes)
        records = decoder.records()
        self._header(path, image, decoder, records)
        self._entries(path, image, records)
        self._finish_segment(name, path, image, decoder, is_last)

    def _header(
        self,
        path: Path,
        image: bytes,
        decoder: SegmentDecoder,
        records: Iterator[tuple[int, int, int, int]],
    ) -> None:
        first = next(records, None)
        second = next(records, None) if first is not None else None
        if first is None or second is None:
            problem = decoder.problem
            if problem is None:
                raise corruption(path, decoder.end_offset, "segment header is missing")
            raise corruption(path, problem.offset, f"segment header is damaged: {problem.reason}")
        if first[0] != RecordType.CRC or second[0] != RecordType.METADATA:
            raise corruption(path, 0, "segment does not start with a crc and a metadata record")
        seed = decode_seed(image, first[2], first[3])
        if seed is None:
            raise corruption(path, 0, "crc record has the wrong size")
        if self.chain_crc is not None and seed != self.chain_crc:
            raise corruption(
                path, 0,
                f"CRC chain broken: the segment starts from 0x{seed:08x} but the "
                f"previous segment ended at 0x{self.chain_crc:08x}",
            )
        metadata = image[second[2] : second[3]]
        if self.metadata is None:
            self.metadata = metadata
        elif metadata != self.metadata:
            raise corruption(
                path, second[1],
                "metadata differs from the metadata of the earlier segments "
                f"({len(metadata)} vs {len(self.metadata)} bytes)",
            )

    def _entries(
        self, path: Path, image: bytes, records: Iterator[tuple[int, int, int, int]]
    ) -> None:
        """The hot loop: per entry one unpack, one slice (the copy), one Struct."""
        entries = self.entries
        append = entries.append
        unpack_index = _INDEX.unpack_from
        base = self.base
        count = len(entries)
        entry_type = _ENTRY
        for rtype, frame, data_start, data_end in records:
            if rtype == entry_type:
                index = unpack_index(image, data_start)[0]
                slot = index - base - 1
                if slot == count:
                    append(WalEntry(index=index, data=image[data_start + 8 : data_end]))
                    count += 1
                elif slot < 0:
                    continue
                elif slot < count:
                    del entries[slot:]
                    append(WalEntry(index=index, data=image[data_start + 8 : data_end]))
                    count = slot + 1
                else:
                    self._first_entry_or_gap(path, frame, index)
                    base = self.base
                    append(WalEntry(index=index, data=image[data_start + 8 : data_end]))
                    count = 1
            else:
                self._other(path, image, (rtype, frame, data_start, data_end))
                base = self.base
                count = len(entries)

    def _first_entry_or_gap(self, path: Path, frame: int, index: int) -> None:
        if self.base != _UNSET_BASE:
            raise corruption(
                path, frame,
                f"entry index {index} leaves a gap after index {self.last_index}",
            )
        invariant(not self.entries, "entries before the replay base was set")
        self.base = index - 1

    def _other(self, path: Path, image: bytes, record: tuple[int, int, int, int]) -> None:
        rtype, frame, data_start, data_end = record
        if rtype == RecordType.STATE:
            self.state = image[data_start:data_end]
        elif rtype == RecordType.SNAPSHOT:
            marker = decode_snapshot(image, data_start, data_end)
            if marker is None:
                raise corruption(path, frame, "snapshot record has the wrong size")
            self._marker(path, frame, marker)
        else:
            kind = RecordType(rtype).name.lower()
            raise corruption(path, frame, f"unexpected {kind} record after the segment header")

    def _marker(self, path: Path, frame: int, marker: SnapshotMarker) -> None:
        self.markers.append(marker)
        self.floor = max(self.floor, marker.index)
        wanted = self.snapshot
        if wanted is not None and marker.index == wanted.index:
            if marker.term != wanted.term:
                raise SnapshotMismatchError(
                    damage_message(
                        path, frame,
                        f"snapshot marker {marker} has the index of the requested snapshot "
                        f"{wanted} but another term (ErrSnapshotMismatch)",
                    )
                )
            self.snapshot_found = True
        if self.base == _UNSET_BASE or marker.index > self.last_index:
            if wanted is not None and marker.index > wanted.index:
                raise SnapshotNotFoundError(
                    f"WAL {self.directory}: the log continues after snapshot {marker}, "
                    f"newer than the requested snapshot {wanted} and beyond its entries "
                    f"({path}, byte offset {frame}); load snapshot {marker} and open at it"
                )
            self.entries.clear()
            self.base = marker.index

    def _finish_segment(
        self, name: SegmentName, path: Path, image: bytes, decoder: SegmentDecoder, is_last: bool
    ) -> None:
        problem = decoder.problem
        if problem is None and decoder.end_offset < len(image):
            if not is_last:
                raise corruption(
                    path, decoder.end_offset,
                    f"data ends early (the file is {len(image)} bytes; only the last "
                    "segment may end in a zero tail)",
                )
            if not decoder.tail_is_zero():
                problem = FrameProblem(TORN, decoder.end_offset, "non-zero bytes after the data")
        if problem is not None:
            tolerated = is_last and self.tolerate_torn_tail and problem.kind == TORN
            if not tolerated:
                where = "" if is_last or problem.kind == CORRUPT else " (not in the last segment)"
                raise corruption(path, problem.offset, problem.reason + where,
                                 torn_tail=is_last and problem.kind == TORN)
        self.chain_crc = decoder.crc
        if is_last:
            self.tail = Tail(name, path, decoder.end_offset, decoder.crc, len(image), problem)


def replay(
    directory: Path,
    segments: list[SegmentName],
    *,
    snapshot: SnapshotMarker | None,
    record_size_max_bytes: int,
    tolerate_torn_tail: bool,
) -> Replay:
    """Select the segments for ``snapshot`` and replay them."""
    selected = select_segments(directory, segments, snapshot)
    result = Replay(directory, snapshot, record_size_max_bytes, tolerate_torn_tail)
    result.run(selected)
    return result
