"""Requests every broker answers whatever else it runs: runtime info."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sized
from typing import TYPE_CHECKING, Any

import trio

from trimq.broker.config import BrokerConfig
from trimq.broker.deps import HandlerRegistry
from trimq.protocol.codes import RequestCode
from trimq.protocol.command import RemotingCommand

if TYPE_CHECKING:
    from trimq.runtime.server import Connection


class BasicService:
    """GET_BROKER_RUNTIME_INFO: name, version, uptime, connections."""

    name = "basic"

    def __init__(self, *, config: BrokerConfig, registry: HandlerRegistry, connections: Sized) -> None:
        """``connections``: the server's open connections (only counted)."""
        self.config = config
        self.connections = connections
        self.started_at = time.time()
        #: The HA role and replication progress (broker/ha/controller.py HAController.status), set by the root.
        self.ha_status: Callable[[], dict[str, Any]] | None = None
        registry.register(RequestCode.GET_BROKER_RUNTIME_INFO, self.get_runtime_info)

    async def start(self) -> None:
        self.started_at = time.time()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()

    async def stop(self) -> None:
        pass

    async def get_runtime_info(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        from importlib.metadata import PackageNotFoundError, version

        try:
            ver = version("trimq")
        except PackageNotFoundError:
            ver = "dev"
        cfg = self.config
        body = {
            "brokerName": cfg.broker_name,
            "clusterName": cfg.cluster_name,
            "version": ver,
            "pid": os.getpid(),
            "uptimeMs": int((time.time() - self.started_at) * 1000),
            "connections": len(self.connections),
            "flushDiskType": cfg.flush_disk_type,
        }
        if self.ha_status is not None:
            body["ha"] = self.ha_status()
        return RemotingCommand.response_to(cmd, body=body)
