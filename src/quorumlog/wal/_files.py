"""Files of a WAL directory: segment names, the lock, fsync and preallocation."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
from dataclasses import dataclass
from pathlib import Path

from quorumlog.errors import LockedError, StorageError

SEGMENT_SUFFIX = ".wal"
TEMP_SUFFIX = ".tmp"
BROKEN_SUFFIX = ".broken"
LOCK_FILE_NAME = "wal.lock"
_SEGMENT_RE = re.compile(r"^([0-9a-f]{16})-([0-9a-f]{16})\.wal$")
_FILE_MODE = 0o644
_READ_CHUNK_BYTES = 1 << 30
# Most buffers one pwritev takes (POSIX IOV_MAX; 1024 on Linux).
IOV_MAX = os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else 1024


@dataclass(frozen=True, slots=True, order=True)
class SegmentName:
    """``{seq:016x}-{index:016x}.wal``: seq counts segments, index is the first
    entry index the segment may hold."""

    seq: int
    index: int

    @property
    def file_name(self) -> str:
        return f"{self.seq:016x}-{self.index:016x}{SEGMENT_SUFFIX}"

    @classmethod
    def parse(cls, file_name: str) -> SegmentName | None:
        match = _SEGMENT_RE.match(file_name)
        if match is None:
            return None
        return cls(seq=int(match.group(1), 16), index=int(match.group(2), 16))


def list_segments(directory: Path) -> list[SegmentName]:
    """The segment files in ``directory`` sorted by seq (other files ignored)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    segments = [s for s in map(SegmentName.parse, names) if s is not None]
    return sorted(segments)


def existing_segments(directory: Path) -> list[SegmentName]:
    """The segments of ``directory``; a StorageError if there are none."""
    segments = list_segments(directory)
    if not segments:
        raise StorageError(
            f"{directory} holds no WAL (no *.wal segment files); create one with Wal.create"
        )
    return segments


def fsync_dir(directory: Path) -> None:
    """Make creations, renames and removals in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_image(path: Path) -> bytes:
    """The whole file in one bytes object (one read per GiB)."""
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        if size <= _READ_CHUNK_BYTES:
            return f.read(size) if size else b""
        return f.readall()


def preallocate(fd: int, size_bytes: int) -> None:
    """Reserve ``size_bytes`` (reads of the unwritten part return zeros)."""
    try:
        os.posix_fallocate(fd, 0, size_bytes)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        # A file system without fallocate: extend with a hole (still zeros).
        if os.fstat(fd).st_size < size_bytes:
            os.ftruncate(fd, size_bytes)


def write_all(fd: int, data: bytes, offset: int) -> None:
    """pwrite ``data`` at ``offset``, continuing after short writes."""
    written = os.pwrite(fd, data, offset)
    if written == len(data):
        return
    view = memoryview(data)[written:]  # a short write (rare for regular files)
    while view:
        offset += written
        written = os.pwrite(fd, view, offset)
        view = view[written:]


def write_all_vectored(fd: int, buffers: list[bytes], offset: int) -> int:
    """pwritev ``buffers`` at ``offset``, IOV_MAX at a time, finishing short writes.

    Returns the bytes written (all of them).
    """
    total = 0
    for start in range(0, len(buffers), IOV_MAX):
        chunk = buffers[start : start + IOV_MAX]
        size = sum(map(len, chunk))
        written = os.pwritev(fd, chunk, offset)
        if written < size:  # rare for regular files: finish with plain writes
            write_all(fd, b"".join(chunk)[written:], offset + written)
        offset += size
        total += size
    return total


def create_file_atomically(path: Path, data: bytes, preallocate_bytes: int) -> int:
    """Write ``data`` (preallocated) to ``path.tmp``, fdatasync, rename, fsync the dir.

    Returns the open read-write fd of the final file, positioned nowhere in
    particular (writers use pwrite).
    """
    temp = path.with_name(path.name + TEMP_SUFFIX)
    with contextlib.suppress(FileNotFoundError):
        temp.unlink()
    fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, _FILE_MODE)
    try:
        preallocate(fd, max(preallocate_bytes, len(data)))
        write_all(fd, data, 0)
        os.fdatasync(fd)
        os.rename(temp, path)
        fsync_dir(path.parent)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            temp.unlink()
        raise
    return fd


def remove_temp_files(directory: Path) -> list[Path]:
    """Remove ``*.tmp`` left by a crash while a file was being created."""
    removed = [p for p in directory.glob(f"*{TEMP_SUFFIX}") if p.is_file()]
    for p in removed:
        p.unlink()
    if removed:
        fsync_dir(directory)
    return removed


class DirLock:
    """An exclusive ``flock`` on ``<dir>/wal.lock``; one appender per directory.

    The holder writes its pid into the file so the error names who holds it.
    The lock dies with the process (the kernel drops it), so a crash never
    leaves a stale lock behind.
    """

    def __init__(self, fd: int, path: Path) -> None:
        self._fd: int | None = fd
        self.path = path

    @classmethod
    def acquire(cls, directory: Path) -> DirLock:
        path = directory / LOCK_FILE_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, _FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise LockedError(
                f"WAL directory {directory} is locked by another process{holder} "
                f"(lock file {path}); only one process may open a WAL for append. "
                "Stop the other process, or use read-only access "
                "(Wal.open_read_only, `quorumlog wal inspect`)."
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(fd, path)

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the only descriptor drops the flock


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return ""
    return f" (pid {text})" if text.isdigit() else ""


def ensure_directory(directory: Path) -> None:
    """Create ``directory`` (and parents) durably if it does not exist."""
    if directory.is_dir():
        return
    missing = []
    current = directory
    while not current.exists():
        missing.append(current)
        current = current.parent
    directory.mkdir(parents=True, exist_ok=True)
    for created in reversed(missing):
        fsync_dir(created.parent)


def storage_error(action: str, path: Path, exc: OSError) -> StorageError:
    return StorageError(f"{action} {path} failed: {exc.strerror or exc}")
