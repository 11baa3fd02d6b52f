"""The slave's side of replication: one connection to the master's HA port (RocketMQ 4.9.3's ``HAClient``).

The client sends its handshake (the newest master epoch it knows and its commit-log max offset), cuts its log
back to the master's start offset when it holds more (a tail written by an older master that the new one never
had), adopts the master's epoch history, then appends every frame where the master had its bytes, builds its
consume queues and index from them (replica.ReplicaWriter) and reports its max offset after each batch and at
least every ``heartbeat_interval_ms``. A frame at another offset than the slave's end, a malformed stream or
``housekeeping_interval_ms`` without a frame closes the connection; it reconnects ``reconnect_interval_ms``
later, to the master address in force then (configured, or learned from the name server).
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from trimq.broker.store.ha.codec import (
    HAProtocolError,
    Hello,
    HelloAck,
    StreamBuffer,
    encode_hello,
    encode_offset_report,
)
from trimq.broker.store.ha.history import HAState
from trimq.broker.store.ha.replica import ReplicaWriter
from trimq.protocol.address import parse_address
from trimq.runtime.logs import RateLimiter, get_logger, log_rate_limited

if TYPE_CHECKING:
    from trimq.broker.store.message_store import MessageStore

log = get_logger("trimq.ha")

__all__ = ["HAClient"]

_RECEIVE_BYTES = 256 * 1024


class HAClient:
    """Follows the master at ``master_ha_address()`` (see the module docstring) until cancelled."""

    def __init__(self, store: MessageStore, state: HAState, *, master_ha_address: Callable[[], str],
                 heartbeat_interval_ms: int = 5_000, housekeeping_interval_ms: int = 20_000,
                 reconnect_interval_ms: int = 1_000, on_master: Callable[[HelloAck], None] | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.store = store
        #: TLS towards the master's HA port (None: plain TCP), verifying it as the broker's request port is
        self.ssl_context = ssl_context
        self.state = state
        self.writer = ReplicaWriter(store)
        self.master_ha_address = master_ha_address
        self.heartbeat_interval_s = heartbeat_interval_ms / 1000
        self.housekeeping_interval_s = housekeeping_interval_ms / 1000
        self.reconnect_interval_s = reconnect_interval_ms / 1000
        self.on_master = on_master
        #: Called when an established connection to the master ends (HA part 2: the slave readies itself to serve).
        self.on_master_lost: Callable[[], None] | None = None
        #: Awaited after each handshake, once the tail the master never had is cut and before anything is followed
        #: (nor the sync told of the master): the broker moves committed offsets that point past its log's end.
        self.before_follow: Callable[[], Awaitable[None]] | None = None
        #: True while a handshake succeeded and the connection is open (metrics: slave connection state).
        self.connected = False
        self.connected_address = ""
        #: The master's answer of the current or last connection.
        self.master: HelloAck | None = None
        #: The highest offset the master said it had sent from (heartbeats carry its transfer position).
        self.last_receive_time = 0.0
        self.reported_offset = -1
        self.connects = 0
        self._address_changed = trio.Event()
        self._errors = RateLimiter(30_000)

    def address_changed(self) -> None:
        """The master's address may have changed (learned from a name server): reconnect when idle."""
        self._address_changed.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # The store is open and ends on a record boundary (recovery, or a master's writes before a demotion):
        # every complete record below its end has its units.
        self.writer.reput_offset = self.store.commitlog.max_offset
        task_status.started()
        while True:
            addr = self.master_ha_address()
            if not addr:
                with trio.move_on_after(self.reconnect_interval_s):
                    await self._address_changed.wait()
                self._address_changed = trio.Event()
                continue
            try:
                await self._session(addr)
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError, HAProtocolError,
                    ValueError) as exc:
                log_rate_limited(self._errors, addr, int(trio.current_time() * 1000), log.warning,
                                 "ha.master_connection_failed", master=addr, error=str(exc) or type(exc).__name__)
            finally:
                was_connected = self.connected
                if self.connected:
                    log.info("ha.master_disconnected", master=addr, max_offset=self.store.commitlog.max_offset)
                self.connected = False
                if was_connected and self.on_master_lost is not None:
                    self.on_master_lost()
            with trio.move_on_after(self.reconnect_interval_s):
                await self._address_changed.wait()
            self._address_changed = trio.Event()

    async def _session(self, addr: str) -> None:
        host, port = parse_address(addr)
        with trio.fail_after(self.housekeeping_interval_s):
            tcp = await trio.open_tcp_stream(host, port)
        tls = trio.SSLStream(tcp, self.ssl_context, server_hostname=host) if self.ssl_context is not None else None
        stream: trio.abc.Stream = tls or tcp
        async with stream:
            if tls is not None:
                with trio.fail_after(self.housekeeping_interval_s):
                    await tls.do_handshake()
            cl = self.store.commitlog
            await stream.send_all(encode_hello(Hello(self.state.master_epoch, cl.max_offset)))
            buf = StreamBuffer()
            ack = None
            with trio.move_on_after(self.housekeeping_interval_s):
                while ack is None:
                    data = await stream.receive_some(_RECEIVE_BYTES)
                    if not data:
                        raise HAProtocolError("the master closed the connection during the handshake")
                    buf.feed(data)
                    ack = buf.next_hello_ack()
            if ack is None:
                raise HAProtocolError("no handshake answer from the master")
            self.master = ack
            if ack.refused:
                log_rate_limited(self._errors, "refused", int(trio.current_time() * 1000), log.error,
                                 "ha.refused_by_master", master=addr, reason=ack.remark)
                return
            history = list(ack.history)
            adopt = history != self.state.history
            if ack.start_offset < cl.max_offset:
                # The history is adopted in memory the moment the tail is gone (answers from then on say the new
                # epoch: a consumer moved back to the cut queue's end must know the position is the new master's, or
                # it waits RocketMQ's 10 s for an illegal offset); it is written only once the cut is durable, so a
                # crash in between never pairs the new epoch with the old tail on disk.
                await self.writer.cut(ack.start_offset, on_truncated=lambda: self.state.adopt(history))
            elif ack.start_offset > cl.max_offset and (cl.segments or cl.max_offset):
                raise HAProtocolError(f"the master starts at {ack.start_offset}, past this slave's end "
                                      f"{cl.max_offset}")
            if adopt:
                self.state.adopt(history)
                await trio.to_thread.run_sync(self.state.save)
            if self.before_follow is not None:
                await self.before_follow()
            self.connected = True
            self.connected_address = addr
            self.connects += 1
            self.last_receive_time = trio.current_time()
            log.info("ha.master_connected", master=addr, master_addr=ack.master_addr, master_epoch=ack.master_epoch,
                     start_offset=ack.start_offset, max_offset=cl.max_offset)
            if self.on_master is not None:
                self.on_master(ack)
            await self._follow(stream, buf)

    async def _report(self, stream: trio.abc.Stream) -> None:
        offset = self.store.commitlog.max_offset
        await stream.send_all(encode_offset_report(offset))
        self.reported_offset = offset
        self._last_report = trio.current_time()

    async def _follow(self, stream: trio.abc.Stream, buf: StreamBuffer) -> None:
        cl = self.store.commitlog
        writer = self.writer
        await self._report(stream)
        while True:
            with trio.move_on_after(self.heartbeat_interval_s):
                data = await stream.receive_some(_RECEIVE_BYTES)
                if not data:
                    raise HAProtocolError("the master closed the connection")
                self.last_receive_time = trio.current_time()
                buf.feed(data)
                appended = False
                while (frame := buf.next_transfer()) is not None:
                    phy, body = frame
                    if phy != cl.max_offset and (cl.segments or cl.max_offset):
                        raise HAProtocolError(f"the master sent offset {phy}, this slave's log ends at "
                                              f"{cl.max_offset}")
                    if body:
                        await writer.append(phy, body)
                        appended = True
                if appended:
                    writer.dispatch()
                    await self._report(stream)
            now = trio.current_time()
            if now - self.last_receive_time > self.housekeeping_interval_s:
                raise HAProtocolError(f"nothing from the master for {self.housekeeping_interval_s:g} s")
            if now - self._last_report >= self.heartbeat_interval_s:
                await self._report(stream)
