"""Deleting expired files and watching the disk: RocketMQ 4.9.3's DefaultMessageStore.CleanCommitLogService,
CleanConsumeQueueService and its disk check (docs/STORAGE.md §9).

* **Commit log** (every ``clean_resource_interval_ms``, first after 60 s): when it is ``delete_when`` o'clock
  or the disk is fuller than ``disk_max_used_space_ratio``, segments are deleted oldest first while their
  last write (file mtime, as RocketMQ) is older than ``file_reserved_time`` hours, at most 10 per pass,
  ``delete_commit_log_files_interval_ms`` apart; above ``disk_space_clean_forcibly_ratio`` (with
  ``clean_file_forcibly_enable``) they are deleted whatever their age. The segment being written is never
  deleted.
* **Consume queues** follow: once the log's first offset has moved, every queue deletes its files whose last
  unit points below it (never its last file) and its min offset becomes its first unit whose record is
  still there. A consumer below it is answered OFFSET_TOO_SMALL -> PULL_OFFSET_MOVED with the new min offset.
* **Disk full**: above ``disk_space_warning_level_ratio`` the store refuses writes (SERVICE_NOT_AVAILABLE)
  until the disk is back under it; checked every 10 s and on every clean pass.

Deleted files are unlinked at once; their descriptors and mappings are closed once no flush thread can be
using them, or after ``destroy_mapedfile_interval_forcibly_ms`` (RocketMQ's reference-counted
``MappedFile.destroy``). Time: ``store.now_ms`` (wall clock, injectable) for ages and the hour; the loops
sleep on trio's clock, so a test runs them on a MockClock.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import trio

from trimq.broker.store.commitlog import CommitLog
from trimq.broker.store.consume_queue import ConsumeQueue
from trimq.runtime.logs import RateLimiter, get_logger, log_rate_limited

log = get_logger("trimq.store.clean")

__all__ = [
    "DELETE_FILES_BATCH_MAX",
    "CleanService",
    "ReclaimConfig",
    "ReclaimStore",
    "disk_partition_space_used_ratio",
    "is_it_time_to_do",
]

DELETE_FILES_BATCH_MAX = 10  # RocketMQ's MappedFileQueue.DELETE_FILES_BATCH_MAX: segments per pass
CLEAN_FIRST_DELAY_S = 60.0  # RocketMQ schedules the first clean a minute after start
DISK_CHECK_INTERVAL_S = 10.0  # RocketMQ's diskCheckScheduledExecutorService period


def is_it_time_to_do(when: str, now_ms: int) -> bool:
    """RocketMQ's ``UtilAll.isItTimeToDo``: is the local hour of ``now_ms`` one of ``when``'s hours
    (``"04"``, ``"01;13"``)? Malformed hours are ignored (RocketMQ throws and the pass is skipped)."""
    hour = time.localtime(now_ms / 1000).tm_hour
    for w in when.split(";"):
        w = w.strip()
        if w.isdigit() and int(w) == hour:
            return True
    return False


def disk_partition_space_used_ratio(path: str) -> float:
    """RocketMQ's ``UtilAll.getDiskPartitionSpaceUsedPercent`` (a ratio, 0.0-1.0, despite the name): used
    / (used + available to us), rounded up to a whole percent; -1 when it cannot be measured. A path that does
    not exist yet is measured at its nearest existing parent (the same file system)."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        st = os.statvfs(p)
    except OSError:
        return -1.0
    total = st.f_blocks * st.f_frsize
    if total <= 0:
        return -1.0
    used = total - st.f_bfree * st.f_frsize
    entire = used + st.f_bavail * st.f_frsize
    if entire <= 0:
        return -1.0
    return math.ceil(used * 100 / entire) / 100


class ReclaimConfig(Protocol):
    """The settings the service reads (StoreConfig has them; RocketMQ's MessageStoreConfig names)."""

    file_reserved_time: int
    delete_when: str
    disk_max_used_space_ratio: int
    disk_space_clean_forcibly_ratio: int
    disk_space_warning_level_ratio: int
    clean_file_forcibly_enable: bool
    clean_resource_interval_ms: int
    delete_commit_log_files_interval_ms: int
    delete_consume_queue_files_interval_ms: int


class ReclaimStore(Protocol):
    """What the service needs of the MessageStore."""

    @property
    def config(self) -> ReclaimConfig: ...
    @property
    def commitlog(self) -> CommitLog: ...
    @property
    def root(self) -> Path: ...
    @property
    def queues(self) -> dict[str, dict[int, ConsumeQueue]]: ...
    @property
    def disk_used_ratio(self) -> dict[str, float]: ...
    @property
    def now_ms(self) -> Callable[[], int]: ...
    @property
    def disk_usage(self) -> Callable[[str], float]: ...
    def mark_disk_full(self, full: bool, ratio: float) -> None: ...
    def delete_first_segment(self) -> None: ...
    def delete_expired_queue_files(self, cq: ConsumeQueue, min_phys_offset: int) -> int: ...
    def delete_expired_index_files(self, min_phys_offset: int) -> int: ...
    def close_retired(self) -> None: ...


class CleanService:
    """The store's file reclaim and disk watch (see the module docstring); ``run`` lives in the store's
    nursery. ``clean_once`` and ``check_disk`` are what the loops call; tests may call them directly."""

    def __init__(self, store: ReclaimStore) -> None:
        self.store = store
        self.clean_immediately = False
        self.last_physical_min_offset = 0
        #: Seconds from ``run`` to the first periodic pass; a test that drives passes by hand sets ``math.inf``
        #: so that the loop cannot run one between them.
        self.first_delay_s = CLEAN_FIRST_DELAY_S
        self._errors = RateLimiter(60_000)

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._disk_check_loop)
            nursery.start_soon(self._clean_loop)

    async def _disk_check_loop(self) -> None:
        while True:  # RocketMQ checks first after 1 s; at once is safer for a broker started on a full disk
            self._guarded(self.check_disk)
            await trio.sleep(DISK_CHECK_INTERVAL_S)

    async def _clean_loop(self) -> None:
        await trio.sleep(self.first_delay_s)
        while True:
            try:
                await self.clean_once()
            except Exception as exc:  # RocketMQ logs and carries on: a failed pass must not stop the broker
                log_rate_limited(self._errors, "clean", self.store.now_ms(), log.warning, "store.clean_failed",
                                 error=f"{type(exc).__name__}: {exc}")
            await trio.sleep(self.store.config.clean_resource_interval_ms / 1000)

    def _guarded(self, fn: Callable[[], object]) -> None:
        try:
            fn()
        except Exception as exc:
            log_rate_limited(self._errors, "disk_check", self.store.now_ms(), log.warning,
                             "store.disk_check_failed", error=f"{type(exc).__name__}: {exc}")

    # -- disk ------------------------------------------------------------------------------------------
    def _ratio(self, kind: str, path: Path) -> float:
        ratio = float(self.store.disk_usage(str(path)))
        self.store.disk_used_ratio[kind] = ratio
        return ratio

    def check_disk(self) -> bool:
        """RocketMQ's ``isSpaceFull`` (every 10 s): the commit log's disk above
        ``disk_space_warning_level_ratio`` marks the store full (writes refused), below it marks it OK."""
        cfg = self.store.config
        ratio = self._ratio("commitlog", self.store.commitlog.directory)
        full = ratio > cfg.disk_space_warning_level_ratio / 100
        self.store.mark_disk_full(full, ratio)
        return full

    def is_space_to_delete(self) -> bool:
        """RocketMQ's ``isSpaceToDelete``: True when the commit log's or the consume queues' disk is above
        ``disk_max_used_space_ratio`` (or cannot be measured); sets ``clean_immediately`` above
        ``disk_space_clean_forcibly_ratio`` and marks the store full / OK like ``check_disk``."""
        cfg = self.store.config
        limit = cfg.disk_max_used_space_ratio / 100
        warning = cfg.disk_space_warning_level_ratio / 100
        forcibly = cfg.disk_space_clean_forcibly_ratio / 100
        self.clean_immediately = False
        for kind, path in (("commitlog", self.store.commitlog.directory),
                           ("consumequeue", self.store.root / "consumequeue")):
            ratio = self._ratio(kind, path)
            if ratio > warning:
                self.store.mark_disk_full(True, ratio)
                self.clean_immediately = True
            elif ratio > forcibly:
                self.clean_immediately = True  # between the two: cleaning at once, writes as they were
            else:
                self.store.mark_disk_full(False, ratio)
            if ratio < 0 or ratio > limit:
                log.info("store.disk_reclaim", path=kind, used_ratio=ratio, disk_max_used_space_ratio=limit)
                return True
        return False

    # -- deleting --------------------------------------------------------------------------------------
    async def clean_once(self) -> tuple[int, int]:
        """One pass of RocketMQ's ``cleanFilesPeriodically``: expired segments, then the consume-queue files
        that only point below the log's new start. Returns ``(segments deleted, queue files deleted)``."""
        segments = await self.delete_expired_commit_log()
        queue_files = await self.delete_expired_consume_queues()
        self.store.close_retired()
        return segments, queue_files

    async def delete_expired_commit_log(self) -> int:
        """RocketMQ's ``CleanCommitLogService.deleteExpiredFiles`` + ``MappedFileQueue.deleteExpiredFileByTime``."""
        store = self.store
        cfg = store.config
        timeup = is_it_time_to_do(cfg.delete_when, store.now_ms())
        spacefull = self.is_space_to_delete()
        if not (timeup or spacefull):
            return 0
        clean_at_once = cfg.clean_file_forcibly_enable and self.clean_immediately
        reserved_ms = cfg.file_reserved_time * 3_600_000
        log.info("store.clean_commitlog_begin", file_reserved_time_h=cfg.file_reserved_time, timeup=timeup,
                 spacefull=spacefull, clean_at_once=clean_at_once)
        cl = store.commitlog
        deleted = 0
        # Never the last segment (the one being written); oldest first, stopping at the first that must stay
        # (no hole in the middle of the log).
        while len(cl.segments) > 1 and deleted < DELETE_FILES_BATCH_MAX:
            seg = cl.segments[0]
            last_modified_ms = os.fstat(seg.fd).st_mtime_ns // 1_000_000
            if not (store.now_ms() >= last_modified_ms + reserved_ms or clean_at_once):
                break
            store.delete_first_segment()
            deleted += 1
            log.info("store.segment_deleted", segment=seg.path.name, last_modified_ms=last_modified_ms,
                     clean_at_once=clean_at_once, min_offset=cl.min_offset)
            if cfg.delete_commit_log_files_interval_ms > 0 and len(cl.segments) > 1:
                await trio.sleep(cfg.delete_commit_log_files_interval_ms / 1000)
        if not deleted and spacefull:
            log.warning("store.clean_nothing_deleted", reason="disk space will be full soon, but no segment "
                        "could be deleted", segments=len(cl.segments))
        return deleted

    async def delete_expired_consume_queues(self) -> int:
        """RocketMQ's ``CleanConsumeQueueService.deleteExpiredFiles``: runs when the log's first offset moved."""
        store = self.store
        min_offset = store.commitlog.min_offset
        if min_offset <= self.last_physical_min_offset:
            return 0
        self.last_physical_min_offset = min_offset
        interval = store.config.delete_consume_queue_files_interval_ms / 1000
        total = 0
        for qs in list(store.queues.values()):
            for cq in list(qs.values()):
                deleted = store.delete_expired_queue_files(cq, min_offset)
                total += deleted
                if deleted and interval > 0:
                    await trio.sleep(interval)
        if total:
            log.info("store.consume_queue_files_deleted", files=total, commitlog_min_offset=min_offset)
        store.delete_expired_index_files(min_offset)  # RocketMQ's indexService.deleteExpiredFile, same pass
        return total
