"""Who is connected: consumer groups and producer groups, learnt from heartbeats (RocketMQ's ConsumerManager and
ProducerManager in one place).

A client heartbeats every 30 s on its connection to the broker; the heartbeat names its client id, the producer
groups it sends for and the consumer groups it consumes for (with consume type, message model,
consume_from_where, trimq's ``consumeOrderly`` and the subscriptions). A member leaves a group when it
unregisters, when its connection closes (at once) or when it has not heartbeated for
``channel_expired_timeout_ms`` (120 s, RocketMQ's ClientHousekeepingService; checked by ``scan_not_active``).

**Membership follows the lease** (issue 14, docs/PROTOCOL.md "Queue-lock leases"): with ``lease_expiry_ms`` set,
an *orderly* member (its heartbeat says ``consumeOrderly``, CLUSTERING) also leaves when it has neither heartbeated nor
renewed its queue locks (``touch``, called for every LOCK_BATCH_MQ, which an orderly client sends to every
broker every third of a lease even when it holds nothing there) for ``lease_expiry_ms``, the lease plus the
takeover margin; and with ``disconnect_grace_ms`` set, an orderly member whose connection closed leaves that
long after the close unless it renews or heartbeats over a new connection first. Both are checked by
``scan_leases``. Non-orderly members keep RocketMQ's rules: they heartbeat every 30 s, so a lease-length silence
says nothing about them. A member that left rejoins with its next heartbeat.

When a consumer group's membership or a member's subscriptions change, the group is marked *dirty*; the
coordination service drains the dirty set after a short coalescing window and pushes one
NOTIFY_CONSUMER_IDS_CHANGED to every member, so a burst of joins costs one notification per member rather than
one per join (DESIGN.md §6.1). Members that heartbeat different subscriptions for one group are reported
(structlog event ``subscription.inconsistent``, once per change, and ``subscription_consistency``): RocketMQ
silently keeps whichever heartbeat came last, and messages get lost (DESIGN.md §6.7).

Pure bookkeeping: no trio, no I/O. Connections are only stored and compared, never awaited; the clock is
injected (``now_ms`` is monotonic broker time, ``wall_ms`` stamps what people read).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trimq.protocol.validation import InvalidNameError, check_group, check_topic
from trimq.runtime.logs import get_logger

if TYPE_CHECKING:
    from trimq.runtime.server import Connection

log = get_logger("trimq.broker.consumers")

__all__ = [
    "CONSUME_FROM_WHERE",
    "CONSUME_TYPES",
    "MESSAGE_MODELS",
    "ClientChannelInfo",
    "ConsumerData",
    "ConsumerGroupInfo",
    "ConsumerManager",
    "ConsumerMember",
    "HeartbeatData",
    "ProducerGroupInfo",
    "SubscriptionConsistency",
    "SubscriptionData",
    "parse_heartbeat",
]

#: RocketMQ's ConsumeType names.
CONSUME_TYPES = ("CONSUME_PASSIVELY", "CONSUME_ACTIVELY")
#: RocketMQ's MessageModel names.
MESSAGE_MODELS = ("CLUSTERING", "BROADCASTING")
#: RocketMQ's ConsumeFromWhere names (the three current ones first, then the deprecated ones it still accepts).
CONSUME_FROM_WHERE = (
    "CONSUME_FROM_LAST_OFFSET",
    "CONSUME_FROM_FIRST_OFFSET",
    "CONSUME_FROM_TIMESTAMP",
    "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST",
    "CONSUME_FROM_MIN_OFFSET",
    "CONSUME_FROM_MAX_OFFSET",
)


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


# ---------------------------------------------------------------------------------------------- heartbeat data


@dataclass(frozen=True, slots=True)
class SubscriptionData:
    """One topic subscription of a consumer, as heartbeated (RocketMQ's SubscriptionData)."""

    topic: str
    sub_string: str = "*"
    tags_set: tuple[str, ...] = ()
    code_set: tuple[int, ...] = ()
    sub_version: int = 0
    expression_type: str = "TAG"

    @property
    def normalized(self) -> str:
        """The expression compared for consistency: ``*``, the sorted tags joined by ``||``, or the raw string.

        ``TagA || TagB`` and ``TagB||TagA`` select the same messages, so they are not an inconsistency.
        """
        s = self.sub_string.strip()
        if s in ("", "*"):
            return "*"
        if self.expression_type == "TAG" and self.tags_set:
            return "||".join(sorted(set(self.tags_set)))
        return s if self.expression_type == "TAG" else f"{self.expression_type}:{s}"

    def to_wire(self) -> dict[str, Any]:
        """RocketMQ's JSON field names."""
        return {
            "topic": self.topic,
            "subString": self.sub_string,
            "tagsSet": list(self.tags_set),
            "codeSet": list(self.code_set),
            "subVersion": self.sub_version,
            "expressionType": self.expression_type,
        }

    @classmethod
    def from_wire(cls, m: Any, where: str) -> SubscriptionData:
        """Parse one ``subscriptionDataSet`` entry; ValueError names the offending field (``where`` prefixes it)."""
        if not isinstance(m, dict):
            raise ValueError(f"{where} must be a map, got {type(m).__name__}")
        topic = m.get("topic")
        try:
            check_topic(topic)
        except InvalidNameError as exc:
            raise ValueError(f"{where}.topic: {exc}") from None
        assert isinstance(topic, str)
        sub = _opt(m, "subString", str, "*", where)
        tags = _opt(m, "tagsSet", list, [], where)
        if not all(isinstance(t, str) for t in tags):
            raise ValueError(f"{where}.tagsSet must be a list of strings")
        codes = _opt(m, "codeSet", list, [], where)
        if not all(type(c) is int for c in codes):
            raise ValueError(f"{where}.codeSet must be a list of integers")
        return cls(
            topic=topic,
            sub_string=sub,
            tags_set=tuple(tags),
            code_set=tuple(codes),
            sub_version=_opt(m, "subVersion", int, 0, where),
            expression_type=_opt(m, "expressionType", str, "TAG", where),
        )


@dataclass(frozen=True, slots=True)
class ConsumerData:
    """One consumer group of a heartbeat (RocketMQ's ConsumerData, plus trimq's ``consume_orderly``)."""

    group_name: str
    consume_type: str = "CONSUME_PASSIVELY"
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    consume_orderly: bool = False
    subscriptions: tuple[SubscriptionData, ...] = ()


@dataclass(frozen=True, slots=True)
class HeartbeatData:
    """A parsed HEART_BEAT body (docs/PROTOCOL.md, code 34)."""

    client_id: str
    producer_groups: tuple[str, ...] = ()
    consumers: tuple[ConsumerData, ...] = ()
    language: str | None = None
    version: str | None = None


def _opt(m: dict[str, Any], key: str, kind: type, default: Any, where: str) -> Any:
    """``m[key]`` checked against ``kind`` (bool is not an int), or ``default`` when absent or nil."""
    value = m.get(key)
    if value is None:
        return default
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"{where}.{key} must be an integer, got {value!r}")
    if not isinstance(value, kind):
        raise ValueError(f"{where}.{key} must be {kind.__name__}, got {type(value).__name__}")
    return value


def _choice(m: dict[str, Any], key: str, choices: tuple[str, ...], where: str) -> str:
    value = _opt(m, key, str, choices[0], where)
    if value not in choices:
        raise ValueError(f"{where}.{key} = {value!r}: must be one of {', '.join(choices)}")
    return str(value)


def parse_heartbeat(body: Any) -> HeartbeatData:
    """Parse and validate a HEART_BEAT body; raises ValueError naming the bad field.

    Absent optional fields take RocketMQ's defaults (CONSUME_PASSIVELY, CLUSTERING, CONSUME_FROM_LAST_OFFSET).
    """
    if not isinstance(body, dict):
        raise ValueError(f"heartbeat body must be a map, got {type(body).__name__}")
    client_id = body.get("clientID")
    if not isinstance(client_id, str) or not client_id:
        raise ValueError(f"clientID must be a non-empty string, got {client_id!r}")
    producers: list[str] = []
    for i, p in enumerate(_opt(body, "producerDataSet", list, [], "heartbeat")):
        if not isinstance(p, dict):
            raise ValueError(f"producerDataSet[{i}] must be a map")
        try:
            producers.append(check_group(p.get("groupName")))
        except InvalidNameError as exc:
            raise ValueError(f"producerDataSet[{i}].groupName: {exc}") from None
    consumers: list[ConsumerData] = []
    seen: set[str] = set()
    for i, c in enumerate(_opt(body, "consumerDataSet", list, [], "heartbeat")):
        where = f"consumerDataSet[{i}]"
        if not isinstance(c, dict):
            raise ValueError(f"{where} must be a map")
        try:
            group = check_group(c.get("groupName"))
        except InvalidNameError as exc:
            raise ValueError(f"{where}.groupName: {exc}") from None
        if group in seen:
            raise ValueError(f"{where}.groupName {group!r} appears twice in one heartbeat")
        seen.add(group)
        subs_raw = _opt(c, "subscriptionDataSet", list, [], where)
        subs = [SubscriptionData.from_wire(s, f"{where}.subscriptionDataSet[{j}]") for j, s in enumerate(subs_raw)]
        topics = [s.topic for s in subs]
        if len(set(topics)) != len(topics):
            raise ValueError(f"{where}.subscriptionDataSet names a topic twice")
        orderly = c.get("consumeOrderly", False)
        if orderly is None:
            orderly = False
        if not isinstance(orderly, bool):
            raise ValueError(f"{where}.consumeOrderly must be true or false, got {orderly!r}")
        consumers.append(ConsumerData(
            group_name=group,
            consume_type=_choice(c, "consumeType", CONSUME_TYPES, where),
            message_model=_choice(c, "messageModel", MESSAGE_MODELS, where),
            consume_from_where=_choice(c, "consumeFromWhere", CONSUME_FROM_WHERE, where),
            consume_orderly=orderly,
            subscriptions=tuple(subs),
        ))
    language = _opt(body, "language", str, None, "heartbeat")
    version = body.get("version")
    if version is not None and (isinstance(version, bool) or not isinstance(version, str | int)):
        raise ValueError(f"heartbeat.version must be a string or an integer, got {version!r}")
    return HeartbeatData(
        client_id=client_id,
        producer_groups=tuple(dict.fromkeys(producers)),
        consumers=tuple(consumers),
        language=language,
        version=None if version is None else str(version),
    )


# ---------------------------------------------------------------------------------------------- group tables


@dataclass(slots=True)
class ClientChannelInfo:
    """One client in one group: its connection and when it last heartbeated (RocketMQ's ClientChannelInfo)."""

    client_id: str
    conn: Connection
    address: str
    language: str | None
    version: str | None
    last_update_ms: int  # broker (monotonic) clock, drives expiry
    last_update_timestamp: int  # wall clock, for people
    closed_at_ms: int | None = None  # broker clock: when its connection closed (orderly members wait out a grace)


@dataclass(slots=True)
class ConsumerMember(ClientChannelInfo):
    """A consumer group member: the channel info plus what it heartbeated for this group."""

    consume_type: str = "CONSUME_PASSIVELY"
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    consume_orderly: bool = False
    subscriptions: dict[str, SubscriptionData] = field(default_factory=dict)

    @property
    def holds_leases(self) -> bool:
        """An orderly CLUSTERING member: it locks queues and renews them every third of a lease, so the lease
        rules apply to its membership (a BROADCASTING orderly member locks nothing and heartbeats every 30 s)."""
        return self.consume_orderly and self.message_model == "CLUSTERING"

    def subscription_view(self) -> dict[str, str]:
        """topic -> normalized expression, what consistency compares."""
        return {t: s.normalized for t, s in sorted(self.subscriptions.items())}


@dataclass(slots=True)
class ConsumerGroupInfo:
    """A consumer group's live members, by client id."""

    group_name: str
    members: dict[str, ConsumerMember] = field(default_factory=dict)

    def client_ids(self) -> list[str]:
        return sorted(self.members)

    @property
    def consume_orderly(self) -> bool:
        return any(m.consume_orderly for m in self.members.values())

    def latest(self) -> ConsumerMember | None:
        """The member that heartbeated last (its settings are the group's, as in RocketMQ)."""
        return max(self.members.values(), key=lambda m: m.last_update_ms, default=None)

    def subscription_table(self) -> dict[str, SubscriptionData]:
        """topic -> subscription, later heartbeats winning: RocketMQ's group-level table (lossy by design)."""
        table: dict[str, SubscriptionData] = {}
        for m in sorted(self.members.values(), key=lambda m: m.last_update_ms):
            table.update(m.subscriptions)
        return table


@dataclass(slots=True)
class ProducerGroupInfo:
    """A producer group's live clients, by client id."""

    group_name: str
    members: dict[str, ClientChannelInfo] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SubscriptionConsistency:
    """Whether every member of a group subscribes to the same topics with the same expressions.

    ``members`` maps each client id to its topic -> expression view; ``inconsistent_topics`` lists every topic
    that some member lacks or subscribes to with a different expression.
    """

    group: str
    consistent: bool
    members: dict[str, dict[str, str]]
    inconsistent_topics: tuple[str, ...]

    def to_wire(self) -> dict[str, Any]:
        return {
            "consumerGroup": self.group,
            "consistent": self.consistent,
            "inconsistentTopics": list(self.inconsistent_topics),
            "members": [{"clientId": cid, "subscriptions": subs} for cid, subs in sorted(self.members.items())],
        }


# ---------------------------------------------------------------------------------------------- the manager


class ConsumerManager:
    """Consumer and producer group membership of one broker.

    ``now_ms`` is the broker's monotonic clock in milliseconds (expiry), ``wall_ms`` the epoch clock (display).
    ``on_dirty`` is called (synchronously) whenever a consumer group becomes dirty, so the notifier can wake.
    """

    def __init__(
        self,
        *,
        channel_expired_timeout_ms: int = 120_000,
        now_ms: Callable[[], int],
        wall_ms: Callable[[], int] = _wall_ms,
        on_dirty: Callable[[], None] | None = None,
        lease_expiry_ms: int = 0,
        disconnect_grace_ms: int = 0,
    ) -> None:
        """``lease_expiry_ms`` / ``disconnect_grace_ms``: the lease rules for orderly members (module
        documentation); 0 turns each off (RocketMQ's rules, the ``rocketmq`` lock profile)."""
        self.channel_expired_timeout_ms = channel_expired_timeout_ms
        self.lease_expiry_ms = lease_expiry_ms
        self.disconnect_grace_ms = disconnect_grace_ms
        self._now_ms = now_ms
        self._wall_ms = wall_ms
        self._on_dirty = on_dirty
        self._consumers: dict[str, ConsumerGroupInfo] = {}
        self._producers: dict[str, ProducerGroupInfo] = {}
        self._orderly_groups: set[str] = set()
        self._dirty: set[str] = set()
        self._consistency_reported: dict[str, tuple[Any, ...]] = {}
        #: Counters for metrics and tests.
        self.stats: dict[str, int] = {"registered": 0, "unregistered": 0, "expired": 0, "closed": 0,
                                      "inconsistent_reports": 0, "lease_expired": 0}

    # ------------------------------------------------------------------ heartbeats and leaving

    def heartbeat(self, conn: Connection, data: HeartbeatData) -> list[str]:
        """Apply a heartbeat received on ``conn``; returns the consumer groups whose membership or subscriptions
        changed (those are now dirty). Remembers the client id on the connection (``conn.attributes``)."""
        conn.attributes["client_id"] = data.client_id
        now, wall = self._now_ms(), self._wall_ms()
        for group in data.producer_groups:
            pinfo = self._producers.setdefault(group, ProducerGroupInfo(group))
            pinfo.members[data.client_id] = ClientChannelInfo(
                data.client_id, conn, conn.remote, data.language, data.version, now, wall)
        changed: list[str] = []
        for cd in data.consumers:
            if self._register_consumer(conn, data, cd, now, wall):
                changed.append(cd.group_name)
        return changed

    def _register_consumer(self, conn: Connection, hb: HeartbeatData, cd: ConsumerData, now: int, wall: int) -> bool:
        ginfo = self._consumers.setdefault(cd.group_name, ConsumerGroupInfo(cd.group_name))
        old = ginfo.members.get(hb.client_id)
        subs = {s.topic: s for s in cd.subscriptions}
        ginfo.members[hb.client_id] = ConsumerMember(
            client_id=hb.client_id, conn=conn, address=conn.remote, language=hb.language, version=hb.version,
            last_update_ms=now, last_update_timestamp=wall, consume_type=cd.consume_type,
            message_model=cd.message_model, consume_from_where=cd.consume_from_where,
            consume_orderly=cd.consume_orderly, subscriptions=subs,
        )
        if cd.consume_orderly:
            self._orderly_groups.add(cd.group_name)
        if old is None:
            self.stats["registered"] += 1
            log.info("consumer.registered", group=cd.group_name, client_id=hb.client_id, remote=conn.remote,
                     orderly=cd.consume_orderly, message_model=cd.message_model)
            self._changed(cd.group_name)
            return True
        if old.conn is not conn:
            log.info("consumer.reconnected", group=cd.group_name, client_id=hb.client_id, remote=conn.remote)
        if {t: s.normalized for t, s in old.subscriptions.items()} != {t: s.normalized for t, s in subs.items()}:
            log.info("consumer.subscription_changed", group=cd.group_name, client_id=hb.client_id,
                     topics=sorted(subs))
            self._changed(cd.group_name)
            return True
        return False

    def unregister_consumer(self, group: str, client_id: str) -> bool:
        """Remove ``client_id`` from ``group`` (UNREGISTER_CLIENT); True if it was a member."""
        if self._remove_consumer(group, client_id, reason="unregistered"):
            self.stats["unregistered"] += 1
            return True
        return False

    def unregister_producer(self, group: str, client_id: str) -> bool:
        """Remove ``client_id`` from producer group ``group``; True if it was there."""
        return self._remove_producer(group, client_id)

    def groups_of_client(self, client_id: str) -> tuple[list[str], list[str]]:
        """(consumer groups, producer groups) in which ``client_id`` is registered."""
        return (
            sorted(g for g, info in self._consumers.items() if client_id in info.members),
            sorted(g for g, info in self._producers.items() if client_id in info.members),
        )

    def connection_closed(self, conn: Connection) -> list[tuple[str, str]]:
        """Forget every registration made through ``conn``; returns the (consumer group, client id) removed.

        A client that already heartbeated again on a newer connection is kept: only registrations whose
        stored connection is ``conn`` go. Under the lease rules (``disconnect_grace_ms``) an orderly member is
        not removed here but marked; ``scan_leases`` removes it once the grace has passed.
        """
        removed: list[tuple[str, str]] = []
        for group, ginfo in list(self._consumers.items()):
            for cid, member in list(ginfo.members.items()):
                if member.conn is not conn:
                    continue
                if self.disconnect_grace_ms and member.holds_leases:
                    # Lease rules: it may reconnect and renew within the grace (scan_leases removes it after).
                    if member.closed_at_ms is None:
                        member.closed_at_ms = self._now_ms()
                    continue
                if self._remove_consumer(group, cid, reason="connection_closed"):
                    removed.append((group, cid))
                    self.stats["closed"] += 1
        for group, pinfo in list(self._producers.items()):
            for cid, pmember in list(pinfo.members.items()):
                if pmember.conn is conn:
                    self._remove_producer(group, cid)
        return removed

    def scan_not_active(self) -> list[tuple[str, str]]:
        """Expire every registration silent for more than ``channel_expired_timeout_ms`` (strictly, as RocketMQ);
        returns the (consumer group, client id) removed. Producers expire the same way."""
        now = self._now_ms()
        limit = self.channel_expired_timeout_ms
        removed: list[tuple[str, str]] = []
        for group, ginfo in list(self._consumers.items()):
            for cid, member in list(ginfo.members.items()):
                if now - member.last_update_ms > limit and self._remove_consumer(group, cid, reason="expired"):
                    removed.append((group, cid))
                    self.stats["expired"] += 1
        for group, pinfo in list(self._producers.items()):
            for cid, pmember in list(pinfo.members.items()):
                if now - pmember.last_update_ms > limit:
                    log.info("producer.expired", group=group, client_id=cid)
                    self._remove_producer(group, cid)
        return removed

    def touch(self, group: str, client_id: str, conn: Connection) -> bool:
        """A lease renewal (LOCK_BATCH_MQ) by ``client_id`` for ``group`` on ``conn``: counts as a heartbeat for the
        lease rules, and a renewal over a new connection makes that connection the member's (a reconnect within
        the grace keeps the membership). False when the client is not a member of the group."""
        ginfo = self._consumers.get(group)
        member = ginfo.members.get(client_id) if ginfo is not None else None
        if member is None:
            return False
        member.last_update_ms = self._now_ms()
        if member.conn is not conn and not conn.closed:
            log.info("consumer.reconnected", group=group, client_id=client_id, remote=conn.remote)
            member.conn, member.address = conn, conn.remote
            member.closed_at_ms = None
            conn.attributes["client_id"] = client_id
        return True

    def has_open_connection(self, client_id: str, *, other_than: Connection | None = None) -> bool:
        """True if some consumer registration of ``client_id`` uses an open connection other than ``other_than``."""
        return any(m.conn is not other_than and not m.conn.closed
                   for ginfo in self._consumers.values() for cid, m in ginfo.members.items() if cid == client_id)

    def next_lease_deadline(self) -> int | None:
        """The broker time (ms) at which ``scan_leases`` would remove the first member if nothing changes
        meanwhile (renewals only push it later), None when no member is under the lease rules."""
        if not (self.lease_expiry_ms or self.disconnect_grace_ms):
            return None
        deadlines = []
        for ginfo in self._consumers.values():
            for member in ginfo.members.values():
                if not member.holds_leases:
                    continue
                if member.closed_at_ms is not None:
                    deadlines.append(member.closed_at_ms + self.disconnect_grace_ms + 1)
                if self.lease_expiry_ms:
                    deadlines.append(member.last_update_ms + self.lease_expiry_ms + 1)
        return min(deadlines, default=None)

    def scan_leases(self) -> list[tuple[str, str, str]]:
        """Apply the lease rules to orderly members (module documentation); returns (group, client id, reason)
        for each member removed, reason ``connection_closed`` or ``lease_expired``. Strictly after the limits."""
        if not (self.lease_expiry_ms or self.disconnect_grace_ms):
            return []
        now = self._now_ms()
        removed: list[tuple[str, str, str]] = []
        for group, ginfo in list(self._consumers.items()):
            for cid, member in list(ginfo.members.items()):
                if not member.holds_leases:
                    continue
                if member.closed_at_ms is not None and now - member.closed_at_ms > self.disconnect_grace_ms:
                    reason = "connection_closed"
                elif self.lease_expiry_ms and now - member.last_update_ms > self.lease_expiry_ms:
                    reason = "lease_expired"
                else:
                    continue
                if self._remove_consumer(group, cid, reason=reason):
                    removed.append((group, cid, reason))
                    self.stats["closed" if reason == "connection_closed" else "lease_expired"] += 1
        return removed

    def _remove_consumer(self, group: str, client_id: str, *, reason: str) -> bool:
        ginfo = self._consumers.get(group)
        if ginfo is None or ginfo.members.pop(client_id, None) is None:
            return False
        log.info("consumer.removed", group=group, client_id=client_id, reason=reason, remaining=len(ginfo.members))
        if not ginfo.members:
            del self._consumers[group]
        self._changed(group)
        return True

    def _remove_producer(self, group: str, client_id: str) -> bool:
        pinfo = self._producers.get(group)
        if pinfo is None or pinfo.members.pop(client_id, None) is None:
            return False
        if not pinfo.members:
            del self._producers[group]
        return True

    def _changed(self, group: str) -> None:
        self._dirty.add(group)
        self._check_consistency(group)
        if self._on_dirty is not None:
            self._on_dirty()

    # ------------------------------------------------------------------ notifications

    def take_dirty_groups(self) -> list[str]:
        """The consumer groups changed since the last call (sorted), and forget them."""
        dirty, self._dirty = self._dirty, set()
        return sorted(dirty)

    @property
    def has_dirty(self) -> bool:
        return bool(self._dirty)

    def member_connections(self, group: str) -> list[tuple[str, Connection]]:
        """(client id, connection) of every live member of ``group``, by client id."""
        ginfo = self._consumers.get(group)
        if ginfo is None:
            return []
        return [(cid, m.conn) for cid, m in sorted(ginfo.members.items()) if not m.conn.closed]

    # ------------------------------------------------------------------ queries

    def get_consumer_ids(self, group: str) -> list[str]:
        """Client ids of the group's members, sorted (GET_CONSUMER_LIST_BY_GROUP)."""
        ginfo = self._consumers.get(group)
        return ginfo.client_ids() if ginfo else []

    def find_channel(self, group: str, client_id: str) -> Connection | None:
        """The open connection of member ``client_id`` of consumer group ``group``, or None."""
        ginfo = self._consumers.get(group)
        member = ginfo.members.get(client_id) if ginfo else None
        if member is None or member.conn.closed:
            return None
        return member.conn

    def group_info(self, group: str) -> ConsumerGroupInfo | None:
        """The consumer group's live members, or None when it has none."""
        return self._consumers.get(group)

    def consumer_groups(self) -> list[str]:
        return sorted(self._consumers)

    def producer_groups(self) -> list[str]:
        return sorted(self._producers)

    def producer_info(self, group: str) -> ProducerGroupInfo | None:
        return self._producers.get(group)

    def is_orderly(self, group: str) -> bool:
        """True once any member of ``group`` heartbeated consumeOrderly or the group locked a queue.

        Sticky for the broker's lifetime: a paused orderly consumer whose group has emptied is still fenced.
        """
        return group in self._orderly_groups

    def mark_orderly(self, group: str) -> None:
        """Record that ``group`` consumes orderly (LOCK_BATCH_MQ is only sent by orderly consumers)."""
        self._orderly_groups.add(group)

    def subscribed_topics(self, group: str) -> list[str]:
        """Every topic some member of ``group`` subscribes to, sorted."""
        ginfo = self._consumers.get(group)
        if ginfo is None:
            return []
        return sorted({t for m in ginfo.members.values() for t in m.subscriptions})

    # ------------------------------------------------------------------ subscription consistency

    def subscription_consistency(self, group: str) -> SubscriptionConsistency:
        """Compare the members' subscriptions (an empty or one-member group is consistent)."""
        ginfo = self._consumers.get(group)
        views = {cid: m.subscription_view() for cid, m in ginfo.members.items()} if ginfo else {}
        topics = sorted({t for v in views.values() for t in v})
        bad = tuple(t for t in topics if len({v.get(t) for v in views.values()}) > 1)
        return SubscriptionConsistency(group, not bad, views, bad)

    def inconsistent_groups(self) -> list[SubscriptionConsistency]:
        """The consistency report of every group whose members disagree."""
        reports = (self.subscription_consistency(g) for g in self.consumer_groups())
        return [r for r in reports if not r.consistent]

    def _check_consistency(self, group: str) -> None:
        # Log once per change of the situation, not on every heartbeat: the signature is what was last reported.
        report = self.subscription_consistency(group)
        if report.consistent:
            if self._consistency_reported.pop(group, None) is not None:
                log.info("subscription.consistent", group=group, members=len(report.members))
            return
        signature = tuple(sorted((cid, tuple(v.items())) for cid, v in report.members.items()))
        if self._consistency_reported.get(group) == signature:
            return
        self._consistency_reported[group] = signature
        self.stats["inconsistent_reports"] += 1
        log.warning("subscription.inconsistent", group=group, topics=list(report.inconsistent_topics),
                    members={cid: v for cid, v in sorted(report.members.items())})

