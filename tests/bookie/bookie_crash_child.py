"""Child process of the kill -9 test: adds, flushes, deletes, compacts, reports.

Usage: bookie_crash_child.py DIRECTORY SEED ITERATIONS

Prints ``flushed L E`` once every entry of ledger L up to E is flushed,
``delete L`` *before* deleting ledger L, and ``compacted`` after a compaction.
The parent kills it with SIGKILL at some point and checks what was reported.
"""

from __future__ import annotations

import random
import sys

from quorumlog.bookie import LedgerStorage, LedgerStorageConfig
from quorumlog.log import configure

KEY = b"crash-test-key"
ENTRY_SIZE_MAX_BYTES = 3000
ENTRIES_PER_ADD_MAX = 25
LIVE_LEDGERS_MAX = 4


def expected(ledger_id: int, entry_id: int) -> bytes:
    size = 1 + (ledger_id * 7919 + entry_id * 104729) % ENTRY_SIZE_MAX_BYTES
    seed = f"<{ledger_id}:{entry_id}>".encode()
    return (seed * (size // len(seed) + 1))[:size]


def config() -> LedgerStorageConfig:
    return LedgerStorageConfig(
        write_cache_max_bytes=1024 * 1024,
        entry_max_bytes=64 * 1024,
        entry_log_max_bytes=128 * 1024,
        read_cache_max_bytes=256 * 1024,
        compaction_read_bytes=128 * 1024,
        compaction_batch_bytes=32 * 1024,
        index_write_buffer_bytes=1024 * 1024,
        index_block_cache_bytes=1024 * 1024,
    )


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def step(storage: LedgerStorage, rng: random.Random, iteration: int) -> None:
    ledgers = storage.ledger_ids()
    if len(ledgers) < LIVE_LEDGERS_MAX or rng.random() < 0.1:
        ledgers.append(max(ledgers, default=0) + 1 + rng.randrange(3))
    touched: dict[int, int] = {}
    for ledger_id in rng.sample(ledgers, k=min(2, len(ledgers))):
        first = storage.last_entry_id(ledger_id) + 1 if storage.ledger_exists(ledger_id) else 0
        count = rng.randrange(1, ENTRIES_PER_ADD_MAX)
        for entry_id in range(first, first + count):
            storage.add(ledger_id, entry_id, expected(ledger_id, entry_id), master_key=KEY)
        touched[ledger_id] = first + count - 1
    storage.flush(f"iteration-{iteration}".encode())
    for ledger_id, last in touched.items():
        say(f"flushed {ledger_id} {last}")
    if len(ledgers) > LIVE_LEDGERS_MAX and rng.random() < 0.3:
        victim = min(storage.ledger_ids())
        say(f"delete {victim}")
        storage.delete_ledger(victim)
        storage.flush()
    if rng.random() < 0.2:
        storage.compact(0.6)
        say("compacted")


def main() -> None:
    directory, seed, iterations = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    configure("WARNING", json=True)  # logs to stderr; stdout carries the reports
    rng = random.Random(seed)
    storage = LedgerStorage(directory, config())
    say("ready")
    for iteration in range(iterations):
        step(storage, rng, iteration)
    storage.close()
    say("done")


if __name__ == "__main__":
    main()
