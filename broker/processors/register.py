"""Broker registration with the name servers (RocketMQ's BrokerOuterAPI.registerBrokerAll).

Every ``register_broker_interval_ms`` (30 s) and soon after any topic change, the broker sends
REGISTER_BROKER with its topic table to each ``namesrv_addr`` over a persistent connection (the runtime's
RemotingClient, the transport the SDK uses: a name server drops a broker whose connection closes), and registers
in-process with the embedded name server when there is one. When the broker starts draining it sends
UNREGISTER_BROKER, so clients stop getting routes to it at once.
"""

from __future__ import annotations

import ssl
from typing import Any, Protocol

import trio

from trimq.broker.config import BrokerConfig
from trimq.broker.deps import AddressSource, Draining, LocalNameServer, TopicTable
from trimq.protocol.address import format_address, parse_address
from trimq.protocol.codes import RequestCode, ResponseCode
from trimq.protocol.command import RemotingCommand
from trimq.runtime.client import RemotingClient, RemotingError
from trimq.runtime.logs import RateLimiter, get_logger
from trimq.runtime.tls import client_ssl_context

log = get_logger("trimq.register")

__all__ = ["RegisterService", "advertised_host"]

_UNSPECIFIED = {"", "0.0.0.0", "::", "*"}
REQUEST_TIMEOUT_S = 3.0
TOPIC_CHANGE_DEBOUNCE_S = 0.05


def advertised_host(cfg: BrokerConfig, bound: list[tuple[str, int]]) -> tuple[str, int]:
    """The address other processes reach this broker at (store host in records, address in routes):
    ``broker_ip`` if set, else the listen host (127.0.0.1 for a wildcard), with the port actually bound
    (``bound``: the server's listening addresses, empty before it listens)."""
    host, port = parse_address(cfg.listen)
    if bound:
        port = bound[0][1]
    if cfg.broker_ip:
        host = cfg.broker_ip
    elif host in _UNSPECIFIED or host == "localhost":
        host = "127.0.0.1"
    return host, port


class HARegistration(Protocol):
    """The HA role's part of a registration (broker/ha/controller.py HAController): the broker id, the HA address
    and master epoch sent, and the name server's answer (a slave learns its master; a superseded master steps down)."""

    broker_id: int

    def register_ext(self) -> dict[str, Any]: ...

    async def on_register_answer(self, ext: dict[str, Any]) -> None: ...

    def on_registered(self) -> None: ...


class RegisterService:
    """Registers the broker's topics with the name servers (and the embedded one, ``namesrv``) once
    ``started`` is set; unregisters when ``server`` starts draining."""

    name = "register"

    def __init__(self, *, config: BrokerConfig, server: Draining, topics: TopicTable,
                 namesrv: LocalNameServer | None, address: AddressSource, started: trio.Event) -> None:
        self.config = config
        self.server = server
        self.namesrv = namesrv
        self.address = address
        self.started = started
        self.topics = topics
        self.topics.listeners.append(self._on_topic_change)
        self._changed = trio.Event()
        self._limiter = RateLimiter(interval_ms=30_000)
        self.registrations = 0  # successful registration rounds (tests)
        self.registered = trio.Event()
        self.draining = False  # once unregistered for a shutdown, never register again
        #: Set by the composition root when the broker has an HA role (issue 15); None: a master with id 0.
        self.ha: HARegistration | None = None

    def wake(self) -> None:
        """Register again now (the HA role changed)."""
        self._changed.set()

    @property
    def broker_id(self) -> int:
        return self.ha.broker_id if self.ha is not None else 0

    def _on_topic_change(self, topic: str) -> None:
        # The embedded name server learns a new topic at once (in-process, no I/O), so a consumer asking for
        # the route right after a producer created the topic finds it; remote name servers after a debounce.
        if self.namesrv is not None and self.started.is_set():
            self._register_local()
        self._changed.set()

    @property
    def broker_addr(self) -> str:
        host, port = self.address()
        return format_address(host, port)

    def _ext(self) -> dict[str, Any]:
        return {"brokerAddr": self.broker_addr, "brokerName": self.config.broker_name,
                "clusterName": self.config.cluster_name, "brokerId": self.broker_id,
                **(self.ha.register_ext() if self.ha is not None else {})}

    async def start(self) -> None:
        pass

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        rc_ctx = RemotingClient(max_frame_bytes=self.config.max_frame_bytes, connect_timeout_s=REQUEST_TIMEOUT_S,
                                ssl_context=namesrv_ssl_context(self.config))
        async with rc_ctx as rc, trio.open_nursery() as nursery:
            await self.started.wait()
            nursery.start_soon(self._unregister_on_drain, rc)
            interval = self.config.register_broker_interval_ms / 1000
            while True:
                await self.register_all(rc)
                with trio.move_on_after(interval):
                    await self._changed.wait()
                    await trio.sleep(TOPIC_CHANGE_DEBOUNCE_S)  # coalesce a burst of topic creations
                self._changed = trio.Event()

    async def stop(self) -> None:
        pass

    async def register_all(self, rc: RemotingClient) -> None:
        """One registration round: the embedded name server, then every configured one (concurrently)."""
        if self.draining:
            return
        table, version = self._register_local()
        body = {"topicConfigTable": table, "dataVersion": version}
        answered: list[str] = []
        async with trio.open_nursery() as nursery:
            for addr in self.config.namesrv_addrs:
                nursery.start_soon(self._register_one, rc, addr, body, answered)
        self.registrations += 1
        self.registered.set()
        if answered and self.ha is not None:
            # every name server of the round has answered or failed: none that answered named a newer master
            self.ha.on_registered()

    def _register_local(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Register with the embedded name server (if any); returns the table and version sent."""
        table = self.topics.table_json()
        version = dict(self.topics.data_version)
        ns = self.namesrv
        if ns is not None and not self.draining:
            ns.register_local(cluster=self.config.cluster_name, broker_addr=self.broker_addr,
                              broker_name=self.config.broker_name, broker_id=self.broker_id, topic_config_table=table,
                              data_version=version)
        return table, version

    async def _register_one(self, rc: RemotingClient, addr: str, body: dict[str, Any], answered: list[str]) -> None:
        cmd = RemotingCommand.request(RequestCode.REGISTER_BROKER, self._ext(), body)
        try:
            resp = await rc.invoke(addr, cmd, REQUEST_TIMEOUT_S)
        except RemotingError as exc:
            if self._limiter.allow(addr, int(trio.current_time() * 1000)) is not None:
                log.warning("register.failed", namesrv=addr, error=str(exc))
            return
        if resp.code != ResponseCode.SUCCESS:
            log.warning("register.refused", namesrv=addr, code=resp.code, remark=resp.remark)
        else:
            answered.append(addr)
            if self.ha is not None:
                await self.ha.on_register_answer(resp.ext)

    async def _unregister_on_drain(self, rc: RemotingClient) -> None:
        await self.server.wait_shutdown()
        await self.unregister_all(rc)

    async def unregister_all(self, rc: RemotingClient) -> None:
        self.draining = True
        if self.namesrv is not None:
            self.namesrv.unregister_local(cluster=self.config.cluster_name, broker_addr=self.broker_addr,
                                          broker_name=self.config.broker_name, broker_id=self.broker_id)
        with trio.move_on_after(1.0):
            async with trio.open_nursery() as nursery:
                for addr in self.config.namesrv_addrs:
                    nursery.start_soon(self._unregister_one, rc, addr)

    async def _unregister_one(self, rc: RemotingClient, addr: str) -> None:
        cmd = RemotingCommand.request(RequestCode.UNREGISTER_BROKER, self._ext())
        try:
            await rc.invoke(addr, cmd, 1.0)
            log.info("register.unregistered", namesrv=addr)
        except RemotingError as exc:
            log.info("register.unregister_failed", namesrv=addr, error=str(exc))


def namesrv_ssl_context(config: BrokerConfig) -> ssl.SSLContext | None:
    """The TLS context for talking to name servers when ``namesrv_tls`` is on (docs/SECURITY.md): verifying them
    with ``tls_ca_file`` (the system CAs when empty), presenting ``tls_cert_file`` when set (mutual TLS)."""
    if not config.namesrv_tls:
        return None
    return client_ssl_context(config.tls_ca_file or None, config.tls_cert_file or None, config.tls_key_file or None)
