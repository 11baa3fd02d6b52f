"""A small HTTP/1.1 server on trio with h11: what the console needs and no more.

h11 does the protocol (framing, keep-alive, chunked bodies, malformed input); this module owns the sockets,
the limits and the lifecycle. One task per connection in the caller's nursery (``trio.serve_listeners``), so
the server starts and stops with its owner. Limits: request head ``MAX_HEAD_BYTES``, body ``MAX_BODY_BYTES``
(413 past it), ``REQUEST_TIMEOUT_S`` for the next request of a connection to arrive whole (a kept-alive
connection idle that long is closed), ``MAX_CONNECTIONS`` at once (further ones are closed at once).

The handler takes a :class:`Request` and returns a :class:`Response`; an exception it raises becomes a 500
(logged), never a dead server.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import h11
import trio

from trimq.runtime.logs import get_logger

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_CONNECTIONS",
    "MAX_HEAD_BYTES",
    "REQUEST_TIMEOUT_S",
    "Handler",
    "Request",
    "Response",
    "serve_http",
]

log = get_logger("trimq.console")

MAX_HEAD_BYTES = 16 * 1024
MAX_BODY_BYTES = 64 * 1024
REQUEST_TIMEOUT_S = 30.0
MAX_CONNECTIONS = 64

_REASONS = {200: b"OK", 303: b"See Other", 400: b"Bad Request", 401: b"Unauthorized", 403: b"Forbidden",
            404: b"Not Found", 405: b"Method Not Allowed", 413: b"Content Too Large", 500: b"Internal Server Error",
            502: b"Bad Gateway", 503: b"Service Unavailable"}


@dataclass(frozen=True)
class Request:
    """One HTTP request: ``path`` without the query; ``query`` and ``form`` (an urlencoded POST body) keep the
    first value of each name; ``headers`` have lower-case names (repeated ones joined with ``, ``)."""

    method: str
    path: str
    query: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    form: dict[str, str] = field(default_factory=dict)

    def cookie(self, name: str) -> str | None:
        """The value of cookie ``name``, if the request carries it."""
        for part in self.headers.get("cookie", "").replace(",", ";").split(";"):
            key, sep, value = part.strip().partition("=")
            if sep and key == name:
                return value
        return None


@dataclass
class Response:
    """An HTTP response; ``headers`` are added to the content type and length."""

    status: int
    body: bytes = b""
    content_type: str = "text/html; charset=utf-8"
    headers: list[tuple[str, str]] = field(default_factory=list)


Handler = Callable[[Request], Awaitable[Response]]


def _first_values(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in urllib.parse.parse_qsl(text, keep_blank_values=True, max_num_fields=200):
        out.setdefault(key, value)
    return out


def parse_request(event: h11.Request, body: bytes) -> Request:
    """A :class:`Request` from h11's request event and the body received."""
    target = event.target.decode("latin-1")
    path, _sep, query = target.partition("?")
    headers: dict[str, str] = {}
    for name, value in event.headers:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    form: dict[str, str] = {}
    if event.method == b"POST" and headers.get("content-type", "").split(";")[0].strip() == \
            "application/x-www-form-urlencoded":
        form = _first_values(body.decode("utf-8", "replace"))
    return Request(event.method.decode("latin-1"), urllib.parse.unquote(path), _first_values(query), headers, form)


class _TooLarge(Exception):
    pass


async def _receive(conn: h11.Connection, stream: trio.abc.Stream) -> Any:
    """The next h11 event, reading from ``stream`` as h11 needs more data."""
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        conn.receive_data(bytes(await stream.receive_some(16384)))


async def _read_request(conn: h11.Connection, stream: trio.abc.Stream) -> tuple[h11.Request, bytes] | None:
    """The next request and its body; None when the peer closed the connection between requests."""
    event = await _receive(conn, stream)
    if isinstance(event, h11.ConnectionClosed):
        return None
    if not isinstance(event, h11.Request):
        raise h11.RemoteProtocolError(f"expected a request, got {type(event).__name__}")
    body = bytearray()
    while True:
        part = await _receive(conn, stream)
        if isinstance(part, h11.Data):
            body += part.data
            if len(body) > MAX_BODY_BYTES:
                raise _TooLarge
        elif isinstance(part, h11.EndOfMessage):
            return event, bytes(body)
        else:
            raise h11.RemoteProtocolError("the request ended early")


async def _send(conn: h11.Connection, stream: trio.abc.Stream, response: Response, *, head: bool = False,
                close: bool = False) -> None:
    headers = [("Content-Type", response.content_type), ("Content-Length", str(len(response.body))),
               *response.headers]
    if close:
        headers.append(("Connection", "close"))
    reason = _REASONS.get(response.status, b"")
    data = conn.send(h11.Response(status_code=response.status, headers=headers, reason=reason))
    if not head and response.body:
        data += conn.send(h11.Data(data=response.body))
    data += conn.send(h11.EndOfMessage())
    await stream.send_all(data)


def _plain(status: int, text: str) -> Response:
    return Response(status, text.encode() + b"\n", "text/plain; charset=utf-8")


async def _connection(stream: trio.abc.Stream, handler: Handler) -> None:
    """Serve the requests of one connection until either side closes it or a limit is hit."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
    async with stream:
        while True:
            try:
                # one bound for idling and sending: a slow or silent peer cannot hold a connection slot
                with trio.fail_after(REQUEST_TIMEOUT_S):
                    got = await _read_request(conn, stream)
            except h11.RemoteProtocolError as exc:
                if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                    status = exc.error_status_hint if exc.error_status_hint in _REASONS else 400
                    await _send_quietly(conn, stream, _plain(status, "bad request"))
                return
            except _TooLarge:
                await _send_quietly(conn, stream, _plain(413, f"request body over {MAX_BODY_BYTES} bytes"))
                return
            except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if got is None:
                return
            event, body = got
            request = parse_request(event, body)
            try:
                response = await handler(request)
            except Exception:
                log.exception("console.request_failed", method=request.method, path=request.path)
                response = _plain(500, "internal error (see the console's log)")
            try:
                await _send(conn, stream, response, head=request.method == "HEAD")
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return
            conn.start_next_cycle()


async def _send_quietly(conn: h11.Connection, stream: trio.abc.Stream, response: Response) -> None:
    try:
        await _send(conn, stream, response, close=True)
    except (h11.LocalProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
        pass


async def serve_http(handler: Handler, host: str, port: int, *,
                     task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``handler`` on ``host:port`` (port 0: any free port) until cancelled;
    ``task_status.started((host, port))`` with the address actually bound."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()
    limit = trio.Semaphore(MAX_CONNECTIONS)

    async def one(stream: trio.SocketStream) -> None:
        try:
            limit.acquire_nowait()
        except trio.WouldBlock:
            await stream.aclose()  # over the limit: refuse rather than queue without bound
            return
        try:
            await _connection(stream, handler)
        finally:
            limit.release()

    task_status.started((str(bound[0]), int(bound[1])))
    await trio.serve_listeners(one, listeners)
