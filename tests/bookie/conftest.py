"""Fixtures of the bookie storage tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from bookie_helpers import DiskProbe, Opener, small_config

from quorumlog.bookie import LedgerStorage


@pytest.fixture
def probe() -> DiskProbe:
    return DiskProbe()


@pytest.fixture
def open_storage(tmp_path: Path, probe: DiskProbe) -> Iterator[Opener]:
    opened: list[LedgerStorage] = []

    def opener(**changes: object) -> LedgerStorage:
        storage = LedgerStorage(tmp_path / "ledgers", small_config(**changes),
                                disk_usage_probe=probe)
        opened.append(storage)
        return storage

    yield opener
    for storage in opened:
        storage.close(flush=False)
