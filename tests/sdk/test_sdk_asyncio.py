"""The SDK native on asyncio (issue 18 item 1): Producer and PushConsumer entered in a running asyncio loop run in
a trio guest run of that loop; asyncio listeners run as tasks of the host loop (in its thread, with asyncio's
task, contextvars and sniffio), plain ones in worker threads; leaving ``async with``, or cancelling the asyncio
task that owns the consumer, persists offsets, releases queue locks and leaves the group.

The broker is the ``trimq_broker`` fixture (trimq.testing.pytest_plugin: a real broker in a background thread),
so nothing of the SDK under test shares a loop with it."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import pytest
import sniffio

from trimq.client import (
    ConsumeConcurrentlyStatus,
    Message,
    MessageExt,
    MessageQueue,
    Producer,
    PushConsumer,
)
from trimq.client import aio as client_aio
from trimq.client.admin import AdminError
from trimq.client.stream import ReceivedMessage
from trimq.testing import ThreadedCluster

T = TypeVar("T")
REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("REQUEST_ID", default="unset")


def run(main: Callable[[], Awaitable[T]], timeout_s: float = 30.0) -> T:
    async def bounded() -> T:
        async with asyncio.timeout(timeout_s):
            return await main()

    return asyncio.run(bounded())


async def wait_until(predicate: Callable[[], bool], timeout_s: float = 15.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.01)


def settled(cluster: ThreadedCluster, group: str, topic: str) -> tuple[dict[int, int], dict[int, int], list[Any]]:
    """(consumer offset by queue, broker offset by queue, the group's queue locks) as the broker has them."""
    admin = cluster.cluster.admin
    progress = cluster.call(admin.consumer_progress, group, topic)
    locks = cluster.call(admin.consumer_locks, group)
    return ({q.queue_id: max(q.consumer_offset, 0) for q in progress.queues},  # -1: never committed (empty)
            {q.queue_id: q.broker_offset for q in progress.queues}, locks.locks)


def test_producer_and_consumer_run_in_the_asyncio_loop(trimq_broker: ThreadedCluster) -> None:
    """An asyncio listener runs as a task of the host loop, in its thread, and may await asyncio; the entering
    task's contextvars reach it; rebalance callbacks are asyncio code too; sends are awaited from asyncio."""
    trimq_broker.create_topic_now("AioOrders", queues=4)
    main_thread = threading.get_ident()
    seen: list[tuple[bytes, str | None]] = []
    facts: list[tuple[bool, bool, str, str]] = []
    assigned: list[list[MessageQueue]] = []
    revoked: list[list[MessageQueue]] = []

    async def main() -> None:
        REQUEST_ID.set("from-the-entering-task")
        consumer = PushConsumer(trimq_broker.consumer_config("aio_group"))

        @consumer.listener("AioOrders", "*", orderly=True)
        async def on_order(msg: MessageExt) -> None:
            facts.append((threading.get_ident() == main_thread, asyncio.current_task() is not None,
                          sniffio.current_async_library(), REQUEST_ID.get()))
            if len(seen) % 2:
                async with asyncio.timeout(5):  # needs its own task: the eager first step runs as that task
                    await asyncio.sleep(0.001)  # suspends: carried on by the asyncio task, not in trio's step
            seen.append((msg.body, msg.properties.get("__SHARDINGKEY")))

        @consumer.on_assigned
        async def on_assigned(queues: list[MessageQueue]) -> None:
            await asyncio.sleep(0)
            assigned.append(queues)

        consumer.on_revoked(revoked.append)
        async with Producer(trimq_broker.producer_config()) as producer, consumer:
            async def send_order(key: str) -> None:  # one key's sends in sequence, the keys concurrently
                for i in range(10):
                    await producer.send(Message("AioOrders", f"{key}:{i}".encode()), sharding_key=key)

            await asyncio.gather(*[send_order(f"order-{k}") for k in range(3)])
            await wait_until(lambda: len(seen) >= 30)
        assert client_aio._HOSTS == {}  # the last client out ended the loop's guest run

    run(main)
    assert all(f == (True, True, "asyncio", "from-the-entering-task") for f in facts), facts[:3]
    by_key: dict[str, list[int]] = {}
    for body, key in seen:
        k, i = body.decode().split(":")
        assert key == k
        by_key.setdefault(k, []).append(int(i))
    assert all(v == sorted(v) for v in by_key.values()) and sum(map(len, by_key.values())) == 30
    assert [len(q) for q in assigned] == [4] and [len(q) for q in revoked] == [4]
    consumer_offsets, broker_offsets, locks = settled(trimq_broker, "aio_group", "AioOrders")
    assert consumer_offsets == broker_offsets and not locks


@pytest.mark.trimq_cluster(brokers=2)
def test_plain_listener_runs_in_a_worker_thread_and_async_hooks_in_the_loop(trimq_cluster: ThreadedCluster) -> None:
    trimq_cluster.create_topic_now("AioPlain", queues=2)
    threads: list[int] = []
    hooks: list[str] = []

    async def main() -> None:
        consumer = PushConsumer(trimq_cluster.consumer_config("aio_plain"))
        consumer.subscribe("AioPlain")

        async def after(ctx: dict[str, Any]) -> None:
            await asyncio.sleep(0)
            hooks.append(sniffio.current_async_library())

        consumer.add_hook(after=after)

        def listener(msgs: list[MessageExt], context: Any) -> ConsumeConcurrentlyStatus:
            threads.append(threading.get_ident())
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

        consumer.register_message_listener_concurrently(listener)
        async with Producer(trimq_cluster.producer_config()) as producer, consumer:
            brokers = {(await producer.send(Message("AioPlain", b"x%d" % i))).message_queue.broker_name
                       for i in range(4)}
            assert brokers == {"broker-a", "broker-b"}
            await wait_until(lambda: len(hooks) >= 4)

    run(main)
    assert len(threads) == 4 and threading.get_ident() not in threads and set(hooks) == {"asyncio"}


def test_messages_iterator_retries_a_failed_message_and_commits_on_exit(trimq_broker: ThreadedCluster) -> None:
    """``async for msg in consumer.messages()`` with ``async with msg.process()``: an exception nacks (the
    orderly message comes again, in place) and propagates; the block's normal end acks; leaving ``async with
    consumer`` persists the offsets and releases the locks."""
    trimq_broker.create_topic_now("AioStream", queues=1)
    handled: list[tuple[bytes, int]] = []

    async def main() -> None:
        consumer = PushConsumer(trimq_broker.consumer_config("aio_stream", suspend_current_queue_time_millis=50))
        consumer.subscribe("AioStream")
        stream = consumer.messages(orderly=True)
        failed_once = False
        async with Producer(trimq_broker.producer_config()) as producer, consumer:
            for body in (b"a", b"b", b"c"):
                await producer.send(Message("AioStream", body))
            async for msg in stream:
                assert isinstance(msg, ReceivedMessage) and msg.topic == "AioStream"
                try:
                    async with msg.process():
                        if msg.body == b"b" and not failed_once:
                            failed_once = True
                            raise RuntimeError("database hiccup")
                        handled.append((msg.body, msg.reconsume_times))
                except RuntimeError:
                    assert msg.state == "nacked"
                    continue
                assert msg.state == "acked"
                if len(handled) == 3:
                    break
        assert stream.closed

    run(main)
    assert handled == [(b"a", 0), (b"b", 1), (b"c", 0)]
    consumer_offsets, broker_offsets, locks = settled(trimq_broker, "aio_stream", "AioStream")
    assert consumer_offsets == broker_offsets == {0: 3} and not locks


def test_cancelling_the_owning_task_shuts_the_consumer_down_cleanly(trimq_broker: ThreadedCluster) -> None:
    """The asyncio task holding ``async with consumer`` is cancelled (a service stopping, a timeout): the
    CancelledError comes out after the graceful shutdown ran: offsets persisted, locks released, group left."""
    trimq_broker.create_topic_now("AioCancel", queues=2)
    consumed: list[bytes] = []

    async def main() -> None:
        async with Producer(trimq_broker.producer_config()) as producer:
            for i in range(10):
                await producer.send(Message("AioCancel", b"m%d" % i))

        async def service() -> None:
            consumer = PushConsumer(trimq_broker.consumer_config("aio_cancel"))

            @consumer.listener("AioCancel", orderly=True)
            async def handle(msg: MessageExt) -> None:
                consumed.append(msg.body)

            async with consumer:
                await asyncio.Event().wait()

        task = asyncio.create_task(service())
        await wait_until(lambda: len(consumed) >= 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert client_aio._HOSTS == {}

    run(main)
    consumer_offsets, broker_offsets, locks = settled(trimq_broker, "aio_cancel", "AioCancel")
    assert consumer_offsets == broker_offsets and sum(broker_offsets.values()) == 10 and not locks
    with pytest.raises(AdminError, match="not online"):  # the group was left
        trimq_broker.call(trimq_broker.cluster.admin.consumer_connections, "aio_cancel")


def test_one_guest_run_per_loop_shared_and_restarted() -> None:
    """Clients entered in one loop share its guest run, which ends with the last of them; the next client starts
    a new one; run_trio reaches any trio API; a call on a client that is not running says so."""

    async def trio_side(x: int) -> int:
        import trio

        await trio.sleep(0)
        return x + 1

    async def main() -> None:
        assert await client_aio.run_trio(trio_side, 1) == 2
        assert client_aio._HOSTS == {}
        p1, p2 = Producer(_config()), Producer(_config())
        async with p1:
            host = client_aio._HOSTS[asyncio.get_running_loop()]
            async with p2:
                assert client_aio._OWNER[p2] is host and host.users == 2
            assert host.users == 1
        assert client_aio._HOSTS == {} and host.finished.done()
        with pytest.raises(client_aio.ClientClosedError, match="not running"):
            await p1.send(Message("T", b"x"))
        async with Producer(_config()):
            assert client_aio._HOSTS[asyncio.get_running_loop()] is not host
        # a failure of an entered object's own tasks ends its block in trio; it is raised when asyncio leaves
        with pytest.raises(ExceptionGroup) as failed:
            async with client_aio.trio_context(failing_service()) as value:
                assert value == "serving"
                await asyncio.sleep(0.05)
        assert failed.group_contains(ValueError, match="boom")

    run(main)
    run(main)  # a second loop, after the first one closed


@asynccontextmanager
async def failing_service() -> AsyncIterator[str]:
    import trio

    async def boom() -> None:
        await trio.sleep(0.01)
        raise ValueError("boom")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(boom)
        yield "serving"


def _config() -> Any:
    from trimq.client import ProducerConfig

    return ProducerConfig(namesrv_addr="127.0.0.1:1")
