"""Property tests: damaged segments read back as exactly the longest valid prefix,
or raise the clear CorruptionError; never a record whose CRC fails, never another
exception type. Damage: truncation at every offset, zeroed sectors, flipped bits."""

from __future__ import annotations

import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quorumlog.errors import CorruptionError
from quorumlog.wal import Wal, WalConfig, WalEntry, verify
from quorumlog.wal._format import SECTOR_BYTES, RecordType, SegmentDecoder

CONFIG = WalConfig(segment_size_bytes=1024)
EXAMPLES = 120
PROPERTY_SETTINGS = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@dataclass(frozen=True)
class Frame:
    segment: int
    start: int
    end: int
    rtype: int
    data: bytes


@dataclass(frozen=True)
class Base:
    """A pristine WAL and the ground truth of every frame in it."""

    path: Path
    names: list[str]
    images: list[bytes]
    frames: list[Frame]

    def header_end(self, segment: int) -> int:
        """End of the metadata frame (the second frame) of ``segment``."""
        return [f for f in self.frames if f.segment == segment][1].end

    def expected_before(self, segment: int, offset: int) -> tuple[list[WalEntry], bytes | None]:
        """Entries and state of every frame that ends before (segment, offset)."""
        kept = [f for f in self.frames
                if f.segment < segment or (f.segment == segment and f.end <= offset)]
        entries = [WalEntry(index=int.from_bytes(f.data[:8], "little"), data=f.data[8:])
                   for f in kept if f.rtype == RecordType.ENTRY]
        states = [f.data for f in kept if f.rtype == RecordType.STATE]
        return entries, states[-1] if states else None

    def everything(self) -> tuple[list[WalEntry], bytes | None]:
        return self.expected_before(len(self.names), 0)

    def first_changed_frame(self, segment: int, old: bytes, new: bytes) -> Frame | None:
        for frame in self.frames:
            span = slice(frame.start, frame.end)
            if frame.segment == segment and old[span] != new[span]:
                return frame
        return None

    def copy(self, into: Path) -> Path:
        target = into / "wal"
        shutil.copytree(self.path, target)
        return target


def _build(path: Path) -> Base:
    rng = random.Random(7)
    index = 1
    with Wal.create(path, b"props-metadata", config=CONFIG) as wal:
        for save in range(40):
            count = rng.randint(1, 4)
            entries = [WalEntry(index=i, data=rng.randbytes(rng.randint(0, 200)))
                       for i in range(index, index + count)]
            wal.save(b"state-%d" % save if save % 3 == 0 else None, entries)
            index += count
    names = sorted(p.name for p in path.glob("*.wal"))
    images = [(path / name).read_bytes() for name in names]
    frames = []
    for number, image in enumerate(images):
        decoder = SegmentDecoder(image, CONFIG.record_size_max_bytes)
        for rtype, start, data_start, data_end in decoder.records():
            end = data_end + (-data_end & 7)
            frames.append(Frame(number, start, end, rtype, image[data_start:data_end]))
        assert decoder.problem is None
    assert len(names) >= 4
    return Base(path, names, images, frames)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Base:
    return _build(tmp_path_factory.mktemp("base") / "wal")


def _read(path: Path) -> tuple[list[WalEntry], bytes | None]:
    contents = Wal.open_read_only(path, config=CONFIG).read_all()
    return contents.entries, contents.state


def _assert_clear(error: CorruptionError, base: Base) -> None:
    assert "byte offset" in error.message
    assert any(name in error.message for name in base.names)
    assert "quorumlog wal verify" in error.message


def _assert_append_open_agrees(path: Path, expected: tuple[list[WalEntry], bytes | None]) -> None:
    """Open for append repairs to the same prefix; the result verifies and takes appends."""
    with Wal.open(path, config=CONFIG) as wal:
        contents = wal.read_all()
        assert (contents.entries, contents.state) == expected
        next_index = wal.last_index + 1
        wal.save(b"after-repair", [WalEntry(index=next_index, data=b"appended")])
    assert verify(path, config=CONFIG).last_index == next_index


def test_truncating_the_last_segment_at_every_offset(base: Base, tmp_path: Path) -> None:
    path = base.copy(tmp_path)
    last = len(base.names) - 1
    image = base.images[last]
    data_end = max(f.end for f in base.frames if f.segment == last)
    segment = path / base.names[last]
    for offset in range(data_end + 9):
        segment.write_bytes(image[:offset])
        if offset < base.header_end(last):
            with pytest.raises(CorruptionError) as info:
                _read(path)
            _assert_clear(info.value, base)
            continue
        assert _read(path) == base.expected_before(last, offset), offset
    for offset in range(base.header_end(last), data_end + 1, 37):  # repair, a sample of them
        segment.write_bytes(image[:offset])
        _assert_append_open_agrees(path, base.expected_before(last, offset))


def test_truncating_a_non_last_segment_is_corruption(base: Base, tmp_path: Path) -> None:
    path = base.copy(tmp_path)
    segment = path / base.names[1]
    segment.write_bytes(base.images[1][:-8])
    with pytest.raises(CorruptionError) as info:
        _read(path)
    _assert_clear(info.value, base)


@PROPERTY_SETTINGS
@given(data=st.data())
def test_zeroed_sector_reads_back_as_the_prefix_before_it(base: Base, data: st.DataObject) -> None:
    segment = data.draw(st.integers(0, len(base.names) - 1), label="segment")
    image = base.images[segment]
    sector = data.draw(st.integers(0, (len(image) - 1) // SECTOR_BYTES), label="sector")
    damaged = bytearray(image)
    damaged[sector * SECTOR_BYTES:(sector + 1) * SECTOR_BYTES] = bytes(SECTOR_BYTES)
    _check_damage(base, segment, bytes(damaged), may_corrupt_in_last=False)


@PROPERTY_SETTINGS
@given(data=st.data())
def test_flipped_bits_never_return_a_bad_record(base: Base, data: st.DataObject) -> None:
    segment = data.draw(st.integers(0, len(base.names) - 1), label="segment")
    image = base.images[segment]
    damaged = bytearray(image)
    flips = data.draw(st.integers(1, 3), label="flips")
    for _ in range(flips):
        offset = data.draw(st.integers(0, len(image) - 1), label="offset")
        damaged[offset] ^= 1 << data.draw(st.integers(0, 7), label="bit")
    _check_damage(base, segment, bytes(damaged), may_corrupt_in_last=True)


def _check_damage(base: Base, segment: int, damaged: bytes, *, may_corrupt_in_last: bool) -> None:
    """The reader returns exactly the prefix before the first changed frame, or raises
    CorruptionError where that is allowed: any change to a non-last segment, damage
    to a segment header, (for bit flips) a damaged record of the last segment, and
    a garbage length field right after the data when more garbage follows it."""
    is_last = segment == len(base.names) - 1
    image = base.images[segment]
    changed = base.first_changed_frame(segment, image, damaged)
    in_header = changed is not None and changed.end <= base.header_end(segment)
    data_end = max(f.end for f in base.frames if f.segment == segment)
    next_length_changed = image[data_end:data_end + 8] != damaged[data_end:data_end + 8]
    if changed is None:
        expected = base.everything()  # only the zero tail changed (or nothing)
    else:
        expected = base.expected_before(segment, changed.start)
    must_fail = changed is not None and (not is_last or in_header)
    may_fail = (
        must_fail
        or (changed is not None and may_corrupt_in_last)
        or (changed is None and next_length_changed and may_corrupt_in_last)
    )
    with tempfile.TemporaryDirectory() as scratch:
        path = base.copy(Path(scratch))
        (path / base.names[segment]).write_bytes(damaged)
        try:
            result = _read(path)
        except CorruptionError as exc:
            assert may_fail, exc.message
            _assert_clear(exc, base)
            return
        assert not must_fail, "damage outside the tail of the last segment went unnoticed"
        assert result == expected
        _assert_append_open_agrees(path, expected)
