"""The name server: RouteInfoManager behind REGISTER_BROKER, UNREGISTER_BROKER, GET_ROUTEINFO_BY_TOPIC,
GET_BROKER_CLUSTER_INFO and GET_ALL_TOPIC_LIST_FROM_NAMESERVER.

``NameServer`` registers its handlers on any RemotingServer: its own (``open_namesrv``, the
``trimq-namesrv`` daemon) or a broker's (``--embedded-namesrv``: ``NamesrvService``, same port). A broker is
dropped after ``broker_channel_expired_ms`` (120 s) without a registration, or at once when the connection
it registered over closes. Liveness uses the trio clock, so tests can run it under MockClock.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

from trimq.namesrv.config import NamesrvConfig
from trimq.namesrv.metrics import NamesrvMetrics
from trimq.namesrv.routes import BROKER_CHANNEL_EXPIRED_MS, RouteInfoManager
from trimq.protocol.address import parse_address
from trimq.protocol.codes import RequestCode, ResponseCode
from trimq.protocol.command import RemotingCommand
from trimq.protocol.errors import RequestError
from trimq.runtime.daemon import open_listeners, run_services
from trimq.runtime.logs import get_logger
from trimq.runtime.server import Connection, RemotingServer
from trimq.runtime.tls import server_ssl_context

log = get_logger("trimq.namesrv")

__all__ = ["NameServer", "NamesrvService", "open_namesrv", "serve_namesrv"]


def _now_ms() -> int:
    return int(trio.current_time() * 1000)


class NameServer:
    """Route tables plus the request handlers, attached to ``server``."""

    def __init__(self, server: RemotingServer, *, expire_ms: int = BROKER_CHANNEL_EXPIRED_MS,
                 scan_interval_ms: int = 10_000) -> None:
        self.server = server
        self.routes = RouteInfoManager(expire_ms)
        self.scan_interval_ms = scan_interval_ms
        self.metrics: NamesrvMetrics | None = None  # a standalone name server with metrics_port set
        reg = server.register
        reg(RequestCode.REGISTER_BROKER, self.register_broker)
        reg(RequestCode.UNREGISTER_BROKER, self.unregister_broker)
        reg(RequestCode.GET_ROUTEINFO_BY_TOPIC, self.get_routeinfo_by_topic)
        reg(RequestCode.GET_BROKER_CLUSTER_INFO, self.get_broker_cluster_info)
        reg(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, self.get_all_topic_list)
        reg(RequestCode.DELETE_TOPIC_IN_NAMESRV, self.delete_topic_in_namesrv)
        server.on_connection_closed(self._on_connection_closed)

    @property
    def address(self) -> str:
        return self.server.address

    async def run_scanner(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Drop brokers that stopped registering (every ``scan_interval_ms``)."""
        task_status.started()
        while True:
            await trio.sleep(self.scan_interval_ms / 1000)
            for addr in self.routes.scan_not_active_broker(_now_ms()):
                log.warning("namesrv.broker_expired", broker_addr=addr, after_ms=self.routes.expire_ms)

    def _on_connection_closed(self, conn: Connection) -> None:
        for addr in self.routes.on_channel_destroy(conn.id):
            log.info("namesrv.broker_disconnected", broker_addr=addr)

    # -- in-process use (embedded name server) -------------------------------------------------------------
    def register_local(self, *, cluster: str, broker_addr: str, broker_name: str, broker_id: int,
                       topic_config_table: dict[str, dict[str, Any]], data_version: Any = None) -> None:
        """Register a broker of this process directly (no connection: only expiry can drop it)."""
        first = self.routes.register_broker(
            cluster=cluster, broker_addr=broker_addr, broker_name=broker_name, broker_id=broker_id,
            topic_config_table=topic_config_table, now_ms=_now_ms(), channel=None, data_version=data_version,
        )
        if first:
            log.info("namesrv.broker_registered", broker_addr=broker_addr, broker_name=broker_name,
                     cluster=cluster, topics=len(topic_config_table), embedded=True)

    def unregister_local(self, *, cluster: str, broker_addr: str, broker_name: str, broker_id: int) -> None:
        """Drop a broker of this process at once (it is draining)."""
        if self.routes.unregister_broker(cluster=cluster, broker_addr=broker_addr, broker_name=broker_name,
                                         broker_id=broker_id):
            log.info("namesrv.broker_unregistered", broker_addr=broker_addr, broker_name=broker_name,
                     cluster=cluster, embedded=True)

    # -- handlers -------------------------------------------------------------------------------------------
    @staticmethod
    def _broker_fields(ext: dict[str, Any]) -> tuple[str, str, str, int]:
        out = []
        for name in ("brokerAddr", "brokerName", "clusterName"):
            v = ext.get(name)
            if not isinstance(v, str) or not v:
                raise RequestError(ResponseCode.SYSTEM_ERROR, f"header field {name!r} must be a non-empty string")
            out.append(v)
        bid = ext.get("brokerId", 0)
        if isinstance(bid, str) and bid.lstrip("-").isdigit():
            bid = int(bid)
        if type(bid) is not int:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"header field 'brokerId' must be an integer, got {bid!r}")
        try:
            parse_address(out[0])
        except ValueError as exc:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"header field 'brokerAddr': {exc}") from None
        return out[0], out[1], out[2], bid

    async def register_broker(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        addr, name, cluster, bid = self._broker_fields(cmd.ext)
        body = cmd.body if cmd.body is not None else {}
        if not isinstance(body, dict):
            raise RequestError(ResponseCode.SYSTEM_ERROR, "REGISTER_BROKER body must be a map")
        table = body.get("topicConfigTable", {})
        if not isinstance(table, dict):
            raise RequestError(ResponseCode.SYSTEM_ERROR, "topicConfigTable must be a map")
        ha_addr = cmd.ext.get("haServerAddr")
        ha_addr = ha_addr if isinstance(ha_addr, str) else ""
        epoch = cmd.ext.get("masterEpoch", 0)
        epoch = epoch if type(epoch) is int else 0
        newer = self.routes.superseding_master(name, addr, epoch) if bid == 0 else None
        if newer is not None:
            # HA (issue 15): a master superseded by a promotion comes back; it is told who the master is (it
            # becomes its slave and registers again as one) and does not take the route back.
            log.warning("namesrv.superseded_master", broker_addr=addr, broker_name=name, master_epoch=epoch,
                        master=newer.broker_addr, newer_master_epoch=newer.master_epoch,
                        newer_master_live=newer.broker_addr in self.routes.broker_live_table)
            return RemotingCommand.response_to(cmd, ext={"masterAddr": newer.broker_addr,
                                                         "haServerAddr": newer.ha_server_addr,
                                                         "masterEpoch": newer.master_epoch})
        try:
            first = self.routes.register_broker(
                cluster=cluster, broker_addr=addr, broker_name=name, broker_id=bid, topic_config_table=table,
                now_ms=_now_ms(), channel=conn.id, data_version=body.get("dataVersion"), ha_server_addr=ha_addr,
                master_epoch=epoch,
            )
        except ValueError as exc:
            raise RequestError(ResponseCode.SYSTEM_ERROR, str(exc)) from None
        if first:
            log.info("namesrv.broker_registered", broker_addr=addr, broker_name=name, cluster=cluster,
                     broker_id=bid, topics=len(table), remote=conn.remote)
        master, live = self.routes.master_of(name)
        newest = self.routes.newest_master.get(name)
        # with no live master, the newest epoch still tells a slave what a promotion must go above
        epoch = live.master_epoch if live is not None else newest.master_epoch if newest is not None else 0
        return RemotingCommand.response_to(cmd, ext={
            "masterAddr": master, "haServerAddr": live.ha_server_addr if live is not None else "",
            "masterEpoch": epoch})

    async def unregister_broker(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        addr, name, cluster, bid = self._broker_fields(cmd.ext)
        if self.routes.unregister_broker(cluster=cluster, broker_addr=addr, broker_name=name, broker_id=bid):
            log.info("namesrv.broker_unregistered", broker_addr=addr, broker_name=name, cluster=cluster)
        return RemotingCommand.response_to(cmd)

    async def get_routeinfo_by_topic(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        topic = cmd.ext.get("topic")
        if not isinstance(topic, str):
            raise RequestError(ResponseCode.SYSTEM_ERROR, "header field 'topic' must be a string")
        route = self.routes.pickup_topic_route_data(topic)
        if route is None:
            raise RequestError(ResponseCode.TOPIC_NOT_EXIST,
                               f"No topic route info in name server for the topic: {topic}")
        return RemotingCommand.response_to(cmd, body=route.to_wire())

    async def get_broker_cluster_info(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        body = self.routes.get_all_cluster_info()
        body.update(self._cluster_info_extension())
        return RemotingCommand.response_to(cmd, body=body)

    def _cluster_info_extension(self) -> dict[str, Any]:
        """trimq's additions to ClusterInfo (``trimq-admin cluster list``): per broker address when it last
        registered (wall clock, from the registration's age on the trio clock) and per broker name its topics."""
        import time

        now, wall = _now_ms(), time.time_ns() // 1_000_000
        live = {
            addr: {"cluster": info.cluster, "brokerName": info.broker_name, "brokerId": info.broker_id,
                   "lastUpdateTimestamp": wall - (now - info.last_update_ms), "ageMs": now - info.last_update_ms,
                   "embedded": info.channel is None, "haServerAddr": info.ha_server_addr,
                   "masterEpoch": info.master_epoch}
            for addr, info in sorted(self.routes.broker_live_table.items())
        }
        topics: dict[str, list[str]] = {}
        for topic, qds in sorted(self.routes.topic_queue_table.items()):
            for name in qds:
                topics.setdefault(name, []).append(topic)
        return {"brokerLiveTable": live, "brokerTopicTable": topics}

    async def get_all_topic_list(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        return RemotingCommand.response_to(cmd, body={"topicList": self.routes.get_all_topic_list()})

    async def delete_topic_in_namesrv(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """DELETE_TOPIC_IN_NAMESRV (216): ext ``topic``; SUCCESS whether or not it had a route (RocketMQ's)."""
        topic = cmd.ext.get("topic")
        if not isinstance(topic, str) or not topic:
            raise RequestError(ResponseCode.SYSTEM_ERROR, "header field 'topic' must be a non-empty string")
        if self.routes.delete_topic(topic):
            log.info("namesrv.topic_deleted", topic=topic, remote=conn.remote)
        return RemotingCommand.response_to(cmd)


@asynccontextmanager
async def open_namesrv(listen: str = "127.0.0.1:0", *, config: NamesrvConfig | None = None
                       ) -> AsyncIterator[NameServer]:
    """Run a standalone name server for the duration of the block: ``async with open_namesrv(addr) as ns``."""
    cfg = config or NamesrvConfig(listen=listen)
    async with trio.open_nursery() as nursery:
        ns: NameServer = await nursery.start(serve_namesrv, cfg)
        try:
            yield ns
        finally:
            ns.server.shutdown()


async def serve_namesrv(config: NamesrvConfig, *,
                        task_status: trio.TaskStatus[NameServer] = trio.TASK_STATUS_IGNORED) -> None:
    """Run a name server until ``ns.server.shutdown()`` (then drain, bounded by ``shutdown_grace_ms``)."""
    config.validate()
    server = RemotingServer(name="namesrv", max_frame_bytes=config.max_frame_bytes,
                            max_connections=config.max_connections, shutdown_grace_s=config.shutdown_grace_ms / 1000)
    ns = NameServer(server, expire_ms=config.broker_channel_expired_ms,
                    scan_interval_ms=config.scan_not_active_broker_interval_ms)
    if config.metrics_port >= 0:  # 0: any free port
        ns.metrics = NamesrvMetrics(ns.routes, server, config.metrics_host, config.metrics_port)
    ssl_context = None
    if config.tls_cert_file:
        ssl_context = server_ssl_context(config.tls_cert_file, config.tls_key_file or None, config.tls_ca_file or None,
                                         require_client_cert=config.tls_require_client_cert)
    listeners = await open_listeners(config.listen, ssl_context)

    async def serve() -> None:
        async with trio.open_nursery() as serving:
            await serving.start(server.serve_listeners, listeners)
            log.info("namesrv.started", address=server.address, tls=ssl_context is not None)
            task_status.started(ns)

    await run_services([NamesrvService(ns)], serve, background=[ns.metrics.serve] if ns.metrics else [])
    log.info("namesrv.stopped")


class NamesrvService:
    """The name server inside a broker (``--embedded-namesrv``: same port, same process) as a broker service:
    its expiry scanner runs with the broker's other services."""

    name = "namesrv"

    def __init__(self, namesrv: NameServer) -> None:
        self.namesrv = namesrv

    async def start(self) -> None:
        pass

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self.namesrv.run_scanner(task_status=task_status)

    async def stop(self) -> None:
        pass
