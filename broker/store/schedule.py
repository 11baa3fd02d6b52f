"""Delayed delivery: RocketMQ's ScheduleMessageService on trio (ROCKETMQ_FACTS.md §6).

A message with a delay level (the ``DELAY`` property > 0: a producer's delayed message, or a retry copy made
by CONSUMER_SEND_MSG_BACK) is not stored in its topic. The put path calls :meth:`ScheduleMessageService.redirect`,
which parks it in ``SCHEDULE_TOPIC_XXXX`` queue ``level - 1`` with ``REAL_TOPIC`` / ``REAL_QID`` recording
where it belongs and the *due time* (store time + the level's delay, wall-clock ms) in the consume-queue
tags field. One task per level reads its queue in order and, once the head is due, re-appends it to the real
topic and queue: same body, flag, sys flag, born time and host, reconsume times and properties, minus
``DELAY`` (RocketMQ's ``messageTimeup``; ``REAL_TOPIC`` / ``REAL_QID`` stay, as in RocketMQ, for lineage).

Progress (the next schedule-queue offset of each level) lives in ``config/delayOffset.json`` with RocketMQ's
layout ``{"offsetTable": {"<level>": offset}}``, written atomically (temp file, fsync, rename) after
deliveries (coalesced, at most ~20 writes a second), at least every ``flush_delay_offset_interval_ms`` while
it changes, and at shutdown.

Guarantees, and how:

* **Never early.** A message is delivered only when the wall clock has reached its due time, which is stored
  with it (the consume-queue tags field), so a restart does not reset it. As in RocketMQ 4.9.3 a due time
  more than one delay ahead of now (clock moved back, bad value) is distrusted and the message delivered at
  once (``DelayLevelTable.correct_deliver_timestamp``).
* **Never lost.** Progress only moves past an entry after its copy was appended (PUT_OK), and the progress
  written to disk only past copies the store has already fsynced (under ASYNC_FLUSH a power cut loses the
  unflushed tail of the commit log; the progress must not claim those copies). A failed append is retried
  after 10 s (RocketMQ's DELAY_FOR_A_PERIOD).
* **Exactly once as far as the store can tell.** Every delivered copy carries ``TRIMQ_SCHEDULE_OFFSET`` =
  the commit-log offset of the schedule record it came from. A crash between an append and the next
  progress write leaves a window of entries that may already be delivered; after a restart each level
  first checks, entry by entry from its persisted offset, whether the real queue already holds a copy
  with that marker, and skips those. Deliveries within a level are sequential, so the first entry without
  a copy ends the check (records that cannot be delivered at all are dropped as before, without ending
  it). RocketMQ itself delivers that window twice.
* **Progress is checked against the log it describes.** A slave's progress comes from its master's (metadata
  sync), apart from the copies (replication), so a promoted slave can hold progress past an entry whose copy it
  never got. Before a level delivers (at start, or promoted), the entry before its progress must have its copy
  in this store, else the progress walks back to the last entry that has one (``_rewind_to_delivered``); the
  entries walked over are delivered again, so none is lost.

Waiting: a level task sleeps until its head entry is due (trio clock; the due times are wall-clock ms), or,
when its queue is empty, until :meth:`notify_arrival` (the store's arrival listener) says something was
appended to it, with a safety wake-up every ``flush_delay_offset_interval_ms``. Nothing busy-polls.
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from trimq.broker.store.atomic import StateFileError, read_json, write_json_atomic
from trimq.broker.store.consume_queue import UNIT
from trimq.broker.store.delay_levels import DEFAULT, DelayLevelTable
from trimq.broker.store.store_base import PutMessageStatus, PutResult
from trimq.protocol.message import MessageConst, MessageExt
from trimq.protocol.record import SYSFLAG_TRANSACTION_COMMIT, SYSFLAG_TRANSACTION_ROLLBACK
from trimq.protocol.validation import SCHEDULE_TOPIC
from trimq.runtime.logs import get_logger

__all__ = [
    "DELAY_FOR_A_PERIOD_S",
    "FILE_NAME",
    "SCHEDULE_OFFSET_PROPERTY",
    "DeliverRequest",
    "ScheduleMessageService",
    "ScheduleRedirect",
    "decode_offset_table",
    "delay_level_of",
    "encode_offset_table",
    "message_timeup",
    "read_units",
    "redirect_to_schedule",
]

log = get_logger("trimq.broker.schedule")

FILE_NAME = "delayOffset.json"

#: trimq's marker on a delivered copy: the commit-log offset of the schedule record it was made from.
SCHEDULE_OFFSET_PROPERTY = "TRIMQ_SCHEDULE_OFFSET"

#: After a failed re-append, wait this long before trying the same entry again (RocketMQ DELAY_FOR_A_PERIOD).
DELAY_FOR_A_PERIOD_S = 10.0

#: When copies wait for the store's fsync, write the progress again after this long.
PENDING_RECHECK_S = 0.5

#: Consume-queue units read per batch.
BATCH_UNITS = 32

#: Due-time slack when looking for an already delivered copy after a restart (clock jitter between the
#: due check and the append's store timestamp).
RECOVERY_SLACK_MS = 5_000

#: At most this many entries of a level are walked back over when its progress is ahead of the delivered copies
#: this store holds (after a promotion); older entries are taken as delivered.
REWIND_MAX_ENTRIES = 100_000

#: Transaction types RocketMQ schedules (CommitLog.asyncPutMessage): not transactional, or commit.
_TRAN_TYPE_MASK = SYSFLAG_TRANSACTION_ROLLBACK  # 0xC covers both bits


# -- pure parts ---------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ScheduleRedirect:
    """Where and how a delayed message is stored instead of its own topic."""

    topic: str
    queue_id: int
    properties: dict[str, str]
    tags_code: int
    level: int


@dataclass(frozen=True, slots=True)
class DeliverRequest:
    """The copy of a due schedule record to append to its real topic and queue."""

    topic: str
    queue_id: int
    body: bytes
    properties: dict[str, str]
    flag: int
    sys_flag: int
    born_timestamp: int
    born_host: tuple[str, int]
    reconsume_times: int


def delay_level_of(properties: Mapping[str, str]) -> int:
    """The ``DELAY`` property as an int (0 when absent); ValueError naming it when it is not an integer."""
    raw = properties.get(MessageConst.DELAY_TIME_LEVEL)
    if raw is None or raw == "":
        return 0
    try:
        return int(raw.strip())
    except ValueError:
        raise ValueError(f"property {MessageConst.DELAY_TIME_LEVEL}={raw!r} is not an integer delay level") from None


def redirect_to_schedule(table: DelayLevelTable, topic: str, queue_id: int, properties: Mapping[str, str],
                         now_ms: int, *, sys_flag: int = 0) -> ScheduleRedirect | None:
    """RocketMQ's CommitLog rule for a delayed message, or None when the message is not delayed.

    Delayed means ``DELAY`` > 0 on a non-transactional or commit message. The level is clamped to the
    table's maximum (and stored clamped); ``REAL_TOPIC`` / ``REAL_QID`` record ``topic`` / ``queue_id``; the
    result goes to ``SCHEDULE_TOPIC_XXXX`` queue ``level - 1`` with ``tags_code`` = ``now_ms`` + the delay
    (the caller passes the append's store time when it knows it, else the current wall-clock time).
    A ``DELAY`` that is not an integer raises ValueError.
    """
    level = delay_level_of(properties)
    if level <= 0:
        return None
    tran_type = sys_flag & _TRAN_TYPE_MASK
    if tran_type not in (0, SYSFLAG_TRANSACTION_COMMIT):
        return None
    level = table.clamp(level)
    props = dict(properties)
    props.pop(SCHEDULE_OFFSET_PROPERTY, None)  # a marker inherited from an earlier hop means nothing here
    props[MessageConst.DELAY_TIME_LEVEL] = str(level)
    props[MessageConst.REAL_TOPIC] = topic
    props[MessageConst.REAL_QUEUE_ID] = str(queue_id)
    return ScheduleRedirect(
        topic=SCHEDULE_TOPIC,
        queue_id=table.queue_id_for(level),
        properties=props,
        tags_code=table.due_time(level, now_ms),
        level=level,
    )


def message_timeup(msg: MessageExt) -> DeliverRequest:
    """RocketMQ's ``messageTimeup``: the copy of a due schedule record for its real topic and queue.

    Keeps every property but ``DELAY`` and adds the ``TRIMQ_SCHEDULE_OFFSET`` marker. Raises ValueError when
    ``REAL_TOPIC`` / ``REAL_QID`` are missing or malformed (such a record cannot be delivered anywhere).
    """
    props = dict(msg.properties)
    props.pop(MessageConst.DELAY_TIME_LEVEL, None)
    real_topic = props.get(MessageConst.REAL_TOPIC)
    raw_qid = props.get(MessageConst.REAL_QUEUE_ID)
    if not real_topic:
        raise ValueError(f"schedule record at {msg.commit_log_offset} has no {MessageConst.REAL_TOPIC} property")
    try:
        queue_id = int(raw_qid or "")
    except ValueError:
        raise ValueError(
            f"schedule record at {msg.commit_log_offset} has a bad {MessageConst.REAL_QUEUE_ID}={raw_qid!r}"
        ) from None
    if queue_id < 0:
        raise ValueError(f"schedule record at {msg.commit_log_offset} has a negative {MessageConst.REAL_QUEUE_ID}")
    props[SCHEDULE_OFFSET_PROPERTY] = str(msg.commit_log_offset)
    return DeliverRequest(
        topic=real_topic,
        queue_id=queue_id,
        body=msg.body,
        properties=props,
        flag=msg.flag,
        sys_flag=msg.sys_flag,
        born_timestamp=msg.born_timestamp,
        born_host=msg.born_host,
        reconsume_times=msg.reconsume_times,
    )


def is_copy_of(candidate: MessageExt, schedule_record: MessageExt) -> bool:
    """Whether ``candidate`` is the delivered copy of ``schedule_record`` (marker and position agree)."""
    return (
        candidate.commit_log_offset > schedule_record.commit_log_offset
        and candidate.properties.get(SCHEDULE_OFFSET_PROPERTY) == str(schedule_record.commit_log_offset)
    )


def encode_offset_table(offsets: Mapping[int, int]) -> dict[str, Any]:
    """RocketMQ's delayOffset.json content: ``{"offsetTable": {"<level>": offset}}``."""
    return {"offsetTable": {str(level): int(offset) for level, offset in sorted(offsets.items())}}


def decode_offset_table(data: object, *, source: str = FILE_NAME) -> dict[int, int]:
    """Parse delayOffset.json content; ValueError naming ``source`` and the bad entry."""
    if not isinstance(data, dict):
        raise ValueError(f"{source}: expected a map with an 'offsetTable' map")
    table = data.get("offsetTable", {})
    if not isinstance(table, dict):
        raise ValueError(f"{source}: 'offsetTable' must be a map")
    out: dict[int, int] = {}
    for key, value in table.items():
        try:
            level = int(key)
        except (TypeError, ValueError):
            raise ValueError(f"{source}: delay level {key!r} is not an integer") from None
        if level < 1:
            raise ValueError(f"{source}: delay level {key!r} must be >= 1")
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{source}: offset of level {key!r} must be a non-negative integer, got {value!r}")
        out[level] = value
    return out


def read_units(store: Any, topic: str, queue_id: int, offset: int, count: int) -> list[tuple[int, int, int]]:
    """``(commit-log offset, size, tags code)`` of up to ``count`` consume-queue units from ``offset`` (fewer
    at the end of a consume-queue file or of the queue; none outside it)."""
    cq = store.find_consume_queue(topic, queue_id)
    if cq is None or count <= 0:
        return []
    return list(UNIT.iter_unpack(cq.read_units(offset, count)))


def wall_clock_ms() -> int:
    """Milliseconds since the epoch (the store's timestamps and the due times use this clock)."""
    return time.time_ns() // 1_000_000


# -- the service ---------------------------------------------------------------------------------------

class _Topics(Protocol):
    """Where SCHEDULE_TOPIC_XXXX is created at start (broker/store/topics.py TopicConfigManager)."""

    def get(self, topic: str) -> Any: ...

    def ensure_topic(self, topic: str, queue_nums: int, perm: int = ...) -> Any: ...


class ScheduleMessageService:
    """Delivers delayed messages when due (a broker service).

    ``redirect`` is the put path's hook for delayed messages; ``notify_arrival`` wakes the level whose
    queue just got an entry (the store calls it after appending to ``SCHEDULE_TOPIC_XXXX``). ``store`` is
    the message store (broker/store/message_store.py), attached at once; ``topics``, when given, gets
    SCHEDULE_TOPIC_XXXX at start.
    """

    name = "schedule_message_service"

    def __init__(self, *, store: Any, store_dir: str, topics: _Topics | None = None,
                 delay_levels: str | DelayLevelTable | None = None, flush_interval_ms: int = 10_000,
                 now_ms: Callable[[], int] = wall_clock_ms) -> None:
        self.topics = topics
        if isinstance(delay_levels, DelayLevelTable):
            self.table = delay_levels
        else:
            self.table = DelayLevelTable.parse(delay_levels or DEFAULT)
        self.path = os.path.join(store_dir, "config", FILE_NAME)
        self.flush_interval_s = flush_interval_ms / 1000
        self.now_ms = now_ms
        self._store = store
        #: level -> next schedule-queue offset to deliver
        self.offsets: dict[int, int] = {}
        #: what delayOffset.json holds (as last written)
        self.persisted_offsets: dict[int, int] = {}
        #: level -> (offset after the entry, commit-log end of its copy), for copies maybe not yet fsynced
        self._pending: dict[int, deque[tuple[int, int]]] = {}
        self._changed = False
        self._arrivals: dict[int, trio.Event] = {}
        self._dirty = trio.Event()
        self._write_lock = trio.Lock()
        self._started = False
        self.delivered = 0
        self.skipped_duplicates = 0
        self.dropped = 0
        #: Whether this broker is a master (HA, issue 15; the composition root wires the HA role): as RocketMQ's
        #: handleScheduleMessageService, only a master delivers; a slave's progress comes from its master's
        #: delay offsets (metadata sync) and its copies from the replicated commit log.
        self.is_master: Callable[[], bool] = lambda: True
        self._role_changed = trio.Event()
        self.attach(store)

    def attach(self, store: Any) -> None:
        """Wire the store's extension points: the put hook (redirect), the SCHEDULE_TOPIC_XXXX tags-code rule
        (due time = store time + delay, used on append and when recovery rebuilds units) and arrivals.
        Must happen before the store starts, so recovery computes due times the same way."""
        self._store = store
        store.put_hook = self._put_hook
        store.tags_code_resolvers[SCHEDULE_TOPIC] = self._resolve_tags_code
        if self._on_arrival not in store.arrival_listeners:
            store.arrival_listeners.append(self._on_arrival)

    @property
    def store(self) -> Any:
        return self._store

    @property
    def max_delay_level(self) -> int:
        return self.table.max_level

    # -- hooks for the put path ----------------------------------------------------------------
    def redirect(self, topic: str, queue_id: int, properties: Mapping[str, str], *, sys_flag: int = 0,
                 store_timestamp_ms: int | None = None) -> ScheduleRedirect | None:
        """The SCHEDULE_TOPIC_XXXX version of a delayed message, None for any other message.

        ``store_timestamp_ms`` (when the store knows the append's store time) is the base of the due time;
        otherwise the current wall-clock time is.
        """
        if topic == SCHEDULE_TOPIC:
            return None  # already redirected (e.g. re-dispatch during recovery)
        base = self.now_ms() if store_timestamp_ms is None else store_timestamp_ms
        return redirect_to_schedule(self.table, topic, queue_id, properties, base, sys_flag=sys_flag)

    def deliver_timestamp(self, properties: Mapping[str, str], store_timestamp_ms: int) -> int:
        """The tags code of a schedule record rebuilt from the commit log (RocketMQ computes it on dispatch):
        store time + the delay of its ``DELAY`` level (store time + 1 s for an unknown level)."""
        try:
            level = delay_level_of(properties)
        except ValueError:
            level = 0
        return self.table.compute_deliver_timestamp(level, store_timestamp_ms)

    def _put_hook(self, req: Any) -> Any:
        """The store's ``put_hook`` (called for DELAY > 0): rewrite ``req`` into its schedule version.

        Returns None to let the store append the rewritten request, or a MESSAGE_ILLEGAL PutResult when
        the DELAY property is unusable. The tags code is left to the SCHEDULE_TOPIC_XXXX resolver, which
        computes the due time from the append's own store timestamp.
        """
        try:
            r = self.redirect(req.topic, req.queue_id, req.property_map(), sys_flag=req.sys_flag)
        except ValueError as exc:
            return PutResult(PutMessageStatus.MESSAGE_ILLEGAL, remark=str(exc))
        if r is not None:
            req.topic = r.topic
            req.queue_id = r.queue_id
            req.set_properties(r.properties)
            req.tags_code = None
        return None

    def _resolve_tags_code(self, properties: dict[str, str], store_timestamp_ms: int) -> int:
        return self.deliver_timestamp(properties, store_timestamp_ms)

    def _on_arrival(self, topic: str, queue_id: int, new_max: int) -> None:
        self.notify_arrival(topic, queue_id)

    def notify_arrival(self, topic: str, queue_id: int) -> None:
        """An entry was appended to ``topic`` / ``queue_id``: wake that level if it is idle. Cheap, synchronous."""
        if topic != SCHEDULE_TOPIC:
            return
        ev = self._arrivals.get(queue_id + 1)
        if ev is not None:
            ev.set()

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        self.load()
        topics = self.topics
        if topics is not None and topics.get(SCHEDULE_TOPIC) is None:
            # Like RocketMQ's TopicConfigManager: the system topic has one queue per level.
            topics.ensure_topic(SCHEDULE_TOPIC, self.table.max_level, 6)
        self._started = True

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._persist_loop)
            task_status.started()
            while True:
                self._role_changed = trio.Event()
                if not self.is_master():
                    log.info("schedule.idle_on_slave", why="a slave does not deliver delayed messages")
                    await self._role_changed.wait()
                    continue
                async with trio.open_nursery() as delivery:
                    for level in self.table.levels():
                        delivery.start_soon(self._deliver_level, level)
                    while self.is_master():
                        await self._role_changed.wait()
                        self._role_changed = trio.Event()
                    log.info("schedule.stopped_on_slave", why="demoted: the master delivers delayed messages")
                    delivery.cancel_scope.cancel()

    def role_changed(self) -> None:
        """The broker's HA role changed: deliver from now on (promoted) or stop delivering (demoted)."""
        self._role_changed.set()

    async def stop(self) -> None:
        if self._started:
            flush = getattr(self.store, "flush", None)
            if flush is not None:
                await flush()  # so the final progress covers every copy appended
            await self.persist()

    def load(self) -> None:
        """Read delayOffset.json (missing = every level from its queue's start). A bad file raises ValueError:
        guessing would redeliver or skip delayed messages."""
        data = read_json(self.path, default=None)
        try:
            self.offsets = {} if data is None else decode_offset_table(data, source=self.path)
        except ValueError as exc:
            raise StateFileError(str(exc)) from None
        for level in self.table.levels():
            self.offsets.setdefault(level, 0)

    def durable_offsets(self) -> dict[int, int]:
        """The progress that is safe to persist: per level, past the entries whose copies the store has
        fsynced. Persisting further would lose the unflushed copies on a power cut; persisting less only
        means the restart finds those copies (marker check) instead of appending them again."""
        flushed = self._flushed_offset()
        out = dict(self.offsets)
        for level, pending in self._pending.items():
            while pending and pending[0][1] <= flushed:
                pending.popleft()
            if pending:
                out[level] = pending[0][0] - 1  # the first entry whose copy is not durable yet
        return out

    def _flushed_offset(self) -> int:
        commitlog = getattr(self.store, "commitlog", None)
        flushed = getattr(commitlog, "flushed_offset", None)
        return flushed if isinstance(flushed, int) else 2**63 - 1

    async def persist(self) -> None:
        """Write the durable progress atomically (worker thread); writes are serialized, newest last."""
        async with self._write_lock:
            snapshot = encode_offset_table(self.durable_offsets())
            await trio.to_thread.run_sync(write_json_atomic, self.path, snapshot)
            self.persisted_offsets = decode_offset_table(snapshot)

    def _set_offset(self, level: int, offset: int, copy_end: int | None = None) -> None:
        """Progress of ``level`` moved to ``offset``; ``copy_end`` is the commit-log end of the copy just
        appended for entry ``offset - 1`` (None when nothing was appended)."""
        self.offsets[level] = offset
        if copy_end is not None:
            self._pending.setdefault(level, deque()).append((offset, copy_end))
        self._changed = True
        self._dirty.set()

    async def _persist_loop(self) -> None:
        while True:
            with trio.move_on_after(self.flush_interval_s):
                await self._dirty.wait()
            self._dirty = trio.Event()
            if not self._changed:
                continue
            self._changed = False
            try:
                await self.persist()
            except OSError as exc:
                self._changed = True  # retried at the next delivery or the safety wake-up, not in a tight loop
                log.error("schedule.persist_failed", path=self.path, error=str(exc))
                continue
            if self.persisted_offsets != self.offsets:
                # What was written is behind: copies still waiting for the store's next fsync, or fsynced while the
                # older snapshot was being written (comparing the durable progress now would stop here with the
                # file behind until the next delivery). Write again once the fsync is likely done.
                await trio.sleep(PENDING_RECHECK_S)
                self._changed = True
                self._dirty.set()
            else:
                # Coalesce bursts: at most ~20 writes a second whatever the delivery rate.
                await trio.sleep(0.05)

    # -- delivery ----------------------------------------------------------------------------------
    async def _deliver_level(self, level: int) -> None:
        queue_id = self.table.queue_id_for(level)
        store = self.store
        recovering = True  # until the first entry with no delivered copy (see the module docstring)
        finder = _CopyFinder(store, self.table)
        offset = await self._rewind_to_delivered(level, queue_id, self.offsets.get(level, 0), finder)
        if offset != self.offsets.get(level, 0):
            self._set_offset(level, offset)
        while True:
            arrival = trio.Event()
            self._arrivals[level] = arrival  # before reading max: an append after this sets it
            min_offset = store.get_min_offset_in_queue(SCHEDULE_TOPIC, queue_id)
            max_offset = store.get_max_offset_in_queue(SCHEDULE_TOPIC, queue_id)
            if offset < min_offset:
                log.warning("schedule.offset_below_min", level=level, offset=offset, min_offset=min_offset)
                offset = min_offset
                self._set_offset(level, offset)
            elif offset > max_offset:
                # The queue is shorter than the progress says (store truncated after a crash): entries
                # appended from now on must not be skipped.
                log.warning("schedule.offset_above_max", level=level, offset=offset, max_offset=max_offset)
                offset = max_offset
                self._set_offset(level, offset)
            if offset >= max_offset:
                recovering = False
                finder.clear()
                with trio.move_on_after(self.flush_interval_s):  # belt and braces; arrivals wake it
                    await arrival.wait()
                continue
            units = self._read_units(queue_id, offset, min(BATCH_UNITS, max_offset - offset))
            if not units:
                await trio.sleep(0.1)  # RocketMQ DELAY_FOR_A_WHILE: the unit is not readable yet
                continue
            for phys, _size, tags_code in units:
                now = self.now_ms()
                due = self.table.correct_deliver_timestamp(now, tags_code, level)
                if due > now:
                    await trio.sleep(math.ceil(due - now) / 1000)
                    break
                msg = store.lookup_message_by_offset(phys)
                if msg is None:
                    log.error("schedule.record_missing", level=level, offset=offset, commit_log_offset=phys)
                    self.dropped += 1
                    offset += 1
                    self._set_offset(level, offset)
                    continue
                try:
                    req = message_timeup(msg)
                except ValueError as exc:
                    log.error("schedule.record_undeliverable", level=level, offset=offset, error=str(exc))
                    self.dropped += 1
                    offset += 1
                    self._set_offset(level, offset)
                    continue
                if recovering:
                    if await finder.has_copy(msg):
                        log.info("schedule.duplicate_skipped", level=level, offset=offset,
                                 commit_log_offset=phys)
                        self.skipped_duplicates += 1
                        offset += 1
                        self._set_offset(level, offset)
                        continue
                    recovering = False
                    finder.clear()
                result = await store.put_message(
                    req.topic, req.queue_id, req.body, req.properties, flag=req.flag, sys_flag=req.sys_flag,
                    born_timestamp=req.born_timestamp, born_host=req.born_host,
                    reconsume_times=req.reconsume_times,
                )
                # No checkpoint between the append returning and the progress moving.
                if _status_name(result) == "PUT_OK":
                    offset += 1
                    self._set_offset(level, offset, _copy_end(result))
                    self.delivered += 1
                    continue
                log.error("schedule.reput_failed", level=level, offset=offset, topic=req.topic,
                          status=_status_name(result), msg_id=msg.msg_id)
                await trio.sleep(DELAY_FOR_A_PERIOD_S)
                break

    def _read_units(self, queue_id: int, offset: int, count: int) -> list[tuple[int, int, int]]:
        return read_units(self.store, SCHEDULE_TOPIC, queue_id, offset, count)

    async def _rewind_to_delivered(self, level: int, queue_id: int, offset: int, finder: _CopyFinder) -> int:
        """``offset`` checked against this store: the entry before it must have its copy here, else the progress
        walks back to the last entry whose copy is here (at most :data:`REWIND_MAX_ENTRIES`).

        Progress can be ahead of the commit log it describes: a slave takes its master's progress by the metadata
        sync, apart from the replication that brings the copies, so a master lost while a copy was still in flight
        leaves a promoted slave (or a demoted master come back) with progress past an entry it has no copy of.
        Deliveries within a level are sequential, so once one entry's copy is found every earlier entry is
        delivered; the entries walked over are delivered again (the recovery check skips any copy it finds).
        """
        store = self.store
        min_offset = store.get_min_offset_in_queue(SCHEDULE_TOPIC, queue_id)
        if offset > store.get_max_offset_in_queue(SCHEDULE_TOPIC, queue_id):
            return offset  # the delivery loop's truncation rule applies
        checked = offset
        while checked > min_offset and offset - checked < REWIND_MAX_ENTRIES:
            units = self._read_units(queue_id, checked - 1, 1)
            if not units:
                break
            record = store.lookup_message_by_offset(units[0][0])
            if record is not None and await finder.has_copy(record):
                break
            checked -= 1  # no copy here: delivered again (or, if undeliverable, dropped again)
        if checked < offset:
            log.warning("schedule.progress_rewound", level=level, offset=offset, rewound_to=checked,
                        why="entries before the progress have no delivered copy in this store")
        return checked


class _CopyFinder:
    """Finds the delivered copy of a schedule record in its real queue by the copy's marker (the restart and
    promotion checks of one level).

    Each real queue is read at most once: from just before the earliest due time asked about, forward only as far
    as needed (a copy is appended at about its due time, so it is found near the start). A question about an
    earlier record reads the part before what was read; markers found on the way are kept. Nothing of the level is
    delivered while it checks, so what was read stays true.
    """

    def __init__(self, store: Any, table: DelayLevelTable) -> None:
        self._store = store
        self._table = table
        #: real queue -> [first read position, end of what was read, marker -> commit-log offset of the copy]
        self._spans: dict[tuple[str, int], tuple[list[int], dict[str, int]]] = {}

    def clear(self) -> None:
        self._spans.clear()

    async def has_copy(self, schedule_record: MessageExt) -> bool:
        """Whether the real queue of ``schedule_record`` holds its delivered copy."""
        props = schedule_record.properties
        topic = props.get(MessageConst.REAL_TOPIC)
        try:
            queue_id = int(props.get(MessageConst.REAL_QUEUE_ID) or "")
        except ValueError:
            return False
        if not topic or queue_id < 0:
            return False
        marker, after = str(schedule_record.commit_log_offset), schedule_record.commit_log_offset
        start = self._start(schedule_record, topic, queue_id)
        span = self._spans.get((topic, queue_id))
        if span is None:
            span = self._spans[(topic, queue_id)] = ([start, start], {})
        bounds, markers = span
        if start < bounds[0]:
            await self._read(topic, queue_id, start, bounds[0], markers)
            bounds[0] = start
        end = self._store.get_max_offset_in_queue(topic, queue_id)
        while True:
            copy_at = markers.get(marker)
            if copy_at is not None and copy_at > after:
                return True
            read = await self._read(topic, queue_id, bounds[1], min(bounds[1] + BATCH_UNITS, end), markers)
            if not read:
                return False
            bounds[1] += read

    def _start(self, schedule_record: MessageExt, topic: str, queue_id: int) -> int:
        """The real-queue position from which the copy can be there: just before the record's due time."""
        store = self._store
        lower = schedule_record.store_timestamp
        try:
            level = self._table.clamp(delay_level_of(schedule_record.properties))
            lower = max(lower, self._table.due_time(level, schedule_record.store_timestamp) - RECOVERY_SLACK_MS)
        except ValueError:
            pass
        return max(store.get_min_offset_in_queue(topic, queue_id),
                   store.get_offset_in_queue_by_time(topic, queue_id, lower) - 1)

    async def _read(self, topic: str, queue_id: int, pos: int, end: int, markers: dict[str, int]) -> int:
        """Collect the markers of the records at ``pos`` .. ``end``; returns how many units were read."""
        store = self._store
        done = 0
        while pos + done < end:
            units = read_units(store, topic, queue_id, pos + done, min(BATCH_UNITS, end - pos - done))
            if not units:
                break
            for phys, _size, _tags in units:
                candidate = store.lookup_message_by_offset(phys)
                found = candidate.properties.get(SCHEDULE_OFFSET_PROPERTY) if candidate is not None else None
                if found is not None:
                    markers[found] = phys
            done += len(units)
            await trio.lowlevel.checkpoint()  # a long read must not starve the other tasks
        return done


def _copy_end(result: Any) -> int:
    """Commit-log end of an appended copy (0 when the result does not say: treated as durable)."""
    start = getattr(result, "commit_log_offset", -1)
    size = getattr(result, "wrote_bytes", 0)
    return start + size if isinstance(start, int) and start >= 0 and isinstance(size, int) else 0


def _status_name(result: Any) -> str:
    status = getattr(result, "status", result)
    return str(getattr(status, "name", status))
