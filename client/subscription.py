"""SubscriptionData: what a consumer subscribed to, as RocketMQ's FilterAPI builds it.

An expression is ``*`` (everything) or tags joined by ``||`` (``"TagA || TagB"``). The broker filters on
the tags' Java hash codes (``code_set``); the client filters again on the exact tags (``tags_set``),
because different tags can share a hash code.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from trimq.client.selectors import java_string_hash
from trimq.protocol.message import MessageExt
from trimq.protocol.validation import check_topic

__all__ = ["SUB_ALL", "SubscriptionData", "build_subscription_data"]

SUB_ALL = "*"


@dataclass
class SubscriptionData:
    """One topic's subscription: expression, parsed tags, their hash codes and a version (ms)."""

    topic: str
    sub_string: str = SUB_ALL
    tags_set: set[str] = field(default_factory=set)
    code_set: set[int] = field(default_factory=set)
    sub_version: int = field(default_factory=lambda: int(time.time() * 1000))

    @property
    def subscribes_all(self) -> bool:
        return self.sub_string == SUB_ALL

    def matches(self, msg: MessageExt) -> bool:
        """Exact client-side filter: everything for ``*``, else the message's tags must be subscribed."""
        if not self.tags_set:
            return True
        return msg.tags is not None and msg.tags in self.tags_set

    def to_wire(self) -> dict[str, Any]:
        """The heartbeat's ``subscriptionDataSet`` entry (docs/PROTOCOL.md, HEART_BEAT)."""
        return {
            "topic": self.topic,
            "subString": self.sub_string,
            "tagsSet": sorted(self.tags_set),
            "codeSet": sorted(self.code_set),
            "subVersion": self.sub_version,
        }


def build_subscription_data(topic: str, sub_expression: str | None) -> SubscriptionData:
    """Parse a tag expression like RocketMQ's FilterAPI.buildSubscriptionData.

    ``None``, ``""`` and ``"*"`` subscribe to everything. Otherwise the expression is split on ``||``,
    each tag trimmed, empty ones skipped. An expression that names no tag at all (``"||"``) raises
    ValueError (RocketMQ would silently match nothing on the broker and everything on the client).
    """
    check_topic(topic)
    if sub_expression is not None and not isinstance(sub_expression, str):
        raise ValueError(f"subscription expression must be a string, got {sub_expression!r}")
    if sub_expression is None or sub_expression.strip() in ("", SUB_ALL):
        return SubscriptionData(topic=topic, sub_string=SUB_ALL)
    tags = [t.strip() for t in sub_expression.split("||")]
    tags = [t for t in tags if t]
    if not tags:
        raise ValueError(f"subscription expression {sub_expression!r} names no tag; use '*' or 'TagA || TagB'")
    return SubscriptionData(
        topic=topic,
        sub_string=sub_expression,
        tags_set=set(tags),
        code_set={java_string_hash(t) for t in tags},
    )
