"""Key scope (issue 17) against a real in-process broker: ``Producer.send(msg, sharding_key=...)`` stores
``__SHARDINGKEY`` on the queue SelectMessageQueueByHash picks; orderly consumers with ``order_scope="key"`` consume
a queue's keys in parallel, each key in order, a poison key dead-lettered while the other keys flow (blocked keys
in GET_CONSUMER_RUNNING_INFO, ``trimq-admin consumer status``'s rendering and the metric); a second member joining
mid-flight takes queues over from the committed prefix (its leases and fencing epochs as in queue scope).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio
from prometheus_client import CollectorRegistry

from trimq.broker.broker import Broker
from trimq.client import (
    ClientConfig,
    ClientInstance,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    Message,
    MessageExt,
    Producer,
    ProducerConfig,
    PushConsumer,
    PushConsumerConfig,
)
from trimq.client.key_backlog import message_key
from trimq.client.selectors import SelectMessageQueueByHash
from trimq.protocol.codes import RequestCode
from trimq.protocol.message import MessageConst
from trimq.tools import admin_format

T = "KeyScopeTopic"
S = ConsumeOrderlyStatus


async def wait_until(pred: Callable[[], Any], timeout: float = 15) -> None:
    with trio.fail_after(timeout):
        while not pred():
            await trio.sleep(0.01)


@asynccontextmanager
async def environment(broker_factory: Any, queues: int) -> AsyncIterator[tuple[Broker, ClientInstance, Producer]]:
    async with broker_factory(embedded_namesrv=True) as broker, \
            ClientInstance(ClientConfig(namesrv_addr=broker.address)) as admin:
        await admin.api.create_topic(broker.address, T, read_queue_nums=queues, write_queue_nums=queues)
        with trio.fail_after(5):
            while not await admin.update_topic_route_info_from_name_server(T):
                await trio.sleep(0.01)
        async with Producer(ProducerConfig(producer_group="key_scope_producer"), instance=admin) as producer:
            yield broker, admin, producer


def config(broker: Broker, group: str, name: str, **kw: Any) -> PushConsumerConfig:
    return PushConsumerConfig(namesrv_addr=broker.address, consumer_group=group, instance_name=name,
                              consume_from_where="CONSUME_FROM_FIRST_OFFSET", order_scope="key",
                              suspend_current_queue_time_millis=10, persist_consumer_offset_interval=100,
                              rebalance_interval=600_000, **kw)


async def test_sharding_key_send_and_poison_key_to_dlq(broker_factory: Any) -> None:
    async with environment(broker_factory, queues=2) as (broker, admin, producer):
        mqs = await producer.message_queues(T)
        # the producer picks the queue as SelectMessageQueueByHash does with the key, and stores the key
        keys = [f"order-{i}" for i in range(6)] + ["poison"]
        sent: dict[str, list[int]] = {}
        for seq in range(4):
            for k in keys:
                r = await producer.send(Message(T, f"{k}:{seq}".encode(), keys=f"{k}:{seq}"), sharding_key=k)
                assert r.message_queue == SelectMessageQueueByHash()(mqs, None, k)
                sent.setdefault(k, []).append(seq)
        active: set[str] = set()
        peak = 0
        got: dict[str, list[int]] = {}
        attempts: dict[str, int] = {}

        async def listener(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> S:
            nonlocal peak
            [m] = msgs
            key = message_key(m)
            assert m.properties[MessageConst.SHARDING_KEY] == key
            assert key not in active
            assert ctx.lock_epoch is not None  # the fencing token, as in queue scope
            active.add(key)
            peak = max(peak, len(active))
            try:
                await trio.sleep(0.02)
                if key == "poison":
                    attempts[m.body.decode()] = attempts.get(m.body.decode(), 0) + 1
                    return S.SUSPEND_CURRENT_QUEUE_A_MOMENT
                got.setdefault(key, []).append(int(m.body.decode().split(":")[1]))
                return S.SUCCESS
            finally:
                active.discard(key)

        registry = CollectorRegistry()
        consumer = PushConsumer(config(broker, "key_scope_g", "c1", max_reconsume_times=2), registry=registry)
        consumer.subscribe(T)
        consumer.register_message_listener_orderly(listener)
        async with consumer:
            await wait_until(lambda: all(got.get(k) == sent[k] for k in keys if k != "poison"))
            # every other key went on while "poison" retried (or was dead-lettered already)
            assert peak > 1
            info = consumer.running_info()
            assert info["orderScope"] == "key"
            await wait_until(lambda: sum(attempts.values()) == 4 * 3)  # 4 messages x (1 + max_reconsume_times 2)
            with trio.fail_after(10):
                while True:
                    dlq = await admin.api.admin_query(broker.address, RequestCode.QUERY_DLQ_MESSAGES,
                                                      {"consumerGroup": "key_scope_g", "maxNums": 100})
                    if len(dlq["messages"]) >= 4:
                        break
                    await trio.sleep(0.01)
            assert sorted(m["keys"] for m in dlq["messages"]) == [f"poison:{i}" for i in range(4)]
            # everything is committed: the dead letters completed the poison key
            for mq in mqs:
                total = await admin.api.get_max_offset(broker.address, mq)
                await wait_until(lambda mq=mq, total=total: consumer.core is not None and  # type: ignore[misc]
                                 consumer.core.offset_store.clone_offset_table(T).get(mq) == total)
            assert "trimq_consumer_blocked_keys" in _scrape(registry)
        assert all(a == 3 for a in attempts.values())


async def test_blocked_key_is_visible_and_a_joining_member_takes_over(broker_factory: Any) -> None:
    async with environment(broker_factory, queues=4) as (broker, _admin, producer):
        gate = trio.Event()
        deliveries: list[tuple[str, str, int]] = []  # (consumer, key, seq)

        def listener_for(name: str) -> Any:
            async def listener(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> S:
                for m in msgs:
                    key, seq = m.body.decode().split(":")
                    if key == "stuck" and not gate.is_set():
                        return S.SUSPEND_CURRENT_QUEUE_A_MOMENT
                    deliveries.append((name, key, int(seq)))
                await trio.sleep(0.005)
                return S.SUCCESS
            return listener

        async def send(n: int, start: int = 0) -> None:
            for seq in range(start, start + n):
                for k in ("stuck", "a", "b", "c", "d", "e", "f", "g"):
                    await producer.send(Message(T, f"{k}:{seq}".encode()), sharding_key=k)

        await send(5)
        c1 = PushConsumer(config(broker, "key_scope_t", "c1", max_reconsume_times=100_000))
        c1.subscribe(T)
        c1.register_message_listener_orderly(listener_for("c1"))
        async with c1:
            await wait_until(lambda: len([d for d in deliveries if d[1] != "stuck"]) == 35)
            info = c1.running_info()
            [blocked] = info["blockedKeys"]
            assert blocked["key"] == "stuck" and blocked["attempts"] >= 1
            text = admin_format.render_consumer_status({"consumerGroup": "key_scope_t", "clients": [info]},
                                                       now_ms=0)
            assert "orderly (key scope)" in text and "blocked keys: 1" in text and "stuck" in text
            # a second member joins mid-flight: the rebalance hands queues over once their batches committed
            c2 = PushConsumer(config(broker, "key_scope_t", "c2", max_reconsume_times=100_000))
            c2.subscribe(T)
            c2.register_message_listener_orderly(listener_for("c2"))
            async with c2:
                def held(c: PushConsumer) -> int:
                    return len([mq for mq in c.process_queue_table() if mq.topic == T])

                await wait_until(lambda: held(c1) == 2 and held(c2) == 2)
                await send(5, start=5)
                gate.set()
                await wait_until(lambda: {(k, s) for _, k, s in deliveries} ==
                                 {(k, s) for k in ("stuck", "a", "b", "c", "d", "e", "f", "g") for s in range(10)})
        # per key, first deliveries in order; a redelivery only replays what was not committed before the move
        for key in ("stuck", "a", "b", "c", "d", "e", "f", "g"):
            seqs = [s for _, k, s in deliveries if k == key]
            firsts = [s for i, s in enumerate(seqs) if s not in seqs[:i]]
            assert firsts == list(range(10)), (key, seqs)
            assert seqs == sorted(seqs), (key, seqs)  # a graceful move commits first: nothing replayed


async def test_cli_producer_sharding_key(broker_factory: Any) -> None:
    """``trimq-producer --sharding-key`` (its LoadProducer, in process): each message carries its key as sharding key
    and sits on the queue SelectMessageQueueByHash gives that key, with --orderly (batched) and without."""
    from trimq.tools.producer import LoadProducer, ProducerOptions

    async with environment(broker_factory, queues=4) as (broker, _admin, producer):
        mqs = await producer.message_queues(T)
        for orderly, batch in ((True, 3), (False, 1)):
            summary = await LoadProducer(producer, ProducerOptions(topic=T, count=30, keys=7, orderly=orderly,
                                                                   batch=batch, sharding_key=True)).run()
            assert summary.sent == 30 and summary.failed == 0
        stored = 0
        store = broker.store
        for mq in mqs:
            q = mq.queue_id
            for off in range(store.get_min_offset_in_queue(T, q), store.get_max_offset_in_queue(T, q)):
                cq = store.find_consume_queue(T, mq.queue_id)
                assert cq is not None
                unit = cq.get_unit(off)
                assert unit is not None
                m = store.lookup_message_by_offset(unit[0])
                assert m is not None
                key = m.properties[MessageConst.SHARDING_KEY]
                assert key == m.keys and SelectMessageQueueByHash()(mqs, None, key) == mq
                stored += 1
        assert stored == 60


def _scrape(registry: CollectorRegistry) -> str:
    from prometheus_client import generate_latest

    return generate_latest(registry).decode()

