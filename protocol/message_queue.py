"""MessageQueue: one queue of a topic on one broker, RocketMQ's identity for everything per-queue."""

from __future__ import annotations

from dataclasses import dataclass
from functools import total_ordering
from typing import Any


def java_string_key(s: str) -> bytes:
    """Sort key equal to Java's String.compareTo (UTF-16 code units, lexicographic)."""
    return s.encode("utf-16-be", "surrogatepass")


@total_ordering
@dataclass(frozen=True, slots=True, eq=True)
class MessageQueue:
    """``MessageQueue(topic, broker_name, queue_id)``: hashable, frozen, ordered like RocketMQ's.

    Order is topic, then broker name (both as Java compares strings), then queue id; ``str()`` is
    RocketMQ's ``MessageQueue [topic=T, brokerName=B, queueId=N]``.
    """

    topic: str
    broker_name: str
    queue_id: int

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, MessageQueue):
            return NotImplemented
        return self.sort_key() < other.sort_key()

    def sort_key(self) -> tuple[bytes, bytes, int]:
        """Java's MessageQueue.compareTo order (topic, broker name, queue id; strings by UTF-16 code units)."""
        return (java_string_key(self.topic), java_string_key(self.broker_name), self.queue_id)

    def __str__(self) -> str:
        return f"MessageQueue [topic={self.topic}, brokerName={self.broker_name}, queueId={self.queue_id}]"

    __repr__ = __str__

    def to_wire(self) -> dict[str, Any]:
        """The map form used in frame bodies (RocketMQ's JSON field names)."""
        return {"topic": self.topic, "brokerName": self.broker_name, "queueId": self.queue_id}

    @classmethod
    def from_wire(cls, m: Any) -> MessageQueue:
        """Parse the map form; raises ValueError naming what is wrong."""
        if not isinstance(m, dict):
            raise ValueError(f"a message queue must be a map, got {type(m).__name__}")
        topic, broker, qid = m.get("topic"), m.get("brokerName"), m.get("queueId")
        if not isinstance(topic, str) or not isinstance(broker, str) or type(qid) is not int:
            raise ValueError(f"a message queue needs topic (str), brokerName (str), queueId (int): {m!r}")
        return cls(topic, broker, qid)
