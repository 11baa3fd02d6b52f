"""``Admin.consumer_list``, ``consumer_delete``, ``topic_delete`` and the reset plan on a real two-broker cluster
(DELETE_SUBSCRIPTIONGROUP 207, DELETE_TOPIC_IN_BROKER 215, DELETE_TOPIC_IN_NAMESRV 216, the dry run of 222)."""

from __future__ import annotations

import os
from typing import Any

import pytest
import trio

from trimq.client import ConsumeConcurrentlyStatus, Message, Producer, PushConsumer
from trimq.client.admin import AdminError
from trimq.protocol.codes import RequestCode, ResponseCode
from trimq.protocol.command import RemotingCommand
from trimq.runtime.client import RemotingClient
from trimq.testing import open_cluster

T = "AgTopic"


async def _wait(pred: Any, timeout: float = 10) -> None:
    with trio.fail_after(timeout):
        while not await pred():
            await trio.sleep(0.02)


async def test_list_delete_groups_and_topics() -> None:
    async with open_cluster(2) as cluster, RemotingClient() as rc:
        admin = cluster.admin
        await cluster.create_topic(T, queues=1)
        async with Producer(cluster.producer_config("ag_p")) as producer:
            for i in range(6):
                await producer.send(Message(T, b"m%d" % i))
        # An offline group with a config and stored offsets: one message of each broker consumed.
        for name, addr in cluster.broker_addrs.items():
            r = await rc.invoke(addr, RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {},
                                                              {"groupName": "ag_offline"}))
            assert r.code == ResponseCode.SUCCESS, (name, r.remark)
            r = await rc.invoke(addr, RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, {
                "consumerGroup": "ag_offline", "topic": T, "queueId": 0, "commitOffset": 1}))
            assert r.code == ResponseCode.SUCCESS, (name, r.remark)

        seen: list[bytes] = []

        async def listener(msgs: list[Any], context: Any) -> ConsumeConcurrentlyStatus:
            seen.extend(m.body for m in msgs)
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

        consumer = PushConsumer(cluster.consumer_config("ag_online", persist_consumer_offset_interval=50))
        consumer.subscribe(T, "*")
        consumer.register_message_listener_concurrently(listener)
        async with consumer:
            async def listed() -> bool:
                groups = {g.consumer_group: g for g in (await admin.consumer_list()).groups}
                on = groups.get("ag_online")
                return on is not None and on.members == 1 and on.total_lag == 0

            await _wait(listed)
            groups = {g.consumer_group: g for g in (await admin.consumer_list()).groups}
            on, off = groups["ag_online"], groups["ag_offline"]
            assert (on.consume_mode, on.message_model, on.brokers) == ("concurrently", "CLUSTERING",
                                                                       ["broker-a", "broker-b"])
            assert (off.members, off.consume_mode, off.total_lag) == (0, None, 6 - 2)

            # A reset plan changes nothing.
            plan = await admin.reset_offset("ag_online", T, 0, dry_run=True)
            assert plan.dry_run and plan.online and plan.clients == []
            assert {(q.broker_name, q.offset) for q in plan.queues} == {("broker-a", 0), ("broker-b", 0)}
            assert plan.reset_generations == {"broker-a": 0, "broker-b": 0}
            progress = await admin.consumer_progress("ag_online", T)
            assert progress.total_lag == 0

            with pytest.raises(AdminError, match="live member"):
                await admin.consumer_delete("ag_online")
            forced = await admin.consumer_delete("ag_online", force=True)
            assert forced.members == [consumer.client_id] and forced.brokers == ["broker-a", "broker-b"]

        deleted = await admin.consumer_delete("ag_offline")
        assert deleted.offsets_removed and deleted.members == []
        group_names = {g.consumer_group for g in (await admin.consumer_list()).groups}
        assert "ag_offline" not in group_names
        left = await admin.consumer_progress("ag_offline", T)
        assert {q.consumer_offset for q in left.queues} == {-1}  # its offsets went with it

        # Topics: the config, the queues and the offsets stored for it on the brokers, the route on the name server.
        r = await rc.invoke(cluster.broker_addrs["broker-a"], RemotingCommand.request(
            RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "ag_kept", "topic": T, "queueId": 0,
                                                 "commitOffset": 2}))
        assert r.code == ResponseCode.SUCCESS
        store_a = cluster.brokers["broker-a"].config.store_dir
        assert os.path.isdir(os.path.join(store_a, "consumequeue", T))
        gone = await admin.topic_delete(T)
        assert [b.broker_name for b in gone.brokers] == ["broker-a", "broker-b"]
        assert gone.namesrvs == [cluster.namesrv_addr]
        assert T not in [t.topic for t in (await admin.topic_list()).topics]
        for broker in cluster.brokers.values():
            assert broker.topic_config_manager.get(T) is None
            assert broker.store.find_consume_queue(T, 0) is None
            assert broker.offset_manager.queue_offsets("ag_kept", T) == {}
        assert not os.path.exists(os.path.join(store_a, "consumequeue", T))
        r = await rc.invoke(cluster.broker_addrs["broker-a"], RemotingCommand.request(
            RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "SCHEDULE_TOPIC_XXXX"}))
        assert r.code == ResponseCode.SYSTEM_ERROR and "system topic" in (r.remark or "")
