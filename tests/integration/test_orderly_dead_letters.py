"""Orderly dead letters as RocketMQ 4.9.3 stores them, on both send-back paths (issue 20 item 7), and the
delayed send's answer seen by a Producer (item 6).

A real broker with ACL and its embedded name server, real PushConsumers and a Producer. One account may
publish to the topic, so its consumers dead-letter through CONSUMER_SEND_MSG_BACK; another may only subscribe
to it, so the broker refuses that request (NO_PERMISSION) and its consumers fall back to producing to
``%RETRY%<group>`` themselves, which their group right allows — the fallback runs for real, nothing is faked.

RocketMQ's ConsumeMessageOrderlyService.checkReconsumeTimes sends a message back once its reconsume times
reaches ``max_reconsume_times``, with that count, so a message is delivered max + 1 times and its dead letter
carries max; the copy keeps the message's properties and gets ORIGIN_MESSAGE_ID = its unique key.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from trimq.broker.broker import Broker
from trimq.client import (
    ClientConfig,
    ClientInstance,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    Message,
    MessageExt,
    MessageQueue,
    Producer,
    ProducerConfig,
    PushConsumer,
    PushConsumerConfig,
)
from trimq.protocol.message import MessageConst
from trimq.protocol.validation import SCHEDULE_TOPIC, dlq_topic, retry_topic

T = "OrderlyDlqTopic"
ADMIN = ("admin-key", "admin-secret")
FULL = ("full-key", "full-secret")
SUB_ONLY = ("sub-key", "sub-secret")
# (group, max_reconsume_times, account): "b" groups dead-letter through the broker, "f" groups fall back
CASES = [("og_b1", 1, FULL), ("og_b3", 3, FULL), ("og_f1", 1, SUB_ONLY), ("og_f3", 3, SUB_ONLY)]
ACL = f"""
[[accounts]]
access_key = "{ADMIN[0]}"
secret_key = "{ADMIN[1]}"
admin = true

[[accounts]]
access_key = "{FULL[0]}"
secret_key = "{FULL[1]}"
default_topic_perm = "DENY"
default_group_perm = "DENY"
topic_perms = {{ {T} = "PUB|SUB" }}
group_perms = {{ og_b1 = "PUB|SUB", og_b3 = "PUB|SUB" }}

[[accounts]]
access_key = "{SUB_ONLY[0]}"
secret_key = "{SUB_ONLY[1]}"
default_topic_perm = "DENY"
default_group_perm = "DENY"
topic_perms = {{ {T} = "SUB" }}
group_perms = {{ og_f1 = "PUB|SUB", og_f3 = "PUB|SUB" }}
"""


async def wait_until(pred: Callable[[], Any], timeout: float = 10) -> None:
    with trio.fail_after(timeout):
        while True:
            r = pred()
            if hasattr(r, "__await__"):
                r = await r
            if r:
                return
            await trio.sleep(0.01)


def stored_messages(broker: Broker, topic: str, queue_id: int = 0) -> list[MessageExt]:
    store = broker.store
    out = []
    for off in range(store.get_min_offset_in_queue(topic, queue_id), store.get_max_offset_in_queue(topic, queue_id)):
        cq = store.find_consume_queue(topic, queue_id)
        assert cq is not None
        unit = cq.get_unit(off)
        assert unit is not None
        msg = store.lookup_message_by_offset(unit[0])
        assert msg is not None
        out.append(msg)
    return out


async def test_orderly_dead_letters_match_rocketmq_on_both_paths(broker_factory: Any, tmp_path: Path) -> None:
    acl = tmp_path / "acl.toml"
    acl.write_text(ACL)
    async with broker_factory(embedded_namesrv=True, acl_file=str(acl)) as broker, \
            ClientInstance(ClientConfig(namesrv_addr=broker.address, access_key=ADMIN[0],
                                        secret_key=ADMIN[1])) as admin:
        await admin.api.create_topic(broker.address, T, read_queue_nums=1, write_queue_nums=1)
        await wait_until(lambda: admin.update_topic_route_info_from_name_server(T), timeout=5)
        async with Producer(ProducerConfig(producer_group="dlq_producer"), instance=admin) as producer:
            sent = await producer.send(Message(T, b"poison", tags="tA", keys="order-7", properties={"app": "v1"}))
            after = await producer.send(Message(T, b"fine"))
        [original, _] = stored_messages(broker, T)
        assert original.properties[MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX] == sent.msg_id != original.msg_id

        seen: dict[str, list[tuple[bytes, int]]] = {group: [] for group, _, _ in CASES}

        def listener_for(group: str) -> Callable[[list[MessageExt], ConsumeOrderlyContext], ConsumeOrderlyStatus]:
            def listener(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
                seen[group].extend((m.body, m.reconsume_times) for m in msgs)
                if any(m.body == b"poison" for m in msgs):
                    return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
                return ConsumeOrderlyStatus.SUCCESS
            return listener

        consumers = []
        for group, max_times, (ak, sk) in CASES:
            c = PushConsumer(PushConsumerConfig(
                namesrv_addr=broker.address, consumer_group=group, instance_name=group, access_key=ak,
                secret_key=sk, consume_from_where="CONSUME_FROM_FIRST_OFFSET", max_reconsume_times=max_times,
                suspend_current_queue_time_millis=10, rebalance_interval=600_000))
            c.subscribe(T)
            c.register_message_listener_orderly(listener_for(group))
            consumers.append(c)
        async with consumers[0], consumers[1], consumers[2], consumers[3]:
            await wait_until(lambda: all((b"fine", 0) in s for s in seen.values()))

        copies = {}
        for (group, max_times, account), consumer in zip(CASES, consumers, strict=True):
            # max + 1 deliveries in place (reconsume times 0..max), then the queue moved on
            assert seen[group] == [(b"poison", n) for n in range(max_times + 1)] + [(b"fine", 0)], group
            path = "broker" if account is FULL else "retry_topic"
            assert consumer.stats.sent_back == {"broker": 0, "retry_topic": 0, "failed": 0, path: 1}, group
            [dead] = stored_messages(broker, dlq_topic(group))
            assert dead.reconsume_times == max_times, group
            assert dead.body == b"poison" and dead.flag == original.flag
            expected = {**original.properties, MessageConst.RETRY_TOPIC: T,
                        MessageConst.ORIGIN_MESSAGE_ID: sent.msg_id}  # the unique key, not the offset id
            assert dead.properties == expected, group
            assert broker.topic_config_manager.get(retry_topic(group)) is None or not \
                stored_messages(broker, retry_topic(group))  # straight to the DLQ, no retry copy
            copies[group] = (dead.reconsume_times, dead.properties)
        # identical whichever path stored them
        assert copies["og_b1"] == copies["og_f1"] and copies["og_b3"] == copies["og_f3"]
        assert after.msg_id  # the message behind the poison one was consumed by every group (above)


async def test_delayed_send_result_names_the_requested_queue(broker_factory: Any) -> None:
    async with broker_factory(embedded_namesrv=True, message_delay_level="60s 60s") as broker, \
            ClientInstance(ClientConfig(namesrv_addr=broker.address)) as admin:
        await admin.api.create_topic(broker.address, T, read_queue_nums=4, write_queue_nums=4)
        await wait_until(lambda: admin.update_topic_route_info_from_name_server(T), timeout=5)
        async with Producer(ProducerConfig(producer_group="delay_producer"), instance=admin) as producer:
            mq = MessageQueue(T, broker.config.broker_name, 3)
            result = await producer.send(Message(T, b"later", delay_time_level=2), message_queue=mq)
        # RocketMQ answers the requested queue; the record waits in SCHEDULE_TOPIC_XXXX queue level - 1
        assert result.message_queue == mq
        [parked] = stored_messages(broker, SCHEDULE_TOPIC, 1)
        assert parked.properties[MessageConst.REAL_TOPIC] == T and parked.properties[MessageConst.REAL_QUEUE_ID] == "3"
        assert result.offset_msg_id == parked.msg_id and result.queue_offset == parked.queue_offset
