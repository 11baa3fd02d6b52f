"""Keeping the message index up to date and answering lookups (docs/STORAGE.md §10).

``IndexDispatcher`` is RocketMQ's ReputMessageService + CommitLogDispatcherBuildIndex for the index only (the
consume queues are written by the append itself, broker/store/message_store.py): a task of the store's
nursery reads records back from the commit log and hands their keys to the
:class:`~trimq.broker.store.index.IndexService`. An append only notes the offsets of its records that carry
``KEYS`` or ``UNIQ_KEY`` (``note_keyed``) and wakes the task, so indexing never adds to a send's latency and
messages without keys cost nothing; the task runs in slices of ``batch_records`` records between which other
tasks run.

* **Recovery** (``recover``, at store start, blocking): the index's files are loaded and dispatching resumes
  after the newest record they indexed; with no file, from the log's first record (a store written before
  the index existed gets one built in the background). When the index is ahead of a log whose torn tail was
  cut, its end moves back so the records written there next are indexed. Up to the log's end at start the
  task scans the log (``mmap.find`` skips the bytes up to the next ``KEY``, so messages without keys cost
  little); past it, the appends' notes say where the records with keys are.
* **Durability**: changed index files are msynced every ``flush_interval_ms`` in a worker thread and at stop.
  A crash may lose the newest entries of files not yet synced: they are rebuilt only for records past the
  newest entry that survived (an older gap stays unindexed — the index is an aid to find messages, never a
  source of truth: every hit is read back and checked).
* **Lookups** (``query_messages``): candidates from the index, each record read back and kept only when its
  topic, store time and key match, so hash collisions and stale entries never reach the caller. A lookup
  first waits (at most ``wait_s``) until everything stored before it is indexed.

Time: the flush loop sleeps on trio's clock (a MockClock drives it in tests).
"""

from __future__ import annotations

import mmap
import struct
import time
from dataclasses import dataclass, field
from typing import Protocol

import trio

from trimq.broker.store.commitlog import CommitLog
from trimq.broker.store.index import IndexRecord, IndexService, QueryOffsetResult
from trimq.protocol.errors import RecordError
from trimq.protocol.message import MessageConst, MessageExt, get_property
from trimq.protocol.record import (
    BLANK_MAGIC_CODE,
    MESSAGE_MAGIC_CODE,
    POS_BORN_HOST,
    SYSFLAG_BORNHOST_V6,
    decode_record,
)
from trimq.runtime.logs import RateLimiter, get_logger, log_rate_limited

log = get_logger("trimq.store.index")

__all__ = ["IndexDispatcher", "LogSource", "QueryMessageResult"]

_SIZE_MAGIC = struct.Struct(">iI")
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_I64 = struct.Struct(">q")
_STOREHOST_V6 = 0x20
_MARKERS = (b"KEYS\x01", b"UNIQ_KEY\x01")
_KEYS = MessageConst.KEYS
_UNIQ_KEY = MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX
_KEYS_NAME = _KEYS + "\x01"
_UNIQ_KEY_NAME = _UNIQ_KEY + "\x01"


class LogSource(Protocol):
    """Where the records are (MessageStore: its ``commitlog`` may be replaced while the store loads)."""

    commitlog: CommitLog


@dataclass(slots=True)
class QueryMessageResult:
    """Raw records found for a key, oldest first, and the index's newest entry (RocketMQ's QueryMessageResult)."""

    records: list[bytes] = field(default_factory=list)
    messages: list[MessageExt] = field(default_factory=list)
    index_last_update_timestamp: int = 0
    index_last_update_phyoffset: int = 0


def _next_marker(mm: mmap.mmap, start: int, end: int) -> int:
    """Where the next ``KEY`` (of a KEYS or UNIQ_KEY property name, or anything else) is in ``mm[start:end]``,
    -1: nowhere. One search for what both names share is faster than one for each."""
    return mm.find(b"KEY", start, end)


class IndexDispatcher:
    """See the module docstring. ``enabled`` False (``message_index_enable = false``): nothing is indexed and
    lookups find nothing; files already on disk are left alone."""

    def __init__(self, index: IndexService, source: LogSource, *, enabled: bool = True,
                 flush_interval_ms: int = 1_000, batch_records: int = 256) -> None:
        self.index = index
        self.source = source
        self.enabled = enabled
        self.flush_interval_ms = flush_interval_ms
        self.batch_records = batch_records
        #: Every record below this commit-log offset has been handed to the index.
        self.dispatched = 0
        self.records_indexed = 0
        self.entries_written = 0
        self._skip_at = -1  # the record at this offset was indexed before the restart: not again
        self._recovered_end = 0  # below it the log is scanned; from it on, ``keyed`` lists what to index
        #: Offsets of appended records with KEYS or UNIQ_KEY not indexed yet, ascending (None: index off).
        self.keyed: list[int] | None = [] if enabled else None
        #: What the append already knew of some of them (``note_keyed(..., known)``): offset -> (topic, store
        #: time, sys flag, property string), so they are indexed without reading the record back from the log.
        self._known: dict[int, tuple[str, int, int, str]] = {}
        self._wakeup = trio.Event()
        self._waiters: list[tuple[int, trio.Event]] = []
        self._topics: dict[bytes, str] = {}
        self._errors = RateLimiter(60_000)

    # -- lifecycle ------------------------------------------------------------------------------------
    def recover(self) -> None:
        """Load the index files and decide where dispatching resumes (blocking; at store start, after the
        commit log was recovered)."""
        if not self.enabled:
            return
        cl = self.source.commitlog
        self.index.load()
        end = cl.max_offset
        if not self.index.files:
            resume, self._skip_at = cl.min_offset, -1
        else:
            resume = self.index.end_phy_offset
            self._skip_at = resume
            if resume >= end:
                # The index has entries for records the log no longer has (its tail was cut): they are never
                # returned (lookups check each record), and records written there from now on get indexed.
                if resume > end:
                    log.warning("index.ahead_of_log", index_end_phy_offset=resume, commitlog_end=end)
                self.index.reset_end_phy_offset(end)
                resume, self._skip_at = end, -1
        if resume < cl.min_offset:
            resume, self._skip_at = cl.min_offset, -1
        self.dispatched = resume
        self._recovered_end = end
        log.info("index.recovered", files=len(self.index.files), resume_from=resume, commitlog_end=end,
                 behind_bytes=end - resume)

    def close(self) -> None:
        """msync and unmap the index files (blocking; at store stop)."""
        self.index.close()

    def wake(self) -> None:
        """The commit log grew (called by the append path): dispatch soon."""
        self._wakeup.set()

    def note_keyed(self, offsets: list[int], known: list[tuple[str, int, int, str]] | None = None) -> None:
        """Records at these commit-log offsets (ascending, appended just now) have KEYS or UNIQ_KEY. ``known``
        (optional, one per offset): each record's (topic, store timestamp, sys flag, property string) as the
        append wrote it, which spares reading the record back (the index's main cost per message)."""
        if self.keyed is not None:
            self.keyed.extend(offsets)
            if known is not None:
                self._known.update(zip(offsets, known, strict=True))

    async def run(self) -> None:
        """Dispatch whenever woken, msync changed files every ``flush_interval_ms``; until cancelled."""
        if not self.enabled:
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._flush_loop)
            while True:
                self._wakeup = trio.Event()  # before dispatching: an append meanwhile sets this one
                await trio.lowlevel.checkpoint()  # the sends that are ready run first: one pass for a burst
                while self.dispatch_some(self.batch_records):
                    self._notify()
                    await trio.sleep(0)  # let sends and pulls run between slices
                self._notify()
                await self._wakeup.wait()

    async def _flush_loop(self) -> None:
        index = self.index
        while True:
            await trio.sleep(self.flush_interval_ms / 1000)
            dirty = index.dirty_files()
            if dirty:
                try:
                    await trio.to_thread.run_sync(index.flush, dirty)
                except OSError as exc:
                    log_rate_limited(self._errors, "flush", _mono_ms(), log.error, "index.flush_failed", error=str(exc))
            index.close_retired()

    # -- dispatching ----------------------------------------------------------------------------------
    @property
    def caught_up(self) -> bool:
        return self.keyed is None or (self.dispatched >= self._recovered_end and not self.keyed)

    def dispatch_some(self, max_records: int) -> bool:
        """Index up to ``max_records`` records past ``dispatched``; True while more remain (synchronous)."""
        if self.keyed is None:
            return False
        cl = self.source.commitlog
        if self.dispatched < cl.min_offset:  # the records in between were deleted before being indexed
            self.dispatched = cl.min_offset
        if self.dispatched < self._recovered_end:  # catching up with what was stored before this start
            limit = min(self._recovered_end, cl.max_offset)
            budget = max_records
            while self.dispatched < limit and budget > 0:
                seg = cl.segment_for(self.dispatched)
                if seg is None:
                    self._give_up(limit, "no segment holds it")
                    break
                budget -= self._scan(seg.mm, seg.start, seg.end, limit, budget)
            self.index.sync_headers()
            if self.dispatched < self._recovered_end:
                return True
        # What was appended since: the appends noted the records to read.
        keyed = self.keyed
        take = keyed[:max_records]
        del keyed[:max_records]
        low = max(self.dispatched, cl.min_offset)
        known = self._known
        batch: list[IndexRecord] = []  # in offset order: the index skips a record older than its newest entry
        for offset in take:
            data = known.pop(offset, None) if known else None
            if offset < low:
                continue
            if data is not None and offset < cl.max_offset:
                topic, store_ts, sys_flag, props = data
                # (most records carry a UNIQ_KEY and no KEYS: a substring test spares the second lookup)
                batch.append((topic, offset, store_ts, sys_flag,
                              get_property(props, _KEYS) if _KEYS_NAME in props else None,
                              get_property(props, _UNIQ_KEY) if _UNIQ_KEY_NAME in props else None))
            else:
                self._index_batch(batch)
                self._index_at(cl, offset)
        self._index_batch(batch)
        if not keyed and known:
            known.clear()  # left by offsets dropped from ``keyed`` (a slave's cut tail): never looked up again
        self.dispatched = keyed[0] if keyed else max(self.dispatched, cl.max_offset)
        self.index.sync_headers()
        return bool(keyed)

    def _index_at(self, cl: CommitLog, offset: int) -> None:
        seg = cl.segment_for(offset)
        if seg is None:
            return
        buf = memoryview(seg.mm)
        try:
            rel = offset - seg.start
            size, magic = _SIZE_MAGIC.unpack_from(buf, rel)
            if magic == MESSAGE_MAGIC_CODE and size >= 91 and offset + size <= seg.end:
                self._index_record(buf, rel, offset, self.index)
        finally:
            buf.release()

    def dispatch_all(self) -> None:
        """Index everything the commit log holds now (tests, and callers that cannot wait for the task)."""
        while self.dispatch_some(1 << 16):
            pass
        self._notify()

    def _give_up(self, limit: int, why: str) -> None:
        # Not a record boundary (a damaged index end, or damage in the log the recovery let through): the
        # records up to ``limit`` cannot be indexed; carry on after them.
        log_rate_limited(self._errors, "scan", _mono_ms(), log.error, "index.dispatch_skipped",
                         from_offset=self.dispatched, to_offset=limit, reason=why)
        self.dispatched = limit

    def _scan(self, mm: mmap.mmap, seg_start: int, seg_end: int, limit: int, budget: int) -> int:
        """Index the records of one segment from ``dispatched`` up to ``limit``; returns how many were looked at.

        Only records with keys cost Python work: the bytes up to the next ``KEYS``/``UNIQ_KEY`` property name
        are skipped with ``mmap.find`` (a byte search for ``KEY``), so a run of messages without keys is passed
        over at once. (A body holding those bytes only makes the walk look at a few more records.)"""
        pos = self.dispatched
        end = min(seg_end, limit)
        seen = 0
        index = self.index
        rel_end = end - seg_start
        buf = memoryview(mm)
        try:
            nxt = _next_marker(mm, pos - seg_start, rel_end)
            while pos < end and seen < budget:
                if nxt < 0:
                    pos = end  # no key in the rest: nothing to index there (the filler, if any, included)
                    break
                rel = pos - seg_start
                size, magic = _SIZE_MAGIC.unpack_from(buf, rel)
                if magic == BLANK_MAGIC_CODE:
                    pos = seg_end  # the filler closes the segment: the log continues in the next one
                    break
                if magic != MESSAGE_MAGIC_CODE or size < 91 or pos + size > end:
                    self.dispatched = pos
                    self._give_up(limit, f"no record at {pos} (size {size}, magic {magic:#x})")
                    return seen
                seen += 1
                if rel + size <= nxt:  # the next key is in a later record
                    pos += size
                    continue
                if pos == self._skip_at:
                    self._skip_at = -1
                else:
                    self._index_record(buf, rel, pos, index)
                pos += size
                nxt = _next_marker(mm, pos - seg_start, rel_end)
        finally:
            buf.release()
        self.dispatched = pos
        return max(seen, 1)

    def _index_batch(self, batch: list[IndexRecord]) -> None:
        """Index what the appends noted (the same fields ``_index_record`` reads back); empties ``batch``."""
        if batch:
            records, entries = self.index.build_index_batch(batch)
            self.records_indexed += records
            self.entries_written += entries
            batch.clear()

    def _index_record(self, buf: memoryview, rel: int, pos: int, index: IndexService) -> None:
        (sys_flag,) = _I32.unpack_from(buf, rel + 36)
        p = rel + POS_BORN_HOST + (20 if sys_flag & SYSFLAG_BORNHOST_V6 else 8)
        (store_ts,) = _I64.unpack_from(buf, p)
        p += 8 + (20 if sys_flag & _STOREHOST_V6 else 8) + 12
        (body_len,) = _I32.unpack_from(buf, p)
        p += 4 + body_len
        topic_len = buf[p]
        topic_b = bytes(buf[p + 1: p + 1 + topic_len])
        p += 1 + topic_len
        (props_len,) = _I16.unpack_from(buf, p)
        props_b = bytes(buf[p + 2: p + 2 + props_len])
        if _MARKERS[0] not in props_b and _MARKERS[1] not in props_b:
            return  # the bytes were in the body
        topic = self._topics.get(topic_b)
        if topic is None:
            topic = topic_b.decode("utf-8", "replace")
            if len(self._topics) < 10_000:
                self._topics[topic_b] = topic
        props = props_b.decode("utf-8", "replace")
        n = index.build_index(topic, pos, store_ts, sys_flag, get_property(props, MessageConst.KEYS),
                              get_property(props, MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX))
        if n:
            self.records_indexed += 1
            self.entries_written += n

    # -- waiting --------------------------------------------------------------------------------------
    def _notify(self) -> None:
        if self._waiters:
            done = self.dispatched
            keep = []
            for offset, ev in self._waiters:
                if offset <= done:
                    ev.set()
                else:
                    keep.append((offset, ev))
            self._waiters = keep

    async def wait_dispatched(self, offset: int, timeout_s: float) -> bool:
        """Wait until every record below ``offset`` is indexed (at most ``timeout_s``); whether it is."""
        if self.keyed is None or self.dispatched >= offset or self.caught_up:
            return True
        ev = trio.Event()
        self._waiters.append((offset, ev))
        self.wake()
        with trio.move_on_after(timeout_s):
            await ev.wait()
        return self.dispatched >= offset

    # -- lookups --------------------------------------------------------------------------------------
    def query_messages(self, topic: str, key: str, max_num: int, begin: int, end: int, *,
                       unique: bool = False) -> QueryMessageResult:
        """The records of ``topic`` stored in ``[begin, end]`` (ms) whose KEYS hold ``key`` (``unique``: whose
        UNIQ_KEY is ``key``): the newest ``max_num`` (capped at ``max_msgs_num_batch``), oldest first."""
        result = QueryMessageResult()
        if not self.enabled:
            return result
        cl = self.source.commitlog
        found: dict[int, tuple[bytes, MessageExt]] = {}

        def accept(offset: int) -> bool:
            if offset in found:
                return False  # the same record indexed twice (a restart): one answer
            msg = _read(cl, offset)
            if msg is None or msg[1].topic != topic or not begin <= msg[1].store_timestamp <= end:
                return False
            props = msg[1].properties
            if unique:
                ok = props.get(MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX) == key
            else:
                ok = key in (props.get(MessageConst.KEYS) or "").split(" ")
            if ok:
                found[offset] = msg
            return ok

        # The index keeps seconds since each file's begin: widen the window by one second there, the store
        # time of each record decides exactly.
        q: QueryOffsetResult = self.index.query_offset(topic, key, max_num, begin - 1000, end, accept)
        result.index_last_update_timestamp = q.index_last_update_timestamp
        result.index_last_update_phyoffset = q.index_last_update_phyoffset
        for offset in q.phy_offsets:
            raw, msg = found[offset]
            result.records.append(raw)
            result.messages.append(msg)
        return result


def _mono_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def _read(cl: CommitLog, offset: int) -> tuple[bytes, MessageExt] | None:
    size = cl.record_size_at(offset)
    if size is None:
        return None
    raw = cl.read(offset, size)
    if raw is None:
        return None
    try:
        return raw, decode_record(raw, check_crc=False)
    except RecordError:
        return None

