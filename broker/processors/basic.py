"""Requests every broker answers whatever else it runs: runtime info."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

import trio

from trimq.protocol.codes import RequestCode
from trimq.protocol.command import RemotingCommand

if TYPE_CHECKING:
    from trimq.broker.broker import Broker
    from trimq.broker.server import Connection


class BasicService:
    """GET_BROKER_RUNTIME_INFO: name, version, uptime, connections."""

    name = "basic"

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.started_at = time.time()
        broker.server.register(RequestCode.GET_BROKER_RUNTIME_INFO, self.get_runtime_info)

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
        cfg = self.broker.config
        body = {
            "brokerName": cfg.broker_name,
            "clusterName": cfg.cluster_name,
            "version": ver,
            "pid": os.getpid(),
            "uptimeMs": int((time.time() - self.started_at) * 1000),
            "connections": len(self.broker.server.connections),
            "flushDiskType": cfg.flush_disk_type,
        }
        return RemotingCommand.response_to(cmd, body=body)
