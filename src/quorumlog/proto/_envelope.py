"""The entry envelope and its digests (BookKeeper's ``DigestManager``).

What a ledger client sends to bookies and reads back.

Each entry travels and is stored as one envelope (BookKeeper's digest-wrapped
entry)::

    header  >QQqIB   ledger_id u64, entry_id u64, lac i64 (piggybacked LAC,
                     -1 for none), payload length u32, digest type u8
    digest           4 bytes (CRC32C) or 32 bytes (HMAC-SHA256)
    payload          the application's bytes

The digest covers the header and the payload. CRC32C protects against
corruption; HMAC-SHA256, keyed by a key derived from the ledger password, also
against a writer that does not know the password. A bookie checks the
envelope's structure (and the CRC32C, which needs no key) before storing it;
readers verify the digest of every entry they read.
"""

from __future__ import annotations

import array
import enum
import hashlib
import hmac
import struct
from collections.abc import Sequence
from typing import NamedTuple

import crc32c
import quorumlog_native

from quorumlog.errors import invariant
from quorumlog.proto._errors import BadEnvelopeError, DigestMismatchError


class DigestType(enum.StrEnum):
    """How an entry's envelope is protected; chosen per ledger at creation."""

    CRC32C = "crc32c"
    HMAC_SHA256 = "hmac-sha256"

ENVELOPE_HEADER = struct.Struct(">QQqIB")
_DIGEST_CODES = {DigestType.CRC32C: 1, DigestType.HMAC_SHA256: 2}
_DIGEST_BY_CODE = {code: kind for kind, code in _DIGEST_CODES.items()}
DIGEST_SIZES = {DigestType.CRC32C: 4, DigestType.HMAC_SHA256: 32}
_CRC = struct.Struct(">I")


class Envelope(NamedTuple):
    ledger_id: int
    entry_id: int
    lac: int
    digest: DigestType
    payload: memoryview


def mac_key(password: bytes) -> bytes:
    """The HMAC key of a ledger, derived from its password."""
    return hashlib.sha256(b"quorumlog-mac\x00" + password).digest()


def _digest(kind: DigestType, key: bytes, header: bytes, payload: bytes | memoryview) -> bytes:
    if kind is DigestType.CRC32C:
        return _CRC.pack(crc32c.crc32c(payload, crc32c.crc32c(header)))
    mac = hmac.new(key, header, hashlib.sha256)
    mac.update(payload)
    return mac.digest()


def encode_entry(
    ledger_id: int,
    entry_id: int,
    lac: int,
    payload: bytes | memoryview,
    *,
    digest: DigestType,
    key: bytes = b"",
) -> bytes:
    """The envelope of one entry (``key`` is ``mac_key(password)`` for HMAC)."""
    header = ENVELOPE_HEADER.pack(ledger_id, entry_id, lac, len(payload), _DIGEST_CODES[digest])
    return b"".join((header, _digest(digest, key, header, payload), payload))


def parse_envelope(data: bytes | memoryview) -> Envelope:
    """Structure of an envelope, without checking a keyed digest.

    Raises BadEnvelopeError for a short envelope, an unknown digest type or a
    length that disagrees with the data; DigestMismatchError for a CRC32C
    envelope whose CRC is wrong.
    """
    view = memoryview(data)
    if len(view) < ENVELOPE_HEADER.size:
        raise BadEnvelopeError(
            f"entry envelope has {len(view)} bytes, shorter than its "
            f"{ENVELOPE_HEADER.size}-byte header")
    ledger_id, entry_id, lac, length, code = ENVELOPE_HEADER.unpack_from(view)
    kind = _DIGEST_BY_CODE.get(code)
    if kind is None:
        raise BadEnvelopeError(f"entry envelope has unknown digest type {code}")
    start = ENVELOPE_HEADER.size + DIGEST_SIZES[kind]
    if len(view) != start + length:
        raise BadEnvelopeError(
            f"entry envelope of {ledger_id}:{entry_id} says {length} payload bytes, "
            f"has {len(view) - start}")
    if lac < -1:
        raise BadEnvelopeError(f"entry envelope of {ledger_id}:{entry_id} has LAC {lac} < -1")
    payload = view[start:]
    if kind is DigestType.CRC32C:
        expected = _digest(kind, b"", bytes(view[: ENVELOPE_HEADER.size]), payload)
        if expected != view[ENVELOPE_HEADER.size:start]:
            raise DigestMismatchError(f"entry {ledger_id}:{entry_id}: CRC32C digest mismatch")
    return Envelope(ledger_id, entry_id, lac, kind, payload)


# quorumlog_native's C loops hard-code this layout: header 29 bytes, CRC32C
# digest (code 1) after it, payload from byte 33.
invariant((ENVELOPE_HEADER.size, _DIGEST_CODES[DigestType.CRC32C],
           DIGEST_SIZES[DigestType.CRC32C]) == (29, 1, 4),
          "the envelope layout drifted from quorumlog_native's")


def crc32c_batch_bounds(buffer: bytes | memoryview, sizes: Sequence[int], ledger_id: int,
                        first_entry_id: int
                        ) -> tuple[array.array[int], array.array[int], int]:
    """Payload bounds of CRC32C envelopes back to back in ``buffer`` (``sizes[i]``
    bytes each) for entries ``first_entry_id, first_entry_id + 1, ...`` of
    ``ledger_id``: payload ``i`` is ``buffer[starts[i]:ends[i]]``; and the
    payload bytes of them all (summed in the same pass).

    Every check of :func:`decode_entry` is done in one C loop over the buffer
    (``quorumlog_native.envelope_bounds``), and nothing per entry is built (a
    batch read's hot path). The bounds cover the longest valid prefix: they
    stop at the first envelope that fails any check, so the caller can decode
    that one with :func:`decode_entry` for the precise error.
    """
    starts: array.array[int] = array.array("q", bytes(8 * len(sizes)))
    ends: array.array[int] = array.array("q", bytes(8 * len(sizes)))
    count, payload_bytes = quorumlog_native.envelope_bounds(buffer, sizes, ledger_id,
                                                            first_entry_id, starts, ends)
    if count < len(sizes):
        del starts[count:], ends[count:]
    return starts, ends, payload_bytes


def decode_entry(
    data: bytes | memoryview,
    *,
    ledger_id: int,
    entry_id: int,
    digest: DigestType,
    key: bytes = b"",
    source: str = "",
) -> Envelope:
    """Parse and verify an envelope read back for (ledger_id, entry_id).

    Raises DigestMismatchError naming ``source`` (the bookie) when the digest,
    the digest type or the ids do not match.
    """
    where = f" from bookie {source}" if source else ""
    try:
        envelope = parse_envelope(data)
    except (BadEnvelopeError, DigestMismatchError) as exc:
        raise DigestMismatchError(f"entry {ledger_id}:{entry_id}{where}: {exc}") from None
    if (envelope.ledger_id, envelope.entry_id) != (ledger_id, entry_id):
        raise DigestMismatchError(
            f"entry {ledger_id}:{entry_id}{where}: envelope is for "
            f"{envelope.ledger_id}:{envelope.entry_id}")
    if envelope.digest is not digest:
        raise DigestMismatchError(
            f"entry {ledger_id}:{entry_id}{where}: digest type {envelope.digest}, "
            f"the ledger uses {digest}")
    if digest is DigestType.HMAC_SHA256:
        view = memoryview(data)
        header = bytes(view[: ENVELOPE_HEADER.size])
        got = view[ENVELOPE_HEADER.size: ENVELOPE_HEADER.size + DIGEST_SIZES[digest]]
        if not hmac.compare_digest(_digest(digest, key, header, envelope.payload), got):
            raise DigestMismatchError(
                f"entry {ledger_id}:{entry_id}{where}: HMAC-SHA256 digest mismatch "
                f"(corrupt entry or wrong password)")
    return envelope


def crc32c_add_lacs(entries: Sequence[tuple[int, bytes]], ledger_id: int) -> list[int | None]:
    """The piggybacked LAC of each ``(entry id, envelope)`` of a batch of adds to
    ``ledger_id``, in one pass (a bookie's batch add hot loop): each envelope
    checked as :func:`parse_envelope` does (structure, CRC32C) and for holding
    the entry it is sent as. None where any check fails or the digest is not
    CRC32C: the caller parses that one with :func:`parse_envelope`, for the
    precise error or the envelope of another digest type."""
    return quorumlog_native.add_lacs(entries, ledger_id)
