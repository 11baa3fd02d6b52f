"""Base of the broker services that only answer requests (the lifecycle itself: runtime/daemon.py).

A service is an object with ``name``, ``async start()``, ``async run(task_status)`` and ``async stop()``
(runtime.daemon.Service); ``Broker.run`` starts them in list order and stops them in reverse. Services that
answer requests register their handlers on the registry they are given, in their constructors.
"""

from __future__ import annotations

import trio

__all__ = ["HandlerService"]


class HandlerService:
    """Base of a service that only answers requests: nothing to load, run or persist."""

    name = "handlers"

    async def start(self) -> None:
        pass

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()

    async def stop(self) -> None:
        pass
