"""Fencing your own writes with the queue lock's epoch (docs/EMBEDDING.md "Fencing your own writes").

An orderly listener that writes somewhere else (a database, another service) can be overtaken by its own past:
a consumer that was paused (a GC pause, a stopped VM, a partition) past its lease wakes up in the middle of a
batch and writes, while the queue already belongs to another consumer that has written newer rows. The broker
fences the *offset commits* of such a consumer; the same token, ``context.lock_epoch``, fences your writes: it
only grows per (consumer group, queue), across broker restarts too, so a store that remembers the highest
epoch it has seen per queue refuses every write carrying a lower one.

Here the store is SQLite (one transaction per write: read the queue's fence, refuse or raise it, insert). A
consumer ``first`` consumes both queues, leaves; ``second`` takes them over and consumes more; then a write
carrying ``first``'s epoch — what ``first`` would send if it had been paused instead of leaving — is refused.

Run it as is (it starts its own broker, with ``trimq.testing.open_broker``)::

    python docs/examples/fenced_writes.py
"""

from __future__ import annotations

import sqlite3
import sys
from typing import Any

import trio

from trimq.client import ConsumeOrderlyStatus, Message, MessageExt, Producer, PushConsumer
from trimq.client.selectors import select_by_hash
from trimq.runtime.logs import configure_logging
from trimq.testing import open_broker

TOPIC = "FencedOrders"
GROUP = "billing"


class FencedStore:
    """Rows written by consumers, fenced per queue by the lock epoch they were consumed under."""

    def __init__(self) -> None:
        self.db = sqlite3.connect(":memory:")
        self.db.execute("CREATE TABLE fence (queue TEXT PRIMARY KEY, epoch INTEGER NOT NULL)")
        self.db.execute("CREATE TABLE orders (queue TEXT, queue_offset INTEGER, body TEXT, epoch INTEGER)")
        self.refused = 0

    def write(self, queue: str, epoch: int, queue_offset: int, body: str) -> bool:
        """Insert a row unless a write with a newer epoch for ``queue`` came first; one transaction."""
        with self.db:
            row = self.db.execute("SELECT epoch FROM fence WHERE queue = ?", (queue,)).fetchone()
            if row is not None and row[0] > epoch:
                self.refused += 1
                return False  # an older holder of the queue: its lease ended and someone else wrote since
            self.db.execute("INSERT INTO fence (queue, epoch) VALUES (?, ?) "
                            "ON CONFLICT (queue) DO UPDATE SET epoch = excluded.epoch", (queue, epoch))
            self.db.execute("INSERT INTO orders VALUES (?, ?, ?, ?)", (queue, queue_offset, body, epoch))
        return True

    def count(self) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM orders").fetchone()[0])


async def main() -> int:
    store = FencedStore()
    epochs: dict[str, dict[str, int]] = {"first": {}, "second": {}}

    def listener_for(name: str) -> Any:
        async def listener(msgs: list[MessageExt], context: Any) -> ConsumeOrderlyStatus:
            queue = f"{context.message_queue.broker_name}/{context.message_queue.queue_id}"
            for m in msgs:
                if not store.write(queue, context.lock_epoch, m.queue_offset, m.body.decode()):
                    # Refused: this consumer lost the queue. Do not commit; the batch is not ours any more.
                    return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
            epochs[name][queue] = context.lock_epoch
            return ConsumeOrderlyStatus.SUCCESS
        return listener

    async with open_broker() as cluster:
        await cluster.create_topic(TOPIC, queues=2)
        async with Producer(cluster.producer_config()) as producer:

            async def send(n: int, tag: str) -> None:
                for i in range(n):
                    key = f"order-{i % 4}"
                    await producer.send(Message(TOPIC, f"{tag}-{i}".encode(), keys=key),
                                        selector=select_by_hash, arg=key)

            async def run(name: str, sent_total: int) -> None:
                consumer = PushConsumer(cluster.consumer_config(GROUP, consume_from_where="CONSUME_FROM_FIRST_OFFSET"))
                consumer.subscribe(TOPIC, "*")
                consumer.register_message_listener_orderly(listener_for(name))
                async with consumer:  # leaving it: graceful shutdown, the queues are unlocked at once
                    with trio.fail_after(30):
                        while store.count() < sent_total:
                            await trio.sleep(0.05)

            await send(20, "a")
            await run("first", 20)
            await send(20, "b")
            await run("second", 40)

    print(f"rows written: {store.count()}; epochs of first: {epochs['first']}; of second: {epochs['second']}")
    queue, old_epoch = sorted(epochs["first"].items())[0]
    late = store.write(queue, old_epoch, 0, "late write of a paused ex-holder")
    print(f"a late write with first's epoch {old_epoch} on {queue}: {'accepted' if late else 'refused'}")
    ok = (store.count() == 40 and not late and store.refused == 1
          and all(epochs["second"][q] > e for q, e in epochs["first"].items() if q in epochs["second"]))
    print("fenced writes: OK" if ok else "fenced writes: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    configure_logging("console", "warning")
    sys.exit(trio.run(main))
