"""Outbound request/response connections from the broker to its peers (name servers).

The broker must not import ``client/``; this is the small part it needs: one persistent connection per
address (the name server drops a broker whose registration connection closes, so the connection is kept),
requests matched to responses by opaque, reconnect on the next request after a failure.
"""

from __future__ import annotations

import itertools
import ssl
from types import TracebackType

import trio

from trimq.protocol.address import parse_address
from trimq.protocol.command import RemotingCommand
from trimq.protocol.errors import ProtocolError
from trimq.protocol.frame import DEFAULT_MAX_FRAME_BYTES, FrameDecoder, encode_frame
from trimq.protocol.logs import get_logger

log = get_logger("trimq.outbound")

__all__ = ["OutboundClient", "OutboundError"]


class OutboundError(Exception):
    """Could not connect, the connection broke, or no response came in time."""


class _Conn:
    def __init__(self, addr: str, stream: trio.abc.Stream) -> None:
        self.addr = addr
        self.stream = stream
        self.pending: dict[int, trio.MemorySendChannel[RemotingCommand]] = {}
        self.send_lock = trio.Lock()
        self.closed = False
        self.scope = trio.CancelScope()

    def close(self) -> None:
        self.closed = True
        self.scope.cancel()
        for ch in self.pending.values():
            ch.close()
        self.pending.clear()


class OutboundClient:
    """``async with OutboundClient() as oc: resp = await oc.request(addr, cmd, timeout_s=3)``."""

    def __init__(self, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, connect_timeout_s: float = 3.0,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        """``ssl_context``: talk TLS (e.g. to name servers serving TLS)."""
        self.ssl_context = ssl_context
        self.max_frame_bytes = max_frame_bytes
        self.connect_timeout_s = connect_timeout_s
        self._conns: dict[str, _Conn] = {}
        self._locks: dict[str, trio.Lock] = {}
        self._opaques = itertools.count(1)
        self._nursery: trio.Nursery | None = None
        self._cm: trio.Nursery | None = None

    async def __aenter__(self) -> OutboundClient:
        self._nursery_cm = trio.open_nursery()
        self._nursery = await self._nursery_cm.__aenter__()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool | None:
        for conn in list(self._conns.values()):
            conn.close()
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()
        return await self._nursery_cm.__aexit__(exc_type, exc, tb)

    def close(self, addr: str) -> None:
        conn = self._conns.pop(addr, None)
        if conn is not None:
            conn.close()

    async def _connect(self, addr: str) -> _Conn:
        conn = self._conns.get(addr)
        if conn is not None and not conn.closed:
            return conn
        lock = self._locks.setdefault(addr, trio.Lock())
        async with lock:
            conn = self._conns.get(addr)
            if conn is not None and not conn.closed:
                return conn
            host, port = parse_address(addr)
            stream: trio.abc.Stream
            try:
                with trio.fail_after(self.connect_timeout_s):
                    stream = await trio.open_tcp_stream(host, port)
                    if self.ssl_context is not None:
                        tls = trio.SSLStream(stream, self.ssl_context, server_hostname=host)
                        await tls.do_handshake()
                        stream = tls
            except (OSError, trio.TooSlowError, trio.BrokenResourceError, ssl.SSLError) as exc:
                detail = str(exc) or repr(exc.__cause__) if exc.__cause__ else str(exc) or "timed out"
                raise OutboundError(f"cannot connect to {addr}: {detail}") from None
            conn = _Conn(addr, stream)
            self._conns[addr] = conn
            assert self._nursery is not None
            self._nursery.start_soon(self._reader, conn)
            return conn

    async def _reader(self, conn: _Conn) -> None:
        decoder = FrameDecoder(self.max_frame_bytes)
        with conn.scope:
            try:
                while True:
                    data = await conn.stream.receive_some(65536)
                    if not data:
                        break
                    for cmd in decoder.feed(data):
                        if cmd.is_response:
                            ch = conn.pending.pop(cmd.opaque, None)
                            if ch is not None:
                                ch.send_nowait(cmd)
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, ProtocolError) as exc:
                log.info("outbound.connection_lost", addr=conn.addr, error=str(exc))
        conn.close()
        if self._conns.get(conn.addr) is conn:
            del self._conns[conn.addr]
        with trio.CancelScope(shield=True):
            await trio.aclose_forcefully(conn.stream)

    async def request(self, addr: str, cmd: RemotingCommand, timeout_s: float) -> RemotingCommand:
        """Send ``cmd`` to ``addr`` and wait for its response; OutboundError on any failure."""
        conn = await self._connect(addr)
        cmd.opaque = next(self._opaques)
        send, recv = trio.open_memory_channel[RemotingCommand](1)
        conn.pending[cmd.opaque] = send
        try:
            with trio.move_on_after(timeout_s) as scope:
                try:
                    async with conn.send_lock:
                        await conn.stream.send_all(encode_frame(cmd, self.max_frame_bytes))
                    return await recv.receive()
                except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, trio.EndOfChannel) as exc:
                    self.close(addr)
                    raise OutboundError(f"connection to {addr} failed: {exc or 'closed'}") from None
            assert scope.cancelled_caught
            raise OutboundError(f"no response from {addr} within {timeout_s}s")
        finally:
            conn.pending.pop(cmd.opaque, None)
