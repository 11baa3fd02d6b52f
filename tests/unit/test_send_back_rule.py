"""The copy CONSUMER_SEND_MSG_BACK stores (broker.processors.retry.build_send_back_properties): RocketMQ 4.9.3's
broker rule (asyncConsumerSendMsgBack) and, with the request's ``reconsumeTimes``, the client's rule
(ConsumeMessageOrderlyService.sendMessageBack produced to %RETRY% and rerouted by handleRetryAndDLQ); and the
client's own fallback copy (client.consume.common.SendBack.produce_to_retry)."""

from __future__ import annotations

import pytest

from tests.unit.consume_fakes import FakeClient
from trimq.broker.processors.retry import build_send_back_properties
from trimq.broker.store.schedule import SCHEDULE_OFFSET_PROPERTY
from trimq.client.consume.common import SendBack
from trimq.protocol.message import MessageConst, MessageExt, decode_properties
from trimq.runtime.client import RemotingTimeoutError

OFFSET_ID = "0A00000200002A9F0000000000001000"
UNIQ = "7F0000010B3A18B4AAC2000000000001"
STORED = {"KEYS": "k1", "TAGS": "a", "UNIQ_KEY": UNIQ, "app": "v"}


def stored(reconsume_times: int = 0, **props: str) -> MessageExt:
    return MessageExt(
        topic="Orders", body=b"x", flag=0, properties={**STORED, **props}, queue_id=1, queue_offset=7,
        commit_log_offset=4096, sys_flag=0, born_timestamp=1, born_host=("10.0.0.1", 1), store_timestamp=2,
        store_host=("10.0.0.2", 10911), reconsume_times=reconsume_times, prepared_transaction_offset=0,
        body_crc=0, store_size=100, msg_id=OFFSET_ID,
    )


@pytest.mark.parametrize("max_times", [1, 2, 3])
def test_client_rule_dead_letter_carries_the_client_count_and_the_unique_key(max_times: int) -> None:
    # An orderly message is retried in place: its stored record still says 0, the client counted max_times.
    msg = stored(0, **{SCHEDULE_OFFSET_PROPERTY: "12"})
    t = build_send_back_properties(msg, "g", delay_level=-1, max_reconsume_times=max_times, retry_queue_id=0,
                                   reconsume_times=max_times)
    assert (t.topic, t.queue_id, t.dead_letter, t.reconsume_times) == ("%DLQ%g", 0, True, max_times)
    assert t.properties == {**STORED, "RETRY_TOPIC": "Orders", "ORIGIN_MESSAGE_ID": UNIQ}


def test_client_rule_origin_falls_back_to_the_offset_id_and_keeps_an_existing_one() -> None:
    msg = stored(0)
    del msg.properties["UNIQ_KEY"]
    t = build_send_back_properties(msg, "g", delay_level=-1, max_reconsume_times=2, retry_queue_id=0,
                                   reconsume_times=2)
    assert t.properties["ORIGIN_MESSAGE_ID"] == OFFSET_ID
    msg = stored(0, ORIGIN_MESSAGE_ID="FIRST")
    t = build_send_back_properties(msg, "g", delay_level=-1, max_reconsume_times=2, retry_queue_id=0,
                                   reconsume_times=2)
    assert t.properties["ORIGIN_MESSAGE_ID"] == "FIRST"


def test_client_rule_is_judged_by_the_client_count() -> None:
    # Under the maximum with delay level 0: a retry with level 3 + count, carrying the count.
    t = build_send_back_properties(stored(9), "g", delay_level=0, max_reconsume_times=3, retry_queue_id=0,
                                   reconsume_times=1)
    assert (t.topic, t.dead_letter, t.delay_level, t.reconsume_times) == ("%RETRY%g", False, 4, 1)
    assert t.properties["DELAY"] == "4"


def test_broker_rule_uses_the_offset_id_and_the_stored_count() -> None:
    # RocketMQ's asyncConsumerSendMsgBack: msgExt.getMsgId() of the message it decoded is the offset id,
    # whatever unique key the message has; reconsume times is the stored one + 1.
    t = build_send_back_properties(stored(0), "g", delay_level=-1, max_reconsume_times=2, retry_queue_id=0)
    assert t.properties["ORIGIN_MESSAGE_ID"] == OFFSET_ID and t.reconsume_times == 1
    assert MessageConst.DELAY_TIME_LEVEL not in t.properties


async def test_client_fallback_of_a_concurrent_send_back_uses_the_unique_key() -> None:
    # RocketMQ's DefaultMQPushConsumerImpl.sendMessageBack fallback: ORIGIN_MESSAGE_ID = msg.getMsgId() of the
    # client (the unique key), RECONSUME_TIME = reconsume times + 1 in the header, delay level 3 + reconsume
    # times. (4.9.3 then loses ORIGIN_MESSAGE_ID to setProperties; trimq keeps it.)
    client = FakeClient()
    client.api.send_back_error = RemotingTimeoutError("slow broker")
    msg = stored(2, MIN_OFFSET="0", MAX_OFFSET="5", CONSUME_START_TIME="1", **{SCHEDULE_OFFSET_PROPERTY: "12"})
    send_back = SendBack(client, "g")  # type: ignore[arg-type]  # a fake of the network side
    ok = await send_back.send(msg, delay_level=0, broker_name="broker-a", max_reconsume_times=16,
                              fallback_reconsume_times=3, fallback_delay_level=5)
    assert ok and client.api.send_backs[0]["reconsume_times"] is None  # the broker's rule was asked first
    [send] = client.api.sends
    assert send["topic"] == "%RETRY%g" and send["reconsume_times"] == 3
    assert decode_properties(send["properties"]) == {**STORED, "RETRY_TOPIC": "Orders", "ORIGIN_MESSAGE_ID": UNIQ,
                                                     "DELAY": "5"}
