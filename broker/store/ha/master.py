"""The master's side of replication: the HA port, one connection per slave, and the SYNC_MASTER wait
(RocketMQ 4.9.3's ``HAService``, ``HAConnection`` and ``GroupTransferService``).

A slave connects, sends its handshake (codec.Hello); the master answers where it starts sending (a fresh slave:
the start of the master's last segment; otherwise the slave's max offset, cut back by the epoch history when
the slave comes from an older master epoch) and then streams the commit log in frames of at most
``batch_size`` bytes, never across a segment end, with an empty frame every ``heartbeat_interval_ms`` when
idle. The slave's 8-byte reports (its max offset) are its acknowledgements: ``push_slave_max_offset`` is the
best of them. No report for ``housekeeping_interval_ms`` closes the connection.

SYNC_MASTER (``wait_for_slave``): a send is acknowledged once a slave reported an offset at or past the end of
its bytes, within ``slave_timeout_ms`` (else FLUSH_SLAVE_TIMEOUT); with no slave connected, or the best one more
than ``fallbehind_max`` bytes behind, at once SLAVE_NOT_AVAILABLE. Every report releases every send it covers,
so one acknowledgement serves a whole batch of sends (group commit, as the SYNC_FLUSH fsync).
"""

from __future__ import annotations

import bisect
import itertools
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from trimq.broker.store.ha.codec import (
    HAProtocolError,
    HelloAck,
    StreamBuffer,
    encode_hello_ack,
    encode_transfer_header,
)
from trimq.broker.store.ha.history import HAState, truncation_point
from trimq.broker.store.store_base import PutMessageStatus
from trimq.runtime.daemon import listen_tcp
from trimq.runtime.logs import get_logger
from trimq.runtime.tls import tls_listeners

if TYPE_CHECKING:
    from trimq.broker.store.message_store import MessageStore

log = get_logger("trimq.ha")

__all__ = ["HAConnection", "HAService"]

_RECEIVE_BYTES = 64 * 1024


@dataclass(eq=False)
class HAConnection:
    """One connected slave."""

    remote: str
    start_offset: int = -1
    #: The slave's last report (-1: none yet); everything below it is on the slave.
    slave_ack_offset: int = -1
    #: Where the next frame starts.
    next_transfer_offset: int = -1
    last_read_time: float = 0.0
    cancel_scope: trio.CancelScope = field(default_factory=trio.CancelScope)


class HAService:
    """The master's replication service over ``store`` (see the module docstring).

    ``is_master`` says whether this broker may serve slaves now (a slave's HA port refuses handshakes),
    ``master_addr`` is the broker address a slave syncs its metadata from, ``broker_epoch`` the lock broker
    epoch a promoted slave must exceed. Times follow trio's clock (a MockClock in tests).
    """

    def __init__(self, store: MessageStore, state: HAState, *, host: str = "127.0.0.1", port: int = 0,
                 batch_size: int = 32 * 1024, heartbeat_interval_ms: int = 5_000,
                 housekeeping_interval_ms: int = 20_000, fallbehind_max: int = 256 * 1024 * 1024,
                 slave_timeout_ms: int = 3_000, is_master: Callable[[], bool] = lambda: True,
                 master_addr: Callable[[], str] = lambda: "", broker_epoch: Callable[[], int] = lambda: 0,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.store = store
        #: TLS of the HA port (the broker's own server context: the port carries every stored message)
        self.ssl_context = ssl_context
        self.state = state
        self.host = host
        self.port = port
        self.batch_size = batch_size
        self.heartbeat_interval_s = heartbeat_interval_ms / 1000
        self.housekeeping_interval_s = housekeeping_interval_ms / 1000
        self.fallbehind_max = fallbehind_max
        self.slave_timeout_s = slave_timeout_ms / 1000
        self.is_master = is_master
        self.master_addr = master_addr
        self.broker_epoch = broker_epoch
        self.connections: list[HAConnection] = []
        #: The best offset any slave reported (RocketMQ's push2SlaveMaxOffset); kept when slaves disconnect.
        self.push_slave_max_offset = 0
        self.bound = trio.Event()
        self._appended = trio.Event()
        self._waiters: list[tuple[int, int, trio.Event]] = []  # (offset, seq, event), ascending
        self._seq = itertools.count()
        # counters for metrics and tests
        self.sync_waits = 0  # sends that had to wait
        self.sync_ok = 0
        self.sync_timeouts = 0
        self.slave_not_available = 0
        store.arrival_listeners.append(self._on_append)

    # -- serving -----------------------------------------------------------------------------------------
    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on the HA port and serve slaves until cancelled."""
        tcp = await listen_tcp(self.host, self.port, "HA replication")
        self.port = tcp[0].socket.getsockname()[1]
        self.bound.set()
        log.info("ha.listening", host=self.host, port=self.port, tls=self.ssl_context is not None)
        task_status.started()
        listeners: list[Any] = tls_listeners(tcp, self.ssl_context) if self.ssl_context is not None else tcp
        await trio.serve_listeners(self._handle, listeners)

    @property
    def address(self) -> str:
        """``host:port`` of the HA port (valid once bound)."""
        return f"{self.host}:{self.port}"

    def close_connections(self) -> None:
        """Drop every slave connection (this broker stops being a master)."""
        for conn in list(self.connections):
            conn.cancel_scope.cancel()
        self._release_waiters()

    async def _handle(self, stream: trio.abc.Stream) -> None:
        tcp = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
        assert isinstance(tcp, trio.SocketStream)
        try:
            peer = tcp.socket.getpeername()
            remote = f"{peer[0]}:{peer[1]}"
        except OSError:
            remote = "?"
        conn = HAConnection(remote)
        with conn.cancel_scope:
            try:
                async with stream:
                    await self._serve_connection(conn, stream)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, HAProtocolError) as exc:
                log.warning("ha.slave_connection_failed", slave=remote, error=str(exc) or type(exc).__name__)
            except Exception:  # one slave's trouble must not stop the HA port
                log.exception("ha.slave_connection_crashed", slave=remote)
            finally:
                if conn in self.connections:
                    self.connections.remove(conn)
                    log.info("ha.slave_disconnected", slave=remote, acked_offset=conn.slave_ack_offset)
                    self._release_waiters()

    async def _serve_connection(self, conn: HAConnection, stream: trio.abc.Stream) -> None:
        buf = StreamBuffer()
        hello = None
        with trio.move_on_after(self.housekeeping_interval_s):
            while hello is None:
                data = await stream.receive_some(_RECEIVE_BYTES)
                if not data:
                    return
                buf.feed(data)
                hello = buf.next_hello()
        if hello is None:
            log.warning("ha.handshake_timeout", slave=conn.remote)
            return
        ack = self._answer(hello.master_epoch, hello.max_offset)
        await stream.send_all(encode_hello_ack(ack))
        if ack.refused:
            log.warning("ha.slave_refused", slave=conn.remote, reason=ack.remark)
            return
        conn.start_offset = conn.next_transfer_offset = ack.start_offset
        conn.last_read_time = trio.current_time()
        self.connections.append(conn)
        log.info("ha.slave_connected", slave=conn.remote, slave_max_offset=hello.max_offset,
                 slave_master_epoch=hello.master_epoch, start_offset=ack.start_offset,
                 master_max_offset=self.store.commitlog.max_offset)
        async with trio.open_nursery() as nursery:

            async def write() -> None:
                try:
                    await self._write_loop(conn, stream)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                    log.warning("ha.slave_write_failed", slave=conn.remote, error=str(exc) or type(exc).__name__)
                nursery.cancel_scope.cancel()  # either loop ending ends the connection

            nursery.start_soon(write)
            try:
                await self._read_loop(conn, stream, buf)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, HAProtocolError) as exc:
                log.warning("ha.slave_read_failed", slave=conn.remote, error=str(exc) or type(exc).__name__)
            nursery.cancel_scope.cancel()

    def _answer(self, slave_epoch: int, slave_max: int) -> HelloAck:
        cl = self.store.commitlog

        def ack(start: int, remark: str = "") -> HelloAck:
            return HelloAck(self.state.master_epoch, self.broker_epoch(), start, self.master_addr(), remark,
                            tuple(self.state.history))

        if not self.is_master():
            return ack(-1, "this broker is not a master")
        if slave_epoch > self.state.master_epoch:
            return ack(-1, f"the slave knows master epoch {slave_epoch}, newer than this master's "
                       f"{self.state.master_epoch}: this master was superseded")
        master_max = cl.max_offset
        if slave_max == 0:
            start = master_max - master_max % cl.segment_size  # RocketMQ: from the start of the last segment
        else:
            start = truncation_point(self.state.history, slave_epoch, slave_max, master_max)
        if start < cl.min_offset:
            return ack(-1, f"the slave's log ends at {start}, before this master's first offset {cl.min_offset}: "
                       "empty the slave's store to start it afresh")
        return ack(start)

    async def _read_loop(self, conn: HAConnection, stream: trio.abc.Stream, buf: StreamBuffer) -> None:
        while True:
            data: bytes | bytearray = b""
            with trio.move_on_after(self.housekeeping_interval_s):
                data = await stream.receive_some(_RECEIVE_BYTES)
                if not data:
                    return
            if not data:
                log.warning("ha.slave_silent", slave=conn.remote, after_ms=int(self.housekeeping_interval_s * 1000))
                return
            conn.last_read_time = trio.current_time()
            buf.feed(data)
            best = None
            while (offset := buf.next_offset_report()) is not None:
                best = offset
            if best is not None and best > self.store.commitlog.max_offset:
                # A slave holds only what this master sent it: believing more would let a SYNC_MASTER answer sends
                # as replicated that no slave has (and push_slave_max_offset never goes back).
                raise HAProtocolError(f"the slave reported offset {best}, past this master's log end "
                                      f"{self.store.commitlog.max_offset}")
            if best is not None:
                conn.slave_ack_offset = best
                if best > self.push_slave_max_offset:
                    self.push_slave_max_offset = best
                    self._release_waiters()

    async def _write_loop(self, conn: HAConnection, stream: trio.abc.Stream) -> None:
        cl = self.store.commitlog
        while True:
            appended = self._appended
            offset = conn.next_transfer_offset
            if offset < cl.max_offset:
                seg = cl.segment_for(offset)
                if seg is None:
                    log.error("ha.transfer_offset_gone", slave=conn.remote, offset=offset, min_offset=cl.min_offset)
                    return
                size = min(self.batch_size, min(seg.end, cl.max_offset) - offset)
                rel = offset - seg.start
                data = seg.mm[rel : rel + size]
                await stream.send_all(encode_transfer_header(offset, size) + data)
                conn.next_transfer_offset = offset + size
                continue
            with trio.move_on_after(self.heartbeat_interval_s) as idle:
                await appended.wait()
            if idle.cancelled_caught:
                await stream.send_all(encode_transfer_header(offset, 0))

    def _on_append(self, topic: str, queue_id: int, new_max: int) -> None:
        ev, self._appended = self._appended, trio.Event()
        ev.set()

    # -- SYNC_MASTER ----------------------------------------------------------------------------------------
    def is_slave_ok(self, master_put_offset: int) -> bool:
        """RocketMQ's ``isSlaveOK``: a slave is connected and not more than ``fallbehind_max`` bytes behind."""
        return bool(self.connections) and master_put_offset - self.push_slave_max_offset < self.fallbehind_max

    async def wait_for_slave(self, offset: int) -> PutMessageStatus:
        """SYNC_MASTER: PUT_OK once a slave holds every byte below ``offset``; FLUSH_SLAVE_TIMEOUT after
        ``slave_timeout_ms``; SLAVE_NOT_AVAILABLE at once when no slave is connected or it is too far behind."""
        if not self.is_slave_ok(offset):
            self.slave_not_available += 1
            return PutMessageStatus.SLAVE_NOT_AVAILABLE
        if self.push_slave_max_offset >= offset:
            self.sync_ok += 1
            return PutMessageStatus.PUT_OK
        self.sync_waits += 1
        ev = trio.Event()
        entry = (offset, next(self._seq), ev)
        bisect.insort(self._waiters, entry)
        with trio.move_on_after(self.slave_timeout_s):
            await ev.wait()
        if self.push_slave_max_offset >= offset:
            self.sync_ok += 1
            return PutMessageStatus.PUT_OK
        if entry in self._waiters:
            self._waiters.remove(entry)
        if not self.connections:
            self.slave_not_available += 1
            return PutMessageStatus.SLAVE_NOT_AVAILABLE
        self.sync_timeouts += 1
        return PutMessageStatus.FLUSH_SLAVE_TIMEOUT

    def read_limit(self) -> int | None:
        """SYNC_MASTER's high watermark for readers (broker/store/read.py ReadGate): what a slave acknowledged,
        while one is available for sends to wait for; None otherwise (everything readable)."""
        if not self.is_master() or not self.is_slave_ok(self.store.commitlog.max_offset):
            return None
        return self.push_slave_max_offset

    def _release_waiters(self) -> None:
        """Wake the waits a report covers (and all of them when no slave is left or this is no master), and let
        readers see what is acknowledged now."""
        self.store.read_gate.release()
        waiters = self._waiters
        if not waiters:
            return
        if not self.connections or not self.is_master():
            for _, _, ev in waiters:
                ev.set()
            waiters.clear()
            return
        acked = self.push_slave_max_offset
        n = 0
        while n < len(waiters) and waiters[n][0] <= acked:
            waiters[n][2].set()
            n += 1
        del waiters[:n]

    # -- lag --------------------------------------------------------------------------------------------
    def lag_bytes(self) -> int:
        """Commit-log bytes the best slave has not acknowledged (0 with no slave ever connected)."""
        if self.push_slave_max_offset == 0 and not self.connections:
            return 0
        return max(0, self.store.commitlog.max_offset - self.push_slave_max_offset)

    def lag_seconds(self, now_ms: int | None = None) -> float:
        """Age of the oldest message the best slave has not acknowledged (0 when it has everything)."""
        cl = self.store.commitlog
        acked = self.push_slave_max_offset
        if acked >= cl.max_offset or (acked == 0 and not self.connections):
            return 0.0
        ts = cl.store_timestamp_at(acked)
        if ts is None:  # a filler or the end of a segment: the next record starts the next segment
            ts = cl.store_timestamp_at(acked - acked % cl.segment_size + cl.segment_size)
        if ts is None:
            return 0.0
        now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        return max(0.0, (now - ts) / 1000)
