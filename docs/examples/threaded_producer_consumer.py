"""A plain threaded program using trimq: no trio, no asyncio in sight.

A :class:`trimq.client.runner.TrioRunner` hosts the SDK's trio loop in a background thread. The program's own
threads send with ``runner.call`` (blocking), and the consumer's listener is a plain ``def``: the SDK runs
it in worker threads, so it may block (database calls, ``time.sleep``) without stalling anything.

Run it as is (it starts its own broker with an embedded name server in a temporary directory, through
``trimq.testing.open_broker``) or point it at a running one::

    python docs/examples/threaded_producer_consumer.py
    python docs/examples/threaded_producer_consumer.py --namesrv 127.0.0.1:9876 --count 1000
"""

from __future__ import annotations

import argparse
import functools
import threading
from collections import defaultdict
from contextlib import ExitStack
from typing import Any

from trimq.client import (
    ConsumeOrderlyStatus,
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

TOPIC = "ExampleOrders"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--namesrv", help="name server HOST:PORT (default: start a broker in a temp dir)")
    ap.add_argument("--count", type=int, default=200, help="messages to send")
    ap.add_argument("--orders", type=int, default=10, help="distinct order ids (keys)")
    args = ap.parse_args()
    configure_logging("console", "warning")

    received: dict[str, list[int]] = defaultdict(list)
    lock = threading.Lock()
    all_received = threading.Event()

    def on_messages(msgs: list[MessageExt], context: Any) -> ConsumeOrderlyStatus:
        """Runs in a worker thread; one queue's messages arrive one call at a time, in order."""
        with lock:
            for m in msgs:
                order_id, step = m.body.decode().split(":")
                received[order_id].append(int(step))
            if sum(map(len, received.values())) >= args.count:
                all_received.set()
        return ConsumeOrderlyStatus.SUCCESS

    with ExitStack() as stack:
        runner = stack.enter_context(TrioRunner())
        namesrv = args.namesrv
        if namesrv is None:
            from trimq.testing import open_broker

            namesrv = runner.enter(open_broker()).namesrv_addr
        admin = runner.enter(open_admin(namesrv))
        runner.call(admin.ensure_topic, TOPIC, 8)  # a fixed queue count keeps key -> queue stable
        producer = runner.enter(Producer(ProducerConfig(namesrv_addr=namesrv, producer_group="example_producer")))

        consumer = PushConsumer(PushConsumerConfig(namesrv_addr=namesrv, consumer_group="example_consumer",
                                                   consume_from_where="CONSUME_FROM_FIRST_OFFSET"))
        consumer.subscribe(TOPIC, "*")
        consumer.register_message_listener_orderly(on_messages)  # a plain def: runs in worker threads
        runner.enter(consumer)  # starts it; closing the runner shuts it down gracefully

        def send_orders(first: int, step: int) -> None:
            # Each order id is sent by one thread, step after step: its messages are stored in order.
            for order in range(first, args.orders, step):
                for n in range(args.count // args.orders):
                    order_id = f"order-{order}"
                    send = functools.partial(producer.send, sharding_key=order_id)  # the order's queue
                    runner.call(send, Message(TOPIC, f"{order_id}:{n}".encode(), keys=order_id))

        senders = [threading.Thread(target=send_orders, args=(i, 2)) for i in range(2)]
        for t in senders:
            t.start()
        for t in senders:
            t.join()
        ok = all_received.wait(30)
    # leaving the stack: consumer, producer and broker exit in reverse order, then the loop stops

    in_order = all(steps == sorted(steps) for steps in received.values())
    total = sum(map(len, received.values()))
    print(f"received {total} of {args.count} messages for {len(received)} orders; per-order order kept: {in_order}")
    return 0 if ok and in_order else 1


if __name__ == "__main__":
    raise SystemExit(main())
