"""The broker service lifecycle: what ``Broker.run`` starts, runs and stops (broker/broker.py builds them).

A service is an object with ``name``, ``async start()`` (load state; services start in list order, so the
store is open before anything that needs it), ``async run(task_status)`` (its background loops, cancelled on
stop) and ``async stop()`` (persist; called in reverse order after the server drained). Services that answer
requests register their handlers on the registry they are given, in their constructors.
"""

from __future__ import annotations

from typing import Protocol

import trio

__all__ = ["BrokerService", "HandlerService"]


class BrokerService(Protocol):
    """One part of a broker with the start / run / stop lifecycle."""

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
