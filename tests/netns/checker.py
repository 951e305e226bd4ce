"""Checkers for the ledger and stream Jepsen-style runs (pure code, no network).

Each takes what the clients recorded during a run and what was read back after
heal, and returns the anomalies found, one sentence each (empty: none).
test_checkers.py feeds them histories with planted anomalies, so a run that
reports none means something.

Ledger (DESIGN.md §2): every entry acknowledged to a writer is in the ledger
read back after heal, with the same content; a reader never sees an entry past
the LAC, so every entry a reader saw during the run is in the final ledger with
the same content, and a reader sees entries in order without gaps; a writer
whose ledger was recovered by another client ("fenced") never gets an entry
acknowledged past the recovered end, and must fail.

Stream (docs/stream.md, "Writers"): every acknowledged message is consumed after
heal; per producer in publish order; no message twice. A send that failed has
an unknown outcome and may or may not be there, but once at most: the producer
resends an unacknowledged message only inside one ledger switch, which docs
call "no loss, no duplicate", and the workload never resends a failed send.
Nothing is consumed that was never sent.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field


@dataclass
class LedgerHistory:
    """One ledger's run: ``acked`` entry id -> content acknowledged to the writer;
    ``seen`` (entry id, content) in the order each reader saw them (one list per
    reader); ``final`` the ledger after heal, entry i at index i; ``recovered_last``
    the last entry id a recovering client settled (None: no recovery);
    ``writer_failed`` whether the writer's appends failed."""

    acked: Mapping[int, bytes]
    seen: Sequence[Sequence[tuple[int, bytes]]]
    final: Sequence[bytes]
    recovered_last: int | None = None
    writer_failed: bool = False


def check_ledger(history: LedgerHistory) -> list[str]:
    anomalies: list[str] = []
    final = history.final
    for entry_id, content in sorted(history.acked.items()):
        if entry_id >= len(final):
            anomalies.append(f"acknowledged entry {entry_id} lost: the ledger ends at "
                             f"{len(final) - 1}")
        elif final[entry_id] != content:
            anomalies.append(f"acknowledged entry {entry_id} changed: {content!r} was "
                             f"acknowledged, {final[entry_id]!r} read back")
    for reader, seen in enumerate(history.seen):
        anomalies += _check_reader(reader, seen, final)
    if history.recovered_last is not None:
        if history.recovered_last != len(final) - 1:
            anomalies.append(f"recovery settled the ledger at {history.recovered_last}, "
                             f"but it ends at {len(final) - 1} after heal")
        past = sorted(i for i in history.acked if i > history.recovered_last)
        if past:
            anomalies.append(f"the fenced writer got entries {past} acknowledged past the "
                             f"recovered end {history.recovered_last}")
        if not history.writer_failed:
            anomalies.append("the writer of a recovered ledger never failed (not fenced)")
    return anomalies


def _check_reader(reader: int, seen: Sequence[tuple[int, bytes]],
                  final: Sequence[bytes]) -> list[str]:
    anomalies = []
    for position, (entry_id, _) in enumerate(seen):
        if entry_id != position:
            anomalies.append(f"reader {reader} saw entry {entry_id} at position {position} "
                             "(out of order or a gap)")
            break
    for entry_id, content in seen:
        if entry_id >= len(final):
            anomalies.append(f"reader {reader} saw entry {entry_id} past the end "
                             f"{len(final) - 1}: read past the LAC")
        elif final[entry_id] != content:
            anomalies.append(f"reader {reader} saw entry {entry_id} as {content!r}, the "
                             f"ledger holds {final[entry_id]!r}: read past the LAC")
    return anomalies


@dataclass
class StreamHistory:
    """``acked``/``unknown``: per producer, the sequence numbers whose send was
    acknowledged / failed; ``consumed``: (producer, seq) in the order read after
    heal (one partition); ``seen``: what tailing readers saw during the run."""

    acked: Mapping[str, Iterable[int]]
    unknown: Mapping[str, Iterable[int]]
    consumed: Sequence[tuple[str, int]]
    seen: Sequence[Sequence[tuple[str, int]]] = field(default_factory=list)


def check_stream(history: StreamHistory) -> list[str]:
    anomalies: list[str] = []
    counts = Counter(history.consumed)
    sent = {(p, s) for p, seqs in history.acked.items() for s in seqs}
    maybe = {(p, s) for p, seqs in history.unknown.items() for s in seqs}
    lost = sorted(sent - set(counts))
    if lost:
        anomalies.append(f"{len(lost)} acknowledged messages lost, first {lost[:5]}")
    twice = sorted(m for m, n in counts.items() if n > 1)
    if twice:
        anomalies.append(f"{len(twice)} messages consumed more than once, first {twice[:5]}")
    phantom = sorted(set(counts) - sent - maybe)
    if phantom:
        anomalies.append(f"{len(phantom)} messages consumed that were never sent, "
                         f"first {phantom[:5]}")
    anomalies += _check_order("consumed", history.consumed)
    for reader, seen in enumerate(history.seen):
        anomalies += _check_order(f"reader {reader}", seen)
        missing = sorted(set(seen) - set(counts))
        if missing:
            anomalies.append(f"reader {reader} saw {len(missing)} messages that are not in "
                             f"the stream after heal, first {missing[:5]}")
    return anomalies


def _check_order(who: str, messages: Sequence[tuple[str, int]]) -> list[str]:
    last: dict[str, int] = {}
    for producer, seq in messages:
        if seq <= last.get(producer, -1):
            return [f"{who}: producer {producer}'s message {seq} came after "
                    f"{last[producer]} (out of order)"]
        last[producer] = seq
    return []
