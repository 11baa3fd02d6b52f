"""The broker process: one RemotingServer plus the services that answer its requests.

A service is an object with ``name``, ``async start()`` (load state; services start in list order, so the
store is open before anything that needs it), ``async run(task_status)`` (its background loops, cancelled on
stop) and ``async stop()`` (persist; called in reverse order after the server drained). Services register
their request handlers on ``trimq.broker.server`` in their constructors.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Protocol

import trio

from trimq.broker.config import BrokerConfig, ConfigError
from trimq.broker.server import RemotingServer, server_ssl_context, tls_listeners
from trimq.protocol.address import format_address, parse_address
from trimq.protocol.logs import get_logger

log = get_logger("trimq.broker")


class BrokerService(Protocol):
    name: str

    async def start(self) -> None: ...

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None: ...

    async def stop(self) -> None: ...


class HandlerService:
    """Base of a service that only answers requests: nothing to load, run or persist."""

    name = "handlers"

    async def start(self) -> None:
        pass

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()

    async def stop(self) -> None:
        pass


class Broker:
    """A broker: ``async with open_broker(config) as broker`` in tests, ``await broker.run()`` in the daemon."""

    def __init__(self, config: BrokerConfig) -> None:
        config.validate()
        self.config = config
        self.server = RemotingServer(
            name=config.broker_name,
            max_frame_bytes=config.max_frame_bytes,
            max_connections=config.max_connections,
            max_inflight_requests=config.max_inflight_requests,
            max_pending_write_bytes=config.max_pending_write_bytes,
            max_total_pending_write_bytes=config.max_total_pending_write_bytes,
            busy_body_bytes=config.busy_body_bytes,
            write_stall_timeout_s=config.max_write_stall_ms / 1000,
            max_idle_s=config.server_channel_max_idle_time_seconds,
            shutdown_grace_s=config.shutdown_grace_ms / 1000,
        )
        self.ssl_context = _server_ssl_context(config)
        self.acl: Any = None  # broker.acl.AccessValidator when acl_file is set
        if config.acl_file:
            from trimq.broker.acl import AccessValidator, load_acl

            acl = self.acl = AccessValidator(load_acl(config.acl_file))
            self.server.authorizer = lambda cmd, conn: acl.check(cmd, conn.remote)
        self.services: list[BrokerService] = []
        self.components: dict[str, Any] = {}
        self.started = trio.Event()
        from trimq.broker.services import build_services

        build_services(self)
        self.metrics: Any = None  # broker.metrics.BrokerMetrics when metrics_port is set
        if config.metrics_port:
            from trimq.broker.metrics import BrokerMetrics

            self.metrics = BrokerMetrics(self)  # installs its hooks before anything is served

    @property
    def address(self) -> str:
        """``host:port`` actually listened on (valid once started)."""
        return self.server.address

    def component(self, name: str) -> Any:
        """A named component (``store``, ``consumer_manager``, ``lock_manager``, ...)."""
        return self.components[name]

    def shutdown(self) -> None:
        """Begin a graceful stop."""
        self.server.shutdown()

    async def run(self, *, task_status: trio.TaskStatus[Broker] = trio.TASK_STATUS_IGNORED) -> None:
        """Start every service, serve until ``shutdown()``, then stop services in reverse order."""
        host, port = parse_address(self.config.listen)
        listeners: list[Any] = await trio.open_tcp_listeners(port, host=host)
        if self.ssl_context is not None:
            listeners = tls_listeners(listeners, self.ssl_context)
        started: list[BrokerService] = []
        try:
            for svc in self.services:
                await svc.start()
                started.append(svc)
            async with trio.open_nursery() as background:
                for svc in self.services:
                    await background.start(svc.run)
                if self.metrics is not None:
                    await background.start(self.metrics.serve)
                async with trio.open_nursery() as serving:
                    await serving.start(self.server.serve_listeners, listeners)
                    self._write_address_file()
                    log.info("broker.started", broker=self.config.broker_name, address=self.address,
                             store=self.config.store_dir, flush=self.config.flush_disk_type)
                    self.started.set()
                    task_status.started(self)
                background.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                for svc in reversed(started):
                    try:
                        await svc.stop()
                    except Exception:
                        log.exception("service.stop_failed", service=svc.name)
            log.info("broker.stopped", broker=self.config.broker_name)

    def _write_address_file(self) -> None:
        os.makedirs(self.config.store_dir, exist_ok=True)
        host, port = self.server.addresses[0]
        path = os.path.join(self.config.store_dir, "broker.addr")
        tmp = path + ".tmp"
        with open(tmp, "w") as fh:
            fh.write(format_address(host, port) + "\n")
        os.replace(tmp, path)


def _server_ssl_context(config: BrokerConfig) -> ssl.SSLContext | None:
    """The TLS context of the broker's listeners (None: plain TCP). ConfigError for unusable files."""
    if not config.tls_cert_file:
        return None
    try:
        return server_ssl_context(config.tls_cert_file, config.tls_key_file or None, config.tls_ca_file or None,
                                  require_client_cert=config.tls_require_client_cert)
    except ValueError as exc:
        raise ConfigError(f"TLS: {exc}") from None


@asynccontextmanager
async def open_broker(config: BrokerConfig) -> AsyncIterator[Broker]:
    """Run a broker in the background for the duration of the block (tests, embedding, the demo)."""
    broker = Broker(config)
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.run)
        try:
            yield broker
        finally:
            broker.shutdown()
