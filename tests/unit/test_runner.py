"""TrioRunner: the trio SDK used from plain threads and from asyncio, against a real in-process broker
(itself hosted by the runner)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from trimq.client.api import SendStatus
from trimq.client.config import ProducerConfig
from trimq.client.errors import InvalidTopicError
from trimq.client.producer import Producer
from trimq.client.runner import RunnerClosedError, TrioRunner
from trimq.protocol.message import Message
from trimq.testing import Cluster, open_broker


@pytest.fixture
def runner() -> Iterator[TrioRunner]:
    with TrioRunner() as r:
        yield r


def start_broker(runner: TrioRunner, tmp_path: Path) -> Cluster:
    """A broker with its embedded name server (trimq.testing), run by the runner until it closes."""
    return runner.enter(open_broker(store_dir=str(tmp_path / "store")))


def test_producer_from_plain_threads(runner: TrioRunner, tmp_path: Path) -> None:
    broker = start_broker(runner, tmp_path)
    producer = runner.enter(Producer(ProducerConfig(namesrv_addr=broker.namesrv_addr, producer_group="runner_p")))
    results: list[Any] = []
    lock = threading.Lock()

    def work(t: int) -> None:
        for i in range(20):
            r = runner.call(producer.send, Message("RunnerTopic", f"{t}-{i}".encode()))
            with lock:
                results.append(r)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(results) == 80 and all(r.status is SendStatus.SEND_OK for r in results)
    # exceptions cross over with their type
    with pytest.raises(InvalidTopicError):
        runner.call(producer.send, Message("bad topic!", b"x"))
    # a synchronous function runs in the trio thread too
    assert runner.call(trio.current_time) > 0


def test_producer_from_asyncio(runner: TrioRunner, tmp_path: Path) -> None:
    broker = start_broker(runner, tmp_path)
    producer = runner.enter(Producer(ProducerConfig(namesrv_addr=broker.namesrv_addr, producer_group="runner_a")))

    async def main() -> list[Any]:
        ticks = 0

        async def ticker() -> None:  # the asyncio loop keeps running while trio works
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        t = asyncio.create_task(ticker())
        try:
            results = await asyncio.gather(*[runner.acall(producer.send, Message("RunnerTopic", b"x%d" % i))
                                             for i in range(50)])
        finally:
            t.cancel()
        assert ticks > 0
        with pytest.raises(InvalidTopicError):
            await runner.acall(producer.send, Message("", b"x"))
        return results

    results = asyncio.run(main())
    assert len(results) == 50 and all(r.status is SendStatus.SEND_OK for r in results)


def test_cancelling_the_asyncio_side_cancels_the_trio_task(runner: TrioRunner) -> None:
    cancelled = threading.Event()

    async def forever() -> None:
        try:
            await trio.sleep_forever()
        finally:
            cancelled.set()

    async def main() -> None:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(runner.acall(forever), 0.05)

    asyncio.run(main())
    assert cancelled.wait(5)


def test_close_exits_in_reverse_order_and_reports_errors() -> None:
    events: list[str] = []

    @asynccontextmanager
    async def thing(name: str, fail_on_exit: bool = False) -> AsyncIterator[str]:
        events.append(f"enter {name}")
        try:
            yield name
        finally:
            await trio.sleep(0)
            events.append(f"exit {name}")
            if fail_on_exit:
                raise KeyError(name)

    runner = TrioRunner().start()
    assert runner.enter(thing("a")) == "a"
    b = thing("b", fail_on_exit=True)
    runner.enter(b)
    runner.enter(thing("c"))
    with pytest.raises(KeyError):
        runner.close()
    assert events == ["enter a", "enter b", "enter c", "exit c", "exit b", "exit a"]
    runner.close()  # idempotent
    assert not runner.running
    with pytest.raises(RunnerClosedError):
        runner.call(trio.sleep, 0)


def test_enter_failures_and_explicit_exit(runner: TrioRunner) -> None:
    @asynccontextmanager
    async def broken() -> AsyncIterator[None]:
        raise ValueError("cannot start")
        yield

    with pytest.raises(ValueError, match="cannot start"):
        runner.enter(broken())
    with pytest.raises(TypeError, match="not an async context manager"):
        runner.enter(object())  # type: ignore[arg-type]

    exited = threading.Event()

    @asynccontextmanager
    async def ok() -> AsyncIterator[None]:
        try:
            yield
        finally:
            exited.set()

    obj = ok()
    runner.enter(obj)
    runner.exit(obj)
    assert exited.is_set()
    with pytest.raises(ValueError, match="not entered"):
        runner.exit(obj)


def test_blocking_calls_from_the_trio_thread_are_refused(runner: TrioRunner) -> None:
    def inner() -> None:
        runner.call(trio.sleep, 0)

    with pytest.raises(RuntimeError, match="blocks"):
        runner.call(inner)


def test_push_consumer_from_threads_and_asyncio(runner: TrioRunner, tmp_path: Path) -> None:
    """A consumer with a plain-def listener (worker threads) fed from plain threads, and one with an
    async listener fed from asyncio; closing the runner shuts both down gracefully."""
    from trimq.client import (
        ConsumeConcurrentlyStatus,
        ConsumeOrderlyStatus,
        PushConsumer,
        PushConsumerConfig,
    )
    broker = start_broker(runner, tmp_path)
    producer = runner.enter(Producer(ProducerConfig(namesrv_addr=broker.namesrv_addr, producer_group="runner_pc")))
    runner.call(broker.create_topic, "RunnerT1", 2)
    runner.call(broker.create_topic, "RunnerT2", 2)

    got_sync: list[bytes] = []
    sync_threads: set[str] = set()
    lock = threading.Lock()
    done_sync = threading.Event()

    def sync_listener(msgs: list[Any], context: Any) -> ConsumeOrderlyStatus:
        with lock:
            sync_threads.add(threading.current_thread().name)
            got_sync.extend(m.body for m in msgs)
            if len(got_sync) >= 20:
                done_sync.set()
        return ConsumeOrderlyStatus.SUCCESS

    c1 = PushConsumer(PushConsumerConfig(namesrv_addr=broker.namesrv_addr, consumer_group="runner_c1",
                                         consume_from_where="CONSUME_FROM_FIRST_OFFSET"))
    c1.subscribe("RunnerT1", "*")
    c1.register_message_listener_orderly(sync_listener)
    assert runner.enter(c1) is c1

    got_async: list[bytes] = []

    async def async_listener(msgs: list[Any], context: Any) -> ConsumeConcurrentlyStatus:
        got_async.extend(m.body for m in msgs)  # runs in the trio thread: no lock needed there
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    c2 = PushConsumer(PushConsumerConfig(namesrv_addr=broker.namesrv_addr, consumer_group="runner_c2",
                                         consume_from_where="CONSUME_FROM_FIRST_OFFSET"))
    c2.subscribe("RunnerT2", "*")
    c2.register_message_listener_concurrently(async_listener)
    runner.enter(c2)

    senders = [threading.Thread(target=lambda t=t: [runner.call(producer.send, Message("RunnerT1", b"%d-%d" % (t, i)))
                                                    for i in range(10)]) for t in range(2)]
    for th in senders:
        th.start()
    for th in senders:
        th.join()
    assert done_sync.wait(20)
    assert sorted(got_sync) == sorted(b"%d-%d" % (t, i) for t in range(2) for i in range(10))
    assert threading.current_thread().name not in sync_threads and runner.name not in sync_threads

    async def produce_and_wait() -> None:
        await asyncio.gather(*[runner.acall(producer.send, Message("RunnerT2", b"a%d" % i)) for i in range(20)])
        async with asyncio.timeout(20):
            while len(set(got_async)) < 20:
                await asyncio.sleep(0.02)

    asyncio.run(produce_and_wait())
    runner.exit(c2)  # one consumer stopped on its own (graceful), the rest at close
    assert not c2.running and c1.running
