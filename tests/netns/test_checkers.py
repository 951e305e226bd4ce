"""Planted anomalies: the ledger and stream checkers of the netns runs can fail.

A Jepsen run that reports 0 anomalies means something only if the checker
reports the anomalies it exists for; each test below plants one in an
otherwise clean history (no namespaces needed)."""

from __future__ import annotations

from .checker import LedgerHistory, StreamHistory, check_ledger, check_stream

FINAL = [b"e0", b"e1", b"e2", b"e3"]


def clean_ledger(**changes: object) -> LedgerHistory:
    fields: dict[str, object] = {
        "acked": {0: b"e0", 1: b"e1", 2: b"e2"},
        "seen": [[(0, b"e0"), (1, b"e1")]],
        "final": FINAL,
    }
    fields.update(changes)
    return LedgerHistory(**fields)  # type: ignore[arg-type]


def test_a_clean_ledger_history_has_no_anomaly() -> None:
    assert check_ledger(clean_ledger()) == []
    # a recovered ledger may hold entries the fenced writer never heard acknowledged
    assert check_ledger(clean_ledger(recovered_last=3, writer_failed=True)) == []


def test_lost_acknowledged_entry_is_reported() -> None:
    found = check_ledger(clean_ledger(acked={0: b"e0", 4: b"e4"}))
    assert found == ["acknowledged entry 4 lost: the ledger ends at 3"]


def test_changed_acknowledged_entry_is_reported() -> None:
    found = check_ledger(clean_ledger(acked={0: b"e0", 1: b"other"}))
    assert len(found) == 1 and "entry 1 changed" in found[0]


def test_read_past_lac_is_reported() -> None:
    # the reader saw an entry that recovery later dropped (it was never confirmed)
    found = check_ledger(clean_ledger(seen=[[(0, b"e0"), (1, b"e1"), (2, b"e2"),
                                             (3, b"e3"), (4, b"e4")]]))
    assert found == ["reader 0 saw entry 4 past the end 3: read past the LAC"]
    # or saw content that was later replaced by the recovered one
    found = check_ledger(clean_ledger(seen=[[(0, b"e0"), (1, b"x1")]]))
    assert len(found) == 1 and "read past the LAC" in found[0]


def test_reader_gap_is_reported() -> None:
    found = check_ledger(clean_ledger(seen=[[(0, b"e0"), (2, b"e2")]]))
    assert found == ["reader 0 saw entry 2 at position 1 (out of order or a gap)"]


def test_fenced_writer_acknowledged_past_recovery_is_reported() -> None:
    found = check_ledger(clean_ledger(acked={0: b"e0", 1: b"e1", 2: b"e2"},
                                      final=FINAL[:2], recovered_last=1, writer_failed=True))
    assert "the fenced writer got entries [2] acknowledged past the recovered end 1" in found
    assert "acknowledged entry 2 lost: the ledger ends at 1" in found


def test_writer_that_kept_writing_after_recovery_is_reported() -> None:
    found = check_ledger(clean_ledger(recovered_last=3, writer_failed=False))
    assert found == ["the writer of a recovered ledger never failed (not fenced)"]
    found = check_ledger(clean_ledger(recovered_last=2, writer_failed=True))
    assert found == ["recovery settled the ledger at 2, but it ends at 3 after heal"]


def clean_stream(**changes: object) -> StreamHistory:
    fields: dict[str, object] = {
        "acked": {"p": [0, 1, 3], "q": [0, 1]},
        "unknown": {"p": [2]},
        "consumed": [("p", 0), ("q", 0), ("p", 1), ("p", 3), ("q", 1)],
        "seen": [[("p", 0), ("q", 0), ("p", 1)]],
    }
    fields.update(changes)
    return StreamHistory(**fields)  # type: ignore[arg-type]


def test_a_clean_stream_history_has_no_anomaly() -> None:
    assert check_stream(clean_stream()) == []
    # a failed send may have been written after all
    assert check_stream(clean_stream(consumed=[("p", 0), ("p", 1), ("p", 2), ("p", 3),
                                               ("q", 0), ("q", 1)])) == []


def test_lost_acknowledged_message_is_reported() -> None:
    found = check_stream(clean_stream(consumed=[("p", 0), ("p", 1), ("q", 0), ("q", 1)]))
    assert found == ["1 acknowledged messages lost, first [('p', 3)]"]


def test_duplicate_message_is_reported() -> None:
    found = check_stream(clean_stream(consumed=[("p", 0), ("p", 1), ("p", 3), ("p", 3),
                                                ("q", 0), ("q", 1)]))
    assert "1 messages consumed more than once, first [('p', 3)]" in found


def test_reordered_and_phantom_messages_are_reported() -> None:
    found = check_stream(clean_stream(consumed=[("p", 1), ("p", 0), ("p", 3), ("q", 0),
                                                ("q", 1), ("q", 7)]))
    assert "consumed: producer p's message 0 came after 1 (out of order)" in found
    assert "1 messages consumed that were never sent, first [('q', 7)]" in found


def test_reader_that_saw_a_vanished_message_is_reported() -> None:
    found = check_stream(clean_stream(seen=[[("p", 0), ("p", 2)]]))
    assert found == ["reader 0 saw 1 messages that are not in the stream after heal, "
                     "first [('p', 2)]"]
