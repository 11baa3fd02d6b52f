"""The MessageStore: commit log + consume queues + flushing + recovery (docs/STORAGE.md).

One object per broker, registered as ``broker.components["store"]`` and run as a broker service.

* **Appends** (``put_message``, ``put_messages``) encode records and write them with no await between
  choosing the position and updating it, so appends are serialized by construction (one writer) while
  pulls, which only slice mapped memory, never wait for them. The only await before an append is for a
  new segment file when the prepared one is not ready (files are created ahead of need in a thread).
  Consume-queue units are written in the same step, so a message is pullable as soon as its send returns.
* **Flushing**: ASYNC_FLUSH fsyncs every ``flush_interval_ms``; SYNC_FLUSH answers a put only once its
  bytes are fsynced, and every put that arrives while an fsync runs shares the next one (group commit).
  Both modes fsync the consume queues and write the checkpoint on the interval.
* **Recovery** (``start``): scan the commit log from the checkpoint, verify magic/CRC/offsets, cut the torn
  tail, repair consume-queue tails, rebuild the units past the last valid one, then serve.
* **Reclaim** (``broker/store/clean.py``): expired segments and the consume-queue files that follow them are
  deleted as RocketMQ does; a nearly full disk refuses writes.
* **Index** (``broker/store/index.py``, ``index_dispatch.py``): RocketMQ's index files, written by a task of
  their own from the commit log (an append only wakes it), rebuilt past their newest entry at start.

Extension points for the later services: ``arrival_listeners`` (long polling), ``put_hook`` (the
schedule service redirects DELAY messages to SCHEDULE_TOPIC_XXXX there) and ``tags_code_resolvers``
(per-topic rule for the consume-queue tags field, e.g. the delivery time of scheduled messages).
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import functools
import ipaddress
import os
import resource
import shutil
import struct
import time
import zlib
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from trimq.broker.store.atomic import fsync_dir, read_json, write_json_atomic
from trimq.broker.store.checkpoint import Checkpoint, CheckpointError, read_checkpoint, write_checkpoint
from trimq.broker.store.clean import CleanService, disk_partition_space_used_ratio
from trimq.broker.store.commitlog import CommitLog, RecordEncoder, ScanRecord, StoreError, file_name, host_sys_flag
from trimq.broker.store.consume_queue import CQ_STORE_UNIT_SIZE, UNIT, ConsumeQueue, tags_string_to_tags_code
from trimq.broker.store.index import DEFAULT_MAX_HASH_SLOT_NUM, DEFAULT_MAX_INDEX_NUM, IndexService
from trimq.broker.store.index_dispatch import IndexDispatcher
from trimq.broker.store.recovery import RecoveryReport, check_queue_tail, first_store_timestamp, scan_commit_log
from trimq.protocol.errors import RecordError
from trimq.protocol.message import MAX_PROPERTIES_BYTES, MessageConst, MessageExt, decode_properties, encode_properties
from trimq.protocol.record import decode_record
from trimq.protocol.validation import InvalidNameError, check_topic
from trimq.runtime.logs import RateLimiter, get_logger, log_rate_limited

log = get_logger("trimq.store")

__all__ = [
    "RECLAIM_SETTINGS",
    "GetMessageResult",
    "GetMessageStatus",
    "MessageStore",
    "PutMessageStatus",
    "PutRequest",
    "PutResult",
    "StoreConfig",
    "get_property",
]

_I16 = struct.Struct(">h")
_I64 = struct.Struct(">q")
_MAX_FILTER_UNITS = 16000 // CQ_STORE_UNIT_SIZE  # RocketMQ scans at least 16000 bytes of units per pull
# Start of the send remark while the disk is full (RocketMQ: "service not available now. It may be caused by
# one of the following reasons: the broker's disk is full [...]").
_DISK_FULL = "service not available now: the broker's disk is full"


class PutMessageStatus(enum.Enum):
    """RocketMQ's PutMessageStatus (the ones trimq can produce)."""

    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    CREATE_MAPPED_FILE_FAILED = "CREATE_MAPPED_FILE_FAILED"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    OS_PAGECACHE_BUSY = "OS_PAGECACHE_BUSY"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"
    # SYNC_MASTER (handle_ha): the message is stored on the master, but no slave confirmed it in time / none is
    # connected or close enough to wait for.
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


@dataclass(slots=True)
class PutResult:
    """Outcome of a put. For a batch, ``msg_id``/``queue_offset``/``commit_log_offset`` are the first
    message's and ``msg_ids`` lists all of them."""

    status: PutMessageStatus
    msg_id: str = ""
    queue_offset: int = -1
    commit_log_offset: int = -1
    store_timestamp: int = 0
    remark: str = ""
    topic: str = ""
    queue_id: int = -1
    msg_ids: list[str] = field(default_factory=list)
    wrote_bytes: int = 0

    @property
    def ok(self) -> bool:
        return self.status is PutMessageStatus.PUT_OK


@dataclass(slots=True)
class PutRequest:
    """A single message on its way into the store, as ``put_hook`` sees (and may rewrite) it."""

    topic: str
    queue_id: int
    body: bytes
    properties: str  # RocketMQ's property string
    flag: int
    sys_flag: int
    born_timestamp: int
    born_host: tuple[str, int]
    reconsume_times: int
    tags_code: int | None

    def get_property(self, name: str) -> str | None:
        return get_property(self.properties, name)

    def property_map(self) -> dict[str, str]:
        return decode_properties(self.properties)

    def set_properties(self, props: dict[str, str]) -> None:
        self.properties = encode_properties(props)


class GetMessageStatus(enum.Enum):
    """RocketMQ's GetMessageStatus."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


@dataclass(slots=True)
class GetMessageResult:
    """What ``get_message`` found: raw records (``body``) and where the consumer goes next."""

    status: GetMessageStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    body: bytes = b""
    message_count: int = 0


#: StoreConfig fields that BrokerConfig has under the same name (the reclaim settings, broker/store/clean.py).
RECLAIM_SETTINGS = (
    "file_reserved_time", "delete_when", "disk_max_used_space_ratio", "disk_space_clean_forcibly_ratio",
    "disk_space_warning_level_ratio", "clean_file_forcibly_enable", "clean_resource_interval_ms",
    "delete_commit_log_files_interval_ms", "delete_consume_queue_files_interval_ms",
    "destroy_mapedfile_interval_forcibly_ms",
)


@dataclass(slots=True)
class StoreConfig:
    """The settings the store needs (the broker builds it from BrokerConfig)."""

    store_dir: str
    segment_size: int = 1024 * 1024 * 1024
    consume_queue_file_size: int = 300_000 * 20
    flush_disk_type: str = "ASYNC_FLUSH"
    flush_interval_ms: int = 500
    sync_flush_timeout_ms: int = 5_000
    max_message_size: int = 4 * 1024 * 1024
    max_transfer_count: int = 32
    max_transfer_bytes: int = 256 * 1024
    # -- reclaim (RocketMQ's MessageStoreConfig names and defaults; broker/store/clean.py)
    file_reserved_time: int = 72  # hours a segment is kept after its last write
    delete_when: str = "04"  # hour(s) of the day expired segments are deleted, ";"-separated
    disk_max_used_space_ratio: int = 75  # percent: above it, expired segments are deleted at any hour
    disk_space_clean_forcibly_ratio: int = 85  # percent: above it, segments are deleted whatever their age
    disk_space_warning_level_ratio: int = 90  # percent: above it, writes are refused
    clean_file_forcibly_enable: bool = True
    clean_resource_interval_ms: int = 10_000
    delete_commit_log_files_interval_ms: int = 100
    delete_consume_queue_files_interval_ms: int = 100
    destroy_mapedfile_interval_forcibly_ms: int = 120_000
    # -- message index (RocketMQ's MessageStoreConfig names and defaults; broker/store/index.py)
    message_index_enable: bool = True
    max_hash_slot_num: int = DEFAULT_MAX_HASH_SLOT_NUM
    max_index_num: int = DEFAULT_MAX_INDEX_NUM
    max_msgs_num_batch: int = 64  # most offsets one key lookup returns

    @property
    def sync_flush(self) -> bool:
        return self.flush_disk_type == "SYNC_FLUSH"


def get_property(props: str, name: str) -> str | None:
    """One property from a RocketMQ property string without parsing the rest."""
    key = name + "\x01"
    i = props.find(key)
    while i != -1:
        if i == 0 or props[i - 1] == "\x02":
            start = i + len(key)
            j = props.find("\x02", start)
            return props[start:] if j == -1 else props[start:j]
        i = props.find(key, i + 1)
    return None


def _host_bytes(host: tuple[str, int]) -> bytes:
    ip, port = host
    return ipaddress.ip_address(ip).packed + struct.pack(">i", port)


TagsCodeResolver = Callable[[dict[str, str], int], int]
ArrivalListener = Callable[[str, int, int], None]


class MessageStore:
    """See the module docstring. Lifecycle: ``await start()`` (recovery), ``run()`` in a nursery (flush and
    file preparation loops), ``await stop()`` (final flush, checkpoint, abort marker removed)."""

    name = "store"

    def __init__(
        self,
        config: StoreConfig,
        *,
        store_host: Callable[[], tuple[str, int]] | None = None,
        now_ms: Callable[[], int] | None = None,
        disk_usage: Callable[[str], float] | None = None,
    ) -> None:
        self.config = config
        #: Wall clock in ms for file ages and ``delete_when`` (tests inject one that follows a MockClock).
        self.now_ms: Callable[[], int] = now_ms or (lambda: time.time_ns() // 1_000_000)
        #: Used ratio (0.0-1.0, -1 unknown) of the disk holding a path (tests inject a fake).
        self.disk_usage: Callable[[str], float] = disk_usage or disk_partition_space_used_ratio
        self.disk_full = False  # RocketMQ's RunningFlags DISK_FULL bit: writes are refused while set
        self.disk_used_ratio: dict[str, float] = {}  # "commitlog" / "consumequeue" -> last measured ratio
        self.deleted_files: dict[str, int] = {"commitlog": 0, "consumequeue": 0}
        self.cleaner = CleanService(self)
        #: The message index (broker/store/index.py) and the task that feeds it from the commit log.
        self.index = IndexService(Path(config.store_dir) / "index", max_hash_slot_num=config.max_hash_slot_num,
                                  max_index_num=config.max_index_num, max_msgs_num_batch=config.max_msgs_num_batch,
                                  now_ms=lambda: self.now_ms())
        self.index_dispatcher = IndexDispatcher(self.index, self, enabled=config.message_index_enable,
                                                flush_interval_ms=max(config.flush_interval_ms, 1_000))
        self._retired: list[tuple[float, Callable[[], None]]] = []  # (close-by time on trio's clock, close)
        self._io_threads = 0  # worker threads fsyncing store files right now
        self.root = Path(config.store_dir)
        self.commitlog = CommitLog(self.root / "commitlog", config.segment_size)
        self.queues: dict[str, dict[int, ConsumeQueue]] = {}
        self.recovery = RecoveryReport()
        self.running = False
        self.writable = False
        self.not_writable_reason = "the store is not started"
        self.arrival_listeners: list[ArrivalListener] = []
        self.put_hook: Callable[[PutRequest], PutResult | None] | None = None
        self.tags_code_resolvers: dict[str, TagsCodeResolver] = {}
        # Metrics hooks (broker/metrics.py): seconds of one append (a batch counts once) and of one fsync pass
        # ("interval": commit log + consume queues + checkpoint, "group_commit": the SYNC_FLUSH commit log).
        self.on_append: Callable[[float], None] | None = None
        self.on_fsync: Callable[[str, float], None] | None = None
        #: SYNC_MASTER (broker/store/ha/master.py HAService.wait_for_slave): waits until a slave holds the bytes
        #: below an offset; None on an ASYNC_MASTER or a SLAVE. Used by ``handle_ha``.
        self.replica_wait: Callable[[int], Awaitable[PutMessageStatus]] | None = None
        self._failure_log = RateLimiter(10_000)  # a failing disk fails every retry: one line per 10 s and kind
        self._store_host_fn = store_host or (lambda: ("127.0.0.1", 0))
        self._store_host_bytes: bytes | None = None
        self._store_host: tuple[str, int] = ("127.0.0.1", 0)
        self._host_cache: dict[tuple[str, int], bytes] = {}
        self._id_prefix_for = b""
        self._id_prefix_hex = ""
        self._valid_topics: set[str] = set()
        self._encoder = RecordEncoder()
        self._last_store_ts = 0
        self._last_flushed_store_ts = 0
        self._alloc_lock = trio.Lock()
        self._alloc_wakeup = trio.Event()
        self._sync_waiters: deque[tuple[int, trio.Event]] = deque()
        self._sync_wakeup = trio.Event()
        self._flush_lock = trio.Lock()
        self._flush_failed: str | None = None
        self._checkpointed = -1
        self._stopped = False
        self._lock_fd: int | None = None

    # ================================================================== lifecycle
    async def start(self) -> None:
        """Recover the store directory (in a worker thread) and mark this run as not yet cleanly stopped."""
        await trio.to_thread.run_sync(self.load)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._flush_loop)
            nursery.start_soon(self._alloc_loop)
            nursery.start_soon(self.cleaner.run)
            nursery.start_soon(self.index_dispatcher.run)
            if self.config.sync_flush:
                nursery.start_soon(self._group_commit_loop)
            task_status.started()

    async def stop(self) -> None:
        """Flush everything, write the checkpoint, remove the abort marker, close the files."""
        if self._stopped or not self.running:
            return
        self._stopped = True
        self.writable = False
        self.not_writable_reason = "the store is stopping"
        with trio.CancelScope(shield=True):
            await self.flush()
            await trio.to_thread.run_sync(self._close_sync)
        for _, ev in self._sync_waiters:
            ev.set()
        self._sync_waiters.clear()

    def load(self) -> RecoveryReport:
        """Open and recover the store (blocking). Called by ``start``; tests may call it directly."""
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock_store()
        try:
            return self._load_locked()
        except BaseException:
            self.commitlog.close()
            self._unlock_store()
            raise

    def _load_locked(self) -> RecoveryReport:
        t0 = time.monotonic()
        _raise_nofile_limit()
        self._load_geometry()
        rep = RecoveryReport()
        abort = self.root / "abort"
        rep.abnormal = abort.exists()
        cp: Checkpoint | None
        try:
            cp = read_checkpoint(self.root / "checkpoint")
            rep.checkpoint = "ok" if cp is not None else "missing"
        except CheckpointError as exc:
            cp = None
            rep.checkpoint = f"damaged: {exc}"
        cl = self.commitlog
        seg = cl.segment_size
        starts = cl.list_files()
        first = starts[0] if starts else 0
        files_end = starts[-1] + seg if starts else 0
        if cp is not None and cp.rocketmq:
            # RocketMQ's own checkpoint (it has opened this store): no offsets, so start where RocketMQ's
            # recovery would, and rebuild units from there (a queue with a gap is still rebuilt from the start).
            rep.checkpoint = "rocketmq"
            rep.scan_from = self._rocketmq_scan_start(starts, cp, rep.abnormal)
            cp.physic_offset = cp.logics_offset = rep.scan_from
        if cp is not None and first <= cp.physic_offset <= files_end:
            rep.scan_from = cp.physic_offset
        else:
            rep.scan_from = first
        end, why, n = scan_commit_log(cl.directory, seg, rep.scan_from, check_crc=True)
        rep.end_offset, rep.stop_reason, rep.records_verified = end, why, n
        cl.open(end)
        cl.flushed_offset = rep.scan_from  # below it was fsynced before; what the scan accepted may not be
        self._last_store_ts = cp.physic_msg_timestamp if cp else 0

        # Consume queues: load every directory, drop tails that point at nothing valid.
        cq_root = self.root / "consumequeue"
        if cq_root.is_dir():
            for tdir in sorted(cq_root.iterdir()):
                if not tdir.is_dir():
                    continue
                for qdir in sorted(tdir.iterdir()):
                    if not (qdir.is_dir() and qdir.name.isdigit()):
                        continue
                    cq = self._new_cq(tdir.name, int(qdir.name))
                    cq.load()
                    if check_queue_tail(cq, cl):
                        rep.queues_trimmed.append(f"{tdir.name}/{qdir.name}")

        # Where rebuilding starts: the last durable consume-queue point, or earlier for a queue that has
        # fewer units than the checkpoint says it had (a damaged or deleted file).
        if cp is not None:
            start = min(cp.logics_offset, end)
            for topic, qs in cp.queue_table.items():
                for qid, expected in qs.items():
                    known = self.find_consume_queue(topic, qid)
                    have = known.max_offset if known is not None else 0
                    if have < expected:
                        start = min(start, self._end_of_last_unit(known, first))
        else:
            start = first
        start = max(min(start, end), first)
        rep.dispatch_from = start
        gaps: set[tuple[str, int]] = set()
        # From the log's first record, a queue offset missing before a record belongs to a deleted segment.
        rep.units_rebuilt = self._dispatch_range(start, gaps, only=None, fill=start == first > 0)
        if gaps:
            log.warning("recovery.queue_gaps", queues=sorted(f"{t}/{q}" for t, q in gaps), rescan_from=first)
            again: set[tuple[str, int]] = set()
            rep.units_rebuilt += self._dispatch_range(first, again, only=gaps, fill=first > 0)
            if again:
                log.error("recovery.queue_gaps_unrepaired", queues=sorted(f"{t}/{q}" for t, q in again))
        for loaded in self.queues.values():  # RocketMQ's recoverTopicQueueTable: min offsets follow the log
            for queue in loaded.values():
                queue.correct_min_offset(cl.min_offset)
        self.index_dispatcher.recover()  # the index catches up past its newest entry once the store runs
        cl.flush(end)
        cl.flushed_offset = end
        self._flush_queues_sync()
        self._write_checkpoint_sync(end, end, self._queue_table())
        self._checkpointed = end
        abort.touch()
        fsync_dir(self.root)
        rep.duration_s = time.monotonic() - t0
        self.recovery = rep
        self.running = True
        self.writable = True
        self.not_writable_reason = ""
        log.info(
            "store.recovered", abnormal=rep.abnormal, checkpoint=rep.checkpoint, scan_from=rep.scan_from,
            end_offset=rep.end_offset, stop_reason=rep.stop_reason, records_verified=rep.records_verified,
            dispatch_from=rep.dispatch_from, units_rebuilt=rep.units_rebuilt, queues_trimmed=rep.queues_trimmed,
            duration_s=round(rep.duration_s, 3),
        )
        return rep

    def _lock_store(self) -> None:
        """Hold an exclusive lock on ``STORE/lock`` while open (RocketMQ's lock file): a second broker on
        the same directory would interleave writes. The kernel drops the lock when the process dies."""
        fd = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise StoreError(f"store directory {self.root} is in use by another broker (its lock is held)") from None
        self._lock_fd = fd

    def _unlock_store(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing releases the lock
            self._lock_fd = None

    def _load_geometry(self) -> None:
        """A store keeps the segment sizes it was created with; config changes apply to new stores only."""
        path = self.root / "config" / "store.json"
        meta = read_json(path, None)
        want = {"commitLogSegmentSize": self.config.segment_size,
                "consumeQueueFileSize": self.config.consume_queue_file_size, "version": 1}
        if meta is None:
            if not (self.root / "commitlog").is_dir() or not any((self.root / "commitlog").iterdir()):
                write_json_atomic(path, want)
                return
            meta = want  # an older store without the file: assume the configured sizes
            write_json_atomic(path, want)
        try:
            seg = int(meta["commitLogSegmentSize"])
            cqs = int(meta["consumeQueueFileSize"])
        except (KeyError, TypeError, ValueError) as exc:
            raise StoreError(f"{path}: not a store description ({exc})") from None
        if seg != self.config.segment_size or cqs != self.config.consume_queue_file_size:
            log.warning("store.geometry_kept", path=str(path), segment_size=seg, consume_queue_file_size=cqs,
                        configured_segment_size=self.config.segment_size,
                        configured_consume_queue_file_size=self.config.consume_queue_file_size)
            self.config.segment_size = seg
            self.config.consume_queue_file_size = cqs
            self.commitlog = CommitLog(self.root / "commitlog", seg)

    def _end_of_last_unit(self, cq: ConsumeQueue | None, first: int) -> int:
        if cq is None or cq.max_offset <= cq.min_offset:
            return first
        unit = cq.get_unit(cq.max_offset - 1)
        return unit[0] + unit[1] if unit else first

    def _rocketmq_scan_start(self, starts: list[int], cp: Checkpoint, abnormal: bool) -> int:
        """Where RocketMQ 4.9.3's CommitLog recovery starts: after a clean stop, the third-last segment
        (``recoverNormally``); after a crash, the last segment whose first record is older than the
        checkpoint's timestamps minus 3 s (``recoverAbnormally``), else the first."""
        if not starts:
            return 0
        if not abnormal:
            return starts[max(0, len(starts) - 3)]
        min_ts = max(0, min(cp.physic_msg_timestamp, cp.logics_msg_timestamp) - 3000)
        for start in reversed(starts):
            ts = first_store_timestamp(self.commitlog.directory / file_name(start))
            if ts and ts <= min_ts:
                return start
        return starts[0]

    def _dispatch_range(self, start: int, gaps: set[tuple[str, int]], only: set[tuple[str, int]] | None,
                        *, fill: bool = False) -> int:
        """Append the missing units of records in ``[start, end)``; records whose unit exists are skipped.

        A record whose queue offset is past its queue's end is a gap (reported in ``gaps``), or with ``fill``
        (the scan started at the log's first record, so the records in between were deleted) the queue gets
        blank units up to it (RocketMQ's fillPreBlank)."""
        rebuilt = 0

        def dispatch(rec: ScanRecord) -> None:
            nonlocal rebuilt
            key = (rec.topic, rec.queue_id)
            if only is not None and key not in only:
                return
            if self._last_store_ts < rec.store_timestamp:
                self._last_store_ts = rec.store_timestamp
            cq = self.queues.get(rec.topic, {}).get(rec.queue_id)
            have = cq.max_offset if cq is not None else 0
            if rec.queue_offset < have:
                return
            if rec.queue_offset > have:
                if not fill:
                    gaps.add(key)
                    return
                if cq is None:
                    cq = self._new_cq(rec.topic, rec.queue_id)
                cq.fill_blank(rec.queue_offset)
                have = rec.queue_offset
            if cq is None:
                cq = self._new_cq(rec.topic, rec.queue_id)
            cq.append(have, UNIT.pack(rec.offset, rec.size, self._tags_code(rec.topic, rec.properties,
                                                                               rec.store_timestamp)))
            rebuilt += 1

        scan_commit_log(self.commitlog.directory, self.commitlog.segment_size, start, check_crc=False,
                        on_record=dispatch)
        return rebuilt

    def _tags_code(self, topic: str, props: str, store_ts: int) -> int:
        resolver = self.tags_code_resolvers.get(topic)
        if resolver is not None:
            return resolver(decode_properties(props), store_ts)
        return tags_string_to_tags_code(get_property(props, MessageConst.TAGS))

    def _close_sync(self) -> None:
        for _, close in self._retired:
            close()
        self._retired.clear()
        for qs in self.queues.values():
            for cq in qs.values():
                cq.close()
        self.index_dispatcher.close()
        self.commitlog.close()
        with contextlib.suppress(FileNotFoundError):
            (self.root / "abort").unlink()
        fsync_dir(self.root)
        self._unlock_store()
        self.running = False
        log.info("store.stopped", end_offset=self.commitlog.max_offset)

    # ================================================================== reclaim (broker/store/clean.py)
    async def _in_io_thread(self, fn: Callable[..., None], *args: Any) -> None:
        """Run a blocking fsync pass in a worker thread, counted: deleted files' descriptors are closed only
        while no such thread runs (it may hold one of them)."""
        self._io_threads += 1
        try:
            await trio.to_thread.run_sync(fn, *args)
        finally:
            self._io_threads -= 1
            if self._retired:
                self.close_retired()

    def _retire(self, close: Callable[[], None]) -> None:
        deadline = trio.current_time() + self.config.destroy_mapedfile_interval_forcibly_ms / 1000
        self._retired.append((deadline, close))

    def close_retired(self) -> None:
        """Close the descriptors and mappings of deleted files: all of them when no fsync thread runs, else
        those deleted ``destroy_mapedfile_interval_forcibly_ms`` ago (RocketMQ's forced destroy)."""
        if not self._retired:
            return
        if self._io_threads:
            now = trio.current_time()
            due = [r for r in self._retired if r[0] <= now]
            self._retired = [r for r in self._retired if r[0] > now]
        else:
            due, self._retired = self._retired, []
        for _, close in due:
            close()

    def delete_first_segment(self) -> None:
        """Delete the oldest segment (never the one being written): unlinked now, closed by ``close_retired``.
        Units pointing into it read as removed until the consume queues follow (``delete_expired_queue_files``)."""
        cl = self.commitlog
        if len(cl.segments) < 2:
            raise ValueError("the segment being written is never deleted")
        seg = cl.segments.pop(0)
        seg.path.unlink(missing_ok=True)
        self._retire(seg.close)
        self.deleted_files["commitlog"] += 1

    def delete_expired_queue_files(self, cq: ConsumeQueue, min_phys_offset: int) -> int:
        """Delete ``cq``'s files that only point below ``min_phys_offset`` and move its min offset up."""
        deleted, fds = cq.delete_expired_files(min_phys_offset)
        for fd in fds:
            self._retire(functools.partial(_close_fd, fd))
        self.deleted_files["consumequeue"] += deleted
        return deleted

    def delete_expired_index_files(self, min_phys_offset: int) -> int:
        """Delete the index files whose newest entry points below ``min_phys_offset`` (never the last one)."""
        return self.index.delete_expired_file(min_phys_offset)

    def delete_topic_queues(self, topic: str) -> int:
        """RocketMQ's ``cleanUnusedTopic`` for one topic (DELETE_TOPIC_IN_BROKER): its consume queues are closed
        (as deleted files are, see ``close_retired``) and their directory removed; its records stay in the commit
        log until they expire. The next flush writes a checkpoint without them, so a restart does not rebuild
        them. Returns how many queues there were."""
        queues = self.queues.pop(topic, None)
        if not queues:
            return 0
        for cq in queues.values():
            self._retire(cq.close)
        shutil.rmtree(self.root / "consumequeue" / topic, ignore_errors=True)
        self._valid_topics.discard(topic)
        self._checkpointed = -1
        log.info("store.topic_queues_deleted", topic=topic, queues=len(queues))
        return len(queues)

    def mark_disk_full(self, full: bool, ratio: float) -> None:
        """RocketMQ's RunningFlags ``getAndMakeDiskFull`` / ``getAndMakeDiskOK``: refuse writes (answered
        SERVICE_NOT_AVAILABLE) while the disk is above ``disk_space_warning_level_ratio``."""
        if full == self.disk_full:
            return
        self.disk_full = full
        limit = self.config.disk_space_warning_level_ratio
        if full:
            log.error("store.disk_full", used_ratio=ratio, disk_space_warning_level_ratio=limit)
            if self.writable:
                self.writable = False
                self.not_writable_reason = (
                    f"{_DISK_FULL}: the disk is {ratio:.0%} used, above disk_space_warning_level_ratio {limit}%")
        else:
            log.info("store.disk_ok", used_ratio=ratio, disk_space_warning_level_ratio=limit)
            if not self.writable and self.not_writable_reason.startswith(_DISK_FULL) and self.running \
                    and not self._stopped:
                self.writable = True
                self.not_writable_reason = ""

    # ================================================================== queues
    def _new_cq(self, topic: str, queue_id: int) -> ConsumeQueue:
        cq = ConsumeQueue(self.root / "consumequeue" / topic / str(queue_id), topic, queue_id,
                          self.config.consume_queue_file_size)
        self.queues.setdefault(topic, {})[queue_id] = cq
        return cq

    def find_consume_queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        """The consume queue of ``topic``/``queue_id`` if it exists."""
        qs = self.queues.get(topic)
        return qs.get(queue_id) if qs is not None else None

    def topics(self) -> list[str]:
        """Topics that have at least one consume queue."""
        return list(self.queues)

    def queue_ids(self, topic: str) -> list[int]:
        return sorted(self.queues.get(topic, {}))

    def _queue_table(self) -> dict[str, dict[int, int]]:
        return {t: {q: cq.max_offset for q, cq in qs.items()} for t, qs in self.queues.items()}

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
            phys += size
        try:
            cl.write(seg, buf)
        except OSError as exc:
            log.error("store.write_failed", error=str(exc), offset=phys0)
            return PutResult(PutMessageStatus.UNKNOWN_ERROR, remark=f"commit-log write failed: {exc}")
        if keyed:
            self.index_dispatcher.note_keyed(keyed)
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
        is stored on the master either way). Store-internal puts (schedule deliveries, retries) do not wait."""
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

    async def _alloc_loop(self) -> None:
        """Create the next segment ahead of need, so a roll-over rarely waits for a file."""
        while True:
            if self.running and self.writable and self.commitlog.needs_segment() is not None:
                try:
                    await self._prepare_segment()
                except OSError as exc:
                    log_rate_limited(self._failure_log, "prepare_segment", _mono_ms(), log.warning,
                                     "store.prepare_segment_failed", error=str(exc))
                    await trio.sleep(1)
            await self._alloc_wakeup.wait()
            self._alloc_wakeup = trio.Event()

    # ================================================================== flushing
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
                    log_rate_limited(self._failure_log, "fsync", _mono_ms(), log.error, "store.fsync_failed",
                                     error=str(exc))
                    await trio.sleep(0.1)
            waiters = self._sync_waiters
            flushed = cl.flushed_offset
            while waiters and (waiters[0][0] <= flushed or self._flush_failed):
                waiters.popleft()[1].set()
            if waiters:
                self._sync_wakeup.set()

    async def _flush_loop(self) -> None:
        while True:
            await trio.sleep(self.config.flush_interval_ms / 1000)
            try:
                await self.flush()
            except OSError as exc:
                log_rate_limited(self._failure_log, "flush", _mono_ms(), log.error, "store.flush_failed",
                                 error=str(exc))

    async def flush(self) -> None:
        """fsync the commit log and the consume queues written so far, then write the checkpoint."""
        if not self.running:
            return
        async with self._flush_lock:
            cl = self.commitlog
            target = cl.max_offset
            dirty = [cq for qs in self.queues.values() for cq in qs.values() if cq.dirty]
            if target <= cl.flushed_offset and not dirty and target == self._checkpointed:
                return
            fds = [fd for cq in dirty for fd in cq.take_dirty_fds()]
            table = self._queue_table()
            store_ts = self._last_store_ts

            def work() -> None:
                cl.flush(target)
                for fd in fds:
                    with contextlib.suppress(OSError):
                        os.fdatasync(fd)
                self._write_checkpoint_sync(target, target, table, store_ts)

            t_fsync = time.perf_counter()
            await self._in_io_thread(work)
            if self.on_fsync is not None:
                self.on_fsync("interval", time.perf_counter() - t_fsync)
            cl.flushed_offset = max(cl.flushed_offset, target)
            self._checkpointed = target

    def _flush_queues_sync(self) -> None:
        for qs in self.queues.values():
            for cq in qs.values():
                cq.flush()

    def _write_checkpoint_sync(self, physic: int, logics: int, table: dict[str, dict[int, int]],
                               store_ts: int | None = None) -> None:
        ts = self._last_store_ts if store_ts is None else store_ts
        write_checkpoint(self.root / "checkpoint", Checkpoint(ts, ts, 0, physic, logics, table))

    # ================================================================== reading
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


def _close_fd(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def _mono_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def _raise_nofile_limit() -> None:
    """Every segment keeps a mapping (and a descriptor) open: lift the soft limit to the hard one."""
    with contextlib.suppress(ValueError, OSError):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY:
            hard = 1 << 20
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

