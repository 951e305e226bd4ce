"""The background trimmer: retention and TTL applied continuously.

After Pulsar's broker retention check (``retentionCheckIntervalInSeconds``,
120 s): a stream's retention and TTL must hold without anyone calling
``trim``. Every bookie node runs a candidate; one at a time holds
:data:`TRIMMER_KEY`, an ephemeral meta key of its :class:`~quorumlog.meta.OwnedSession`
(a SIGKILLed holder loses it after ``lease_ttl_ms``, and another candidate
takes over at its next round). Every ``check_interval_ms`` the holder runs
``trim`` on every stream: TTL moves cursors, retention removes the ledgers
every cursor has passed, the trash of a crashed trim is emptied and orphaned
Spark write ledgers are deleted (docs/stream.md, "Retention and TTL"). Then a
stream with an offload policy (``StreamConfig.offload``) has up to
``offload_ledgers_per_round_max`` of its closed ledgers past the policy's
threshold offloaded to its target (docs/stream.md, "Tiered storage"), and a
stream with a compaction threshold (``StreamConfig.compaction_threshold_bytes``)
has each partition whose closed ledgers after the compaction horizon hold
more than it compacted (docs/stream.md, "Topic compaction").

Trim is safe to run concurrently with a manual ``quorumlog stream trim``:
each step is a compare-and-swap on the partition's head, and deleting a
ledger twice is a no-op. A stream that fails to trim (meta unavailable, a
stream deleted meanwhile) is logged and counted; the others go on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from quorumlog.config import Config, require
from quorumlog.errors import QuorumlogError
from quorumlog.ledger import LedgerClient
from quorumlog.log import get_logger
from quorumlog.meta import OwnedSession
from quorumlog.stream._admin import list_streams, trim_stream
from quorumlog.stream._compaction import compact_by_policy
from quorumlog.stream._errors import StreamNotFoundError
from quorumlog.stream._meta import load_record
from quorumlog.stream._metrics import trimmer_metrics
from quorumlog.stream._offload import offload_by_policy

_log = get_logger(__name__)

TRIMMER_KEY = "/stream-trimmer"
"""The ephemeral key of the node that trims (its value: the node's address)."""


async def trimmer_holder(client: LedgerClient) -> str:
    """The address of the node that holds the trimmer lease ("": none elected)."""
    kv = await client.meta.get(TRIMMER_KEY)
    return "" if kv is None else bytes(kv.value).decode()


class TrimmerConfig(Config, frozen=True):
    """``[trimmer]`` in a bookie node's TOML file."""

    # Run a trimmer candidate on this node (the elected one trims every stream).
    enabled: bool = True
    # How often the elected trimmer applies retention and TTL to every stream
    # (Pulsar's retentionCheckIntervalInSeconds = 120): data a policy frees is
    # deleted at most this long (plus one round's work) after it is freed.
    check_interval_ms: int = 120_000
    # The trimmer's lease lives in a meta session of this TTL: a SIGKILLed
    # trimmer is replaced after at most this long plus one check interval.
    lease_ttl_ms: int = 4_000
    # Streams trimmed at once: a round is mostly meta round trips, a few per
    # partition, so it overlaps them; bounded so that a round over many
    # streams does not flood meta.
    streams_in_flight_max: int = 8
    # Ledgers a round offloads per stream with an offload policy (one at a
    # time): bounds how long one stream's offload holds a round; the rest
    # follow at the next rounds.
    offload_ledgers_per_round_max: int = 16

    def validate(self) -> None:
        require(self.check_interval_ms > 0, "[trimmer] check_interval_ms must be positive")
        require(self.lease_ttl_ms >= 500, "[trimmer] lease_ttl_ms must be >= 500")
        require(self.streams_in_flight_max >= 1,
                "[trimmer] streams_in_flight_max must be positive")
        require(self.offload_ledgers_per_round_max >= 0,
                "[trimmer] offload_ledgers_per_round_max must be >= 0 (0: no automatic "
                "offload on this node)")


@dataclass(slots=True)
class TrimRound:
    """What one round of the elected trimmer did."""

    streams: int = 0
    deleted_ledgers: list[int] = field(default_factory=list)
    expired_cursors: int = 0
    offloaded_ledgers: list[int] = field(default_factory=list)
    compacted: list[tuple[str, int]] = field(default_factory=list)  # (stream, partition)
    failed: dict[str, str] = field(default_factory=dict)  # stream -> error


class StreamTrimmer:
    """A trimmer candidate (see the module docstring)."""

    def __init__(self, node_id: str, meta_addresses: Sequence[str],
                 config: TrimmerConfig) -> None:
        config.validate()
        self.node_id = node_id
        self._addresses = list(meta_addresses)
        self._config = config
        self._client: LedgerClient | None = None
        self._owns_client = False
        self._session: OwnedSession | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.start_with(await LedgerClient.connect(self._addresses), owned=True)

    def start_with(self, client: LedgerClient, *, owned: bool = False) -> None:
        """Run the candidate on ``client`` (closed by :meth:`close` when ``owned``)."""
        self._client = client
        self._owns_client = owned
        self._session = OwnedSession(client.meta, self._config.lease_ttl_ms, owner="trimmer")
        self._task = asyncio.get_running_loop().create_task(self._run(), name="stream-trimmer")

    async def elected(self) -> bool:
        """Hold (or take) the trimmer lease; False while another node holds it."""
        assert self._session is not None
        return await self._session.hold(TRIMMER_KEY, self.node_id.encode())

    async def trim_once(self) -> TrimRound:
        """Trim every stream once (the caller holds the lease)."""
        client = self._client
        assert client is not None
        out = TrimRound()
        metrics = trimmer_metrics()
        names = iter(await list_streams(client))

        async def trim_each() -> None:  # one of streams_in_flight_max workers
            for name in names:
                out.streams += 1
                try:
                    report = await trim_stream(client, name)
                except StreamNotFoundError:
                    continue  # deleted (or being deleted) since the list was read
                except QuorumlogError as exc:
                    out.failed[name] = exc.message
                    metrics.failures += 1
                    _log.warning("stream_trim_failed", stream=name, error=exc.message)
                    continue
                out.deleted_ledgers += (report.deleted_ledgers + report.orphans_deleted
                                        + report.offloaded_copies_deleted)
                out.expired_cursors += report.expired_cursors
                await offload_each(name)
                await compact_each(name)

        async def offload_each(name: str) -> None:
            if self._config.offload_ledgers_per_round_max == 0:
                return
            try:
                record = await load_record(client.meta, name)
                outcomes = await offload_by_policy(
                    client, record, ledgers_max=self._config.offload_ledgers_per_round_max)
            except StreamNotFoundError:
                return
            except QuorumlogError as exc:
                out.failed[name] = exc.message
                metrics.offload_failures += 1
                _log.warning("stream_offload_failed", stream=name, error=exc.message)
                return
            done = [o.ledger_id for o in outcomes if o.status == "offloaded"]
            out.offloaded_ledgers += done
            metrics.offloaded_ledgers += len(done)

        async def compact_each(name: str) -> None:
            try:
                record = await load_record(client.meta, name)
                outcomes = await compact_by_policy(client, record)
            except StreamNotFoundError:
                return
            except QuorumlogError as exc:
                out.failed[name] = exc.message
                metrics.compaction_failures += 1
                _log.warning("stream_compaction_failed", stream=name, error=exc.message)
                return
            done = [(name, o.partition) for o in outcomes if o.compacted]
            out.compacted += done
            metrics.compacted_partitions += len(done)

        await asyncio.gather(*(trim_each() for _ in range(self._config.streams_in_flight_max)))
        metrics.rounds += 1
        metrics.deleted_ledgers += len(out.deleted_ledgers)
        if out.deleted_ledgers or out.expired_cursors or out.offloaded_ledgers or out.compacted:
            _log.info("stream_trimmer_round", streams=out.streams,
                      deleted_ledgers=len(out.deleted_ledgers),
                      expired_cursors=out.expired_cursors,
                      offloaded_ledgers=len(out.offloaded_ledgers),
                      compacted_partitions=len(out.compacted), failed=len(out.failed))
        return out

    async def _run(self) -> None:
        """A round every ``check_interval_ms``, the first one interval after the
        start (as Pulsar schedules its retention check)."""
        interval_s = self._config.check_interval_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            try:
                if await self.elected():
                    await self.trim_once()
            except QuorumlogError as exc:
                _log.warning("stream_trimmer_round_failed", error=exc.message)
            except Exception:  # a bug: say so, and keep trimming at the next round
                _log.exception("stream_trimmer_round_crashed", trimmer=self.node_id)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._session is not None:
            await self._session.close()  # the lease goes with the session
        if self._client is not None and self._owns_client:
            await self._client.close()
