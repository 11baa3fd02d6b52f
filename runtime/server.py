"""The trio TCP server every trimq daemon uses: frames in, handlers by request code, frames out.

One task reads each connection and starts a task per request, so a slow request (a long-polling pull, a
SYNC_FLUSH send waiting for its fsync) never holds up the others and responses may go out of order.
Handlers registered with ``inline=True`` (cheap ones that never wait long: an ASYNC_FLUSH send, a heartbeat,
offsets, locks) run in the reading task instead, which saves a task per request; a handler with a
``fast_path`` runs it inline first and falls back to a task only when the fast path cannot answer (a pull
finds messages at once; only a pull that has to be held gets a task). Outgoing frames are queued per
connection and written by one writer task, which joins everything queued into one ``send_all``: a
pipelining client gets many responses per system call.

Bounds that keep a misbehaving peer from hurting others: at most ``max_connections`` connections; per
connection at most ``max_inflight_requests`` requests being handled (the reader stops reading until one
finishes, so TCP pushes back on the sender) and at most ``max_pending_write_bytes`` of unsent responses
(handlers wait for the peer to read). A malformed frame closes only that connection. Every request's numeric
fields are range-checked (protocol/fields.py) before its handler runs. Whatever a handler raises, and whatever
its answer holds, the peer gets an answer of bounded size (remarks are cut to ``MAX_REMARK_CHARS``; an answer
that cannot be encoded becomes SYSTEM_ERROR) and the server keeps running. A connection on which no frame
arrives for ``max_idle_s`` is closed (RocketMQ's ``serverChannelMaxIdleTimeSeconds``), and so is one whose
answers make no progress for ``write_stall_timeout_s`` (a peer that does not read).

Flow control (docs/PROTOCOL.md §2): a response whose body is larger than ``busy_body_bytes`` (a pull's
records) is replaced by a bodiless SYSTEM_BUSY, RocketMQ's flow-control code, when queueing it would take
its connection past ``max_pending_write_bytes`` unsent, or the whole server past
``max_total_pending_write_bytes`` while that peer is itself behind. Every other frame, however small, counts
against the same two budgets: it waits, before it is encoded, while its connection has more than
``max_pending_write_bytes`` unsent or while the server has more than ``max_total_pending_write_bytes``
unsent and this peer is itself behind (``busy_body_bytes`` or more unsent); a connection in that state is
*paused* (its requests are not read). So all peers that never read together cost the broker about
``max_total_pending_write_bytes`` plus ``busy_body_bytes`` and a frame each, and peers that read keep being
served; a paused peer whose answers make no progress is closed after ``write_stall_timeout_s``.
"""

from __future__ import annotations

import itertools
import ssl
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from trimq.protocol.address import format_address
from trimq.protocol.codes import ResponseCode, code_name
from trimq.protocol.command import FLAG_ONEWAY, FLAG_RESPONSE, RemotingCommand
from trimq.protocol.errors import ProtocolError, RequestError
from trimq.protocol.fields import check_field_ranges
from trimq.protocol.frame import DEFAULT_MAX_FRAME_BYTES, FrameDecoder, encode_frame
from trimq.runtime.daemon import listen_tcp
from trimq.runtime.logs import RateLimiter, get_logger, log_rate_limited
from trimq.runtime.tls import tls_listeners

log = get_logger("trimq.server")

Handler = Callable[[RemotingCommand, "Connection"], Awaitable[RemotingCommand | None]]


class Deferred:
    """What a fast path returns when it took charge of the request and will answer it later through
    :meth:`Connection.answer_deferred` (a held pull answered when a message arrives)."""

    __slots__ = ()


DEFERRED = Deferred()

# A synchronous first try at a request: its response, DEFERRED, or None when the full (async) handler must run.
FastPath = Callable[[RemotingCommand, "Connection"], "RemotingCommand | Deferred | None"]
# Runs before the handler; returns None to allow, or the NO_PERMISSION remark saying what is missing.
Authorizer = Callable[[RemotingCommand, "Connection"], "str | None"]
RECEIVE_CHUNK_BYTES = 256 * 1024
FEED_SLICE_BYTES = 16 * 1024  # a large read is decoded this much at a time (see Connection._read_loop)
WRITE_BATCH_BYTES = 1024 * 1024  # frames joined into one send_all at most (a copy)
# Frames smaller than this are appended to a shared buffer instead of queued one by one: a queued bytes object
# costs ~40 bytes beyond its length, which for small answers (a PULL_NOT_FOUND is ~100 bytes) would make the
# memory of unsent answers nearly twice what the budgets count.
SMALL_FRAME_BYTES = 4096
COALESCE_BYTES = 64 * 1024
MAX_REMARK_CHARS = 512
"""Longest remark an answer carries; longer ones (a remark that echoes a multi-MB field) are cut."""


def bounded_remark(remark: str, limit: int = MAX_REMARK_CHARS) -> str:
    """``remark`` cut to ``limit`` characters, saying how much was left out (an answer's remark may echo a
    field of any size; the answer must stay small)."""
    if len(remark) <= limit:
        return remark
    return f"{remark[:limit]}... ({len(remark) - limit} more characters)"


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
        self._out: list[bytes | bytearray] = []
        self._out_bytes = 0
        self._writer_wakeup = trio.lowlevel.ParkingLot()
        self._space_available = trio.lowlevel.ParkingLot()
        self._inflight = trio.Semaphore(server.max_inflight_requests)
        self._pending: dict[int, trio.MemorySendChannel[RemotingCommand]] = {}
        self._opaques = itertools.count(1)
        self._handlers_nursery: trio.Nursery | None = None
        self.deferred = 0  # requests a fast path took charge of, not answered yet (see answer_deferred)
        self._deferred_lot = trio.lowlevel.ParkingLot()
        self.last_frame_at = trio.current_time()  # trio clock: when the last frame arrived (idle close)
        self.close_reason: str | None = None  # set when the server closes it (idle, write_stalled, ...)

    def __repr__(self) -> str:
        return f"<Connection #{self.id} {self.remote}>"

    @property
    def pending_write_bytes(self) -> int:
        return self._out_bytes

    async def send(self, cmd: RemotingCommand) -> None:
        """Queue ``cmd`` for writing, with flow control (the module documentation, docs/PROTOCOL.md §2): a
        response with a large body to a peer that is behind becomes SYSTEM_BUSY at once; anything else waits
        while the peer has more than ``max_pending_write_bytes`` unread, *before* it is encoded.

        Small frames count against ``max_total_pending_write_bytes`` too: while the server is over it, a peer
        that is itself behind waits. Sending on a closed connection is a no-op: the peer is gone and nobody can
        get the frame. A response is always sent in some form (see :meth:`_encode`); a server-initiated request
        that cannot be encoded raises.
        """
        cmd = self._flow_control(cmd)
        if self._out_bytes and self._over_budget():
            await self._wait_for_space()
        if self.closed:
            return
        data = self._encode(cmd)
        if data is not None:
            self._queue(data)

    def send_nowait(self, cmd: RemotingCommand) -> None:
        """Queue ``cmd`` for writing without waiting for the peer to read (the caller bounds how much it sends
        this way: one answer per request the peer made; a large body to a peer that is behind still becomes
        SYSTEM_BUSY). A no-op on a closed connection."""
        if self.closed:
            return
        data = self._encode(self._flow_control(cmd))
        if data is not None:
            self._queue(data)

    def _encode(self, cmd: RemotingCommand) -> bytes | None:
        """The frame of ``cmd``. A response's remark is cut to MAX_REMARK_CHARS, and a response that cannot be
        encoded (over ``max_frame_bytes``, or holding a value msgpack cannot carry) becomes a bodiless
        SYSTEM_ERROR saying why (RocketMQ answers SYSTEM_ERROR to any Throwable); if even that fails, the
        connection is closed and None returned. Never raises for a response: the answer path must not stop the
        server."""
        server = self.server
        if not cmd.flag & FLAG_RESPONSE:
            return encode_frame(cmd, server.max_frame_bytes)  # our own request: the caller's error
        remark = cmd.remark
        if remark is not None and len(remark) > MAX_REMARK_CHARS:
            cmd = RemotingCommand(cmd.code, cmd.opaque, cmd.flag, cmd.version, bounded_remark(remark), cmd.ext,
                                  cmd.body)
        try:
            return encode_frame(cmd, server.max_frame_bytes)
        except Exception as exc:  # FrameTooLargeError, msgpack's TypeError/OverflowError/ValueError, ...
            error = bounded_remark(f"{type(exc).__name__}: {exc}", 200)
            server.encode_errors += 1
            log_rate_limited(server.warn_limiter, "connection.encode_failed", _mono_ms(), log.error,
                             "connection.encode_failed", server=server.name, remote=self.remote, conn=self.id,
                             response_code=code_name(cmd.code, response=True), error=error,
                             encode_errors=server.encode_errors)
            try:
                return encode_frame(RemotingCommand(
                    code=int(ResponseCode.SYSTEM_ERROR), opaque=cmd.opaque, flag=cmd.flag,
                    remark=f"the answer could not be encoded: {error}"), server.max_frame_bytes)
            except Exception:
                self.abort("encode_failed")
                return None

    def _over_budget(self) -> bool:
        """True while this connection must not queue more (docs/PROTOCOL.md §2): it has more than
        ``max_pending_write_bytes`` unsent, or the server has more than ``max_total_pending_write_bytes``
        unsent and this peer is itself behind (``busy_body_bytes`` or more unsent)."""
        out = self._out_bytes
        server = self.server
        return out > server.max_pending_write_bytes or (
            server.pending_write_bytes > server.max_total_pending_write_bytes and out >= server.busy_body_bytes
            and out > 0)

    async def _wait_for_space(self) -> None:
        """Wait until :meth:`_over_budget` is False or the connection closed (this connection is paused)."""
        server = self.server
        while not self.closed and self._over_budget():
            server._paused.add(self)  # woken when the server drops below its budget (RemotingServer._release)
            await self._space_available.park()

    def abort(self, reason: str) -> None:
        """Close this connection now (from any task): queued answers are dropped, handlers cancelled, the
        close callbacks run. ``reason`` (e.g. ``idle``, ``write_stalled``) is logged with the close."""
        if self.close_reason is None:
            self.close_reason = reason
        self._mark_closed()
        scope = self.server._read_scopes.get(self.id)
        if scope is not None:
            scope.cancel()

    def _flow_control(self, cmd: RemotingCommand) -> RemotingCommand:
        """``cmd``, or a bodiless SYSTEM_BUSY answer in its place when it is a response whose body exceeds
        ``busy_body_bytes`` and would take this connection past ``max_pending_write_bytes`` unsent, or the
        server past ``max_total_pending_write_bytes`` while this peer is itself behind. Dropping the body at
        once is what bounds memory: up to ``max_inflight_requests`` handlers per connection could otherwise
        each hold one while waiting for a peer that never reads."""
        body = cmd.body
        if not cmd.flag & FLAG_RESPONSE or not isinstance(body, bytes | bytearray | memoryview):
            return cmd
        size = len(body)
        server = self.server
        if size <= server.busy_body_bytes:
            return cmd
        if self._out_bytes + size <= server.max_pending_write_bytes and (
                server.pending_write_bytes + size <= server.max_total_pending_write_bytes
                or self._out_bytes < server.busy_body_bytes):
            return cmd
        server.flow_control_rejections += 1
        log_rate_limited(server.warn_limiter, "connection.flow_control", _mono_ms(), log.warning,
                         "connection.flow_control", server=server.name, remote=self.remote, conn=self.id,
                         pending_bytes=self._out_bytes, total_pending_bytes=server.pending_write_bytes,
                         dropped_body_bytes=size, rejections=server.flow_control_rejections)
        return RemotingCommand(code=int(ResponseCode.SYSTEM_BUSY), opaque=cmd.opaque, flag=cmd.flag,
                               remark=f"[FLOW_CONTROL] {self._out_bytes} bytes of earlier responses not read yet; "
                                      "try again later")

    def _queue(self, data: bytes) -> None:
        out = self._out
        size = len(data)
        if size < SMALL_FRAME_BYTES:
            # The writer takes whole list items before it awaits, so the last item is never being written.
            last = out[-1] if out else None
            if type(last) is bytearray and len(last) < COALESCE_BYTES:
                last += data
            else:
                out.append(bytearray(data))
        else:
            out.append(data)
        self._out_bytes += size
        server = self.server
        server.pending_write_bytes += size
        if server.pending_write_bytes > server.peak_pending_write_bytes:
            server.peak_pending_write_bytes = server.pending_write_bytes
        self._writer_wakeup.unpark_all()

    def defer(self) -> None:
        """A fast path took charge of a request and will answer it later (:meth:`answer_deferred`, or
        :meth:`drop_deferred` when it gives up); a graceful stop waits for those answers."""
        self.deferred += 1

    def answer_deferred(self, cmd: RemotingCommand) -> None:
        """Send the late answer to a deferred request (its opaque already set)."""
        self.send_nowait(cmd)
        self.drop_deferred()

    def drop_deferred(self) -> None:
        if self.deferred > 0:
            self.deferred -= 1
        if not self.deferred:
            self._deferred_lot.unpark_all()

    async def _wait_deferred(self) -> None:
        while self.deferred and not self.closed:
            await self._deferred_lot.park()

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
        server = self.server
        stall_s = server.write_stall_timeout_s
        try:
            while True:
                if not self._out:
                    await self._writer_wakeup.park()
                    continue
                out = self._out
                size, n = len(out[0]), 1
                while n < len(out) and size < WRITE_BATCH_BYTES:  # bounded: the join below is a copy
                    size += len(out[n])
                    n += 1
                chunks, self._out = (out, []) if n == len(out) else (out[:n], out[n:])
                data = chunks[0] if n == 1 else b"".join(chunks)
                if stall_s > 0:
                    # A peer that does not read fills the socket buffers, then this write stops progressing:
                    # the connection is paused (see _over_budget) and, after write_stall_timeout_s, closed.
                    with trio.move_on_after(stall_s) as stalled:
                        await self.stream.send_all(data)
                    if stalled.cancelled_caught:
                        server.stalled_closed += 1
                        log_rate_limited(server.warn_limiter, "connection.write_stalled", _mono_ms(), log.warning,
                                         "connection.write_stalled", server=server.name, remote=self.remote,
                                         conn=self.id, pending_bytes=self._out_bytes, timeout_s=stall_s,
                                         closed_total=server.stalled_closed)
                        self.abort("write_stalled")
                        return
                else:
                    await self.stream.send_all(data)
                if not self.closed:  # else _mark_closed already took everything off the counts
                    self._out_bytes -= size
                    server._release(size)
                self._space_available.unpark_all()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._mark_closed()

    async def _idle_watchdog(self, max_idle_s: float) -> None:
        """Close the connection once no frame has arrived for ``max_idle_s`` (RocketMQ closes a channel idle for
        ``serverChannelMaxIdleTimeSeconds``); clients heartbeat every 30 s, so only dead or silent peers go."""
        server = self.server
        while True:
            deadline = self.last_frame_at + max_idle_s
            if trio.current_time() >= deadline:
                server.idle_closed += 1
                log_rate_limited(server.warn_limiter, "connection.idle", _mono_ms(), log.info, "connection.idle",
                                 server=server.name, remote=self.remote, conn=self.id, idle_s=max_idle_s,
                                 closed_total=server.idle_closed)
                self.abort("idle")
                return
            await trio.sleep_until(deadline)

    async def _flush(self) -> None:
        """Wait until every queued frame was written (or the connection broke)."""
        while self._out_bytes > 0 and not self.closed:
            await self._space_available.park()

    def _mark_closed(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._out.clear()
        self.server._paused.discard(self)
        self.server._release(self._out_bytes)
        self._out_bytes = 0
        self._space_available.unpark_all()
        self._deferred_lot.unpark_all()
        for ch in self._pending.values():
            ch.close()

    async def _read_loop(self, handlers: trio.Nursery) -> str:
        """Read until EOF, a malformed frame or cancellation; returns why it stopped."""
        decoder = FrameDecoder(self.server.max_frame_bytes)
        while True:
            if self._out_bytes and self._over_budget():
                await self._wait_for_space()  # paused: read nothing more until the peer reads its answers
                if self.closed:
                    return "closed"
            try:
                data = await self.stream.receive_some(RECEIVE_CHUNK_BYTES)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return "broken"
            if not data:
                return "eof"
            if len(data) <= FEED_SLICE_BYTES:
                stop = await self._process(decoder, data, handlers)
                if stop is not None:
                    return stop
                continue
            # Decoded requests cost several times their bytes: decode a big read in slices and stop between
            # them when this peer falls behind, so a paused peer holds at most a slice of decoded requests.
            view = memoryview(data)
            for start in range(0, len(data), FEED_SLICE_BYTES):
                if start and self._out_bytes and self._over_budget():
                    await self._wait_for_space()
                    if self.closed:
                        return "closed"
                stop = await self._process(decoder, view[start:start + FEED_SLICE_BYTES], handlers)
                if stop is not None:
                    return stop

    async def _process(self, decoder: FrameDecoder, data: bytes | bytearray | memoryview,
                       handlers: trio.Nursery) -> str | None:
        """Decode ``data`` and handle the requests it completes; "protocol_error" when it is malformed."""
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
        if not cmds:
            return None
        self.last_frame_at = trio.current_time()
        server = self.server
        inline = server._inline
        fast_paths = server._fast_paths
        for cmd in cmds:
            if cmd.flag & FLAG_RESPONSE:
                ch = self._pending.get(cmd.opaque)
                if ch is not None:
                    try:
                        ch.send_nowait(cmd)
                    except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                        pass  # a second answer to the same request: the first one counts
                continue
            code = cmd.code
            out_of_range = check_field_ranges(code, cmd.ext, cmd.body)
            if out_of_range is not None:
                await self._refuse_out_of_range(cmd, out_of_range)
                continue
            if code in inline:
                await self._dispatch(cmd)
                continue
            fast = fast_paths.get(code)
            if fast is not None and await self._try_fast(cmd, fast):
                continue
            await self._inflight.acquire()
            handlers.start_soon(self._handle, cmd)
        return None

    async def _refuse_out_of_range(self, cmd: RemotingCommand, remark: str) -> None:
        """A request with a number outside its Java type's range (protocol/fields.py) never reaches its handler:
        SYSTEM_ERROR naming the field, value and range; a oneway one is dropped, counted and logged."""
        server = self.server
        oneway = bool(cmd.flag & FLAG_ONEWAY)
        server.field_range_errors[oneway] += 1
        log_rate_limited(server.warn_limiter, "request.field_out_of_range", _mono_ms(), log.warning,
                         "request.field_out_of_range", server=server.name, remote=self.remote, conn=self.id,
                         code=code_name(cmd.code, response=False), oneway=oneway, error=remark,
                         refused_total=sum(server.field_range_errors.values()))
        if server.observe is not None:
            server.observe(cmd.code, int(ResponseCode.SYSTEM_ERROR), 0.0)
        if not oneway:
            await self.send(RemotingCommand.response_to(cmd, ResponseCode.SYSTEM_ERROR, remark))

    async def _try_fast(self, cmd: RemotingCommand, fast: FastPath) -> bool:
        """Run a handler's synchronous fast path in the reading task; True when it answered the request."""
        server = self.server
        if server.authorizer is not None:
            return False  # the full path checks permissions first
        started = time.perf_counter()
        try:
            resp = fast(cmd, self)
        except Exception:
            return False  # let the full handler produce the proper error response
        if resp is None:
            return False
        if resp is DEFERRED:
            return True  # answered later through answer_deferred
        assert isinstance(resp, RemotingCommand)
        if server.observe is not None:
            server.observe(cmd.code, resp.code, time.perf_counter() - started)
        if not cmd.flag & FLAG_ONEWAY:
            resp.opaque = cmd.opaque
            await self.send(resp)
        return True

    async def _handle(self, cmd: RemotingCommand) -> None:
        try:
            await self._dispatch(cmd)
        finally:
            self._inflight.release()

    async def _dispatch(self, cmd: RemotingCommand) -> None:
        """Authorize, run the handler, answer (errors become SYSTEM_ERROR responses)."""
        server = self.server
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
                # The message may echo a field of any size: cut it for the log line and the answer alike.
                error = bounded_remark(f"{type(exc).__name__}: {exc}")
                server.handler_errors += 1
                log_rate_limited(server.warn_limiter, ("request.failed", cmd.code), _mono_ms(), log.error,
                                 "request.failed", server=server.name, code=code_name(cmd.code, response=False),
                                 remote=self.remote, error=error,
                                 traceback=bounded_remark("".join(traceback.format_tb(exc.__traceback__)), 4000),
                                 handler_errors=server.handler_errors)
                resp = RemotingCommand.response_to(cmd, ResponseCode.SYSTEM_ERROR, error)
        if server.observe is not None:
            server.observe(cmd.code, resp.code if resp is not None else 0, time.perf_counter() - started)
        if resp is not None and not cmd.flag & FLAG_ONEWAY:
            resp.opaque = cmd.opaque
            await self.send(resp)

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
        max_total_pending_write_bytes: int = 256 * 1024 * 1024,
        busy_body_bytes: int = 16 * 1024,
        shutdown_grace_s: float = 5.0,
        authorizer: Authorizer | None = None,
        max_idle_s: float = 0.0,
        write_stall_timeout_s: float = 0.0,
    ) -> None:
        """``max_idle_s``: close a connection on which no frame arrived for this long; ``write_stall_timeout_s``:
        close one whose answers make no progress this long (the peer does not read). 0 turns either off."""
        self.name = name
        self.authorizer = authorizer
        self.max_frame_bytes = max_frame_bytes
        self.max_connections = max_connections
        self.max_inflight_requests = max_inflight_requests
        self.max_pending_write_bytes = max_pending_write_bytes
        self.max_total_pending_write_bytes = max_total_pending_write_bytes
        self.busy_body_bytes = busy_body_bytes
        self.pending_write_bytes = 0  # unsent bytes of every connection
        self.peak_pending_write_bytes = 0  # the most pending_write_bytes has been (a high-water mark)
        self.flow_control_rejections = 0  # responses replaced by SYSTEM_BUSY (Connection._flow_control)
        self.max_idle_s = max_idle_s
        self.write_stall_timeout_s = write_stall_timeout_s
        self.idle_closed = 0  # connections closed for max_idle_s without a frame
        self.stalled_closed = 0  # connections closed for write_stall_timeout_s without write progress
        self.encode_errors = 0  # answers that could not be encoded (replaced by SYSTEM_ERROR)
        self.handler_errors = 0  # handlers that raised something other than RequestError
        self.field_range_errors = {False: 0, True: 0}  # requests refused by protocol.fields, by oneway
        self._paused: set[Connection] = set()  # connections waiting for the server to drop below its budget
        self.shutdown_grace_s = shutdown_grace_s
        self.handlers: dict[int, Handler] = {}
        self._inline: set[int] = set()  # codes whose handlers run in the reading task
        self._fast_paths: dict[int, FastPath] = {}
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
        self._listening = False  # serve_listeners is accepting (``serving``)
        self._read_scopes: dict[int, trio.CancelScope] = {}

    def _release(self, n: int) -> None:
        """``n`` unsent bytes were written or dropped; wake paused connections once under the budget."""
        self.pending_write_bytes -= n
        if self._paused and self.pending_write_bytes <= self.max_total_pending_write_bytes:
            paused, self._paused = self._paused, set()
            for conn in paused:
                conn._space_available.unpark_all()

    def _authorize(self, cmd: RemotingCommand, conn: Connection) -> str | None:
        """Run the authorizer; a failing one refuses the request (fail closed) rather than crash it."""
        assert self.authorizer is not None
        try:
            return self.authorizer(cmd, conn)
        except Exception as exc:
            log.exception("request.authorizer_failed", code=code_name(cmd.code, response=False), remote=conn.remote)
            return f"permission check failed: {type(exc).__name__}: {exc}"

    def register(self, code: int, handler: Handler, *, inline: bool = False,
                 fast_path: FastPath | None = None) -> None:
        """Route requests with ``code`` to ``handler``; the last registration for a code wins.

        ``inline=True`` runs the handler in the connection's reading task instead of a task of its own: only
        for handlers that never wait long (a wait stalls every later request of that connection; a shutdown
        may cancel one at an ``await``). ``fast_path(cmd, conn)`` is a synchronous first try run inline: its
        response is sent at once, and only when it returns None does ``handler`` run in a task. It must
        leave no trace when it returns None or raises (the handler then answers, errors included), and is
        skipped when an authorizer is set.
        """
        code = int(code)
        self.handlers[code] = handler
        if inline:
            self._inline.add(code)
        else:
            self._inline.discard(code)
        if fast_path is not None:
            self._fast_paths[code] = fast_path
        else:
            self._fast_paths.pop(code, None)

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

    @property
    def serving(self) -> bool:
        """True while requests are served: the listeners are open and no graceful stop has begun (``/healthz``)."""
        return self._listening and not self._shutdown.is_set()

    async def wait_shutdown(self) -> None:
        """Return when a graceful stop begins: services answer held requests and unregister then, so the
        drain is quick."""
        await self._shutdown.wait()

    async def serve(
        self, host: str, port: int, *, task_status: trio.TaskStatus[list[tuple[str, int]]] = trio.TASK_STATUS_IGNORED,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """Listen on ``host:port`` (TLS with ``ssl_context``) and serve until ``shutdown()`` or cancellation."""
        listeners = await listen_tcp(host, port)
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
                self._listening = True
                try:
                    task_status.started(self.addresses)
                    await self._shutdown.wait()
                finally:
                    self._listening = False
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
                if self.max_idle_s > 0:
                    nursery.start_soon(conn._idle_watchdog, self.max_idle_s)
                async with trio.open_nursery() as handlers:
                    with trio.CancelScope() as read_scope:
                        self._read_scopes[conn.id] = read_scope
                        if self._shutdown.is_set():
                            read_scope.cancel()
                        reason = await conn._read_loop(handlers)
                    self._read_scopes.pop(conn.id, None)
                    if conn.close_reason is not None:  # closed by the server (Connection.abort)
                        reason = conn.close_reason
                        self._fire_closed(conn)
                        handlers.cancel_scope.cancel()
                    elif read_scope.cancelled_caught:
                        reason = "shutdown"  # let in-flight requests finish; the drain bound cuts them off
                        await conn._wait_deferred()
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


__all__ = ["DEFERRED", "MAX_REMARK_CHARS", "Authorizer", "Connection", "ConnectionClosedError", "Deferred",
           "FastPath", "Handler", "RemotingServer", "bounded_remark"]
