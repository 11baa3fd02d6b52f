"""``trimq.testing``'s brokers are real ones, and :class:`trimq.client.admin.Admin` answers with typed results:
one broker with its embedded name server, and two-broker clusters with a standalone or embedded name server."""

from __future__ import annotations

import os

import pytest
import trio

from trimq.client import Message, Producer, PushConsumer
from trimq.client.admin_results import ClusterList, TopicCreateResult, TopicList, TopicStatus, to_document
from trimq.client.consume.common import ConsumeConcurrentlyStatus
from trimq.testing import open_broker, open_cluster


async def test_open_broker_runs_a_broker_with_its_name_server() -> None:
    async with open_broker() as cluster:
        (name, addr), = cluster.broker_addrs.items()
        assert name == "broker-a" and addr == cluster.namesrv_addr
        store = cluster.brokers[name].config.store_dir
        assert os.path.isdir(store)

        created = await cluster.create_topic("HelperT", queues=3)
        assert isinstance(created, TopicCreateResult) and created.routed and created.total_write_queues == 3
        async with Producer(cluster.producer_config()) as producer:
            for i in range(5):
                await producer.send(Message("HelperT", f"m{i}".encode()))
        got: list[bytes] = []
        done = trio.Event()

        async def listener(msgs: list, _ctx: object) -> ConsumeConcurrentlyStatus:
            got.extend(m.body for m in msgs)
            if len(got) >= 5:
                done.set()
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

        consumer = PushConsumer(cluster.consumer_config("helper_group"))
        consumer.subscribe("HelperT", "*")
        consumer.register_message_listener_concurrently(listener)
        async with consumer:
            with trio.fail_after(20):
                await done.wait()
        assert sorted(got) == [f"m{i}".encode() for i in range(5)]

        status = await cluster.admin.topic_status("HelperT")
        assert isinstance(status, TopicStatus) and status.total_messages == 5
        assert [(q.broker_name, q.queue_id) for q in status.queues] == [("broker-a", i) for i in range(3)]
        assert to_document(status)["queues"][0].keys() == {"brokerName", "queueId", "minOffset", "maxOffset",
                                                           "messages", "lastUpdateTimestamp"}
    assert not os.path.exists(store)  # the temporary store goes with the broker


@pytest.mark.parametrize("namesrv", ["standalone", "embedded"])
async def test_open_cluster_registers_every_broker(namesrv: str) -> None:
    async with open_cluster(2, namesrv=namesrv) as cluster:  # type: ignore[arg-type]
        assert sorted(cluster.broker_addrs) == ["broker-a", "broker-b"]
        assert (cluster.namesrv_addr == cluster.broker_addrs["broker-a"]) == (namesrv == "embedded")
        clusters = await cluster.admin.cluster_list()
        assert isinstance(clusters, ClusterList)
        (entry,) = clusters.clusters
        assert {(b.broker_name, b.broker_addr) for b in entry.brokers} == set(cluster.broker_addrs.items())

        created = await cluster.create_topic("SpreadT", queues=2)
        assert sorted(b.broker_name for b in created.brokers) == ["broker-a", "broker-b"]
        assert created.total_write_queues == 4
        topics = await cluster.admin.topic_list()
        assert isinstance(topics, TopicList) and not topics.errors
        (spread,) = [t for t in topics.topics if t.topic == "SpreadT"]
        assert sorted((b.broker_name, b.write_queue_nums) for b in spread.brokers) == [("broker-a", 2), ("broker-b", 2)]
        async with Producer(cluster.producer_config()) as producer:
            queues = await producer.message_queues("SpreadT")
        assert sorted((q.broker_name, q.queue_id) for q in queues) == [(b, q) for b in ("broker-a", "broker-b")
                                                                       for q in range(2)]


async def test_open_cluster_refuses_per_broker_settings() -> None:
    with pytest.raises(ValueError, match="broker_name"):
        async with open_cluster(2, broker_name="x"):
            pass
