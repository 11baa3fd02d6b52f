"""Prometheus metrics of push consumers (prometheus-client), in a registry passed in or one per consumer.

Event metrics are updated as things happen; state metrics are read from the live consumers when the
registry is scraped (a custom collector), so they cost nothing between scrapes and vanish with a consumer.

=================================================  =========  ======================================================
name                                               type       labels / meaning
=================================================  =========  ======================================================
trimq_consumer_consume_latency_seconds             histogram  consumer_group, topic: one listener call
trimq_consumer_consumed_messages_total             counter    consumer_group, topic, result=ok|failed
trimq_consumer_pull_latency_seconds                histogram  consumer_group, topic: one PULL_MESSAGE (long polls
                                                              included)
trimq_consumer_send_back_total                     counter    consumer_group, how=broker|retry_topic|failed
trimq_consumer_rebalance_total                     counter    consumer_group: rebalance passes
trimq_consumer_rebalance_duration_seconds          histogram  consumer_group
trimq_consumer_process_queue_messages              gauge      consumer_group, topic, broker, queue_id: cached, not
                                                              committed
trimq_consumer_process_queue_bytes                 gauge      same: their body bytes
trimq_consumer_locked_queues                       gauge      consumer_group: orderly queues locked on the broker
trimq_consumer_queue_blocked_seconds               gauge      consumer_group, topic, broker, queue_id: orderly queue
                                                              retrying one message, for how long
trimq_consumer_queue_blocked_attempts              gauge      same: failed attempts of that message
trimq_consumer_blocked_keys                        gauge      consumer_group, topic, broker, queue_id: keys of a
                                                              key-scope orderly queue retrying one message
trimq_consumer_pulls_total                         counter    consumer_group, outcome=pulls|found|no_new|errors|...
trimq_consumer_dead_letters_total                  counter    consumer_group: messages this consumer dead-lettered
=================================================  =========  ======================================================

The group label is ``consumer_group``, as on the broker's metrics (formerly ``group``: docs/OPERATIONS.md,
"Label names").

Several consumers may share a registry: the families are created once per registry and labelled by
``consumer_group``.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

__all__ = ["ConsumerMetrics", "MetricsSource", "QueueState"]

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
PULL_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 15.0, 30.0)
QUEUE_LABELS = ["consumer_group", "topic", "broker", "queue_id"]


@dataclass
class QueueState:
    """One held queue, as the state collector reports it."""

    topic: str
    broker: str
    queue_id: int
    messages: int
    bytes: int
    locked: bool
    blocked_seconds: float | None = None
    blocked_attempts: int = 0
    blocked_keys: int | None = None
    """Key scope: keys retrying one message (None: not a key-scope queue)."""


class MetricsSource(Protocol):
    """What the state collector reads from a consumer at scrape time."""

    @property
    def group_name(self) -> str: ...

    def metrics_state(self) -> tuple[list[QueueState], dict[str, int], int]:
        """(held queues, pull counters, dead letters)."""
        ...


class _StateCollector:
    """Reads every attached consumer's state at scrape time."""

    def __init__(self) -> None:
        self.sources: weakref.WeakSet[Any] = weakref.WeakSet()

    def describe(self) -> list[Metric]:
        return []  # no fixed series; names are unique to this module

    def collect(self) -> Iterator[Metric]:
        msgs = GaugeMetricFamily("trimq_consumer_process_queue_messages",
                                 "Messages cached by a process queue and not yet committed", labels=QUEUE_LABELS)
        size = GaugeMetricFamily("trimq_consumer_process_queue_bytes",
                                 "Body bytes of the messages cached by a process queue", labels=QUEUE_LABELS)
        locked = GaugeMetricFamily("trimq_consumer_locked_queues",
                                   "Orderly queues this consumer holds locked on the broker",
                                   labels=["consumer_group"])
        blocked = GaugeMetricFamily("trimq_consumer_queue_blocked_seconds",
                                    "How long an orderly queue has been retrying one message", labels=QUEUE_LABELS)
        attempts = GaugeMetricFamily("trimq_consumer_queue_blocked_attempts",
                                     "Failed attempts of the message an orderly queue is blocked on",
                                     labels=QUEUE_LABELS)
        keys = GaugeMetricFamily("trimq_consumer_blocked_keys",
                                 "Keys of a key-scope orderly queue retrying one message", labels=QUEUE_LABELS)
        pulls = CounterMetricFamily("trimq_consumer_pulls", "Pull requests by outcome",
                                    labels=["consumer_group", "outcome"])
        dlq = CounterMetricFamily("trimq_consumer_dead_letters", "Messages this consumer dead-lettered",
                                  labels=["consumer_group"])
        for src in list(self.sources):
            group = src.group_name
            queues, pull_stats, dead = src.metrics_state()
            n_locked = 0
            for q in queues:
                labels = [group, q.topic, q.broker, str(q.queue_id)]
                msgs.add_metric(labels, q.messages)
                size.add_metric(labels, q.bytes)
                n_locked += q.locked
                if q.blocked_seconds is not None:
                    blocked.add_metric(labels, q.blocked_seconds)
                    attempts.add_metric(labels, q.blocked_attempts)
                if q.blocked_keys is not None:
                    keys.add_metric(labels, q.blocked_keys)
            locked.add_metric([group], n_locked)
            for outcome, value in sorted(pull_stats.items()):
                pulls.add_metric([group, outcome], value)
            dlq.add_metric([group], dead)
        yield from (msgs, size, locked, blocked, attempts, keys, pulls, dlq)


class _Families:
    """The event metrics of one registry (created once, shared by the consumers using it)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.consume_latency = Histogram("trimq_consumer_consume_latency_seconds", "Duration of one listener call",
                                         ["consumer_group", "topic"], buckets=LATENCY_BUCKETS, registry=registry)
        self.consumed = Counter("trimq_consumer_consumed_messages", "Messages consumed, by result",
                                ["consumer_group", "topic", "result"], registry=registry)
        self.pull_latency = Histogram("trimq_consumer_pull_latency_seconds",
                                      "Duration of one PULL_MESSAGE (long polling included)",
                                      ["consumer_group", "topic"],
                                      buckets=PULL_BUCKETS, registry=registry)
        self.send_back = Counter("trimq_consumer_send_back", "Messages sent back for a retry or a dead letter",
                                 ["consumer_group", "how"], registry=registry)
        self.rebalances = Counter("trimq_consumer_rebalance", "Rebalance passes", ["consumer_group"],
                                  registry=registry)
        self.rebalance_duration = Histogram("trimq_consumer_rebalance_duration_seconds",
                                            "Duration of one rebalance pass", ["consumer_group"],
                                            buckets=LATENCY_BUCKETS,
                                            registry=registry)
        self.state = _StateCollector()
        registry.register(self.state)


_FAMILIES: weakref.WeakKeyDictionary[CollectorRegistry, _Families] = weakref.WeakKeyDictionary()


class ConsumerMetrics:
    """The metrics of one consumer group member; ``registry`` defaults to a new one for this consumer."""

    def __init__(self, group: str, registry: CollectorRegistry | None = None) -> None:
        self.group = group
        self.registry = registry if registry is not None else CollectorRegistry()
        fam = _FAMILIES.get(self.registry)
        if fam is None:
            fam = _FAMILIES[self.registry] = _Families(self.registry)
        self._f = fam
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def attach(self, source: MetricsSource) -> None:
        """Report ``source``'s state at every scrape (until it is garbage or :meth:`detach` is called)."""
        self._f.state.sources.add(source)

    def detach(self, source: MetricsSource) -> None:
        """Stop reading ``source`` at scrape time (the consumer stopped)."""
        self._f.state.sources.discard(source)

    def _child(self, family: Any, *labels: str) -> Any:
        # ``labels()`` validates and locks on every call; the per-batch metrics reuse their children
        key = (id(family), labels)
        child = self._children.get(key)
        if child is None:
            if len(self._children) >= 10_000:
                self._children.clear()
            child = self._children[key] = family.labels(*labels)
        return child

    def observe_consume(self, topic: str, seconds: float) -> None:
        """One listener call's duration."""
        self._child(self._f.consume_latency, self.group, topic).observe(seconds)

    def count_consumed(self, topic: str, ok: int, failed: int) -> None:
        """Messages a listener call consumed and failed."""
        if ok:
            self._child(self._f.consumed, self.group, topic, "ok").inc(ok)
        if failed:
            self._child(self._f.consumed, self.group, topic, "failed").inc(failed)

    def observe_pull(self, topic: str, seconds: float) -> None:
        """One pull's round trip."""
        self._child(self._f.pull_latency, self.group, topic).observe(seconds)

    def count_send_back(self, how: str) -> None:
        """A message sent back for retry (``how``: broker, retry_topic or failed)."""
        self._f.send_back.labels(self.group, how).inc()

    def observe_rebalance(self, seconds: float) -> None:
        """One rebalance pass and its duration."""
        self._f.rebalances.labels(self.group).inc()
        self._f.rebalance_duration.labels(self.group).observe(seconds)
