"""What the console's pages show, built from the Admin's typed results. Pure: no I/O, no trio.

The pages join several results that each answer one question: a group's queues come from its consume
progress (offsets, lag, owner), the brokers' lock tables (lock holder, age) and the members' running info
(blocked orderly queues); :func:`queue_rows` puts them on one row per queue.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from trimq.client.admin_results import (
    ConsumerConnections,
    ConsumerLocks,
    ConsumerProgress,
    ConsumerStatus,
    TopicEntry,
)
from trimq.protocol.validation import SYSTEM_TOPICS, is_dlq_topic, is_retry_topic

__all__ = ["BlockedQueueRow", "MemberRow", "QueueRow", "blocked_rows", "member_rows", "queue_rows", "topic_kind",
           "visible_topics"]

QueueKey = tuple[str, str, int]


def topic_kind(topic: str) -> str:
    """``retry`` (``%RETRY%group``), ``dlq`` (``%DLQ%group``), ``system`` (the schedule topic, TBW102, RocketMQ's
    ``RMQ_SYS_*``) or ``normal``."""
    if is_retry_topic(topic):
        return "retry"
    if is_dlq_topic(topic):
        return "dlq"
    if topic in SYSTEM_TOPICS or topic.upper().startswith("RMQ_SYS_"):
        return "system"
    return "normal"


def visible_topics(entries: Iterable[TopicEntry], *, show_all: bool) -> list[TopicEntry]:
    """The topics a page lists: the applications' own, or every one (``show_all``). A broker registers its
    own name and its cluster's as topics too (RocketMQ does): those have no config on any broker."""
    out = []
    for e in entries:
        if show_all or (topic_kind(e.topic) == "normal" and e.brokers):
            out.append(e)
    return out


def _mq_key(mq: Any) -> QueueKey | None:
    if not isinstance(mq, dict):
        return None
    try:
        return str(mq.get("topic")), str(mq.get("brokerName")), int(mq.get("queueId"))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class BlockedQueueRow:
    """An orderly queue retrying one message (a member's ``blockedQueues``): skip it to move on."""

    consumer_group: str
    client_id: str
    topic: str
    broker_name: str
    queue_id: int
    offset: int | None
    msg_id: str | None
    attempts: int | None
    blocked_ms: int | None


def blocked_rows(status: ConsumerStatus | None) -> list[BlockedQueueRow]:
    """Every blocked queue the group's members report, by queue."""
    rows = []
    for client in status.clients if status is not None else []:
        for b in client.blocked_queues:
            key = _mq_key(b.get("mq"))
            if key is None:
                continue
            rows.append(BlockedQueueRow(status.consumer_group if status else "", client.client_id, *key,
                                        b.get("offset"), b.get("msgId"), b.get("attempts"), b.get("blockedMs")))
    rows.sort(key=lambda r: (r.topic, r.broker_name, r.queue_id))
    return rows


@dataclass(frozen=True)
class QueueRow:
    """One queue of a group: offsets and lag, who consumes it, who holds its broker lock, whether it is blocked."""

    topic: str
    broker_name: str
    queue_id: int
    broker_offset: int | None = None
    consumer_offset: int | None = None
    lag: int | None = None
    owner: str | None = None
    lock_holder: str | None = None
    lock_age_ms: int | None = None
    lock_expired: bool = False
    blocked: BlockedQueueRow | None = None


def queue_rows(progress: ConsumerProgress | None, locks: ConsumerLocks | None,
               status: ConsumerStatus | None) -> list[QueueRow]:
    """One row per queue the progress, a lock or a blocked queue names, sorted by topic, broker, queue."""
    rows: dict[QueueKey, dict[str, Any]] = {}

    def row(key: QueueKey) -> dict[str, Any]:
        return rows.setdefault(key, {"topic": key[0], "broker_name": key[1], "queue_id": key[2]})

    for q in progress.queues if progress is not None else []:
        if q.topic is None or q.broker_name is None or q.queue_id is None:
            continue
        row((q.topic, q.broker_name, int(q.queue_id))).update(
            broker_offset=q.broker_offset, consumer_offset=q.consumer_offset, lag=q.lag, owner=q.owner)
    for lk in locks.locks if locks is not None else []:
        if lk.topic is None or lk.broker_name is None or lk.queue_id is None:
            continue
        row((lk.topic, lk.broker_name, int(lk.queue_id))).update(
            lock_holder=lk.client_id, lock_age_ms=lk.age_ms, lock_expired=lk.expired)
    for b in blocked_rows(status):
        row((b.topic, b.broker_name, b.queue_id))["blocked"] = b
    return [QueueRow(**rows[k]) for k in sorted(rows)]


@dataclass(frozen=True)
class MemberRow:
    """A live member: its connection (address, version, last heartbeat) and, when it answered, its running
    info (queues held, in flight, dead-lettered, skipped, blocked queues)."""

    client_id: str
    client_addr: str | None
    language: str | None
    version: Any
    last_update_timestamp: int | None
    answered: bool = False
    queues: int = 0
    in_flight: int | None = None
    dead_lettered: int | None = None
    skipped: int | None = None
    blocked: int = 0
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def member_rows(connections: ConsumerConnections | None, status: ConsumerStatus | None) -> list[MemberRow]:
    """The group's members (from its connections), each with its running info when it reported it."""
    infos = {c.client_id: c for c in status.clients} if status is not None else {}
    errors = {e.client_id: e.error for e in status.errors} if status is not None else {}
    out = []
    for c in connections.connection_set if connections is not None else []:
        info = infos.get(c.client_id)
        if info is None:
            out.append(MemberRow(c.client_id, c.client_addr, c.language, c.version, c.last_update_timestamp,
                                 error=errors.get(c.client_id)))
            continue
        held = [r for r in info.mq_table if not (r.get("processQueueInfo") or {}).get("dropped")]
        out.append(MemberRow(c.client_id, c.client_addr, c.language, c.version, c.last_update_timestamp, True,
                             len(held), info.info.get("inFlight"), info.info.get("deadLettered"),
                             info.info.get("skipped"),
                             sum(1 for b in info.blocked_queues if _mq_key(b.get("mq")) is not None)))
    out.sort(key=lambda m: m.client_id)
    return out
