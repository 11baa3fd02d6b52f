"""Reads, the message store's pull path: RocketMQ's ``DefaultMessageStore.getMessage`` and the lookups admin
requests make (offsets by time, store timestamps, single records). Synchronous: units are read with one
``pread`` and records sliced out of mapped segments, so a read never waits for a write.
"""

from __future__ import annotations

from typing import Any

from trimq.broker.store.consume_queue import CQ_STORE_UNIT_SIZE, UNIT
from trimq.broker.store.store_base import (
    GetMessageResult,
    GetMessageStatus,
    StoreBase,
)
from trimq.protocol.errors import RecordError
from trimq.protocol.message import MessageExt
from trimq.protocol.record import decode_record

__all__ = ["StoreRead"]

_MAX_FILTER_UNITS = 16000 // CQ_STORE_UNIT_SIZE  # RocketMQ scans at least 16000 bytes of units per pull


class StoreRead(StoreBase):
    """The read path of :class:`~trimq.broker.store.message_store.MessageStore`."""

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        """The offset the next message of the queue gets (0 for an empty or unknown queue)."""
        cq = self.find_consume_queue(topic, queue_id)
        return cq.max_offset if cq is not None else 0

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self.find_consume_queue(topic, queue_id)
        return cq.min_offset if cq is not None else 0

    @property
    def max_phy_offset(self) -> int:
        return self.commitlog.max_offset

    @property
    def min_phy_offset(self) -> int:
        return self.commitlog.min_offset

    def get_message(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_msg_nums: int,
        tag_codes: frozenset[int] | set[int] | None = None,
        *,
        max_bytes: int | None = None,
    ) -> GetMessageResult:
        """RocketMQ's ``DefaultMessageStore.getMessage``: up to ``max_msg_nums`` raw records from ``offset``.

        Units whose tags code is not in ``tag_codes`` (None = all) are skipped and counted in
        ``next_begin_offset``. Synchronous: it reads units with one ``pread`` and slices mapped segments.
        trimq differs in one case: an offset beyond the end moves to ``max_offset`` (RocketMQ moves to 0
        when the queue's min offset is 0, which replays the whole queue).
        """
        count_cap = max(1, min(max_msg_nums, self.config.max_transfer_count))
        byte_cap = self.config.max_transfer_bytes if max_bytes is None else max_bytes
        cq = self.find_consume_queue(topic, queue_id)
        if cq is None:
            return GetMessageResult(GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0)
        lo, hi = cq.min_offset, cq.max_offset
        if hi == 0:
            return GetMessageResult(GetMessageStatus.NO_MESSAGE_IN_QUEUE, 0, lo, hi)
        if offset < lo:
            return GetMessageResult(GetMessageStatus.OFFSET_TOO_SMALL, lo, lo, hi)
        if offset == hi:
            return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_ONE, offset, lo, hi)
        if offset > hi:
            return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_BADLY, hi, lo, hi)
        data = cq.read_units(offset, max(_MAX_FILTER_UNITS, count_cap))
        if not data:
            return GetMessageResult(GetMessageStatus.OFFSET_FOUND_NULL, offset, lo, hi)
        status = GetMessageStatus.NO_MATCHED_MESSAGE
        ranges: list[tuple[int, int]] = []
        total = 0
        n = 0
        scanned = 0
        cl_max = self.commitlog.max_offset
        cl_min = self.commitlog.min_offset
        for phys, size, tags in UNIT.iter_unpack(data):
            if n and (n >= count_cap or total + size > byte_cap):
                break
            scanned += 1
            if tag_codes is not None and tags not in tag_codes:
                continue
            if phys < cl_min or phys + size > cl_max:
                if not n:
                    status = GetMessageStatus.MESSAGE_WAS_REMOVING
                continue
            ranges.append((phys, size))
            total += size
            n += 1
        if n:
            status = GetMessageStatus.FOUND
            body = self.commitlog.read_ranges(ranges)
        else:
            body = b""
        return GetMessageResult(status, offset + scanned, lo, hi, body, n)

    def read_record(self, commit_log_offset: int) -> bytes | None:
        """The raw record at ``commit_log_offset`` (VIEW_MESSAGE_BY_ID), or None."""
        size = self.commitlog.record_size_at(commit_log_offset)
        if size is None:
            return None
        return self.commitlog.read(commit_log_offset, size)

    def lookup_message_by_offset(self, commit_log_offset: int) -> MessageExt | None:
        """The decoded message at ``commit_log_offset``, or None when there is no valid record there."""
        data = self.read_record(commit_log_offset)
        if data is None:
            return None
        try:
            return decode_record(data)
        except RecordError:
            return None

    def get_store_timestamp(self, topic: str, queue_id: int, queue_offset: int) -> int | None:
        """Store time of the message at ``queue_offset``, or None."""
        cq = self.find_consume_queue(topic, queue_id)
        if cq is None:
            return None
        unit = cq.get_unit(queue_offset)
        if unit is None:
            return None
        return self.commitlog.store_timestamp_at(unit[0])

    def get_earliest_msg_store_time(self, topic: str, queue_id: int) -> int | None:
        """Store time of the first message still in the queue, or None for an empty queue."""
        return self.get_store_timestamp(topic, queue_id, self.get_min_offset_in_queue(topic, queue_id))

    def get_offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset whose store time is >= ``timestamp_ms`` (max offset when all are older).

        RocketMQ returns the offset whose store time is *closest* to the timestamp, which may be an older
        message or one of several with the same time; trimq's lower bound is deterministic.
        """
        cq = self.find_consume_queue(topic, queue_id)
        if cq is None:
            return 0
        lo, hi = cq.min_offset, cq.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            ts = self.get_store_timestamp(topic, queue_id, mid)
            if ts is None or ts < timestamp_ms:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def runtime_info(self) -> dict[str, Any]:
        """Numbers for GET_BROKER_RUNTIME_INFO and logs."""
        return {
            "commitLogMinOffset": self.commitlog.min_offset,
            "commitLogMaxOffset": self.commitlog.max_offset,
            "commitLogFlushedOffset": self.commitlog.flushed_offset,
            "segments": len(self.commitlog.segments),
            "queues": sum(len(qs) for qs in self.queues.values()),
            "writable": self.writable,
        }
