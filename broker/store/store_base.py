"""The message store's vocabulary and shared state: its settings (StoreConfig), what a put or a get returns,
and StoreBase, the state every part of the store works on (commit log, consume queues, flags, hooks) with the
consume-queue lookups and the bookkeeping of deleted files' descriptors.

The store's jobs are split by module, each a part of :class:`~trimq.broker.store.message_store.MessageStore`:
appends and group commit (``append.py``), reads (``read.py``), and the lifecycle: recovery, flushing and
reclaim (``lifecycle.py``).
"""

from __future__ import annotations

import enum
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from trimq.broker.store.clean import disk_partition_space_used_ratio
from trimq.broker.store.commitlog import CommitLog, RecordEncoder
from trimq.broker.store.consume_queue import ConsumeQueue
from trimq.broker.store.index import DEFAULT_MAX_HASH_SLOT_NUM, DEFAULT_MAX_INDEX_NUM, IndexService
from trimq.broker.store.index_dispatch import IndexDispatcher
from trimq.broker.store.recovery import RecoveryReport
from trimq.protocol.message import decode_properties, encode_properties, get_property
from trimq.runtime.logs import RateLimiter, get_logger

log = get_logger("trimq.store")

__all__ = [
    "RECLAIM_SETTINGS",
    "ArrivalListener",
    "GetMessageResult",
    "GetMessageStatus",
    "PutMessageStatus",
    "PutRequest",
    "PutResult",
    "StoreBase",
    "StoreConfig",
    "TagsCodeResolver",
    "mono_ms",
]


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


TagsCodeResolver = Callable[[dict[str, str], int], int]
ArrivalListener = Callable[[str, int, int], None]


class StoreBase:
    """The state of a message store and what every part of it uses (see the module docstring)."""

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

    # ================================================================== descriptors of deleted files
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


def mono_ms() -> int:
    """A monotonic clock in ms (rate-limited failure logs)."""
    return time.monotonic_ns() // 1_000_000

