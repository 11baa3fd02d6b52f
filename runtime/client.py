"""The client side of the one transport (the SDK's, and the broker's to its name servers): one connection per
address, concurrent requests multiplexed by opaque.

``async with RemotingClient() as rc: resp = await rc.invoke("127.0.0.1:10911", cmd, timeout_s=3)``.
Each connection has a reader task that routes responses to their waiters by opaque and hands
server-initiated requests (NOTIFY_CONSUMER_IDS_CHANGED, GET_CONSUMER_RUNNING_INFO) to registered
handlers, and a writer task that joins queued frames into one ``send_all``. A broken connection fails its
pending requests with RemotingConnectError and is replaced on the next call.
"""

from __future__ import annotations

import itertools
import os
import ssl
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Self

import trio

from trimq.protocol.address import parse_address
from trimq.protocol.codes import ResponseCode, code_name
from trimq.protocol.command import FLAG_RESPONSE, RemotingCommand
from trimq.protocol.errors import ProtocolError
from trimq.protocol.frame import DEFAULT_MAX_FRAME_BYTES, FrameDecoder, encode_frame
from trimq.protocol.signature import sign_command
from trimq.runtime.logs import get_logger

log = get_logger("trimq.remoting")

ServerRequestHandler = Callable[[RemotingCommand, str], Awaitable[RemotingCommand | None]]


class RemotingError(Exception):
    """Base class of transport failures."""


class RemotingConnectError(RemotingError):
    """Could not connect to the address, or the connection broke while the request was outstanding."""


class RemotingTimeoutError(RemotingError, TimeoutError):
    """No response arrived within the request's timeout."""


class RemotingClosedError(RemotingError):
    """The client was closed."""


class _Pending:
    """Where the response to one request lands: a one-shot slot the requesting task parks on (cheaper than
    a memory channel per request)."""

    __slots__ = ("_task", "closed", "response")

    def __init__(self) -> None:
        self._task: trio.lowlevel.Task | None = None
        self.response: RemotingCommand | None = None
        self.closed = False

    def send_nowait(self, cmd: RemotingCommand) -> None:
        if self.response is None and not self.closed:
            self.response = cmd
            self._wake()

    def close(self) -> None:
        if self.response is None:
            self.closed = True
            self._wake()

    def _wake(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            trio.lowlevel.reschedule(task)

    async def wait(self) -> RemotingCommand | None:
        """The response, or None when the connection closed first. A checkpoint (cancellable)."""
        if self.response is None and not self.closed:
            self._task = trio.lowlevel.current_task()

            def abort(_: object) -> trio.lowlevel.Abort:
                self._task = None
                return trio.lowlevel.Abort.SUCCEEDED

            await trio.lowlevel.wait_task_rescheduled(abort)
        else:
            await trio.lowlevel.checkpoint()
        return self.response


class _Channel:
    """One connection to one address."""

    def __init__(self, client: RemotingClient, addr: str, stream: trio.abc.Stream) -> None:
        self.client = client
        self.addr = addr
        self.stream = stream
        self.pending: dict[int, _Pending] = {}
        self.closed = False
        self.close_reason = "this client closed it"  # why, said to the requests still waiting for an answer
        self.cancel_scope = trio.CancelScope()
        self._out: list[bytes] = []
        self._wakeup = trio.lowlevel.ParkingLot()

    def send_frame(self, data: bytes) -> None:
        if self.closed:
            raise RemotingConnectError(f"connection to {self.addr} is closed")
        self._out.append(data)
        self._wakeup.unpark_all()

    async def run(self, handlers: trio.Nursery) -> None:
        with self.cancel_scope:
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._writer)
                    await self._reader(handlers)
                    nursery.cancel_scope.cancel()
            finally:
                self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.cancel_scope.cancel()
        for ch in self.pending.values():
            ch.close()
        self.pending.clear()
        if self.client._channels.get(self.addr) is self:
            del self.client._channels[self.addr]
        self.client._connection_closed(self.addr)

    async def _writer(self) -> None:
        try:
            while True:
                if not self._out:
                    await self._wakeup.park()
                    continue
                chunks, self._out = self._out, []
                await self.stream.send_all(b"".join(chunks) if len(chunks) > 1 else chunks[0])
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            log.info("connection.broken", addr=self.addr, error=str(exc))
            self._closing(f"it broke while sending ({exc or type(exc).__name__})")
            self.close()

    async def _reader(self, handlers: trio.Nursery) -> None:
        decoder = FrameDecoder(self.client.max_frame_bytes)
        while True:
            try:
                data = await self.stream.receive_some(256 * 1024)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                self._closing(f"it broke ({exc or type(exc).__name__})")
                return
            if not data:
                self._closing("the peer closed it")
                return
            try:
                cmds = decoder.feed(data)
            except ProtocolError as exc:
                log.warning("connection.protocol_error", addr=self.addr, error=str(exc))
                self._closing(f"the peer sent what is not a trimq frame ({exc})")
                return
            pending = self.pending
            for cmd in cmds:
                if cmd.flag & FLAG_RESPONSE:
                    waiter = pending.pop(cmd.opaque, None)
                    if waiter is not None:
                        waiter.send_nowait(cmd)
                else:
                    handlers.start_soon(self._serve_request, cmd)

    def _closing(self, reason: str) -> None:
        if not self.closed:
            self.close_reason = reason

    async def _serve_request(self, cmd: RemotingCommand) -> None:
        handler = self.client._handlers.get(cmd.code)
        resp: RemotingCommand | None
        if handler is None:
            resp = RemotingCommand.response_to(
                cmd, ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f"request code {cmd.code} is not supported"
            )
        else:
            try:
                resp = await handler(cmd, self.addr)
            except Exception as exc:
                log.exception("server_request.failed", code=code_name(cmd.code, response=False), addr=self.addr)
                resp = RemotingCommand.response_to(cmd, ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")
        if resp is not None and not cmd.is_oneway and not self.closed:
            resp.opaque = cmd.opaque
            resp.flag |= 1
            try:
                self.send_frame(encode_frame(resp, self.client.max_frame_bytes))
            except RemotingError:
                pass


class RemotingClient:
    """Connections to brokers and name servers, shared by everything in one client process."""

    def __init__(
        self,
        *,
        default_timeout_s: float = 3.0,
        connect_timeout_s: float = 3.0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        ssl_context: ssl.SSLContext | None = None,
        credentials: tuple[str, str] | None = None,
    ) -> None:
        """``credentials=(access_key, secret_key)`` signs every request for a broker with ACL on."""
        self.default_timeout_s = default_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_frame_bytes = max_frame_bytes
        self.ssl_context = ssl_context
        self.credentials = credentials
        self._channels: dict[str, _Channel] = {}
        self._connecting: dict[str, trio.Lock] = {}
        self._handlers: dict[int, ServerRequestHandler] = {}
        self._opaques = itertools.count(1)
        self._nursery: trio.Nursery | None = None
        self._closed = False
        self._close_listeners: list[Callable[[str], None]] = []
        self._open_listeners: list[Callable[[str], None]] = []

    async def __aenter__(self) -> Self:
        self._nursery_manager = trio.open_nursery()
        self._nursery = await self._nursery_manager.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        self._closed = True
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()
        for ch in list(self._channels.values()):
            ch.close()
        return await self._nursery_manager.__aexit__(exc_type, exc, tb)

    def add_close_listener(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(addr)`` (synchronously, from the task that noticed) whenever a connection closes: the
        peer closed it, it broke, or :meth:`close_address` closed it. Orderly consumers stop starting batches
        of a broker's queues at that moment (their lease may be gone; client.rebalance.impl)."""
        self._close_listeners.append(listener)

    def add_open_listener(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(addr)`` (synchronously) whenever a new connection to ``addr`` is established: the peer
        is reachable again (the client instance stops avoiding it for reads and offsets at once)."""
        self._open_listeners.append(listener)

    def _connection_closed(self, addr: str) -> None:
        _notify(self._close_listeners, addr, "connection.close_listener_failed")

    def register_handler(self, code: int, handler: ServerRequestHandler) -> None:
        """Handle requests the server pushes to us with ``code``: ``handler(cmd, addr) -> response | None``."""
        self._handlers[int(code)] = handler

    @property
    def connected_addresses(self) -> list[str]:
        return list(self._channels)

    async def _channel(self, addr: str) -> _Channel:
        if self._closed or self._nursery is None:
            raise RemotingClosedError("the remoting client is closed (use it inside `async with`)")
        ch = self._channels.get(addr)
        if ch is not None and not ch.closed:
            return ch
        lock = self._connecting.setdefault(addr, trio.Lock())
        async with lock:
            ch = self._channels.get(addr)
            if ch is not None and not ch.closed:
                return ch
            host, port = parse_address(addr)
            try:
                with trio.fail_after(self.connect_timeout_s):
                    tcp = await trio.open_tcp_stream(host, port)
                    stream: trio.abc.Stream = tcp
                    _nodelay(tcp)
                    if self.ssl_context is not None:
                        tls = trio.SSLStream(tcp, self.ssl_context, server_hostname=host)
                        await tls.do_handshake()
                        stream = tls
            except trio.TooSlowError:
                raise RemotingConnectError(f"connecting to {addr} timed out after {self.connect_timeout_s}s") from None
            except (OSError, trio.BrokenResourceError, ssl.SSLError) as exc:
                # trio wraps a failed TLS handshake in an empty BrokenResourceError: report the SSL error
                raise RemotingConnectError(f"cannot connect to {addr}: {connect_error_text(exc)}") from None
            ch = _Channel(self, addr, stream)
            self._channels[addr] = ch
            self._nursery.start_soon(self._run_channel, ch)
            _notify(self._open_listeners, addr, "connection.open_listener_failed")
            return ch

    async def _run_channel(self, ch: _Channel) -> None:
        try:
            assert self._nursery is not None
            await ch.run(self._nursery)
        finally:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(ch.stream)

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout_s: float | None = None) -> RemotingCommand:
        """Send a request and wait for its response.

        Raises RemotingTimeoutError, RemotingConnectError (connect failed or connection lost meanwhile).
        The response may carry any response code; checking it is the caller's business.
        """
        timeout = self.default_timeout_s if timeout_s is None else timeout_s
        ch = self._channels.get(addr)
        if ch is None or ch.closed or self._closed:
            ch = await self._channel(addr)
        opaque = next(self._opaques)
        cmd.opaque = opaque
        waiter = _Pending()
        ch.pending[opaque] = waiter
        try:
            if self.credentials is not None:
                sign_command(cmd, *self.credentials)  # ACL: docs/SECURITY.md
            ch.send_frame(encode_frame(cmd, self.max_frame_bytes))
            with trio.move_on_after(timeout) as scope:
                resp = await waiter.wait()
                if resp is None:
                    raise RemotingConnectError(f"connection to {addr} lost while waiting for "
                                               f"{code_name(cmd.code, response=False)}: {ch.close_reason}")
                return resp
            assert scope.cancelled_caught
            raise RemotingTimeoutError(
                f"{code_name(cmd.code, response=False)} to {addr} got no response within {timeout}s"
            )
        finally:
            ch.pending.pop(opaque, None)

    async def invoke_many(self, addr: str, cmds: list[RemotingCommand], timeout_s: float | None = None
                          ) -> list[RemotingCommand | RemotingError]:
        """Pipeline requests to one address: all frames go out in one write, then every response is awaited
        (one timeout for the lot). Returns, in request order, each response or the RemotingError of a request
        that got none (timeout, connection lost); raises RemotingConnectError when the connection cannot be
        made at all."""
        timeout = self.default_timeout_s if timeout_s is None else timeout_s
        ch = self._channels.get(addr)
        if ch is None or ch.closed or self._closed:
            ch = await self._channel(addr)
        waiters: list[tuple[int, _Pending]] = []
        frames = []
        try:
            for cmd in cmds:
                opaque = next(self._opaques)
                cmd.opaque = opaque
                waiter = _Pending()
                ch.pending[opaque] = waiter
                waiters.append((opaque, waiter))
                if self.credentials is not None:
                    sign_command(cmd, *self.credentials)  # ACL: docs/SECURITY.md
                frames.append(encode_frame(cmd, self.max_frame_bytes))
            ch.send_frame(b"".join(frames))
            with trio.move_on_after(timeout):
                for _, waiter in waiters:
                    if waiter.response is None and not waiter.closed:
                        await waiter.wait()
            out: list[RemotingCommand | RemotingError] = []
            for cmd, (_, waiter) in zip(cmds, waiters, strict=True):
                what = code_name(cmd.code, response=False)
                if waiter.response is not None:
                    out.append(waiter.response)
                elif waiter.closed:
                    out.append(RemotingConnectError(f"connection to {addr} lost while waiting for {what}: "
                                                    f"{ch.close_reason}"))
                else:
                    out.append(RemotingTimeoutError(f"{what} to {addr} got no response within {timeout}s"))
            return out
        finally:
            for opaque, _ in waiters:
                ch.pending.pop(opaque, None)

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand) -> None:
        """Send a request that expects no response."""
        ch = await self._channel(addr)
        cmd.opaque = next(self._opaques)
        cmd.flag |= 2
        if self.credentials is not None:
            sign_command(cmd, *self.credentials)  # ACL: docs/SECURITY.md
        ch.send_frame(encode_frame(cmd, self.max_frame_bytes))

    def close_address(self, addr: str) -> None:
        """Drop the connection to ``addr`` (pending requests fail); the next call reconnects."""
        ch = self._channels.get(addr)
        if ch is not None:
            ch.close()


def _notify(listeners: list[Callable[[str], None]], addr: str, failed_event: str) -> None:
    # A listener's error is logged, never raised into the transport (the other listeners still run).
    for listener in list(listeners):
        try:
            listener(addr)
        except Exception:
            log.exception(failed_event, addr=addr)


def connect_error_text(exc: BaseException) -> str:
    """Why a connection could not be made, in the system's words. trio's "all attempts to connect to H:P failed"
    keeps each address's reason ("Connection refused", ...) in its cause, and a failed TLS handshake is an empty
    BrokenResourceError whose cause is the SSL error."""
    cause = exc.__cause__
    if isinstance(cause, BaseExceptionGroup):
        reasons = dict.fromkeys(
            os.strerror(e.errno) if isinstance(e, OSError) and e.errno else str(e) or repr(e) for e in cause.exceptions)
        return "; ".join(reasons)
    return str(exc) or repr(cause)


def _nodelay(stream: trio.SocketStream) -> None:
    import socket

    try:
        stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass


__all__ = [
    "RemotingClient",
    "RemotingClosedError",
    "RemotingConnectError",
    "RemotingError",
    "RemotingTimeoutError",
    "ServerRequestHandler",
    "connect_error_text",
]
