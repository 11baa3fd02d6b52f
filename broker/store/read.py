"""Reads, the message store's pull path: RocketMQ's ``DefaultMessageStore.getMessage`` and the lookups admin
requests make (offsets by time, store timestamps, single records). Synchronous: units are read with one
``pread`` and records sliced out of mapped segments, so a read never waits for a write.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from trimq.broker.store.consume_queue import CQ_STORE_UNIT_SIZE, UNIT
from trimq.broker.store.store_base import (
    ArrivalListener,
    GetMessageResult,
    GetMessageStatus,
    StoreBase,
)
from trimq.protocol.errors import RecordError
from trimq.protocol.message import MessageExt
from trimq.protocol.record import decode_record

__all__ = ["ReadGate", "StoreRead"]

_MAX_FILTER_UNITS = 16000 // CQ_STORE_UNIT_SIZE  # RocketMQ scans at least 16000 bytes of units per pull


class ReadGate:
    """SYNC_MASTER: a reader sees a record only once a slave holds it (the high watermark).

    A consumer that read a record only the master held would, after a failover, continue past the queue offset
    the promoted slave gives the next message, and never receive that one. So on a SYNC_MASTER with a slave
    available (``limit`` is then the slave's acknowledged commit-log offset) pulls stop at the first record the
    slave has not acknowledged, and arrivals reach long polling (``listeners``) once acknowledged. ``limit``
    None (no gate: any other role, no slave connected, or one too far behind, as a send's SLAVE_NOT_AVAILABLE)
    makes every record readable at once. RocketMQ 4.9.3 serves records before replication; its DLedger mode
    serves committed entries only, as here.
    """

    def __init__(self, commitlog_end: Callable[[], int], held_max: int = 100_000) -> None:
        self._commitlog_end = commitlog_end
        self._held_max = held_max
        self._limit_fn: Callable[[], int | None] | None = None  # see follow()
        #: Told of an arrival once it is readable: (topic, queue id, the queue's max offset).
        self.listeners: list[ArrivalListener] = []
        self._held: deque[tuple[int, str, int, int]] = deque()  # (commit-log end, topic, queue id, max offset)

    def follow(self, limit_fn: Callable[[], int | None] | None) -> None:
        """Readers see the commit log up to ``limit_fn()`` (None from it, or no function: everything), from now
        on; the HA controller sets it by role. Arrivals readable now are passed on at once."""
        self._limit_fn = limit_fn
        self.release()

    def limit(self) -> int | None:
        """The readable commit-log end, or None when everything is readable."""
        return None if self._limit_fn is None else self._limit_fn()

    @property
    def held(self) -> int:
        """Arrivals waiting for a slave's acknowledgement."""
        return len(self._held)

    def on_arrival(self, topic: str, queue_id: int, new_max: int) -> None:
        """The store's arrival listener: pass the arrival on, or hold it until a slave acknowledges it."""
        limit = self.limit()
        end = self._commitlog_end()
        if limit is not None and end > limit:
            if len(self._held) >= self._held_max:
                self._compact()
            self._held.append((end, topic, queue_id, new_max))
            return
        if self._held:
            self.release()
        self._tell(topic, queue_id, new_max)

    def release(self) -> None:
        """Pass on the held arrivals that are readable now (all of them when the gate is open)."""
        held = self._held
        if not held:
            return
        limit = self.limit()
        ready: dict[tuple[str, int], int] = {}
        while held and (limit is None or held[0][0] <= limit):
            _end, topic, queue_id, new_max = held.popleft()
            ready[(topic, queue_id)] = new_max
        for (topic, queue_id), new_max in ready.items():
            self._tell(topic, queue_id, new_max)

    def _compact(self) -> None:
        """Keep one held arrival per queue, its latest: a slave connected but silent (until it falls too far behind
        or its connection is closed) must not grow this without bound. Such a queue's readers then hear of it at
        its latest arrival's acknowledgement."""
        latest = {(topic, queue_id): (end, topic, queue_id, new_max) for end, topic, queue_id, new_max in self._held}
        self._held = deque(sorted(latest.values()))

    def _tell(self, topic: str, queue_id: int, new_max: int) -> None:
        for listener in self.listeners:
            listener(topic, queue_id, new_max)


class StoreRead(StoreBase):
    """The read path of :class:`~trimq.broker.store.message_store.MessageStore`."""

    read_gate: ReadGate

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
        readable = self.read_gate.limit()
        if readable is None or readable > cl_max:
            readable = cl_max
        for phys, size, tags in UNIT.iter_unpack(data):
            if n and (n >= count_cap or total + size > byte_cap):
                break
            if phys + size > readable and phys >= cl_min and phys + size <= cl_max:
                if not scanned:  # no slave holds it yet (ReadGate): as if it had not arrived
                    return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_ONE, offset, lo, hi)
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

    def queue_offset_at(self, topic: str, queue_id: int, commit_log_offset: int) -> int:
        """The first queue offset whose record starts at or after ``commit_log_offset`` (the queue's max offset when
        none does): where the queue stood when the log reached that offset. A binary search over the units."""
        cq = self.find_consume_queue(topic, queue_id)
        if cq is None:
            return 0

        def reached(offset: int) -> bool:
            unit = cq.get_unit(offset)
            return unit is None or unit[0] >= commit_log_offset

        return _first_offset(cq, reached)

    def has_readable(self, topic: str, queue_id: int, offset: int) -> bool:
        """Whether a pull from ``offset`` can find something: the queue goes past it and, behind a
        :class:`ReadGate`, a slave holds the record there."""
        cq = self.find_consume_queue(topic, queue_id)
        if cq is None or cq.max_offset <= offset:
            return False
        limit = self.read_gate.limit()
        if limit is None:
            return True
        unit = cq.get_unit(offset)
        return unit is None or unit[0] + unit[1] <= limit

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

        def reached(offset: int) -> bool:
            ts = self.get_store_timestamp(topic, queue_id, offset)
            return ts is not None and ts >= timestamp_ms

        return _first_offset(cq, reached)

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


def _first_offset(cq: Any, reached: Callable[[int], bool]) -> int:
    """The first queue offset of ``cq`` where ``reached`` holds (its max offset when none does); ``reached`` must
    hold from some offset on. A binary search: one unit read per step."""
    lo, hi = cq.min_offset, cq.max_offset
    while lo < hi:
        mid = (lo + hi) // 2
        if reached(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo
