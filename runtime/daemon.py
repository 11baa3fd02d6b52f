"""What both daemons (the broker, the name server) do the same way: open their listeners, and run their services
with the start / run / stop lifecycle around serving.

A service is an object with ``name``, ``async start()`` (load state; services start in list order),
``async run(task_status)`` (its background loops, cancelled once the server has drained) and
``async stop()`` (persist; called in reverse order, shielded, even when start-up failed half-way).
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import trio

from trimq.protocol.address import parse_address
from trimq.runtime.logs import get_logger
from trimq.runtime.tls import tls_listeners

__all__ = ["Service", "listen_tcp", "open_listeners", "run_services"]

log = get_logger("trimq.daemon")


class Service(Protocol):
    """One part of a daemon with the start / run / stop lifecycle."""

    name: str

    async def start(self) -> None: ...

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None: ...

    async def stop(self) -> None: ...


async def open_listeners(listen: str, ssl_context: ssl.SSLContext | None = None) -> list[Any]:
    """TCP listeners on ``listen`` (``HOST:PORT``; port 0 picks a free one), speaking TLS with ``ssl_context``.
    Opened before any service starts, so a port in use stops the daemon before it touches its state."""
    host, port = parse_address(listen)
    listeners = await listen_tcp(host, port)
    return tls_listeners(listeners, ssl_context) if ssl_context is not None else listeners


async def listen_tcp(host: str, port: int, purpose: str = "") -> list[Any]:
    """``trio.open_tcp_listeners(port, host=host)``, whose OSError ("Address already in use", "Name or service not
    known") does not say which address: raised again as ``cannot listen on HOST:PORT[ for PURPOSE]: reason``, the
    errno kept. A daemon opens several (requests, metrics, HA replication), so the message says which one."""
    try:
        listeners: list[Any] = await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        what = f" for {purpose}" if purpose else ""
        raise OSError(exc.errno, f"cannot listen on {host}:{port}{what}: {exc.strerror or exc}") from exc
    return listeners


async def run_services(services: Sequence[Service], serve: Callable[[], Awaitable[None]], *,
                       background: Sequence[Callable[..., Awaitable[Any]]] = ()) -> None:
    """Start ``services`` in order, run their loops (and the ``background`` tasks, e.g. a metrics endpoint,
    each started with ``nursery.start``), ``await serve()`` until the server has drained, then cancel the
    loops and stop the started services in reverse order. A service whose ``stop`` fails is logged and the
    others still stop."""
    started: list[Service] = []
    try:
        for svc in services:
            await svc.start()
            started.append(svc)
        async with trio.open_nursery() as loops:
            for svc in services:
                await loops.start(svc.run)
            for task in background:
                await loops.start(task)
            await serve()
            loops.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            for svc in reversed(started):
                try:
                    await svc.stop()
                except Exception:
                    log.exception("service.stop_failed", service=svc.name)
