"""Producer and client-instance pieces that need no broker: validation, queue choice, ids, route parsing."""

from __future__ import annotations

import os
import re

import pytest

from trimq.client.api import parse_route
from trimq.client.config import ClientConfig
from trimq.client.errors import (
    ClientIdConflictError,
    EmptyBodyError,
    ForbiddenTopicError,
    InvalidMessageError,
    InvalidTopicError,
    MessageTooLargeError,
    MQClientError,
)
from trimq.client.instance import ClientInstance, TopicPublishInfo, build_client_id
from trimq.client.producer import UniqIdGenerator, validate_message
from trimq.protocol.message import Message
from trimq.protocol.message_queue import MessageQueue
from trimq.protocol.route import BrokerData, QueueData, TopicRouteData


def test_validate_message_errors_are_specific() -> None:
    validate_message(Message("T", b"x"), 10)
    with pytest.raises(InvalidTopicError, match="topic name is empty"):
        validate_message(Message("", b"x"), 10)
    with pytest.raises(InvalidTopicError, match="illegal characters"):
        validate_message(Message("a/b", b"x"), 10)
    with pytest.raises(ForbiddenTopicError, match="SCHEDULE_TOPIC_XXXX"):
        validate_message(Message("SCHEDULE_TOPIC_XXXX", b"x"), 10)
    with pytest.raises(EmptyBodyError, match="empty"):
        validate_message(Message("T", b""), 10)
    with pytest.raises(EmptyBodyError, match="missing"):
        validate_message(Message("T", None), 10)  # type: ignore[arg-type]
    with pytest.raises(InvalidMessageError, match="must be bytes"):
        validate_message(Message("T", "text"), 10)  # type: ignore[arg-type]
    with pytest.raises(MessageTooLargeError, match="11 bytes; the maximum is 10"):
        validate_message(Message("T", b"x" * 11), 10)
    with pytest.raises(InvalidMessageError, match="delay_time_level must be >= 0"):
        validate_message(Message("T", b"x", delay_time_level=-1), 10)
    with pytest.raises(InvalidMessageError, match="reserved separator"):
        validate_message(Message("T", b"x", properties={"k": "a\x01b"}), 10)
    with pytest.raises(InvalidMessageError, match="properties take"):
        validate_message(Message("T", b"x", properties={"k": "v" * 40000}), 10)
    with pytest.raises(InvalidMessageError, match=r"expected a protocol\.message\.Message"):
        validate_message("hello", 10)


def test_delay_level_goes_into_the_delay_property() -> None:
    assert Message("T", b"x", delay_time_level=3).all_properties()["DELAY"] == "3"


def mqs(*spec: tuple[str, int]) -> list[MessageQueue]:
    return [MessageQueue("T", b, q) for b, q in spec]


def test_select_one_message_queue_round_robin_and_avoids_last_broker() -> None:
    info = TopicPublishInfo(mqs(("a", 0), ("a", 1), ("b", 0), ("b", 1)), send_which_queue=0)
    assert [info.select_one_message_queue().queue_id for _ in range(4)] == [1, 0, 1, 0]
    assert [info.select_one_message_queue().broker_name for _ in range(4)] == ["a", "b", "b", "a"]
    for _ in range(10):
        assert info.select_one_message_queue("a").broker_name == "b"
    single = TopicPublishInfo(mqs(("a", 0), ("a", 1)))
    assert single.select_one_message_queue("a").broker_name == "a"  # no other broker: use it anyway
    with pytest.raises(MQClientError):
        TopicPublishInfo([]).select_one_message_queue()


def test_uniq_ids_are_32_hex_and_unique() -> None:
    gen = UniqIdGenerator("10.1.2.3")
    ids = [gen.next_id(1_700_000_000_000 + i) for i in range(1000)]
    assert len(set(ids)) == 1000
    assert all(re.fullmatch(r"[0-9A-F]{32}", i) for i in ids)
    assert ids[0].startswith("0A010203")


def test_client_id_format_and_conflicts() -> None:
    assert build_client_id("10.0.0.1", "", pid=42) == "10.0.0.1@42"
    assert build_client_id("10.0.0.1", "orders", pid=42) == "10.0.0.1@42@orders"
    assert ClientInstance(ClientConfig(client_ip="1.2.3.4")).client_id == f"1.2.3.4@{os.getpid()}"


async def test_two_instances_in_one_process_get_distinct_ids() -> None:
    cfg = ClientConfig(client_ip="1.2.3.4")
    async with ClientInstance(cfg) as a, ClientInstance(cfg) as b:
        assert a.client_id == f"1.2.3.4@{os.getpid()}"
        assert b.client_id == f"1.2.3.4@{os.getpid()}@2"
        named = ClientConfig(client_ip="1.2.3.4", instance_name="x")
        async with ClientInstance(named):
            with pytest.raises(ClientIdConflictError, match="instance_name"):
                async with ClientInstance(named):
                    pass
    async with ClientInstance(cfg) as c:  # ids are released on exit
        assert c.client_id == f"1.2.3.4@{os.getpid()}"


def test_route_parsing_and_queue_sets() -> None:
    body = {
        "brokerDatas": [{"cluster": "C", "brokerName": "b", "brokerAddrs": {"0": "h:2"}},
                        {"cluster": "C", "brokerName": "a", "brokerAddrs": {"0": "h:1", "1": "h:9"}},
                        {"cluster": "C", "brokerName": "slave-only", "brokerAddrs": {"1": "h:3"}}],
        "queueDatas": [{"brokerName": "b", "readQueueNums": 2, "writeQueueNums": 1, "perm": 6},
                       {"brokerName": "a", "readQueueNums": 1, "writeQueueNums": 2, "perm": 6},
                       {"brokerName": "slave-only", "readQueueNums": 1, "writeQueueNums": 1, "perm": 6},
                       {"brokerName": "ro", "readQueueNums": 1, "writeQueueNums": 1, "perm": 4}],
    }
    route = parse_route(body, "ns")
    assert route.broker_datas[1] == BrokerData("C", "a", {0: "h:1", 1: "h:9"})
    assert route.queue_datas[0] == QueueData("b", 2, 1, 6, 0)
    # writable queues of brokers with a master, in broker-name order
    assert [(m.broker_name, m.queue_id) for m in route.publish_queues("T")] == [("a", 0), ("a", 1), ("b", 0)]
    assert {(m.broker_name, m.queue_id) for m in route.subscribe_queues("T")} == {
        ("a", 0), ("b", 0), ("b", 1), ("slave-only", 0), ("ro", 0)}
    with pytest.raises(MQClientError, match="malformed GET_ROUTEINFO_BY_TOPIC"):
        parse_route({"queueDatas": [{"brokerName": "a", "readQueueNums": "x"}]}, "ns")
    assert TopicRouteData((), ()).publish_queues("T") == []
