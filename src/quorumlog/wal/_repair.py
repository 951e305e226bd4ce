"""Cutting a torn tail off the last segment (etcd's Repair)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import msgspec

from quorumlog.errors import invariant
from quorumlog.log import get_logger
from quorumlog.wal._files import BROKEN_SUFFIX, fsync_dir, preallocate, read_image
from quorumlog.wal._replay import Tail


class RepairReport(msgspec.Struct, frozen=True, kw_only=True):
    """What a repair cut: ``segment`` was truncated at ``offset``; the
    ``bytes_cut`` non-zero bytes after it are kept in ``broken_copy``."""

    segment: str
    offset: int
    bytes_cut: int
    broken_copy: str
    reason: str


def repair_tail(tail: Tail, segment_size_bytes: int) -> RepairReport:
    """Keep ``<segment>.broken``, truncate after the last good record, re-preallocate, fsync."""
    problem = tail.problem
    invariant(problem is not None, "repair of a tail without a problem")
    path = tail.path
    broken = path.with_name(path.name + BROKEN_SUFFIX)
    nonzero_end = len(read_image(path).rstrip(b"\x00"))
    shutil.copyfile(path, broken)
    _fsync_file(broken)
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        os.ftruncate(fd, tail.end_offset)
        preallocate(fd, max(segment_size_bytes, tail.end_offset))
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(path.parent)
    report = RepairReport(
        segment=str(path),
        offset=tail.end_offset,
        bytes_cut=max(0, nonzero_end - tail.end_offset),
        broken_copy=str(broken),
        reason=problem.reason if problem else "",
    )
    get_logger(__name__).warning("wal_tail_repaired", segment=report.segment, offset=report.offset,
                 bytes_cut=report.bytes_cut, reason=report.reason)
    return report


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
