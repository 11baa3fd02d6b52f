"""The message store's lifecycle: recovery at start, flushing on the interval and at stop, reclaim.

* **Recovery** (``start`` / ``load``): lock the directory, scan the commit log from the checkpoint, verify
  magic/CRC/offsets, cut the torn tail, repair consume-queue tails, rebuild the units past the last valid
  one, then serve.
* **Flushing**: every ``flush_interval_ms`` (both flush modes) the commit log and the consume queues written
  so far are fsynced and the checkpoint written; ``stop`` flushes one last time and removes the abort marker.
* **Reclaim** (driven by ``broker/store/clean.py``): expired segments and the consume-queue and index files
  that follow them are deleted as RocketMQ does; a nearly full disk refuses writes.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import resource
import shutil
import time

import trio

from trimq.broker.store.atomic import fsync_dir, read_json, write_json_atomic
from trimq.broker.store.checkpoint import Checkpoint, CheckpointError, read_checkpoint, write_checkpoint
from trimq.broker.store.commitlog import CommitLog, ScanRecord, StoreError, file_name
from trimq.broker.store.consume_queue import UNIT, ConsumeQueue, tags_string_to_tags_code
from trimq.broker.store.recovery import RecoveryReport, check_queue_tail, first_store_timestamp, scan_commit_log
from trimq.broker.store.store_base import (
    StoreBase,
    mono_ms,
)
from trimq.protocol.message import MessageConst, decode_properties, get_property
from trimq.runtime.logs import get_logger, log_rate_limited

__all__ = ["StoreLifecycle"]

log = get_logger("trimq.store")

# Start of the send remark while the disk is full (RocketMQ: "service not available now. It may be caused by
# one of the following reasons: the broker's disk is full [...]").
_DISK_FULL = "service not available now: the broker's disk is full"


class StoreLifecycle(StoreBase):
    """Recovery, flushing and reclaim of :class:`~trimq.broker.store.message_store.MessageStore`."""

    # ================================================================== start and stop
    async def start(self) -> None:
        """Recover the store directory (in a worker thread) and mark this run as not yet cleanly stopped."""
        await trio.to_thread.run_sync(self.load)

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

    # ================================================================== flushing
    async def _flush_loop(self) -> None:
        while True:
            await trio.sleep(self.config.flush_interval_ms / 1000)
            try:
                await self.flush()
            except OSError as exc:
                log_rate_limited(self._failure_log, "flush", mono_ms(), log.error, "store.flush_failed",
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

    # ================================================================== reclaim (broker/store/clean.py)
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


def _close_fd(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)



def _raise_nofile_limit() -> None:
    """Every segment keeps a mapping (and a descriptor) open: lift the soft limit to the hard one."""
    with contextlib.suppress(ValueError, OSError):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY:
            hard = 1 << 20
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
