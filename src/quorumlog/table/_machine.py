"""The Raft state machine of one partition replica: a TableStore.

Snapshots are RocksDB checkpoints (hard links) packed into the bytes of a Raft
snapshot, so they travel through the chunked snapshot transfer; the current
limitation is that the whole checkpoint is held in memory and in the snapshot
file (docs/table.md).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import msgspec

from quorumlog.errors import invariant
from quorumlog.table._commands import WriteResult, decode_entry
from quorumlog.table._store import TableStore
from quorumlog.table._timetag import TimetagClock


class _Checkpoint(msgspec.Struct, frozen=True):
    decree: int
    files: list[tuple[str, bytes]]


_ENCODE = msgspec.msgpack.Encoder()
_DECODE_CHECKPOINT = msgspec.msgpack.Decoder(_Checkpoint)


class PartitionMachine:
    """The Raft state machine of one partition replica (``raft.StateMachine``)."""

    def __init__(self, store: TableStore, clock: TimetagClock, staging: Path) -> None:
        self.store = store
        self.clock = clock
        self._staging = staging

    def apply(self, index: int, data: bytes) -> list[WriteResult]:
        entry = decode_entry(data)
        self.clock.observe(entry.timestamp_us)
        return self.store.apply(index, entry)

    def snapshot(self) -> bytes:
        """A RocksDB checkpoint of the store, packed (file name, contents)."""
        self._staging.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self._staging) as temp:
            target = Path(temp) / "checkpoint"
            decree = self.store.checkpoint(target)
            files = [(path.name, path.read_bytes()) for path in sorted(target.iterdir())]
        return _ENCODE.encode(_Checkpoint(decree=decree, files=files))

    def restore(self, data: bytes) -> None:
        """Install a checkpoint, unless the store already holds everything in it
        (a restart: the store is at or past the snapshot's decree)."""
        if not data:
            # The bootstrap snapshot of a group created with its voters (nothing
            # applied yet), sent to a replica that joins later: it starts empty.
            return
        checkpoint = _DECODE_CHECKPOINT.decode(data)
        if self.store.applied_decree >= checkpoint.decree:
            return
        self._staging.mkdir(parents=True, exist_ok=True)
        target = Path(tempfile.mkdtemp(dir=self._staging)) / "checkpoint"
        target.mkdir()
        for name, content in checkpoint.files:
            invariant("/" not in name and name not in ("", ".", ".."), f"bad file {name!r}")
            (target / name).write_bytes(content)
        self.store.restore(target)
        shutil.rmtree(target.parent, ignore_errors=True)
        invariant(self.store.applied_decree == checkpoint.decree,
                  "a restored checkpoint holds its decree")
