"""The Pythonic surface under trio (issue 18 items 1-3): the decorator, per-message handlers, the message stream,
rebalance callbacks, and a clean shutdown when the scope owning the consumer is cancelled; the pytest fixture
serves trio tests too (pytest-trio)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import trio

from trimq.client import ConsumeOrderlyStatus, Message, MessageExt, MessageQueue, Producer, PushConsumer
from trimq.testing import ThreadedCluster


async def settled(cluster: ThreadedCluster, group: str, topic: str) -> tuple[dict[int, int], dict[int, int], list[Any]]:
    admin = cluster.cluster.admin
    progress = await cluster.acall(admin.consumer_progress, group, topic)
    locks = await cluster.acall(admin.consumer_locks, group)
    return ({q.queue_id: max(q.consumer_offset, 0) for q in progress.queues},
            {q.queue_id: q.broker_offset for q in progress.queues}, locks.locks)


async def test_cancelled_scope_shuts_down_cleanly_and_handlers_retry_in_order(trimq_broker: ThreadedCluster) -> None:
    """A per-message handler registered with ``@consumer.listener(orderly=True)`` that raises is retried in place
    (orderly), before the next message of its queue; cancelling the scope that holds the consumer leaves with
    offsets persisted, locks released and the callbacks told."""
    await trimq_broker.create_topic("TrioOrders", queues=2)
    handled: list[tuple[bytes, int]] = []
    failed: set[bytes] = set()
    events: list[tuple[str, int]] = []
    consumer = PushConsumer(trimq_broker.consumer_config("trio_handlers", suspend_current_queue_time_millis=20))

    @consumer.listener("TrioOrders", orderly=True)
    async def handle(msg: MessageExt) -> None:
        await trio.sleep(0)
        if msg.body.endswith(b":2") and msg.body not in failed:
            failed.add(msg.body)
            raise RuntimeError("try again")
        handled.append((msg.body, msg.reconsume_times))

    consumer.on_assigned(lambda queues: events.append(("assigned", len(queues))))

    @consumer.on_revoked
    async def revoked(queues: list[MessageQueue]) -> None:
        await trio.sleep(0)
        events.append(("revoked", len(queues)))

    async with Producer(trimq_broker.producer_config()) as producer:
        for shard in ("a", "b"):
            for i in range(5):
                await producer.send(Message("TrioOrders", f"{shard}:{i}".encode()), sharding_key=shard)
    with trio.move_on_after(20) as scope:
        async with consumer:
            while len(handled) < 10:
                await trio.sleep(0.01)
            scope.cancel()  # the owner goes away while the consumer runs
            await trio.sleep_forever()
    assert scope.cancelled_caught and not consumer.running
    for key in (b"a", b"b"):
        mine = [(b, r) for b, r in handled if b.startswith(key)]
        assert [b for b, _ in mine] == [key + b":%d" % i for i in range(5)]
        assert dict(mine)[key + b":2"] == 1  # delivered again, in place
    assert events == [("assigned", 2), ("revoked", 2)]
    consumer_offsets, broker_offsets, locks = await settled(trimq_broker, "trio_handlers", "TrioOrders")
    assert consumer_offsets == broker_offsets and sum(broker_offsets.values()) == 10 and not locks


async def test_message_stream_under_trio(trimq_broker: ThreadedCluster) -> None:
    """The default stream is concurrent: each message is its own listener call, so they may arrive in any order
    (CI once saw s0, s2, s1); only orderly=True keeps queue order."""
    await trimq_broker.create_topic("TrioStream", queues=1)
    consumer = PushConsumer(trimq_broker.consumer_config("trio_stream"))
    consumer.subscribe("TrioStream")
    stream = consumer.messages()
    assert consumer.messages() is stream
    got = []
    async with Producer(trimq_broker.producer_config()) as producer, consumer:
        for i in range(3):
            await producer.send(Message("TrioStream", b"s%d" % i, keys=f"k{i}"))
        async for msg in stream:
            async with msg.process():
                got.append((msg.body, msg.keys, msg.message_queue.queue_id))
            if len(got) == 3:
                break
    assert sorted(got) == [(b"s0", "k0", 0), (b"s1", "k1", 0), (b"s2", "k2", 0)]
    assert [m async for m in stream] == []  # ended with the consumer
    consumer_offsets, broker_offsets, _ = await settled(trimq_broker, "trio_stream", "TrioStream")
    assert consumer_offsets == broker_offsets == {0: 3}


def test_plain_handler_and_rocketmq_listener_with_the_decorator(trimq_broker: ThreadedCluster) -> None:
    """From plain threads (a TrioRunner): a plain per-message handler runs in a worker thread; the decorator also
    takes RocketMQ's (msgs, context) listeners; messages() must be chosen before the start."""
    from trimq.client.runner import TrioRunner

    trimq_broker.create_topic_now("TrioPlain", queues=1)
    seen: list[tuple[bytes, bool]] = []
    consumer = PushConsumer(trimq_broker.consumer_config("trio_plain"))

    @consumer.listener("TrioPlain")
    def handle(msg: MessageExt) -> None:
        seen.append((msg.body, threading.current_thread() is threading.main_thread()))

    other = PushConsumer(trimq_broker.consumer_config("trio_plain2"))

    @other.listener("TrioPlain", orderly=True)
    def batch(msgs: list[MessageExt], context: Any) -> ConsumeOrderlyStatus:
        return ConsumeOrderlyStatus.SUCCESS

    assert other.consume_orderly and other._listener is batch
    with TrioRunner() as runner:
        producer = runner.enter(Producer(trimq_broker.producer_config()))
        runner.enter(consumer)
        with pytest.raises(Exception, match="before starting"):
            consumer.messages()
        runner.call(producer.send, Message("TrioPlain", b"p"))
        end = time.monotonic() + 15
        while not seen and time.monotonic() < end:
            time.sleep(0.01)
    assert seen == [(b"p", False)]
