"""A minimal HTTP endpoint for a daemon's Prometheus text and health, as a trio task owned by that daemon.

prometheus-client's own ``start_http_server`` runs a daemon thread nobody owns; this serves from a task in
the daemon's nursery, so it starts and stops with the daemon:

* ``GET /metrics`` (or ``/``): the registry in Prometheus text format; 500 when a collector fails (the
  daemon keeps running).
* ``GET /healthz``: ``200 ok`` while the daemon serves requests, ``503`` before it listens and once its
  graceful shutdown has begun (``healthy()``, e.g. :attr:`trimq.runtime.server.RemotingServer.serving`), so
  a load balancer or an orchestrator stops sending it work while it drains.
* ``HEAD`` of either: the same status and headers, no body. Other methods: 405; other paths: 404.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from trimq.runtime.daemon import listen_tcp

__all__ = ["MAX_REQUEST_BYTES", "answer", "render", "serve_metrics"]

MAX_REQUEST_BYTES = 8192
_TEXT = "text/plain; charset=utf-8"


def _response(status: str, body: bytes, content_type: str = _TEXT, *, head: bool = False) -> bytes:
    """An HTTP/1.1 response; ``head``: the headers of that response only (Content-Length of the body)."""
    header = (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
              "Connection: close\r\n\r\n")
    return header.encode() + (b"" if head else body)


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)


def answer(request_line: str, registry: CollectorRegistry, healthy: Callable[[], bool] | None) -> bytes:
    """The response to one request line (``GET /healthz HTTP/1.1``)."""
    parts = request_line.split()
    method = parts[0] if parts else ""
    if len(parts) < 2 or method not in ("GET", "HEAD"):
        return _response("405 Method Not Allowed", b"only GET or HEAD /metrics, /healthz\n")
    head = method == "HEAD"
    path = parts[1].split("?")[0]
    if path == "/healthz":
        try:
            ok = True if healthy is None else bool(healthy())
        except Exception:  # a health check that fails says "not healthy", it does not crash the daemon
            ok = False
        if ok:
            return _response("200 OK", b"ok\n", head=head)
        return _response("503 Service Unavailable", b"not serving\n", head=head)
    if path not in ("/metrics", "/"):
        return _response("404 Not Found", b"see /metrics or /healthz\n", head=head)
    try:
        return _response("200 OK", render(registry), CONTENT_TYPE_LATEST, head=head)
    except Exception as exc:  # a broken collector must not take the daemon down with it
        return _response("500 Internal Server Error", f"metrics collection failed: {exc}\n".encode(), head=head)


async def serve_metrics(registry: CollectorRegistry, host: str, port: int, *,
                        healthy: Callable[[], bool] | None = None, task_status: Any = None) -> None:
    """Serve ``/metrics`` and ``/healthz`` on ``host:port`` until cancelled; ``task_status.started((host, port))``.

    ``healthy()`` answers /healthz (None: healthy whenever the endpoint itself is up).
    """
    listeners = await listen_tcp(host, port, "metrics")
    addr = listeners[0].socket.getsockname()[:2]
    if task_status is not None:
        task_status.started((addr[0], addr[1]))

    async def handle(stream: Any) -> None:
        async with stream:
            data = b""
            with trio.move_on_after(5):
                while b"\r\n\r\n" not in data and len(data) < MAX_REQUEST_BYTES:
                    chunk = await stream.receive_some(4096)
                    if not chunk:
                        break
                    data += chunk
            line = data.split(b"\r\n", 1)[0].decode("latin-1", "replace")
            try:
                await stream.send_all(answer(line, registry, healthy))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    await trio.serve_listeners(handle, listeners)
