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
    """Writes to other keys do not wake a parked watch, and the write that
    does wake it names its revision: the watch looks from there. So writes to
    other keys that push the watch's start revision out of the bounded history
    do not fail it (before session 10, each wake-up rescanned from the
    request's start: the whole history since then, and CompactedError once it
    was dropped)."""
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


class _Scans:
    """Counts a state machine's ``events_since`` calls (one per look of a watch)."""

    def __init__(self, machine: object) -> None:
        self.calls = 0
        self._inner = machine.events_since  # type: ignore[attr-defined]

    def __call__(self, *args: object, **kwargs: object) -> object:
        self.calls += 1
        return self._inner(*args, **kwargs)


def test_writes_to_other_keys_do_not_wake_parked_watches(tmp_path: Path) -> None:
    """Parked watches are kept by key and prefix (etcd's watcher groups): a
    write wakes only the watches it touches. Before, every applied pass woke
    every parked watch, which then scanned the new revisions: a cost per
    write times the watches parked, on every meta member."""
    async def main() -> None:
        limits = MetaLimits(history_events_max=20)
        async with one_member(tmp_path, limits=limits) as member, \
                MetaClient([member.address]) as meta:
            scans = _Scans(member.service.machine)
            member.service.machine.events_since = scans  # type: ignore[method-assign, assignment]
            start = await meta.put("/other/0", b"x") + 1
            on_key = asyncio.ensure_future(
                meta.watch_once("/watched/a", start_revision=start, wait_ms=20_000))
            on_prefix = asyncio.ensure_future(
                meta.watch_once("/watched/", prefix=True, start_revision=start, wait_ms=20_000))
            quiet = asyncio.ensure_future(
                meta.watch_once("/quiet", start_revision=start, wait_ms=1_500))
            await wait_until(lambda: member.service._watches_open == 3, what="watches parked")
            looked = scans.calls
            for i in range(1, 60):  # three times the history bound, other keys only
                await meta.put(f"/other/{i}", b"x")
            assert scans.calls == looked, "a write to another key woke a parked watch"
            assert member.service.machine.compacted_revision >= start
            revision = await meta.put("/watched/b", b"under the prefix")
            events, _ = await asyncio.wait_for(on_prefix, 10)
            assert [(e.kv.key, e.kv.mod_revision) for e in events] == [("/watched/b", revision)]
            assert not on_key.done()
            revision = await meta.put("/watched/a", b"the key")
            events, _ = await asyncio.wait_for(on_key, 10)
            assert [(e.kv.key, e.kv.mod_revision) for e in events] == [("/watched/a", revision)]
            # A watch that no write touched ends at its deadline with no event
            # and the current revision, though its start left the history.
            events, at = await asyncio.wait_for(quiet, 10)
            assert events == [] and at == member.service.machine.revision

    rpc.run(main())


def test_concurrent_writes_share_log_entries_and_keep_their_own_revisions(
    tmp_path: Path,
) -> None:
    """The writes a leader queues before a ready pass are combined into one
    log entry (``MetaService._on_write``, ``raft.combine_msgpack``): fewer
    entries than writes, yet each write is answered with its own revision,
    and a watch sees every one of them, in order."""
    async def main() -> None:
        async with one_member(tmp_path) as member, MetaClient([member.address]) as meta:
            start = await meta.put("/warm", b"x") + 1
            machine = member.service.machine
            first_index = machine.applied_index
            count = 200
            revisions = await asyncio.gather(
                *(meta.put(f"/c/{i}", b"%d" % i) for i in range(count)))
            assert sorted(revisions) == list(range(start, start + count))
            assert machine.applied_index - first_index < count
            for i, revision in enumerate(revisions):
                kv = machine.get(f"/c/{i}")
                assert kv is not None and (kv.value, kv.mod_revision) == (b"%d" % i, revision)
            seen: list[tuple[str, int]] = []

            async def watch_all() -> None:
                while len(seen) < count:
                    events, _ = await meta.watch_once(
                        "/c/", prefix=True, start_revision=start + len(seen), wait_ms=1_000)
                    seen.extend((e.kv.key, e.kv.mod_revision) for e in events)

            await asyncio.wait_for(watch_all(), 30)
            assert seen == sorted(((f"/c/{i}", r) for i, r in enumerate(revisions)),
                                  key=lambda pair: pair[1])

    rpc.run(main())
