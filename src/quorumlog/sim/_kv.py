"""The replicated key-value state machine the simulator runs on Raft.

Commands (put / get / CAS) are msgpack-encoded into log entries. Each carries
the client id and a per-client sequence number: the state machine keeps, per
client, the last sequence applied and its result (a *session*), so a write
retried through another leader is applied once and its retries get the first
result back. A command older than the session's last sequence is stale (its
client gave up and moved on) and has no effect.

``digest`` chains a hash over every applied log entry (index, term, payload),
so two replicas at the same applied index have the same digest iff they
applied the same entries; snapshots carry it, which lets the simulator check
that an installed snapshot is the state the log would have produced.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from enum import StrEnum

import msgspec

from quorumlog.errors import ProtocolError, invariant

KvValue = str | None
KvResult = str | bool | None

DIGEST_BYTES = 16
SESSIONS_MAX = 10_000
"""Client sessions kept; a simulated run has a handful of clients."""


class KvOp(StrEnum):
    PUT = "put"
    GET = "get"
    CAS = "cas"


class KvCommand(msgspec.Struct, frozen=True, array_like=True):
    """One client command as stored in a Raft log entry."""

    client_id: int
    seq: int
    op: KvOp
    key: str
    value: KvValue = None
    expected: KvValue = None


class _Snapshot(msgspec.Struct, frozen=True, array_like=True):
    applied_index: int
    digest: bytes
    data: list[tuple[str, str]]
    sessions: list[tuple[int, int, KvResult]]


_encoder = msgspec.msgpack.Encoder()
_command_decoder = msgspec.msgpack.Decoder(KvCommand)
_snapshot_decoder = msgspec.msgpack.Decoder(_Snapshot)


def encode_command(command: KvCommand) -> bytes:
    return _encoder.encode(command)


def decode_command(data: bytes) -> KvCommand:
    try:
        return _command_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"log entry is not a key-value command: {exc}") from None


@dataclass(frozen=True, slots=True)
class Applied:
    """What applying one command did: its result, or that it was a stale retry."""

    result: KvResult
    duplicate: bool
    stale: bool


@dataclass(slots=True)
class KvStateMachine:
    data: dict[str, str] = field(default_factory=dict)
    sessions: dict[int, tuple[int, KvResult]] = field(default_factory=dict)
    applied_index: int = 0
    digest: bytes = bytes(DIGEST_BYTES)

    def note_entry(self, index: int, term: int, payload: bytes) -> None:
        """Advance the applied index and digest over any entry (command or not)."""
        invariant(
            index == self.applied_index + 1,
            f"state machine applies index {index} after {self.applied_index}: "
            "entries must be applied in order without gaps",
        )
        self.applied_index = index
        hasher = hashlib.blake2b(self.digest, digest_size=DIGEST_BYTES)
        hasher.update(index.to_bytes(8, "big"))
        hasher.update(term.to_bytes(8, "big"))
        hasher.update(payload)
        self.digest = hasher.digest()

    def apply(self, command: KvCommand) -> Applied:
        session = self.sessions.get(command.client_id)
        if session is not None and command.seq <= session[0]:
            if command.seq == session[0]:
                return Applied(session[1], duplicate=True, stale=False)
            return Applied(None, duplicate=False, stale=True)
        result = self._execute(command)
        invariant(
            command.client_id in self.sessions or len(self.sessions) < SESSIONS_MAX,
            f"more than {SESSIONS_MAX} client sessions",
        )
        self.sessions[command.client_id] = (command.seq, result)
        return Applied(result, duplicate=False, stale=False)

    def _execute(self, command: KvCommand) -> KvResult:
        if command.op is KvOp.PUT:
            invariant(command.value is not None, "put needs a value")
            self.data[command.key] = command.value  # type: ignore[assignment]
            return None
        current = self.data.get(command.key)
        if command.op is KvOp.GET:
            return current
        if current != command.expected:
            return False
        if command.value is None:
            self.data.pop(command.key, None)
        else:
            self.data[command.key] = command.value
        return True

    def get(self, key: str) -> KvValue:
        return self.data.get(key)

    def snapshot(self) -> bytes:
        return _encoder.encode(
            _Snapshot(
                applied_index=self.applied_index,
                digest=self.digest,
                data=sorted(self.data.items()),
                sessions=[(c, s, r) for c, (s, r) in sorted(self.sessions.items())],
            )
        )

    @classmethod
    def restore(cls, blob: bytes) -> KvStateMachine:
        try:
            snap = _snapshot_decoder.decode(blob)
        except msgspec.DecodeError as exc:
            raise ProtocolError(f"snapshot is not a key-value snapshot: {exc}") from None
        return cls(
            data=dict(snap.data),
            sessions={c: (s, r) for c, s, r in snap.sessions},
            applied_index=snap.applied_index,
            digest=snap.digest,
        )

    @classmethod
    def at_snapshot(cls, blob: bytes, index: int) -> KvStateMachine:
        """Restore from a Raft snapshot taken at ``index``.

        An empty blob is the bootstrap snapshot (or none at all): the initial,
        empty state, as of ``index``, with the initial digest.
        """
        if not blob:
            return cls(applied_index=index)
        machine = cls.restore(blob)
        invariant(
            machine.applied_index == index,
            f"snapshot at index {index} holds state applied to {machine.applied_index}",
        )
        return machine
