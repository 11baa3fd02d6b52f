"""Topic routes, the one model the name server answers with and the client reads (RocketMQ's TopicRouteData,
BrokerData and QueueData in rocketmq-remoting's ``protocol.route``), with their wire form. Pure: no I/O.

Wire form (GET_ROUTEINFO_BY_TOPIC's body, docs/PROTOCOL.md): ``{"brokerDatas": [{"cluster", "brokerName",
"brokerAddrs": {"<brokerId>": "host:port"}}], "queueDatas": [{"brokerName", "readQueueNums",
"writeQueueNums", "perm", "topicSysFlag"}], "filterServerTable": {}}``. ``from_wire`` raises ValueError
naming the field that is malformed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trimq.protocol.message_queue import MessageQueue

__all__ = ["MASTER_ID", "PERM_INHERIT", "PERM_PRIORITY", "PERM_READ", "PERM_WRITE", "BrokerData", "QueueData",
           "TopicRouteData"]

#: RocketMQ's PermName bits.
PERM_PRIORITY = 0x8
PERM_READ = 0x4
PERM_WRITE = 0x2
PERM_INHERIT = 0x1
#: RocketMQ's MixAll.MASTER_ID: the broker id of a master.
MASTER_ID = 0


def _map(v: Any, name: str) -> Mapping[Any, Any]:
    if not isinstance(v, dict):
        raise ValueError(f"{name} must be a map, got {type(v).__name__}")
    return v


def _int(m: Mapping[str, Any], key: str, default: int | None = None) -> int:
    v = m.get(key, default)
    if isinstance(v, str):  # RocketMQ's JSON clients may send numbers as strings
        try:
            return int(v)
        except ValueError:
            pass
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"field {key!r} must be an integer, got {v!r}")
    return v


def _name(m: Mapping[str, Any], what: str) -> str:
    name = m.get("brokerName")
    if not isinstance(name, str):
        raise ValueError(f"{what} brokerName must be a string, got {name!r}")
    return name


@dataclass(frozen=True, slots=True)
class QueueData:
    """How many queues one broker (by name) has of a topic, and its permission bits."""

    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int = PERM_READ | PERM_WRITE
    topic_sys_flag: int = 0

    @property
    def readable(self) -> bool:
        return bool(self.perm & PERM_READ)

    @property
    def writeable(self) -> bool:
        return bool(self.perm & PERM_WRITE)

    def to_wire(self) -> dict[str, Any]:
        return {"brokerName": self.broker_name, "readQueueNums": self.read_queue_nums,
                "writeQueueNums": self.write_queue_nums, "perm": self.perm, "topicSysFlag": self.topic_sys_flag}

    @classmethod
    def from_wire(cls, v: Any) -> QueueData:
        m = _map(v, "queueData")
        return cls(_name(m, "queueData"), _int(m, "readQueueNums"), _int(m, "writeQueueNums"),
                   _int(m, "perm", PERM_READ | PERM_WRITE), _int(m, "topicSysFlag", 0))


@dataclass(frozen=True, slots=True)
class BrokerData:
    """The addresses of one broker name: broker id -> ``host:port`` (id 0 is the master)."""

    cluster: str
    broker_name: str
    broker_addrs: dict[int, str] = field(default_factory=dict)

    @property
    def master_addr(self) -> str | None:
        return self.broker_addrs.get(MASTER_ID)

    def select_broker_addr(self) -> str | None:
        """The master, else any address (RocketMQ's selectBrokerAddr)."""
        return self.master_addr or next(iter(self.broker_addrs.values()), None)

    def to_wire(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "brokerName": self.broker_name,
                "brokerAddrs": {str(k): v for k, v in sorted(self.broker_addrs.items())}}

    @classmethod
    def from_wire(cls, v: Any) -> BrokerData:
        m = _map(v, "brokerData")
        addrs: dict[int, str] = {}
        for k, a in _map(m.get("brokerAddrs", {}), "brokerAddrs").items():
            try:
                addrs[int(k)] = str(a)
            except (TypeError, ValueError):
                raise ValueError(f"broker id {k!r} is not an integer") from None
        return cls(str(m.get("cluster", "")), _name(m, "brokerData"), addrs)


@dataclass(frozen=True, slots=True)
class TopicRouteData:
    """A topic's route from the name server: which brokers host it and with how many queues."""

    broker_datas: tuple[BrokerData, ...]
    queue_datas: tuple[QueueData, ...]

    def publish_queues(self, topic: str) -> list[MessageQueue]:
        """Writable queues, brokers in name order (RocketMQ's topicRouteData2TopicPublishInfo)."""
        masters = {bd.broker_name for bd in self.broker_datas if bd.master_addr}
        out: list[MessageQueue] = []
        for qd in sorted(self.queue_datas, key=lambda q: q.broker_name):
            if qd.writeable and qd.broker_name in masters:
                out.extend(MessageQueue(topic, qd.broker_name, i) for i in range(qd.write_queue_nums))
        return out

    def subscribe_queues(self, topic: str) -> set[MessageQueue]:
        """Readable queues (RocketMQ's topicRouteData2TopicSubscribeInfo)."""
        return {
            MessageQueue(topic, qd.broker_name, i)
            for qd in self.queue_datas
            if qd.readable
            for i in range(qd.read_queue_nums)
        }

    def to_wire(self) -> dict[str, Any]:
        return {"brokerDatas": [bd.to_wire() for bd in self.broker_datas],
                "queueDatas": [qd.to_wire() for qd in self.queue_datas], "filterServerTable": {}}

    @classmethod
    def from_wire(cls, body: Any) -> TopicRouteData:
        m = _map(body, "body")
        return cls(tuple(BrokerData.from_wire(b) for b in m.get("brokerDatas") or []),
                   tuple(QueueData.from_wire(q) for q in m.get("queueDatas") or []))
