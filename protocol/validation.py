"""Name rules shared by broker and client (RocketMQ's TopicValidator / Validators)."""

from __future__ import annotations

import re

TOPIC_MAX_LENGTH = 127
GROUP_MAX_LENGTH = 255
_VALID_CHARS = re.compile(r"^[%|a-zA-Z0-9_-]+$")

RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
DEFAULT_TOPIC = "TBW102"
SYSTEM_TOPICS = frozenset({SCHEDULE_TOPIC, DEFAULT_TOPIC})


class InvalidNameError(ValueError):
    """A topic or group name breaks RocketMQ's naming rules."""


def check_topic(topic: object) -> str:
    """Return ``topic`` if it is a valid topic name, else raise InvalidNameError saying why."""
    if not isinstance(topic, str) or not topic.strip():
        raise InvalidNameError("topic name is empty")
    if len(topic) > TOPIC_MAX_LENGTH:
        raise InvalidNameError(f"topic name is {len(topic)} characters; the maximum is {TOPIC_MAX_LENGTH}")
    if not _VALID_CHARS.match(topic):
        raise InvalidNameError(
            f"topic name {topic!r} contains illegal characters; allowed are letters, digits, '%', '|', '_' and '-'"
        )
    return topic


def check_group(group: object) -> str:
    """Return ``group`` if it is a valid consumer/producer group name, else raise InvalidNameError."""
    if not isinstance(group, str) or not group.strip():
        raise InvalidNameError("group name is empty")
    if len(group) > GROUP_MAX_LENGTH:
        raise InvalidNameError(f"group name is {len(group)} characters; the maximum is {GROUP_MAX_LENGTH}")
    if not _VALID_CHARS.match(group):
        raise InvalidNameError(
            f"group name {group!r} contains illegal characters; allowed are letters, digits, '%', '|', '_' and '-'"
        )
    return group


def retry_topic(group: str) -> str:
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_GROUP_TOPIC_PREFIX + group


def is_retry_topic(topic: str) -> bool:
    return topic.startswith(RETRY_GROUP_TOPIC_PREFIX)


def is_dlq_topic(topic: str) -> bool:
    return topic.startswith(DLQ_GROUP_TOPIC_PREFIX)
