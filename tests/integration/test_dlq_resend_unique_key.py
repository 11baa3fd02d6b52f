"""RESEND_DLQ_MESSAGES finds the original queue of a dead letter whose ORIGIN_MESSAGE_ID is a unique key (orderly
dead letters and the client's fallback copies) through the message index, as it does for an offset message id.
Without the index (switched off) such a dead letter went to queue 0: the bug this catches."""

from __future__ import annotations

from typing import Any

import pytest

from trimq.protocol.codes import RequestCode, ResponseCode
from trimq.protocol.message import MessageConst, encode_properties
from trimq.protocol.record import decode_records
from trimq.runtime.client import RemotingClient

T = "RsTopic"
G = "rs_group"


@pytest.mark.parametrize("indexed", [True, False])
async def test_resend_by_unique_key_goes_to_the_original_queue(broker_factory: Any, call: Any, indexed: bool) -> None:
    async with broker_factory(message_index_enable=indexed) as broker, RemotingClient() as rc:
        a = broker.address
        assert (await call(rc, a, RequestCode.UPDATE_AND_CREATE_TOPIC,
                           {"topic": T, "readQueueNums": 4, "writeQueueNums": 4, "perm": 6})).code == 0
        props = encode_properties({MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: "UQ-ORIGINAL-1", "KEYS": "k"})
        r = await call(rc, a, RequestCode.SEND_MESSAGE, {"producerGroup": "p", "topic": T, "queueId": 2,
                                                         "sysFlag": 0, "bornTimestamp": 0, "flag": 0,
                                                         "properties": props}, b"original")
        assert r.code == ResponseCode.SUCCESS, r.remark
        pulled = await call(rc, a, RequestCode.PULL_MESSAGE, {"consumerGroup": G, "topic": T, "queueId": 2,
                                                              "queueOffset": 0, "maxMsgNums": 1, "sysFlag": 0})
        [original] = decode_records(pulled.body)
        # An orderly consumer's dead letter: the client's count, ORIGIN_MESSAGE_ID = the unique key
        r = await call(rc, a, RequestCode.CONSUMER_SEND_MSG_BACK, {
            "group": G, "offset": original.commit_log_offset, "delayLevel": 0, "originMsgId": original.msg_id,
            "originTopic": T, "reconsumeTimes": 3, "maxReconsumeTimes": 2})
        assert r.code == ResponseCode.SUCCESS, r.remark
        dlq = await call(rc, a, RequestCode.QUERY_DLQ_MESSAGES, {"consumerGroup": G, "offset": 0, "maxNums": 10})
        [dead] = dlq.body["messages"]
        assert dead["originMsgId"] == "UQ-ORIGINAL-1"  # a unique key: no offset to follow

        r = await call(rc, a, RequestCode.RESEND_DLQ_MESSAGES, {"consumerGroup": G, "msgId": dead["msgId"]})
        assert r.code == ResponseCode.SUCCESS, r.remark
        [resent] = r.body["resent"]
        assert resent["topic"] == T
        assert resent["queueId"] == (2 if indexed else 0)
