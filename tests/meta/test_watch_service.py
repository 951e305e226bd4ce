"""Parked watches on a real (one-member) meta service."""

from __future__ import annotations

import asyncio
from pathlib import Path

from quorumlog import rpc
from quorumlog.meta import MetaClient, MetaLimits
from rpc.support import wait_until

from .support import one_member


def test_a_parked_watch_outlives_unrelated_writes_that_push_its_start_out_of_history(
    tmp_path: Path,
) -> None:
    """Every applied write wakes a parked watch; it checks only the revisions
    new since it last looked and moves its start past them. So writes to
    other keys that push the watch's start revision out of the bounded history
    do not fail it (before, each wake-up rescanned from the request's start:
    the whole history since then, and CompactedError once it was dropped)."""
    async def main() -> None:
        limits = MetaLimits(history_events_max=20)
        async with one_member(tmp_path, limits=limits) as member, \
                MetaClient([member.address]) as meta:
            start = await meta.put("/other/0", b"x") + 1
            watch = asyncio.ensure_future(
                meta.watch_once("/watched", start_revision=start, wait_ms=20_000))
            await wait_until(lambda: member.service._watches_open == 1, what="watch parked")
            for i in range(1, 60):  # three times the history bound, other keys only
                await meta.put(f"/other/{i}", b"x")
            assert member.service.machine.compacted_revision >= start
            assert not watch.done()
            revision = await meta.put("/watched", b"hello")
            events, _ = await asyncio.wait_for(watch, 10)
            assert [(e.kv.key, e.kv.value, e.kv.mod_revision) for e in events] == [
                ("/watched", b"hello", revision)]

    rpc.run(main())
