"""What :class:`trimq.client.admin.Admin` returns: one frozen dataclass per operation, and :func:`to_document`,
the JSON document of a result (the one ``trimq-admin --json`` prints; docs/ADMIN.md lists its fields).

Field names are RocketMQ's in snake_case; the document uses RocketMQ's camelCase wire names
(``broker_name`` -> ``brokerName``). Where a broker or a consumer answers with a structure the admin only
passes on (a consumer's running info, the member's answer to a skip), the result keeps the fields it reads
typed and the rest in a mapping named ``extra`` (or ``info``), documented in docs/PROTOCOL.md.

Pure: no I/O, no trio, no click.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trimq.protocol.message import MessageConst, MessageExt

__all__ = [
    "BrokerAddress",
    "BrokerFailure",
    "BrokerLockInfo",
    "BrokerPromoteResult",
    "ClientFailure",
    "ClusterBroker",
    "ClusterEntry",
    "ClusterList",
    "ConsumerConnection",
    "ConsumerConnections",
    "ConsumerDeleteResult",
    "ConsumerGroupEntry",
    "ConsumerGroupList",
    "ConsumerLocks",
    "ConsumerProgress",
    "ConsumerRunningInfo",
    "ConsumerStatus",
    "DeadLetter",
    "DeadLetterList",
    "MemberReset",
    "MessageQueryResult",
    "QueueLock",
    "QueueProgress",
    "QueueReset",
    "QueueStatus",
    "ResendFailure",
    "ResendResult",
    "Resent",
    "ResetOffsetResult",
    "SkipResult",
    "StoredMessage",
    "TopicBrokerConfig",
    "TopicCreateResult",
    "TopicDeleteResult",
    "TopicEntry",
    "TopicList",
    "TopicStatus",
    "body_text",
    "perm_text",
    "to_document",
]

PERM_READ = 4
PERM_WRITE = 2
PERM_INHERIT = 1


def perm_text(perm: int) -> str:
    """RocketMQ's PermName.perm2String: ``RW-`` for 6, ``R--`` for 4, ``RWX`` for 7."""
    return ("R" if perm & PERM_READ else "-") + ("W" if perm & PERM_WRITE else "-") + \
        ("X" if perm & PERM_INHERIT else "-")


def body_text(body: bytes) -> tuple[str, str]:
    """(text, encoding): the body decoded as UTF-8 when it is valid UTF-8, else its hex and ``"hex"``."""
    try:
        return bytes(body).decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return bytes(body).hex(), "hex"


# --------------------------------------------------------------------------------------------- documents

_KEY = "key"  # field metadata: the document's key when it is not the camelCase of the field name
_OMIT_NONE = "omit_none"  # field metadata: leave the key out when the value is None
_MERGE = "merge"  # field metadata: a mapping whose keys are merged into the document


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _meta(key: str | None = None, *, omit_none: bool = False, merge: bool = False) -> dict[str, Any]:
    return {_KEY: key, _OMIT_NONE: omit_none, _MERGE: merge}


def to_document(value: Any) -> Any:
    """The JSON-ready form of a result: dataclasses become maps with camelCase keys (in field order),
    ``extra`` mappings are merged in, a :class:`StoredMessage` becomes the ``message show`` document."""
    to_doc = getattr(value, "to_document", None)
    if to_doc is not None:
        return to_doc()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            if f.metadata.get(_MERGE):
                out.update({k: to_document(x) for k, x in (v or {}).items() if k not in out})
                continue
            if v is None and f.metadata.get(_OMIT_NONE):
                continue
            out[f.metadata.get(_KEY) or _camel(f.name)] = to_document(v)
        return out
    if isinstance(value, Mapping):
        return {k: to_document(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_document(v) for v in value]
    return value


# --------------------------------------------------------------------------------------------- failures


@dataclass(frozen=True)
class BrokerFailure:
    """A broker that did not answer (or refused) while the rest of the operation went on."""

    broker_name: str
    error: str


@dataclass(frozen=True)
class ClientFailure:
    """A consumer (client id) that did not answer a request forwarded by its broker."""

    client_id: str
    error: str


# --------------------------------------------------------------------------------------------- topics


@dataclass(frozen=True)
class TopicBrokerConfig:
    """A topic's queues and permission on one broker (RocketMQ's TopicConfig)."""

    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int


@dataclass(frozen=True)
class TopicEntry:
    topic: str
    brokers: list[TopicBrokerConfig]


@dataclass(frozen=True)
class TopicList:
    """Every topic the name server routes, with its configuration on each broker."""

    topics: list[TopicEntry]
    errors: list[BrokerFailure] = field(default_factory=list)


@dataclass(frozen=True)
class BrokerAddress:
    broker_name: str
    broker_addr: str


@dataclass(frozen=True)
class TopicCreateResult:
    """A topic created (or updated) on ``brokers``; ``routed``: the name server routes it to all of them."""

    topic: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    brokers: list[BrokerAddress]
    routed: bool = False
    errors: list[BrokerFailure] | None = field(default=None, metadata=_meta(omit_none=True))

    @property
    def total_write_queues(self) -> int:
        """Writable queues over every broker it was created on (what a producer can send to)."""
        return self.write_queue_nums * len(self.brokers)

    def to_document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"topic": self.topic, "readQueueNums": self.read_queue_nums,
                               "writeQueueNums": self.write_queue_nums, "perm": self.perm,
                               "permText": perm_text(self.perm), "brokers": to_document(self.brokers),
                               "routed": self.routed}
        if self.errors is not None:
            doc["errors"] = to_document(self.errors)
        return doc


@dataclass(frozen=True)
class QueueStatus:
    """One queue of a topic (RocketMQ's TopicOffset): offsets still stored and the last store time."""

    broker_name: str
    queue_id: int
    min_offset: int
    max_offset: int
    messages: int
    last_update_timestamp: int


@dataclass(frozen=True)
class TopicStatus:
    topic: str
    queues: list[QueueStatus]
    total_messages: int
    errors: list[BrokerFailure] = field(default_factory=list)


# --------------------------------------------------------------------------------------------- cluster


@dataclass(frozen=True)
class ClusterBroker:
    """One broker address as the name server knows it (id 0: the master)."""

    broker_name: str
    broker_id: int
    broker_addr: str
    last_update_timestamp: int | None
    age_ms: int | None
    topic_count: int
    topics: list[str]
    #: HA (issue 15), from the broker's runtime info: ASYNC_MASTER / SYNC_MASTER / SLAVE (None: it did not answer)
    role: str | None = None
    master_epoch: int | None = None
    #: A master: how far its best slave is behind (bytes, seconds) and how many slaves follow it.
    lag_bytes: int | None = None
    lag_seconds: float | None = None
    slaves: int | None = None
    #: A slave: whether it is connected to its master now.
    master_connected: bool | None = None
    error: str | None = None
    #: A slave: ms since its consumer offsets were last merged with its master's (what a promotion would serve).
    offsets_sync_age_ms: int | None = None


@dataclass(frozen=True)
class BrokerPromoteResult:
    """A slave promoted to the master of its broker name (``trimq-admin broker promote``, PROMOTE_BROKER)."""

    broker_name: str
    broker_addr: str
    broker_role: str
    master_epoch: int
    broker_epoch: int
    max_offset: int


@dataclass(frozen=True)
class ClusterEntry:
    cluster: str
    brokers: list[ClusterBroker]


@dataclass(frozen=True)
class ClusterList:
    clusters: list[ClusterEntry]


# --------------------------------------------------------------------------------------------- consumer groups


@dataclass(frozen=True)
class ConsumerConnection:
    """A live member of a group (RocketMQ's Connection), as one broker sees it."""

    client_id: str
    client_addr: str | None = None
    language: str | None = None
    version: Any = None
    last_update_timestamp: int | None = None
    extra: dict[str, Any] = field(default_factory=dict, metadata=_meta(merge=True))


@dataclass(frozen=True)
class ConsumerConnections:
    """GET_CONSUMER_CONNECTION_LIST of the first broker the group is on (RocketMQ's ConsumerConnection)."""

    broker_name: str
    consumer_group: str
    connection_set: list[ConsumerConnection]
    subscription_table: dict[str, dict[str, Any]]
    consume_type: str | None = None
    message_model: str | None = None
    consume_from_where: str | None = None
    consume_orderly: bool = False
    consistent: bool = True
    extra: dict[str, Any] = field(default_factory=dict, metadata=_meta(merge=True))


@dataclass(frozen=True)
class QueueProgress:
    """One queue of RocketMQ's consumerProgress: broker offset, consumer offset (-1: none), lag, owner."""

    topic: str
    broker_name: str
    queue_id: int
    broker_offset: int
    consumer_offset: int
    lag: int
    owner: str | None
    last_timestamp: int
    last_update_timestamp: int


@dataclass(frozen=True)
class ConsumerProgress:
    consumer_group: str
    topic: str | None
    orderly: bool
    online: bool
    total_lag: int
    queues: list[QueueProgress]
    errors: list[BrokerFailure] = field(default_factory=list)


@dataclass(frozen=True)
class QueueLock:
    """A broker's queue lock of the group (RocketMQ's LockEntry)."""

    topic: str
    broker_name: str
    queue_id: int
    client_id: str | None
    last_update_timestamp: int | None
    age_ms: int | None
    expired: bool


@dataclass(frozen=True)
class BrokerLockInfo:
    broker_name: str
    max_live_ms: int | None
    fenced_updates: int
    stats: dict[str, int]


@dataclass(frozen=True)
class ConsumerLocks:
    consumer_group: str
    locks: list[QueueLock]
    fenced_updates: int
    brokers: list[BrokerLockInfo]
    errors: list[BrokerFailure] = field(default_factory=list)


@dataclass(frozen=True)
class ConsumerRunningInfo:
    """A member's running info (RocketMQ's ConsumerRunningInfo), fetched through its broker. ``info`` is the
    map the member sent (docs/PROTOCOL.md, code 307); the properties read the parts tools look at."""

    client_id: str
    info: dict[str, Any] = field(default_factory=dict, metadata=_meta(merge=True))

    @property
    def consume_orderly(self) -> bool:
        return bool(self.info.get("consumeOrderly"))

    @property
    def running(self) -> bool:
        return bool(self.info.get("running"))

    @property
    def mq_table(self) -> list[dict[str, Any]]:
        """[{``mq``, ``processQueueInfo``}] of the queues the member holds."""
        return list(self.info.get("mqTable") or [])

    @property
    def blocked_queues(self) -> list[dict[str, Any]]:
        """Orderly queues retrying one message: [{``mq``, ``offset``, ``msgId``, ``attempts``, ``blockedMs``}]."""
        return list(self.info.get("blockedQueues") or [])


@dataclass(frozen=True)
class ConsumerStatus:
    consumer_group: str
    broker_name: str
    clients: list[ConsumerRunningInfo]
    errors: list[ClientFailure] = field(default_factory=list)


@dataclass(frozen=True)
class QueueReset:
    broker_name: str
    queue_id: int
    previous_offset: int | None
    offset: int | None


@dataclass(frozen=True)
class MemberReset:
    """A live member told of a reset: ``ok`` when it applied it; ``queues`` it restarted."""

    broker_name: str
    client_id: str | None
    ok: bool
    remark: str | None
    queues: int


@dataclass(frozen=True)
class ResetOffsetResult:
    """RocketMQ's resetOffsetByTime of a group on one topic. ``dry_run``: the plan only (each queue's current
    and new offset), nothing was changed or told; ``reset_generations``: per broker, the reset generation the
    reset started (docs/ADMIN.md)."""

    consumer_group: str
    topic: str
    timestamp: int
    is_force: bool
    online: bool
    queues: list[QueueReset]
    clients: list[MemberReset]
    errors: list[BrokerFailure] = field(default_factory=list)
    dry_run: bool = False
    reset_generations: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class SkipResult:
    """A message dead-lettered by the member holding its queue (SKIP_MESSAGE, docs/PROTOCOL.md code 9004);
    ``extra`` holds the member's answer (``mq``, ``msgId``, ``queueOffset``, ``nextOffset``, ...)."""

    broker_name: str
    dead_letter_topic: str
    extra: dict[str, Any] = field(default_factory=dict, metadata=_meta(merge=True))

    @property
    def client_id(self) -> str | None:
        return self.extra.get("clientId")

    @property
    def next_offset(self) -> int | None:
        """The offset the queue now continues at (None when later messages were already cached)."""
        return self.extra.get("nextOffset")


# --------------------------------------------------------------------------------------------- dead letters


@dataclass(frozen=True)
class DeadLetter:
    """One message of ``%DLQ%group`` (QUERY_DLQ_MESSAGES, docs/PROTOCOL.md code 9002). ``body`` only when
    asked for; ``extra`` keeps any other field the broker sent."""

    broker_name: str
    msg_id: str | None = None
    origin_msg_id: str | None = None
    origin_topic: str | None = None
    uniq_key: str | None = None
    keys: str | None = None
    tags: str | None = None
    reconsume_times: int | None = None
    store_timestamp: int | None = None
    born_timestamp: int | None = None
    queue_offset: int | None = None
    commit_log_offset: int | None = None
    body_size: int | None = None
    skipped_by: str | None = None
    resent: bool = False
    body: bytes | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    _FIELDS = ("msgId", "originMsgId", "originTopic", "uniqKey", "keys", "tags", "reconsumeTimes", "storeTimestamp",
               "bornTimestamp", "queueOffset", "commitLogOffset", "bodySize", "skippedBy", "resent")

    @classmethod
    def from_wire(cls, broker_name: str, m: Mapping[str, Any]) -> DeadLetter:
        known = {f.name: m[_camel(f.name)] for f in dataclasses.fields(cls)
                 if f.name not in ("broker_name", "extra") and _camel(f.name) in m}
        body = known.get("body")
        known["body"] = bytes(body) if isinstance(body, bytes | bytearray) else None
        known["resent"] = bool(known.get("resent"))
        extra = {k: v for k, v in m.items() if k not in cls._FIELDS and k != "body"}
        return cls(broker_name=broker_name, extra=extra, **known)

    def to_document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"brokerName": self.broker_name}
        for f in dataclasses.fields(self):
            if f.name not in ("broker_name", "body", "extra"):
                doc[_camel(f.name)] = getattr(self, f.name)
        doc.update({k: v for k, v in self.extra.items() if k not in doc})
        if self.body is not None:
            doc["body"], doc["bodyEncoding"] = body_text(self.body)
        return doc


@dataclass(frozen=True)
class DeadLetterList:
    consumer_group: str
    topic: str
    messages: list[DeadLetter]
    truncated: bool
    errors: list[BrokerFailure] = field(default_factory=list)


@dataclass(frozen=True)
class Resent:
    """A dead letter sent back to its topic: the dead letter's id and the new message's place and id."""

    broker_name: str
    dlq_msg_id: str | None
    queue_offset: int | None
    topic: str | None
    queue_id: int | None
    msg_id: str | None


@dataclass(frozen=True)
class ResendFailure:
    broker_name: str
    msg_id: str | None
    queue_offset: int | None
    error: str | None


@dataclass(frozen=True)
class ResendResult:
    consumer_group: str
    resent: list[Resent]
    resent_count: int
    skipped: int
    failed: list[ResendFailure]
    errors: list[BrokerFailure] = field(default_factory=list)


# --------------------------------------------------------------------------------------------- messages


@dataclass(frozen=True)
class StoredMessage:
    """One stored message, as ``message show`` finds it (by offset id or by queue position)."""

    broker_name: str | None
    message: MessageExt

    def to_document(self) -> dict[str, Any]:
        msg = self.message
        text, encoding = body_text(msg.body)
        props = dict(sorted(msg.properties.items()))
        return {
            "brokerName": self.broker_name,
            "msgId": msg.msg_id,
            "uniqKey": props.get(MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX),
            "topic": msg.topic,
            "queueId": msg.queue_id,
            "queueOffset": msg.queue_offset,
            "commitLogOffset": msg.commit_log_offset,
            "tags": msg.tags,
            "keys": msg.keys,
            "bornTimestamp": msg.born_timestamp,
            "bornHost": f"{msg.born_host[0]}:{msg.born_host[1]}",
            "storeTimestamp": msg.store_timestamp,
            "storeHost": f"{msg.store_host[0]}:{msg.store_host[1]}",
            "reconsumeTimes": msg.reconsume_times,
            "flag": msg.flag,
            "sysFlag": msg.sys_flag,
            "storeSize": msg.store_size,
            "bodyCRC": msg.body_crc,
            "properties": props,
            "bodySize": len(msg.body),
            "bodyEncoding": encoding,
            "body": text,
        }


@dataclass(frozen=True)
class MessageQueryResult:
    """Messages found by key (``message query``, QUERY_MESSAGE on every broker asked), oldest first.
    ``unique_key``: ``key`` is a producer's unique key (UNIQ_KEY) rather than one of the messages' KEYS."""

    key: str
    topic: str | None
    unique_key: bool
    messages: list[StoredMessage]
    errors: list[BrokerFailure] = field(default_factory=list)


@dataclass(frozen=True)
class TopicDeleteResult:
    """A topic deleted on ``brokers`` (DELETE_TOPIC_IN_BROKER) and forgotten by ``namesrvs``
    (DELETE_TOPIC_IN_NAMESRV), RocketMQ's mqadmin deleteTopic."""

    topic: str
    brokers: list[BrokerAddress]
    namesrvs: list[str]
    errors: list[BrokerFailure] = field(default_factory=list)


@dataclass(frozen=True)
class ConsumerGroupEntry:
    """One consumer group of ``consumer list``: its live members (over every broker), how it consumes, its lag."""

    consumer_group: str
    members: int
    consume_mode: str | None  # "orderly" / "concurrently" (None: offline and no stored offset says)
    message_model: str | None
    consume_type: str | None
    total_lag: int
    brokers: list[str]


@dataclass(frozen=True)
class ConsumerGroupList:
    """Every consumer group the brokers know (their subscription-group configs), as kafka-consumer-groups
    --list and mqadmin consumerProgress without a group show them."""

    groups: list[ConsumerGroupEntry]
    errors: list[BrokerFailure] = field(default_factory=list)


@dataclass(frozen=True)
class ConsumerDeleteResult:
    """A group's config deleted on ``brokers`` (DELETE_SUBSCRIPTIONGROUP), its offsets with it unless kept;
    ``members`` online when it was deleted (only with force)."""

    consumer_group: str
    brokers: list[str]
    offsets_removed: bool
    members: list[str]
    errors: list[BrokerFailure] = field(default_factory=list)

