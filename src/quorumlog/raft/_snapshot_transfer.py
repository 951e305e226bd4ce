"""Snapshot transfer between Raft hosts: chunked, flow-controlled, verified.

A snapshot can be far larger than one rpc frame (16 MiB by default), so the
driver never sends a core's SNAP message whole. It streams the snapshot to the
follower's driver outside the normal message path, as etcd does (Raft paper
§7 sends InstallSnapshot in chunks for the same reason)::

    leader's driver                              follower's driver
    SnapshotOffer(parts: name, size)       ->    a staging file per part
    SnapshotChunk(part, offset, crc) + data ->   check the chunk's CRC, pwrite it
        ... at most chunks_in_flight_max chunks unanswered (flow control) ...
    SnapshotCommit(SNAP message without    ->    every part complete? read each
                   data, CRC of each part)       back, check its CRC; then step
                                                 the complete SNAP message into
                                                 the core, and answer
    report_snapshot(follower, ok) to the leader's core

A snapshot is a list of named **parts**. The first is ``state``: the bytes
of ``Snapshot.data`` (a state machine's ``snapshot()``, or the small manifest
of a file snapshot, ``_file_snapshot``). A file snapshot (a RocksDB
checkpoint) adds one part per file, named as the file; the sender reads each
from the checkpoint directory chunk by chunk, and the receiver writes them into
``<transfer>/files/``, which it hands to ``deliver`` with the message (the host
renames it into the group's checkpoints, no copy).

Memory: the sender sends slices of the snapshot's bytes (no copy) and reads
file parts one chunk at a time; the receiver writes chunks to files as they
come, holds at most ``chunks_in_flight_max`` chunks in flight, reads the
``state`` part back into memory once, after the last chunk (the core needs the
snapshot as bytes), and verifies file parts by streaming them (CRC, then
fsync), never holding a whole file.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import msgspec
from crc32c import crc32c

from quorumlog import rpc
from quorumlog.clock import SYSTEM_CLOCK, Clock
from quorumlog.config import Config, require
from quorumlog.errors import (
    InvariantViolation,
    ProtocolError,
    TransientError,
    UsageError,
)
from quorumlog.raft._types import (
    Message,
    MessageType,
    Snapshot,
    SnapshotMeta,
    decode_message,
    encode_message,
)

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB

STATE_PART = "state"
"""The part holding ``Snapshot.data``; every snapshot has it."""

SNAPSHOT_PARTS_MAX = 1024
"""Parts one snapshot may have (a checkpoint's file count stays far below)."""

PART_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
"""Part names become file names: no separators, no leading dot, bounded length."""

FRAME_OVERHEAD_BYTES = 4 * KIB
"""Room a chunk request's header and body need in a frame beside its payload."""

FILES_DIR_NAME = "files"
"""Where a transfer stages file parts, under its directory: renamed as a whole."""

VERIFY_READ_BYTES = 1 * MIB
"""Read size when a received file part is read back to check its CRC."""


class SnapshotTransferConfig(Config, frozen=True):
    """Limits of snapshot transfers, on the sending and the receiving side."""

    # Snapshot bytes per chunk request: large enough that per-request costs are
    # small, small enough to fit a frame and to keep each write short.
    chunk_bytes: int = 1 * MIB
    # Chunks sent and not yet acknowledged (flow control): the sender's queue and
    # the receiver's write backlog stay below chunks_in_flight_max * chunk_bytes.
    chunks_in_flight_max: int = 4
    # Deadline of each offer, chunk and commit request: a transfer that makes no
    # progress for this long fails (and is reported to the core as failed).
    request_timeout_ms: int = 30_000
    # After a failed transfer to a follower the next one waits this long,
    # doubling per consecutive failure up to backoff_ms_max.
    backoff_ms_min: int = 100
    backoff_ms_max: int = 10_000
    # Largest snapshot (sum of its parts) a host accepts: a disk space guard.
    snapshot_bytes_max: int = 64 * GIB
    # Snapshots a host receives at once (staging files and I/O).
    receives_max: int = 4
    # An incoming transfer without a request for this long is dropped (its
    # sender died); checked whenever an offer arrives.
    receive_idle_timeout_ms: int = 120_000

    def validate(self) -> None:
        require(self.chunk_bytes >= 1, "chunk_bytes must be >= 1")
        require(self.chunks_in_flight_max >= 1, "chunks_in_flight_max must be >= 1")
        require(self.request_timeout_ms >= 1, "request_timeout_ms must be >= 1")
        require(
            1 <= self.backoff_ms_min <= self.backoff_ms_max,
            "need 1 <= backoff_ms_min <= backoff_ms_max",
        )
        require(self.snapshot_bytes_max >= 1, "snapshot_bytes_max must be >= 1")
        require(self.receives_max >= 1, "receives_max must be >= 1")
        require(self.receive_idle_timeout_ms >= 1, "receive_idle_timeout_ms must be >= 1")


# ----- wire messages (type ids 100-105: the raft range of docs/rpc.md) ------------


class SnapshotPartInfo(msgspec.Struct, frozen=True, array_like=True):
    name: str
    size_bytes: int


class SnapshotOfferResponse(rpc.Message, frozen=True):
    type_id: ClassVar[int] = 101


class SnapshotOfferRequest(rpc.Request[SnapshotOfferResponse], frozen=True):
    """Start a transfer; replaces any unfinished one of the same group."""

    type_id: ClassVar[int] = 100
    from_node: int
    group_id: int
    transfer_id: int
    term: int
    index: int
    parts: list[SnapshotPartInfo]


class SnapshotChunkResponse(rpc.Message, frozen=True):
    type_id: ClassVar[int] = 103


class SnapshotChunkRequest(rpc.Request[SnapshotChunkResponse], frozen=True):
    """``payload`` = bytes [offset, offset + len) of part ``part``."""

    type_id: ClassVar[int] = 102
    from_node: int
    group_id: int
    transfer_id: int
    part: int
    offset: int
    crc32c: int


class SnapshotCommitResponse(rpc.Message, frozen=True):
    type_id: ClassVar[int] = 105


class SnapshotCommitRequest(rpc.Request[SnapshotCommitResponse], frozen=True):
    """Every chunk was acknowledged: verify and install. ``message`` is the
    encoded SNAP message with empty snapshot data; ``part_crc32c`` the CRC of
    each whole part, in offer order."""

    type_id: ClassVar[int] = 104
    from_node: int
    group_id: int
    transfer_id: int
    part_crc32c: list[int]
    message: bytes


class SnapshotTransferError(TransientError):
    """A snapshot transfer failed or was refused; the leader retries it later."""


rpc.register_error(100, SnapshotTransferError)


# ----- sending -----------------------------------------------------------------------


ChunkReader = Callable[[int, int], Awaitable["bytes | memoryview"]]
"""``read(offset, size)``: the bytes [offset, offset + size) of a part."""


@dataclass(frozen=True, slots=True)
class FileSource:
    """The files of a file snapshot to send: (name, size) in ``directory``,
    read on ``executor`` (never on the event loop)."""

    directory: Path
    files: list[tuple[str, int]]
    executor: Executor


def _view_reader(view: memoryview) -> ChunkReader:
    async def read(offset: int, size: int) -> memoryview:
        return view[offset : offset + size]
    return read


class _FileReader:
    """Reads one file part chunk by chunk (pread on the executor); its size must
    be the one the manifest promised."""

    def __init__(self, path: Path, size_bytes: int, executor: Executor) -> None:
        self._path, self._executor = path, executor
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        actual = os.fstat(self._fd).st_size
        if actual != size_bytes:
            os.close(self._fd)
            raise SnapshotTransferError(
                f"snapshot file {path} has {actual} bytes, its manifest says {size_bytes}")

    async def read(self, offset: int, size: int) -> bytes:
        data = await asyncio.get_running_loop().run_in_executor(
            self._executor, os.pread, self._fd, size, offset)
        if len(data) != size:
            raise SnapshotTransferError(
                f"snapshot file {self._path} ended at {offset + len(data)} while sending it")
        return data

    def __enter__(self) -> _FileReader:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)


@dataclass(slots=True)
class _Backoff:
    failures: int = 0
    not_before: float = 0.0  # loop time


class SnapshotSender:
    """Streams SNAP messages' snapshots to followers (one call per transfer)."""

    def __init__(
        self,
        node_id: int,
        config: SnapshotTransferConfig,
        pool: rpc.Pool,
        new_transfer_id: Callable[[], int],
    ) -> None:
        limit = pool.config.max_frame_bytes - FRAME_OVERHEAD_BYTES
        if config.chunk_bytes > limit:
            raise UsageError(
                f"snapshot chunk_bytes {config.chunk_bytes} does not fit the rpc frame limit "
                f"({pool.config.max_frame_bytes} bytes); lower it below {limit}"
            )
        self._node_id = node_id
        self._config = config
        self._pool = pool
        self._new_transfer_id = new_transfer_id
        self._backoff: dict[tuple[int, int], _Backoff] = {}

    def delay_s(self, group_id: int, peer: int, now: float) -> float:
        """How long a transfer to ``peer`` must wait after earlier failures."""
        backoff = self._backoff.get((group_id, peer))
        return max(0.0, backoff.not_before - now) if backoff is not None else 0.0

    def finished(self, group_id: int, peer: int, *, ok: bool, now: float) -> None:
        """Record a transfer's outcome: success clears the backoff, failure doubles it."""
        key = (group_id, peer)
        if ok:
            self._backoff.pop(key, None)
            return
        backoff = self._backoff.setdefault(key, _Backoff())
        backoff.failures += 1
        delay_ms = min(
            self._config.backoff_ms_max,
            self._config.backoff_ms_min << min(backoff.failures - 1, 32),
        )
        backoff.not_before = now + delay_ms / 1000

    async def send(
        self, address: str, group_id: int, message: Message,
        files: FileSource | None = None,
    ) -> int:
        """Transfer ``message``'s snapshot (and ``files``, for a file snapshot) to
        ``address`` and have it stepped there; return the bytes sent. Raises
        QuorumlogError (or OSError reading a file) on any failure."""
        snapshot = message.snapshot
        if message.type is not MessageType.SNAP or snapshot is None:
            raise InvariantViolation("SnapshotSender.send needs a SNAP message")
        timeout_s = self._config.request_timeout_ms / 1000
        try:
            async with asyncio.timeout(timeout_s):
                connection = await self._pool.get(address)
        except TimeoutError:
            raise SnapshotTransferError(f"no connection to {address} within {timeout_s}s") from None
        state = memoryview(snapshot.data)
        infos = [SnapshotPartInfo(name=STATE_PART, size_bytes=state.nbytes)]
        if files is not None:
            infos += [SnapshotPartInfo(name=name, size_bytes=size) for name, size in files.files]
        transfer_id = self._new_transfer_id()
        await connection.call(SnapshotOfferRequest(
            from_node=self._node_id, group_id=group_id, transfer_id=transfer_id,
            term=snapshot.meta.term, index=snapshot.meta.index, parts=infos,
        ), timeout_s=timeout_s)
        crcs = [await self._send_part(connection, group_id, transfer_id, 0,
                                      size_bytes=state.nbytes, read=_view_reader(state))]
        if files is not None:
            for number, (name, size) in enumerate(files.files, start=1):
                with _FileReader(files.directory / name, size, files.executor) as reader:
                    crcs.append(await self._send_part(
                        connection, group_id, transfer_id, number,
                        size_bytes=size, read=reader.read))
        header = encode_message(msgspec.structs.replace(
            message, snapshot=Snapshot(meta=snapshot.meta)))
        await connection.call(SnapshotCommitRequest(
            from_node=self._node_id, group_id=group_id, transfer_id=transfer_id,
            part_crc32c=crcs, message=header,
        ), timeout_s=timeout_s)
        return sum(info.size_bytes for info in infos)

    async def _send_part(
        self, connection: rpc.Connection, group_id: int, transfer_id: int, part: int, *,
        size_bytes: int, read: ChunkReader,
    ) -> int:
        """Send one part in chunks, at most chunks_in_flight_max unanswered (so at
        most that many chunks are in memory); return its CRC."""
        config = self._config
        timeout_s = config.request_timeout_ms / 1000
        crc = 0
        in_flight: set[asyncio.Future[Any]] = set()
        try:
            for offset in range(0, size_bytes, config.chunk_bytes):
                chunk = await read(offset, min(config.chunk_bytes, size_bytes - offset))
                crc = crc32c(chunk, crc)
                while len(in_flight) >= config.chunks_in_flight_max:
                    done, in_flight = await asyncio.wait(
                        in_flight, return_when=asyncio.FIRST_COMPLETED)
                    for future in done:
                        future.result()
                request = SnapshotChunkRequest(
                    from_node=self._node_id, group_id=group_id, transfer_id=transfer_id,
                    part=part, offset=offset, crc32c=crc32c(chunk))
                in_flight.add(asyncio.ensure_future(
                    connection.call(request, payload=chunk, timeout_s=timeout_s)))
            while in_flight:
                done, in_flight = await asyncio.wait(
                    in_flight, return_when=asyncio.FIRST_COMPLETED)
                for future in done:
                    future.result()
        finally:
            for future in in_flight:
                future.cancel()
        return crc


# ----- receiving ---------------------------------------------------------------------


@dataclass(slots=True)
class _IncomingPart:
    name: str
    size_bytes: int
    path: Path
    received_bytes: int = 0
    offsets: set[int] = field(default_factory=set)


@dataclass(slots=True)
class _Incoming:
    from_node: int
    group_id: int
    transfer_id: int
    term: int
    index: int
    directory: Path
    parts: list[_IncomingPart]
    last_request_s: float
    committing: bool = False


@dataclass(slots=True)
class ReceiveStats:
    transfers_completed: int = 0
    transfers_refused: int = 0
    bytes_received: int = 0


class SnapshotReceiver:
    """Assembles incoming snapshots in staging files and steps them when complete.

    ``deliver(group_id, message, files)`` steps the complete SNAP message into
    the group's core (it raises QuorumlogError if the group is not hosted or
    the core refuses the message); ``files`` is the directory of a file
    snapshot's verified, fsynced files (None for a bytes snapshot), which
    ``deliver`` moves away or leaves to be removed. ``hosts_group`` says
    whether a group is hosted.
    """

    def __init__(
        self,
        directory: Path,
        config: SnapshotTransferConfig,
        executor: Executor,
        *,
        hosts_group: Callable[[int], bool],
        deliver: Callable[[int, Message, Path | None], None],
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._clock = clock  # idle transfers expire by it
        self.directory = directory
        self._config = config
        self._executor = executor
        self._hosts_group = hosts_group
        self._deliver = deliver
        self._incoming: dict[int, _Incoming] = {}  # by group: one transfer per group
        self.stats = ReceiveStats()
        # Transfers cut short by a crash are worthless: start from an empty directory.
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True, exist_ok=True)

    def handlers(self) -> dict[type[rpc.Request[Any]], Any]:
        return {
            SnapshotOfferRequest: self._on_offer,
            SnapshotChunkRequest: self._on_chunk,
            SnapshotCommitRequest: self._on_commit,
        }

    @property
    def receiving(self) -> int:
        """Transfers in progress."""
        return len(self._incoming)

    def close(self) -> None:
        for incoming in list(self._incoming.values()):
            self._drop(incoming)

    # ----- handlers ------------------------------------------------------------------

    async def _on_offer(
        self, request: SnapshotOfferRequest, ctx: rpc.RequestContext
    ) -> SnapshotOfferResponse:
        self._check_offer(request)
        previous = self._incoming.get(request.group_id)
        if previous is not None:
            # One transfer per group: the newest offer wins (its sender gave up
            # on the old one and starts again, or a new leader took over).
            self._drop(previous)
        self._drop_idle()
        if len(self._incoming) >= self._config.receives_max:
            self.stats.transfers_refused += 1
            raise SnapshotTransferError(
                f"already receiving {len(self._incoming)} snapshots (receives_max); "
                "the leader retries later"
            )
        directory = self.directory / (
            f"g{request.group_id:016x}-n{request.from_node}-t{request.transfer_id:016x}")
        parts = [
            _IncomingPart(name=p.name, size_bytes=p.size_bytes,
                          path=(directory / f"{number:04d}-{p.name}" if number == 0
                                else directory / FILES_DIR_NAME / p.name))
            for number, p in enumerate(request.parts)
        ]
        incoming = _Incoming(
            from_node=request.from_node, group_id=request.group_id,
            transfer_id=request.transfer_id, term=request.term, index=request.index,
            directory=directory, parts=parts, last_request_s=self._clock.monotonic_s(),
        )
        self._incoming[request.group_id] = incoming
        try:
            await asyncio.get_running_loop().run_in_executor(
                self._executor, _create_files, incoming)
        except OSError as exc:
            self._drop(incoming)
            raise SnapshotTransferError(f"cannot stage snapshot in {directory}: {exc}") from None
        return SnapshotOfferResponse()

    def _check_offer(self, request: SnapshotOfferRequest) -> None:
        if not self._hosts_group(request.group_id):
            raise SnapshotTransferError(
                f"raft group {request.group_id} is not hosted here (yet); the leader retries")
        if request.transfer_id < 0 or request.index < 1 or request.term < 1:
            raise ProtocolError("snapshot offer with an impossible id or position")
        names = [part.name for part in request.parts]
        if names[:1] != [STATE_PART] or len(set(names)) != len(names):
            raise ProtocolError(
                f"snapshot parts {names[:8]} must start with {STATE_PART!r} and not repeat")
        if len(names) > SNAPSHOT_PARTS_MAX:
            raise ProtocolError(f"snapshot of {len(names)} parts > {SNAPSHOT_PARTS_MAX}")
        bad = [name for name in names if not PART_NAME_PATTERN.match(name)]
        if bad:
            raise ProtocolError(f"snapshot part names {bad[:4]} are not plain file names")
        sizes = [part.size_bytes for part in request.parts]
        total = sum(sizes)
        if min(sizes) < 0 or total > self._config.snapshot_bytes_max:
            raise ProtocolError(
                f"snapshot of {total} bytes outside [0, snapshot_bytes_max="
                f"{self._config.snapshot_bytes_max}]")

    async def _on_chunk(
        self, request: SnapshotChunkRequest, ctx: rpc.RequestContext
    ) -> SnapshotChunkResponse:
        incoming = self._current(request.from_node, request.group_id, request.transfer_id)
        if not 0 <= request.part < len(incoming.parts) or incoming.committing:
            raise ProtocolError(f"snapshot chunk for part {request.part} out of turn")
        part = incoming.parts[request.part]
        payload = ctx.payload
        size = payload.nbytes
        if (
            size == 0
            or request.offset < 0
            or request.offset + size > part.size_bytes
            or request.offset in part.offsets
        ):
            raise ProtocolError(
                f"snapshot chunk [{request.offset}, +{size}) does not fit part {part.name!r} "
                f"of {part.size_bytes} bytes (or came twice)")
        if crc32c(payload) != request.crc32c:
            raise ProtocolError(
                f"snapshot chunk at {request.offset} of part {part.name!r}: CRC mismatch")
        # Claimed before the write: a duplicate arriving meanwhile is refused.
        part.offsets.add(request.offset)
        incoming.last_request_s = self._clock.monotonic_s()
        try:
            await asyncio.get_running_loop().run_in_executor(
                self._executor, _write_chunk, part.path, request.offset, payload)
        except OSError as exc:
            self._drop(incoming)
            raise SnapshotTransferError(f"cannot write snapshot chunk: {exc}") from None
        part.received_bytes += size
        self.stats.bytes_received += size
        return SnapshotChunkResponse()

    async def _on_commit(
        self, request: SnapshotCommitRequest, ctx: rpc.RequestContext
    ) -> SnapshotCommitResponse:
        incoming = self._current(request.from_node, request.group_id, request.transfer_id)
        message, meta = self._check_commit(incoming, request)
        incoming.committing = True
        loop = asyncio.get_running_loop()
        try:
            data = await loop.run_in_executor(
                self._executor, _read_verified, incoming.parts[0], request.part_crc32c[0])
            files = None
            if len(incoming.parts) > 1:
                files = incoming.directory / FILES_DIR_NAME
                await loop.run_in_executor(
                    self._executor, _verify_files, incoming.parts[1:],
                    request.part_crc32c[1:], files)
            complete = msgspec.structs.replace(message, snapshot=Snapshot(meta=meta, data=data))
            self._deliver(incoming.group_id, complete, files)
        finally:
            self._drop(incoming)
        self.stats.transfers_completed += 1
        return SnapshotCommitResponse()

    def _check_commit(
        self, incoming: _Incoming, request: SnapshotCommitRequest
    ) -> tuple[Message, SnapshotMeta]:
        if incoming.committing:
            raise ProtocolError("snapshot commit sent twice")
        missing = [p.name for p in incoming.parts if p.received_bytes != p.size_bytes]
        if missing:
            raise ProtocolError(f"snapshot commit before parts {missing[:4]} were complete")
        if len(request.part_crc32c) != len(incoming.parts):
            raise ProtocolError("snapshot commit names a CRC per part")
        message = decode_message(request.message)
        snapshot = message.snapshot
        if (
            message.type is not MessageType.SNAP
            or snapshot is None
            or snapshot.data
            or (snapshot.meta.term, snapshot.meta.index) != (incoming.term, incoming.index)
            or message.from_ != incoming.from_node
        ):
            raise ProtocolError("snapshot commit does not carry the offered SNAP message")
        return message, snapshot.meta

    # ----- bookkeeping --------------------------------------------------------------

    def _current(self, from_node: int, group_id: int, transfer_id: int) -> _Incoming:
        incoming = self._incoming.get(group_id)
        expected = (from_node, transfer_id)
        if incoming is None or (incoming.from_node, incoming.transfer_id) != expected:
            raise SnapshotTransferError(
                f"no snapshot transfer {transfer_id} from node {from_node} for group "
                f"{group_id} in progress (superseded or dropped); the leader starts again")
        return incoming

    def _drop_idle(self) -> None:
        limit_s = self._config.receive_idle_timeout_ms / 1000
        now = self._clock.monotonic_s()
        for incoming in list(self._incoming.values()):
            if not incoming.committing and now - incoming.last_request_s > limit_s:
                self._drop(incoming)

    def _drop(self, incoming: _Incoming) -> None:
        if self._incoming.get(incoming.group_id) is incoming:
            del self._incoming[incoming.group_id]
        # Chunk writes of a dropped transfer may still be running: they open
        # the file without O_CREAT, so once it is gone they fail harmlessly.
        shutil.rmtree(incoming.directory, ignore_errors=True)


def _create_files(incoming: _Incoming) -> None:
    incoming.directory.mkdir(parents=True, exist_ok=True)
    if len(incoming.parts) > 1:
        (incoming.directory / FILES_DIR_NAME).mkdir()
    for part in incoming.parts:
        fd = os.open(part.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        os.close(fd)


def _write_chunk(path: Path, offset: int, payload: memoryview) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        view = payload
        while view:
            written = os.pwrite(fd, view, offset)
            view = view[written:]
            offset += written
    finally:
        os.close(fd)


def _read_verified(part: _IncomingPart, expected_crc: int) -> bytes:
    """The part's bytes read back from its staging file, length and CRC checked."""
    try:
        with open(part.path, "rb", buffering=0) as f:
            data = f.readall()
    except OSError as exc:
        raise SnapshotTransferError(f"cannot read snapshot part {part.name!r}: {exc}") from None
    if len(data) != part.size_bytes:
        raise SnapshotTransferError(
            f"snapshot part {part.name!r} reads back {len(data)} bytes, not {part.size_bytes}")
    actual = crc32c(data)
    if actual != expected_crc:
        raise SnapshotTransferError(
            f"snapshot part {part.name!r}: CRC 0x{actual:08x} read back, the sender's is "
            f"0x{expected_crc:08x}")
    return data


def _verify_files(parts: list[_IncomingPart], expected_crcs: list[int], directory: Path) -> None:
    """Read each received file part back in bounded reads, check its length and
    CRC, fsync it; then fsync the directory (the host renames it into place and
    a snapshot record will name it)."""
    for part, expected_crc in zip(parts, expected_crcs, strict=True):
        try:
            with open(part.path, "rb", buffering=0) as f:
                crc, size = 0, 0
                while chunk := f.read(VERIFY_READ_BYTES):
                    crc, size = crc32c(chunk, crc), size + len(chunk)
                os.fsync(f.fileno())
        except OSError as exc:
            raise SnapshotTransferError(
                f"cannot read snapshot file {part.name!r}: {exc}") from None
        if size != part.size_bytes or crc != expected_crc:
            raise SnapshotTransferError(
                f"snapshot file {part.name!r} reads back {size} bytes with CRC 0x{crc:08x}; "
                f"the sender sent {part.size_bytes} bytes with CRC 0x{expected_crc:08x}")
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
