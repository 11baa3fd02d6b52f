"""The trio TCP server every trimq daemon uses: frames in, handlers by request code, frames out.

One task reads each connection and starts a task per request, so a slow request (a long-polling pull, a
SYNC_FLUSH send waiting for its fsync) never holds up the others and responses may go out of order.
Outgoing frames are queued per connection and written by one writer task, which joins everything queued
into one ``send_all``: a pipelining client gets many responses per system call.

Bounds that keep a misbehaving peer from hurting others: at most ``max_connections`` connections; per
connection at most ``max_inflight_requests`` requests being handled (the reader stops reading until one
finishes, so TCP pushes back on the sender) and at most ``max_pending_write_bytes`` of unsent responses
(handlers wait for the peer to read). A malformed frame closes only that connection.
"""

from __future__ import annotations

import itertools
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from protocol.address import format_address
from protocol.codes import ResponseCode, code_name
from protocol.command import FLAG_ONEWAY, RemotingCommand
from protocol.errors import ProtocolError
from protocol.frame import DEFAULT_MAX_FRAME_BYTES, FrameDecoder, encode_frame
from protocol.logs import RateLimiter, get_logger, log_rate_limited

log = get_logger("trimq.server")

Handler = Callable[[RemotingCommand, "Connection"], Awaitable[RemotingCommand | None]]
# Runs before the handler; returns None to allow, or the NO_PERMISSION remark saying what is missing.
Authorizer = Callable[[RemotingCommand, "Connection"], "str | None"]
RECEIVE_CHUNK_BYTES = 256 * 1024


class RequestError(Exception):
    """Raised by a handler to answer with a specific response code and remark."""

    def __init__(self, code: int, remark: str) -> None:
        super().__init__(remark)
        self.code = int(code)
        self.remark = remark


class ConnectionClosedError(Exception):
    """The connection closed before a server-initiated request got its response."""


class Connection:
    """One accepted client connection. Handlers get it to learn who asked and to push requests back."""

    def __init__(self, server: RemotingServer, stream: trio.abc.Stream, conn_id: int, remote: str) -> None:
        self.server = server
        self.stream = stream
        self.id = conn_id
        self.remote = remote
        self.attributes: dict[str, Any] = {}  # e.g. the client id learnt from a heartbeat
        self.opened_at = time.time()
        self.closed = False
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._writer_wakeup = trio.lowlevel.ParkingLot()
        self._space_available = trio.lowlevel.ParkingLot()
        self._inflight = trio.Semaphore(server.max_inflight_requests)
        self._pending: dict[int, trio.MemorySendChannel[RemotingCommand]] = {}
        self._opaques = itertools.count(1)
        self._handlers_nursery: trio.Nursery | None = None

    def __repr__(self) -> str:
        return f"<Connection #{self.id} {self.remote}>"

    @property
    def pending_write_bytes(self) -> int:
        return self._out_bytes

    async def send(self, cmd: RemotingCommand) -> None:
        """Queue ``cmd`` for writing. Waits while the peer has more than the allowed bytes unread.

        Sending on a closed connection is a no-op: the peer is gone and nobody can get the frame.
        """
        data = encode_frame(cmd, self.server.max_frame_bytes)
        while self._out_bytes > self.server.max_pending_write_bytes and not self.closed:
            await self._space_available.park()
        if self.closed:
            return
        self._out.append(data)
        self._out_bytes += len(data)
        self._writer_wakeup.unpark_all()

    async def request(self, cmd: RemotingCommand, timeout_s: float) -> RemotingCommand:
        """Send a server-initiated request and wait for the peer's response (e.g. GET_CONSUMER_RUNNING_INFO).

        Raises trio.TooSlowError after ``timeout_s`` and ConnectionClosedError if the peer goes away.
        """
        cmd.opaque = next(self._opaques)
        send, recv = trio.open_memory_channel[RemotingCommand](1)
        self._pending[cmd.opaque] = send
        try:
            await self.send(cmd)
            with trio.fail_after(timeout_s):
                try:
                    return await recv.receive()
                except trio.EndOfChannel:
                    raise ConnectionClosedError(f"{self.remote} closed before answering") from None
        finally:
            self._pending.pop(cmd.opaque, None)

    async def send_oneway(self, code: int, ext: dict[str, Any] | None = None, body: Any = None) -> None:
        """Push a oneway request (e.g. NOTIFY_CONSUMER_IDS_CHANGED) to the peer."""
        cmd = RemotingCommand(code=int(code), opaque=next(self._opaques), flag=FLAG_ONEWAY, ext=ext or {}, body=body)
        await self.send(cmd)

    # -- internals -------------------------------------------------------------------------------
    async def _writer(self) -> None:
        try:
            while True:
                if not self._out:
                    await self._writer_wakeup.park()
                    continue
                chunks, self._out = self._out, []
                size = sum(map(len, chunks))
                await self.stream.send_all(chunks[0] if len(chunks) == 1 else b"".join(chunks))
                self._out_bytes -= size
                self._space_available.unpark_all()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._mark_closed()

    async def _flush(self) -> None:
        """Wait until every queued frame was written (or the connection broke)."""
        while self._out_bytes > 0 and not self.closed:
            await self._space_available.park()

    def _mark_closed(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._out.clear()
        self._out_bytes = 0
        self._space_available.unpark_all()
        for ch in self._pending.values():
            ch.close()

    async def _read_loop(self, handlers: trio.Nursery) -> str:
        """Read until EOF, a malformed frame or cancellation; returns why it stopped."""
        decoder = FrameDecoder(self.server.max_frame_bytes)
        while True:
            try:
                data = await self.stream.receive_some(RECEIVE_CHUNK_BYTES)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return "broken"
            if not data:
                return "eof"
            try:
                cmds = decoder.feed(data)
            except ProtocolError as exc:
                self.server.protocol_errors += 1
                # A fuzzer or a wrong client hits this per connection: one line per 10 s, with a count.
                log_rate_limited(self.server.warn_limiter, "connection.protocol_error", _mono_ms(), log.warning,
                                 "connection.protocol_error", server=self.server.name, remote=self.remote,
                                 conn=self.id, error=type(exc).__name__, detail=str(exc),
                                 protocol_errors=self.server.protocol_errors)
                return "protocol_error"
            for cmd in cmds:
                if cmd.is_response:
                    ch = self._pending.get(cmd.opaque)
                    if ch is not None:
                        ch.send_nowait(cmd)
                    continue
                await self._inflight.acquire()
                handlers.start_soon(self._handle, cmd)

    async def _handle(self, cmd: RemotingCommand) -> None:
        server = self.server
        try:
            handler = server.handlers.get(cmd.code)
            started = time.perf_counter()
            resp: RemotingCommand | None
            denied = server._authorize(cmd, self) if server.authorizer is not None else None
            if denied is not None:
                resp = RemotingCommand.response_to(cmd, ResponseCode.NO_PERMISSION, denied)
            elif handler is None:
                resp = RemotingCommand.response_to(
                    cmd, ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f"request code {cmd.code} is not supported"
                )
            else:
                try:
                    resp = await handler(cmd, self)
                except RequestError as exc:
                    resp = RemotingCommand.response_to(cmd, exc.code, exc.remark)
                except trio.Cancelled:
                    raise
                except Exception as exc:
                    log.exception("request.failed", code=code_name(cmd.code, response=False), remote=self.remote)
                    resp = RemotingCommand.response_to(
                        cmd, ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}"
                    )
            if server.observe is not None:
                server.observe(cmd.code, resp.code if resp is not None else 0, time.perf_counter() - started)
            if resp is not None and not cmd.is_oneway:
                resp.opaque = cmd.opaque
                await self.send(resp)
        finally:
            self._inflight.release()

    async def _wait_idle(self) -> None:
        """Wait until no request of this connection is being handled."""
        n = self.server.max_inflight_requests
        for _ in range(n):
            await self._inflight.acquire()
        for _ in range(n):
            self._inflight.release()


class RemotingServer:
    """Accepts connections and dispatches their requests to handlers registered by request code."""

    def __init__(
        self,
        *,
        name: str = "server",
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_connections: int = 10_000,
        max_inflight_requests: int = 1024,
        max_pending_write_bytes: int = 32 * 1024 * 1024,
        shutdown_grace_s: float = 5.0,
        authorizer: Authorizer | None = None,
    ) -> None:
        self.name = name
        self.authorizer = authorizer
        self.max_frame_bytes = max_frame_bytes
        self.max_connections = max_connections
        self.max_inflight_requests = max_inflight_requests
        self.max_pending_write_bytes = max_pending_write_bytes
        self.shutdown_grace_s = shutdown_grace_s
        self.handlers: dict[int, Handler] = {}
        self.connections: dict[int, Connection] = {}
        self.addresses: list[tuple[str, int]] = []
        self.protocol_errors = 0
        self.refused_connections = 0
        self.observe: Callable[[int, int, float], None] | None = None
        self.warn_limiter = RateLimiter(10_000)  # repeated warnings: one line per 10 s and kind, with a count
        self._close_callbacks: list[Callable[[Connection], None]] = []
        self._open_callbacks: list[Callable[[Connection], None]] = []
        self._ids = itertools.count(1)
        self._shutdown = trio.Event()
        self._read_scopes: dict[int, trio.CancelScope] = {}

    def _authorize(self, cmd: RemotingCommand, conn: Connection) -> str | None:
        """Run the authorizer; a failing one refuses the request (fail closed) rather than crash it."""
        assert self.authorizer is not None
        try:
            return self.authorizer(cmd, conn)
        except Exception as exc:
            log.exception("request.authorizer_failed", code=code_name(cmd.code, response=False), remote=conn.remote)
            return f"permission check failed: {type(exc).__name__}: {exc}"

    def register(self, code: int, handler: Handler) -> None:
        """Route requests with ``code`` to ``handler``; the last registration for a code wins."""
        self.handlers[int(code)] = handler

    def on_connection_closed(self, callback: Callable[[Connection], None]) -> None:
        """Call ``callback(conn)`` (synchronously) as soon as a connection closes, for whatever reason."""
        self._close_callbacks.append(callback)

    def on_connection_opened(self, callback: Callable[[Connection], None]) -> None:
        self._open_callbacks.append(callback)

    @property
    def address(self) -> str:
        """``host:port`` of the first listener (with the real port when 0 was asked for)."""
        host, port = self.addresses[0]
        return format_address(host, port)

    def shutdown(self) -> None:
        """Begin a graceful stop: stop accepting and reading, let in-flight requests finish (bounded)."""
        self._shutdown.set()

    @property
    def shutting_down(self) -> bool:
        """True once ``shutdown()`` was called."""
        return self._shutdown.is_set()

    async def wait_shutdown(self) -> None:
        """Return when a graceful stop begins: services answer held requests and unregister then, so the
        drain is quick."""
        await self._shutdown.wait()

    async def serve(
        self, host: str, port: int, *, task_status: trio.TaskStatus[list[tuple[str, int]]] = trio.TASK_STATUS_IGNORED,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """Listen on ``host:port`` (TLS with ``ssl_context``) and serve until ``shutdown()`` or cancellation."""
        listeners: list[Any] = await trio.open_tcp_listeners(port, host=host)
        if ssl_context is not None:
            listeners = tls_listeners(listeners, ssl_context)
        await self.serve_listeners(listeners, task_status=task_status)

    async def serve_listeners(
        self, listeners: list[Any], *, task_status: trio.TaskStatus[list[tuple[str, int]]] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve already-open listeners (TCP, or TLS-wrapped) until ``shutdown()`` or cancellation."""
        self.addresses = []
        for lst in listeners:
            sock = getattr(lst, "socket", None) or getattr(getattr(lst, "transport_listener", None), "socket", None)
            if sock is not None:
                addr = sock.getsockname()
                self.addresses.append((addr[0], addr[1]))
        async with trio.open_nursery() as conns:
            async with trio.open_nursery() as accepting:
                for lst in listeners:
                    accepting.start_soon(self._accept_loop, lst, conns)
                task_status.started(self.addresses)
                await self._shutdown.wait()
                accepting.cancel_scope.cancel()
            for lst in listeners:
                await lst.aclose()
            log.info("server.draining", server=self.name, connections=len(self.connections))
            for scope in list(self._read_scopes.values()):
                scope.cancel()
            with trio.move_on_after(self.shutdown_grace_s) as waited:
                while self.connections:
                    await trio.sleep(0.01)
            if waited.cancelled_caught:
                log.warning("server.drain_timeout", server=self.name, connections=len(self.connections))
            conns.cancel_scope.cancel()

    async def _accept_loop(self, listener: Any, conns: trio.Nursery) -> None:
        async with listener:
            while True:
                try:
                    stream = await listener.accept()
                except (OSError, trio.BrokenResourceError) as exc:
                    # e.g. EMFILE: back off instead of spinning, keep serving the connections we have.
                    log_rate_limited(self.warn_limiter, "server.accept_failed", _mono_ms(), log.warning,
                                     "server.accept_failed", server=self.name, error=str(exc))
                    await trio.sleep(0.1)
                    continue
                conns.start_soon(self._serve_connection, stream)

    async def _serve_connection(self, stream: trio.abc.Stream) -> None:
        remote = _peer_name(stream)
        if len(self.connections) >= self.max_connections:
            self.refused_connections += 1
            log_rate_limited(self.warn_limiter, "connection.refused", _mono_ms(), log.warning, "connection.refused",
                             server=self.name, remote=remote, reason="max_connections", limit=self.max_connections,
                             refused_total=self.refused_connections)
            await trio.aclose_forcefully(stream)
            return
        conn = Connection(self, stream, next(self._ids), remote)
        self.connections[conn.id] = conn
        reason = "cancelled"
        try:
            _set_nodelay(stream)
            for cb in self._open_callbacks:
                cb(conn)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(conn._writer)
                async with trio.open_nursery() as handlers:
                    with trio.CancelScope() as read_scope:
                        self._read_scopes[conn.id] = read_scope
                        if self._shutdown.is_set():
                            read_scope.cancel()
                        reason = await conn._read_loop(handlers)
                    self._read_scopes.pop(conn.id, None)
                    if read_scope.cancelled_caught:
                        reason = "shutdown"  # let in-flight requests finish; the drain bound cuts them off
                    else:
                        # The peer is gone or spoke garbage: nobody can receive answers, stop working for it.
                        conn._mark_closed()
                        self._fire_closed(conn)
                        handlers.cancel_scope.cancel()
                await conn._flush()
                nursery.cancel_scope.cancel()
        finally:
            self._read_scopes.pop(conn.id, None)
            conn._mark_closed()
            self.connections.pop(conn.id, None)
            self._fire_closed(conn)
            await trio.aclose_forcefully(stream)
            log.debug("connection.closed", server=self.name, remote=remote, conn=conn.id, reason=reason)

    def _fire_closed(self, conn: Connection) -> None:
        if conn.attributes.get("_close_fired"):
            return
        conn.attributes["_close_fired"] = True
        for cb in self._close_callbacks:
            try:
                cb(conn)
            except Exception:
                log.exception("connection.close_callback_failed", remote=conn.remote)


def server_ssl_context(cert_file: str, key_file: str | None = None, ca_file: str | None = None, *,
                       require_client_cert: bool = False) -> ssl.SSLContext:
    """A TLS 1.2+ server context presenting ``cert_file``/``key_file`` (PEM); with ``require_client_cert``,
    peers must show a certificate signed by ``ca_file`` (mutual TLS). ValueError naming an unusable file."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert_file, key_file or None)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"certificate {cert_file} / key {key_file or cert_file}: {exc}") from None
    ctx.verify_mode = ssl.CERT_NONE
    if require_client_cert:
        if not ca_file:
            raise ValueError("requiring client certificates needs a CA file to verify them with")
        try:
            ctx.load_verify_locations(cafile=ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"CA file {ca_file}: {exc}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def tls_listeners(listeners: list[Any], ssl_context: ssl.SSLContext) -> list[Any]:
    """Wrap TCP listeners so every accepted connection speaks TLS (the handshake runs on first read/write;
    a peer that fails it is just a broken connection)."""
    return [trio.SSLListener(lst, ssl_context, https_compatible=False) for lst in listeners]


def _mono_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def _peer_name(stream: Any) -> str:
    sock = getattr(stream, "socket", None) or getattr(getattr(stream, "transport_stream", None), "socket", None)
    if sock is None:
        return "?"
    try:
        host, port = sock.getpeername()[:2]
        return format_address(host, port)
    except OSError:
        return "?"


def _set_nodelay(stream: Any) -> None:
    sock = getattr(stream, "socket", None) or getattr(getattr(stream, "transport_stream", None), "socket", None)
    if sock is not None:
        import socket as _s

        try:
            sock.setsockopt(_s.IPPROTO_TCP, _s.TCP_NODELAY, 1)
        except OSError:
            pass


__all__ = ["Authorizer", "Connection", "ConnectionClosedError", "Handler", "RemotingServer", "RequestError",
           "server_ssl_context", "tls_listeners"]
