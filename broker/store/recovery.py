"""Crash recovery helpers: scan the commit log, check consume-queue tails (docs/STORAGE.md §Recovery).

Blocking, no trio: the MessageStore runs them in a worker thread before it serves anything.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from trimq.broker.store.commitlog import CommitLog, ScanRecord, file_name, scan_segment_bytes
from trimq.broker.store.consume_queue import ConsumeQueue
from trimq.protocol.record import MESSAGE_MAGIC_CODE, POS_BORN_HOST, SYSFLAG_BORNHOST_V6

__all__ = ["RecoveryReport", "check_queue_tail", "first_store_timestamp", "scan_commit_log"]

_CHECK = struct.Struct(">iIiiiq")  # size, magic, crc, queue id, flag, queue offset
_MAGIC_SYSFLAG = (struct.Struct(">I"), struct.Struct(">i"))
_I64 = struct.Struct(">q")


@dataclass(slots=True)
class RecoveryReport:
    """What start-up found and did (logged, and kept on the store for tests and the admin tools)."""

    abnormal: bool = False  # the abort marker was there: the last run did not stop cleanly
    checkpoint: str = "missing"  # "ok", "missing" or "damaged: why"
    scan_from: int = 0  # where the verifying scan of the commit log started
    end_offset: int = 0  # where the commit log ends after recovery
    stop_reason: str = ""  # what stopped the scan ("end", "bad magic ... at N", ...)
    records_verified: int = 0
    dispatch_from: int = 0  # where consume-queue rebuilding started
    units_rebuilt: int = 0
    queues_trimmed: list[str] = field(default_factory=list)  # queues whose tail pointed at nothing valid
    duration_s: float = 0.0


def scan_commit_log(
    directory: str | os.PathLike[str],
    segment_size: int,
    start: int,
    *,
    check_crc: bool,
    on_record: Callable[[ScanRecord], None] | None = None,
) -> tuple[int, str, int]:
    """Walk the records of the segment files from ``start`` (a record boundary) to where the valid log ends.

    Returns ``(end offset, why the scan stopped, records seen)``. Segments are mapped read-only one at a
    time. A segment closed by a filler continues into the next file; anything else that is not a whole,
    valid record (zeros, garbage, a torn record, a bad CRC when ``check_crc``) ends the log.
    """
    d = Path(directory)
    pos = start
    count = 0

    def counted(rec: ScanRecord) -> None:
        nonlocal count
        count += 1
        if on_record is not None:
            on_record(rec)

    while True:
        seg_start = pos - pos % segment_size
        path = d / file_name(seg_start)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return pos, "end" if pos == seg_start else f"segment {path.name} is missing", count
        try:
            length = min(os.fstat(fd).st_size, segment_size)
            if length <= pos - seg_start:
                return pos, f"segment {path.name} is only {length} bytes", count
            with mmap.mmap(fd, length, access=mmap.ACCESS_READ) as mm:
                pos, why = scan_segment_bytes(
                    mm, seg_start, pos, seg_start + length, check_crc=check_crc, on_record=counted
                )
        finally:
            os.close(fd)
        if why != "filler" or length < segment_size:
            return pos, why, count


def first_store_timestamp(path: str | os.PathLike[str]) -> int:
    """STORETIMESTAMP of the first record of a segment file, 0 when it does not start with a message
    (RocketMQ's ``isMappedFileMatchedRecover`` reads the same field)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(POS_BORN_HOST + 20 + 8)
    except OSError:
        return 0
    if len(head) < POS_BORN_HOST + 8 + 8 or _MAGIC_SYSFLAG[0].unpack_from(head, 4)[0] != MESSAGE_MAGIC_CODE:
        return 0
    sys_flag = _MAGIC_SYSFLAG[1].unpack_from(head, 36)[0]
    pos = POS_BORN_HOST + (20 if sys_flag & SYSFLAG_BORNHOST_V6 else 8)
    if len(head) < pos + 8:
        return 0
    return int(_I64.unpack_from(head, pos)[0])


def check_queue_tail(cq: ConsumeQueue, cl: CommitLog) -> int:
    """Drop trailing units of ``cq`` that do not point at their own record in ``cl``; returns how many.

    A unit is kept when the commit log holds, at its offset, a message record of its size whose queue id
    and queue offset are the unit's. Only the tail is checked (that is where a crash leaves damage). A unit
    pointing below the log's first offset is kept too: its record was deleted as expired, and so were those
    of the units before it (dropping them would move the queue's max offset back).
    """
    dropped = 0
    while cq.max_offset > cq.min_offset:
        k = cq.max_offset - 1
        unit = cq.get_unit(k)
        if unit is not None and (unit[0] < cl.min_offset or _unit_matches(cl, unit[0], unit[1], cq.queue_id, k)):
            break
        cq.truncate(k)
        dropped += 1
    return dropped


def _unit_matches(cl: CommitLog, phys: int, size: int, queue_id: int, queue_offset: int) -> bool:
    if size < 91 or phys < cl.min_offset or phys + size > cl.max_offset:
        return False
    head = cl.read(phys, _CHECK.size)
    if head is None:
        return False
    rsize, magic, _crc, qid, _flag, qoff = _CHECK.unpack(head)
    return magic == MESSAGE_MAGIC_CODE and rsize == size and qid == queue_id and qoff == queue_offset
