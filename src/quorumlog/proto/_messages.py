"""The bookie's request/response messages and flags (rpc type ids 1200-1299).

The contract between bookies (``quorumlog.bookie`` server role) and ledger
clients (``quorumlog.ledger``); neither package owns it. Entries travel as
envelopes (``_envelope.py``) in the rpc payload, never inside the message
struct, so they are not copied by the message codec. Error codes are in
``_errors.py``, keys in meta in ``_keys.py``.

Requests and their meaning:

- ``AddEntryRequest`` + payload envelope: store one entry. The bookie checks
  the master key (the first add or fence of a ledger records it; another key
  is refused with UnauthorizedError), that the envelope's ids match the
  request, the envelope's structure and CRC32C, and the fenced flag (a fenced
  ledger refuses adds with LedgerFencedError unless ``FLAG_RECOVERY``). The
  envelope's LAC is the piggybacked LAC. The add is answered after the journal
  fsync, or, with ``FLAG_NO_SYNC`` (deferred sync), once journaled in memory;
  ``ForceLedgerRequest`` makes every earlier add of the ledger durable. With
  ``FLAG_RECOVERY | FLAG_NO_JOURNAL`` the entry is not journaled and the add
  is answered once it is in the write cache; ``FlushLedgerRequest`` makes it
  durable.
- ``AddEntriesRequest`` + payload envelopes back to back (``sizes`` long
  each): a batch of adds to one ledger, entry ids strictly ascending (not
  necessarily consecutive: with E > Qw a bookie holds every few entries, and
  resends after an ensemble change skip the entries a bookie already has),
  at most ``ADD_BATCH_ENTRIES_MAX`` entries. The bookie applies each add in
  order exactly as an ``AddEntryRequest`` (same checks, same fencing), then
  answers once, after one journal fsync covers every accepted entry, with a
  result per entry: ``codes[i]`` is 0 (``ENTRY_OK``) or the entry's wire
  error code (``WIRE_ERROR_CODES``), ``messages[i]`` its text. One entry's
  error (fenced, too large, bad envelope) does not fail the others; an error
  of the whole request (malformed batch, not registered) fails them all.
- ``ReadEntryRequest``: one entry's envelope as the payload of the response.
  ``FLAG_FENCE`` (needs the master key) fences the ledger first, durably,
  before answering: this is the recovery read. NoSuchEntryError /
  NoSuchLedgerError when absent; the client must tell those apart from
  timeouts and connection errors.
- ``ReadBatchRequest``: up to ``max_entries`` consecutive entries (or
  ``max_bytes``) from ``first_entry_id``; the payload is the envelopes back to
  back and ``sizes`` gives their lengths. Stops early at the first missing
  entry; zero entries is NoSuchEntryError.
- ``ReadLacRequest``: the ledger's LAC (max of explicit and piggybacked) and
  last entry id. With ``timeout_ms > 0`` it is a long poll: answered when the
  LAC passes ``previous_lac`` or when the timeout ends (then with the current
  LAC, maybe unchanged). With ``with_entry`` the envelope of entry
  ``previous_lac + 1`` rides along as the payload when the bookie has it.
- ``FenceRequest``: fence (durably, before answering) and return the LAC:
  step one of ledger recovery.
- ``WriteLacRequest``: an explicit LAC, sent by an idle writer so tailing
  readers see the tail.
- ``ForceLedgerRequest``: make all adds of the ledger so far durable.
- ``FlushLedgerRequest``: flush the bookie's write cache (every ledger's) to
  its entry logs and index, synced, as its periodic journal checkpoint does,
  then check that the index holds each of ``entry_ids`` of the ledger
  (NoSuchEntryError naming the missing ones otherwise: the bookie restarted
  and lost ``FLAG_NO_JOURNAL`` adds, copy them again). Answered once they are
  durable; makes ``FLAG_NO_JOURNAL`` adds as durable as journaled ones.
- Admin: ``BookieStatusRequest``, ``LedgerInfoRequest``, ``GcRequest``,
  ``ScrubRequest``.
"""

from __future__ import annotations

from typing import ClassVar

from quorumlog import rpc
from quorumlog.errors import QuorumlogError
from quorumlog.proto._errors import WIRE_ERROR_CODES, BookieError

FLAG_RECOVERY = 1
FLAG_NO_SYNC = 2
FLAG_FENCE = 4
FLAG_NO_JOURNAL = 8
"""An add flag, valid only with ``FLAG_RECOVERY`` (the bookie refuses it
otherwise with UsageError): the entry data goes to ledger storage's write
cache without a journal record and the add is answered at once. Nothing
makes such an entry durable but a ``FlushLedgerRequest`` (or the bookie's
own periodic flush): a crash before either loses it. For copies whose
reader is named nowhere yet - auto-recovery copies a fragment to a bookie
the ledger's metadata names only after the flush (BookKeeper's
``journalWriteData=false``)."""

FLUSH_ENTRIES_MAX = 65536
"""Most entry ids one ``FlushLedgerRequest`` asks the bookie to check after its
flush (about 0.6 MiB of ids). Bounds the bookie's index lookups per request;
a caller with more entries sends several requests."""


ADD_BATCH_ENTRIES_MAX = 256
"""Most entries in one ``AddEntriesRequest``. Bounds the bookie's work per
request and the per-entry result lists; a writer's outstanding window (256 by
default) fits in one batch per bookie."""

ADD_BATCH_BYTES_MAX = 1024 * 1024
"""Most envelope bytes a client puts in one ``AddEntriesRequest`` (a larger
single entry travels alone). Far below the rpc frame bound (16 MiB by
default), so a batch never trips it, and large enough that 1 KiB entries
batch by count, not by size."""

ENTRY_OK = 0
"""Per-entry result code of an accepted add in ``AddEntriesResponse``."""


# ----- entries ----------------------------------------------------------------


class AddEntryResponse(rpc.Message, frozen=True):
    type_id: ClassVar[int] = 1201
    ledger_id: int
    entry_id: int


class AddEntryRequest(rpc.Request[AddEntryResponse], frozen=True):
    """Payload: the entry envelope."""

    type_id: ClassVar[int] = 1200
    ledger_id: int
    entry_id: int
    master_key: bytes
    flags: int = 0  # FLAG_RECOVERY | FLAG_NO_SYNC | FLAG_NO_JOURNAL (with FLAG_RECOVERY)


class AddEntriesResponse(rpc.Message, frozen=True):
    """One result per entry of the request, in its order: ``codes[i]`` is
    ``ENTRY_OK`` or a wire error code, ``messages[i]`` the error's text."""

    type_id: ClassVar[int] = 1215
    ledger_id: int
    entry_ids: list[int]
    codes: list[int]
    messages: list[str]


class AddEntriesRequest(rpc.Request[AddEntriesResponse], frozen=True):
    """Payload: the entries' envelopes back to back, ``sizes[i]`` bytes each."""

    type_id: ClassVar[int] = 1214
    ledger_id: int
    entry_ids: list[int]
    sizes: list[int]
    master_key: bytes
    flags: int = 0  # FLAG_RECOVERY | FLAG_NO_SYNC | FLAG_NO_JOURNAL, for every entry


def entry_result(error: QuorumlogError | None) -> tuple[int, str]:
    """The per-entry (code, message) of an add's outcome (None: accepted)."""
    if error is None:
        return ENTRY_OK, ""
    for klass in type(error).__mro__:
        code = _CODE_OF_CLASS.get(klass)
        if code is not None:
            return code, error.message
    return _CODE_OF_CLASS[BookieError], f"{type(error).__name__}: {error.message}"


def entry_error(code: int, message: str) -> QuorumlogError | None:
    """The error a per-entry result code stands for (None for ``ENTRY_OK``)."""
    if code == ENTRY_OK:
        return None
    cls = _CLASS_OF_CODE.get(code)
    if cls is None:
        return BookieError(f"bookie error with unknown code {code}: {message}")
    return cls(message)


_CODE_OF_CLASS: dict[type[QuorumlogError], int] = {c: code for code, c in WIRE_ERROR_CODES}
_CLASS_OF_CODE: dict[int, type[QuorumlogError]] = dict(WIRE_ERROR_CODES)


class ReadEntryResponse(rpc.Message, frozen=True):
    """Payload: the entry envelope."""

    type_id: ClassVar[int] = 1203
    ledger_id: int
    entry_id: int
    lac: int  # the bookie's LAC for the ledger when answering


class ReadEntryRequest(rpc.Request[ReadEntryResponse], frozen=True):
    type_id: ClassVar[int] = 1202
    ledger_id: int
    entry_id: int
    flags: int = 0  # FLAG_FENCE: a recovery read
    master_key: bytes = b""  # required with FLAG_FENCE


class ReadBatchResponse(rpc.Message, frozen=True):
    """Payload: the envelopes back to back, ``sizes`` long each."""

    type_id: ClassVar[int] = 1205
    ledger_id: int
    first_entry_id: int
    sizes: list[int]
    lac: int


class ReadBatchRequest(rpc.Request[ReadBatchResponse], frozen=True):
    type_id: ClassVar[int] = 1204
    ledger_id: int
    first_entry_id: int
    max_entries: int
    max_bytes: int


# ----- LAC and fencing --------------------------------------------------------


class ReadLacResponse(rpc.Message, frozen=True):
    """Payload (``with_entry``): the envelope of entry previous_lac + 1, or empty."""

    type_id: ClassVar[int] = 1207
    ledger_id: int
    lac: int
    last_entry_id: int  # highest entry the bookie holds, -1 for none
    fenced: bool


class ReadLacRequest(rpc.Request[ReadLacResponse], frozen=True):
    type_id: ClassVar[int] = 1206
    ledger_id: int
    previous_lac: int = -1
    timeout_ms: int = 0  # > 0: long poll until lac > previous_lac
    with_entry: bool = False


class FenceResponse(rpc.Message, frozen=True):
    type_id: ClassVar[int] = 1209
    ledger_id: int
    lac: int
    last_entry_id: int
    fenced: bool


class FenceRequest(rpc.Request[FenceResponse], frozen=True):
    type_id: ClassVar[int] = 1208
    ledger_id: int
    master_key: bytes


class WriteLacResponse(rpc.Message, frozen=True):
    type_id: ClassVar[int] = 1211
    ledger_id: int


class WriteLacRequest(rpc.Request[WriteLacResponse], frozen=True):
    type_id: ClassVar[int] = 1210
    ledger_id: int
    master_key: bytes
    lac: int


class ForceLedgerResponse(rpc.Message, frozen=True):
    type_id: ClassVar[int] = 1213
    ledger_id: int
    last_entry_id: int  # every add of the ledger up to here is durable


class ForceLedgerRequest(rpc.Request[ForceLedgerResponse], frozen=True):
    type_id: ClassVar[int] = 1212
    ledger_id: int
    master_key: bytes


class FlushLedgerResponse(rpc.Message, frozen=True):
    type_id: ClassVar[int] = 1217
    ledger_id: int
    entries_durable: int  # how many of the request's entry ids the index holds: all


class FlushLedgerRequest(rpc.Request[FlushLedgerResponse], frozen=True):
    """Flush the write cache (synced) and check that the index holds each of
    ``entry_ids`` (at most ``FLUSH_ENTRIES_MAX``) of the ledger."""

    type_id: ClassVar[int] = 1216
    ledger_id: int
    master_key: bytes
    entry_ids: list[int]


# ----- admin ------------------------------------------------------------------


class BookieStatusResponse(rpc.Message, frozen=True):
    type_id: ClassVar[int] = 1221
    bookie_id: str
    read_only: bool
    registered: bool
    labels: dict[str, str]
    ledgers: int
    disk_usage: float
    journal_dir: str
    ledger_dir: str
    stats: dict[str, int]
    instance_id: str = ""  # the bookie's cookie; "" from bookies before cookies


class BookieStatusRequest(rpc.Request[BookieStatusResponse], frozen=True):
    type_id: ClassVar[int] = 1220


class LedgerInfoResponse(rpc.Message, frozen=True):
    type_id: ClassVar[int] = 1223
    ledger_id: int
    exists: bool
    fenced: bool
    lac: int
    last_entry_id: int


class LedgerInfoRequest(rpc.Request[LedgerInfoResponse], frozen=True):
    type_id: ClassVar[int] = 1222
    ledger_id: int


class GcResponse(rpc.Message, frozen=True):
    type_id: ClassVar[int] = 1225
    deleted_ledgers: int
    compacted_logs: int
    reclaimed_bytes: int


class GcRequest(rpc.Request[GcResponse], frozen=True):
    type_id: ClassVar[int] = 1224


class ScrubResponse(rpc.Message, frozen=True):
    type_id: ClassVar[int] = 1227
    ok: bool
    entries_checked: int
    problems: list[str]


class ScrubRequest(rpc.Request[ScrubResponse], frozen=True):
    type_id: ClassVar[int] = 1226


class DeleteLedgerResponse(rpc.Message, frozen=True):
    type_id: ClassVar[int] = 1229
    ledger_id: int
    deleted: bool  # False: the bookie held no copy


class DeleteLedgerRequest(rpc.Request[DeleteLedgerResponse], frozen=True):
    """Drop this bookie's copy of a ledger (auto-recovery removes an extra copy,
    one the ledger's metadata does not name, this way). The master key must be
    the ledger's; the caller decides that the copy is not needed."""

    type_id: ClassVar[int] = 1228
    ledger_id: int
    master_key: bytes
