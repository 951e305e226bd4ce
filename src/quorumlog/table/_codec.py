"""How table records are laid out in RocksDB (after Pegasus's key and value schema).

Key: ``hash_key length (u16, big-endian) | hash_key | sort_key``. Every record
of one hash_key is contiguous and ordered by sort_key, so a sort-key range is
one RocksDB range and a hash_key's records are a prefix.

Value: ``expire_ts_s (u32) | timetag (u64) | user data``. ``expire_ts_s`` is
the Unix second after which the record is gone (0: no TTL). A record whose
timetag has the delete flag is a tombstone: reads treat it as absent; it stays
until a replicated ``CollectGarbage`` entry removes it, so that a duplicated write
with an older timetag arriving late cannot bring the value back.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from quorumlog.table._errors import KeyTooLargeError, ValueTooLargeError

HASH_KEY_BYTES_MAX = 0xFFFE  # the u16 length prefix; 0xFFFF starts the store's own keys
SORT_KEY_BYTES_MAX = 64 * 1024
VALUE_BYTES_MAX = 1024 * 1024  # one Raft entry holds a batch of these
_KEY_LENGTH = struct.Struct(">H")
_VALUE_HEADER = struct.Struct(">IQ")
VALUE_HEADER_BYTES = _VALUE_HEADER.size


def check_key(hash_key: bytes, sort_key: bytes = b"") -> None:
    if len(hash_key) > HASH_KEY_BYTES_MAX:
        raise KeyTooLargeError(f"hash_key of {len(hash_key)} bytes is over the limit of "
                               f"{HASH_KEY_BYTES_MAX} bytes")
    if len(sort_key) > SORT_KEY_BYTES_MAX:
        raise KeyTooLargeError(f"sort_key of {len(sort_key)} bytes is over the limit of "
                               f"{SORT_KEY_BYTES_MAX} bytes")


def check_value(value: bytes) -> None:
    if len(value) > VALUE_BYTES_MAX:
        raise ValueTooLargeError(f"value of {len(value)} bytes is over the limit of "
                                 f"{VALUE_BYTES_MAX} bytes; split it over several sort keys")


def encode_key(hash_key: bytes, sort_key: bytes) -> bytes:
    return _KEY_LENGTH.pack(len(hash_key)) + hash_key + sort_key


def hash_key_prefix(hash_key: bytes) -> bytes:
    """The prefix every key of ``hash_key`` starts with."""
    return _KEY_LENGTH.pack(len(hash_key)) + hash_key


def decode_key(key: bytes) -> tuple[bytes, bytes]:
    (length,) = _KEY_LENGTH.unpack_from(key)
    end = _KEY_LENGTH.size + length
    return key[_KEY_LENGTH.size:end], key[end:]


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key after every key that starts with ``prefix`` (None: no bound)."""
    as_list = bytearray(prefix)
    while as_list:
        if as_list[-1] != 0xFF:
            as_list[-1] += 1
            return bytes(as_list)
        as_list.pop()
    return None


@dataclass(frozen=True, slots=True)
class Record:
    value: bytes
    expire_ts_s: int  # 0: no TTL
    timetag: int

    @property
    def deleted(self) -> bool:
        return bool(self.timetag & 1)

    def expired(self, now_s: int) -> bool:
        return self.expire_ts_s != 0 and self.expire_ts_s <= now_s

    def live(self, now_s: int) -> bool:
        return not self.deleted and not self.expired(now_s)

    def ttl_s(self, now_s: int) -> int:
        """Seconds left, -1 without TTL (Pegasus's ``ttl`` answer)."""
        return -1 if self.expire_ts_s == 0 else max(0, self.expire_ts_s - now_s)


def encode_record(record: Record) -> bytes:
    return _VALUE_HEADER.pack(record.expire_ts_s, record.timetag) + record.value


def decode_record(raw: bytes) -> Record:
    expire_ts_s, timetag = _VALUE_HEADER.unpack_from(raw)
    return Record(value=raw[VALUE_HEADER_BYTES:], expire_ts_s=expire_ts_s, timetag=timetag)


# The store's own records (applied decree, format) sort after every data key:
# a data key starts with a hash_key length of at most HASH_KEY_BYTES_MAX.
STORE_KEY_PREFIX = b"\xff\xff"
