"""RocketMQ's latency fault tolerance (client/latency_fault.py): pure, time as an argument (issue 15)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from trimq.client.latency_fault import (
    LATENCY_MAX,
    NOT_AVAILABLE_DURATION,
    LatencyFaultTolerance,
    MQFaultStrategy,
    compute_not_available_duration,
)
from trimq.protocol.message_queue import MessageQueue


@pytest.mark.parametrize(("latency", "duration"), [
    (0, 0), (49, 0), (50, 0), (99, 0), (100, 0), (549, 0), (550, 30_000), (999, 30_000), (1_000, 60_000),
    (2_000, 120_000), (2_999, 120_000), (3_000, 180_000), (14_999, 180_000), (15_000, 600_000),
    (30_000, 600_000),
])
def test_not_available_duration_follows_rocketmqs_table(latency: int, duration: int) -> None:
    assert compute_not_available_duration(latency) == duration
    assert LATENCY_MAX == (50, 100, 550, 1000, 2000, 3000, 15000)
    assert NOT_AVAILABLE_DURATION == (0, 0, 30000, 60000, 120000, 180000, 600000)


def test_a_broker_is_avoided_until_its_duration_ends() -> None:
    lft = LatencyFaultTolerance()
    assert lft.is_available("a", 0)
    lft.update_fault_item("a", 600, 30_000, now_ms=1_000)
    assert not lft.is_available("a", 1_000) and not lft.is_available("a", 30_999)
    assert lft.is_available("a", 31_000)
    lft.update_fault_item("a", 20, 0, now_ms=2_000)  # a fast answer makes it available at once
    assert lft.is_available("a", 2_000)
    lft.update_fault_item("a", 600, 30_000, now_ms=3_000)
    lft.remove("a")  # its master re-registered
    assert lft.is_available("a", 3_000)


def test_pick_one_at_least_prefers_available_then_low_latency() -> None:
    lft = LatencyFaultTolerance()
    assert lft.pick_one_at_least(0) is None
    lft.update_fault_item("slow", 3_000, 180_000, now_ms=0)
    assert lft.pick_one_at_least(10) == "slow"  # the only one
    lft.update_fault_item("dead", 30_000, 600_000, now_ms=0)
    lft.update_fault_item("meh", 600, 30_000, now_ms=0)
    lft.update_fault_item("ok", 10, 0, now_ms=0)
    # the better half (ok, meh), rotating
    assert {lft.pick_one_at_least(10) for _ in range(4)} == {"ok", "meh"}


@dataclass
class Info:
    message_queue_list: list[MessageQueue]
    send_which_queue: int = 0
    picked: list[str | None] = field(default_factory=list)

    def select_one_message_queue(self, last_broker_name: str | None = None) -> MessageQueue:
        self.picked.append(last_broker_name)
        for _ in range(len(self.message_queue_list)):
            self.send_which_queue += 1
            mq = self.message_queue_list[self.send_which_queue % len(self.message_queue_list)]
            if mq.broker_name != last_broker_name:
                return mq
        return self.message_queue_list[0]


QUEUES = [MessageQueue("T", b, q) for b in ("broker-a", "broker-b") for q in range(2)]


def test_disabled_it_only_avoids_the_last_failed_broker() -> None:
    strategy = MQFaultStrategy(enabled=False)
    info = Info(list(QUEUES))
    strategy.update_fault_item("broker-a", 30_000, True, now_ms=0)  # not recorded while disabled
    assert strategy.select_one_message_queue(info, "broker-a", now_ms=1).broker_name == "broker-b"
    assert info.picked == ["broker-a"] and strategy.is_available("broker-a", 1)


def test_enabled_a_failed_broker_is_avoided_for_ten_minutes_then_used_again() -> None:
    strategy = MQFaultStrategy(enabled=True)
    info = Info(list(QUEUES))
    strategy.update_fault_item("broker-a", 3, True, now_ms=1_000)  # a failure counts as 30 s of latency
    picks = {strategy.select_one_message_queue(info, None, now_ms=2_000).broker_name for _ in range(8)}
    assert picks == {"broker-b"}
    assert not strategy.is_available("broker-a", 600_999)
    picks = {strategy.select_one_message_queue(info, None, now_ms=601_000).broker_name for _ in range(8)}
    assert picks == {"broker-a", "broker-b"}


def test_enabled_slow_answers_cost_time_by_the_table_and_fast_ones_nothing() -> None:
    strategy = MQFaultStrategy(enabled=True)
    info = Info(list(QUEUES))
    strategy.update_fault_item("broker-b", 80, False, now_ms=0)
    assert strategy.is_available("broker-b", 0)
    strategy.update_fault_item("broker-b", 1_200, False, now_ms=0)
    assert not strategy.is_available("broker-b", 59_999) and strategy.is_available("broker-b", 60_000)
    assert {strategy.select_one_message_queue(info, None, now_ms=10).broker_name for _ in range(6)} == {"broker-a"}


def test_enabled_with_every_broker_avoided_it_takes_the_least_bad_one() -> None:
    strategy = MQFaultStrategy(enabled=True)
    info = Info(list(QUEUES))
    strategy.update_fault_item("broker-a", 3_500, False, now_ms=0)  # 180 s
    strategy.update_fault_item("broker-b", 30_000, True, now_ms=0)  # 600 s
    mq = strategy.select_one_message_queue(info, None, now_ms=10)
    assert mq.broker_name == "broker-a" and mq in QUEUES
    # a broker without any queue in the topic any more is forgotten
    only_b = Info([q for q in QUEUES if q.broker_name == "broker-b"])
    strategy2 = MQFaultStrategy(enabled=True)
    strategy2.update_fault_item("broker-a", 30_000, True, now_ms=0)
    strategy2.update_fault_item("gone", 30_000, True, now_ms=0)
    strategy2.update_fault_item("broker-b", 30_000, True, now_ms=0)
    for _ in range(4):
        assert strategy2.select_one_message_queue(only_b, None, now_ms=10).broker_name == "broker-b"
