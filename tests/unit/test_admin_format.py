"""trimq-admin's pure parts: table layout, timestamp parsing and display, permissions, the renderers, and the
offset-reset rule and RESET_CONSUMER_CLIENT_OFFSET body parsing shared by the broker and the client."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trimq.broker.processors.admin_forward import compute_reset_offsets
from trimq.client.admin_handlers import parse_reset_body
from trimq.client.admin_results import body_text, perm_text
from trimq.protocol.message_queue import MessageQueue
from trimq.tools import admin_format as fmt

UTC = dt.UTC
PLUS2 = dt.timezone(dt.timedelta(hours=2))
NOW = 1_714_564_800_000  # 2024-05-01 12:00:00 UTC


# ---------------------------------------------------------------------------------------------- tables


def test_table_aligns_numbers_right_and_text_left() -> None:
    out = fmt.render_table(["TOPIC", "QID", "LAG"], [["Orders", 0, 12], ["%RETRY%orders", 10, None]])
    assert out.splitlines() == [
        "TOPIC          QID  LAG",
        "Orders           0   12",
        "%RETRY%orders   10    -",
    ]


def test_table_cells_booleans_floats_and_empty() -> None:
    out = fmt.render_table(["A", "B", "C"], [[True, 1.25, "x"], [False, 10.0, None]], indent="  ")
    assert out.splitlines() == ["  A       B  C", "  yes   1.2  x", "  no   10.0  -"]
    assert fmt.render_table(["A", "B"], []) == "A  B\n(none)"
    with pytest.raises(ValueError, match="row 0 has 1 cells"):
        fmt.render_table(["A", "B"], [["only one"]])


def test_mixed_column_is_left_aligned() -> None:
    out = fmt.render_table(["X"], [[1], ["two"], [None]])
    assert out.splitlines() == ["X", "1", "two", "-"]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.text(alphabet="abcxyz%@:", max_size=12), st.integers(-5, 10**9)), max_size=8))
def test_table_columns_line_up(rows: list[tuple[str, int]]) -> None:
    lines = fmt.render_table(["NAME", "VALUE"], rows).splitlines()
    assert len(lines) == 1 + max(1, len(rows))
    if rows:
        width = max(len(line) for line in lines)
        # the numeric column is right-aligned, so every line ends at the same column
        assert all(len(line) == width for line in lines)


def test_kv_lines() -> None:
    assert fmt.kv_lines([("a", 1), ("long key", None)]) == "a:        1\nlong key: -"


# ---------------------------------------------------------------------------------------------- timestamps


@pytest.mark.parametrize(("text", "expected"), [
    ("1714564800000", NOW),
    ("0", 0),
    ("20240501120000", NOW),
    ("2024-05-01T12:00:00", NOW),
    ("2024-05-01 12:00:00.250", NOW + 250),
    ("2024-05-01T14:00:00+02:00", NOW),
    ("2024-05-01T12:00:00Z", NOW),
    ("2024-05-01", NOW - 12 * 3_600_000),
    ("2024-05-01#12:00:00:007", NOW + 7),
    ("now", NOW),
    (" NOW ", NOW),
    ("-30m", NOW - 30 * 60_000),
    ("-1.5h", NOW - 90 * 60_000),
    ("-2d", NOW - 2 * 86_400_000),
    ("-500ms", NOW - 500),
])
def test_parse_timestamp_forms(text: str, expected: int) -> None:
    assert fmt.parse_timestamp(text, now_ms=NOW, tz=UTC) == expected


def test_parse_timestamp_uses_the_zone_for_naive_times_only() -> None:
    assert fmt.parse_timestamp("20240501140000", now_ms=0, tz=PLUS2) == NOW
    assert fmt.parse_timestamp("2024-05-01T12:00:00Z", now_ms=0, tz=PLUS2) == NOW
    assert fmt.parse_timestamp("1714564800000", now_ms=0, tz=PLUS2) == NOW  # epoch ms has no zone
    local = dt.datetime(2024, 5, 1, 12, 0, 0).astimezone()  # default: this machine's zone
    assert fmt.parse_timestamp("20240501120000", now_ms=0) == int(local.timestamp() * 1000)


@pytest.mark.parametrize("text", ["", "yesterday", "2024-13-01T00:00:00", "20241301120000", "-5", "-5y", "12:00",
                                  "2024-05-01 25:00:00"])
def test_parse_timestamp_rejects_with_the_accepted_forms(text: str) -> None:
    with pytest.raises(fmt.TimestampError) as info:
        fmt.parse_timestamp(text, now_ms=NOW, tz=UTC)
    assert repr(text) in str(info.value) and "yyyyMMddHHmmss" in str(info.value) and "ISO 8601" in str(info.value)


@pytest.mark.parametrize(("text", "ms"), [("99999999999999999999", 99999999999999999999), ("9223372036854775808",
                                          2**63), ("-99999999d", NOW - 99999999 * 86_400_000)])
def test_parse_timestamp_rejects_what_a_broker_cannot_take(text: str, ms: int) -> None:
    """Past a Java long the request could not even be encoded: reset-offset died in msgpack's OverflowError (found by
    hand); before 1970 it means nothing."""
    with pytest.raises(fmt.TimestampError) as info:
        fmt.parse_timestamp(text, now_ms=NOW, tz=UTC)
    assert str(info.value) == f"{text!r} is {ms} epoch milliseconds, outside 0 .. 9223372036854775807"
    assert fmt.parse_timestamp("9223372036854775807", now_ms=NOW, tz=UTC) == 2**63 - 1


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=1, max_value=4_102_444_800_000))
def test_displayed_timestamps_parse_back(ms: int) -> None:
    shown = fmt.format_timestamp(ms, tz=UTC)
    assert fmt.parse_timestamp(shown, now_ms=0, tz=UTC) == ms


def test_format_timestamp_and_age() -> None:
    assert fmt.format_timestamp(NOW + 5, tz=UTC) == "2024-05-01 12:00:00.005"
    assert fmt.format_timestamp(NOW, tz=PLUS2) == "2024-05-01 14:00:00.000"
    for missing in (None, 0, -1):
        assert fmt.format_timestamp(missing, tz=UTC) == "-"
    assert [fmt.format_age(v) for v in (0, 850, 12_345, 245_000, 7_380_000, 273_600_000, -1, None)] == [
        "0ms", "850ms", "12.3s", "4m05s", "2h03m", "3d04h", "-", "-"]


# ---------------------------------------------------------------------------------------------- values


def test_perm_text_and_parse() -> None:
    assert [perm_text(p) for p in (6, 4, 2, 7, 0)] == ["RW-", "R--", "-W-", "RWX", "---"]
    assert [fmt.parse_perm(t) for t in ("6", "rw", "RW-", "r", "w", "0", "rwx")] == [6, 6, 6, 4, 2, 0, 7]
    for bad in ("8", "rz", "", "-"):
        with pytest.raises(ValueError, match="perm"):
            fmt.parse_perm(bad)


def test_body_text_and_json() -> None:
    assert body_text("héllo".encode()) == ("héllo", "utf-8")
    assert body_text(b"\xff\x00") == ("ff00", "hex")
    doc = json.loads(fmt.to_json({"raw": b"\x01\x02", "tags": frozenset({"b", "a"}), "n": 1}))
    assert doc == {"raw": {"hex": "0102"}, "tags": ["a", "b"], "n": 1}


# ---------------------------------------------------------------------------------------------- renderers


def test_render_consumer_progress() -> None:
    doc = {"consumerGroup": "orders", "orderly": True, "online": True, "totalLag": 4, "errors": [], "queues": [
        {"topic": "Orders", "brokerName": "broker-a", "queueId": 1, "brokerOffset": 9, "consumerOffset": 5, "lag": 4,
         "owner": "10.0.0.1@42", "lastTimestamp": NOW, "lastUpdateTimestamp": NOW},
        {"topic": "%RETRY%orders", "brokerName": "broker-a", "queueId": 0, "brokerOffset": 0, "consumerOffset": -1,
         "lag": 0, "owner": None, "lastTimestamp": 0, "lastUpdateTimestamp": 0},
    ]}
    assert fmt.render_consumer_progress(doc, tz=UTC).splitlines() == [
        "TOPIC          BROKER    QID  BROKER_OFFSET  CONSUMER_OFFSET  LAG  OWNER        LAST_CONSUMED",
        "Orders         broker-a    1              9                5    4  10.0.0.1@42  2024-05-01 12:00:00.000",
        "%RETRY%orders  broker-a    0              0                -    0  -            -",
        "group orders (orderly, online): total lag 4",
    ]


def test_render_consumer_status_says_why_orderly_queues_pause_while_their_master_is_down() -> None:
    mq = {"topic": "Orders", "brokerName": "broker-a", "queueId": 1}
    doc = {"consumerGroup": "orders", "errors": [], "clients": [{
        "clientId": "c1", "consumeOrderly": True, "messageModel": "CLUSTERING", "running": True, "inFlight": 0,
        "deadLettered": 0, "skipped": 0, "lockedQueues": [], "mqTable": [], "pull": {"pausedMasterDown": [mq]}}]}
    text = fmt.render_consumer_status(doc, now_ms=NOW)
    assert "paused orderly queues: the master of their broker is down" in text
    assert "Orders@broker-a:1" in text.splitlines()[-1]


def test_render_consumer_status_blocked_queue() -> None:
    mq = {"topic": "Orders", "brokerName": "broker-a", "queueId": 1}
    doc = {"consumerGroup": "orders", "errors": [], "clients": [{
        "clientId": "c1", "consumeOrderly": True, "messageModel": "CLUSTERING", "running": True, "inFlight": 0,
        "deadLettered": 0, "skipped": 0, "lockedQueues": [mq],
        "mqTable": [{"mq": mq, "processQueueInfo": {"cachedMsgCount": 4, "cachedMsgMinOffset": 5,
                                                    "cachedMsgMaxOffset": 8, "transactionMsgCount": 0,
                                                    "commitOffset": 5, "dropped": False}}],
        "blockedQueues": [{"mq": mq, "offset": 5, "msgId": "AB", "attempts": 6, "blockedMs": 5400}],
        "statusTable": {"Orders": {"consumeOK": 20, "consumeFailed": 6, "consumeRT": 0.5, "consumeRTMax": 3,
                                   "pullCount": 4, "pullRT": 2.25}},
    }]}
    lines = fmt.render_consumer_status(doc, now_ms=NOW).splitlines()
    assert lines[0] == "client c1: orderly, CLUSTERING, running; in flight 0, dead-lettered 0, skipped 0"
    assert lines[2].split() == ["Orders@broker-a:1", "4", "5..8", "0", "5", "yes", "no"]
    assert "skip it with 'consumer skip'" in lines[3]
    assert lines[5].split() == ["Orders@broker-a:1", "5", "AB", "6", "5.4s"]
    assert lines[7].split() == ["Orders", "20", "6", "0.5", "3", "4", "2.2"]


def test_render_reset_and_cluster_and_skip() -> None:
    reset = {"online": False, "errors": [], "clients": [], "queues": [
        {"brokerName": "broker-a", "queueId": 0, "previousOffset": -1, "offset": 7}]}
    assert fmt.render_reset_offset(reset).splitlines() == [
        "BROKER    QID  OLD_OFFSET  NEW_OFFSET", "broker-a    0           -           7",
        "group offline: offsets written on the brokers; members will start from them"]
    cluster = {"clusters": [{"cluster": "c", "brokers": [
        {"brokerName": "b", "brokerId": 0, "brokerAddr": "127.0.0.1:1", "lastUpdateTimestamp": NOW, "ageMs": 4100,
         "topicCount": 2, "topics": ["A", "B"]}]}]}
    assert fmt.render_cluster_list(cluster, now_ms=NOW, tz=UTC).splitlines() == [
        "CLUSTER  BROKER  ID  ADDRESS      ROLE  EPOCH  REPLICATION  TOPICS  LAST_REGISTERED",
        "c        b        0  127.0.0.1:1     -      -            -       2  2024-05-01 12:00:00.000 (4.1s ago)",
        "topics of b: A, B"]
    # HA (issue 15): roles, epochs, a master's lag, a slave's link
    pair = {"clusters": [{"cluster": "c", "brokers": [
        {"brokerName": "b", "brokerId": 0, "brokerAddr": "m:1", "role": "SYNC_MASTER", "masterEpoch": 2,
         "slaves": 1, "lagBytes": 512, "lagSeconds": 0.25, "topics": []},
        {"brokerName": "b", "brokerId": 1, "brokerAddr": "s:1", "role": "SLAVE", "masterEpoch": 2,
         "masterConnected": False, "topics": []},
        {"brokerName": "b", "brokerId": 2, "brokerAddr": "s:2", "role": "SLAVE", "masterEpoch": 2,
         "masterConnected": True, "offsetsSyncAgeMs": 850, "topics": []},
        {"brokerName": "d", "brokerId": 0, "brokerAddr": "d:1", "error": "refused", "topics": []}]}]}
    rows = [line.split("  ") for line in fmt.render_cluster_list(pair, now_ms=NOW, tz=UTC).splitlines()[1:5]]
    assert [[c.strip() for c in r if c.strip()][4:7] for r in rows] == [
        ["SYNC_MASTER", "2", "1 slave(s), lag 512 B / 0.25 s"], ["SLAVE", "2", "master unreachable"],
        ["SLAVE", "2", "following, offsets 850ms old"], ["unreachable", "-", "-"]]
    skip = {"mq": {"topic": "T", "brokerName": "b", "queueId": 1}, "queueOffset": 5, "msgId": "AB",
            "reconsumeTimes": 6, "clientId": "c1", "deadLetterTopic": "%DLQ%g", "nextOffset": None}
    assert fmt.render_consumer_skip(skip).endswith("later messages were already cached")


# ---------------------------------------------------------------------------------------------- reset rule


def test_reset_offsets_force_and_rewind_only() -> None:
    by_time = {0: 3, 1: 10, 2: 0}
    stored = {0: 5, 1: 4, 2: -1}
    kw: dict[str, Any] = {"queue_ids": range(3), "by_time": lambda q, ts: by_time[q], "max_offset": lambda q: 20,
          "consumer_offset": lambda q: stored[q]}
    assert compute_reset_offsets(timestamp=1, force=True, **kw) == [(0, 3, 5), (1, 10, 4), (2, 0, -1)]
    # without force only moves back (queue 1 stays at 4), and a queue with no offset takes the new one
    assert compute_reset_offsets(timestamp=1, force=False, **kw) == [(0, 3, 5), (1, 4, 4), (2, 0, -1)]
    assert compute_reset_offsets(timestamp=-1, force=True, **kw) == [(0, 20, 5), (1, 20, 4), (2, 20, -1)]


def test_parse_reset_body() -> None:
    mq = MessageQueue("T", "b", 1)
    group, topic, offsets = parse_reset_body({"group": "g", "topic": "T"},
                                             {"offsetTable": [{"mq": mq.to_wire(), "offset": 7}]})
    assert (group, topic, offsets) == ("g", "T", {mq: 7})
    cases: list[tuple[dict[str, Any], Any, str]] = [
        ({"topic": "T"}, {"offsetTable": []}, "'group'"),
        ({"group": "g", "topic": "T"}, None, "offsetTable"),
        ({"group": "g", "topic": "T"}, {"offsetTable": [{"mq": {"topic": "T"}, "offset": 1}]}, "offsetTable[0].mq"),
        ({"group": "g", "topic": "T"}, {"offsetTable": [{"mq": mq.to_wire(), "offset": -1}]}, "non-negative"),
        ({"group": "g", "topic": "U"}, {"offsetTable": [{"mq": mq.to_wire(), "offset": 1}]}, "not 'U'"),
    ]
    for ext, body, needle in cases:
        with pytest.raises(ValueError) as info:
            parse_reset_body(ext, body)
        assert needle in str(info.value)
