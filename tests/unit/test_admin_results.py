"""The typed results of trimq.client.admin.Admin turn into the JSON documents docs/ADMIN.md lists."""

from __future__ import annotations

from trimq.client.admin_results import (
    BrokerAddress,
    BrokerFailure,
    ConsumerConnection,
    ConsumerConnections,
    ConsumerRunningInfo,
    ConsumerStatus,
    DeadLetter,
    QueueProgress,
    TopicCreateResult,
    to_document,
)


def test_topic_create_document_has_perm_text_and_errors_only_when_some_broker_failed() -> None:
    ok = TopicCreateResult("T", 4, 4, 6, [BrokerAddress("broker-a", "127.0.0.1:1")], True)
    assert to_document(ok) == {"topic": "T", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6, "permText": "RW-",
                               "brokers": [{"brokerName": "broker-a", "brokerAddr": "127.0.0.1:1"}], "routed": True}
    failed = TopicCreateResult("T", 4, 4, 4, [], False, [BrokerFailure("broker-b", "refused")])
    assert to_document(failed)["errors"] == [{"brokerName": "broker-b", "error": "refused"}]
    assert to_document(failed)["permText"] == "R--"


def test_camel_case_keys_and_merged_extras() -> None:
    row = QueueProgress("T", "broker-a", 1, 9, 5, 4, "c1", 10, 11)
    assert list(to_document(row)) == ["topic", "brokerName", "queueId", "brokerOffset", "consumerOffset", "lag",
                                      "owner", "lastTimestamp", "lastUpdateTimestamp"]
    conns = ConsumerConnections("broker-a", "g", [ConsumerConnection("c1", "127.0.0.1:5", "PYTHON", "0.1.0", 7,
                                                                     {"consumeType": "CONSUME_PASSIVELY"})],
                                {"T": {"subString": "*"}}, "CONSUME_PASSIVELY", "CLUSTERING",
                                "CONSUME_FROM_LAST_OFFSET", True, False, {"future": 1})
    doc = to_document(conns)
    assert doc["brokerName"] == "broker-a" and doc["consistent"] is False and doc["future"] == 1
    assert doc["connectionSet"] == [{"clientId": "c1", "clientAddr": "127.0.0.1:5", "language": "PYTHON",
                                     "version": "0.1.0", "lastUpdateTimestamp": 7, "consumeType": "CONSUME_PASSIVELY"}]
    status = ConsumerStatus("g", "broker-a", [ConsumerRunningInfo("c1", {"running": True, "mqTable": []})])
    assert to_document(status)["clients"] == [{"clientId": "c1", "running": True, "mqTable": []}]
    assert status.clients[0].running and status.clients[0].mq_table == []


def test_dead_letter_keeps_unknown_fields_and_shows_its_body_as_text_or_hex() -> None:
    wire = {"msgId": "AA", "originTopic": "T", "resent": 0, "queueOffset": 3, "body": b"\xff\x01", "newField": "x"}
    dl = DeadLetter.from_wire("broker-a", wire)
    assert dl.msg_id == "AA" and dl.queue_offset == 3 and dl.resent is False and dl.body == b"\xff\x01"
    doc = to_document(dl)
    assert doc["brokerName"] == "broker-a" and doc["newField"] == "x"
    assert (doc["body"], doc["bodyEncoding"]) == ("ff01", "hex")
    assert "body" not in to_document(DeadLetter.from_wire("broker-a", {"msgId": "BB"}))
