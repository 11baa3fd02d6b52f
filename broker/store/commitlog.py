"""The commit log: fixed-size segments of RocketMQ 4.x records (docs/STORAGE.md, ROCKETMQ_FACTS.md §9).

Segments are files of ``segment_size`` bytes (sparse) named by their 20-digit start offset. Records are
written with ``pwrite`` (a full disk gives a clean ENOSPC error, where a store through a shared mapping
would kill the process with SIGBUS) and read by slicing a read-only ``mmap`` of the same file: the page
cache makes the bytes visible at once, and a slice costs no system call. A record never spans two
segments: when a record and an 8-byte filler do not fit in what is left, the segment is closed with the
end-of-segment filler (size = bytes left, magic 0xCBD43194) and the record starts the next one.

Blocking I/O, no trio. The writer is the MessageStore (one at a time by construction); ``flush`` runs in a
worker thread and only needs the file descriptors, which stay open until ``close``.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import struct
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from trimq.protocol.record import (
    BLANK_MAGIC_CODE,
    END_FILE_MIN_BLANK_LENGTH,
    MESSAGE_MAGIC_CODE,
    POS_BORN_HOST,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6,
    encode_blank,
)

__all__ = [
    "CommitLog",
    "RecordEncoder",
    "ScanRecord",
    "Segment",
    "StoreError",
    "file_name",
]

_FILE_NAME = re.compile(r"^\d{20}$")
_SIZE_MAGIC = struct.Struct(">iI")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
# Fields 1-9 of a record: size, magic, body crc, queue id, flag, queue offset, physical offset, sys flag,
# born timestamp (48 bytes).
_HEAD = struct.Struct(">iIiiiqqiq")


class StoreError(OSError):
    """The store directory is not in a state the broker can serve from (the message says why).

    An OSError, so callers that report "cannot start" for an unusable address or directory report this too.
    """


def file_name(offset: int) -> str:
    """RocketMQ's ``UtilAll.offset2FileName``: the offset zero-padded to 20 digits."""
    return f"{offset:020d}"


class Segment:
    """One commit-log file: ``[start, start + size)`` of the log."""

    __slots__ = ("fd", "mm", "path", "size", "start")

    def __init__(self, path: Path, start: int, size: int) -> None:
        self.path = path
        self.start = start
        self.size = size
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(self.fd).st_size != size:
                os.ftruncate(self.fd, size)  # sparse: no block is allocated until written
            self.mm = mmap.mmap(self.fd, size, access=mmap.ACCESS_READ)
        except BaseException:
            os.close(self.fd)
            raise

    @property
    def end(self) -> int:
        return self.start + self.size

    def write(self, offset: int, data: bytes | bytearray | memoryview) -> None:
        """Write ``data`` at log offset ``offset`` (inside this segment)."""
        pos = offset - self.start
        n = os.pwrite(self.fd, data, pos)
        if n == len(data):
            return
        view = memoryview(data)[n:]  # a short write (rare): finish it
        pos += n
        while view:
            n = os.pwrite(self.fd, view, pos)
            view = view[n:]
            pos += n

    def flush(self) -> None:
        """fdatasync: the written bytes and the block map reach the disk (blocking)."""
        os.fdatasync(self.fd)

    def close(self) -> None:
        with contextlib.suppress(BufferError, ValueError):
            self.mm.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)

    def __repr__(self) -> str:
        return f"<Segment {self.path.name}>"


@dataclass(slots=True)
class ScanRecord:
    """What recovery learns about one record without building a MessageExt."""

    offset: int
    size: int
    queue_id: int
    queue_offset: int
    sys_flag: int
    store_timestamp: int
    topic: str
    properties: str


class RecordEncoder:
    """Encodes records into a buffer with as little per-message work as possible.

    Host bytes and the struct for a given pair of host lengths are computed once; each message costs one
    ``struct.pack``, a CRC32 and three ``bytearray`` extends. The output is byte-identical to
    ``protocol.record.encode_record`` (the unit tests check it).
    """

    def __init__(self) -> None:
        self._structs: dict[tuple[int, int], struct.Struct] = {}
        self._wholes: dict[tuple[int, int, int, int, int], struct.Struct] = {}
        self._topics: dict[str, bytes] = {}

    def middle(self, born_len: int, store_len: int) -> struct.Struct:
        """Struct for fields 1-14 plus the body length, for the given host byte lengths (8 or 20)."""
        key = (born_len, store_len)
        st = self._structs.get(key)
        if st is None:
            st = struct.Struct(f">iIiiiqqiq{born_len}sq{store_len}siqi")
            self._structs[key] = st
        return st

    def whole(self, born_len: int, store_len: int, body_len: int, topic_field_len: int,
              props_len: int) -> struct.Struct:
        """Struct for a whole record: fields 1-14, the body length and body, the topic field (length byte
        included, as ``topic_bytes`` gives it), the properties length and properties. Cached by the lengths:
        messages of a workload tend to have a few sizes, so one ``pack`` writes a record."""
        key = (born_len, store_len, body_len, topic_field_len, props_len)
        st = self._wholes.get(key)
        if st is None:
            st = struct.Struct(f">iIiiiqqiq{born_len}sq{store_len}siqi{body_len}s{topic_field_len}sh{props_len}s")
            if len(self._wholes) >= 4096:
                self._wholes.clear()
            self._wholes[key] = st
        return st

    def topic_bytes(self, topic: str) -> bytes:
        """Length byte + UTF-8 topic (cached)."""
        tb = self._topics.get(topic)
        if tb is None:
            raw = topic.encode()
            if len(raw) > 127:
                raise ValueError(f"topic is {len(raw)} bytes; a record holds at most 127")
            tb = bytes((len(raw),)) + raw
            if len(self._topics) > 100_000:
                self._topics.clear()
            self._topics[topic] = tb
        return tb

    @staticmethod
    def record_size(body_len: int, topic_field_len: int, props_len: int, born_len: int, store_len: int) -> int:
        """Total record size; ``topic_field_len`` includes the length byte."""
        return 90 + body_len + topic_field_len + props_len + (born_len - 8) + (store_len - 8)


def host_sys_flag(sys_flag: int, born_len: int, store_len: int) -> int:
    """``sys_flag`` with the IPv6 host bits set from the host byte lengths."""
    sys_flag &= ~(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6)
    if born_len == 20:
        sys_flag |= SYSFLAG_BORNHOST_V6
    if store_len == 20:
        sys_flag |= SYSFLAG_STOREHOST_V6
    return sys_flag


class CommitLog:
    """The segment files of one store, the write position and the durable position."""

    def __init__(self, directory: str | os.PathLike[str], segment_size: int) -> None:
        if segment_size < 4096:
            raise ValueError(f"commit-log segment size {segment_size} is below 4096")
        self.directory = Path(directory)
        self.segment_size = segment_size
        self.segments: list[Segment] = []
        self.max_offset = 0  # write position: the next record starts here
        self.flushed_offset = 0  # every byte below is fsynced
        self._spare: Segment | None = None  # the next segment, created ahead of need

    # -- opening ----------------------------------------------------------------------------------------
    def list_files(self) -> list[int]:
        """Start offsets of the segment files on disk, ascending (other names are ignored)."""
        if not self.directory.is_dir():
            return []
        return sorted(int(p.name) for p in self.directory.iterdir() if _FILE_NAME.match(p.name))

    def open(self, end_offset: int) -> None:
        """Map the segments after recovery decided the log ends at ``end_offset``.

        Segments past the one holding ``end_offset`` are deleted (they can only hold garbage or nothing);
        the tail of the last segment beyond ``end_offset`` is zeroed (cut, then re-extended sparse), so a
        torn write or appended garbage is gone for good.
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        starts = self.list_files()
        self.close()
        for i, start in enumerate(starts):
            if i and start != starts[i - 1] + self.segment_size:
                raise StoreError(
                    f"commit log {self.directory}: segment {file_name(start)} does not follow "
                    f"{file_name(starts[i - 1])} (segment size {self.segment_size})"
                )
        keep = [s for s in starts if s <= end_offset]
        for s in starts:
            if s not in keep:
                (self.directory / file_name(s)).unlink()
        for s in keep:
            path = self.directory / file_name(s)
            size = path.stat().st_size
            if s <= end_offset < s + self.segment_size:
                # The last segment: zero everything past the end, whatever is there.
                os.truncate(path, end_offset - s)
                os.truncate(path, self.segment_size)
            elif size != self.segment_size:
                os.truncate(path, self.segment_size)
            self.segments.append(Segment(path, s, self.segment_size))
        if self.segments and end_offset > self.segments[-1].end:
            raise StoreError(f"commit log {self.directory}: no segment holds end offset {end_offset}")
        if not self.segments and end_offset % self.segment_size:
            raise StoreError(f"commit log {self.directory}: no segment holds end offset {end_offset}")
        self.max_offset = end_offset
        self.flushed_offset = end_offset

    @property
    def min_offset(self) -> int:
        """First offset still in the log (segments are never deleted yet: 0 unless the log starts later)."""
        return self.segments[0].start if self.segments else self.max_offset

    def segment_for(self, offset: int) -> Segment | None:
        """The segment holding log offset ``offset``."""
        segs = self.segments
        if not segs:
            return None
        idx = (offset - segs[0].start) // self.segment_size
        if 0 <= idx < len(segs):
            return segs[idx]
        return None

    # -- writing ----------------------------------------------------------------------------------------
    def room_for(self, size: int) -> Segment | None:
        """The segment a write of ``size`` bytes goes to, rolling over to the prepared next segment (after
        closing the current one with the filler) when it does not fit. None when the next segment does not
        exist yet: create it with ``create_segment`` (in a worker thread), ``install_spare`` it, retry."""
        cur = self.segment_for(self.max_offset)
        if cur is not None and self.max_offset + size + END_FILE_MIN_BLANK_LENGTH <= cur.end:
            return cur
        spare = self._spare
        if spare is None or spare.start != self.next_segment_start():
            return None
        self.roll()
        return spare

    def next_segment_start(self) -> int:
        """Where the segment after the current one starts."""
        cur = self.segment_for(self.max_offset)
        if cur is not None:
            return cur.end
        return self.max_offset - self.max_offset % self.segment_size

    def needs_segment(self) -> int | None:
        """Start offset of the segment that should be created ahead of need, or None if it is ready."""
        start = self.next_segment_start()
        if self._spare is not None and self._spare.start == start:
            return None
        return start

    def create_segment(self, start: int) -> Segment:
        """Create (or open) the segment file starting at ``start`` (blocking: worker thread)."""
        return Segment(self.directory / file_name(start), start, self.segment_size)

    def install_spare(self, seg: Segment) -> None:
        """Make ``seg`` (from ``create_segment``) the next segment to roll into."""
        if self._spare is not None and self._spare is not seg:
            self._spare.close()
        self._spare = seg

    def roll(self) -> int:
        """Close the current segment with the filler and move to the spare one; returns the new position."""
        cur = self.segment_for(self.max_offset)
        spare = self._spare
        assert spare is not None
        if cur is not None:
            remaining = cur.end - self.max_offset
            cur.write(self.max_offset, encode_blank(remaining))
            self.max_offset = cur.end
        self.segments.append(spare)
        self._spare = None
        return self.max_offset

    def write(self, seg: Segment, data: bytes | bytearray | memoryview) -> int:
        """Append ``data`` (whole records) at the write position of ``seg``; returns its start offset."""
        offset = self.max_offset
        seg.write(offset, data)
        self.max_offset = offset + len(data)
        return offset

    def flush(self, target: int) -> None:
        """fdatasync the segments holding bytes in ``[flushed_offset, target)`` (blocking: worker thread).

        The caller (on the event loop) advances ``flushed_offset`` afterwards, so two flushes running at
        once can never move it backwards.
        """
        low = self.flushed_offset
        if target <= low:
            return
        for seg in list(self.segments):
            if seg.end > low and seg.start < target:
                seg.flush()

    @property
    def has_spare(self) -> bool:
        return self._spare is not None

    # -- replication (broker/store/ha/replica.py) -------------------------------------------------------
    def start_at(self, offset: int) -> None:
        """Make an empty log start at ``offset``, a segment boundary (a fresh slave: RocketMQ's master sends from
        the start of its last segment)."""
        if self.segments or self.max_offset:
            raise ValueError(f"commit log {self.directory} is not empty (max offset {self.max_offset})")
        if offset % self.segment_size:
            raise ValueError(f"offset {offset} is not a segment boundary (segment size {self.segment_size})")
        if self._spare is not None and self._spare.start != offset:
            # prepared for a log starting at 0: its file would not follow the segments to come
            self._spare.close()
            self._spare.path.unlink(missing_ok=True)
            self._spare = None
        self.max_offset = self.flushed_offset = offset

    def add_segment(self, seg: Segment) -> None:
        """Append ``seg`` (from ``create_segment``, starting where the current segment ends) to the log, for
        bytes received from a master: unlike ``roll``, no filler is written (the master's bytes hold it)."""
        if seg.start != self.next_segment_start() or self.segment_for(self.max_offset) is not None:
            raise ValueError(f"segment {seg.path.name} does not follow the log (max offset {self.max_offset})")
        if self._spare is not None and self._spare.start == seg.start:
            if self._spare is not seg:
                self._spare.close()
            self._spare = None
        self.segments.append(seg)

    @property
    def spare(self) -> Segment | None:
        """The next segment, created ahead of need (None: not yet)."""
        return self._spare

    def cut(self, offset: int) -> list[Segment]:
        """Forget the log from ``offset`` on (a slave following a newer master): the bytes of
        ``[offset, max_offset)`` are zeroed, later segments (and the prepared next one) are removed from the log
        and returned (the caller unlinks them, and closes them once no flush uses them). ``offset`` must not be
        below the log's first offset."""
        if offset >= self.max_offset:
            return []
        if offset < self.min_offset:
            raise ValueError(f"cannot cut the commit log at {offset}, below its first offset {self.min_offset}")
        keep = [s for s in self.segments if s.start <= offset]
        gone = [s for s in self.segments if s.start > offset]
        zero = bytes(1 << 20)
        for seg in keep:
            lo, hi = max(offset, seg.start), min(self.max_offset, seg.end)
            pos = lo
            while pos < hi:  # only what was written: the rest of a segment is zero already (sparse)
                n = min(len(zero), hi - pos)
                seg.write(pos, zero[:n])
                pos += n
        self.segments = keep
        if self._spare is not None:  # created for the old end: its file would not follow the new one
            gone.append(self._spare)
            self._spare = None
        self.max_offset = offset
        self.flushed_offset = min(self.flushed_offset, offset)
        return gone

    # -- reading ----------------------------------------------------------------------------------------
    def read(self, offset: int, size: int) -> bytes | None:
        """``size`` bytes at ``offset`` (inside one segment and below the write position), or None."""
        seg = self.segment_for(offset)
        if seg is None or size <= 0 or offset + size > self.max_offset:
            return None
        rel = offset - seg.start
        if rel + size > seg.size:
            return None
        return seg.mm[rel : rel + size]

    def read_ranges(self, ranges: Iterable[tuple[int, int]]) -> bytes:
        """Concatenate the bytes of ``(offset, size)`` ranges, merging adjacent ones into one slice."""
        pieces: list[bytes] = []
        cur_start = cur_end = -1
        for off, size in ranges:
            if off == cur_end:
                cur_end += size
                continue
            if cur_start >= 0:
                piece = self.read(cur_start, cur_end - cur_start)
                if piece is not None:
                    pieces.append(piece)
            cur_start, cur_end = off, off + size
        if cur_start >= 0:
            piece = self.read(cur_start, cur_end - cur_start)
            if piece is not None:
                pieces.append(piece)
        if len(pieces) == 1:
            return pieces[0]
        return b"".join(pieces)

    def record_size_at(self, offset: int) -> int | None:
        """The size of the message record at ``offset``, or None if there is none."""
        seg = self.segment_for(offset)
        if seg is None or offset + 8 > self.max_offset:
            return None
        size, magic = _SIZE_MAGIC.unpack_from(seg.mm, offset - seg.start)
        if magic != MESSAGE_MAGIC_CODE or size < 91 or offset + size > min(seg.end, self.max_offset):
            return None
        return size

    def store_timestamp_at(self, offset: int) -> int | None:
        """The STORETIMESTAMP of the record at ``offset`` (RocketMQ's ``pickupStoreTimestamp``)."""
        if self.record_size_at(offset) is None:
            return None
        seg = self.segment_for(offset)
        assert seg is not None
        rel = offset - seg.start
        (sys_flag,) = _I32.unpack_from(seg.mm, rel + 36)
        pos = rel + POS_BORN_HOST + (20 if sys_flag & SYSFLAG_BORNHOST_V6 else 8)
        return int(_I64.unpack_from(seg.mm, pos)[0])

    # -- closing ----------------------------------------------------------------------------------------
    def close(self) -> None:
        for seg in self.segments:
            seg.close()
        self.segments = []
        if self._spare is not None:
            self._spare.close()
            self._spare = None


def scan_segment_bytes(
    buf: bytes | mmap.mmap | memoryview,
    seg_start: int,
    pos: int,
    end: int,
    *,
    check_crc: bool,
    on_record: Callable[[ScanRecord], None] | None,
) -> tuple[int, str]:
    """Walk records of one segment from log offset ``pos`` (a record boundary) up to ``end`` (the segment
    end). Returns ``(offset where the valid log stops, why)``; ``why`` is ``"filler"`` when the segment
    was closed by a filler (the next segment continues the log), else a description of what stopped it.

    A record is accepted only if its magic, size, field lengths, physical-offset field and (when asked)
    body CRC all check out.
    """
    while pos + 8 <= end:
        rel = pos - seg_start
        size, magic = _SIZE_MAGIC.unpack_from(buf, rel)
        if magic == BLANK_MAGIC_CODE:
            if pos + size == end and size >= END_FILE_MIN_BLANK_LENGTH:
                return end, "filler"
            return pos, f"bad filler size {size} at {pos}"
        if magic != MESSAGE_MAGIC_CODE:
            return pos, "end" if size == 0 and magic == 0 else f"bad magic {magic:#010x} at {pos}"
        if size < 91 or pos + size + END_FILE_MIN_BLANK_LENGTH > end:
            return pos, f"bad record size {size} at {pos}"
        (_, _, crc, queue_id, _flag, queue_offset, phys, sys_flag, _born) = _HEAD.unpack_from(buf, rel)
        if phys != pos:
            return pos, f"record at {pos} says it is at {phys}"
        p = rel + POS_BORN_HOST + (20 if sys_flag & SYSFLAG_BORNHOST_V6 else 8)
        (store_ts,) = _I64.unpack_from(buf, p)
        p += 8 + (20 if sys_flag & SYSFLAG_STOREHOST_V6 else 8) + 12
        (body_len,) = _I32.unpack_from(buf, p)
        p += 4
        rec_end = rel + size
        if body_len < 0 or p + body_len + 3 > rec_end:
            return pos, f"record at {pos}: body length {body_len} overruns it"
        if check_crc and zlib.crc32(buf[p : p + body_len]) & 0x7FFFFFFF != crc:
            return pos, f"record at {pos}: body CRC mismatch"
        p += body_len
        topic_len = buf[p]
        if p + 1 + topic_len + 2 > rec_end:
            return pos, f"record at {pos}: topic overruns it"
        (props_len,) = _I16.unpack_from(buf, p + 1 + topic_len)
        if props_len < 0 or p + 1 + topic_len + 2 + props_len != rec_end:
            return pos, f"record at {pos}: field lengths do not add up to {size}"
        if on_record is not None:
            try:
                topic = bytes(buf[p + 1 : p + 1 + topic_len]).decode()
                props = bytes(buf[p + 3 + topic_len : rec_end]).decode()
            except UnicodeDecodeError:
                return pos, f"record at {pos}: topic or properties are not UTF-8"
            on_record(ScanRecord(pos, size, queue_id, queue_offset, sys_flag, store_ts, topic, props))
        pos += size
    return pos, "segment end"
