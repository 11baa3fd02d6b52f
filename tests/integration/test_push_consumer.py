"""PushConsumer against a real in-process broker (embedded name server, short delay levels).

Orderly retry in place and dead letters; concurrent retry through ``%RETRY%group`` into the DLQ; sync and
async listeners; graceful shutdown (takeover within a second, nothing both sent back and left uncommitted);
the blocked-queue gauge, SKIP_MESSAGE and GET_CONSUMER_RUNNING_INFO over the wire; hooks; metrics.
Waits poll for a condition (never a fixed sleep as the assertion); the only time bound asserted is the
takeover's, which is the feature under test.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import trio
from prometheus_client import CollectorRegistry

from trimq.broker.broker import Broker
from trimq.client import (
    ClientConfig,
    ClientInstance,
    ConfigError,
    ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    Message,
    MessageExt,
    MessageQueue,
    MQClientError,
    OffsetNotFoundError,
    Producer,
    ProducerConfig,
    PushConsumer,
    PushConsumerConfig,
)
from trimq.protocol.codes import RequestCode, ResponseCode
from trimq.protocol.command import RemotingCommand
from trimq.protocol.validation import retry_topic

T = "PushTopic"
LEVELS = "100ms 100ms 100ms 100ms 100ms 100ms 100ms 100ms"  # level 3 + reconsume times stays short


async def wait_until(pred: Callable[[], Any], timeout: float = 10, interval: float = 0.01) -> None:
    with trio.fail_after(timeout):
        while True:
            r = pred()
            if hasattr(r, "__await__"):
                r = await r
            if r:
                return
            await trio.sleep(interval)


@dataclass
class Env:
    broker: Broker
    admin: ClientInstance
    producer: Producer

    @property
    def addr(self) -> str:
        return self.broker.address

    @property
    def broker_name(self) -> str:
        return self.broker.config.broker_name

    def mq(self, queue_id: int, topic: str = T) -> MessageQueue:
        return MessageQueue(topic, self.broker_name, queue_id)

    async def send(self, body: str, queue_id: int = 0, keys: str | None = None) -> None:
        await self.producer.send(Message(T, body.encode(), keys=keys), message_queue=self.mq(queue_id))

    async def max_offset(self, topic: str, queue_id: int = 0) -> int:
        return await self.admin.api.get_max_offset(self.addr, MessageQueue(topic, self.broker_name, queue_id))

    async def dlq(self, group: str) -> list[dict[str, Any]]:
        body = await self.admin.api.admin_query(self.addr, RequestCode.QUERY_DLQ_MESSAGES,
                                                {"consumerGroup": group, "maxNums": 100})
        return list(body["messages"])

    async def to_client(self, group: str, consumer: PushConsumer, code: int, ext: dict[str, Any]) -> RemotingCommand:
        """A broker -> client request over the consumer's own connection (what the admin path will do)."""
        conn = self.broker.consumer_manager.find_channel(group, consumer.client_id)
        assert conn is not None
        return await conn.request(RemotingCommand.request(code, ext), 5)

    def config(self, group: str, name: str = "", **kw: Any) -> PushConsumerConfig:
        kw.setdefault("consume_from_where", "CONSUME_FROM_FIRST_OFFSET")
        kw.setdefault("suspend_current_queue_time_millis", 10)
        kw.setdefault("rebalance_interval", 600_000)  # only notifications rebalance (takeover must not wait)
        return PushConsumerConfig(namesrv_addr=self.addr, consumer_group=group, instance_name=name, **kw)


@asynccontextmanager
async def environment(broker_factory: Any, queues: int = 1) -> AsyncIterator[Env]:
    async with broker_factory(embedded_namesrv=True, message_delay_level=LEVELS) as broker, \
            ClientInstance(ClientConfig(namesrv_addr=broker.address)) as admin:
        await admin.api.create_topic(broker.address, T, read_queue_nums=queues, write_queue_nums=queues)
        await wait_until(lambda: admin.update_topic_route_info_from_name_server(T), timeout=5)
        async with Producer(ProducerConfig(producer_group="push_test_producer"), instance=admin) as producer:
            yield Env(broker, admin, producer)


def body(msg: MessageExt) -> str:
    return msg.body.decode()


# ----------------------------------------------------------------------------------------------------------


async def test_orderly_retry_in_place_then_success(broker_factory: Any) -> None:
    async with environment(broker_factory) as env:
        for i in range(5):
            await env.send(f"m{i}")
        seen: list[tuple[str, int]] = []
        failures = {"m1": 3}

        async def listener(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
            for m in msgs:
                seen.append((body(m), m.reconsume_times))
                if failures.get(body(m), 0) > 0:
                    failures[body(m)] -= 1
                    return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
            return ConsumeOrderlyStatus.SUCCESS

        consumer = PushConsumer(env.config("orderly_retry"))
        consumer.subscribe(T)
        consumer.register_message_listener_orderly(listener)
        async with consumer:
            await wait_until(lambda: len(seen) >= 8)
            await trio.sleep(0.05)
        # in place: the failing message 4 times (reconsume 0..3), nothing after it meanwhile
        assert seen == [("m0", 0), ("m1", 0), ("m1", 1), ("m1", 2), ("m1", 3), ("m2", 0), ("m3", 0), ("m4", 0)]
        stored = await env.admin.api.query_consumer_offset(env.addr, "orderly_retry", env.mq(0))
        assert stored == 5  # the graceful shutdown persisted the offsets
        assert await env.dlq("orderly_retry") == []


def suspended_orderly_consumer(env: Env, group: str) -> tuple[PushConsumer, list[str]]:
    """An orderly consumer of ``T``, suspended before its start, and the bodies its listener is handed."""
    seen: list[str] = []

    async def listener(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
        seen.extend(body(m) for m in msgs)
        return ConsumeOrderlyStatus.SUCCESS

    consumer = PushConsumer(env.config(group))
    consumer.subscribe(T)
    consumer.register_message_listener_orderly(listener)
    consumer.suspend()
    return consumer, seen


async def test_suspended_before_start_locks_its_queue_but_pulls_nothing_until_resumed(broker_factory: Any) -> None:
    # RocketMQ's pause flag holds before the start; suspend() used to be ignored then, and the consumer pulled at once.
    async with environment(broker_factory) as env:
        for i in range(3):
            await env.send(f"m{i}")
        consumer, seen = suspended_orderly_consumer(env, "suspended_start")
        assert consumer.suspended
        async with consumer:
            assert consumer.core is not None
            stats = consumer.core.pull_service.stats
            await wait_until(lambda: stats["suspended"] >= 1)  # the queue's pull loop ran and was put off
            # the topic's one queue is held and locked (the group's %RETRY% queue may or may not be held yet: its
            # rebalance runs on its own, and asserting the whole table made this test fail now and then)
            held = consumer.process_queue_table()
            assert [pq.locked for mq, pq in held.items() if mq.topic == T] == [True]
            assert all(pq.locked for pq in held.values())
            assert stats["pulls"] == 0 and seen == []
            consumer.resume()
            assert not consumer.suspended
            await wait_until(lambda: len(seen) == 3)
        assert seen == ["m0", "m1", "m2"]


async def test_resumed_before_start_pulls_from_the_start(broker_factory: Any) -> None:
    async with environment(broker_factory) as env:
        await env.send("m0")
        consumer, seen = suspended_orderly_consumer(env, "resumed_before_start")
        consumer.resume()
        assert not consumer.suspended
        async with consumer:
            await wait_until(lambda: seen == ["m0"])
            assert consumer.core is not None and consumer.core.pull_service.stats["suspended"] == 0


async def test_orderly_max_reconsume_dead_letters_and_moves_on(broker_factory: Any) -> None:
    async with environment(broker_factory) as env:
        for i in range(4):
            await env.send(f"m{i}", keys=f"k{i}")
        seen: list[tuple[str, int]] = []

        def listener(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:  # sync: thread
            seen.extend((body(m), m.reconsume_times) for m in msgs)
            if any(body(m) == "m1" for m in msgs):
                raise RuntimeError("poison message")  # an exception counts as SUSPEND
            return ConsumeOrderlyStatus.SUCCESS

        consumer = PushConsumer(env.config("orderly_dlq", max_reconsume_times=2))
        consumer.subscribe(T)
        consumer.register_message_listener_orderly(listener)
        async with consumer:
            await wait_until(lambda: len(seen) >= 6)
            await wait_until(lambda: env.dlq("orderly_dlq"), timeout=5)
            assert not consumer.blocked_queues()  # the commit past the dead letter unblocked the queue
        assert seen == [("m0", 0), ("m1", 0), ("m1", 1), ("m1", 2), ("m2", 0), ("m3", 0)]
        [dead] = await env.dlq("orderly_dlq")
        assert dead["keys"] == "k1" and dead["originTopic"] == T
        assert await env.max_offset(retry_topic("orderly_dlq")) == 0  # straight to the DLQ, no retry copy
        assert await env.admin.api.query_consumer_offset(env.addr, "orderly_dlq", env.mq(0)) == 4


async def test_concurrent_retry_via_retry_topic_then_dlq(broker_factory: Any) -> None:
    async with environment(broker_factory, queues=2) as env:
        await env.send("good-0", 0)
        await env.send("bad", 1, keys="bad-key")
        await env.send("good-1", 1)
        seen: list[tuple[str, str, int, str]] = []
        threads: set[str] = set()

        def listener(msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
            threads.add(threading.current_thread().name)
            for m in msgs:
                seen.append((body(m), m.topic, m.reconsume_times, ctx.message_queue.topic))
            if any(body(m) == "bad" for m in msgs):
                return ConsumeConcurrentlyStatus.RECONSUME_LATER
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

        group = "conc_retry"
        consumer = PushConsumer(env.config(group, max_reconsume_times=2))
        consumer.subscribe(T)
        consumer.register_message_listener_concurrently(listener)
        async with consumer:
            await wait_until(lambda: env.dlq(group), timeout=10)
            goods = sorted(b for b, *_ in seen if b.startswith("good"))
            assert goods == ["good-0", "good-1"]
        bad = [(t, rt, qt) for b, t, rt, qt in seen if b == "bad"]
        # delivered from the queue, then twice from %RETRY%group with its real topic restored, then dead
        assert [rt for _, rt, _ in bad] == [0, 1, 2]
        assert all(t == T for t, _, _ in bad)
        assert [qt for _, _, qt in bad] == [T, retry_topic(group), retry_topic(group)]
        [dead] = await env.dlq(group)
        assert dead["keys"] == "bad-key" and dead["reconsumeTimes"] == 3 and dead["originTopic"] == T
        assert threading.main_thread().name not in threads  # plain listeners run in worker threads
        for qid in (0, 1):
            assert await env.admin.api.query_consumer_offset(env.addr, group, env.mq(qid)) == \
                await env.max_offset(T, qid)


async def test_async_concurrent_listener_ack_index_and_hooks(broker_factory: Any) -> None:
    async with environment(broker_factory) as env:
        for i in range(4):
            await env.send(f"m{i}")
        calls: list[list[str]] = []
        before: list[dict[str, Any]] = []
        after: list[dict[str, Any]] = []

        async def listener(msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
            await trio.sleep(0)
            calls.append([body(m) for m in msgs])
            if [body(m) for m in msgs] == ["m0", "m1", "m2", "m3"]:
                ctx.ack_index = 1  # m2 and m3 come back through the retry topic
                ctx.delay_level_when_next_consume = 1
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

        consumer = PushConsumer(env.config("conc_async", consume_message_batch_max_size=4))
        consumer.subscribe(T)
        consumer.register_message_listener_concurrently(listener)
        consumer.add_hook(before=lambda ctx: before.append(dict(ctx)), after=lambda ctx: after.append(dict(ctx)))
        async with consumer:
            await wait_until(lambda: sorted(b for c in calls[1:] for b in c) == ["m2", "m3"])
        assert calls[0] == ["m0", "m1", "m2", "m3"]
        assert len(before) == len(after) == len(calls)
        assert after[0]["status"] == "CONSUME_SUCCESS" and after[0]["success"] is True
        assert after[0]["consumer_group"] == "conc_async" and after[0]["return_type"] == "SUCCESS"
        assert [body(m) for m in before[0]["msgs"]] == ["m0", "m1", "m2", "m3"]


async def test_blocked_gauge_running_info_and_skip_over_the_wire(broker_factory: Any) -> None:
    async with environment(broker_factory) as env:
        for i in range(3):
            await env.send(f"m{i}", keys=f"k{i}")
        seen: list[str] = []

        async def listener(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
            seen.extend(body(m) for m in msgs)
            return (ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT if body(msgs[0]) == "m1"
                    else ConsumeOrderlyStatus.SUCCESS)

        group = "orderly_blocked"
        registry = CollectorRegistry()
        consumer = PushConsumer(env.config(group, suspend_current_queue_time_millis=50), registry=registry,
                                metrics_port=0)
        consumer.subscribe(T)
        consumer.register_message_listener_orderly(listener)
        async with consumer:
            await wait_until(lambda: consumer.blocked_queues() and consumer.blocked_queues()[0]["attempts"] >= 3)
            [blocked] = consumer.blocked_queues()
            assert blocked["offset"] == 1 and blocked["mq"] == env.mq(0).to_wire()
            labels = {"consumer_group": group, "topic": T, "broker": env.broker_name, "queue_id": "0"}
            await wait_until(lambda: (registry.get_sample_value("trimq_consumer_queue_blocked_seconds", labels)
                                      or 0) > 0)
            assert (registry.get_sample_value("trimq_consumer_queue_blocked_attempts", labels) or 0) >= 3
            assert "m2" not in seen  # blocked in place

            resp = await env.to_client(group, consumer, RequestCode.GET_CONSUMER_RUNNING_INFO,
                                       {"consumerGroup": group})
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            info = resp.body
            assert info["consumeOrderly"] is True and info["blockedQueues"][0]["offset"] == 1
            [row] = [r for r in info["mqTable"] if r["mq"]["topic"] == T]
            assert row["processQueueInfo"]["locked"] is True
            assert info["statusTable"][T]["consumeFailed"] >= 3
            assert info["properties"]["consumerGroup"] == group

            bad = await env.to_client(group, consumer, RequestCode.SKIP_MESSAGE,
                                      {"consumerGroup": group, "topic": T, "brokerName": env.broker_name,
                                       "queueId": 0, "queueOffset": 7})
            assert bad.code == ResponseCode.SYSTEM_ERROR and "not cached" in (bad.remark or "")
            resp = await env.to_client(group, consumer, RequestCode.SKIP_MESSAGE,
                                       {"consumerGroup": group, "topic": T, "brokerName": env.broker_name,
                                        "queueId": 0, "queueOffset": 1})
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            assert resp.body["queueOffset"] == 1 and resp.body["nextOffset"] == 2
            await wait_until(lambda: "m2" in seen)
            assert not consumer.blocked_queues()

            # the metrics endpoint serves the same registry
            assert consumer.metrics_address is not None
            text = await http_get(*consumer.metrics_address)
            assert "trimq_consumer_consume_latency_seconds_bucket" in text
            assert "trimq_consumer_pull_latency_seconds_count" in text
            assert "trimq_consumer_rebalance_total" in text
            assert 'trimq_consumer_consumed_messages_total{consumer_group="orderly_blocked",result="failed"' in text
        [dead] = await env.dlq(group)
        assert dead["keys"] == "k1"
        assert dead["skippedBy"].startswith("admin via ")  # an operator's skip, told from an exhausted retry
        assert seen.count("m2") == 1 and seen[-1] == "m2"
        assert await env.admin.api.query_consumer_offset(env.addr, group, env.mq(0)) == 3


async def http_get(host: str, port: int) -> str:
    stream = await trio.open_tcp_stream(host, port)
    async with stream:
        await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    return data.decode()


@dataclass
class Member:
    consumer: PushConsumer
    stop: trio.Event
    stopped: trio.Event


async def run_member(nursery: trio.Nursery, consumer: PushConsumer) -> Member:
    m = Member(consumer, trio.Event(), trio.Event())

    async def run(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with consumer:
                task_status.started()
                await m.stop.wait()
        finally:
            m.stopped.set()

    await nursery.start(run)
    return m


async def test_graceful_orderly_shutdown_takeover_within_a_second_without_duplicates(broker_factory: Any) -> None:
    queues = 4
    async with environment(broker_factory, queues=queues) as env:
        group = "takeover"
        consumed: list[tuple[str, str, int]] = []  # (member, body, queue id)
        first_after_stop: dict[str, float] = {}
        stop_time: list[float] = []

        def listener_for(name: str) -> Any:
            async def listener(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
                for m in msgs:
                    consumed.append((name, body(m), m.queue_id))
                    if stop_time and name == "b" and m.queue_id in a_queues and "b" not in first_after_stop:
                        first_after_stop["b"] = trio.current_time()
                await trio.sleep(0.002)
                return ConsumeOrderlyStatus.SUCCESS
            return listener

        a_queues: set[int] = set()
        sent = 0

        async def produce(n: int) -> None:
            nonlocal sent
            for _ in range(n):
                await env.send(f"x{sent}", sent % queues)
                sent += 1

        async with trio.open_nursery() as nursery:
            members = {}
            for name in ("a", "b"):
                c = PushConsumer(env.config(group, name))
                c.subscribe(T)
                c.register_message_listener_orderly(listener_for(name))
                members[name] = await run_member(nursery, c)
            a, b = members["a"], members["b"]

            def split() -> bool:
                qa = {mq.queue_id for mq in a.consumer.process_queue_table() if mq.topic == T}
                qb = {mq.queue_id for mq in b.consumer.process_queue_table() if mq.topic == T}
                return len(qa) == len(qb) == 2 and not qa & qb

            await wait_until(split)
            a_queues.update(mq.queue_id for mq in a.consumer.process_queue_table() if mq.topic == T)
            await produce(40)
            await wait_until(lambda: len(consumed) >= 40)
            stop_time.append(trio.current_time())
            await a.consumer.shutdown()
            await produce(40)
            await wait_until(lambda: "b" in first_after_stop, timeout=5)
            took = first_after_stop["b"] - stop_time[0]
            assert took < 5.0, f"takeover took {took:.3f}s"  # not the 10 min rebalance; room for a loaded machine
            await wait_until(lambda: len(consumed) >= 80)
            a.stop.set()
            await a.stopped.wait()
            b.stop.set()
        bodies = [bd for _, bd, _ in consumed]
        assert sorted(bodies, key=lambda s: int(s[1:])) == [f"x{i}" for i in range(80)]  # each exactly once
        for qid in range(queues):  # per queue, in send order
            q = [int(bd[1:]) for _, bd, q_ in consumed if q_ == qid]
            assert q == sorted(q)


async def test_concurrent_shutdown_failure_is_neither_sent_back_nor_committed(broker_factory: Any) -> None:
    async with environment(broker_factory) as env:
        await env.send("slow-fail")
        started = trio.Event()
        release = trio.Event()

        async def slow(msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
            started.set()
            await release.wait()
            return ConsumeConcurrentlyStatus.RECONSUME_LATER

        group = "conc_shutdown"
        consumer = PushConsumer(env.config(group, "s1", await_termination_millis_when_shutdown=5000))
        consumer.subscribe(T)
        consumer.register_message_listener_concurrently(slow)
        async with trio.open_nursery() as nursery:
            member = await run_member(nursery, consumer)
            await started.wait()
            nursery.start_soon(consumer.shutdown)
            await wait_until(lambda: consumer.service is not None and consumer.service.stopping)
            release.set()  # the in-flight call fails after the shutdown began
            await consumer.shutdown()  # idempotent: waits for the one under way
            member.stop.set()
        assert consumer.service is not None and consumer.service.dropped_results == 0
        assert await env.max_offset(retry_topic(group)) == 0  # not sent back ...
        try:  # ... and not committed
            stored = await env.admin.api.query_consumer_offset(env.addr, group, env.mq(0))
        except OffsetNotFoundError:
            stored = 0
        assert stored == 0

        seen: list[tuple[str, int]] = []

        def ok(msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
            seen.extend((body(m), m.reconsume_times) for m in msgs)
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

        successor = PushConsumer(env.config(group, "s2"))
        successor.subscribe(T)
        successor.register_message_listener_concurrently(ok)
        async with successor:
            await wait_until(lambda: seen)
        assert seen == [("slow-fail", 0)]  # consumed from the queue once, no retry copy
        assert await env.dlq(group) == []


async def test_lifecycle_errors_and_config_validation(broker_factory: Any) -> None:
    with pytest.raises(ConfigError, match="consume_thread_max"):
        PushConsumerConfig(consumer_group="g", consume_thread_max=0)
    with pytest.raises(ConfigError, match="pull_threshold_for_queue"):
        PushConsumerConfig(consumer_group="g", pull_threshold_for_queue=65536)
    with pytest.raises(ConfigError, match="metrics_port"):
        PushConsumer(PushConsumerConfig(consumer_group="g"), metrics_port=70000)
    c = PushConsumer(PushConsumerConfig(consumer_group="g", namesrv_addr="127.0.0.1:1"))
    with pytest.raises(ValueError, match="illegal characters"):
        c.subscribe("bad topic")
    with pytest.raises(TypeError, match="callable"):
        c.register_message_listener_orderly("nope")  # type: ignore[arg-type]
    with pytest.raises(MQClientError, match="no message listener"):
        async with c:
            pass
    c.register_message_listener_concurrently(lambda msgs, ctx: ConsumeConcurrentlyStatus.CONSUME_SUCCESS)
    with pytest.raises(MQClientError, match="no subscription"):
        async with c:
            pass


async def test_queue_moved_while_its_batch_is_in_the_listener_is_not_consumed_twice(broker_factory: Any) -> None:
    """Regression (seen in `make demo`): a rebalance that moves an orderly queue while its batch is still in the
    listener used to drop that batch's offset commit, so the new owner consumed the batch again; and the old
    owner kept the broker lock for 20 s more when the queue still cached messages."""
    queues = 4
    async with environment(broker_factory, queues=queues) as env:
        group = "reshuffle"
        consumed: list[tuple[str, str]] = []
        release = trio.Event()
        in_listener: set[int] = set()

        def listener_for(name: str) -> Any:
            async def listener(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
                if name == "a":
                    in_listener.add(msgs[0].queue_id)
                    await release.wait()  # every queue of 'a' is mid-batch when 'b' joins
                consumed.extend((name, body(m)) for m in msgs)
                return ConsumeOrderlyStatus.SUCCESS
            return listener

        async with trio.open_nursery() as nursery:
            a_consumer = PushConsumer(env.config(group, "a"))
            a_consumer.subscribe(T)
            a_consumer.register_message_listener_orderly(listener_for("a"))
            a = await run_member(nursery, a_consumer)
            await wait_until(lambda: len([mq for mq in a.consumer.process_queue_table() if mq.topic == T]) == 4)
            for i in range(queues * 3):
                await env.send(f"x{i}", i % queues)
            await wait_until(lambda: len(in_listener) == queues)
            b_consumer = PushConsumer(env.config(group, "b"))
            b_consumer.subscribe(T)
            b_consumer.register_message_listener_orderly(listener_for("b"))
            b = await run_member(nursery, b_consumer)
            # 'a' drops two queues and waits (up to 1 s) for their consume locks: let the batches finish then
            await trio.sleep(0.3)
            release.set()
            await wait_until(lambda: len(consumed) >= queues * 3, timeout=5)
            await wait_until(lambda: len([mq for mq in b.consumer.process_queue_table() if mq.topic == T]) == 2)
            await trio.sleep(0.3)  # a duplicate, if any, would show up now
            a.stop.set()
            b.stop.set()
        bodies = sorted(bd for _, bd in consumed)
        assert bodies == sorted(f"x{i}" for i in range(queues * 3)), "a message was consumed twice or lost"
        assert any(name == "b" for name, _ in consumed), "the queues moved to 'b' were consumed by it"
