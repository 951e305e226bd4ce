"""Dead-letter streams (Pulsar's ``DeadLetterPolicy``).

A consumer with ``dead_letter_max_redeliveries`` N delivers a message at most
1 + N times; when it would come again once more (a negative acknowledgement
or an acknowledgement timeout), the message goes to the dead-letter stream
instead, and once it is durable there it is acknowledged on the
subscription. The dead-letter stream is a stream like any other (created
with one partition when missing), named ``<stream>-<subscription>-DLQ``
unless ``dead_letter_stream`` names it (Pulsar's default name). A dead
letter keeps the message's key, value and properties and adds Pulsar's
``REAL_TOPIC`` (the stream it came from) and ``ORIGIN_MESSAGE_ID``
(``partition:ledger:entry:batch``).

The sender is the consumer's own (there is no broker): one task per consumer
sends dead letters in order through a producer it opens on first use and
closes after ``DEAD_LETTER_IDLE_CLOSE_S`` without one, which releases the
stream's writer lease for another consumer of the subscription (a failover
member) that has dead letters of its own; that one waits for the lease up to
the producer's ``lease_wait_ms``. A send that fails is retried with backoff
through a new producer; the message stays unacknowledged meanwhile. A send
the dead-letter stream refuses for good (a ``UsageError``: the message with
the two added properties is over the entry or properties limit) is logged as
``stream_dead_letter_refused`` and the message is handed back to the
consumer, which delivers it again as an ordinary redelivery from then on.

At-least-once, as in Pulsar: a consumer that stops (closed, crashed, or a
failover hand-over) between the send and the persisted acknowledgement has
the message delivered again after a restart, with its redelivery count
starting over, so it can reach the dead-letter stream twice. A consumer's
close waits up to ``DEAD_LETTER_CLOSE_WAIT_S`` for the dead letters queued so
far; what is still unsent then stays unacknowledged and comes again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from quorumlog.errors import QuorumlogError, UsageError
from quorumlog.ledger import LedgerClient
from quorumlog.log import get_logger
from quorumlog.stream._admin import create_stream
from quorumlog.stream._config import StreamConfig
from quorumlog.stream._errors import StreamExistsError, StreamNotFoundError
from quorumlog.stream._layout import check_name
from quorumlog.stream._producer import Producer, ProducerConfig
from quorumlog.stream._reader import Message

log = get_logger(__name__)

DEAD_LETTER_SUFFIX = "-DLQ"
REAL_TOPIC = "REAL_TOPIC"
ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
DEAD_LETTER_IDLE_CLOSE_S = 1.0  # then the writer lease is free for another consumer
DEAD_LETTER_CLOSE_WAIT_S = 5.0  # a consumer's close waits this long for queued dead letters
RETRY_BACKOFF_S_MIN = 0.1
RETRY_BACKOFF_S_MAX = 5.0


def dead_letter_stream_name(stream: str, subscription: str, configured: str = "") -> str:
    """``configured``, or Pulsar's default ``<stream>-<subscription>-DLQ``;
    checked as a stream name, and never the stream itself."""
    name = configured or f"{stream}-{subscription}{DEAD_LETTER_SUFFIX}"
    check_name("dead-letter stream", name)
    if name == stream:
        raise UsageError(f"the dead-letter stream of {stream!r} cannot be {stream!r} itself")
    return name


def origin_message_id(message: Message) -> str:
    position = message.position
    return f"{message.partition}:{position.ledger_id}:{position.entry_id}:{position.batch_index}"


class DeadLetterSender:
    """Sends one consumer's dead letters, in order; ``on_sent`` acknowledges each
    on the subscription once it is durable in the dead-letter stream. A message
    that ``wanted`` no longer accepts when its turn comes (acknowledged
    meanwhile, or its partition handed over) is not sent."""

    def __init__(self, client: LedgerClient, stream: str, name: str, *,
                 on_sent: Callable[[Message], Awaitable[None]],
                 wanted: Callable[[Message], bool],
                 on_refused: Callable[[Message], None]) -> None:
        self._client = client
        self._stream = stream
        self.name = name
        self._on_sent = on_sent
        self._wanted = wanted
        self._on_refused = on_refused
        self._queue: asyncio.Queue[Message] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._producer: Producer | None = None

    def put(self, message: Message) -> None:
        self._queue.put_nowait(message)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self, wait_s: float = DEAD_LETTER_CLOSE_WAIT_S) -> None:
        """Send what is queued (for up to ``wait_s``), then stop; what is still
        unsent stays unacknowledged and comes again."""
        if self._task is not None and not self._task.done():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await self._queue.join()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._close_producer()

    async def _run(self) -> None:
        try:
            while True:
                try:
                    async with asyncio.timeout(DEAD_LETTER_IDLE_CLOSE_S):
                        message = await self._queue.get()
                except TimeoutError:
                    await self._close_producer()
                    if self._queue.empty():
                        return  # put() starts another run
                    continue
                try:
                    if self._wanted(message):
                        if await self._send(message):
                            await self._on_sent(message)
                        else:
                            self._on_refused(message)
                finally:
                    self._queue.task_done()
        finally:
            await self._close_producer()

    async def _send(self, message: Message) -> bool:
        """True once the message is durable in the dead-letter stream; False when
        that stream refuses it for good (or it is no longer wanted)."""
        backoff_s = RETRY_BACKOFF_S_MIN
        properties = {**message.properties, REAL_TOPIC: self._stream,
                      ORIGIN_MESSAGE_ID: origin_message_id(message)}
        while self._wanted(message):
            try:
                if self._producer is None:
                    self._producer = await self._open()
                await self._producer.send(message.value, key=message.key, properties=properties)
                log.info("stream_dead_lettered", stream=self._stream, dead_letter=self.name,
                         message=origin_message_id(message),
                         redeliveries=message.redelivery_count)
                return True
            except UsageError as exc:
                log.error("stream_dead_letter_refused", stream=self._stream,
                          dead_letter=self.name, message=origin_message_id(message),
                          error=exc.message)
                return False
            except QuorumlogError as exc:
                log.warning("stream_dead_letter_failed", stream=self._stream,
                            dead_letter=self.name, message=origin_message_id(message),
                            error=exc.message)
                await self._close_producer()
                await asyncio.sleep(backoff_s)
                backoff_s = min(2 * backoff_s, RETRY_BACKOFF_S_MAX)
        return False

    async def _open(self) -> Producer:
        config = ProducerConfig(batching=False, backlog_interval_ms=0)
        try:
            return await Producer.open(self._client, self.name, config=config)
        except StreamNotFoundError:
            with contextlib.suppress(StreamExistsError):  # another consumer made it
                await create_stream(self._client, self.name, StreamConfig())
            return await Producer.open(self._client, self.name, config=config)

    async def _close_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            with contextlib.suppress(QuorumlogError):
                await producer.close()
