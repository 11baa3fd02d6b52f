"""The documents and tables of ``message query``, ``consumer list``, ``consumer delete``, ``topic delete`` and
the reset plan (tools/admin_format.py over client/admin_results.py), and the ACL rules of the deletions."""

from __future__ import annotations

from trimq.broker.acl import required_permissions
from trimq.client.admin_results import (
    BrokerAddress,
    BrokerFailure,
    ConsumerDeleteResult,
    ConsumerGroupEntry,
    ConsumerGroupList,
    MessageQueryResult,
    QueueReset,
    ResetOffsetResult,
    StoredMessage,
    TopicDeleteResult,
    to_document,
)
from trimq.protocol.codes import RequestCode
from trimq.protocol.message import MessageExt
from trimq.tools import admin_format as fmt


def _msg() -> MessageExt:
    return MessageExt(topic="Orders", body=b"hi", flag=0, properties={"KEYS": "order-1 c-9", "UNIQ_KEY": "U1"},
                      queue_id=1, queue_offset=5, commit_log_offset=3100, sys_flag=0, born_timestamp=0,
                      born_host=("127.0.0.1", 1), store_timestamp=0, store_host=("127.0.0.1", 10911),
                      reconsume_times=0, prepared_transaction_offset=0, body_crc=0, store_size=120,
                      msg_id="7F00000100002A9F0000000000000C1C")


def test_message_query() -> None:
    doc = to_document(MessageQueryResult("order-1", "Orders", False, [StoredMessage("broker-a", _msg())],
                                         [BrokerFailure("broker-b", "timeout")]))
    assert doc["key"] == "order-1" and doc["uniqueKey"] is False and doc["messages"][0]["uniqKey"] == "U1"
    text = fmt.render_message_query(doc)
    assert text.splitlines()[0].split() == ["BROKER", "TOPIC", "QID", "OFFSET", "MSG_ID", "UNIQ_KEY", "KEYS", "TAGS",
                                            "STORED"]
    assert "broker-a  Orders    1       5  7F00000100002A9F0000000000000C1C  U1        order-1 c-9" in text
    assert text.splitlines()[-2:] == ["1 message(s) with key order-1 in topic Orders", "error: broker-b: timeout"]


def test_consumer_list_delete_and_topic_delete() -> None:
    groups = ConsumerGroupList([ConsumerGroupEntry("orders", 2, "orderly", "CLUSTERING", "CONSUME_PASSIVELY", 7,
                                                   ["broker-a"]),
                                ConsumerGroupEntry("old", 0, None, None, None, 0, [])])
    doc = to_document(groups)
    assert doc["groups"][0] == {"consumerGroup": "orders", "members": 2, "consumeMode": "orderly",
                                "messageModel": "CLUSTERING", "consumeType": "CONSUME_PASSIVELY", "totalLag": 7,
                                "brokers": ["broker-a"]}
    assert fmt.render_consumer_list(doc).splitlines() == [
        "GROUP   MEMBERS  MODE     MODEL       LAG  BROKERS",
        "orders        2  orderly  CLUSTERING    7  broker-a",
        "old           0  -        -             0  -",
        "2 consumer groups",
    ]
    deleted = to_document(ConsumerDeleteResult("orders", ["broker-a"], True, ["c1"]))
    assert fmt.render_consumer_delete(deleted) == ("consumer group orders deleted and its stored offsets on "
                                                   "broker-a; 1 member(s) were online: c1")
    gone = to_document(TopicDeleteResult("Orders", [BrokerAddress("broker-a", "127.0.0.1:10911")], ["127.0.0.1:9876"]))
    assert fmt.render_topic_delete(gone) == ("topic Orders deleted on broker-a (127.0.0.1:10911) and from "
                                             "127.0.0.1:9876")


def test_reset_plan() -> None:
    plan = ResetOffsetResult("orders", "Orders", 0, True, True, [QueueReset("broker-a", 0, 5, 0)], [], [],
                             dry_run=True, reset_generations={"broker-a": 0})
    doc = to_document(plan)
    assert doc["dryRun"] is True and doc["resetGenerations"] == {"broker-a": 0}
    assert fmt.render_reset_offset(doc).splitlines() == [
        "BROKER    QID  CURRENT_OFFSET  NEW_OFFSET",
        "broker-a    0               5           0",
        "plan for group orders on Orders (online: its members will be told): nothing changed; run again with "
        "--execute to apply it",
    ]


def test_deletions_need_an_admin_account() -> None:
    for code, ext in ((RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "T"}),
                      (RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": "g"}),
                      (RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "T"})):
        assert required_permissions(code, ext, None).admin
