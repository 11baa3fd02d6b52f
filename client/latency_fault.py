"""RocketMQ's latency fault tolerance for sends (``sendLatencyFaultEnable``): pure, time as an argument.

RocketMQ 4.9.3's MQFaultStrategy and LatencyFaultToleranceImpl (client/.../latency/). After every send attempt
the producer reports the broker name, how long the attempt took and whether it failed
(:meth:`MQFaultStrategy.update_fault_item`). A broker is then avoided for a time that grows with its latency
(``LATENCY_MAX`` -> ``NOT_AVAILABLE_DURATION``): an answer within 100 ms costs nothing, 550 ms 30 s, ...,
15 s or more 10 min; a failed attempt counts as 30 s of latency, so a broker that did not answer (or refused the
connection) is avoided for 10 minutes. While the strategy is enabled the next queue is the round robin's next one
on an available broker; when none is available it takes the "least bad" broker (:meth:`pick_one_at_least`).
Disabled (RocketMQ's default), it only avoids the broker of the previous failed attempt.

trimq's addition: :meth:`LatencyFaultTolerance.remove` is called when a broker's master (re-)appears in a route
(client/instance.py's route listeners), so a restarted or promoted master is used again at once rather than
after the 10 minutes its failure earned it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from trimq.protocol.message_queue import MessageQueue

__all__ = [
    "LATENCY_MAX",
    "NOT_AVAILABLE_DURATION",
    "FaultItem",
    "LatencyFaultTolerance",
    "MQFaultStrategy",
    "PublishQueues",
    "compute_not_available_duration",
]

#: RocketMQ's latencyMax (ms) and the notAvailableDuration (ms) each earns.
LATENCY_MAX: tuple[int, ...] = (50, 100, 550, 1_000, 2_000, 3_000, 15_000)
NOT_AVAILABLE_DURATION: tuple[int, ...] = (0, 0, 30_000, 60_000, 120_000, 180_000, 600_000)
#: The latency a failed attempt counts as (RocketMQ: ``isolation ? 30000 : currentLatency``).
ISOLATION_LATENCY_MS = 30_000


def compute_not_available_duration(current_latency_ms: int) -> int:
    """How long (ms) a broker that took ``current_latency_ms`` is avoided: the duration of the largest
    ``LATENCY_MAX`` step it reached (0 below 100 ms)."""
    for latency, duration in zip(reversed(LATENCY_MAX), reversed(NOT_AVAILABLE_DURATION), strict=True):
        if current_latency_ms >= latency:
            return duration
    return 0


@dataclass(slots=True)
class FaultItem:
    """One broker's last report: its latency and from when it is available again."""

    name: str
    current_latency: int
    start_timestamp: int  # ms: available again from then

    def is_available(self, now_ms: int) -> bool:
        return now_ms - self.start_timestamp >= 0

    def sort_key(self, now_ms: int) -> tuple[int, int, int]:
        """RocketMQ's FaultItem.compareTo: available first, then lower latency, then sooner available."""
        return (0 if self.is_available(now_ms) else 1, self.current_latency, self.start_timestamp)


class LatencyFaultTolerance:
    """Broker name -> :class:`FaultItem` (RocketMQ's LatencyFaultToleranceImpl)."""

    def __init__(self) -> None:
        self.fault_item_table: dict[str, FaultItem] = {}
        self._which_item_worst = 0

    def update_fault_item(self, name: str, current_latency: int, not_available_duration: int, now_ms: int) -> None:
        """Record an attempt on ``name``: avoided until ``now_ms + not_available_duration``."""
        item = self.fault_item_table.get(name)
        if item is None:
            self.fault_item_table[name] = FaultItem(name, current_latency, now_ms + not_available_duration)
        else:
            item.current_latency = current_latency
            item.start_timestamp = now_ms + not_available_duration

    def is_available(self, name: str, now_ms: int) -> bool:
        item = self.fault_item_table.get(name)
        return item is None or item.is_available(now_ms)

    def remove(self, name: str) -> None:
        self.fault_item_table.pop(name, None)

    def pick_one_at_least(self, now_ms: int) -> str | None:
        """A broker to use when none is available: one of the better half (RocketMQ's pickOneAtLeast), rotating."""
        items = sorted(self.fault_item_table.values(), key=lambda i: i.sort_key(now_ms))
        if not items:
            return None
        half = len(items) // 2
        if half <= 0:
            return items[0].name
        self._which_item_worst += 1
        return items[self._which_item_worst % half].name


class PublishQueues(Protocol):
    """A topic's writable queues with the round-robin counter (client/instance.py TopicPublishInfo)."""

    message_queue_list: list[MessageQueue]
    send_which_queue: int

    def select_one_message_queue(self, last_broker_name: str | None = None) -> MessageQueue: ...


class MQFaultStrategy:
    """RocketMQ's MQFaultStrategy: chooses the queue of the next send attempt and records how attempts went."""

    def __init__(self, enabled: bool = False) -> None:
        self.send_latency_fault_enable = enabled
        self.latency_fault_tolerance = LatencyFaultTolerance()

    def select_one_message_queue(self, info: PublishQueues, last_broker_name: str | None, now_ms: int
                                 ) -> MessageQueue:
        """The queue of the next attempt (``last_broker_name``: the broker of the previous failed attempt)."""
        if not self.send_latency_fault_enable:
            return info.select_one_message_queue(last_broker_name)
        queues = info.message_queue_list
        if queues:
            for _ in range(len(queues)):
                info.send_which_queue = (info.send_which_queue + 1) & 0x7FFFFFFF
                mq = queues[info.send_which_queue % len(queues)]
                if self.latency_fault_tolerance.is_available(mq.broker_name, now_ms):
                    return mq
            not_best = self.latency_fault_tolerance.pick_one_at_least(now_ms)
            on_it = [mq for mq in queues if mq.broker_name == not_best]
            if on_it:
                info.send_which_queue = (info.send_which_queue + 1) & 0x7FFFFFFF
                return on_it[info.send_which_queue % len(on_it)]
            if not_best is not None:
                self.latency_fault_tolerance.remove(not_best)  # no queue of it any more: forget it
        return info.select_one_message_queue()

    def update_fault_item(self, broker_name: str, current_latency: int, isolation: bool, now_ms: int) -> None:
        """An attempt on ``broker_name`` took ``current_latency`` ms; ``isolation``: it failed."""
        if self.send_latency_fault_enable:
            duration = compute_not_available_duration(ISOLATION_LATENCY_MS if isolation else current_latency)
            self.latency_fault_tolerance.update_fault_item(broker_name, current_latency, duration, now_ms)

    def is_available(self, broker_name: str, now_ms: int) -> bool:
        """Whether ``broker_name`` is not being avoided (always True while disabled)."""
        return not self.send_latency_fault_enable or self.latency_fault_tolerance.is_available(broker_name, now_ms)
