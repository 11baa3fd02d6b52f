"""An asyncio service using trimq: produce and consume without blocking the asyncio event loop.

The SDK is trio code; a :class:`trimq.client.runner.TrioRunner` hosts it in a background thread. From asyncio:

* ``await runner.acall(producer.send, msg)`` sends without blocking the event loop;
* ``runner.enter``/``runner.close`` block while clients start and stop gracefully, so call them through
  ``asyncio.to_thread``;
* the consumer's listener is an ``async def`` running in trio: it hands each message to asyncio with
  ``loop.call_soon_threadsafe`` and returns at once (commit-on-handoff). A listener that must not commit
  before the asyncio side finished would instead wait for an acknowledgement (see docs/EMBEDDING.md).

Run it as is (it starts its own broker with an embedded name server in a temporary directory, through
``trimq.testing.open_broker``) or point it at a running one::

    python docs/examples/asyncio_service.py
    python docs/examples/asyncio_service.py --namesrv 127.0.0.1:9876
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from trimq.client import (
    ConsumeConcurrentlyStatus,
    Message,
    MessageExt,
    Producer,
    ProducerConfig,
    PushConsumer,
    PushConsumerConfig,
)
from trimq.client.admin import open_admin
from trimq.client.runner import TrioRunner
from trimq.runtime.logs import configure_logging

TOPIC = "ExampleEvents"


async def service(namesrv: str | None, count: int) -> int:
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[MessageExt] = asyncio.Queue()
    runner = TrioRunner()
    await asyncio.to_thread(runner.start)
    try:
        if namesrv is None:
            from trimq.testing import open_broker

            cluster = await asyncio.to_thread(runner.enter, open_broker())
            namesrv = cluster.namesrv_addr
        admin = await asyncio.to_thread(runner.enter, open_admin(namesrv))
        await runner.acall(admin.ensure_topic, TOPIC, 4)
        producer = await asyncio.to_thread(
            runner.enter, Producer(ProducerConfig(namesrv_addr=namesrv, producer_group="asyncio_producer")))

        async def listener(msgs: list[MessageExt], context: Any) -> ConsumeConcurrentlyStatus:
            for m in msgs:  # runs in the trio thread: hand over to asyncio, thread-safely
                loop.call_soon_threadsafe(inbox.put_nowait, m)
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

        consumer = PushConsumer(PushConsumerConfig(namesrv_addr=namesrv, consumer_group="asyncio_consumer",
                                                   consume_from_where="CONSUME_FROM_FIRST_OFFSET"))
        consumer.subscribe(TOPIC, "*")
        consumer.register_message_listener_concurrently(listener)
        await asyncio.to_thread(runner.enter, consumer)

        results = await asyncio.gather(*[runner.acall(producer.send, Message(TOPIC, f"event {i}".encode()))
                                         for i in range(count)])
        print(f"sent {len(results)} messages from asyncio")

        seen: set[bytes] = set()
        try:
            async with asyncio.timeout(30):
                while len(seen) < count:
                    seen.add((await inbox.get()).body)
        except TimeoutError:
            pass
        print(f"asyncio received {len(seen)} of {count} distinct messages")
        return 0 if len(seen) == count else 1
    finally:
        await asyncio.to_thread(runner.close)  # graceful: consumer, producer, broker, then the loop


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--namesrv", help="name server HOST:PORT (default: start a broker in a temp dir)")
    ap.add_argument("--count", type=int, default=100, help="messages to send")
    args = ap.parse_args()
    configure_logging("console", "warning")
    return asyncio.run(service(args.namesrv, args.count))


if __name__ == "__main__":
    raise SystemExit(main())
