"""RouteInfoManager: the name server's tables (RocketMQ's RouteInfoManager), a pure core.

No I/O, no trio: callers pass the time (ms) and an opaque ``channel`` key for the connection a broker
registered over, so the service can drop a broker when that connection closes.

Differences from RocketMQ 4.9.3, on purpose: a registration *replaces* the broker's queue data (a topic
the broker no longer has loses that broker's queue data, and a topic nobody serves disappears), where
RocketMQ only adds and keeps stale topics until an explicit delete.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from trimq.protocol.route import MASTER_ID, BrokerData, QueueData, TopicRouteData

__all__ = ["BROKER_CHANNEL_EXPIRED_MS", "BrokerLiveInfo", "NewestMaster", "RouteInfoManager"]

BROKER_CHANNEL_EXPIRED_MS = 120_000


@dataclass(slots=True)
class BrokerLiveInfo:
    last_update_ms: int
    channel: Hashable | None
    cluster: str
    broker_name: str
    broker_id: int
    data_version: Any = None
    #: HA (issue 15): the broker's replication port and the newest master epoch it knows.
    ha_server_addr: str = ""
    master_epoch: int = 0


@dataclass(frozen=True, slots=True)
class NewestMaster:
    """HA: the master of a broker name with the newest master epoch this name server has seen register, kept after
    it goes away (a stale master must not take its place while it is down: see ``superseding_master``)."""

    broker_addr: str
    ha_server_addr: str
    master_epoch: int


class RouteInfoManager:
    """Brokers, clusters and topic routes, with liveness by last registration time."""

    def __init__(self, expire_ms: int = BROKER_CHANNEL_EXPIRED_MS) -> None:
        self.expire_ms = expire_ms
        self.topic_queue_table: dict[str, dict[str, QueueData]] = {}
        self.broker_addr_table: dict[str, BrokerData] = {}
        self.cluster_addr_table: dict[str, set[str]] = {}
        self.broker_live_table: dict[str, BrokerLiveInfo] = {}
        #: HA: per broker name, its newest master (while this name server runs; not dropped with the broker).
        self.newest_master: dict[str, NewestMaster] = {}

    # -- registration -----------------------------------------------------------------------------------
    def register_broker(
        self,
        *,
        cluster: str,
        broker_addr: str,
        broker_name: str,
        broker_id: int,
        topic_config_table: dict[str, dict[str, Any]],
        now_ms: int,
        channel: Hashable | None = None,
        data_version: Any = None,
        ha_server_addr: str = "",
        master_epoch: int = 0,
    ) -> bool:
        """Add or refresh a broker; returns True when it was not registered before.

        ``topic_config_table`` maps topic -> RocketMQ TopicConfig JSON (``readQueueNums``,
        ``writeQueueNums``, ``perm``, ``topicSysFlag``). Only a master (id 0) defines queue data.
        Raises ValueError for a malformed table entry (nothing is changed then).
        """
        queue_datas: dict[str, QueueData] = {}
        for topic, cfg in topic_config_table.items():
            if not isinstance(cfg, dict):
                raise ValueError(f"topic config of {topic!r} is not a map")
            try:
                queue_datas[str(topic)] = QueueData(
                    broker_name,
                    int(cfg.get("readQueueNums", 0)),
                    int(cfg.get("writeQueueNums", 0)),
                    int(cfg.get("perm", 6)),
                    int(cfg.get("topicSysFlag", 0)),
                )
            except (TypeError, ValueError) as exc:
                raise ValueError(f"topic config of {topic!r}: {exc}") from None
        self.cluster_addr_table.setdefault(cluster, set()).add(broker_name)
        bd = self.broker_addr_table.get(broker_name)
        if bd is None:
            bd = self.broker_addr_table[broker_name] = BrokerData(cluster, broker_name)
        # An address registered under another id of this broker name moves (RocketMQ does the same).
        for bid, addr in list(bd.broker_addrs.items()):
            if addr == broker_addr and bid != broker_id:
                del bd.broker_addrs[bid]
        first = bd.broker_addrs.get(broker_id) != broker_addr or broker_addr not in self.broker_live_table
        bd.broker_addrs[broker_id] = broker_addr
        if broker_id == MASTER_ID:
            for topic in list(self.topic_queue_table):
                if topic not in queue_datas:
                    self._remove_queue_data(topic, broker_name)
            for topic, qd in queue_datas.items():
                self.topic_queue_table.setdefault(topic, {})[broker_name] = qd
        self.broker_live_table[broker_addr] = BrokerLiveInfo(now_ms, channel, cluster, broker_name, broker_id,
                                                             data_version, ha_server_addr, master_epoch)
        if broker_id == MASTER_ID:
            newest = self.newest_master.get(broker_name)
            if newest is None or master_epoch >= newest.master_epoch:
                self.newest_master[broker_name] = NewestMaster(broker_addr, ha_server_addr, master_epoch)
        return first

    def superseding_master(self, broker_name: str, broker_addr: str, master_epoch: int) -> NewestMaster | None:
        """HA (issue 15): the master of ``broker_name`` at another address with a newer master epoch than a broker
        at ``broker_addr`` that registers as master with ``master_epoch`` (it was superseded by a promotion: it must
        not take the master's place back, it becomes that master's slave); else None.

        That master need not be live: a promoted master that is down (killed, restarting) still holds messages
        it acknowledged that the stale one never had, so the stale one waits as its slave rather than serve a log
        that would be cut when it returns (an operator who has given it up promotes the waiting slave)."""
        newest = self.newest_master.get(broker_name)
        if newest is None or newest.broker_addr == broker_addr or newest.master_epoch <= master_epoch:
            return None
        return newest

    def master_of(self, broker_name: str) -> tuple[str, BrokerLiveInfo | None]:
        """The master address of ``broker_name`` ("" when none) and what it registered."""
        bd = self.broker_addr_table.get(broker_name)
        addr = bd.broker_addrs.get(MASTER_ID, "") if bd is not None else ""
        return addr, self.broker_live_table.get(addr) if addr else None

    def unregister_broker(self, *, cluster: str, broker_addr: str, broker_name: str, broker_id: int) -> bool:
        """Remove one broker address; returns whether it was registered."""
        live = self.broker_live_table.pop(broker_addr, None)
        bd = self.broker_addr_table.get(broker_name)
        removed = live is not None
        if bd is not None and bd.broker_addrs.get(broker_id) == broker_addr:
            del bd.broker_addrs[broker_id]
            removed = True
        if bd is not None and not bd.broker_addrs:
            del self.broker_addr_table[broker_name]
            names = self.cluster_addr_table.get(cluster)
            if names is not None:
                names.discard(broker_name)
                if not names:
                    del self.cluster_addr_table[cluster]
            for topic in list(self.topic_queue_table):
                self._remove_queue_data(topic, broker_name)
        return removed

    def _remove_queue_data(self, topic: str, broker_name: str) -> None:
        qds = self.topic_queue_table.get(topic)
        if qds is not None:
            qds.pop(broker_name, None)
            if not qds:
                del self.topic_queue_table[topic]

    def on_channel_destroy(self, channel: Hashable) -> list[str]:
        """A connection closed: unregister every broker that registered over it; returns their addresses."""
        gone = [addr for addr, live in self.broker_live_table.items() if live.channel == channel]
        for addr in gone:
            self._drop(addr)
        return gone

    def scan_not_active_broker(self, now_ms: int) -> list[str]:
        """Unregister brokers silent for more than ``expire_ms``; returns their addresses."""
        gone = [a for a, live in self.broker_live_table.items() if now_ms - live.last_update_ms > self.expire_ms]
        for addr in gone:
            self._drop(addr)
        return gone

    def _drop(self, addr: str) -> None:
        live = self.broker_live_table[addr]
        self.unregister_broker(cluster=live.cluster, broker_addr=addr, broker_name=live.broker_name,
                               broker_id=live.broker_id)

    # -- queries ----------------------------------------------------------------------------------------
    def pickup_topic_route_data(self, topic: str) -> TopicRouteData | None:
        """RocketMQ's TopicRouteData for ``topic`` (brokers in name order), or None when no broker serves it."""
        qds = self.topic_queue_table.get(topic)
        if not qds:
            return None
        broker_datas = tuple(self._snapshot(self.broker_addr_table[name]) for name in sorted(qds)
                             if name in self.broker_addr_table)
        if not broker_datas:
            return None
        return TopicRouteData(broker_datas, tuple(qds[name] for name in sorted(qds)))

    @staticmethod
    def _snapshot(bd: BrokerData) -> BrokerData:
        """A copy whose addresses later registrations do not change (the table's own is updated in place)."""
        return BrokerData(bd.cluster, bd.broker_name, dict(bd.broker_addrs))

    def get_all_cluster_info(self) -> dict[str, Any]:
        """RocketMQ's ClusterInfo: ``brokerAddrTable`` and ``clusterAddrTable``."""
        return {
            "brokerAddrTable": {name: bd.to_wire() for name, bd in sorted(self.broker_addr_table.items())},
            "clusterAddrTable": {c: sorted(names) for c, names in sorted(self.cluster_addr_table.items())},
        }

    def get_all_topic_list(self) -> list[str]:
        return sorted(self.topic_queue_table)

    def delete_topic(self, topic: str) -> bool:
        """RocketMQ's deleteTopic: forget the topic's route on every broker; whether it had one. (A broker that
        still hosts it brings it back with its next registration: delete it on the brokers first.)"""
        return self.topic_queue_table.pop(topic, None) is not None
