"""The message model and RocketMQ's property names and property-string codec (ROCKETMQ_FACTS.md §6)."""

from __future__ import annotations

from dataclasses import dataclass, field


class MessageConst:
    """RocketMQ's property names (MessageConst.java)."""

    KEYS = "KEYS"
    TAGS = "TAGS"
    WAIT_STORE_MSG_OK = "WAIT"
    DELAY_TIME_LEVEL = "DELAY"
    RETRY_TOPIC = "RETRY_TOPIC"
    REAL_TOPIC = "REAL_TOPIC"
    REAL_QUEUE_ID = "REAL_QID"
    TRANSACTION_PREPARED = "TRAN_MSG"
    ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
    RECONSUME_TIME = "RECONSUME_TIME"
    MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
    MAX_OFFSET = "MAX_OFFSET"
    MIN_OFFSET = "MIN_OFFSET"
    UNIQ_CLIENT_MESSAGE_ID_KEYIDX = "UNIQ_KEY"
    CONSUME_START_TIME = "CONSUME_START_TIME"
    CLUSTER = "CLUSTER"
    # trimq: when a dead-lettered message was skipped by an operator rather than exhausted.
    SKIPPED_BY = "TRIMQ_SKIPPED_BY"
    # RocketMQ 5's PROPERTY_SHARDING_KEY: the key an orderly key-scope consumer keeps in order (issue 17).
    SHARDING_KEY = "__SHARDINGKEY"


KEY_SEPARATOR = " "
NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
MAX_PROPERTIES_BYTES = 32767


def encode_properties(props: dict[str, str]) -> str:
    """RocketMQ's property string: ``name \\x01 value \\x02`` per entry; None values are skipped."""
    return "".join(
        f"{k}{NAME_VALUE_SEPARATOR}{v}{PROPERTY_SEPARATOR}" for k, v in props.items() if v is not None
    )


def decode_properties(s: str) -> dict[str, str]:
    """Parse a property string. Entries without a name/value separator are ignored, as RocketMQ does."""
    out: dict[str, str] = {}
    if not s:
        return out
    for item in s.split(PROPERTY_SEPARATOR):
        name, sep, value = item.partition(NAME_VALUE_SEPARATOR)
        if sep:
            out[name] = value
    return out


def get_property(props: str, name: str) -> str | None:
    """One property from a RocketMQ property string without parsing the rest (the store's and the index's hot
    paths read one or two names of a record)."""
    key = name + NAME_VALUE_SEPARATOR
    i = props.find(key)
    while i != -1:
        if i == 0 or props[i - 1] == PROPERTY_SEPARATOR:
            start = i + len(key)
            j = props.find(PROPERTY_SEPARATOR, start)
            return props[start:] if j == -1 else props[start:j]
        i = props.find(key, i + 1)
    return None


def check_property_text(name: str, value: str) -> None:
    """Raise ValueError if a property name or value holds one of the reserved separator characters."""
    for text, what in ((name, "name"), (value, "value")):
        if NAME_VALUE_SEPARATOR in text or PROPERTY_SEPARATOR in text:
            raise ValueError(f"property {what} {text!r} contains a reserved separator character (\\x01 or \\x02)")


@dataclass(slots=True)
class Message:
    """A message as a producer builds it."""

    topic: str
    body: bytes
    tags: str | None = None
    keys: str | list[str] | None = None
    flag: int = 0
    properties: dict[str, str] = field(default_factory=dict)
    delay_time_level: int = 0

    def all_properties(self) -> dict[str, str]:
        """Properties as stored: user properties plus TAGS, KEYS and DELAY from the fields."""
        props = dict(self.properties)
        if self.tags:
            props[MessageConst.TAGS] = self.tags
        if self.keys:
            props[MessageConst.KEYS] = (
                self.keys if isinstance(self.keys, str) else KEY_SEPARATOR.join(self.keys)
            )
        if self.delay_time_level > 0:
            props[MessageConst.DELAY_TIME_LEVEL] = str(self.delay_time_level)
        return props


@dataclass(slots=True)
class MessageExt:
    """A stored message as read back from the commit log (RocketMQ's MessageExt)."""

    topic: str
    body: bytes
    flag: int
    properties: dict[str, str]
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    sys_flag: int
    born_timestamp: int
    born_host: tuple[str, int]
    store_timestamp: int
    store_host: tuple[str, int]
    reconsume_times: int
    prepared_transaction_offset: int
    body_crc: int
    store_size: int
    msg_id: str

    @property
    def tags(self) -> str | None:
        """The TAGS property (what subscriptions filter on)."""
        return self.properties.get(MessageConst.TAGS)

    @property
    def keys(self) -> str | None:
        """The KEYS property: the message's keys separated by spaces (indexed for queries)."""
        return self.properties.get(MessageConst.KEYS)

    @property
    def key_list(self) -> list[str]:
        """The KEYS property split into its keys."""
        k = self.keys
        return k.split(KEY_SEPARATOR) if k else []

    @property
    def unique_id(self) -> str:
        """The producer's unique key when it set one, otherwise the store's message id."""
        return self.properties.get(MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX) or self.msg_id

    def get_property(self, name: str) -> str | None:
        """One property's value, None when absent."""
        return self.properties.get(name)
