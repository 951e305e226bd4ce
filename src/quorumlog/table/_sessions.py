"""Exactly-once table writes: per-client results kept inside the partition's RocksDB.

After the Raft dissertation (section 6.3) and the meta service's client
sessions (``quorumlog.meta``), adapted to a partition whose state lives in
RocksDB. A client gives every write to a partition a proposal id:
``(client_id, seq, first_outstanding_seq)``, with ``seq`` counted per
partition from 1. The partition's state machine keeps, per client, the
results of its writes at or above a *floor*, so a retry of a write that was
applied (its answer lost with a killed leader) gets the first result instead
of being applied again.

Everything is in the store, under its own ``ff ff`` key space, written in the
same RocksDB write batch as the entry's data, so checkpoints (snapshots)
carry it, a restart finds it, and every replica holds the same rows:

* ``ff ff 'cs' client_id`` -> (floor, last_timestamp_us): the session;
* ``ff ff 'cr' client_id seq`` -> the encoded results of that write;
* ``ff ff 'ce' minute client_id`` -> b"": sessions by the minute of their
  last write (moved only when that minute changes, so a busy client leaves
  no trail of deleted index keys);
* ``ff ff 'cx'`` -> the minute below which every session was expired: the
  expiry scan runs when that minute advances, and seeks past what it did.

The store also keeps each client's session row in memory (``SessionCache``,
with the highest seq that has a kept result), updated once the entry's batch
is written: a write reads nothing back from RocksDB but for a retry of a seq
it has a result for.

Every delete is a point delete of a key known to exist (no range
tombstones, which would slow every later read): a client's kept results lie
in ``[floor, floor + CLIENT_RESULTS_WINDOW_WRITES)``.

Bounds, all decided by the entries' timestamps (the leader's stamp that
every replica applies), never by a replica's own clock:

* the floor rises to the client's ``first_outstanding_seq`` (answers below
  it were delivered) and to ``seq - CLIENT_RESULTS_WINDOW_WRITES + 1``: a
  client keeps at most that many results per partition;
* a session idle (no write) for ``CLIENT_SESSION_IDLE_EXPIRY_S`` of entry
  time (counted in whole minutes: up to a minute more) is removed,
  ``SESSIONS_EXPIRED_PER_ENTRY_MAX`` per applied write (a combined log
  entry: that many per write it holds, at its first write's timestamp).

Invariant: a seq at or above the floor with no kept result was never
applied. A request below the floor is refused (``stale_sequence``: its outcome
can no longer be told); a request of an unknown client whose
``first_outstanding_seq`` is above 1 is refused (``session_expired``: the
partition knew this client once, so an earlier attempt may have applied) and
the client starts a new session. Refusals apply nothing.
"""

from __future__ import annotations

import struct

import msgspec
from rocksdict import Rdict, WriteBatch

from quorumlog.errors import InvariantViolation, invariant
from quorumlog.table._codec import STORE_KEY_PREFIX
from quorumlog.table._commands import Done, Refused, WriteResult

CLIENT_RESULTS_WINDOW_WRITES = 1024  # results kept per client and partition (seq window)
# A client idle this long (entry time) is forgotten; far above the client's
# operation deadline (20 s), so no retry of a live write outlives its session.
CLIENT_SESSION_IDLE_EXPIRY_S = 600
SESSIONS_EXPIRED_PER_ENTRY_MAX = 4  # bounds the work one applied entry does for expiry
EXPIRY_BUCKET_S = 60  # sessions are indexed by the minute of their last write
US_PER_S = 1_000_000
CLIENT_ID_MAX = (1 << 63) - 1  # client ids are random 63-bit numbers

SESSION_EXPIRED = "session_expired"
STALE_SEQUENCE = "stale_sequence"
BAD_SEQUENCE = "bad_sequence"

_SESSION = STORE_KEY_PREFIX + b"cs"
_RESULT = STORE_KEY_PREFIX + b"cr"
_BY_AGE = STORE_KEY_PREFIX + b"ce"
_EXPIRED_BELOW = STORE_KEY_PREFIX + b"cx"
_U64 = struct.Struct(">Q")
_U64_PAIR = struct.Struct(">QQ")
_RESULTS_ENCODER = msgspec.msgpack.Encoder()
_RESULTS_DECODER = msgspec.msgpack.Decoder(list[WriteResult])


def _raw(value: object) -> bytes:
    if not isinstance(value, bytes):
        raise InvariantViolation(f"invariant violated: store returned {type(value).__name__}")
    return value


def _result_key(client_id: int, seq: int) -> bytes:
    return _RESULT + _U64_PAIR.pack(client_id, seq)


def _bucket(timestamp_us: int) -> int:
    return max(0, timestamp_us) // (EXPIRY_BUCKET_S * US_PER_S)


def _age_key(bucket: int, client_id: int) -> bytes:
    return _BY_AGE + _U64_PAIR.pack(bucket, client_id)


class SessionCache:
    """What a partition replica's store holds of its client sessions, kept in
    memory so that applying a write does not read it back from RocksDB: per
    client ``(floor, last_timestamp_us, top)`` (None: no session), ``top``
    being at least the highest seq with a kept result (none above it), and
    the expiry scan's minute.

    A read-through cache of committed rows: filled from the database on a
    miss, updated by :meth:`ClientSessions.commit` only after the entry's
    write batch is written, and dropped whole when the store's data is
    replaced (``TableStore.restore``) or when it grows past
    ``SESSION_CACHE_CLIENTS_MAX`` clients."""

    __slots__ = ("expired_below", "rows")

    def __init__(self) -> None:
        self.rows: dict[int, tuple[int, int, int] | None] = {}
        self.expired_below: int | None = None  # None: not read yet

    def clear(self) -> None:
        self.rows.clear()
        self.expired_below = None


# Session rows a store keeps in memory: past it the cache starts over (about
# 100 bytes a client; a node may host hundreds of partition replicas).
SESSION_CACHE_CLIENTS_MAX = 1024
_DONE_RESULTS = _RESULTS_ENCODER.encode([Done()])


class ClientSessions:
    """The session rows as one applied log entry sees them: the committed rows
    (``SessionCache``, else the database) overlaid by what the entry wrote
    before (a combined entry may hold several writes of one client); writes go
    into the entry's write batch and, once it is written (:meth:`commit`),
    into the cache.

    ``timestamp_us`` is the timestamp of the write being applied (:meth:`at`)."""

    def __init__(self, db: Rdict, batch: WriteBatch, timestamp_us: int,
                 cache: SessionCache) -> None:
        self._db = db
        self._batch = batch
        self._timestamp_us = timestamp_us
        self._cache = cache
        self._rows: dict[int, tuple[int, int, int] | None] = {}  # this entry's sessions
        self._rows_written: set[int] = set()  # clients whose row :meth:`write_rows` puts
        self._results: dict[bytes, bytes | None] = {}  # this entry's results (None: deleted)
        self._expired_below: int | None = None  # this entry's scan minute, if it moved
        self._wrote = False
        self._expired_count = 0

    def at(self, timestamp_us: int) -> None:
        """The next write applied has this timestamp."""
        self._timestamp_us = timestamp_us

    def write_rows(self) -> None:
        """Put the session rows the entry's writes moved into its batch, once per
        client (a combined entry holds many writes of each client); call before
        the batch is written."""
        for client_id in self._rows_written:
            row = self._rows[client_id]
            if row is not None:
                self._batch.put(_SESSION + _U64.pack(client_id), _U64_PAIR.pack(row[0], row[1]))
        self._rows_written.clear()

    def commit(self) -> None:
        """The entry's write batch is written: its rows are the committed ones."""
        cache = self._cache
        if len(cache.rows) + len(self._rows) > SESSION_CACHE_CLIENTS_MAX:
            cache.rows.clear()  # the next entries read their rows from the database
        cache.rows.update(self._rows)
        if self._expired_below is not None:
            cache.expired_below = self._expired_below

    def _scan_minute(self) -> int:
        cached = self._cache.expired_below
        if cached is None:
            raw = self._db.get(_EXPIRED_BELOW)
            cached = 0 if raw is None else _U64.unpack(_raw(raw))[0]
            self._cache.expired_below = cached
        return cached

    def expire(self, writes: int = 1) -> None:
        """Remove sessions idle past the expiry, at most
        ``SESSIONS_EXPIRED_PER_ENTRY_MAX`` per write of the entry; run before
        the entry's first write, at its timestamp.

        Sessions whose last write's minute lies below ``limit`` are idle for at
        least the expiry; nothing is read until ``limit`` passes the minute the
        previous scan finished."""
        invariant(not self._wrote, "sessions expire before the entry's writes")
        expired_max = SESSIONS_EXPIRED_PER_ENTRY_MAX * writes
        limit = _bucket(self._timestamp_us - CLIENT_SESSION_IDLE_EXPIRY_S * US_PER_S)
        done_below = self._scan_minute()
        if limit <= done_below:
            return
        it = self._db.iter()
        it.seek(_age_key(done_below, 0))  # every index key below it is gone
        while it.valid():
            key = _raw(it.key())
            if not key.startswith(_BY_AGE):
                break
            bucket, client_id = _U64_PAIR.unpack(key[len(_BY_AGE):])
            if bucket >= limit:
                break
            if self._expired_count == expired_max:
                limit = bucket  # the next entry goes on from this minute
                break
            self._forget(client_id, key)
            it.next()
        self._batch.put(_EXPIRED_BELOW, _U64.pack(limit))
        self._expired_below = limit

    def _forget(self, client_id: int, age_key: bytes) -> None:
        session = self._session(client_id)
        if session is None:
            raise InvariantViolation(
                f"invariant violated: client session {client_id} is indexed but absent")
        floor = session[0]
        self._batch.delete(age_key)
        self._batch.delete(_SESSION + _U64.pack(client_id))
        for seq in range(floor, floor + CLIENT_RESULTS_WINDOW_WRITES):
            self._batch.delete(_result_key(client_id, seq))
        self._rows[client_id] = None
        self._expired_count += 1

    def answered(self, client_id: int, seq: int,
                 first_outstanding_seq: int) -> list[WriteResult] | Refused | None:
        """The first results of a duplicate, a refusal, or None: apply the write."""
        if not (0 < client_id <= CLIENT_ID_MAX and 1 <= first_outstanding_seq <= seq):
            return Refused(f"client {client_id}: needs client_id in 1..{CLIENT_ID_MAX} and "
                           f"first_outstanding_seq {first_outstanding_seq} in [1, seq {seq}]; "
                           "this is a client bug",
                           code=BAD_SEQUENCE)
        session = self._session(client_id)
        if session is None:
            if first_outstanding_seq > 1:
                return Refused(f"client {client_id}: its session on this partition expired "
                               f"(idle over {CLIENT_SESSION_IDLE_EXPIRY_S} s); the client "
                               "starts a new one", code=SESSION_EXPIRED)
            return None
        floor, _, top = session
        if seq < floor:
            return Refused(f"client {client_id}: write {seq} is below the kept window "
                           f"(floor {floor}); its outcome is unknown", code=STALE_SEQUENCE)
        if seq > top:
            return None  # no result is kept above top: never applied
        key = _result_key(client_id, seq)
        if key in self._results:
            raw = self._results[key]
        else:
            found = self._db.get(key)
            raw = None if found is None else _raw(found)
        return None if raw is None else _RESULTS_DECODER.decode(raw)

    def remember(self, client_id: int, seq: int, first_outstanding_seq: int,
                 results: list[WriteResult]) -> None:
        """Keep the results of an applied write and move the session's floor and age."""
        self._wrote = True
        session = self._session(client_id)
        old_floor, top = (1, 0) if session is None else (session[0], session[2])
        bucket = _bucket(self._timestamp_us)
        if session is None or _bucket(session[1]) != bucket:
            if session is not None:
                self._batch.delete(_age_key(_bucket(session[1]), client_id))
            self._batch.put(_age_key(bucket, client_id), b"")
        floor = max(old_floor, first_outstanding_seq, seq - CLIENT_RESULTS_WINDOW_WRITES + 1)
        invariant(floor <= seq, "the floor never passes the write being kept")
        # Kept results lie in [old_floor, old_floor + window): delete those below floor.
        written = self._results
        for dropped in range(old_floor, min(floor, old_floor + CLIENT_RESULTS_WINDOW_WRITES)):
            key = _result_key(client_id, dropped)
            written[key] = None
            self._batch.delete(key)
        key = _result_key(client_id, seq)
        encoded = (_DONE_RESULTS if len(results) == 1 and type(results[0]) is Done
                   else _RESULTS_ENCODER.encode(results))
        written[key] = encoded
        self._batch.put(key, encoded)
        self._rows[client_id] = (floor, max(self._timestamp_us, 0), max(top, seq))
        self._rows_written.add(client_id)

    def _session(self, client_id: int) -> tuple[int, int, int] | None:
        """(floor, last_timestamp_us, top) of the client's session, None: none."""
        rows = self._rows
        if client_id in rows:
            return rows[client_id]
        cached = self._cache.rows
        if client_id in cached:
            return cached[client_id]
        raw = self._db.get(_SESSION + _U64.pack(client_id))
        if raw is None:
            session = None
        else:
            floor, last_us = _U64_PAIR.unpack(_raw(raw))
            session = (floor, last_us, self._top_result(client_id))
        cached[client_id] = session  # the committed row: this entry has not written it
        return session

    def _top_result(self, client_id: int) -> int:
        """The highest seq with a kept result of the client (0: none)."""
        prefix = _RESULT + _U64.pack(client_id)
        it = self._db.iter()
        it.seek_for_prev(prefix + b"\xff" * _U64.size)
        if not it.valid():
            return 0
        key = _raw(it.key())
        return _U64.unpack(key[len(prefix):])[0] if key.startswith(prefix) else 0


def count_sessions(db: Rdict) -> int:
    """How many client sessions the store keeps (for tests and status)."""
    it = db.iter()
    it.seek(_SESSION)
    count = 0
    while it.valid() and _raw(it.key()).startswith(_SESSION):
        count += 1
        it.next()
    return count
