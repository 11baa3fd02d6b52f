"""Appends and group commit, the message store's write path (docs/STORAGE.md).

``put_message`` / ``put_messages`` encode records and write them with no await between choosing the position
and updating it, so appends are serialized by construction (one writer) while pulls, which only slice mapped
memory, never wait for them. The only await before an append is for a new segment file when the prepared one
is not ready (files are created ahead of need in a thread, ``_alloc_loop``). Consume-queue units are written in
the same step, so a message is pullable as soon as its send returns. Under SYNC_FLUSH a put is answered only
once its bytes are fsynced, and every put that arrives while an fsync runs shares the next one
(``_group_commit_loop``). On a SYNC_MASTER ``handle_ha`` waits for a slave.
"""

from __future__ import annotations

import ipaddress
import struct
import time
import zlib

import trio

from trimq.broker.store.commitlog import host_sys_flag
from trimq.broker.store.consume_queue import UNIT, tags_string_to_tags_code
from trimq.broker.store.store_base import (
    PutMessageStatus,
    PutRequest,
    PutResult,
    StoreBase,
    mono_ms,
)
from trimq.protocol.message import (
    MAX_PROPERTIES_BYTES,
    MessageConst,
    decode_properties,
    encode_properties,
    get_property,
)
from trimq.protocol.validation import InvalidNameError, check_topic
from trimq.runtime.logs import get_logger, log_rate_limited

__all__ = ["StoreAppend"]

log = get_logger("trimq.store")


class StoreAppend(StoreBase):
    """The write path of :class:`~trimq.broker.store.message_store.MessageStore`."""

    # ================================================================== host addresses
    @property
    def store_host(self) -> tuple[str, int]:
        """The broker's address as written into records (resolved on first use, once it is known)."""
        self._store_host_b()
        return self._store_host

    def _store_host_b(self) -> bytes:
        b = self._store_host_bytes
        if b is None:
            host = self._store_host_fn()
            b = _host_bytes(host)
            if host[1]:  # port known: cache it (before serving starts it may still be 0)
                self._store_host_bytes = b
            self._store_host = host
        return b

    def _id_prefix(self, store_b: bytes) -> str:
        if self._id_prefix_for != store_b:
            self._id_prefix_for = store_b
            self._id_prefix_hex = store_b.hex().upper()
        return self._id_prefix_hex

    def _born_b(self, host: tuple[str, int]) -> bytes:
        b = self._host_cache.get(host)
        if b is None:
            b = _host_bytes(host)
            if len(self._host_cache) > 10_000:
                self._host_cache.clear()
            self._host_cache[host] = b
        return b

    # ================================================================== writing
    async def put_message(
        self,
        topic: str,
        queue_id: int,
        body: bytes,
        properties: dict[str, str] | str,
        *,
        flag: int = 0,
        sys_flag: int = 0,
        born_timestamp: int,
        born_host: tuple[str, int],
        reconsume_times: int = 0,
        tags_code: int | None = None,
    ) -> PutResult:
        """Append one message to ``topic``/``queue_id``. ``properties`` is a dict or a RocketMQ property string.

        ``tags_code`` overrides the consume-queue tags field (default: hash of TAGS, or the topic's
        resolver). A message with DELAY > 0 goes through ``put_hook`` first when one is set.
        """
        props = properties if isinstance(properties, str) else encode_properties(properties)
        if self.put_hook is not None:
            delay = get_property(props, MessageConst.DELAY_TIME_LEVEL)
            if delay and delay.strip().lstrip("-").isdigit() and int(delay) > 0:
                req = PutRequest(topic, queue_id, body, props, flag, sys_flag, born_timestamp, born_host,
                                 reconsume_times, tags_code)
                early = self.put_hook(req)
                if early is not None:
                    return early
                topic, queue_id, props, tags_code = req.topic, req.queue_id, req.properties, req.tags_code
                body, flag, sys_flag = req.body, req.flag, req.sys_flag
        return await self.put_messages(
            topic, queue_id, [(body, props, flag)], sys_flag=sys_flag, born_timestamp=born_timestamp,
            born_host=born_host, reconsume_times=reconsume_times, tags_code=tags_code,
        )

    async def put_messages(
        self,
        topic: str,
        queue_id: int,
        messages: list[tuple[bytes, str, int]],
        *,
        sys_flag: int = 0,
        born_timestamp: int,
        born_host: tuple[str, int],
        reconsume_times: int = 0,
        tags_code: int | None = None,
    ) -> PutResult:
        """Append ``(body, property string, flag)`` messages to one queue as one write (a batch).

        The batch is all or nothing: any message that is too big, has oversized properties or an unusable
        topic rejects the whole batch and leaves the store untouched.
        """
        if not self.writable:
            return PutResult(PutMessageStatus.SERVICE_NOT_AVAILABLE,
                             remark=self.not_writable_reason or "store is not writable")
        if not messages:
            return PutResult(PutMessageStatus.MESSAGE_ILLEGAL, remark="no message to store")
        if topic not in self._valid_topics:
            try:
                check_topic(topic)
                topic_field = self._encoder.topic_bytes(topic)
            except (InvalidNameError, ValueError) as exc:
                return PutResult(PutMessageStatus.MESSAGE_ILLEGAL, remark=str(exc))
            if len(self._valid_topics) < 100_000:
                self._valid_topics.add(topic)
        else:
            topic_field = self._encoder.topic_bytes(topic)
        if not 0 <= queue_id <= 0x7FFFFFFF:
            return PutResult(PutMessageStatus.MESSAGE_ILLEGAL, remark=f"queue id {queue_id} is out of range")
        try:
            born_b = self._born_b(born_host)
        except (ValueError, TypeError) as exc:
            return PutResult(PutMessageStatus.MESSAGE_ILLEGAL, remark=f"born host {born_host!r}: {exc}")
        store_b = self._store_host_b()
        blen, slen = len(born_b), len(store_b)
        sys_flag = host_sys_flag(sys_flag, blen, slen)
        tlen = len(topic_field)
        max_size = min(self.config.max_message_size, self.commitlog.segment_size - 8)
        resolver = self.tags_code_resolvers.get(topic) if tags_code is None else None
        fixed = 74 + tlen + blen + slen  # record size minus body and properties
        # per message: (body, encoded properties, flag, record size, tags code)
        prepared: list[tuple[bytes, bytes, int, int, int]] = []
        append = prepared.append
        total = 0
        batch = len(messages) > 1
        for body, props, flag in messages:
            props_b = props.encode()
            plen = len(props_b)
            size = fixed + len(body) + plen
            if size > max_size or plen > MAX_PROPERTIES_BYTES:
                if plen > MAX_PROPERTIES_BYTES:
                    return PutResult(
                        PutMessageStatus.PROPERTIES_SIZE_EXCEEDED,
                        remark=f"properties are {plen} bytes; the maximum is {MAX_PROPERTIES_BYTES}",
                    )
                return PutResult(
                    PutMessageStatus.MESSAGE_ILLEGAL,
                    remark=f"message record is {size} bytes; the maximum is {max_size}",
                )
            if tags_code is not None:
                tc = tags_code
            elif resolver is not None:
                tc = 0  # computed below, once the store time is known
            else:
                tc = tags_string_to_tags_code(get_property(props, "TAGS")) if "TAGS\x01" in props else 0
            if batch and "DELAY\x01" in props:
                d = get_property(props, MessageConst.DELAY_TIME_LEVEL)
                if d and d.isdigit() and int(d) > 0:
                    return PutResult(PutMessageStatus.MESSAGE_ILLEGAL, remark="a batch cannot hold delayed messages")
            append((body, props_b, flag, size, tc))
            total += size
        if total > max_size:
            return PutResult(
                PutMessageStatus.MESSAGE_ILLEGAL, remark=f"batch is {total} bytes; the maximum is {max_size}"
            )

        t_append = time.perf_counter()
        cl = self.commitlog
        seg = cl.room_for(total)
        while seg is None:
            try:
                await self._prepare_segment()
            except OSError as exc:
                return PutResult(PutMessageStatus.CREATE_MAPPED_FILE_FAILED, remark=f"cannot create segment: {exc}")
            if not self.writable:
                return PutResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, remark=self.not_writable_reason)
            seg = cl.room_for(total)
        if not cl.has_spare:
            self._alloc_wakeup.set()  # a roll used the prepared segment: prepare the next one

        # ---- from here to the end of the write nothing awaits: this is the single-writer section.
        now = int(time.time() * 1000)
        store_ts = now if now > self._last_store_ts else self._last_store_ts
        self._last_store_ts = store_ts
        qs = self.queues.get(topic)
        cq = qs.get(queue_id) if qs is not None else None
        if cq is None:
            cq = self._new_cq(topic, queue_id)
        qoff = cq.max_offset
        phys0 = phys = cl.max_offset
        crc32 = zlib.crc32
        unit = UNIT.pack
        whole = self._encoder.whole
        buf = bytearray()
        units = bytearray()
        keyed: list[int] = []  # offsets of the records with KEYS or UNIQ_KEY, for the index task
        known: list[tuple[str, int, int, str]] = []  # and what the index needs of each (no read back)
        for i, (body, props_b, flag, size, tc) in enumerate(prepared):
            # one pack per record: fields 1-14, the body, the topic, the properties (struct cached by lengths)
            bl = len(body)
            pl = len(props_b)
            buf += whole(blen, slen, bl, tlen, pl).pack(
                size, 0xDAA320A7, crc32(body) & 0x7FFFFFFF, queue_id, flag, qoff + i, phys, sys_flag,
                born_timestamp, born_b, store_ts, store_b, reconsume_times, 0, bl, body, topic_field, pl, props_b)
            if resolver is not None:
                tc = resolver(decode_properties(messages[i][1]), store_ts)
            units += unit(phys, size, tc)
            if b"KEY" in props_b:
                keyed.append(phys)
                known.append((topic, store_ts, sys_flag, messages[i][1]))
            phys += size
        try:
            cl.write(seg, buf)
        except OSError as exc:
            log.error("store.write_failed", error=str(exc), offset=phys0)
            return PutResult(PutMessageStatus.UNKNOWN_ERROR, remark=f"commit-log write failed: {exc}")
        if keyed:
            self.index_dispatcher.note_keyed(keyed, known)
        try:
            cq.append(qoff, bytes(units))
        except OSError as exc:
            # The record is in the commit log but its unit is not: stop accepting writes, recovery at the next
            # start rebuilds the unit (it is past the checkpoint).
            self.writable = False
            self.not_writable_reason = f"consume-queue write failed: {exc}; restart the broker to repair"
            log.error("store.cq_write_failed", topic=topic, queue_id=queue_id, error=str(exc))
            return PutResult(PutMessageStatus.UNKNOWN_ERROR, remark=self.not_writable_reason)
        new_max = cq.max_offset
        for listener in self.arrival_listeners:
            try:
                listener(topic, queue_id, new_max)
            except Exception:  # the message is stored whatever a listener does
                log.exception("store.arrival_listener_failed", topic=topic, queue_id=queue_id)
        self.index_dispatcher.wake()  # indexed by its own task, off the send's path
        # ---- end of the single-writer section.
        if self.on_append is not None:
            self.on_append(time.perf_counter() - t_append)

        id_prefix = self._id_prefix(store_b)
        if len(prepared) == 1:
            first_id = f"{id_prefix}{phys0:016X}"
            ids = [first_id]
        else:
            ids = []
            p = phys0
            for entry in prepared:
                ids.append(f"{id_prefix}{p:016X}")  # RocketMQ's offset message id: store host + offset, hex
                p += entry[3]
            first_id = ids[0]
        result = PutResult(PutMessageStatus.PUT_OK, first_id, qoff, phys0, store_ts, "", topic, queue_id, ids,
                           len(buf))
        if self.config.sync_flush and not await self._wait_flushed(phys):
            result.status = PutMessageStatus.FLUSH_DISK_TIMEOUT
            result.remark = self._flush_failed or (
                f"not flushed within {self.config.sync_flush_timeout_ms} ms"
            )
        return result

    async def handle_ha(self, result: PutResult) -> PutResult:
        """RocketMQ's ``CommitLog.handleHA`` for a producer's put: on a SYNC_MASTER, answer only once a slave
        holds the message (``replica_wait``); FLUSH_SLAVE_TIMEOUT or SLAVE_NOT_AVAILABLE otherwise (the message
        is stored on the master either way). Producers' sends and CONSUMER_SEND_MSG_BACK wait; store-internal puts
        (schedule deliveries) do not."""
        wait = self.replica_wait
        if wait is None or result.status not in (PutMessageStatus.PUT_OK, PutMessageStatus.FLUSH_DISK_TIMEOUT):
            return result
        status = await wait(result.commit_log_offset + result.wrote_bytes)
        if status is not PutMessageStatus.PUT_OK:
            result.status = status
            result.remark = ("no slave confirmed the message in time" if status is PutMessageStatus.FLUSH_SLAVE_TIMEOUT
                             else "no slave is connected, or it is too far behind")
        return result

    # ================================================================== segment files
    async def _prepare_segment(self) -> None:
        """Make sure the next segment file exists (created in a worker thread, one at a time)."""
        async with self._alloc_lock:
            start = self.commitlog.needs_segment()
            if start is None:
                return
            seg = await trio.to_thread.run_sync(self.commitlog.create_segment, start)
            if self.commitlog.needs_segment() == start:
                self.commitlog.install_spare(seg)
            else:
                seg.close()
                if all(s.start != start for s in self.commitlog.segments):
                    # The log moved while the file was made (a fresh slave's start_at): a file left at ``start``
                    # would not follow its segments, and the store would refuse to open after a restart.
                    seg.path.unlink(missing_ok=True)

    async def _alloc_loop(self) -> None:
        """Create the next segment ahead of need, so a roll-over rarely waits for a file."""
        while True:
            if self.running and self.writable and self.commitlog.needs_segment() is not None:
                try:
                    await self._prepare_segment()
                except OSError as exc:
                    log_rate_limited(self._failure_log, "prepare_segment", mono_ms(), log.warning,
                                     "store.prepare_segment_failed", error=str(exc))
                    await trio.sleep(1)
            await self._alloc_wakeup.wait()
            self._alloc_wakeup = trio.Event()

    # ================================================================== group commit (SYNC_FLUSH)
    async def _wait_flushed(self, offset: int) -> bool:
        """SYNC_FLUSH: wait until the commit log is fsynced up to ``offset``; False on timeout/failure."""
        if self.commitlog.flushed_offset >= offset:
            return True
        ev = trio.Event()
        self._sync_waiters.append((offset, ev))
        self._sync_wakeup.set()
        with trio.move_on_after(self.config.sync_flush_timeout_ms / 1000):
            await ev.wait()
        return self.commitlog.flushed_offset >= offset

    async def _group_commit_loop(self) -> None:
        """One fsync for every put waiting at the time it starts; puts arriving meanwhile share the next."""
        cl = self.commitlog
        while True:
            await self._sync_wakeup.wait()
            self._sync_wakeup = trio.Event()
            target = cl.max_offset
            if target > cl.flushed_offset:
                try:
                    t_fsync = time.perf_counter()
                    await self._in_io_thread(cl.flush, target)
                    if self.on_fsync is not None:
                        self.on_fsync("group_commit", time.perf_counter() - t_fsync)
                    cl.flushed_offset = max(cl.flushed_offset, target)
                    self._flush_failed = None
                except OSError as exc:
                    self._flush_failed = f"fsync failed: {exc}"
                    log_rate_limited(self._failure_log, "fsync", mono_ms(), log.error, "store.fsync_failed",
                                     error=str(exc))
                    await trio.sleep(0.1)
            waiters = self._sync_waiters
            flushed = cl.flushed_offset
            while waiters and (waiters[0][0] <= flushed or self._flush_failed):
                waiters.popleft()[1].set()
            if waiters:
                self._sync_wakeup.set()


def _host_bytes(host: tuple[str, int]) -> bytes:
    ip, port = host
    return ipaddress.ip_address(ip).packed + struct.pack(">i", port)

