"""A minimal HTTP endpoint serving Prometheus text, as a trio task owned by the daemon that exposes it.

prometheus-client's own ``start_http_server`` runs a daemon thread nobody owns; this serves
``GET /metrics`` from a task in the daemon's nursery, so it starts and stops with the daemon. Imports trio
lazily: protocol/ itself stays sans-IO and only the daemons call this.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

MAX_REQUEST_BYTES = 8192


def _response(status: str, body: bytes, content_type: str = "text/plain; charset=utf-8") -> bytes:
    head = (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n")
    return head.encode() + body


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)


async def serve_metrics(registry: CollectorRegistry, host: str, port: int, *, task_status: Any = None) -> None:
    """Serve ``GET /metrics`` on ``host:port`` until cancelled; ``task_status.started((host, port))``."""
    import trio

    listeners = await trio.open_tcp_listeners(port, host=host)
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
            line = data.split(b"\r\n", 1)[0].decode("latin-1", "replace").split()
            if len(line) < 2 or line[0] != "GET":
                resp = _response("405 Method Not Allowed", b"only GET /metrics\n")
            elif line[1].split("?")[0] not in ("/metrics", "/"):
                resp = _response("404 Not Found", b"see /metrics\n")
            else:
                try:
                    resp = _response("200 OK", render(registry), CONTENT_TYPE_LATEST)
                except Exception as exc:  # a broken collector must not take the daemon down with it
                    resp = _response("500 Internal Server Error", f"metrics collection failed: {exc}\n".encode())
            try:
                await stream.send_all(resp)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    await trio.serve_listeners(handle, listeners)
