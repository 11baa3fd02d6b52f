"""Pure parts of retries and delay levels: the schedule redirect, messageTimeup, the delayOffset.json codec,
the send-back rule, subscription-group configs and the DLQ resend bookkeeping."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trimq.broker.processors.retry import _GroupResend, build_send_back_properties
from trimq.broker.store.delay_levels import DelayLevelTable
from trimq.broker.store.schedule import (
    SCHEDULE_OFFSET_PROPERTY,
    decode_offset_table,
    delay_level_of,
    encode_offset_table,
    is_copy_of,
    message_timeup,
    redirect_to_schedule,
)
from trimq.broker.store.subscription_groups import SubscriptionGroupConfig, SubscriptionGroupManager
from trimq.protocol.message import MessageExt
from trimq.protocol.record import SYSFLAG_TRANSACTION_COMMIT, SYSFLAG_TRANSACTION_PREPARED
from trimq.protocol.validation import SCHEDULE_TOPIC

TABLE = DelayLevelTable.parse("100ms 200ms 300ms")
DEFAULT = DelayLevelTable.parse()


def make_msg(**kw: object) -> MessageExt:
    base: dict[str, object] = dict(
        topic="T", body=b"hello", flag=3, properties={}, queue_id=2, queue_offset=7, commit_log_offset=4096,
        sys_flag=0, born_timestamp=111, born_host=("10.0.0.1", 5555), store_timestamp=222,
        store_host=("10.0.0.2", 10911), reconsume_times=0, prepared_transaction_offset=0, body_crc=0,
        store_size=100, msg_id="0A00000200002A9F0000000000001000",
    )
    base.update(kw)
    return MessageExt(**base)  # type: ignore[arg-type]


# -- redirect -------------------------------------------------------------------------------------------

def test_not_delayed_messages_are_not_redirected() -> None:
    assert redirect_to_schedule(TABLE, "T", 1, {}, 1000) is None
    assert redirect_to_schedule(TABLE, "T", 1, {"DELAY": "0"}, 1000) is None
    assert redirect_to_schedule(TABLE, "T", 1, {"DELAY": "-2"}, 1000) is None


def test_redirect_records_real_topic_and_queue_and_due_time() -> None:
    r = redirect_to_schedule(TABLE, "Orders", 3, {"DELAY": "2", "KEYS": "k1", "TAGS": "a"}, 10_000)
    assert r is not None
    assert (r.topic, r.queue_id, r.level, r.tags_code) == (SCHEDULE_TOPIC, 1, 2, 10_200)
    assert r.properties == {"DELAY": "2", "KEYS": "k1", "TAGS": "a", "REAL_TOPIC": "Orders", "REAL_QID": "3"}


def test_redirect_clamps_the_level_to_the_maximum() -> None:
    r = redirect_to_schedule(TABLE, "T", 0, {"DELAY": "99"}, 0)
    assert r is not None
    assert (r.queue_id, r.level, r.tags_code, r.properties["DELAY"]) == (2, 3, 300, "3")
    r = redirect_to_schedule(DEFAULT, "T", 0, {"DELAY": "19"}, 0)
    assert r is not None and r.level == 18 and r.tags_code == 2 * 3600 * 1000


def test_redirect_follows_rocketmq_transaction_rule() -> None:
    assert redirect_to_schedule(TABLE, "T", 0, {"DELAY": "1"}, 0, sys_flag=SYSFLAG_TRANSACTION_PREPARED) is None
    assert redirect_to_schedule(TABLE, "T", 0, {"DELAY": "1"}, 0, sys_flag=SYSFLAG_TRANSACTION_COMMIT) is not None


def test_redirect_drops_an_inherited_marker_and_rejects_garbage_levels() -> None:
    r = redirect_to_schedule(TABLE, "T", 0, {"DELAY": "1", SCHEDULE_OFFSET_PROPERTY: "5"}, 0)
    assert r is not None and SCHEDULE_OFFSET_PROPERTY not in r.properties
    with pytest.raises(ValueError, match="DELAY='soon' is not an integer"):
        redirect_to_schedule(TABLE, "T", 0, {"DELAY": "soon"}, 0)
    assert delay_level_of({}) == 0 and delay_level_of({"DELAY": " 4 "}) == 4


@settings(max_examples=200, deadline=None)
@given(level=st.integers(1, 60), queue_id=st.integers(0, 1023), now=st.integers(0, 2**42))
def test_redirect_properties(level: int, queue_id: int, now: int) -> None:
    r = redirect_to_schedule(DEFAULT, "Topic", queue_id, {"DELAY": str(level)}, now)
    assert r is not None
    assert 1 <= r.level <= DEFAULT.max_level and r.queue_id == r.level - 1
    assert r.tags_code == now + DEFAULT.delay_ms(r.level) > now
    assert DEFAULT.level_for_queue(r.queue_id) == r.level


# -- messageTimeup --------------------------------------------------------------------------------------

def test_message_timeup_restores_the_real_destination() -> None:
    props = {"DELAY": "3", "REAL_TOPIC": "%RETRY%g", "REAL_QID": "0", "RETRY_TOPIC": "T",
             "ORIGIN_MESSAGE_ID": "ABC", "KEYS": "k"}
    msg = make_msg(topic=SCHEDULE_TOPIC, queue_id=2, properties=props, reconsume_times=4, commit_log_offset=777)
    req = message_timeup(msg)
    assert (req.topic, req.queue_id, req.reconsume_times) == ("%RETRY%g", 0, 4)
    assert (req.body, req.flag, req.sys_flag, req.born_timestamp, req.born_host) == (
        b"hello", 3, 0, 111, ("10.0.0.1", 5555))
    assert req.properties == {"REAL_TOPIC": "%RETRY%g", "REAL_QID": "0", "RETRY_TOPIC": "T",
                              "ORIGIN_MESSAGE_ID": "ABC", "KEYS": "k", SCHEDULE_OFFSET_PROPERTY: "777"}
    copy = make_msg(topic="%RETRY%g", properties=req.properties, commit_log_offset=900)
    assert is_copy_of(copy, msg)
    assert not is_copy_of(make_msg(properties=req.properties, commit_log_offset=500), msg)
    assert not is_copy_of(make_msg(properties={SCHEDULE_OFFSET_PROPERTY: "778"}, commit_log_offset=900), msg)


@pytest.mark.parametrize("props, error", [
    ({"REAL_QID": "0"}, "no REAL_TOPIC"),
    ({"REAL_TOPIC": "T"}, "bad REAL_QID"),
    ({"REAL_TOPIC": "T", "REAL_QID": "x"}, "bad REAL_QID"),
    ({"REAL_TOPIC": "T", "REAL_QID": "-1"}, "negative REAL_QID"),
])
def test_message_timeup_rejects_records_without_a_destination(props: dict[str, str], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        message_timeup(make_msg(properties=props))


# -- delayOffset.json -----------------------------------------------------------------------------------

def test_offset_table_codec_uses_rocketmq_layout() -> None:
    data = encode_offset_table({3: 10, 1: 2})
    assert data == {"offsetTable": {"1": 2, "3": 10}}
    assert decode_offset_table(data) == {1: 2, 3: 10}
    assert decode_offset_table({}) == {}


@pytest.mark.parametrize("data, error", [
    ([], "expected a map"),
    ({"offsetTable": []}, "must be a map"),
    ({"offsetTable": {"x": 1}}, "not an integer"),
    ({"offsetTable": {"0": 1}}, "must be >= 1"),
    ({"offsetTable": {"1": -1}}, "non-negative integer"),
    ({"offsetTable": {"1": "3"}}, "non-negative integer"),
])
def test_offset_table_rejects_bad_files(data: object, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        decode_offset_table(data, source="delayOffset.json")


# -- the send-back rule ---------------------------------------------------------------------------------

def test_first_send_back_goes_to_retry_with_level_3() -> None:
    msg = make_msg(properties={"KEYS": "k"})
    t = build_send_back_properties(msg, "g", delay_level=0, max_reconsume_times=16, retry_queue_id=0)
    assert (t.topic, t.queue_id, t.dead_letter, t.delay_level, t.reconsume_times) == ("%RETRY%g", 0, False, 3, 1)
    assert t.properties == {"KEYS": "k", "RETRY_TOPIC": "T", "ORIGIN_MESSAGE_ID": msg.msg_id, "DELAY": "3"}


def test_later_send_back_keeps_lineage_and_grows_the_level() -> None:
    msg = make_msg(topic="%RETRY%g", reconsume_times=2,
                   properties={"RETRY_TOPIC": "T", "ORIGIN_MESSAGE_ID": "FIRST", "REAL_TOPIC": "%RETRY%g",
                               "REAL_QID": "0", SCHEDULE_OFFSET_PROPERTY: "12"})
    t = build_send_back_properties(msg, "g", delay_level=0, max_reconsume_times=16, retry_queue_id=0)
    assert t.delay_level == 5 and t.reconsume_times == 3
    assert t.properties["RETRY_TOPIC"] == "T" and t.properties["ORIGIN_MESSAGE_ID"] == "FIRST"
    assert SCHEDULE_OFFSET_PROPERTY not in t.properties
    t = build_send_back_properties(msg, "g", delay_level=7, max_reconsume_times=16, retry_queue_id=0)
    assert t.delay_level == 7 and t.properties["DELAY"] == "7"


def test_blank_origin_id_is_replaced() -> None:
    msg = make_msg(properties={"ORIGIN_MESSAGE_ID": "  "})
    t = build_send_back_properties(msg, "g", delay_level=0, max_reconsume_times=16, retry_queue_id=0)
    assert t.properties["ORIGIN_MESSAGE_ID"] == msg.msg_id


@pytest.mark.parametrize("reconsume, max_times, level", [(16, 16, 0), (20, 16, 3), (0, 0, 0), (3, 16, -1)])
def test_exhausted_or_negative_level_is_a_dead_letter_at_once(reconsume: int, max_times: int, level: int) -> None:
    msg = make_msg(reconsume_times=reconsume, properties={"DELAY": "5", "RETRY_TOPIC": "T"})
    t = build_send_back_properties(msg, "g", delay_level=level, max_reconsume_times=max_times, retry_queue_id=0)
    assert (t.topic, t.queue_id, t.dead_letter, t.reconsume_times) == ("%DLQ%g", 0, True, reconsume + 1)
    assert "DELAY" not in t.properties  # DESIGN §6.6: no delay on the way to the DLQ
    assert t.properties["RETRY_TOPIC"] == "T"


# -- subscription groups --------------------------------------------------------------------------------

def test_subscription_group_defaults_are_rocketmq_s() -> None:
    cfg = SubscriptionGroupConfig("g")
    assert cfg.to_wire() == {
        "groupName": "g", "consumeEnable": True, "consumeFromMinEnable": True, "consumeBroadcastEnable": True,
        "retryQueueNums": 1, "retryMaxTimes": 16, "brokerId": 0, "whichBrokerWhenConsumeSlowly": 1,
        "notifyConsumerIdsChangedEnable": True,
    }
    assert SubscriptionGroupConfig.from_wire({"groupName": "g", "retryMaxTimes": 3}).retry_max_times == 3


@pytest.mark.parametrize("data, error", [
    ({"groupName": "g", "retryQueueNums": -1}, "retryQueueNums"),
    ({"groupName": "g", "retryMaxTimes": "3"}, "retryMaxTimes"),
    ({"groupName": "g", "consumeEnable": 1}, "consumeEnable"),
    ({"groupName": "bad group"}, "groupName"),
    ({"retryMaxTimes": 3}, "groupName is missing"),
    ({"groupName": "g", "retries": 3}, "unknown subscription group field"),
    ("g", "must be a map"),
])
def test_subscription_group_validation_names_the_field(data: object, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        SubscriptionGroupConfig.from_wire(data)


def test_subscription_group_manager_auto_creates_and_round_trips(tmp_path: object) -> None:
    mgr = SubscriptionGroupManager(store_dir=str(tmp_path), auto_create=True)
    assert mgr.get("g") is None
    cfg = mgr.find("g")
    assert cfg is not None and cfg.retry_max_times == 16 and mgr.dirty
    mgr.update_and_create(SubscriptionGroupConfig("h", retry_queue_nums=0))
    mgr.persist_sync()
    again = SubscriptionGroupManager(store_dir=str(tmp_path), auto_create=False)
    again.load()
    assert sorted(again.all()) == ["g", "h"] and again.all()["h"].retry_queue_nums == 0
    assert again.find("unknown") is None and "unknown" not in again.all()


# -- DLQ resend bookkeeping -----------------------------------------------------------------------------

@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 40), max_size=60))
def test_resend_marks_compact_into_an_offset(marks: list[int]) -> None:
    state = _GroupResend()
    for m in marks:
        state.mark(m)
    for q in range(45):
        assert state.is_resent(q) == (q in marks)
    assert all(q >= state.offset for q in state.resent)
    assert state.offset not in state.resent


def test_send_back_marks_an_operators_skip_on_the_dead_letter_only() -> None:
    from trimq.broker.processors.retry import build_send_back_properties
    from trimq.protocol.message import MessageConst
    from trimq.protocol.record import decode_record, encode_record

    msg = decode_record(encode_record(topic="T", body=b"b", queue_id=0, queue_offset=0, physical_offset=0))
    dead = build_send_back_properties(msg, "g", delay_level=-1, max_reconsume_times=16, retry_queue_id=0,
                                      skipped_by="admin via 127.0.0.1:1")
    assert dead.dead_letter and dead.properties[MessageConst.SKIPPED_BY] == "admin via 127.0.0.1:1"
    retry = build_send_back_properties(msg, "g", delay_level=0, max_reconsume_times=16, retry_queue_id=0,
                                       skipped_by="ignored")
    assert not retry.dead_letter and MessageConst.SKIPPED_BY not in retry.properties
