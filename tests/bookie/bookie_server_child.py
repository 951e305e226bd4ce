"""A bookie process for the kill -9 test: run_bookie without meta, prints its address.

Usage: bookie_server_child.py DIRECTORY [WRITE_CACHE_BYTES FLUSH_INTERVAL_MS]

Prints ``ready HOST:PORT`` once serving, then serves until killed.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from server_helpers import small_bookie_config

from quorumlog import rpc
from quorumlog.bookie import run_bookie
from quorumlog.log import configure


async def main(directory: Path, write_cache_bytes: int | None,
               flush_interval_ms: int | None) -> None:
    config = small_bookie_config(directory)
    if write_cache_bytes is not None and flush_interval_ms is not None:
        config = config.replace(
            flush_interval_ms=flush_interval_ms,
            storage=config.storage.replace(write_cache_max_bytes=write_cache_bytes))
    async with run_bookie(config) as bookie:
        sys.stdout.write(f"ready {bookie.address}\n")
        sys.stdout.flush()
        await asyncio.Event().wait()


if __name__ == "__main__":
    configure("WARNING")
    extra = [int(arg) for arg in sys.argv[2:4]]
    rpc.run(main(Path(sys.argv[1]), *(extra or [None, None])))
