"""QUERY_MESSAGE (broker/processors/query.py) and ``Admin.message_query`` on a real two-broker cluster: by key
and by unique key, across brokers, with and without a topic, time ranges and maxNum, RocketMQ's wire fields
(ext, QUERY_NOT_FOUND, ``_UNIQUE_KEY_QUERY``) and an answer only of records that really match."""

from __future__ import annotations

from typing import Any

from trimq.client import Message, Producer
from trimq.protocol.codes import RequestCode, ResponseCode
from trimq.protocol.command import RemotingCommand
from trimq.protocol.record import decode_records
from trimq.runtime.client import RemotingClient
from trimq.testing import open_cluster

SMALL_INDEX: dict[str, Any] = {"max_hash_slot_num": 64, "max_index_num": 256}


async def test_query_by_key_across_brokers() -> None:
    async with open_cluster(2, **SMALL_INDEX) as cluster:
        admin = cluster.admin
        await cluster.create_topic("QOrders", queues=2)
        await cluster.create_topic("QOther", queues=1)
        sent = {}
        async with Producer(cluster.producer_config("q_p")) as producer:
            for i in range(8):  # round robin over the four queues of the two brokers
                result = await producer.send(Message("QOrders", b"o%d" % i, keys=["order-1" if i % 2 else "order-2",
                                                                                  f"n{i}"]))
                sent[i] = result
            await producer.send(Message("QOther", b"x", keys="order-1"))
            await producer.send(Message("QOrders", b"Aa", keys="Aa"))  # the hash of "Aa" equals that of "BB"

        res = await admin.message_query("order-1", "QOrders")
        assert sorted(s.message.body for s in res.messages) == [b"o1", b"o3", b"o5", b"o7"]
        times = [s.message.store_timestamp for s in res.messages]
        assert times == sorted(times)  # oldest first (brokers' clocks; within one ms by broker name)
        assert {s.broker_name for s in res.messages} == {"broker-a", "broker-b"} and res.errors == []
        everywhere = await admin.message_query("order-1")  # no topic: every topic of every broker
        assert sorted(s.message.body for s in everywhere.messages) == [b"o1", b"o3", b"o5", b"o7", b"x"]
        uniq = sent[4].msg_id
        by_id = await admin.message_query(uniq, "QOrders", unique_key=True)
        assert [s.message.body for s in by_id.messages] == [b"o4"]
        assert (await admin.message_query(uniq, "QOrders")).messages == []  # a unique key is not one of KEYS
        assert (await admin.message_query("BB", "QOrders")).messages == []
        assert len((await admin.message_query("order-2", "QOrders", max_num=1)).messages) == 2  # one per broker
        last = res.messages[-1].message.store_timestamp
        assert (await admin.message_query("order-1", "QOrders", begin_ms=last + 1)).messages == []

        # The wire, as RocketMQ's client speaks it (string ext fields)
        a = cluster.broker_addrs["broker-a"]
        async with RemotingClient(default_timeout_s=10) as rc:
            async def query(ext: dict[str, Any]) -> RemotingCommand:
                return await rc.invoke(a, RemotingCommand.request(RequestCode.QUERY_MESSAGE, ext))

            r = await query({"topic": "QOrders", "key": "order-1", "maxNum": "32", "beginTimestamp": "0",
                             "endTimestamp": str(2**63 - 1)})
            assert r.code == ResponseCode.SUCCESS
            msgs = decode_records(r.body)
            assert msgs and all("order-1" in (m.keys or "").split(" ") for m in msgs)
            assert r.ext["indexLastUpdatePhyoffset"] >= msgs[-1].commit_log_offset
            assert r.ext["indexLastUpdateTimestamp"] >= msgs[-1].store_timestamp
            r = await query({"topic": "QOrders", "key": "nothing", "maxNum": 32, "beginTimestamp": 0,
                             "endTimestamp": 2**63 - 1})
            assert (r.code, r.remark) == (ResponseCode.QUERY_NOT_FOUND,
                                          "can not find message, maybe time range not correct")
            b = cluster.broker_addrs[sent[4].message_queue.broker_name]
            r = await rc.invoke(b, RemotingCommand.request(RequestCode.QUERY_MESSAGE, {
                "topic": "QOrders", "key": uniq, "maxNum": 1, "beginTimestamp": 0, "endTimestamp": 2**63 - 1,
                "_UNIQUE_KEY_QUERY": "true"}))
            assert [m.body for m in decode_records(r.body)] == [b"o4"]
            r = await query({"topic": "QOrders"})
            assert r.code == ResponseCode.SYSTEM_ERROR and "key" in (r.remark or "")


async def test_index_switched_off_answers_not_found() -> None:
    async with open_cluster(1, message_index_enable=False) as cluster:
        await cluster.create_topic("QOff", queues=1)
        async with Producer(cluster.producer_config("q_off")) as producer:
            await producer.send(Message("QOff", b"m", keys="k"))
        assert (await cluster.admin.message_query("k", "QOff")).messages == []
