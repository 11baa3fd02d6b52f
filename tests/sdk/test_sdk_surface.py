"""The Pythonic surface's rules without a broker (issue 18 item 2): which functions are per-message handlers,
what a handler's outcome becomes as a RocketMQ status, what a message stream's settled batch returns, and the
pytest plugin's markers."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import trio

from trimq.client import (
    ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    MessageExt,
    MessageQueue,
    PushConsumer,
    PushConsumerConfig,
)
from trimq.client.push_consumer import _takes_one_message, per_message_listener
from trimq.client.stream import MessageStream
from trimq.testing import ThreadedCluster

MQ = MessageQueue("T", "broker-a", 0)


def msg(i: int) -> MessageExt:
    return MessageExt("T", b"m%d" % i, 0, {}, 0, i, 0, 0, 0, ("127.0.0.1", 1), 0, ("127.0.0.1", 2), 0, 0, 0, 0,
                      f"id{i}")


def test_one_positional_argument_makes_a_per_message_handler() -> None:
    def one(m: Any) -> None: ...
    async def one_async(m: Any, *, flag: bool = False) -> None: ...
    def two(msgs: Any, ctx: Any) -> None: ...
    def var(*args: Any) -> None: ...
    def optional_second(m: Any, ctx: Any = None) -> None: ...

    class Handler:
        async def __call__(self, m: Any) -> None: ...

    assert _takes_one_message(one) and _takes_one_message(one_async) and _takes_one_message(Handler())
    assert _takes_one_message(functools.partial(two, [1]))
    assert not any(_takes_one_message(f) for f in (two, var, optional_second, print))


async def test_per_message_handler_outcomes() -> None:
    seen: list[bytes] = []

    async def handler(m: MessageExt) -> Any:
        seen.append(m.body)
        if m.body == b"m2":
            raise ValueError("bad message")
        return False if m.body == b"m3" else None

    concurrently = per_message_listener(handler, orderly=False)
    ctx = ConsumeConcurrentlyContext(MQ)
    assert await concurrently([msg(0), msg(1)], ctx) is ConsumeConcurrentlyStatus.CONSUME_SUCCESS
    assert ctx.ack_index > 1
    # a failure after the first message: the ones before it are consumed, it and the rest retried
    assert await concurrently([msg(0), msg(1), msg(2), msg(4)], ctx) is ConsumeConcurrentlyStatus.CONSUME_SUCCESS
    assert ctx.ack_index == 1 and seen[-1] == b"m2"
    with pytest.raises(ValueError):  # the first message: the consume service sees (and logs) the exception
        await concurrently([msg(2)], ConsumeConcurrentlyContext(MQ))
    assert await concurrently([msg(3)], ConsumeConcurrentlyContext(MQ)) is ConsumeConcurrentlyStatus.RECONSUME_LATER

    orderly = per_message_listener(handler, orderly=True)
    assert await orderly([msg(0)], ConsumeOrderlyContext(MQ)) is ConsumeOrderlyStatus.SUCCESS
    assert await orderly([msg(0), msg(3)], ConsumeOrderlyContext(MQ)) is \
        ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
    with pytest.raises(ValueError):  # orderly: the whole batch again, in place
        await orderly([msg(0), msg(2)], ConsumeOrderlyContext(MQ))

    def plain(m: MessageExt) -> Any:
        return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT

    assert per_message_listener(plain, orderly=True)([msg(0)], ConsumeOrderlyContext(MQ)) is \
        ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT


async def test_stream_statuses_follow_the_settled_messages() -> None:
    stream = MessageStream()
    results: list[Any] = []
    contexts = [ConsumeConcurrentlyContext(MQ) for _ in range(3)]

    async def call(i: int, msgs: list[MessageExt]) -> None:
        results.append((i, await stream(msgs, contexts[i])))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call, 0, [msg(0), msg(1), msg(2)])
        await trio.testing.wait_all_tasks_blocked()
        got = [await stream.__anext__() for _ in range(3)]
        assert [r.body for r in got] == [b"m0", b"m1", b"m2"] and len(stream) == 0
        got[0].ack()
        got[2].ack()
        assert got[1].nack() and not got[1].ack()  # the first settlement wins
        await trio.testing.wait_all_tasks_blocked()
        assert results == [(0, ConsumeConcurrentlyStatus.CONSUME_SUCCESS)] and contexts[0].ack_index == 0

        nursery.start_soon(call, 1, [msg(3)])
        await trio.testing.wait_all_tasks_blocked()
        async with (await stream.__anext__()).process():
            pass
        nursery.start_soon(call, 2, [msg(4), msg(5)])
        await trio.testing.wait_all_tasks_blocked()
        first = await stream.__anext__()
        with pytest.raises(RuntimeError):
            async with first.process():
                raise RuntimeError("handler failed")
        stream.close()  # shutdown: the message not handed out is given up, the iteration ends
    assert results[1:] == [(1, ConsumeConcurrentlyStatus.CONSUME_SUCCESS),
                           (2, ConsumeConcurrentlyStatus.RECONSUME_LATER)]
    assert first.state == "nacked" and [m async for m in stream] == []

    orderly = MessageStream(orderly=True)
    orderly.close()
    assert await orderly([msg(0)], ConsumeOrderlyContext(MQ)) is ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT


def test_registration_rules() -> None:
    consumer = PushConsumer(PushConsumerConfig(consumer_group="g", namesrv_addr="127.0.0.1:1"))
    stream = consumer.messages(orderly=True)
    assert consumer.consume_orderly and consumer.messages() is stream
    with pytest.raises(Exception, match="orderly=True"):
        consumer.messages(orderly=False)
    with pytest.raises(TypeError):
        consumer.on_assigned("not callable")  # type: ignore[type-var]  # deliberately not a callable


@pytest.mark.trimq_broker(broker_name="broker-x")
def test_the_broker_fixture_takes_settings_from_its_marker(trimq_broker: ThreadedCluster) -> None:
    assert list(trimq_broker.broker_addrs) == ["broker-x"]
    assert trimq_broker.create_topic_now("Marked", queues=2).routed
