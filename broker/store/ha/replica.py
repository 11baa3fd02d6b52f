"""A slave's side of the store: bytes from the master appended to the commit log, consume queues and the index
built from them, and a tail cut when the slave follows a newer master (RocketMQ's
``DefaultMessageStore.appendToCommitLog``, its ``ReputMessageService`` and ``truncateDirtyLogicFiles``).

The master sends raw commit-log bytes, cut anywhere (a frame may end inside a record) but never across a
segment end. They are written where the master had them, so the slave's log is byte-identical to the master's
over the range it holds, fillers included. ``dispatch`` then walks the complete records past ``reput_offset``
and appends their consume-queue units as the master did (the queue offsets are in the records), notes keyed
records for the index task and wakes long polls. A fresh slave starts on the master's last segment boundary:
its queues start at the queue offsets of the first records it receives (earlier units are blank).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from trimq.broker.store.commitlog import ScanRecord, scan_segment_bytes
from trimq.broker.store.consume_queue import UNIT, ConsumeQueue
from trimq.protocol.record import BLANK_MAGIC_CODE
from trimq.runtime.logs import get_logger

if TYPE_CHECKING:
    from trimq.broker.store.message_store import MessageStore

log = get_logger("trimq.ha")

__all__ = ["ReplicaWriter"]

_SIZE_MAGIC = struct.Struct(">iI")
_PAD = bytes(8)


class ReplicaWriter:
    """Appends replicated bytes to ``store`` and dispatches them; one per store, used by the slave's HAClient."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store
        #: Every complete record below this offset has its consume-queue unit (RocketMQ's reputFromOffset).
        self.reput_offset = store.commitlog.max_offset
        self.records_dispatched = 0

    async def append(self, offset: int, data: bytes) -> None:
        """Write ``data`` (bytes of one segment) at log offset ``offset``, which must be the log's end; an empty
        log starts there (a segment boundary). ValueError when ``offset`` is not where the log ends."""
        cl = self.store.commitlog
        if not cl.segments and cl.max_offset == 0 and offset:
            cl.start_at(offset)
            self.reput_offset = offset
            self.store.index_dispatcher.dispatched = offset
        if offset != cl.max_offset:
            raise ValueError(f"master sent bytes at {offset}, the slave's commit log ends at {cl.max_offset}")
        view = memoryview(data)
        while view:
            seg = cl.segment_for(cl.max_offset)
            if seg is None:
                start = cl.next_segment_start()
                spare = cl.spare
                if spare is None or spare.start != start:
                    spare = await trio.to_thread.run_sync(cl.create_segment, start)
                cl.add_segment(spare)
                continue
            room = seg.end - cl.max_offset
            chunk = view[:room]
            cl.write(seg, chunk)
            view = view[len(chunk):]

    def dispatch(self) -> int:
        """Build consume-queue units for the complete records past ``reput_offset``; returns how many."""
        store = self.store
        cl = store.commitlog
        done = 0
        arrived: dict[tuple[str, int], int] = {}
        keyed: list[int] = []
        filled: list[ConsumeQueue] = []

        def on_record(rec: ScanRecord) -> None:
            nonlocal done
            cq = store.find_consume_queue(rec.topic, rec.queue_id)
            if cq is None:
                cq = store._new_cq(rec.topic, rec.queue_id)
            if rec.queue_offset < cq.max_offset:
                return  # the unit is there already (a store that held these records before)
            if rec.queue_offset > cq.max_offset:
                if cq.max_offset > cq.min_offset:
                    log.warning("ha.queue_gap", topic=rec.topic, queue_id=rec.queue_id, expected=cq.max_offset,
                                got=rec.queue_offset, commit_log_offset=rec.offset)
                cq.fill_blank(rec.queue_offset)  # a fresh slave: the queue starts where the log does
                filled.append(cq)
            cq.append(rec.queue_offset, UNIT.pack(rec.offset, rec.size,
                                                  store._tags_code(rec.topic, rec.properties, rec.store_timestamp)))
            if store._last_store_ts < rec.store_timestamp:
                store._last_store_ts = rec.store_timestamp
            if "KEY" in rec.properties:
                keyed.append(rec.offset)
            arrived[(rec.topic, rec.queue_id)] = cq.max_offset
            done += 1

        while self.reput_offset < cl.max_offset:
            pos = self.reput_offset
            seg = cl.segment_for(pos)
            if seg is None:
                break
            end = min(seg.end, cl.max_offset)
            if end - pos < 8:
                break
            size, magic = _SIZE_MAGIC.unpack_from(seg.mm, pos - seg.start)
            if magic == BLANK_MAGIC_CODE:
                if cl.max_offset < seg.end:
                    break  # the rest of the filler is still on its way
                self.reput_offset = seg.end
                continue
            # A copy of what arrived, padded so the scan stops cleanly at an incomplete record.
            buf = bytes(seg.mm[pos - seg.start : end - seg.start]) + _PAD
            stop, _why = scan_segment_bytes(buf, pos, pos, end + len(_PAD), check_crc=False, on_record=on_record)
            if stop == pos:
                if size > 0 and pos + size > end:
                    break  # an incomplete record: the rest comes with the next frame
                log.error("ha.reput_stopped", offset=pos, reason=_why)
                break
            self.reput_offset = stop
        for cq in filled:  # the blank units before a fresh slave's first record are not readable
            cq.correct_min_offset(cl.min_offset)
        if keyed:
            store.index_dispatcher.note_keyed(keyed)
            store.index_dispatcher.wake()
        for (topic, queue_id), new_max in arrived.items():
            for listener in store.arrival_listeners:
                try:
                    listener(topic, queue_id, new_max)
                except Exception:
                    log.exception("ha.arrival_listener_failed", topic=topic, queue_id=queue_id)
        self.records_dispatched += done
        return done

    async def cut(self, offset: int, on_truncated: Callable[[], None] | None = None) -> None:
        """Forget the store's log from ``offset`` on, with the consume-queue units and index positions pointing
        there, and make the cut durable (checkpoint) before anything new is appended. ``on_truncated`` runs as soon
        as readers can no longer see the tail, before the cut is durable (a slave adopts its master's epoch history
        in memory then, so no answer sent while the cut is flushed stamps a position of the new log with the old
        epoch)."""
        store = self.store
        cl = store.commitlog
        if offset >= cl.max_offset:
            return
        old = cl.max_offset
        async with store._flush_lock:  # no flush may checkpoint an offset of the old tail meanwhile
            for seg in cl.cut(offset):
                seg.path.unlink(missing_ok=True)
                store._retire(seg.close)
            for queues in store.queues.values():
                for cq in queues.values():
                    cq.truncate(_first_unit_at_or_after(cq, offset))
            disp = store.index_dispatcher
            if disp.keyed is not None:
                disp.keyed[:] = [o for o in disp.keyed if o < offset]
                disp.dispatched = min(disp.dispatched, offset)
                if store.index.end_phy_offset > offset:
                    store.index.reset_end_phy_offset(offset)
            store._checkpointed = -1
            if on_truncated is not None:
                on_truncated()
        self.reput_offset = min(self.reput_offset, offset)
        await store.flush()
        log.warning("ha.commitlog_truncated", from_offset=old, to_offset=offset, bytes=old - offset)


def _first_unit_at_or_after(cq: ConsumeQueue, offset: int) -> int:
    """The first queue offset of ``cq`` whose unit points at ``offset`` or later (units ascend)."""
    lo, hi = cq.min_offset, cq.max_offset
    while lo < hi:
        mid = (lo + hi) // 2
        unit = cq.get_unit(mid)
        if unit is not None and unit[0] >= offset and unit != (0, 0x7FFFFFFF, 0):
            hi = mid
        else:
            lo = mid + 1
    return lo
