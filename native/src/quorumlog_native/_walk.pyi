import array
from collections.abc import Sequence
from typing import Any

# Any object with the buffer protocol (bytes, memoryview, array.array,
# pyarrow.Buffer): Python 3.11 has no type for it (collections.abc.Buffer is 3.12).
_Buffer = Any
_Int64s = array.array[int] | bytearray | memoryview

def envelope_bounds(buffer: _Buffer, sizes: Sequence[int], ledger_id: int, first_entry_id: int,
                    starts: _Int64s, ends: _Int64s) -> tuple[int, int]: ...
def add_lacs(entries: Sequence[tuple[int, _Buffer]], ledger_id: int) -> list[int | None]: ...
def frames_following(buf: _Buffer, pos: int, ledger_id: int, entry_id: int, count_max: int,
                     room: int, entry_max: int) -> list[bytes]: ...
def stream_columns(buffer: _Buffer, starts: _Buffer, ends: _Buffer, prefix_word: int,
                   count_max: int
                   ) -> tuple[int, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes,
                              bytes, bytes, bool] | None: ...
def crc32c(data: _Buffer, value: int = 0) -> int: ...
def hardware() -> bool: ...
