"""ConsumerManager: heartbeat parsing, membership, expiry, coalescing dirty groups, subscription consistency."""

from __future__ import annotations

from typing import Any

import pytest
from structlog.testing import capture_logs

from trimq.broker.consumers import ConsumerManager, HeartbeatData, SubscriptionData, parse_heartbeat

G = "order_group"


class FakeClock:
    def __init__(self, now: int = 5_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class StubConn:
    """The few Connection attributes the manager reads (it never awaits a connection)."""

    def __init__(self, remote: str = "127.0.0.1:40000") -> None:
        self.remote = remote
        self.attributes: dict[str, Any] = {}
        self.closed = False


def sub(topic: str, expr: str = "*") -> dict[str, Any]:
    tags = [] if expr == "*" else [t.strip() for t in expr.split("||")]
    return {"topic": topic, "subString": expr, "tagsSet": tags, "codeSet": [hash(t) & 0xFFFF for t in tags],
            "subVersion": 1}


def hb(client_id: str, group: str = G, subs: list[dict[str, Any]] | None = None, *, orderly: bool = False,
       producer: str | None = None, **extra: Any) -> HeartbeatData:
    body: dict[str, Any] = {
        "clientID": client_id,
        "producerDataSet": [{"groupName": producer}] if producer else [],
        "consumerDataSet": [{
            "groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
            "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET", "consumeOrderly": orderly,
            "subscriptionDataSet": subs if subs is not None else [sub("TopicA")],
        }] if group else [],
        **extra,
    }
    return parse_heartbeat(body)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def wakeups() -> list[int]:
    return []


@pytest.fixture
def cm(clock: FakeClock, wakeups: list[int]) -> ConsumerManager:
    return ConsumerManager(channel_expired_timeout_ms=120_000, now_ms=clock, wall_ms=lambda: 1_700_000_000_000,
                           on_dirty=lambda: wakeups.append(1))


# ------------------------------------------------------------------------------------------------ parsing


def test_parse_full_heartbeat() -> None:
    data = hb("10.0.0.1@1", orderly=True, producer="pg", language="PYTHON", version=3,
              subs=[sub("TopicA", "TagA || TagB"), sub("%RETRY%order_group")])
    assert data.client_id == "10.0.0.1@1"
    assert data.producer_groups == ("pg",)
    assert data.language == "PYTHON" and data.version == "3"
    (cd,) = data.consumers
    assert (cd.group_name, cd.consume_type, cd.message_model, cd.consume_from_where, cd.consume_orderly) == (
        G, "CONSUME_PASSIVELY", "CLUSTERING", "CONSUME_FROM_FIRST_OFFSET", True)
    assert [s.topic for s in cd.subscriptions] == ["TopicA", "%RETRY%order_group"]
    assert cd.subscriptions[0].tags_set == ("TagA", "TagB")


def test_parse_defaults_are_rocketmqs() -> None:
    data = parse_heartbeat({"clientID": "c", "consumerDataSet": [{"groupName": "g"}]})
    (cd,) = data.consumers
    assert (cd.consume_type, cd.message_model, cd.consume_from_where, cd.consume_orderly, cd.subscriptions) == (
        "CONSUME_PASSIVELY", "CLUSTERING", "CONSUME_FROM_LAST_OFFSET", False, ())
    assert parse_heartbeat({"clientID": "c"}).consumers == ()


@pytest.mark.parametrize(("body", "message"), [
    ([], "heartbeat body must be a map"),
    ({}, "clientID"),
    ({"clientID": ""}, "clientID"),
    ({"clientID": 5}, "clientID"),
    ({"clientID": "c", "producerDataSet": [{"groupName": "bad name"}]}, "producerDataSet[0].groupName"),
    ({"clientID": "c", "producerDataSet": "x"}, "producerDataSet must be list"),
    ({"clientID": "c", "consumerDataSet": [{}]}, "consumerDataSet[0].groupName"),
    ({"clientID": "c", "consumerDataSet": ["g"]}, "consumerDataSet[0] must be a map"),
    ({"clientID": "c", "consumerDataSet": [{"groupName": "g", "messageModel": "P2P"}]},
     "consumerDataSet[0].messageModel = 'P2P': must be one of CLUSTERING, BROADCASTING"),
    ({"clientID": "c", "consumerDataSet": [{"groupName": "g", "consumeType": 1}]}, "consumeType must be str"),
    ({"clientID": "c", "consumerDataSet": [{"groupName": "g", "consumeFromWhere": "NOW"}]}, "consumeFromWhere"),
    ({"clientID": "c", "consumerDataSet": [{"groupName": "g", "consumeOrderly": "yes"}]}, "consumeOrderly"),
    ({"clientID": "c", "consumerDataSet": [{"groupName": "g"}, {"groupName": "g"}]}, "appears twice"),
    ({"clientID": "c", "consumerDataSet": [{"groupName": "g", "subscriptionDataSet": [{"topic": "T"},
                                                                                      {"topic": "T"}]}]},
     "names a topic twice"),
    ({"clientID": "c", "consumerDataSet": [{"groupName": "g", "subscriptionDataSet": [{"topic": "a b"}]}]},
     "consumerDataSet[0].subscriptionDataSet[0].topic"),
    ({"clientID": "c", "consumerDataSet": [{"groupName": "g", "subscriptionDataSet": [7]}]},
     "subscriptionDataSet[0] must be a map"),
    ({"clientID": "c", "consumerDataSet": [{"groupName": "g", "subscriptionDataSet": [
        {"topic": "T", "tagsSet": [1]}]}]}, "tagsSet must be a list of strings"),
    ({"clientID": "c", "consumerDataSet": [{"groupName": "g", "subscriptionDataSet": [
        {"topic": "T", "subVersion": True}]}]}, "subVersion must be an integer"),
    ({"clientID": "c", "version": [1]}, "version"),
])
def test_parse_rejects_bad_heartbeats_naming_the_field(body: Any, message: str) -> None:
    with pytest.raises(ValueError) as exc:
        parse_heartbeat(body)
    assert message in str(exc.value)


def test_subscription_normalization() -> None:
    a = SubscriptionData("T", "TagA || TagB", ("TagA", "TagB"))
    b = SubscriptionData("T", "TagB||TagA", ("TagB", "TagA"))
    assert a.normalized == b.normalized == "TagA||TagB"
    assert SubscriptionData("T", " * ").normalized == "*"
    assert SubscriptionData("T", "").normalized == "*"
    assert SubscriptionData("T", "a > 1", expression_type="SQL92").normalized == "SQL92:a > 1"
    assert SubscriptionData.from_wire(a.to_wire(), "x") == a


# ------------------------------------------------------------------------------------------------ membership


def test_heartbeat_registers_and_remembers_client_id(cm: ConsumerManager, wakeups: list[int]) -> None:
    conn = StubConn()
    assert cm.heartbeat(conn, hb("c1", orderly=True)) == [G]  # type: ignore[arg-type]
    assert conn.attributes["client_id"] == "c1"
    assert cm.get_consumer_ids(G) == ["c1"]
    assert cm.find_channel(G, "c1") is conn
    info = cm.group_info(G)
    assert info is not None
    member = info.members["c1"]
    assert (member.address, member.consume_from_where, member.consume_orderly) == (
        "127.0.0.1:40000", "CONSUME_FROM_FIRST_OFFSET", True)
    assert member.last_update_timestamp == 1_700_000_000_000
    assert cm.is_orderly(G)
    assert wakeups == [1]
    assert cm.take_dirty_groups() == [G]
    assert cm.take_dirty_groups() == []


def test_unchanged_heartbeat_is_not_a_change(cm: ConsumerManager, clock: FakeClock) -> None:
    conn = StubConn()
    cm.heartbeat(conn, hb("c1"))  # type: ignore[arg-type]
    cm.take_dirty_groups()
    clock.now += 30_000
    assert cm.heartbeat(conn, hb("c1")) == []  # type: ignore[arg-type]
    assert not cm.has_dirty
    # same tags in another order: still no change
    cm.heartbeat(conn, hb("c1", subs=[sub("TopicA", "x||y")]))  # type: ignore[arg-type]
    cm.take_dirty_groups()
    assert cm.heartbeat(conn, hb("c1", subs=[sub("TopicA", "y || x")])) == []  # type: ignore[arg-type]


def test_subscription_change_marks_dirty(cm: ConsumerManager) -> None:
    conn = StubConn()
    cm.heartbeat(conn, hb("c1"))  # type: ignore[arg-type]
    cm.take_dirty_groups()
    assert cm.heartbeat(conn, hb("c1", subs=[sub("TopicA"), sub("TopicB")])) == [G]  # type: ignore[arg-type]
    assert cm.subscribed_topics(G) == ["TopicA", "TopicB"]


def test_burst_of_joins_coalesces_into_one_dirty_group(cm: ConsumerManager, wakeups: list[int]) -> None:
    for i in range(5):
        cm.heartbeat(StubConn(f"127.0.0.1:{i}"), hb(f"c{i}"))  # type: ignore[arg-type]
    cm.heartbeat(StubConn(), hb("x", group="other"))  # type: ignore[arg-type]
    assert cm.take_dirty_groups() == ["order_group", "other"]
    assert cm.get_consumer_ids(G) == ["c0", "c1", "c2", "c3", "c4"]
    assert [cid for cid, _ in cm.member_connections(G)] == ["c0", "c1", "c2", "c3", "c4"]
    assert len(wakeups) == 6


def test_unregister_and_group_removal(cm: ConsumerManager) -> None:
    c1, c2 = StubConn(), StubConn()
    cm.heartbeat(c1, hb("c1", producer="pg"))  # type: ignore[arg-type]
    cm.heartbeat(c2, hb("c2"))  # type: ignore[arg-type]
    cm.take_dirty_groups()
    assert cm.groups_of_client("c1") == ([G], ["pg"])
    assert cm.unregister_consumer(G, "c1")
    assert not cm.unregister_consumer(G, "c1")
    assert cm.unregister_producer("pg", "c1")
    assert cm.producer_groups() == []
    assert cm.take_dirty_groups() == [G]
    assert cm.get_consumer_ids(G) == ["c2"]
    cm.unregister_consumer(G, "c2")
    assert cm.group_info(G) is None and cm.get_consumer_ids(G) == []
    assert cm.consumer_groups() == []


def test_connection_close_removes_only_that_connections_registrations(cm: ConsumerManager) -> None:
    old, new, other = StubConn(), StubConn(), StubConn()
    cm.heartbeat(old, hb("c1", producer="pg"))  # type: ignore[arg-type]
    cm.heartbeat(other, hb("c2", group="g2"))  # type: ignore[arg-type]
    cm.heartbeat(new, hb("c1", producer="pg"))  # type: ignore[arg-type]  # reconnected
    cm.take_dirty_groups()
    assert cm.connection_closed(old) == []  # type: ignore[arg-type]
    assert cm.find_channel(G, "c1") is new
    assert cm.connection_closed(new) == [(G, "c1")]  # type: ignore[arg-type]
    assert cm.producer_groups() == []
    assert cm.get_consumer_ids("g2") == ["c2"]
    assert cm.take_dirty_groups() == [G]
    assert cm.stats["closed"] == 1


def test_find_channel_ignores_closed_connections(cm: ConsumerManager) -> None:
    conn = StubConn()
    cm.heartbeat(conn, hb("c1"))  # type: ignore[arg-type]
    conn.closed = True
    assert cm.find_channel(G, "c1") is None
    assert cm.find_channel(G, "nobody") is None
    assert cm.find_channel("nogroup", "c1") is None
    assert cm.member_connections(G) == []


def test_expiry_is_strictly_after_the_timeout(cm: ConsumerManager, clock: FakeClock) -> None:
    quiet, chatty = StubConn(), StubConn()
    cm.heartbeat(quiet, hb("quiet", producer="pg"))  # type: ignore[arg-type]
    cm.heartbeat(chatty, hb("chatty"))  # type: ignore[arg-type]
    cm.take_dirty_groups()
    clock.now += 60_000
    cm.heartbeat(chatty, hb("chatty"))  # type: ignore[arg-type]
    clock.now += 60_000  # quiet is exactly 120 s old: still a member (RocketMQ: "greater than")
    assert cm.scan_not_active() == []
    clock.now += 1
    assert cm.scan_not_active() == [(G, "quiet")]
    assert cm.get_consumer_ids(G) == ["chatty"]
    assert cm.producer_groups() == []
    assert cm.take_dirty_groups() == [G]
    assert cm.stats["expired"] == 1


def test_orderly_flag_is_sticky(cm: ConsumerManager) -> None:
    conn = StubConn()
    assert not cm.is_orderly(G)
    cm.heartbeat(conn, hb("c1", orderly=True))  # type: ignore[arg-type]
    cm.connection_closed(conn)  # type: ignore[arg-type]
    assert cm.is_orderly(G)
    cm.mark_orderly("locker")
    assert cm.is_orderly("locker")


# ------------------------------------------------------------------------------------------------ consistency


def test_consistent_group(cm: ConsumerManager) -> None:
    cm.heartbeat(StubConn(), hb("c1", subs=[sub("T", "a||b")]))  # type: ignore[arg-type]
    cm.heartbeat(StubConn(), hb("c2", subs=[sub("T", "b || a")]))  # type: ignore[arg-type]
    report = cm.subscription_consistency(G)
    assert report.consistent and report.inconsistent_topics == ()
    assert cm.inconsistent_groups() == []
    assert cm.subscription_consistency("empty").consistent


def test_inconsistency_is_detected_logged_once_per_change_and_cleared(cm: ConsumerManager) -> None:
    c1, c2 = StubConn(), StubConn()
    with capture_logs() as logs:
        cm.heartbeat(c1, hb("c1", subs=[sub("T", "a"), sub("U")]))  # type: ignore[arg-type]
        cm.heartbeat(c2, hb("c2", subs=[sub("T", "b")]))  # type: ignore[arg-type]
        for _ in range(3):  # periodic heartbeats: no new line
            cm.heartbeat(c1, hb("c1", subs=[sub("T", "a"), sub("U")]))  # type: ignore[arg-type]
            cm.heartbeat(c2, hb("c2", subs=[sub("T", "b")]))  # type: ignore[arg-type]
    events = [e for e in logs if e["event"].startswith("subscription.")]
    assert [e["event"] for e in events] == ["subscription.inconsistent"]
    assert events[0]["topics"] == ["T", "U"] and events[0]["log_level"] == "warning"
    assert events[0]["members"] == {"c1": {"T": "a", "U": "*"}, "c2": {"T": "b"}}
    report = cm.subscription_consistency(G)
    assert not report.consistent and report.inconsistent_topics == ("T", "U")
    assert report.to_wire()["members"] == [{"clientId": "c1", "subscriptions": {"T": "a", "U": "*"}},
                                           {"clientId": "c2", "subscriptions": {"T": "b"}}]
    assert [r.group for r in cm.inconsistent_groups()] == [G]

    with capture_logs() as logs:
        cm.heartbeat(c2, hb("c2", subs=[sub("T", "a")]))  # type: ignore[arg-type]  # a different inconsistency
        cm.heartbeat(c2, hb("c2", subs=[sub("T", "a"), sub("U")]))  # type: ignore[arg-type]  # resolved
    assert [e["event"] for e in logs if e["event"].startswith("subscription.")] == [
        "subscription.inconsistent", "subscription.consistent"]
    assert cm.subscription_consistency(G).consistent
    assert cm.stats["inconsistent_reports"] == 2


def test_inconsistency_resolved_by_a_member_leaving(cm: ConsumerManager) -> None:
    c1, c2 = StubConn(), StubConn()
    cm.heartbeat(c1, hb("c1", subs=[sub("T", "a")]))  # type: ignore[arg-type]
    cm.heartbeat(c2, hb("c2", subs=[sub("T", "b")]))  # type: ignore[arg-type]
    with capture_logs() as logs:
        cm.connection_closed(c2)  # type: ignore[arg-type]
    assert "subscription.consistent" in [e["event"] for e in logs]
    assert cm.subscription_consistency(G).consistent


def test_group_level_table_is_last_heartbeat_wins(cm: ConsumerManager, clock: FakeClock) -> None:
    cm.heartbeat(StubConn(), hb("c1", subs=[sub("T", "a")]))  # type: ignore[arg-type]
    clock.now += 1
    cm.heartbeat(StubConn(), hb("c2", subs=[sub("T", "b")]))  # type: ignore[arg-type]
    info = cm.group_info(G)
    assert info is not None
    assert info.subscription_table()["T"].sub_string == "b"
    latest = info.latest()
    assert latest is not None and latest.client_id == "c2"
