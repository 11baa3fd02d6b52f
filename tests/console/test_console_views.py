"""The console's pure parts: joining a group's results into one row per queue, topic kinds, the login check
and the CSRF token."""

from __future__ import annotations

import base64

from trimq.client.admin_results import (
    ConsumerConnection,
    ConsumerConnections,
    ConsumerLocks,
    ConsumerProgress,
    ConsumerRunningInfo,
    ConsumerStatus,
    QueueLock,
    QueueProgress,
    TopicBrokerConfig,
    TopicEntry,
)
from trimq.tools.console import views
from trimq.tools.console.security import ConsoleAuth, csrf_token, csrf_valid, same_origin


def mq(queue_id: int, topic: str = "T") -> dict[str, object]:
    return {"topic": topic, "brokerName": "b", "queueId": queue_id}


def test_queue_rows_join_progress_locks_and_blocked_queues() -> None:
    progress = ConsumerProgress("g", None, True, True, 5, [
        QueueProgress("T", "b", 0, 10, 10, 0, "c1", 0, 0),
        QueueProgress("T", "b", 1, 10, 5, 5, "c1", 0, 0),
    ])
    locks = ConsumerLocks("g", [QueueLock("T", "b", 1, "c1", 1, 250, False), QueueLock("T", "b", 2, "c2", 1, 9, True)],
                          0, [])
    status = ConsumerStatus("g", "b", [ConsumerRunningInfo("c1", {
        "mqTable": [{"mq": mq(0), "processQueueInfo": {}}, {"mq": mq(1), "processQueueInfo": {}},
                    {"mq": mq(3), "processQueueInfo": {"dropped": True}}],
        "blockedQueues": [{"mq": mq(1), "offset": 5, "msgId": "M", "attempts": 7, "blockedMs": 900},
                          {"mq": "junk"}],
        "inFlight": 1})])
    rows = views.queue_rows(progress, locks, status)
    assert [(r.queue_id, r.lag, r.owner, r.lock_holder, r.lock_expired) for r in rows] == [
        (0, 0, "c1", None, False), (1, 5, "c1", "c1", False), (2, None, None, "c2", True)]
    assert rows[1].blocked is not None and (rows[1].blocked.offset, rows[1].blocked.attempts) == (5, 7)
    assert rows[0].blocked is None and rows[2].blocked is None
    assert views.queue_rows(None, None, None) == []

    conns = ConsumerConnections("b", "g", [ConsumerConnection("c2"), ConsumerConnection("c1", "1.2.3.4:5")], {})
    members = views.member_rows(conns, status)
    assert [(m.client_id, m.answered, m.queues, m.blocked, m.in_flight) for m in members] == [
        ("c1", True, 2, 1, 1), ("c2", False, 0, 0, None)]


def test_topic_kinds_and_visible_topics() -> None:
    assert [views.topic_kind(t) for t in ("Orders", "%RETRY%g", "%DLQ%g", "TBW102", "SCHEDULE_TOPIC_XXXX",
                                          "RMQ_SYS_TRACE_TOPIC")] == \
        ["normal", "retry", "dlq", "system", "system", "system"]
    on_b = [TopicBrokerConfig("b", 4, 4, 6)]
    entries = [TopicEntry("Orders", on_b), TopicEntry("%RETRY%g", on_b), TopicEntry("DefaultCluster", [])]
    assert [e.topic for e in views.visible_topics(entries, show_all=False)] == ["Orders"]
    assert len(views.visible_topics(entries, show_all=True)) == 3


def test_login_and_csrf() -> None:
    def basic(text: str) -> str:
        return "Basic " + base64.b64encode(text.encode()).decode()

    assert ConsoleAuth().allows(None) and not ConsoleAuth().enabled
    acl = ConsoleAuth("ak", "sk")
    assert acl.allows(basic("ak:sk")) and acl.allows("basic " + basic("ak:sk").split()[1])
    for bad in (None, "", basic("ak:nope"), basic("ak"), basic("other:sk"), "Basic !!!", "Bearer sk", "Digest x"):
        assert not acl.allows(bad), bad
    token = ConsoleAuth("ak", "sk", token="tok")
    assert token.allows(basic("anyone:tok")) and token.allows("Bearer tok")
    assert not token.allows(basic("ak:sk"))  # the token replaces the ACL pair as the login
    assert not ConsoleAuth("ak", "").enabled  # half a pair is no login (trimq-admin refuses it anyway)

    secret = b"s" * 32
    assert csrf_valid(secret, "a" * 32, csrf_token(secret, "a" * 32))
    assert not csrf_valid(secret, "b" * 32, csrf_token(secret, "a" * 32))
    assert not csrf_valid(b"t" * 32, "a" * 32, csrf_token(secret, "a" * 32))
    assert not csrf_valid(secret, None, "x") and not csrf_valid(secret, "a" * 32, None)

    assert same_origin({"host": "h:1"}) and same_origin({"host": "h:1", "origin": "http://h:1"})
    assert not same_origin({"host": "h:1", "origin": "http://evil:1"})
    assert not same_origin({"host": "h:1", "origin": "null"})
    assert not same_origin({"host": "h:1", "sec-fetch-site": "same-site"})
    assert same_origin({"host": "h:1", "sec-fetch-site": "none"})
