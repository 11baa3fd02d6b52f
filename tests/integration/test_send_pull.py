"""SEND / SEND_BATCH / PULL and the topic admin requests against a real in-process broker over TCP."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from trimq.broker.broker import Broker
from trimq.protocol.codes import RequestCode, ResponseCode
from trimq.protocol.command import RemotingCommand
from trimq.protocol.message import encode_properties
from trimq.protocol.record import iter_records, parse_message_id
from trimq.runtime.client import RemotingClient

RC = RequestCode


async def call(rc: RemotingClient, addr: str, code: int, ext: dict[str, Any] | None = None, body: Any = None
               ) -> RemotingCommand:
    return await rc.invoke(addr, RemotingCommand.request(code, ext or {}, body), timeout_s=10)


def send_ext(topic: str, queue_id: int, **props: str) -> dict[str, Any]:
    return {"producerGroup": "pg", "topic": topic, "queueId": queue_id, "sysFlag": 0, "bornTimestamp": 1234,
            "flag": 0, "properties": encode_properties(props)}


def pull_ext(topic: str, queue_id: int, offset: int, **kw: Any) -> dict[str, Any]:
    return {"consumerGroup": "cg", "topic": topic, "queueId": queue_id, "queueOffset": offset, "maxMsgNums": 32,
            "sysFlag": 0, "commitOffset": 0, "suspendTimeoutMillis": 0, "subscription": "*", "subVersion": 0, **kw}


async def send(rc: RemotingClient, addr: str, topic: str, qid: int, body: bytes, **props: str) -> RemotingCommand:
    return await call(rc, addr, RC.SEND_MESSAGE, send_ext(topic, qid, **props), body)


async def store_state(b: Broker) -> tuple[int, dict[str, list[int]]]:
    st = b.store
    return st.commitlog.max_offset, {t: [cq.max_offset for cq in qs.values()] for t, qs in st.queues.items()}


async def test_send_then_pull_in_order_with_msg_ids(broker_factory: Callable[..., Any], rclient: RemotingClient
                                                    ) -> None:
    async with broker_factory() as b:
        addr = b.address
        ids = []
        for i in range(40):
            r = await send(rclient, addr, "Orders", 1, b"order-%d" % i, KEYS=f"k{i}", TAGS="paid")
            assert r.code == ResponseCode.SUCCESS, r.remark
            assert r.ext["queueId"] == 1 and r.ext["queueOffset"] == i
            ids.append(r.ext["msgId"])
        host, offset = parse_message_id(ids[3])
        assert host == ("127.0.0.1", b.server.addresses[0][1])
        got: list[Any] = []
        offset = 0
        while True:
            r = await call(rclient, addr, RC.PULL_MESSAGE, pull_ext("Orders", 1, offset))
            if r.code != ResponseCode.SUCCESS:
                assert r.code == ResponseCode.PULL_NOT_FOUND and r.ext["nextBeginOffset"] == 40
                break
            assert isinstance(r.body, bytes)
            got.extend(iter_records(r.body))
            assert r.ext["nextBeginOffset"] > offset and r.ext["maxOffset"] == 40 and r.ext["minOffset"] == 0
            offset = r.ext["nextBeginOffset"]
        assert [m.body for m in got] == [b"order-%d" % i for i in range(40)]
        assert [m.queue_offset for m in got] == list(range(40))
        assert [m.msg_id for m in got] == ids
        assert got[0].keys == "k0" and got[0].tags == "paid" and got[0].born_timestamp == 1234
        assert got[0].born_host[0] == "127.0.0.1"
        # VIEW_MESSAGE_BY_ID takes the commit-log offset from the id.
        _, phys = parse_message_id(ids[5])
        r = await call(rclient, addr, RC.VIEW_MESSAGE_BY_ID, {"offset": phys})
        assert r.code == ResponseCode.SUCCESS and next(iter_records(r.body)).body == b"order-5"
        r = await call(rclient, addr, RC.VIEW_MESSAGE_BY_ID, {"offset": phys + 1})
        assert r.code == ResponseCode.SYSTEM_ERROR and "offset" in (r.remark or "")


async def test_batch_send_is_one_append_to_one_queue(broker_factory: Callable[..., Any], rclient: RemotingClient
                                                     ) -> None:
    async with broker_factory() as b:
        items = [{"body": b"b%d" % i, "properties": encode_properties({"TAGS": "x"}), "flag": i} for i in range(50)]
        r = await call(rclient, b.address, RC.SEND_BATCH_MESSAGE, send_ext("Batch", 2), items)
        assert r.code == ResponseCode.SUCCESS, r.remark
        assert r.ext["queueOffset"] == 0 and len(r.ext["msgId"].split(",")) == 50
        r = await call(rclient, b.address, RC.PULL_MESSAGE, pull_ext("Batch", 2, 0, maxMsgNums=100))
        msgs = list(iter_records(r.body))
        assert [m.body for m in msgs] == [b"b%d" % i for i in range(32)]  # capped at 32 per pull
        assert [m.flag for m in msgs[:3]] == [0, 1, 2]
        for bad_body, why in (([], "non-empty"), ([{"body": "text"}], "bin"), ([5], "not a map"), (b"x", "array")):
            r = await call(rclient, b.address, RC.SEND_BATCH_MESSAGE, send_ext("Batch", 2), bad_body)
            assert r.code == ResponseCode.MESSAGE_ILLEGAL and why in (r.remark or ""), (bad_body, r.remark)


async def test_tag_filtering_by_hash_and_retry_immediately(broker_factory: Callable[..., Any],
                                                           rclient: RemotingClient) -> None:
    async with broker_factory() as b:
        for i in range(10):
            await send(rclient, b.address, "Tags", 0, b"%d" % i, TAGS="A" if i % 3 == 0 else "B")
        await send(rclient, b.address, "Tags", 0, b"untagged")
        r = await call(rclient, b.address, RC.PULL_MESSAGE, pull_ext("Tags", 0, 0, subscription="A || C"))
        assert r.code == ResponseCode.SUCCESS
        assert [m.body for m in iter_records(r.body)] == [b"0", b"3", b"6", b"9"]
        assert r.ext["nextBeginOffset"] == 11
        r = await call(rclient, b.address, RC.PULL_MESSAGE, pull_ext("Tags", 0, 1, subscription="C"))
        assert (r.code, r.ext["nextBeginOffset"], r.body) == (ResponseCode.PULL_RETRY_IMMEDIATELY, 11, None)
        for everything in ("*", "", " * "):
            r = await call(rclient, b.address, RC.PULL_MESSAGE, pull_ext("Tags", 0, 10, subscription=everything))
            assert [m.body for m in iter_records(r.body)] == [b"untagged"]


async def test_pull_offsets_follow_rocketmq(broker_factory: Callable[..., Any], rclient: RemotingClient) -> None:
    async with broker_factory() as b:
        a = b.address
        for i in range(5):
            await send(rclient, a, "Off", 0, b"%d" % i)
        await send(rclient, a, "Off", 3, b"other queue")

        async def pull(qid: int, offset: int) -> tuple[int, int]:
            r = await call(rclient, a, RC.PULL_MESSAGE, pull_ext("Off", qid, offset))
            return r.code, r.ext.get("nextBeginOffset", -1)

        assert await pull(0, 5) == (ResponseCode.PULL_NOT_FOUND, 5)  # at max: nothing new
        assert await pull(0, 99) == (ResponseCode.PULL_OFFSET_MOVED, 5)  # beyond max: moved to max
        assert await pull(1, 0) == (ResponseCode.PULL_NOT_FOUND, 0)  # empty queue at 0
        assert await pull(1, 7) == (ResponseCode.PULL_OFFSET_MOVED, 0)  # empty queue, offset != 0
        before = await store_state(b)
        r = await call(rclient, a, RC.PULL_MESSAGE, pull_ext("Off", 0, -1))
        assert r.code == ResponseCode.SYSTEM_ERROR and "negative" in (r.remark or "")
        r = await call(rclient, a, RC.PULL_MESSAGE, pull_ext("Off", 4, 0))
        assert r.code == ResponseCode.SYSTEM_ERROR and "queueId[4] is illegal" in (r.remark or "")
        r = await call(rclient, a, RC.PULL_MESSAGE, pull_ext("Nope", 0, 0))
        assert r.code == ResponseCode.TOPIC_NOT_EXIST
        r = await call(rclient, a, RC.PULL_MESSAGE, {"topic": "Off", "queueId": 0, "queueOffset": 0})
        assert r.code == ResponseCode.SYSTEM_ERROR and "consumerGroup" in (r.remark or "")
        r = await call(rclient, a, RC.PULL_MESSAGE, {**pull_ext("Off", 0, 0), "queueOffset": "zero"})
        assert r.code == ResponseCode.SYSTEM_ERROR and "queueOffset" in (r.remark or "")
        assert await store_state(b) == before


async def test_bad_sends_get_the_right_code_and_change_nothing(broker_factory: Callable[..., Any],
                                                               rclient: RemotingClient) -> None:
    async with broker_factory(max_message_size=8 * 1024, auto_create_topic_enable=True) as b:
        a = b.address
        await send(rclient, a, "Good", 0, b"first")
        before = await store_state(b)
        topics_before = set(b.topic_config_manager.all())
        cases = [
            (send_ext("Good", 0), b"x" * 9000, ResponseCode.MESSAGE_ILLEGAL, "maximum"),
            (send_ext("NewTopic", 0), b"x" * 9000, ResponseCode.MESSAGE_ILLEGAL, "maximum"),
            (send_ext("Good", 0, K="v" * 40000), b"x", ResponseCode.MESSAGE_ILLEGAL, "properties"),
            (send_ext("bad topic!", 0), b"x", ResponseCode.SYSTEM_ERROR, "illegal characters"),
            (send_ext("T" * 128, 0), b"x", ResponseCode.SYSTEM_ERROR, "maximum is 127"),
            (send_ext("", 0), b"x", ResponseCode.SYSTEM_ERROR, "empty"),
            (send_ext("Good", 4), b"x", ResponseCode.SYSTEM_ERROR, "queueId[4] is illegal"),
            (send_ext("SCHEDULE_TOPIC_XXXX", 0), b"x", ResponseCode.NO_PERMISSION, "forbidden"),
            (send_ext("Good", 0), None, ResponseCode.MESSAGE_ILLEGAL, "body"),
            ({**send_ext("Good", 0), "queueId": "q"}, b"x", ResponseCode.SYSTEM_ERROR, "queueId"),
            ({**send_ext("Good", 0), "properties": 5}, b"x", ResponseCode.SYSTEM_ERROR, "properties"),
            # Found by the broker fuzz test: ints that do not fit their record field failed in the store.
            ({**send_ext("Good", 0), "flag": 2**31}, b"x", ResponseCode.SYSTEM_ERROR, "'flag' = 2147483648"),
            ({**send_ext("Good", 0), "sysFlag": -(2**31) - 1}, b"x", ResponseCode.SYSTEM_ERROR, "int32"),
            ({**send_ext("Good", 0), "reconsumeTimes": 2**40}, b"x", ResponseCode.SYSTEM_ERROR, "reconsumeTimes"),
            ({**send_ext("Good", 0), "bornTimestamp": 2**63}, b"x", ResponseCode.SYSTEM_ERROR, "int64"),
        ]
        for ext, body, code, remark in cases:
            r = await call(rclient, a, RC.SEND_MESSAGE, ext, body)
            assert r.code == code and remark in (r.remark or ""), (ext.get("topic"), r.code, r.remark)
        assert await store_state(b) == before
        assert set(b.topic_config_manager.all()) == topics_before
        # The connection survived all of it.
        r = await send(rclient, a, "Good", 0, b"second")
        assert r.code == ResponseCode.SUCCESS and r.ext["queueOffset"] == 1


async def test_unknown_topic_without_auto_create(broker_factory: Callable[..., Any], rclient: RemotingClient
                                                 ) -> None:
    async with broker_factory(auto_create_topic_enable=False) as b:
        r = await send(rclient, b.address, "Unknown", 0, b"x")
        assert r.code == ResponseCode.TOPIC_NOT_EXIST and "Unknown" in (r.remark or "")
        r = await call(rclient, b.address, RC.UPDATE_AND_CREATE_TOPIC,
                       {"topic": "Unknown", "readQueueNums": 8, "writeQueueNums": 8, "perm": 6})
        assert r.code == ResponseCode.SUCCESS
        r = await send(rclient, b.address, "Unknown", 7, b"x")
        assert r.code == ResponseCode.SUCCESS


async def test_topic_admin_and_offset_queries(broker_factory: Callable[..., Any], rclient: RemotingClient,
                                              tmp_path: Path) -> None:
    store = tmp_path / "admin-store"
    async with broker_factory(store_dir=str(store)) as b:
        a = b.address
        r = await call(rclient, a, RC.UPDATE_AND_CREATE_TOPIC,
                       {"topic": "Admin", "readQueueNums": 2, "writeQueueNums": 2, "perm": 6})
        assert r.code == ResponseCode.SUCCESS
        assert (store / "config" / "topics.json").exists()
        for bad, why in (({"topic": "a b"}, "illegal"), ({"topic": "X", "readQueueNums": 0}, "readQueueNums"),
                         ({"topic": "X", "perm": 9}, "perm"), ({"topic": "SCHEDULE_TOPIC_XXXX"}, "system")):
            r = await call(rclient, a, RC.UPDATE_AND_CREATE_TOPIC, bad)
            assert r.code == ResponseCode.SYSTEM_ERROR and why in (r.remark or ""), r.remark
        r = await call(rclient, a, RC.GET_ALL_TOPIC_CONFIG)
        assert r.body["topicConfigTable"]["Admin"]["readQueueNums"] == 2
        stamps = []
        for i in range(3):
            r = await send(rclient, a, "Admin", 1, b"%d" % i)
            m = (await call(rclient, a, RC.VIEW_MESSAGE_BY_ID, {"offset": parse_message_id(r.ext["msgId"])[1]}))
            stamps.append(next(iter_records(m.body)).store_timestamp)
        q = {"topic": "Admin", "queueId": 1}
        assert (await call(rclient, a, RC.GET_MAX_OFFSET, q)).ext["offset"] == 3
        assert (await call(rclient, a, RC.GET_MIN_OFFSET, q)).ext["offset"] == 0
        assert (await call(rclient, a, RC.GET_EARLIEST_MSG_STORETIME, q)).ext["timestamp"] == stamps[0]
        r = await call(rclient, a, RC.SEARCH_OFFSET_BY_TIMESTAMP, {**q, "timestamp": stamps[-1]})
        assert r.ext["offset"] == stamps.index(stamps[-1])
        r = await call(rclient, a, RC.SEARCH_OFFSET_BY_TIMESTAMP, {**q, "timestamp": stamps[-1] + 1})
        assert r.ext["offset"] == 3
        assert (await call(rclient, a, RC.GET_MAX_OFFSET, {"topic": "Admin", "queueId": 0})).ext["offset"] == 0
        assert (await call(rclient, a, RC.GET_EARLIEST_MSG_STORETIME,
                           {"topic": "Admin", "queueId": 0})).ext["timestamp"] == -1
        r = await call(rclient, a, RC.GET_MAX_OFFSET, {"topic": "Admin"})
        assert r.code == ResponseCode.SYSTEM_ERROR and "queueId" in (r.remark or "")
    # Topics and messages survive a restart.
    async with broker_factory(store_dir=str(store)) as b:
        cfg = b.topic_config_manager.get("Admin")
        assert (cfg.read_queue_nums, cfg.write_queue_nums) == (2, 2)
        assert (await call(rclient, b.address, RC.GET_MAX_OFFSET, {"topic": "Admin", "queueId": 1})).ext["offset"] == 3


async def test_pull_commits_the_offset_through_the_offset_manager(broker_factory: Callable[..., Any],
                                                                  rclient: RemotingClient) -> None:
    async with broker_factory() as b:
        om = b.offset_manager
        await send(rclient, b.address, "Commit", 0, b"x")
        r = await call(rclient, b.address, RC.PULL_MESSAGE,
                       pull_ext("Commit", 0, 1, sysFlag=0x1, commitOffset=1))
        assert r.code == ResponseCode.PULL_NOT_FOUND
        assert om is not None and om.query_offset("cg", "Commit", 0) == 1


async def test_topics_lost_in_a_crash_window_are_recreated_from_the_store(
    broker_factory: Callable[..., Any], rclient: RemotingClient, tmp_path: Path
) -> None:
    store = tmp_path / "window"
    async with broker_factory(store_dir=str(store), default_topic_queue_nums=2) as b:
        r = await send(rclient, b.address, "Window", 1, b"x")
        assert r.code == ResponseCode.SUCCESS
    (store / "config" / "topics.json").unlink()
    async with broker_factory(store_dir=str(store), default_topic_queue_nums=2) as b:
        cfg = b.topic_config_manager.get("Window")
        assert cfg is not None and cfg.read_queue_nums == 2
        r = await call(rclient, b.address, RC.PULL_MESSAGE, pull_ext("Window", 1, 0))
        assert [m.body for m in iter_records(r.body)] == [b"x"]
