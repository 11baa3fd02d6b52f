"""DelayLevelTable: RocketMQ's messageDelayLevel parsing, clamping, due times and the delivery correction."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trimq.broker.store.delay_levels import DEFAULT, MAX_DELAY_MS, DelayLevelTable

S, M, H = 1_000, 60_000, 3_600_000


@pytest.fixture
def default() -> DelayLevelTable:
    return DelayLevelTable.parse()


def test_default_spec(default: DelayLevelTable) -> None:
    assert DEFAULT == "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    assert default == DelayLevelTable.parse(DEFAULT)
    assert default.max_level == len(default) == 18
    assert list(default) == [
        1 * S, 5 * S, 10 * S, 30 * S,
        1 * M, 2 * M, 3 * M, 4 * M, 5 * M, 6 * M, 7 * M, 8 * M, 9 * M, 10 * M, 20 * M, 30 * M,
        1 * H, 2 * H,
    ]  # fmt: skip
    assert default.delay_ms(1) == 1_000
    assert default.delay_ms(3) == 10_000  # the first retry of a consumer (3 + reconsumeTimes 0)
    assert default.delay_ms(18) == 7_200_000
    assert default.spec == DEFAULT


@pytest.mark.parametrize(
    ("token", "ms"),
    [("100ms", 100), ("7s", 7_000), ("3m", 180_000), ("2h", 7_200_000), ("1d", 86_400_000), ("0010s", 10_000)],
)
def test_each_unit(token: str, ms: int) -> None:
    assert DelayLevelTable.parse(token).delay_ms(1) == ms


def test_custom_spec_for_tests() -> None:
    t = DelayLevelTable.parse("100ms 200ms 300ms")
    assert list(t) == [100, 200, 300]
    assert t.spec == "100ms 200ms 300ms"
    assert t.max_level == 3


def test_whitespace_is_flexible() -> None:
    assert DelayLevelTable.parse("  1s\t5s\n 1m ") == DelayLevelTable.parse("1s 5s 1m")


def test_spec_is_canonical_and_round_trips() -> None:
    t = DelayLevelTable.parse("60s 1500ms 120m 24h 1000ms")
    assert t.spec == "1m 1500ms 2h 1d 1s"
    assert DelayLevelTable.parse(t.spec) == t
    assert t == DelayLevelTable([60_000, 1_500, 7_200_000, 86_400_000, 1_000])
    assert hash(t) == hash(DelayLevelTable.parse(t.spec))
    assert repr(t) == "DelayLevelTable.parse('1m 1500ms 2h 1d 1s')"
    assert t != "1m 1500ms 2h 1d 1s"


@given(st.lists(st.integers(min_value=1, max_value=MAX_DELAY_MS), min_size=1, max_size=20))
@settings(max_examples=100, deadline=None)
def test_round_trip_property(delays: list[int]) -> None:
    t = DelayLevelTable(delays)
    assert list(DelayLevelTable.parse(t.spec)) == delays


@pytest.mark.parametrize(
    ("spec", "bad"),
    [
        ("1s 5x 10s", "'5x'"),  # unknown unit
        ("1s 5 10s", "'5'"),  # no unit
        ("1s s", "'s'"),  # no number
        ("1S", "'1S'"),  # units are lower case, as in RocketMQ
        ("1s,5s", "'1s,5s'"),  # commas are not separators
        ("1.5s", "'1.5s'"),
        ("-1s", "'-1s'"),
        ("1 s", "'1'"),
        ("1sec", "'1sec'"),
        ("\u0661s", "'\u0661s'"),  # a non-ASCII digit
    ],
)
def test_bad_token_is_named(spec: str, bad: str) -> None:
    with pytest.raises(ValueError, match="bad delay-level token") as exc:
        DelayLevelTable.parse(spec)
    message = str(exc.value)
    assert bad in message
    assert "<positive integer><unit>" in message and "ms, s, m, h or d" in message


def test_level_of_bad_token_is_named() -> None:
    with pytest.raises(ValueError, match=r"level 3"):
        DelayLevelTable.parse("1s 2s nope")


@pytest.mark.parametrize("spec", ["0s", "1s 0ms", "36501d", f"{MAX_DELAY_MS + 1}ms"])
def test_zero_and_huge_delays_rejected(spec: str) -> None:
    with pytest.raises(ValueError, match="positive and at most 36500d"):
        DelayLevelTable.parse(spec)


@pytest.mark.parametrize("spec", ["", "   ", "\n"])
def test_empty_spec(spec: str) -> None:
    with pytest.raises(ValueError, match="empty delay-level spec"):
        DelayLevelTable.parse(spec)


def test_spec_must_be_a_string() -> None:
    with pytest.raises(TypeError, match="must be a string"):
        DelayLevelTable.parse(5)  # type: ignore[arg-type]


@pytest.mark.parametrize(("delays", "match"), [([], "at least one"), ([1, 0], "level 2"), ([1, 1.5], "integer")])
def test_bad_direct_construction(delays: list[int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DelayLevelTable(delays)


@pytest.mark.parametrize("level", [0, -1, 19, 100])
def test_delay_out_of_range(default: DelayLevelTable, level: int) -> None:
    with pytest.raises(ValueError, match=r"delay level must be in 1\.\.18"):
        default.delay_ms(level)


@pytest.mark.parametrize("level", [None, "3", 2.0, True])
def test_level_must_be_int(default: DelayLevelTable, level: object) -> None:
    with pytest.raises(ValueError, match="must be an integer"):
        default.delay_ms(level)  # type: ignore[arg-type]


def test_clamp(default: DelayLevelTable) -> None:
    assert default.clamp(1) == 1
    assert default.clamp(17) == 17
    assert default.clamp(18) == 18
    assert default.clamp(19) == 18  # RocketMQ's CommitLog clamps to the max level
    assert default.clamp(10_000) == 18
    for level in (0, -3):
        with pytest.raises(ValueError, match=">= 1"):
            default.clamp(level)


def test_due_time(default: DelayLevelTable) -> None:
    assert default.due_time(1, 1_700_000_000_000) == 1_700_000_001_000
    assert default.due_time(18, 0) == 2 * H
    with pytest.raises(ValueError):
        default.due_time(19, 0)
    with pytest.raises(ValueError, match="store timestamp"):
        default.due_time(1, "now")  # type: ignore[arg-type]


def test_compute_deliver_timestamp_falls_back_to_one_second(default: DelayLevelTable) -> None:
    assert default.compute_deliver_timestamp(2, 10_000) == 15_000
    assert default.compute_deliver_timestamp(19, 10_000) == 11_000  # level unknown to this table
    assert default.compute_deliver_timestamp(0, 10_000) == 11_000


def test_queue_ids(default: DelayLevelTable) -> None:
    assert default.queue_id_for(1) == 0
    assert default.queue_id_for(18) == 17
    assert default.level_for_queue(0) == 1
    assert default.level_for_queue(17) == 18
    assert [default.level_for_queue(default.queue_id_for(lv)) for lv in default.levels()] == list(range(1, 19))
    with pytest.raises(ValueError, match=r"schedule queue id must be in 0\.\.17"):
        default.level_for_queue(18)
    with pytest.raises(ValueError, match=r"schedule queue id must be in 0\.\.17"):
        default.level_for_queue(-1)
    with pytest.raises(ValueError):
        default.queue_id_for(0)


def test_items_and_levels() -> None:
    t = DelayLevelTable.parse("100ms 200ms")
    assert list(t.items()) == [(1, 100), (2, 200)]
    assert list(t.levels()) == [1, 2]
    assert t.delays_ms == (100, 200)


class TestCorrectDeliverTimestamp:
    """RocketMQ 4.9.3 ScheduleMessageService.correctDeliverTimestamp: a due time beyond now + delay -> now."""

    def test_due_time_within_one_delay_is_kept(self, default: DelayLevelTable) -> None:
        now = 1_000_000
        assert default.correct_deliver_timestamp(now, now + 3_000, 2) == now + 3_000
        assert default.correct_deliver_timestamp(now, now - 50, 2) == now - 50  # overdue: kept, delivered now

    def test_exactly_one_delay_ahead_is_kept(self, default: DelayLevelTable) -> None:
        now = 1_000_000
        assert default.correct_deliver_timestamp(now, now + 5_000, 2) == now + 5_000

    def test_too_far_ahead_is_delivered_now(self, default: DelayLevelTable) -> None:
        # e.g. the clock went back an hour after the message was stored
        now = 1_000_000
        assert default.correct_deliver_timestamp(now, now + 5_001, 2) == now
        assert default.correct_deliver_timestamp(now, now + H, 2) == now

    def test_bad_level(self, default: DelayLevelTable) -> None:
        with pytest.raises(ValueError, match="delay level"):
            default.correct_deliver_timestamp(0, 0, 19)
