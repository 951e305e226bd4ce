"""The I/O side of append mode: the tail segment, cuts and segment release."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from quorumlog.errors import invariant
from quorumlog.log import get_logger
from quorumlog.wal._encoder import SegmentCut
from quorumlog.wal._files import (
    SegmentName,
    create_file_atomically,
    fsync_dir,
    write_all,
    write_all_vectored,
)


class SegmentWriter:
    """Owns the open tail segment; every method is called under the WAL's I/O lock."""

    def __init__(
        self,
        directory: Path,
        segments: list[SegmentName],
        fd: int,
        offset: int,
        segment_size_bytes: int,
    ) -> None:
        invariant(len(segments) > 0, "a writer needs a tail segment")
        self.directory = directory
        self.segments = segments
        self.fd = fd
        self.offset = offset
        self.segment_size_bytes = segment_size_bytes
        self.closed = False

    @property
    def tail(self) -> SegmentName:
        return self.segments[-1]

    def write_many(self, buffers: list[bytes]) -> None:
        """Write encoded saves at the end of the data: one pwrite, or pwritev of the pieces."""
        if len(buffers) == 1:
            write_all(self.fd, buffers[0], self.offset)
            self.offset += len(buffers[0])
        else:
            self.offset += write_all_vectored(self.fd, buffers, self.offset)

    def sync(self) -> None:
        os.fdatasync(self.fd)

    def cut(self, cut: SegmentCut) -> None:
        """etcd's cut: trim and fsync the tail, then start the next segment atomically.

        The new segment (header already encoded) is written to a temp file,
        preallocated, fdatasynced and renamed, and the directory fsynced, so a
        segment file is never visible without its crc and metadata records.
        """
        invariant(cut.previous_end == self.offset, "cut point differs from the written offset")
        invariant(cut.name.seq == self.tail.seq + 1, "cut does not follow the tail segment")
        os.ftruncate(self.fd, self.offset)
        os.fsync(self.fd)
        path = self.directory / cut.name.file_name
        new_fd = create_file_atomically(path, cut.header, self.segment_size_bytes)
        old_fd, self.fd = self.fd, new_fd
        os.close(old_fd)
        self.segments.append(cut.name)
        self.offset = len(cut.header)
        get_logger(__name__).debug(
            "wal_segment_cut", path=str(path), seq=cut.name.seq, index=cut.name.index
        )

    def release_to(self, index: int) -> list[Path]:
        """Unlink the segments before the last one whose name index is <= ``index``.

        etcd's ReleaseLockTo: the segment that may hold ``index`` stays, and
        the tail always stays.
        """
        keep_from = 0
        for i, name in enumerate(self.segments):
            if name.index <= index:
                keep_from = i
        removed = [self.directory / name.file_name for name in self.segments[:keep_from]]
        for path in removed:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        if removed:
            del self.segments[:keep_from]
            fsync_dir(self.directory)
        return removed

    def close(self) -> None:
        """Close the tail segment; the WAL makes no calls after this (it checks closed)."""
        if not self.closed:
            self.closed = True
            os.close(self.fd)
