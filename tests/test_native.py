"""quorumlog_native's C loops against quorumlog's per-entry Python decoders.

Each C function must accept exactly the entries the per-entry decoder accepts
and stop where it stops: on valid batches, and on batches damaged one way at a
random place (a flipped byte, a wrong id, a wrong length, a cut buffer, a LAC
below -1, another digest type).
"""

from __future__ import annotations

import array
import os
import random
import subprocess
import sys

import crc32c
import pytest
import quorumlog_native
from hypothesis import given, settings
from hypothesis import strategies as st

from quorumlog.bookie._format import (
    FrameIncomplete,
    FrameInvalid,
    decode_frame,
    encode_frame_header,
)
from quorumlog.proto import (
    BadEnvelopeError,
    DigestMismatchError,
    DigestType,
    crc32c_add_lacs,
    crc32c_batch_bounds,
    decode_entry,
    encode_entry,
    mac_key,
    parse_envelope,
)

LEDGER = 77
ENTRY_MAX = 1 << 20
DAMAGES = ("none", "flip", "ledger", "entry", "length", "cut", "lac", "digest", "code")


def _reseal(data: bytearray) -> bytes:
    """The envelope with its CRC32C made right again for what it now says, so
    that only the field check can catch the damage."""
    data[29:33] = crc32c.crc32c(bytes(data[33:]), crc32c.crc32c(bytes(data[:29]))).to_bytes(
        4, "big")
    return bytes(data)


def _damage(envelope: bytes, how: str, rng: random.Random) -> bytes:
    data = bytearray(envelope)
    sealed = rng.random() < 0.5
    if how == "code":
        data[28] = rng.choice([0, 2, 3, 255])
    elif how == "flip":
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif how == "ledger":
        data[0:8] = (LEDGER + 1).to_bytes(8, "big")
    elif how == "entry":
        data[8:16] = (int.from_bytes(data[8:16], "big") + 1).to_bytes(8, "big")
    elif how == "length":
        data[24:28] = (int.from_bytes(data[24:28], "big") + 1).to_bytes(4, "big")
    elif how == "cut":
        del data[rng.randrange(len(data)):]
    elif how == "lac":
        data[16:24] = (-2).to_bytes(8, "big", signed=True)
    elif how == "digest":
        return encode_entry(LEDGER, int.from_bytes(data[8:16], "big"), 3, bytes(data[33:]),
                            digest=DigestType.HMAC_SHA256, key=mac_key(b"pw"))
    if how in ("ledger", "entry", "length", "lac", "code") and sealed:
        return _reseal(data)
    return bytes(data)


def _batch(seed: int, count: int, how: str, first: int) -> tuple[list[bytes], int | None]:
    rng = random.Random(seed)
    envelopes = [encode_entry(LEDGER, first + k, first + k - 1, rng.randbytes(rng.randrange(300)),
                              digest=DigestType.CRC32C) for k in range(count)]
    bad = None
    if how != "none" and count:
        bad = rng.randrange(count)
        envelopes[bad] = _damage(envelopes[bad], how, rng)
    return envelopes, bad


def _python_prefix(buffer: bytes, sizes: list[int], first: int) -> int:
    """How many leading envelopes decode_entry accepts (the reference)."""
    position = 0
    for k, size in enumerate(sizes):
        if size <= 0 or position + size > len(buffer):
            return k
        try:
            decode_entry(buffer[position:position + size], ledger_id=LEDGER, entry_id=first + k,
                         digest=DigestType.CRC32C)
        except DigestMismatchError:
            return k
        position += size
    return len(sizes)


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32), count=st.integers(0, 40), how=st.sampled_from(DAMAGES),
       first=st.sampled_from([0, 1, 2**40, 2**63 - 50]), lie=st.booleans())
def test_batch_bounds_stop_where_the_per_entry_decoder_stops(seed: int, count: int, how: str,
                                                             first: int, lie: bool) -> None:
    envelopes, bad = _batch(seed, count, how, first)
    sizes = [len(e) for e in envelopes]
    buffer = b"".join(envelopes)
    if lie and count:  # a size that disagrees with the buffer (a bookie's bug or a cut answer)
        index = random.Random(seed).randrange(count)
        sizes[index] += random.Random(seed).choice([-1, 1, 40])
    starts, ends, payload_bytes = crc32c_batch_bounds(buffer, sizes, LEDGER, first)
    expected = _python_prefix(buffer, sizes, first)
    assert len(starts) == len(ends) == expected
    assert payload_bytes == sum(ends) - sum(starts)
    if bad is not None and not lie:
        assert expected == bad  # every damage is caught (a bit flip by the CRC)
    position = 0
    for k in range(expected):
        payload = decode_entry(buffer[position:position + sizes[k]], ledger_id=LEDGER,
                               entry_id=first + k, digest=DigestType.CRC32C).payload
        assert buffer[starts[k]:ends[k]] == payload
        position += sizes[k]


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32), count=st.integers(0, 30), how=st.sampled_from(DAMAGES))
def test_add_lacs_accept_what_parse_envelope_accepts(seed: int, count: int, how: str) -> None:
    envelopes, _ = _batch(seed, count, how, 5)
    entries = [(5 + k, e) for k, e in enumerate(envelopes)]
    if count and seed % 3 == 0:  # an add sent as another entry id
        entries[-1] = (entries[-1][0] + 7, entries[-1][1])
    expected: list[int | None] = []
    for entry_id, data in entries:
        try:
            parsed = parse_envelope(data)
        except (BadEnvelopeError, DigestMismatchError):
            expected.append(None)
            continue
        ok = (parsed.ledger_id, parsed.entry_id, parsed.digest) == (LEDGER, entry_id,
                                                                   DigestType.CRC32C)
        expected.append(parsed.lac if ok else None)
    assert crc32c_add_lacs(entries, LEDGER) == expected
    assert crc32c_add_lacs([list(pair) for pair in entries], LEDGER) == expected  # type: ignore[misc]


def _frames(seed: int, count: int) -> tuple[bytes, list[bytes]]:
    rng = random.Random(seed)
    datas = [rng.randbytes(rng.randrange(200)) for _ in range(count)]
    buf = b"".join(encode_frame_header(LEDGER, 10 + k, d) + d for k, d in enumerate(datas))
    return buf, datas


def _python_following(buf: bytes, pos: int, entry_id: int, count_max: int, room: int,
                      entry_max: int) -> list[bytes]:
    out: list[bytes] = []
    while len(out) < count_max:
        try:
            frame = decode_frame(buf, pos, entry_max)
        except (FrameIncomplete, FrameInvalid):
            break
        room -= len(frame.data)
        if (frame.ledger_id, frame.entry_id) != (LEDGER, entry_id) or room < 0:
            break
        out.append(frame.data)
        pos, entry_id = pos + frame.frame_bytes, entry_id + 1
    return out


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32), count=st.integers(1, 40), damage=st.booleans(),
       count_max=st.integers(0, 50), fit=st.integers(0, 40), slack=st.sampled_from([-1, 0, 1]),
       entry_max=st.integers(50, 300))
def test_frames_following_stops_where_decode_frame_stops(seed: int, count: int, damage: bool,
                                                        count_max: int, fit: int, slack: int,
                                                        entry_max: int) -> None:
    buf, datas = _frames(seed, count)
    room = max(0, sum(map(len, datas[:fit])) + slack)  # the byte budget, at its edges
    rng = random.Random(seed)
    if damage:
        data = bytearray(buf)
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        buf = bytes(data)
    if rng.random() < 0.3:
        buf = buf[:rng.randrange(len(buf))]
    expected = _python_following(buf, 0, 10, count_max, room, entry_max)
    assert quorumlog_native.frames_following(buf, 0, LEDGER, 10, count_max, room,
                                             entry_max) == expected


def test_frames_following_refuses_a_position_outside_the_buffer() -> None:
    buf, _ = _frames(1, 3)
    with pytest.raises(ValueError, match="outside"):
        quorumlog_native.frames_following(buf, len(buf) + 1, LEDGER, 10, 5, 1000, 1000)
    assert quorumlog_native.frames_following(buf, len(buf), LEDGER, 10, 5, 1000, 1000) == []


def test_bad_arguments_are_clear_errors() -> None:
    starts = array.array("q", bytes(8))
    with pytest.raises(ValueError, match="len\\(sizes\\)"):
        quorumlog_native.envelope_bounds(b"", [1, 2], LEDGER, 0, starts, starts)
    with pytest.raises(ValueError, match="ledger_id"):
        quorumlog_native.envelope_bounds(b"", [], -1, 0, starts, starts)
    with pytest.raises(TypeError, match="pairs"):
        quorumlog_native.add_lacs([(1, b"x", 3)], LEDGER)  # type: ignore[list-item]


@pytest.mark.parametrize("soft", [False, True])
def test_crc32c_matches_the_crc32c_package(soft: bool) -> None:
    """The CPU's instruction and the table fallback (forced by an environment
    variable, checked in a fresh interpreter) both give the package's CRC."""
    script = (
        "import os, crc32c, quorumlog_native as n\n"
        "rng = __import__('random').Random(5)\n"
        "for size in list(range(0, 70)) + [255, 4096, 100003]:\n"
        "    data = rng.randbytes(size)\n"
        "    for start in (0, 1, 3, 7):\n"
        "        view = memoryview(data)[start:]\n"
        "        for value in (0, 1, 0xFFFFFFFF, 0x12345678):\n"
        "            assert n.crc32c(view, value) == crc32c.crc32c(view, value), (size, start)\n"
        "print(n.hardware())\n")
    env = dict(os.environ)
    if soft:
        env["QUORUMLOG_NATIVE_SOFT_CRC"] = "1"
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    if soft:
        assert done.stdout.strip() == "False"
    assert crc32c.crc32c(b"123456789") == quorumlog_native.crc32c(b"123456789") == 0xE3069283
