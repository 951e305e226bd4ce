"""A producer or consumer in its own process, for crash tests (the parent SIGKILLs it).

    python stream_child.py produce META STREAM      # sends v0, v1, ... forever
    python stream_child.py consume META STREAM SUB  # receives and acks forever
    python stream_child.py consume META STREAM SUB NAME  # the same as failover consumer NAME

Each acknowledged send / persisted ack is printed as one JSON line (flushed),
so the parent knows exactly what the child was told was durable.
"""

from __future__ import annotations

import json
import sys

from quorumlog import rpc
from quorumlog.log import configure
from quorumlog.stream import ConsumerConfig, StreamClient


async def produce(meta: list[str], stream: str) -> None:
    async with await StreamClient.connect(meta) as client:
        producer = await client.producer(stream)
        i = 0
        while True:
            message_id = await producer.send(b"v%d" % i, key=b"k%d" % (i % 7))
            print(json.dumps({"value": f"v{i}", "partition": message_id.partition,
                              **message_id.position.to_json()}), flush=True)
            i += 1


async def consume(meta: list[str], stream: str, subscription: str, name: str) -> None:
    async with await StreamClient.connect(meta) as client:
        consumer = await client.subscribe(stream, subscription, config=ConsumerConfig(
            initial_position="earliest", ack_flush_ms=0, lease_ttl_ms=1000,
            subscription_type="failover" if name else "exclusive", consumer_name=name))
        print(json.dumps({"ready": True}), flush=True)
        while True:
            message = await consumer.receive()
            assert message is not None
            if name:
                print(json.dumps({"received": message.value.decode(),
                                  "partition": message.partition}), flush=True)
            # Ack every message except those whose value ends in 3 (left unacked).
            if not message.value.endswith(b"3"):
                # Killed between the two lines, the parent cannot know whether
                # the ack was persisted: the message may or may not come again.
                print(json.dumps({"acking": message.value.decode()}), flush=True)
                await consumer.ack(message)
                print(json.dumps({"acked": message.value.decode()}), flush=True)
            else:
                print(json.dumps({"skipped": message.value.decode()}), flush=True)


if __name__ == "__main__":
    configure("WARNING")  # logs to stderr; stdout carries only the JSON lines
    mode, meta_arg, stream_arg = sys.argv[1:4]
    addresses = meta_arg.split(",")
    if mode == "produce":
        rpc.run(produce(addresses, stream_arg))
    else:
        rpc.run(consume(addresses, stream_arg, sys.argv[4], "".join(sys.argv[5:6])))
