"""The receiving side of snapshot transfers refuses bad input with a clear
error and keeps serving: corrupt chunks, early or wrong commits, bad offers.
A real rpc server on 127.0.0.1 serves a real SnapshotReceiver; ``deliver``
records what would be stepped into the core."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from crc32c import crc32c

from quorumlog import rpc
from quorumlog.errors import ProtocolError, QuorumlogError
from quorumlog.raft import ConfState, Message, MessageType, Snapshot, SnapshotMeta
from quorumlog.raft import encode_message as encode
from quorumlog.raft._snapshot_transfer import (
    STATE_PART,
    SnapshotChunkRequest,
    SnapshotCommitRequest,
    SnapshotOfferRequest,
    SnapshotPartInfo,
    SnapshotReceiver,
    SnapshotTransferConfig,
    SnapshotTransferError,
)
from rpc.support import run

GROUP = 7
OTHER_GROUP = 8
LEADER = 1
DATA = bytes(range(256)) * 1000  # 256,000 bytes
CHUNK = 100_000
META = SnapshotMeta(index=50, term=3, conf_state=ConfState(voters=frozenset({1, 2, 3})), epoch=4)


class Harness:
    def __init__(self, receiver: SnapshotReceiver, connection: rpc.Connection) -> None:
        self.receiver, self.connection = receiver, connection

    async def offer(self, transfer_id: int = 1, *, from_node: int = LEADER,
                    parts: list[SnapshotPartInfo] | None = None, group_id: int = GROUP) -> None:
        await self.connection.call(SnapshotOfferRequest(
            from_node=from_node, group_id=group_id, transfer_id=transfer_id, term=META.term,
            index=META.index, parts=parts or [SnapshotPartInfo(STATE_PART, len(DATA))]))

    async def chunk(self, offset: int, data: bytes, *, transfer_id: int = 1,
                    crc: int | None = None, part: int = 0) -> None:
        await self.connection.call(SnapshotChunkRequest(
            from_node=LEADER, group_id=GROUP, transfer_id=transfer_id, part=part, offset=offset,
            crc32c=crc32c(data) if crc is None else crc), payload=data)

    async def all_chunks(self, transfer_id: int = 1) -> None:
        for offset in range(0, len(DATA), CHUNK):
            await self.chunk(offset, DATA[offset : offset + CHUNK], transfer_id=transfer_id)

    async def commit(self, *, transfer_id: int = 1, crc: int | None = None,
                     message: Message | None = None, more_crcs: list[int] | None = None,
                     ) -> None:
        snap = Message(type=MessageType.SNAP, to=2, from_=LEADER, term=3,
                       snapshot=Snapshot(meta=META))
        await self.connection.call(SnapshotCommitRequest(
            from_node=LEADER, group_id=GROUP, transfer_id=transfer_id,
            part_crc32c=[crc32c(DATA) if crc is None else crc, *(more_crcs or [])],
            message=encode(message or snap)))

    def staged(self) -> list[Path]:
        return sorted(self.receiver.directory.rglob("*"))


def with_receiver(
    tmp_path: Path, body: Callable[[Harness, list[tuple[int, Message]]], Awaitable[None]],
    *, on_files: Callable[[Path], None] | None = None, **config: Any,
) -> None:
    delivered: list[tuple[int, Message]] = []

    def deliver(group_id: int, message: Message, files: Path | None) -> None:
        if on_files is not None and files is not None:
            on_files(files)
        delivered.append((group_id, message))

    async def main() -> None:
        executor = ThreadPoolExecutor(max_workers=1)
        receiver = SnapshotReceiver(
            tmp_path / "incoming", SnapshotTransferConfig(**config), executor,
            hosts_group=lambda group_id: group_id in (GROUP, OTHER_GROUP),
            deliver=deliver)
        server = rpc.Server(receiver.handlers())
        await server.start("127.0.0.1", 0)
        connection = await rpc.connect("127.0.0.1", server.port)
        try:
            await body(Harness(receiver, connection), delivered)
        finally:
            await connection.close()
            await server.close()
            receiver.close()
            executor.shutdown()

    run(main())


def test_a_complete_transfer_delivers_the_snapshot_and_cleans_up(tmp_path: Path) -> None:
    async def body(h: Harness, delivered: list[tuple[int, Message]]) -> None:
        await h.offer()
        # Chunks may arrive in any order; each lands at its offset.
        offsets = list(range(0, len(DATA), CHUNK))
        await asyncio.gather(*(h.chunk(o, DATA[o : o + CHUNK]) for o in reversed(offsets)))
        await h.commit()
        [(group_id, message)] = delivered
        assert group_id == GROUP and message.type is MessageType.SNAP
        assert message.snapshot == Snapshot(meta=META, data=DATA)
        assert h.staged() == [] and h.receiver.receiving == 0
        assert h.receiver.stats.transfers_completed == 1

    with_receiver(tmp_path, body)


def test_a_corrupt_chunk_is_refused_and_the_transfer_goes_on(tmp_path: Path) -> None:
    async def body(h: Harness, delivered: list[tuple[int, Message]]) -> None:
        await h.offer()
        first = DATA[:CHUNK]
        with pytest.raises(ProtocolError, match="CRC mismatch"):
            await h.chunk(0, first, crc=crc32c(first) ^ 1)
        with pytest.raises(ProtocolError, match="does not fit"):
            await h.chunk(len(DATA) - 10, DATA[:CHUNK])
        await h.all_chunks()
        with pytest.raises(ProtocolError, match="came twice"):
            await h.chunk(0, first)
        await h.commit()
        assert delivered[0][1].snapshot == Snapshot(meta=META, data=DATA)

    with_receiver(tmp_path, body)


def test_early_or_wrong_commits_deliver_nothing(tmp_path: Path) -> None:
    async def body(h: Harness, delivered: list[tuple[int, Message]]) -> None:
        await h.offer()
        await h.chunk(0, DATA[:CHUNK])
        with pytest.raises(ProtocolError, match="before parts"):
            await h.commit()
        for offset in range(CHUNK, len(DATA), CHUNK):
            await h.chunk(offset, DATA[offset : offset + CHUNK])
        wrong = Message(type=MessageType.SNAP, to=2, from_=LEADER, term=3, snapshot=Snapshot(
            meta=SnapshotMeta(index=49, term=3, conf_state=META.conf_state, epoch=4)))
        with pytest.raises(ProtocolError, match="offered SNAP"):
            await h.commit(message=wrong)
        # Read back, the part's CRC must be the sender's: nothing is stepped.
        with pytest.raises(SnapshotTransferError, match="CRC"):
            await h.commit(crc=crc32c(DATA) ^ 1)
        assert delivered == [] and h.staged() == [] and h.receiver.receiving == 0
        with pytest.raises(SnapshotTransferError, match="no snapshot transfer"):
            await h.commit()

    with_receiver(tmp_path, body)


def test_bad_offers_are_refused(tmp_path: Path) -> None:
    async def body(h: Harness, delivered: list[tuple[int, Message]]) -> None:
        cases: list[tuple[dict[str, Any], type[QuorumlogError], str]] = [
            ({"parts": [SnapshotPartInfo(STATE_PART, 1), SnapshotPartInfo("../etc", 1)]},
             ProtocolError, "plain file names"),
            ({"parts": [SnapshotPartInfo("other", 1)]}, ProtocolError, "must start with"),
            ({"parts": [SnapshotPartInfo(STATE_PART, 1), SnapshotPartInfo(STATE_PART, 1)]},
             ProtocolError, "must start with"),
            ({"parts": [SnapshotPartInfo(STATE_PART, 2000)]}, ProtocolError,
             "snapshot_bytes_max"),
            ({"group_id": OTHER_GROUP + 1}, SnapshotTransferError, "not hosted"),
        ]
        for kwargs, error, match in cases:
            with pytest.raises(error, match=match):
                await h.offer(**kwargs)
        assert h.receiver.receiving == 0 and h.staged() == []

    with_receiver(tmp_path, body, snapshot_bytes_max=1000)


def test_a_new_offer_supersedes_the_unfinished_one_and_receives_are_bounded(
    tmp_path: Path,
) -> None:
    async def body(h: Harness, delivered: list[tuple[int, Message]]) -> None:
        await h.offer(transfer_id=1, from_node=LEADER + 5)  # a leader that lost its lead
        await h.offer(transfer_id=2)  # one transfer per group: the new one wins
        await h.chunk(0, DATA[:CHUNK], transfer_id=2)
        await h.offer(transfer_id=3)  # the leader started again
        with pytest.raises(SnapshotTransferError, match="superseded"):
            await h.chunk(CHUNK, DATA[CHUNK : 2 * CHUNK], transfer_id=2)
        assert len([p for p in h.staged() if p.is_dir()]) == 1
        error = None
        try:
            await h.offer(transfer_id=4, group_id=OTHER_GROUP)
        except SnapshotTransferError as exc:
            error = exc
        assert error is not None and error.retriable and "receives_max" in error.message
        await h.all_chunks(transfer_id=3)
        await h.commit(transfer_id=3)
        assert len(delivered) == 1 and h.staged() == []

    with_receiver(tmp_path, body, receives_max=1)


FILES = {"000009.sst": bytes(range(256)) * 900, "CURRENT": b"MANIFEST-000005\n"}


def test_file_parts_are_staged_verified_and_handed_over_as_a_directory(
        tmp_path: Path) -> None:
    received: dict[str, bytes] = {}

    def on_files(directory: Path) -> None:
        received.update({p.name: p.read_bytes() for p in directory.iterdir()})

    async def body(h: Harness, delivered: list[tuple[int, Message]]) -> None:
        parts = [SnapshotPartInfo(STATE_PART, len(DATA)),
                 *(SnapshotPartInfo(name, len(data)) for name, data in FILES.items())]
        await h.offer(parts=parts)
        await h.all_chunks()
        for number, data in enumerate(FILES.values(), start=1):
            for offset in range(0, len(data), CHUNK):
                await h.chunk(offset, data[offset : offset + CHUNK], part=number)
        crcs = [crc32c(data) for data in FILES.values()]
        # A file whose CRC read back is not the sender's: nothing is handed over.
        with pytest.raises(SnapshotTransferError, match="CURRENT"):
            await h.commit(more_crcs=[crcs[0], crcs[1] ^ 1])
        assert delivered == [] and received == {} and h.staged() == []
        await h.offer(transfer_id=2, parts=parts)
        await h.all_chunks(transfer_id=2)
        for number, data in enumerate(FILES.values(), start=1):
            await h.chunk(0, data, part=number, transfer_id=2)
        await h.commit(transfer_id=2, more_crcs=crcs)
        assert len(delivered) == 1 and received == FILES
        assert h.staged() == [] and h.receiver.receiving == 0

    with_receiver(tmp_path, body, on_files=on_files)
