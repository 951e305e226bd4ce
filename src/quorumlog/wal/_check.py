"""Offline tools over a WAL directory: inspect, verify, repair, snapshot markers."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import msgspec

from quorumlog.errors import QuorumlogError
from quorumlog.wal._config import WalConfig
from quorumlog.wal._files import SegmentName, existing_segments, list_segments, read_image
from quorumlog.wal._format import (
    CORRUPT,
    RECORD_TYPE_NAMES,
    TORN,
    RecordType,
    SegmentDecoder,
    entry_index,
)
from quorumlog.wal._repair import RepairReport
from quorumlog.wal._replay import replay
from quorumlog.wal._types import SnapshotMarker
from quorumlog.wal._wal import Wal

# `inspect --records` lists at most this many records unless told otherwise.
RECORDS_LIMIT_DEFAULT = 1000


class RecordInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One record as found on disk (``index`` for entries, else None)."""

    segment: str
    offset: int
    type: str
    frame_bytes: int
    index: int | None


class SegmentReport(msgspec.Struct, frozen=True, kw_only=True):
    """One segment decoded on its own: counts, index range, where data ends, status."""

    name: str
    size_bytes: int
    data_bytes: int
    record_counts: dict[str, int]
    first_index: int | None
    last_index: int | None
    status: str
    problem: str | None


class WalReport(msgspec.Struct, frozen=True, kw_only=True):
    """``inspect``: every segment, the records asked for, and verify's verdict."""

    directory: str
    segments: list[SegmentReport]
    records: list[RecordInfo]
    error: str | None


class VerifySummary(msgspec.Struct, frozen=True, kw_only=True):
    """What a clean ``verify`` found."""

    segments: int
    entries: int
    first_index: int | None
    last_index: int | None
    snapshot_markers: list[SnapshotMarker]
    has_state: bool


def _cfg(config: WalConfig | None) -> WalConfig:
    cfg = config if config is not None else WalConfig()
    cfg.validate()
    return cfg


def verify(directory: str | os.PathLike[str], *, config: WalConfig | None = None) -> VerifySummary:
    """Read every segment strictly (a torn tail counts as damage).

    Raises CorruptionError (file and byte offset in the message) or
    StorageError; returns a summary when the WAL is clean.
    """
    path = Path(directory)
    segments = existing_segments(path)
    result = replay(path, segments, snapshot=None,
                    record_size_max_bytes=_cfg(config).record_size_max_bytes,
                    tolerate_torn_tail=False)
    entries = result.entries
    return VerifySummary(
        segments=len(segments),
        entries=len(entries),
        first_index=entries[0].index if entries else None,
        last_index=entries[-1].index if entries else None,
        snapshot_markers=result.markers,
        has_state=result.state is not None,
    )


def valid_snapshot_markers(
    directory: str | os.PathLike[str], *, config: WalConfig | None = None
) -> list[SnapshotMarker]:
    """The snapshot markers in the WAL, oldest first (etcd's ValidSnapshotEntries).

    Reads read-only and tolerates a torn tail. Unlike etcd it cannot drop
    markers beyond the committed index: the state record is opaque here.
    """
    path = Path(directory)
    result = replay(path, existing_segments(path), snapshot=None,
                    record_size_max_bytes=_cfg(config).record_size_max_bytes,
                    tolerate_torn_tail=True)
    return result.markers


def repair(
    directory: str | os.PathLike[str], *, config: WalConfig | None = None
) -> RepairReport | None:
    """Open for append (which cuts a torn tail, keeping ``.broken``) and close.

    Returns what was cut, or None if the WAL needed nothing. Damage other
    than a torn tail of the last segment raises CorruptionError.
    """
    wal = Wal.open(directory, config=config)
    wal.close()
    return wal.repair_report


def inspect(
    directory: str | os.PathLike[str],
    *,
    records_limit: int = 0,
    config: WalConfig | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> WalReport:
    """Decode each segment on its own (for a table) and run :func:`verify`.

    Lists up to ``records_limit`` records. Never raises for damage: it is
    reported per segment and in ``error``. ``progress(done, total)`` is called
    after each step: one per segment, then one for the verify pass.
    """
    path = Path(directory)
    cfg = _cfg(config)
    segments = list_segments(path)
    steps = len(segments) + 1
    records: list[RecordInfo] = []
    reports = []
    for i, name in enumerate(segments):
        reports.append(_inspect_segment(path, name, cfg, records, records_limit,
                                        is_last=i == len(segments) - 1))
        if progress is not None:
            progress(i + 1, steps)
    error: str | None = None
    try:
        verify(path, config=cfg)
    except QuorumlogError as exc:
        error = exc.message
    if progress is not None:
        progress(steps, steps)
    return WalReport(directory=str(path), segments=reports, records=records, error=error)


def _inspect_segment(
    directory: Path,
    name: SegmentName,
    cfg: WalConfig,
    records: list[RecordInfo],
    records_limit: int,
    *,
    is_last: bool,
) -> SegmentReport:
    image = read_image(directory / name.file_name)
    decoder = SegmentDecoder(image, cfg.record_size_max_bytes)
    counts = {t.name.lower(): 0 for t in RecordType}
    first: int | None = None
    last: int | None = None
    for rtype, frame, data_start, data_end in decoder.records():
        counts[RECORD_TYPE_NAMES[rtype]] += 1
        index = entry_index(image, data_start) if rtype == RecordType.ENTRY else None
        if index is not None:
            first = index if first is None else first
            last = index
        if len(records) < records_limit:
            records.append(RecordInfo(
                segment=name.file_name, offset=frame, type=RECORD_TYPE_NAMES[rtype],
                frame_bytes=_frame_end(data_end) - frame, index=index,
            ))
    status, problem = _segment_status(decoder, len(image), is_last=is_last)
    return SegmentReport(
        name=name.file_name, size_bytes=len(image), data_bytes=decoder.end_offset,
        record_counts=counts, first_index=first, last_index=last, status=status,
        problem=problem,
    )


def _frame_end(data_end: int) -> int:
    return data_end + (-data_end & 7)


def _segment_status(decoder: SegmentDecoder, size: int, *, is_last: bool) -> tuple[str, str | None]:
    problem = decoder.problem
    if problem is not None:
        kind = problem.kind if is_last else CORRUPT
        return kind, f"{problem.reason} at byte offset {problem.offset}"
    if decoder.end_offset < size:
        if not is_last:
            return CORRUPT, f"data ends early at byte offset {decoder.end_offset}"
        if not decoder.tail_is_zero():
            return TORN, f"non-zero bytes after the data at byte offset {decoder.end_offset}"
    return "ok", None
